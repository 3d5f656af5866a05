"""onmt_doc_build_vocab -config X.yaml [key.path=value ...]: learn subwords and vocabularies."""

from __future__ import annotations

import logging
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, add_config_args, run


def _main(argv: Optional[list[str]]) -> int:
    parser = ArgumentParser(prog="onmt_doc_build_vocab", description=__doc__)
    add_config_args(parser)
    args = parser.parse_args(argv)
    from onmt_doc.config import load_config
    from onmt_doc.data.prepare import build_codec
    from onmt_doc.train.reporting import setup_logging

    setup_logging()
    cfg = load_config(args.config, args.overrides)
    codec = build_codec(cfg, cfg.log.dir)
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
