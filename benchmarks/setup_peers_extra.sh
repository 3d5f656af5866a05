#!/usr/bin/env bash
# Extra installs on top of ../shared/peers/setup_peers.sh so that `import onmt` works in the peers
# venv: OpenNMT-py 3.5.1 is installed with --no-deps, and onmt/transforms/clean.py imports fasttext
# (and other transforms import spacy) at `import onmt` time.
# Usage: bash benchmarks/setup_peers_extra.sh [PEERS_DIR]   (default: $HOME/.cache/onmt-peers)
set -euo pipefail
DIR=${1:-${PEERS_DIR:-$HOME/.cache/onmt-peers}}
cd "$DIR"
[ -s constraints.txt ] || echo "torch==2.13.0" > constraints.txt   # never replace the pinned torch
venv/bin/pip install -q -c constraints.txt spacy fasttext-wheel
venv/bin/python -c "import torch, onmt, ctranslate2; assert torch.__version__.startswith('2.13.0'), torch.__version__; print('peers ready:', torch.__version__, onmt.__version__, ctranslate2.__version__)"
