"""What every command shares: the error contract and the ``-config`` + overrides arguments."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional, Sequence

from onmt_doc.errors import UserError


def run(main: Callable[[Optional[list[str]]], int], argv: Optional[list[str]] = None) -> int:
    """Run a command: a user mistake is one line on stderr and exit status 1, never a traceback."""
    prog = os.path.basename(sys.argv[0]) or "onmt_doc"
    try:
        return main(argv) or 0
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, or a training stopped by SIGTERM/SIGINT (exit_status)
        print(f"{prog}: interrupted", file=sys.stderr)
        return getattr(e, "exit_status", 130)
    except BrokenPipeError:  # output piped into e.g. `head`
        return 0


def add_config_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The ``-config X.yaml key.path=value ...`` arguments, spelled the same in every command."""
    parser.add_argument("-config", "--config", required=required, help="YAML config file")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="dotted overrides, e.g. train.max_steps=200 loss.0.smoothing=0.2",
    )


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors follow the one-line error contract."""

    # counts that must not be negative in whichever command declares them (torch raises otherwise)
    NON_NEGATIVE = ("threads",)

    def parse_args(  # type: ignore[override]
        self, args: Optional[Sequence[str]] = None, namespace: Optional[argparse.Namespace] = None
    ) -> argparse.Namespace:
        """argparse's parse_args, then a usage error for a negative count in ``NON_NEGATIVE``."""
        ns = super().parse_args(args, namespace)
        for name in self.NON_NEGATIVE:
            value = getattr(ns, name, None)
            if isinstance(value, int) and value < 0:
                self.error(f"-{name} must be 0 or more (got {value})")
        return ns

    def error(self, message: str) -> None:  # type: ignore[override]
        """Raise instead of argparse's usage dump + exit 2, so ``run`` prints it as one line."""
        raise UserError(message)
