"""Export a Transformer checkpoint (a sentence model, or a k_to_1 / k_to_k concatenation model) to
CTranslate2, with its subword model(s), vocabularies, the unit and k, and a README saying how to
build inputs, tokenize and decode. Translate it with onmt_doc_translate -engine ctranslate2 -model OUT.

onmt_doc_release -model runs/x/checkpoints/last.pt -output ct2_model [-quantization int8] [-force]

Needs the optional extra: pip install -e '.[export]' (ctranslate2 >= 4).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.export.ctranslate2 import QUANTIZATIONS, export_ctranslate2


def _main(argv: Optional[list[str]] = None) -> int:
    p = ArgumentParser(
        prog="onmt_doc_release", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "-model",
        "--model",
        required=True,
        help="onmt_doc checkpoint (transformer encoder + decoder; sentence, k_to_1 or k_to_k unit)",
    )
    p.add_argument("-output", "--output", required=True, help="folder for the CTranslate2 model")
    p.add_argument(
        "-quantization",
        "--quantization",
        default=None,
        metavar="TYPE",
        help=f"weight type of the exported model: {', '.join(QUANTIZATIONS)} (default: float32)",
    )
    p.add_argument(
        "-max_positions",
        "--max_positions",
        type=int,
        default=1024,
        help="longest source or target (tokens, markup included) the exported position table covers",
    )
    p.add_argument("-force", "--force", action="store_true", help="replace -output if it exists")
    args = p.parse_args(argv)
    info = export_ctranslate2(args.model, args.output, args.quantization, args.force, args.max_positions)
    print(f"exported {args.model} to {args.output} ({info['quantization']})", file=sys.stderr)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console script ``onmt_doc_release``: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
