#!/usr/bin/env bash
# The GPU spec on a lent GPU machine, in two commands (benchmarks/README.md, "Running the GPU spec"):
#
#   bash benchmarks/lent_gpu.sh prepare                 # here: .carry/{gpuwhl,ct2whl} (wheels), .carry/data
#   bash benchmarks/lent_gpu.sh run STAGES SECONDS [ARGS...]   # there, in one device call
#
# The device machine has torch but lacks pyonmttok, torch-optimizer and the peer OpenNMT-py 3.5.1, and
# cannot reach ../shared: `prepare` puts them in git-ignored folders the device call carries (64 MiB
# in all): [".carry/gpuwhl", ".carry/data"] for the stages on real data, [".carry/ct2whl"] for
# `decoding` (CTranslate2) with the stages on random weights. `run` installs the wheels, runs
# `python -m benchmarks run gpu.yaml --stages STAGES` under `timeout SECONDS` and copies run.json and
# results.jsonl into $OUT every 5 s, so a call cut off still brings back what was measured; at the end
# it adds log.txt and runs.tgz (every training's metrics.jsonl, the peer's log, the recipe's table.md).
# ARGS go to `benchmarks run` (a rehearsal here: `OUT=/tmp/o bash benchmarks/lent_gpu.sh run
# documents 900 --smoke --device cpu`).
set -uo pipefail
cd "$(dirname "$0")/.."

wheels() {  # FOLDER PACKAGE...: wheels for the device machine's Python 3.12 on x86_64 Linux
  local folder=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$folder" "$@"
}

prepare() {
  local data=${ONMT_DOC_DATA:-../shared/data}
  grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo /.carry/ >> .git/info/exclude
  mkdir -p .carry/gpuwhl .carry/ct2whl .carry/data
  cp -r "$data"/{docmt-en-de,multi30k-en-de,news-sent-en-de,README.md} .carry/data/ || return 1
  local ours=(pyonmttok==1.38.1 torch-optimizer==0.3.0 pytorch-ranger)
  # the data calls: our libraries, the peer OpenNMT-py and what it imports
  wheels .carry/gpuwhl "${ours[@]}" opennmt-py==3.5.1 configargparse rapidfuzz pyahocorasick || return 1
  # the decoding call (no data): our libraries and CTranslate2 (43 MB: it does not fit beside the data)
  wheels .carry/ct2whl "${ours[@]}" ctranslate2==4.8.5 || return 1
  du -sh .carry/gpuwhl .carry/ct2whl .carry/data
}

run() {
  local stages=${1:?usage: run STAGES SECONDS [ARGS...]} seconds=${2:?usage: run STAGES SECONDS [ARGS...]}
  shift 2
  local out=${OUT:?OUT: the folder whose files come back}
  mkdir -p "$out" || return 1
  local work=${GPU_WORK:-/tmp/gpu}
  # the wheels are for the device machine's Python (3.12); a machine that has the libraries keeps its own
  local -A seen=()
  local carried=() w
  for w in .carry/*whl/*.whl; do  # every carried folder's wheels, each once
    [ -e "$w" ] && [ -z "${seen[${w##*/}]:-}" ] && seen[${w##*/}]=1 && carried+=("$w")
  done
  if ! python3 -c "import pyonmttok, torch_optimizer" 2>/dev/null && [ ${#carried[@]} -gt 0 ]; then
    # --upgrade: a warm machine keeps /tmp/site from an earlier call, whose packages pip would not replace
    python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site "${carried[@]}" || return 1
    export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD
  fi
  local data=.carry/data
  [ -d "$data" ] || data=${ONMT_DOC_DATA:-../shared/data}
  (while sleep 5; do cp "$work"/results.jsonl "$work"/run.json "$out"/ 2>/dev/null; done) &
  local copier=$!
  # at the limit timeout's SIGTERM makes the runner stop its running stage's whole process group
  timeout -k 10 "$seconds" python3 -m benchmarks run gpu.yaml --stages "$stages" --data "$data" --out "$work" "$@" \
    > "$out/log.txt" 2>&1
  local rc=$?
  kill "$copier" 2>/dev/null
  cp "$work"/results.jsonl "$work"/run.json "$out"/ 2>/dev/null
  (cd / && find "${work#/}" \( -name metrics.jsonl -o -name table.md -o -name train.log \) -print0 \
    | tar czf "$out/runs.tgz" --null -T -) 2>/dev/null
  echo "benchmarks run: exit $rc (124 = cut off at ${seconds} s); $(wc -l < "$out/results.jsonl" 2>/dev/null || echo 0) records"
  tail -n 5 "$out/log.txt"
  return $rc
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) sed -n 2,14p "$0"; exit 2 ;;
esac
