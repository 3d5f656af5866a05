"""Contrastive suite files: the test item and the project's two formats, read as a stream (memory
does not grow with the suite). The published suites' own files are read by
:mod:`onmt_doc.evaluation.published_suites` into the same items; :mod:`onmt_doc.evaluation.contrastive`
scores them.

- **JSON** (ContraPro-style): a JSON array, or one object per line (JSON Lines). Keys, with
  ContraPro's own names accepted: ``source``/``src segment``, ``reference``/``ref segment``/
  ``correct``, ``contrastive`` (list of strings) or ``errors`` (list of ``{"contrastive": …}``),
  optional context inline as ``context_src``/``context_tgt`` (lists of sentences) or from separate
  context files (``context_lines`` lines per item), optional ``document id``/``document``, and the
  categories ``ante distance``, ``ref pronoun``, ``category`` (string or object) and
  ``categories`` (object).
- **TSV**: ``context source<TAB>context target<TAB>source<TAB>correct<TAB>contrastive…``; several
  context sentences in one field are separated by ``" ||| "``. An optional first line starting
  with ``#`` names the columns: ``context_src``, ``context_tgt``, ``source``, ``correct``,
  ``contrastive`` (the last, taking the rest of the row); any other name is a category.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import IO, Iterator, Optional, Sequence

from onmt_doc.errors import DataError, UserError
from onmt_doc.outputs import check_readable_file

log = logging.getLogger("onmt_doc")

CONTEXT_SEP = " ||| "
TSV_COLUMNS = ("context_src", "context_tgt", "source", "correct", "contrastive")
FORMATS = ("json", "tsv", "contrapro", "voita", "bawden")


@dataclass
class ContrastiveItem:
    """One test item: a source, its correct translation and the minimally different wrong ones, with
    the context pairs and categories the report groups by; both file formats read into it."""

    where: str  # "FILE:LINE" or "FILE item N", for error messages
    src: str
    correct: str
    contrastive: list[str]
    ctx_src: list[str] = field(default_factory=list)
    ctx_tgt: list[str] = field(default_factory=list)
    categories: dict[str, str] = field(default_factory=dict)
    document: Optional[str] = None  # document id; the shuffle ablation takes context from others
    # each candidate's own target context (candidates() order), where a suite gives one per candidate
    # (Voita et al., Bawden et al.); None: every candidate reads ctx_tgt
    candidate_ctx_tgt: Optional[list[list[str]]] = None
    correct_index: int = 0  # the correct candidate's place in the suite's own order (first_best rule)
    block: Optional[str] = None  # block id (Bawden et al.'s example blocks; the block rule)

    def candidates(self) -> list[str]:
        """The sentences to score, the correct one first (scores are compared in this order)."""
        return [self.correct, *self.contrastive]

    def target_contexts(self) -> list[list[str]]:
        """The target context of each candidate, in :meth:`candidates` order."""
        if self.candidate_ctx_tgt is not None:
            return self.candidate_ctx_tgt
        return [self.ctx_tgt] * (1 + len(self.contrastive))

    def has_duplicate(self) -> bool:
        """A contrastive candidate identical to the correct one (the same sentence and target context)."""
        contexts = self.target_contexts()
        return any(c == self.correct and t == contexts[0] for c, t in zip(self.contrastive, contexts[1:]))


# ---------------------------------------------------------------------------------- reading
def _open(path: str) -> "_BoundedText":
    check_readable_file(path)
    try:
        return _BoundedText(open(path, encoding="utf-8"), path)
    except OSError as e:
        raise UserError(f"{path}: cannot read the suite ({e.strerror})") from None


class _BoundedText:
    """A suite file whose lines are read with a bound (``MAX_ITEM_CHARS``): a file with no line
    end (``/dev/zero``) is an error, not all the memory there is."""

    def __init__(self, f: IO[str], path: str) -> None:
        self.f, self.path, self.number = f, path, 0

    def __enter__(self) -> "_BoundedText":
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()

    def read(self, n: int) -> str:
        """Up to ``n`` characters (the JSON reader's chunks)."""
        try:
            return self.f.read(n)
        except UnicodeDecodeError as e:
            raise DataError(f"{self.path}: not UTF-8 text ({e.reason} at byte {e.start})") from None

    def readline(self) -> str:
        """The next line ('' at the end), refused past the bound."""
        try:
            line = self.f.readline(MAX_ITEM_CHARS + 1)
        except UnicodeDecodeError as e:
            raise DataError(f"{self.path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        self.number += bool(line)
        if len(line) > MAX_ITEM_CHARS:
            raise DataError(f"{self.path}:{self.number}: line longer than {MAX_ITEM_CHARS >> 20} Mi characters")
        return line

    def __iter__(self) -> Iterator[str]:
        return iter(self.readline, "")


def detect_format(path: str) -> str:
    """The suite's format: ``tsv`` unless the first non-blank character is ``[`` or ``{``; a JSON
    suite is ``voita`` (items with ``dst`` and ``true_ind``), ``bawden`` (one object of numbered
    blocks, each with ``src`` and ``trg`` (anaphora) or ``examples`` (lexical choice: the sources
    are inside the examples)) or else ``json``, judged by its first value.
    ContraPro's JSON reads as ``json`` too (as do ContraPro-style suites such as the toy one); its
    per-candidate context files and its evaluate.py's categories need ``-format contrapro``."""
    with _open(path) as f:
        for line in f:
            if line.strip():
                if line.lstrip()[0] not in "[{":
                    return "tsv"
                break
        else:
            raise DataError(f"{path}: empty suite")
    first = next((value for _, value in _json_objects(path)), None)
    if isinstance(first, dict):
        if "dst" in first and "true_ind" in first:
            return "voita"
        if first and all(
            isinstance(v, dict) and (("src" in v and "trg" in v) or "examples" in v) for v in first.values()
        ):
            return "bawden"
    return "json"


def _check_item(item: ContrastiveItem) -> ContrastiveItem:
    """An item must have text in every candidate and as many context targets as sources (for every
    candidate, when each has its own); blank context positions are dropped."""
    if not item.src.strip() or not item.correct.strip():
        raise DataError(f"{item.where}: empty source or correct translation")
    if not item.contrastive or any(not c.strip() for c in item.contrastive):
        raise DataError(f"{item.where}: needs at least one non-empty contrastive translation")
    if not 0 <= item.correct_index <= len(item.contrastive):
        raise DataError(f"{item.where}: the correct candidate's index {item.correct_index} is out of range")
    contexts = item.target_contexts()
    if len(contexts) != 1 + len(item.contrastive):
        raise DataError(f"{item.where}: {len(contexts)} target contexts for {1 + len(item.contrastive)} candidates")
    for k, ctx_tgt in enumerate(contexts):
        if len(item.ctx_src) != len(ctx_tgt):
            which = f" (candidate {k + 1})" if item.candidate_ctx_tgt is not None else ""
            raise DataError(
                f"{item.where}: {len(item.ctx_src)} context source sentences but "
                f"{len(ctx_tgt)} context target sentences{which}"
            )
        for s, t in zip(item.ctx_src, ctx_tgt):
            if bool(s.strip()) != bool(t.strip()):
                raise DataError(f"{item.where}: a context sentence is empty on one side only")
    keep = [i for i, s in enumerate(item.ctx_src) if s.strip()]
    item.ctx_src = [item.ctx_src[i] for i in keep]
    contexts = [[ctx[i] for i in keep] for ctx in contexts]
    item.ctx_tgt = contexts[0]
    item.candidate_ctx_tgt = None if all(c == contexts[0] for c in contexts) else contexts
    return item


def _split_context(text: str) -> list[str]:
    return [s.strip() for s in text.split(CONTEXT_SEP.strip())] if text.strip() else []


def iter_tsv(path: str) -> Iterator[ContrastiveItem]:
    """Items of a TSV suite (see the module docstring), one per non-blank line."""
    columns = list(TSV_COLUMNS)
    with _open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if number == 1 and line.startswith("#"):
                columns = _tsv_header(path, line[1:].split("\t"))
                continue
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < len(columns):
                raise DataError(
                    f"{path}:{number}: {len(fields)} tab-separated fields, need at least "
                    f"{len(columns)} ({', '.join(columns)})"
                )
            row = dict(zip(columns[:-1], fields))
            yield _check_item(
                ContrastiveItem(
                    f"{path}:{number}",
                    row["source"],
                    row["correct"],
                    fields[len(columns) - 1 :],
                    _split_context(row["context_src"]),
                    _split_context(row["context_tgt"]),
                    {k: v for k, v in row.items() if k not in TSV_COLUMNS},
                )
            )


def _tsv_header(path: str, names: list[str]) -> list[str]:
    names = [n.strip() for n in names]
    missing = [n for n in TSV_COLUMNS if n not in names]
    if missing or names[-1] != "contrastive" or len(set(names)) != len(names):
        raise DataError(
            f"{path}:1: the header must name each of {', '.join(TSV_COLUMNS)} once, "
            f"'contrastive' last (got {' | '.join(names)}; missing {', '.join(missing) or 'none'})"
        )
    return names


# the longest suite item read (items are a few KB; this stops /dev/zero and files that are not JSON)
MAX_ITEM_CHARS = 64 << 20


def _json_objects(path: str, chunk_chars: int = 1 << 16) -> Iterator[tuple[int, object]]:
    """(line, value) of each top-level value of a JSON array or of a JSON Lines file, decoded
    incrementally so that a large suite is never held in memory at once."""
    decoder = json.JSONDecoder()
    with _open(path) as f:
        buf, pos, line, in_array, done = "", 0, 1, None, False
        while True:
            # skip whitespace and, inside an array, the separators
            while True:
                while pos < len(buf) and (buf[pos].isspace() or (in_array and buf[pos] == ",")):
                    line += buf[pos] == "\n"
                    pos += 1
                if pos < len(buf) or done:
                    break
                buf, pos = buf[pos:] + f.read(chunk_chars), 0
                done = pos >= len(buf)
            if pos >= len(buf):
                if in_array:
                    raise DataError(f"{path}:{line}: the JSON array is not closed")
                return
            if in_array is None:
                in_array = buf[pos] == "["
                pos += in_array
                continue
            if in_array and buf[pos] == "]":
                return
            while True:
                err: Optional[ValueError] = None
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except ValueError as e:
                    err = e
                except RecursionError:
                    raise DataError(f"{path}:{line}: JSON nested too deeply to be a suite item") from None
                # a value ending at the buffer's end (a number) may continue in the next chunk
                if err is None and (end < len(buf) or done):
                    break
                if done:
                    where = line + buf.count("\n", pos, getattr(err, "pos", pos))
                    raise DataError(f"{path}:{where}: invalid JSON ({getattr(err, 'msg', err)})")
                if len(buf) - pos > MAX_ITEM_CHARS:
                    raise DataError(
                        f"{path}:{line}: no complete JSON value in {MAX_ITEM_CHARS >> 20} Mi characters; "
                        f"is this a JSON suite?"
                    )
                more = f.read(chunk_chars)
                buf += more
                done = not more
            yield line, value
            line += buf.count("\n", pos, end)
            pos = end


def _text_list(value: object, where: str, key: str) -> list[str]:
    if isinstance(value, str):
        return _split_context(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise DataError(f"{where}: '{key}' must be a string or a list of strings")


def _first(obj: dict, keys: Sequence[str], where: str, required: bool = True) -> object:
    for k in keys:
        if k in obj:
            return obj[k]
    if required:
        raise DataError(f"{where}: missing '{keys[0]}' (or {', '.join(repr(k) for k in keys[1:])})")
    return None


def _json_item(obj: object, where: str) -> ContrastiveItem:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    src = _first(obj, ("source", "src segment"), where)
    correct = _first(obj, ("reference", "ref segment", "correct"), where)
    if "contrastive" in obj:
        wrong = (
            _text_list(obj["contrastive"], where, "contrastive")
            if isinstance(obj["contrastive"], list)
            else [obj["contrastive"]]
        )
    else:
        errors = _first(obj, ("errors",), where)
        if not isinstance(errors, list) or not all(isinstance(e, dict) and "contrastive" in e for e in errors):
            raise DataError(f"{where}: 'errors' must be a list of objects with a 'contrastive' translation")
        wrong = [e["contrastive"] for e in errors]
    if not all(isinstance(v, str) for v in (src, correct, *wrong)):
        raise DataError(f"{where}: source, reference and contrastive translations must be strings")
    cats = {}
    for key in ("ante distance", "ref pronoun"):
        if key in obj:
            cats[key] = str(obj[key])
    cat = obj.get("category")
    if cat is not None:
        cats.update({str(k): str(v) for k, v in cat.items()} if isinstance(cat, dict) else {"category": str(cat)})
    if isinstance(obj.get("categories"), dict):
        cats.update({str(k): str(v) for k, v in obj["categories"].items()})
    doc = _first(obj, ("document id", "document"), where, required=False)
    return ContrastiveItem(
        where,
        src,
        correct,
        wrong,
        _text_list(obj.get("context_src", []), where, "context_src"),
        _text_list(obj.get("context_tgt", []), where, "context_tgt"),
        cats,
        None if doc is None else str(doc),
    )


def iter_json(
    path: str, context_src: Optional[str] = None, context_tgt: Optional[str] = None, context_lines: int = 1
) -> Iterator[ContrastiveItem]:
    """Items of a JSON suite; with context files, ``context_lines`` lines of each (blank = no
    sentence) are the context of each item, in order. Context files whose length fits one block per
    candidate instead (ContraPro's json2text_and_context.pl) are refused before any item is read."""
    if bool(context_src) != bool(context_tgt):
        raise UserError("context files come in pairs: give both -context_src and -context_tgt")
    if context_src:
        _check_item_blocks(path, context_src, context_tgt, context_lines)
    return _iter_json(path, context_src, context_tgt, context_lines)


def _check_item_blocks(path: str, context_src: str, context_tgt: str, n: int) -> None:
    """Before scoring: the context files hold ``n`` lines per item of ``path``."""
    if n < 1:
        raise UserError(f"-context_lines must be at least 1 (got {n})")
    items = candidates = 0
    for line, obj in _json_objects(path):
        item = _json_item(obj, f"{path}:{line} (item {items + 1})")
        items += 1
        candidates += 1 + len(item.contrastive)
    lines, other = count_lines(context_src), count_lines(context_tgt)
    if lines == other == n * items:
        return
    if lines == other == n * candidates:
        raise DataError(
            f"{context_src}: {lines} lines = {n} per candidate of the {candidates} candidates of {path}, not per "
            f"item ({items} items): context written once per candidate (ContraPro's json2text_and_context.pl) "
            f"goes with -format contrapro"
        )
    if lines != other or lines % n:
        raise DataError(f"{context_src} and {context_tgt}: line counts are not a multiple of {n} or differ")
    if lines < n * items:
        raise DataError(f"{context_src}: ends before item {lines // n + 1} of {path} ({n} context lines per item)")
    raise DataError(f"{context_src}: has more context lines than {path} has items ({n} per item)")


def count_lines(path: str) -> int:
    """The number of lines of a text file, read with the suite reader's bounds."""
    with _open(path) as f:
        return sum(1 for _ in f)


def _iter_json(
    path: str, context_src: Optional[str], context_tgt: Optional[str], context_lines: int
) -> Iterator[ContrastiveItem]:
    ctx = _context_blocks(context_src, context_tgt, context_lines) if context_src else None
    for n, (line, obj) in enumerate(_json_objects(path), 1):
        item = _json_item(obj, f"{path}:{line} (item {n})")
        if ctx is not None:
            block = next(ctx, None)
            if block is None:
                raise DataError(
                    f"{context_src}: ends before item {n} of {path} ({context_lines} context lines per item)"
                )
            item.ctx_src, item.ctx_tgt = block
        yield _check_item(item)
    if ctx is not None and next(ctx, None) is not None:
        raise DataError(f"{context_src}: has more context lines than {path} has items ({context_lines} per item)")


def _context_blocks(src: str, tgt: str, n: int) -> Iterator[tuple[list[str], list[str]]]:
    if n < 1:
        raise UserError(f"-context_lines must be at least 1 (got {n})")
    with _open(src) as fs, _open(tgt) as ft:
        while True:
            s = [fs.readline() for _ in range(n)]
            t = [ft.readline() for _ in range(n)]
            if not s[0] and not t[0]:
                return
            if any(x == "" for x in s + t):
                raise DataError(f"{src} and {tgt}: line counts are not a multiple of {n} or differ")
            yield [x.rstrip("\r\n") for x in s], [x.rstrip("\r\n") for x in t]


def _utf8(items: Iterator[ContrastiveItem], path: str) -> Iterator[ContrastiveItem]:
    """A suite or context file that is not UTF-8 is a one-line error, not a traceback."""
    try:
        yield from items
    except UnicodeDecodeError as e:
        raise DataError(f"{path} (or its context files): not UTF-8 text ({e.reason} at byte {e.start})") from None
