"""What every command shares: the error contract and the ``-config`` + overrides arguments."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional

from onmt_doc.errors import UserError


def run(main: Callable[[Optional[list[str]]], int], argv: Optional[list[str]] = None) -> int:
    """Run a command: a user mistake is one line on stderr and exit status 1, never a traceback."""
    prog = os.path.basename(sys.argv[0]) or "onmt_doc"
    try:
        return main(argv) or 0
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`
        return 0


def add_config_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("-config", "--config", required=required, help="YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value",
                        help="dotted overrides, e.g. train.max_steps=200 loss.0.smoothing=0.2")


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors follow the one-line error contract."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)
