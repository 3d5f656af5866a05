"""Count the PMI table of a training corpus for the pmi_gate_hinge loss (regularized context gates).

  onmt_doc_build_pmi_table -config X.yaml -output runs/x/pmi.npz
  onmt_doc_build_pmi_table -src TRAIN.src -tgt TRAIN.tgt -config X.yaml -output table [key=value …]

The corpus is tokenized with the run's subword model and vocabularies (``log.dir`` of the config;
learned there first, as training would, when missing); ``-src``/``-tgt`` default to
``data.train``. The table stores sorted pair ids and counts (``onmt_doc/pmi.py``); it holds no
normaliser, so one table serves both. The last line is the share of the corpus's target tokens
with z* = 1 under ``-normaliser`` (default: the config's ``pmi_gate_hinge`` loss, else ``shared``):
what the regulariser will push the gates towards.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, add_config_args, run, run_folder_lock
from onmt_doc.errors import UserError
from onmt_doc.outputs import check_readable_file, check_writable_target, refuse_inputs


def _main(argv: Optional[list[str]] = None) -> int:
    p = ArgumentParser(
        prog="onmt_doc_build_pmi_table", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-src", "--src", help="source side of the training corpus (default: data.train.src)")
    p.add_argument("-tgt", "--tgt", help="target side (default: data.train.tgt)")
    p.add_argument("-output", "--output", required=True, help="table file to write (.npz)")
    p.add_argument(
        "-normaliser",
        "--normaliser",
        choices=["shared", "per_scenario"],
        help="Z of eq. 6 for the z* summary (default: the config's pmi_gate_hinge loss, else shared)",
    )
    add_config_args(p)
    args = p.parse_args(argv)

    from onmt_doc.config import load_config
    from onmt_doc.data.pmi import build_table, tokenized_pairs, z_star_share
    from onmt_doc.data.prepare import build_codec, codec_files, load_codec
    from onmt_doc.train.reporting import setup_logging

    setup_logging()
    cfg = load_config(args.config, args.overrides)
    one = cfg.data.train if not isinstance(cfg.data.train, dict) else None  # several corpora: give the files
    src, tgt = args.src or (one and one.src), args.tgt or (one and one.tgt)
    if not src or not tgt:
        raise UserError("give -src and -tgt, or data.train.src and data.train.tgt in the config")
    for flag, path in (("-src", src), ("-tgt", tgt)):
        check_readable_file(path, flag)
    inputs = [("-src", src), ("-tgt", tgt), ("-config", args.config), *codec_files(cfg.log.dir, cfg.vocab.shared)]
    refuse_inputs(args.output, inputs)
    check_writable_target(args.output, make_folder=True)  # e.g. runs/x/pmi.npz before runs/x exists
    codec = load_codec(cfg.vocab, cfg.log.dir)
    if codec is None:  # learned into the run folder, as training would: only with the folder locked
        with run_folder_lock(cfg.log.dir):
            codec = build_codec(cfg.data, cfg.vocab, cfg.log.dir)
    start = time.time()
    normaliser = args.normaliser or next(
        (getattr(c, "normaliser") for c in cfg.loss if c.type == "pmi_gate_hinge"), "shared"
    )
    table = build_table(src, tgt, codec, cfg.data.documents, cfg.data.max_line_chars, normaliser)
    table.save(args.output, inputs)
    print(
        f"{table.n_pairs} sentence pairs: {len(table.bi_keys)} bilingual and {len(table.mono_keys)} "
        f"monolingual type pairs, written to {args.output} in {time.time() - start:.1f} s",
        file=sys.stderr,
    )
    ones, total = z_star_share(table, tokenized_pairs(src, tgt, codec, cfg.data.documents, cfg.data.max_line_chars))
    print(
        f"z* = 1 for {100.0 * ones / max(total, 1):.1f}% of {total:,} target tokens ({normaliser} normaliser)",
        file=sys.stderr,
    )
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
