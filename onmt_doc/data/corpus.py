"""Document files: one sentence per line, a blank line between documents.

Source and target files are line-aligned, blank lines included. Readers validate as they go and
report the file and line of the first problem; nothing is silently dropped or realigned.
"""
from __future__ import annotations

import sys
from itertools import zip_longest
from typing import IO, Iterator, Optional

from onmt_doc.errors import DataError

def iter_lines(path: str, max_chars: int = 0, stream: Optional[IO[bytes]] = None) -> Iterator[str]:
    """Lines of a UTF-8 file without their line ends ('-' = standard input)."""
    name = "<stdin>" if path == "-" else path
    if stream is None:
        if path == "-":
            stream = sys.stdin.buffer
        else:
            try:
                stream = open(path, "rb")
            except FileNotFoundError:
                raise DataError(f"{path}: file not found") from None
            except IsADirectoryError:
                raise DataError(f"{path}: is a directory, not a text file") from None
    try:
        for number, raw in enumerate(stream, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise DataError(f"{name}:{number}: invalid UTF-8 at byte {e.start}") from None
            if max_chars and len(line) > max_chars:
                raise DataError(f"{name}:{number}: line has {len(line)} characters, more than "
                                f"data.max_line_chars={max_chars}")
            yield line.strip()
    finally:
        if path != "-":
            stream.close()


Pair = tuple[str, Optional[str]]


def iter_parallel(src: str, tgt: Optional[str], documents: bool = True, max_chars: int = 0,
                  ) -> Iterator[Optional[list[Pair]]]:
    """Stream aligned documents of (source, target) pairs, ``None`` for each blank line.

    ``tgt=None`` gives source-only pairs. A blank line on one side only, or a different number of
    lines, is an error naming the file and the first line where the two files diverge.
    """
    tgt_lines = iter_lines(tgt, max_chars) if tgt else None
    doc: list[Pair] = []
    number = 0
    for number, (s, t) in enumerate(zip_longest(iter_lines(src, max_chars), tgt_lines or ()), 1):
        if tgt_lines is not None:
            if s is None or t is None:
                short, other = (src, tgt) if s is None else (tgt, src)
                raise DataError(f"{short}: ends at line {number - 1} but {other} continues "
                                f"(files must be line-aligned, blank lines included)")
            if bool(s) != bool(t):
                blank, full = (src, tgt) if not s else (tgt, src)
                raise DataError(f"{blank}:{number}: blank line (document break) where {full}:{number} "
                                f"has a sentence; the files are misaligned from here")
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
    if number == 0:
        raise DataError(f"{src}: file is empty")


def read_parallel(src: str, tgt: str, documents: bool = True,
                  max_chars: int = 0) -> list[list[tuple[str, str]]]:
    """All aligned documents of a parallel corpus (blank lines only separate them)."""
    return [d for d in iter_parallel(src, tgt, documents, max_chars) if d is not None]
