"""What every command shares: the error contract and the ``-config`` + overrides arguments."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from typing import Callable, Iterator, Optional, Sequence

from onmt_doc.devices import check_count
from onmt_doc.errors import UserError

# what the machine, not the program, ran out of or refused: one line, never a traceback
ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG)


def run(main: Callable[[Optional[list[str]]], int], argv: Optional[list[str]] = None) -> int:
    """Run a command: a user mistake, a full disk or a closed output is one line on stderr and a
    non-zero exit status, never a traceback."""
    prog = os.path.basename(sys.argv[0]) or "onmt_doc"
    if sys.stdout is None:  # started with stdout closed (>&-): printing results must fail, not vanish
        sys.stdout = ClosedStdout()
    try:
        return main(argv) or 0
    except UserError as e:
        return _fail(prog, str(e))
    except KeyboardInterrupt as e:  # Ctrl-C, or a training stopped by SIGTERM/SIGINT (exit_status)
        print(f"{prog}: interrupted", file=sys.stderr)
        return getattr(e, "exit_status", 130)
    except BrokenPipeError:  # the reader of our output went away (e.g. `| head`): the output is incomplete
        _silence_stdout()
        return _fail(prog, "standard output was closed by its reader (broken pipe); the output is incomplete")
    except OSError as e:
        if e.errno not in ENVIRONMENT_ERRNOS:
            raise
        where = f" ({e.filename})" if e.filename else " (while writing the output)"
        return _fail(prog, f"{e.strerror or e}{where}")
    except MemoryError:
        return _fail(prog, OUT_OF_MEMORY)
    except RuntimeError as e:  # torch reports a failed allocation as a RuntimeError (OutOfMemoryError on CUDA)
        if not any(marker in str(e) for marker in ALLOCATION_FAILURES):
            raise
        return _fail(prog, f"{OUT_OF_MEMORY} ({str(e).splitlines()[0][:160]})")


OUT_OF_MEMORY = "out of memory; use smaller batches (batch_tokens), a shorter input or a smaller model"
ALLOCATION_FAILURES = ("can't allocate memory", "CUDA out of memory", "out of memory", "DefaultCPUAllocator")


class ClosedStdout:
    """What ``sys.stdout`` is when the command was started without one: a write is a one-line
    error instead of output that silently goes nowhere (``print`` ignores a ``None`` stdout)."""

    closed = True

    def write(self, text: str) -> int:
        """Refuse: the results would be lost."""
        raise UserError("standard output is closed (>&-); the results printed there would be lost")

    def flush(self) -> None:
        """Nothing to flush."""


def _fail(prog: str, message: str) -> int:
    try:
        print(f"{prog}: error: {message}", file=sys.stderr)
    except OSError:
        pass
    return 1


def _silence_stdout() -> None:
    """Point standard output at /dev/null so the interpreter's final flush does not print a
    second, unhandled BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def run_folder_lock(run_dir: str) -> Iterator[None]:
    """Hold a run folder's lock (the one training takes) while a command writes into it, so that
    no two commands, or a command and a training, write one run folder at once."""
    from onmt_doc.outputs import make_folders
    from onmt_doc.train.run_folder import RunLock

    make_folders(run_dir, "log.dir")
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


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
    """argparse whose usage errors follow the one-line error contract, and which gives every
    command ``-user_dir`` (plugins: a user's own parts, onmt_doc/plugins.py)."""

    # thread counts of whichever command declares them: 0 or more (torch raises otherwise), and
    # at most a multiple of the cores (torch.set_num_threads(10**6) asks for a million threads)
    NON_NEGATIVE = ("threads",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        """argparse's parser plus ``-user_dir``."""
        super().__init__(*args, **kwargs)
        self.add_argument(
            "-user_dir",
            "--user_dir",
            action="append",
            default=[],
            metavar="PATH",
            help="import a plugin (a .py file or a package folder) that registers its own parts; repeatable",
        )

    def parse_args(  # type: ignore[override]
        self, args: Optional[Sequence[str]] = None, namespace: Optional[argparse.Namespace] = None
    ) -> argparse.Namespace:
        """argparse's parse_args, a usage error for a negative count in ``NON_NEGATIVE``, then the
        ``-user_dir`` plugins imported (before any config or checkpoint is read)."""
        ns = super().parse_args(args, namespace)
        for name in self.NON_NEGATIVE:
            value = getattr(ns, name, None)
            if isinstance(value, int) and value < 0:
                self.error(f"-{name} must be 0 or more (got {value})")
            if isinstance(value, int):
                check_count(value, f"-{name}")
        if ns.user_dir:
            from onmt_doc.plugins import import_plugins

            import_plugins(ns.user_dir, "-user_dir")
        return ns

    def error(self, message: str) -> None:  # type: ignore[override]
        """Raise instead of argparse's usage dump + exit 2, so ``run`` prints it as one line."""
        raise UserError(message)


def describe_import(source: str, output: str, payload: dict, markup: bool, detail: str = "") -> str:
    """The one line an importer (``onmt_doc_import_opennmt``, ``onmt_doc_import_marian``) prints
    about the checkpoint it wrote; ``detail``: what else that format makes worth saying."""
    m = payload["config"]["model"]
    return (
        f"imported {source} to {output}: d_model {m['d_model']}, "
        f"{m['encoder']['layers']}+{m['decoder']['layers']} layers, {detail}"
        f"{len(payload['codec']['tgt_vocab'])} target entries, sentence markup {'on' if markup else 'off'}"
    )


def add_import_flags(p: argparse.ArgumentParser, source: str) -> None:
    """The flags every importer shares: ``-sentence_markup`` and ``-force`` (``source``: the
    toolkit whose model is imported, as the help names it)."""
    p.add_argument(
        "-sentence_markup",
        "--sentence_markup",
        action="store_true",
        help="write data.sentence_markup: true (onmt_doc's <s> … </s> around each sentence, which the "
        f"{source} model never saw: lower BLEU as is) for fine-tuning into a document model",
    )
    p.add_argument(
        "-force",
        "--force",
        action="store_true",
        help="overwrite -output if it exists; replace the vocabulary of a -run_dir that has checkpoints "
        "(the old files are kept as <name>.backup-<time>)",
    )
