"""onmt_doc_train -config X.yaml [key.path=value ...]   (or under torchrun)."""

from __future__ import annotations

from typing import Optional

from onmt_doc.bin.common import ArgumentParser, add_config_args, run


def _main(argv: Optional[list[str]]) -> int:
    parser = ArgumentParser(prog="onmt_doc_train", description=__doc__)
    add_config_args(parser)
    args = parser.parse_args(argv)
    import os

    from onmt_doc.config import load_config
    from onmt_doc.train.reporting import setup_logging
    from onmt_doc.train.trainer import train

    setup_logging(int(os.environ.get("RANK", "0")))
    train(load_config(args.config, args.overrides), args.config)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
