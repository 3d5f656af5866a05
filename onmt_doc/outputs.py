"""The one way every command writes a file or a folder: nothing a user owns is lost.

Every writer of the toolkit (translations, evaluation reports, checkpoints, vocabularies, subword
models, PMI tables, exports, the resolved config) goes through :func:`output_file` or
:func:`output_folder`, so one set of rules holds for all of them:

* **Inputs are never outputs.** A path that is, or resolves to (symbolic links, ``..``, hard
  links), one of the command's inputs is refused before anything is written; so is an output
  folder that holds one of the inputs.
* **All or nothing.** A regular file is written to a temporary file beside it
  (``.<name>.tmp<pid>``, the pattern ``train/run_folder.py`` clears after a crash) and renamed over
  the target only once complete; on any failure the temporary file is removed and an existing
  output is left exactly as it was. A link is followed: its target is replaced, the link stays.
* **Special files are streamed.** A character device, a FIFO or a socket (``/dev/stdout``,
  ``/dev/null``, a named pipe) is written to directly, never replaced by a regular file.
* **A full disk is a one-line error**, naming the output (``UserError``), never a traceback.

Folders (exports) are built complete in a fresh folder beside the target and swapped in; an
existing folder is replaced only with ``force`` and only after the new one is complete.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import shutil
import stat
import sys
from typing import IO, Any, Iterable, Iterator, Optional, Sequence, Union

from onmt_doc.errors import DataError, UserError

PathLike = Union[str, "os.PathLike[str]"]
# an input of a command: (how the user named it, e.g. "-src", its path); None is skipped, "-" is
# standard input and "/dev/stdout" standard output (an output that must not land on another one)
Input = tuple[str, Optional[PathLike]]

STDOUT = "-"


def describe(flag: str, path: PathLike) -> str:
    """``-output x.txt``, or the bare path when the writer has no flag: the start of every error."""
    return f"{flag} {os.fspath(path)}" if flag else os.fspath(path)


def _os_reason(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on the device"
    if e.errno == errno.EDQUOT:
        return "disk quota exceeded"
    return e.strerror or str(e)


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether two paths name one file: equal once resolved, or hard links of one inode."""
    a, b = os.fspath(a), os.fspath(b)
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _is_inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _real_inputs(inputs: Iterable[Input]) -> list[tuple[str, str]]:
    return [(flag, os.fspath(p)) for flag, p in inputs if p is not None and os.fspath(p) not in ("", STDOUT)]


STDIN = "-"  # an input named "-" is standard input (``-src -``)
_STREAM_NAMES = {0: "standard input", 1: "standard output", 2: "standard error"}


def _descriptor(path: str, is_input: bool) -> Optional[int]:
    """The descriptor a command's path stands for: ``-`` (standard input for an input, standard
    output for an output), ``/dev/stdin``, ``/dev/stdout``, ``/dev/fd/N``…; None for a plain path."""
    if path == STDIN:
        return 0 if is_input else 1
    return 0 if path == "/dev/stdin" else descriptor_of(path)


def _regular_node(path: str, fd: Optional[int]) -> Optional[tuple[int, int]]:
    """(st_dev, st_ino) of the regular file behind ``fd`` (or ``path``); None for a terminal, a
    pipe, a device or a missing file: only a regular file can be read and written over at once."""
    try:
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _named(flag: str, path: str, fd: Optional[int]) -> str:
    """How an input is named in a refusal: ``the -src file x.en``, ``-src - (standard input)``."""
    shown = f"{path} ({_STREAM_NAMES[fd]})" if fd in _STREAM_NAMES and path != _STREAM_NAMES[fd] else path
    return f"the {flag} file {shown}" if flag else f"the input {shown}"


def refuse_inputs(path: PathLike, inputs: Iterable[Input], flag: str = "-output") -> None:
    """A one-line ``UserError`` if the output ``path`` is, or resolves to, one of ``inputs``.
    Standard input and output are files too: ``-src - < x.en`` with ``-output x.en``, or an output
    to standard output (``-``) redirected onto an input (``>> x.en``), are the same file under
    another name (compared by device and inode, for regular files)."""
    p = os.fspath(path)
    out_fd = _descriptor(p, is_input=False)
    out_node = _regular_node(p, out_fd)
    for in_flag, in_path in ((f, os.fspath(x)) for f, x in inputs if x is not None and os.fspath(x) != ""):
        in_fd = _descriptor(in_path, is_input=True)
        if out_fd is None and in_fd is None:
            same = same_file(p, in_path)
        else:
            same = out_node is not None and out_node == _regular_node(in_path, in_fd)
        if same:
            where = f"{describe(flag, p)} ({_STREAM_NAMES[out_fd]})" if out_fd in _STREAM_NAMES else describe(flag, p)
            raise UserError(f"{where} is {_named(in_flag, in_path, in_fd)}; writing it would destroy the input")


def refuse_folder_holding_inputs(folder: PathLike, inputs: Iterable[Input], flag: str = "-output") -> None:
    """A one-line ``UserError`` if the output ``folder`` is, or holds, one of ``inputs`` (replacing
    the folder would delete them)."""
    for in_flag, in_path in _real_inputs(inputs):
        if _is_inside(in_path, os.fspath(folder)):
            what = f"the {in_flag} file {in_path}" if in_flag else f"the input {in_path}"
            raise UserError(f"{describe(flag, folder)} holds {what}; choose a folder that does not contain the input")


_FD_PATH = re.compile(r"^/(?:dev/fd|proc/(?:self|thread-self|\d+)/fd)/(\d+)$")
_STD_PATHS = {"/dev/stdout": 1, "/dev/stderr": 2}


def descriptor_of(path: PathLike) -> Optional[int]:
    """The file descriptor a path names (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``,
    ``/proc/self/fd/N``), which must be written through, not reopened: with ``>> log.txt`` the
    path resolves to the log file itself, and a rename over it would erase what it held."""
    p = os.fspath(path)
    if p in _STD_PATHS:
        return _STD_PATHS[p]
    m = _FD_PATH.match(p)
    return int(m.group(1)) if m else None


def is_special(path: PathLike) -> bool:
    """A character device, FIFO or socket (``/dev/stdout``, ``/dev/null``, a named pipe): written
    to directly, since renaming a file over it would replace the device node."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def check_writable_target(path: PathLike, flag: str = "-output", make_folder: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written: a folder, or a file whose folder
    does not exist (``make_folder``: whose folder cannot be created). Commands call this first so
    that a long run does not fail at its end."""
    p = os.fspath(path)
    if p == STDOUT or descriptor_of(p) is not None:
        return
    if os.path.isdir(p):
        raise UserError(f"{describe(flag, p)}: is a directory; give a file name")
    if is_special(p):
        return
    folder = os.path.dirname(os.path.realpath(p)) or "."
    if make_folder:
        while not os.path.lexists(folder):
            folder = os.path.dirname(folder)
        if not os.path.isdir(folder):
            raise UserError(f"{describe(flag, p)}: {folder} is a file, not a folder")
    elif not os.path.isdir(folder):
        raise UserError(f"{describe(flag, p)}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{describe(flag, p)}: cannot write in {folder} (permission denied)")
    if os.path.exists(p) and not os.access(p, os.W_OK) and os.geteuid() != 0:
        raise UserError(f"{describe(flag, p)}: the file is not writable (permission denied)")


def _temporary_beside(target: str, flag: str, shown: str) -> tuple[int, str]:
    """Create ``.<name>.tmp<pid>`` beside ``target`` exclusively (no link followed)."""
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp{os.getpid()}")
    for _ in range(2):
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666), tmp
        except FileExistsError:  # our own pid's leftover: this process is the only one using the name
            os.remove(tmp)
        except OSError as e:
            folder = os.path.dirname(target)
            raise UserError(f"{describe(flag, shown)}: cannot write in {folder} ({_os_reason(e)})") from None
    raise UserError(f"{describe(flag, shown)}: cannot create a temporary file beside it")


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def output_file(
    path: PathLike,
    inputs: Iterable[Input] = (),
    flag: str = "-output",
    binary: bool = False,
    durable: bool = False,
    make_folder: bool = False,
) -> Iterator[IO]:
    """Open ``path`` for writing under the rules of this module; yields a text (UTF-8, ``\\n``) or
    binary file object. ``"-"`` is standard output. The output appears only if the ``with`` body
    completes; an exception inside it leaves any existing file untouched. ``durable`` fsyncs the
    file and its folder (checkpoints: after a power loss the name holds the old or the new file)."""
    p = os.fspath(path)
    refuse_inputs(p, inputs, flag)
    if p == STDOUT:
        if sys.stdout is None or sys.stdout.closed:
            raise UserError(f"{describe(flag, p)}: standard output is closed; give a file name")
        stream = sys.stdout.buffer if binary else sys.stdout
        try:
            yield stream
        except BrokenPipeError:
            raise  # the reader went away: ``bin.common.run`` reports it
        except OSError as e:
            raise UserError(f"standard output: write failed ({_os_reason(e)})") from None
        _flush(stream, flag, "standard output")
        return
    fd = descriptor_of(p)
    if fd is not None:
        with _stream_descriptor(fd, p, flag, binary) as f:
            yield f
        return
    check_writable_target(p, flag, make_folder)
    if make_folder:
        make_folders(os.path.dirname(os.path.abspath(p)), flag, p)
    if is_special(p):
        with _stream_special(p, flag, binary) as f:
            yield f
        return
    target = os.path.realpath(p)
    fd, tmp = _temporary_beside(target, flag, p)
    try:
        raw = os.fdopen(fd, "wb")
        f = raw if binary else io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
        try:
            with f:
                yield f
                f.flush()
                if durable:
                    os.fsync(raw.fileno())
        except OSError as e:
            raise UserError(f"{describe(flag, p)}: write failed ({_os_reason(e)}); nothing was written") from None
        _copy_mode(target, tmp)
        try:
            os.replace(tmp, target)
            if durable:
                _fsync_folder(os.path.dirname(target))
        except OSError as e:
            raise UserError(f"{describe(flag, p)}: cannot replace it ({_os_reason(e)})") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _copy_mode(target: str, tmp: str) -> None:
    """The replaced file keeps its permissions; a new one gets the usual ``0666 & ~umask``."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    with contextlib.suppress(OSError):
        os.chmod(tmp, mode)


@contextlib.contextmanager
def _stream_descriptor(fd: int, path: str, flag: str, binary: bool) -> Iterator[IO]:
    """Write through an already open descriptor (a duplicate, so closing it keeps the original)."""
    try:
        raw = os.fdopen(os.dup(fd), "wb")
    except OSError as e:
        raise UserError(f"{describe(flag, path)}: descriptor {fd} is not open ({_os_reason(e)})") from None
    f = raw if binary else io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
    try:
        with f:
            yield f
            _flush(f, flag, path)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise UserError(f"{describe(flag, path)}: write failed ({_os_reason(e)})") from None


@contextlib.contextmanager
def _stream_special(path: str, flag: str, binary: bool) -> Iterator[IO]:
    try:
        f = open(path, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": "\n"}))
    except OSError as e:
        raise UserError(f"{describe(flag, path)}: cannot open for writing ({_os_reason(e)})") from None
    try:
        with f:
            yield f
            _flush(f, flag, path)
    except OSError as e:
        raise UserError(f"{describe(flag, path)}: write failed ({_os_reason(e)})") from None


def _flush(stream: IO, flag: str, shown: str) -> None:
    try:
        stream.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise UserError(f"{describe(flag, shown)}: write failed ({_os_reason(e)})") from None


def write_text(path: PathLike, text: str, inputs: Iterable[Input] = (), flag: str = "-output", **kw) -> None:
    """:func:`output_file` for a text known in full."""
    with output_file(path, inputs, flag, **kw) as f:
        f.write(text)


def write_bytes(path: PathLike, data: bytes, inputs: Iterable[Input] = (), flag: str = "-output", **kw) -> None:
    """:func:`output_file` for bytes known in full."""
    with output_file(path, inputs, flag, binary=True, **kw) as f:
        f.write(data)


def make_folders(folder: PathLike, flag: str = "", shown: Optional[PathLike] = None) -> None:
    """``os.makedirs`` with a one-line error (a file in the way, permission, full disk)."""
    folder = os.fspath(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{describe(flag, shown or folder)}: {folder} exists and is not a folder") from None
    except OSError as e:
        reason = _os_reason(e)
        raise UserError(f"{describe(flag, shown or folder)}: cannot create the folder {folder} ({reason})") from None


@contextlib.contextmanager
def output_folder(
    path: PathLike, inputs: Sequence[Input] = (), flag: str = "-output", force: bool = False
) -> Iterator[str]:
    """Yield a fresh, empty folder beside ``path`` to build a whole output in; once the ``with``
    body completes it becomes ``path``. An existing non-empty ``path`` is refused unless ``force``,
    and even then it is only removed after the new folder is complete (renamed aside, the new one
    renamed in, the old one deleted). On any failure the old folder is as it was."""
    p = os.path.abspath(os.fspath(path))
    shown = os.fspath(path)
    refuse_folder_holding_inputs(p, inputs, flag)
    refuse_inputs(p, inputs, flag)
    exists = os.path.lexists(p)
    if exists and not os.path.isdir(p):
        raise UserError(f"{describe(flag, shown)} exists and is not a folder; remove it or choose another name")
    if exists and os.path.islink(p):
        raise UserError(f"{describe(flag, shown)} is a symbolic link; give the real folder")
    if exists and os.listdir(p) and not force:
        raise UserError(f"{describe(flag, shown)} exists and is not an empty folder; add -force to replace it")
    parent = os.path.dirname(p)
    make_folders(parent, flag, shown)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{describe(flag, shown)}: cannot write in {parent} (permission denied)")
    staging = os.path.join(parent, f".{os.path.basename(p)}.tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    make_folders(staging, flag, shown)
    try:
        try:
            yield staging
        except OSError as e:
            raise UserError(f"{describe(flag, shown)}: write failed ({_os_reason(e)}); nothing was replaced") from None
        _swap_in(staging, p)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging: str, target: str) -> None:
    if not os.path.exists(target):
        os.rename(staging, target)
        return
    old = f"{target}.old{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    os.rename(target, old)
    try:
        os.rename(staging, target)
    except OSError:
        os.rename(old, target)  # put the old folder back: the user keeps what they had
        raise
    shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------- inputs


def input_problem(path: PathLike) -> Optional[str]:
    """Why ``path`` cannot be read as a file (None if it can): not found, a folder, no permission."""
    p = os.fspath(path)
    if os.path.isdir(p):
        return "is a directory, not a file"
    if not os.path.lexists(p):
        return "file not found"
    if not os.path.exists(p):
        return "is a broken symbolic link"
    if not os.access(p, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def check_readable_file(path: PathLike, flag: str = "") -> None:
    """A one-line ``UserError`` naming ``flag`` and ``path`` unless it is a readable file."""
    problem = input_problem(path)
    if problem:
        raise DataError(f"{describe(flag, path)}: {problem}")


def open_input(path: PathLike, flag: str = "") -> IO[bytes]:
    """Open a user's file for reading in binary, with the reason in one line when it cannot be."""
    check_readable_file(path, flag)
    try:
        return open(path, "rb")
    except OSError as e:
        raise DataError(f"{describe(flag, path)}: cannot be read ({_os_reason(e)})") from None


def read_input_bytes(path: PathLike, flag: str = "", limit: int = 1 << 30, what: str = "file") -> bytes:
    """The whole of a small input (a subword model, a config), read with a bound so that
    ``/dev/zero`` or an endless pipe is an error, not a machine out of memory."""
    with open_input(path, flag) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise DataError(f"{describe(flag, path)}: cannot be read ({_os_reason(e)})") from None
    if len(data) > limit:
        raise DataError(f"{describe(flag, path)}: larger than {_size(limit)}; not a {what}")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


# the deepest nesting accepted in a JSON file a user hands in (configs and vocabularies nest 2-4 deep)
MAX_JSON_DEPTH = 64


def parse_json(data: Union[bytes, str], where: str, what: str = "JSON file", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A user's JSON, strictly: UTF-8, valid, nested at most ``max_depth`` deep (the parser's own
    limit is a ``RecursionError`` near 1000, and code walking a value nested that deep fails later);
    every problem a one-line ``DataError`` naming ``where``."""
    try:
        value = json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start}); not a {what}") from None
    except ValueError as e:
        raise DataError(f"{where}: not valid JSON ({str(e).splitlines()[0][:120]}); not a {what}") from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested more than {max_depth} deep; not a {what}") from None
    if _depth_over(value, max_depth):
        raise DataError(f"{where}: JSON nested more than {max_depth} deep; not a {what}")
    return value


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep (iteratively: no recursion)."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False
