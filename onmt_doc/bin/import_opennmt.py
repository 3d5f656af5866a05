"""Import an OpenNMT-py 3.x Transformer checkpoint as an onmt_doc checkpoint, so a sentence model
trained there translates here or initialises a document model (``train.init_from``).

onmt_doc_import_opennmt -model onmt_model_step_N.pt -output model.pt -src_subword_model subword.model

The subword model(s) and tokenizer mode are those the OpenNMT-py model's training data was
tokenized with (its checkpoint does not carry them). Every parameter is mapped by name; an
architecture onmt_doc does not have is refused in one line (docs/deploy.md). The model reads
OpenNMT-py's own sequences (``data.sentence_markup: false``: no ``<s> … </s>`` around sentences);
``-sentence_markup`` keeps onmt_doc's markup instead, as a start for fine-tuning into a document model.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, add_import_flags, describe_import, run, run_folder_lock
from onmt_doc.convert.opennmt import import_opennmt
from onmt_doc.outputs import check_writable_target, refuse_inputs


def _main(argv: Optional[list[str]] = None) -> int:
    p = ArgumentParser(
        prog="onmt_doc_import_opennmt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-model", "--model", required=True, help="OpenNMT-py 3.x checkpoint (transformer/transformer)")
    p.add_argument("-output", "--output", required=True, help="onmt_doc checkpoint to write")
    p.add_argument("-src_subword_model", "--src_subword_model", default=None, help="BPE or SentencePiece model")
    p.add_argument(
        "-tgt_subword_model", "--tgt_subword_model", default=None, help="target-side model (default: the source's)"
    )
    p.add_argument(
        "-subword_type",
        "--subword_type",
        default="bpe",
        choices=["bpe", "sentencepiece", "none"],
        help="kind of the subword model(s); none: text is split on spaces only",
    )
    p.add_argument(
        "-tokenizer",
        "--tokenizer",
        default="aggressive",
        choices=["aggressive", "conservative", "space", "char", "none"],
        help="pyonmttok mode (with joiners) the training data was tokenized with; ignored by SentencePiece",
    )
    p.add_argument(
        "-run_dir",
        "--run_dir",
        default=None,
        help="also write the subword model(s) and vocabularies here, as a run folder (log.dir) holds them, "
        "to fine-tune the model with train.init_from",
    )
    add_import_flags(p, "OpenNMT-py")
    args = p.parse_args(argv)
    inputs = [
        ("-model", args.model),
        ("-src_subword_model", args.src_subword_model),
        ("-tgt_subword_model", args.tgt_subword_model),
    ]
    refuse_inputs(args.output, inputs)
    check_writable_target(args.output, make_folder=True)
    with run_folder_lock(args.run_dir) if args.run_dir else contextlib.nullcontext():
        payload = import_opennmt(
            args.model,
            args.output,
            args.src_subword_model,
            args.tgt_subword_model,
            args.subword_type,
            args.tokenizer,
            args.force,
            args.run_dir,
            args.sentence_markup,
        )
    print(describe_import(args.model, args.output, payload, args.sentence_markup), file=sys.stderr)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console script ``onmt_doc_import_opennmt``: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
