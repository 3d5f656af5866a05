"""onmt_doc_build_vocab -config X.yaml [-force] [key.path=value ...]: learn subwords and vocabularies.

Writes them into the run folder (``log.dir``) with the folder locked. In a run that already has
checkpoints, a vocabulary or subword model that would change is refused (the checkpoints' token
ids mean the old one); ``-force`` replaces them and keeps the old files as ``<name>.backup-<time>``.
"""

from __future__ import annotations

import logging
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, add_config_args, run, run_folder_lock


def _main(argv: Optional[list[str]]) -> int:
    parser = ArgumentParser(prog="onmt_doc_build_vocab", description=__doc__)
    parser.add_argument(
        "-force",
        "--force",
        action="store_true",
        help="replace the vocabulary of a run that has checkpoints (the old files are kept as backups)",
    )
    add_config_args(parser)
    args = parser.parse_args(argv)
    from onmt_doc.config import load_config
    from onmt_doc.data.prepare import build_codec, train_corpora
    from onmt_doc.train.reporting import setup_logging

    setup_logging()
    cfg = load_config(args.config, args.overrides)
    train_corpora(cfg.data)  # every file checked before the run folder is created or locked
    with run_folder_lock(cfg.log.dir):
        codec = build_codec(cfg.data, cfg.vocab, cfg.log.dir, args.force)
    sizes = (
        f"{len(codec.src_vocab)} shared entries"
        if codec.shared
        else f"{len(codec.src_vocab)} source / {len(codec.tgt_vocab)} target entries"
    )
    logging.getLogger("onmt_doc").info(
        "%s model (%s) and vocabulary (%s) written to %s", cfg.vocab.subword, cfg.vocab.size, sizes, cfg.log.dir
    )
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
