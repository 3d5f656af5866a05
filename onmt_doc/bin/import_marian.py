"""Import a Marian / OPUS-MT model (Hugging Face layout) as an onmt_doc checkpoint, so it translates
here or initialises a document model (``train.init_from``).

onmt_doc_import_marian -model opus-mt-en-de/ -output model.pt [-run_dir runs/en-de]

``-model`` is a local folder with config.json, model.safetensors (or pytorch_model.bin), source.spm,
target.spm and vocab.json; nothing is downloaded (docs/pretrained.md says how to fetch one). The
SentencePiece models and the vocabulary travel inside the checkpoint, so onmt_doc_translate reads
raw text with the model's own segmentation. Anything of the network onmt_doc does not build is
refused in one line naming the config key. The model reads Marian's own sequences
(``data.sentence_markup: false``); ``-sentence_markup`` keeps onmt_doc's markup instead, as the start
for fine-tuning into a document model.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, add_import_flags, describe_import, run, run_folder_lock
from onmt_doc.convert.marian import FOLDER_FILES, import_marian
from onmt_doc.outputs import check_writable_target, refuse_inputs


def _main(argv: Optional[list[str]] = None) -> int:
    p = ArgumentParser(
        prog="onmt_doc_import_marian", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-model", "--model", required=True, help="folder of a Marian model in the Hugging Face layout")
    p.add_argument("-output", "--output", required=True, help="onmt_doc checkpoint to write")
    p.add_argument(
        "-run_dir",
        "--run_dir",
        default=None,
        help="also write the SentencePiece models and vocabularies here, as a run folder (log.dir) holds them, "
        "to fine-tune the model with train.init_from",
    )
    add_import_flags(p, "Marian")
    args = p.parse_args(argv)
    refuse_inputs(args.output, [("-model", os.path.join(args.model, name)) for name in FOLDER_FILES])
    check_writable_target(args.output, make_folder=True)
    with run_folder_lock(args.run_dir) if args.run_dir else contextlib.nullcontext():
        payload, verified = import_marian(args.model, args.output, args.force, args.run_dir, args.sentence_markup)
    detail = f"activation {payload['config']['model']['activation']}, "
    checked = f"{len(verified)} files matching their download's sha256" if verified else "no download record to check"
    detail += f"{checked}, "
    print(describe_import(args.model, args.output, payload, args.sentence_markup, detail), file=sys.stderr)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console script ``onmt_doc_import_marian``: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
