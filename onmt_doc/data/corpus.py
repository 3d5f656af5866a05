"""Document files: one sentence per line, a blank line between documents.

Source and target files are line-aligned, blank lines included. Readers validate as they go and
report the file and line of the first problem; nothing is silently dropped or realigned.

Line breaks (training and translation alike): a line ends at LF; a CR just before the LF (CRLF)
is removed. Any other character that some tools read as a line break (CR alone, NEL U+0085, LS
U+2028, PS U+2029, VT, FF, FS/GS/RS) is an error naming the file and line: a file with CR-only
line ends would otherwise be one long line. A line that is empty or holds only whitespace (any
Unicode whitespace, NBSP and U+3000 included) is a document break; non-empty ones are counted
and logged as a warning naming the first, since they may be a mistake.
"""

from __future__ import annotations

import logging
import re
import sys
from itertools import zip_longest
from typing import IO, Iterator, Optional

from onmt_doc.errors import DataError
from onmt_doc.outputs import open_input

log = logging.getLogger("onmt_doc")

# characters str.splitlines() and other tools treat as line breaks (LF is the line end itself)
_OTHER_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_BREAK_NAMES = {
    "\r": "CR (carriage return without LF: old Mac line ends? convert them to LF)",
    "\x0b": "VT (U+000B)",
    "\x0c": "FF (U+000C)",
    "\x1c": "FS (U+001C)",
    "\x1d": "GS (U+001D)",
    "\x1e": "RS (U+001E)",
    "\x85": "NEL (U+0085)",
    "\u2028": "LS (U+2028)",
    "\u2029": "PS (U+2029)",
}


def _check_line(line: str, name: str, number: int, max_chars: int) -> None:
    """Refuse line-break characters inside a line, then over-long lines."""
    other = _OTHER_BREAKS.search(line)
    if other:
        raise DataError(
            f"{name}:{number}: column {other.start() + 1} holds the line break "
            f"{_BREAK_NAMES[other.group()]}; only LF and CRLF end lines"
        )
    if max_chars and len(line) > max_chars:
        raise DataError(f"{name}:{number}: line has {len(line)} characters, more than data.max_line_chars={max_chars}")


# the longest line read when data.max_line_chars is 0 (no limit set): a file or device with no line
# end (``/dev/zero``, an endless pipe) is an error once a line passes it, not a machine out of memory
MAX_LINE_BYTES = 64 << 20


def _stdin() -> IO[bytes]:
    if sys.stdin is None or sys.stdin.closed:
        raise DataError("standard input is closed; give a file instead of '-'")
    return sys.stdin.buffer


def bounded_lines(stream: IO[bytes], name: str, max_chars: int) -> Iterator[bytes]:
    """The raw lines of ``stream``, each read with a bound (4 bytes per allowed character, at
    most ``MAX_LINE_BYTES``), so one endless line cannot exhaust memory."""
    limit = min(4 * max_chars + 2, MAX_LINE_BYTES) if max_chars else MAX_LINE_BYTES
    number = 0
    while True:
        try:
            raw = stream.readline(limit + 1)
        except OSError as e:
            raise DataError(f"{name}: read failed after line {number} ({e.strerror or e})") from None
        if not raw:
            return
        number += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            most = f"data.max_line_chars={max_chars}" if max_chars and limit < MAX_LINE_BYTES else f"{limit} bytes"
            raise DataError(f"{name}:{number}: line longer than {most} (no line end found); is this a text file?")
        yield raw


def iter_lines(path: str, max_chars: int = 0, stream: Optional[IO[bytes]] = None) -> Iterator[str]:
    """Lines of a UTF-8 file without their line ends ('-' = standard input)."""
    name = "<stdin>" if path == "-" else path
    if stream is None:
        stream = _stdin() if path == "-" else open_input(path)
    blank_like, first_blank_like = 0, 0
    try:
        for number, raw in enumerate(bounded_lines(stream, name, max_chars), 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{name}:{number}: invalid UTF-8 at byte {e.start}") from None
            line = line[:-2] if line.endswith("\r\n") else line[:-1] if line.endswith("\n") else line
            _check_line(line, name, number, max_chars)
            stripped = line.strip()
            if line and not stripped:
                blank_like += 1
                first_blank_like = first_blank_like or number
            yield stripped
        if blank_like:
            log.warning(
                f"{name}: {blank_like} line(s) hold only whitespace (first: line "
                f"{first_blank_like}); each is a document break"
            )
    finally:
        if path != "-":
            stream.close()


Pair = tuple[str, Optional[str]]


def iter_aligned(src: str, tgt: Optional[str], max_chars: int = 0) -> Iterator[Pair]:
    """Stream the checked line pairs of two line-aligned files (``tgt=None``: source lines with
    ``None``); a blank line is ``("", "")``. A blank line on one side only, or a different number of
    lines, is an error naming the file and the first line where the two files diverge. Holds one
    line pair at a time: binarization reads corpora of any size through it."""
    tgt_lines = iter_lines(tgt, max_chars) if tgt else None
    number = 0
    for number, (s, t) in enumerate(zip_longest(iter_lines(src, max_chars), tgt_lines or ()), 1):
        if tgt_lines is not None:
            if s is None or t is None:
                short, other = (src, tgt) if s is None else (tgt, src)
                raise DataError(
                    f"{short}: ends at line {number - 1} but {other} continues "
                    f"(files must be line-aligned, blank lines included)"
                )
            if bool(s) != bool(t):
                blank, full = (src, tgt) if not s else (tgt, src)
                raise DataError(
                    f"{blank}:{number}: blank line (document break) where {full}:{number} "
                    f"has a sentence; the files are misaligned from here"
                )
        yield s, t
    if number == 0:
        raise DataError(f"{src}: file is empty")


def iter_parallel(
    src: str,
    tgt: Optional[str],
    documents: bool = True,
    max_chars: int = 0,
) -> Iterator[Optional[list[Pair]]]:
    """Stream aligned documents of (source, target) pairs, ``None`` for each blank line
    (:func:`iter_aligned` checks the alignment).

    ``tgt=None`` gives source-only pairs.
    """
    doc: list[Pair] = []
    for s, t in iter_aligned(src, tgt, max_chars):
        if not s:
            if doc:
                yield doc
                doc = []
            yield None
        elif documents:
            doc.append((s, t))
        else:
            yield [(s, t)]
    if doc:
        yield doc


def read_parallel(src: str, tgt: str, documents: bool = True, max_chars: int = 0) -> list[list[tuple[str, str]]]:
    """All aligned documents of a parallel corpus (blank lines only separate them)."""
    return [d for d in iter_parallel(src, tgt, documents, max_chars) if d is not None]
