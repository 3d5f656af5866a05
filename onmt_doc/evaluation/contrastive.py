"""Contrastive test suites: does a model score the correct translation above minimally different
wrong ones, given the context? (ContraPro, Müller et al., 2018; Voita et al., 2019; Bawden et al.,
2018.)

Two formats, both read as a stream (memory does not grow with the suite):

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

Every candidate is scored by forced decoding in context through :meth:`Translator.score_items`,
the code path of ``onmt_doc_translate -score``: a candidate's score is the log-probability of its
sentence (markup and final ``<eos>`` included) as the last sentence of a document made of the
context pairs (reference context translations) and the (source, candidate) pair.
"""

from __future__ import annotations

import json
import random
from collections import deque
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Iterable, Iterator, Optional, Sequence

from onmt_doc.errors import DataError, UserError
from onmt_doc.outputs import check_readable_file

if TYPE_CHECKING:
    from onmt_doc.translate.translator import Translator

CONTEXT_SEP = " ||| "
TSV_COLUMNS = ("context_src", "context_tgt", "source", "correct", "contrastive")
SHUFFLE_BLOCK = 256  # items whose contexts are exchanged in the "shuffle" ablation
ABLATIONS = ("none", "remove", "shuffle")


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

    def candidates(self) -> list[str]:
        """The sentences to score, the correct one first (scores are compared in this order)."""
        return [self.correct, *self.contrastive]


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
        return self.f.read(n)

    def readline(self) -> str:
        """The next line ('' at the end), refused past the bound."""
        line = self.f.readline(MAX_ITEM_CHARS + 1)
        self.number += bool(line)
        if len(line) > MAX_ITEM_CHARS:
            raise DataError(f"{self.path}:{self.number}: line longer than {MAX_ITEM_CHARS >> 20} Mi characters")
        return line

    def __iter__(self) -> Iterator[str]:
        return iter(self.readline, "")


def detect_format(path: str) -> str:
    """``json`` when the first non-blank character is ``[`` or ``{``, else ``tsv``."""
    with _open(path) as f:
        for line in f:
            if line.strip():
                return "json" if line.lstrip()[0] in "[{" else "tsv"
    raise DataError(f"{path}: empty suite")


def _check_item(item: ContrastiveItem) -> ContrastiveItem:
    """An item must have text in every candidate and as many context targets as sources."""
    if not item.src.strip() or not item.correct.strip():
        raise DataError(f"{item.where}: empty source or correct translation")
    if not item.contrastive or any(not c.strip() for c in item.contrastive):
        raise DataError(f"{item.where}: needs at least one non-empty contrastive translation")
    if len(item.ctx_src) != len(item.ctx_tgt):
        raise DataError(
            f"{item.where}: {len(item.ctx_src)} context source sentences but "
            f"{len(item.ctx_tgt)} context target sentences"
        )
    for s, t in zip(item.ctx_src, item.ctx_tgt):
        if bool(s.strip()) != bool(t.strip()):
            raise DataError(f"{item.where}: a context sentence is empty on one side only")
    pairs = [(s, t) for s, t in zip(item.ctx_src, item.ctx_tgt) if s.strip()]
    item.ctx_src, item.ctx_tgt = [s for s, _ in pairs], [t for _, t in pairs]
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
    sentence) are the context of each item, in order."""
    if bool(context_src) != bool(context_tgt):
        raise UserError("context files come in pairs: give both -context_src and -context_tgt")
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


def read_suite(
    path: str,
    fmt: str = "auto",
    context_src: Optional[str] = None,
    context_tgt: Optional[str] = None,
    context_lines: int = 1,
) -> Iterator[ContrastiveItem]:
    """The items of a suite file, streamed, in either format."""
    try:
        fmt = detect_format(path) if fmt == "auto" else fmt
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if fmt == "tsv":
        if context_src or context_tgt:
            raise UserError("context files go with JSON suites; a TSV suite has its context in its rows")
        return _utf8(iter_tsv(path), path)
    if fmt == "json":
        return _utf8(iter_json(path, context_src, context_tgt, context_lines), path)
    raise UserError(f"unknown suite format {fmt!r} (auto, json or tsv)")


def _utf8(items: Iterator[ContrastiveItem], path: str) -> Iterator[ContrastiveItem]:
    """A suite or context file that is not UTF-8 is a one-line error, not a traceback."""
    try:
        yield from items
    except UnicodeDecodeError as e:
        raise DataError(f"{path} (or its context files): not UTF-8 text ({e.reason} at byte {e.start})") from None


# ---------------------------------------------------------------------------------- ablations
def ablate(items: Iterable[ContrastiveItem], mode: str, seed: int = 1) -> Iterator[ContrastiveItem]:
    """The items unchanged (``none``), without context (``remove``), or each with the context of
    another document's item (``shuffle``: exchanged within blocks of SHUFFLE_BLOCK items)."""
    if mode == "none":
        return iter(items)
    if mode == "remove":
        return (
            ContrastiveItem(i.where, i.src, i.correct, i.contrastive, [], [], i.categories, i.document) for i in items
        )
    if mode == "shuffle":
        return _shuffled(items, random.Random(seed))
    raise UserError(f"unknown ablation {mode!r} ({', '.join(ABLATIONS)})")


def _shuffled(items: Iterable[ContrastiveItem], rng: random.Random) -> Iterator[ContrastiveItem]:
    block: list[ContrastiveItem] = []
    for item in items:
        block.append(item)
        if len(block) == SHUFFLE_BLOCK:
            yield from _exchange(block, rng)
            block = []
    yield from _exchange(block, rng)


def _doc_key(item: ContrastiveItem) -> object:
    return item.document if item.document is not None else tuple(item.ctx_src)


def _exchange(block: list[ContrastiveItem], rng: random.Random) -> Iterator[ContrastiveItem]:
    """Each item takes the context of a random other item of the block from another document
    (of any other item when the whole block is one document)."""
    for i, item in enumerate(block):
        others = [j for j in range(len(block)) if j != i and _doc_key(block[j]) != _doc_key(item)]
        others = others or [j for j in range(len(block)) if j != i] or [i]
        donor = block[rng.choice(others)]
        yield ContrastiveItem(
            item.where,
            item.src,
            item.correct,
            item.contrastive,
            donor.ctx_src,
            donor.ctx_tgt,
            item.categories,
            item.document,
        )


# ---------------------------------------------------------------------------------- scoring
class ContextWindow:
    """How much of an item's context a model reads: none for sentence models; for document and
    context models, the most recent sentences that fit in one instance (``data.max_tokens``, and
    ``translate.window_sentences``/``data.max_sentences`` for HM-GDC), so the scored sentence is
    never cut off from its context by the translator's windows."""

    def __init__(self, translator: Translator, max_sentences: int = 0) -> None:
        """``translator`` supplies the codec, the model's unit and the window limits; ``max_sentences``
        (> 0) caps the context sentences further."""
        self.codec, self.unit = translator.codec, translator.model.unit
        data = translator.cfg.data
        self.max_tokens = data.max_tokens
        window = (translator.opt.window_sentences or data.max_sentences) if self.unit == "context" else 0
        limits = ([max_sentences] if max_sentences > 0 else []) + ([window - 1] if window > 0 else [])
        self.max_sentences: Optional[int] = min(limits) if limits else None

    def __call__(self, item: ContrastiveItem) -> list[tuple[str, str]]:
        """The (source, target) context pairs the model reads for ``item``, oldest first."""
        if self.unit == "sentence" or not item.ctx_src:
            return []
        pairs = list(zip(item.ctx_src, item.ctx_tgt))
        if self.max_sentences is not None:
            pairs = pairs[len(pairs) - self.max_sentences :] if self.max_sentences else []
        if not pairs:
            return []
        src = self.codec.encode([s for s, _ in pairs] + [item.src], "src")
        tgt = self.codec.encode([t for _, t in pairs] + item.candidates(), "tgt")
        src_len = 1 + len(src[-1]) + 2
        tgt_len = 1 + max(len(t) for t in tgt[len(pairs) :]) + 2
        keep = 0
        for k in range(len(pairs) - 1, -1, -1):
            src_len += len(src[k]) + 2
            tgt_len += len(tgt[k]) + 2
            if src_len > self.max_tokens or tgt_len > self.max_tokens:
                break
            keep += 1
        return pairs[len(pairs) - keep :]


def score_suite(
    translator: Translator, items: Iterable[ContrastiveItem], max_context: int = 0
) -> Iterator[tuple[ContrastiveItem, list[float]]]:
    """Each item with the forced-decoding scores of its candidates (correct first), in order.

    Every candidate is one document (context pairs + the candidate pair) scored by
    ``translator.score_items`` exactly as ``onmt_doc_translate -score`` scores it; the
    translator's read-ahead buffer bounds memory.
    """
    window = ContextWindow(translator, max_context)
    pending: deque = deque()

    def documents() -> Iterator[list[tuple[str, str]]]:
        for item in items:
            pending.append(item)
            context = window(item)
            for cand in item.candidates():
                yield [*context, (item.src, cand)]

    scores: list[float] = []
    for out in translator.score_items(documents(), exact=True):
        scores.append(float(out[-1]))
        if len(scores) == len(pending[0].candidates()):
            yield pending.popleft(), scores
            scores = []


@dataclass
class Accuracy:
    """Correct = the correct candidate scores strictly above every contrastive one (ties lose)."""

    correct: int = 0
    total: int = 0
    by_category: dict = field(default_factory=dict)  # name -> value -> [correct, total]

    def add(self, item: ContrastiveItem, scores: Sequence[float]) -> bool:
        """Count one scored item (``scores`` in :meth:`ContrastiveItem.candidates` order); True if correct."""
        ok = scores[0] > max(scores[1:])
        self.correct += ok
        self.total += 1
        for name, value in item.categories.items():
            cell = self.by_category.setdefault(name, {}).setdefault(value, [0, 0])
            cell[0] += ok
            cell[1] += 1
        return ok

    def summary(self) -> dict:
        """Accuracy in percent overall and per category value, with the counts (JSON-ready)."""

        def pct(c: int, n: int) -> float:
            return 100.0 * c / n if n else 0.0

        return {
            "accuracy": pct(self.correct, self.total),
            "correct": self.correct,
            "total": self.total,
            "categories": {
                name: {
                    v: {"accuracy": pct(*cell), "correct": cell[0], "total": cell[1]}
                    for v, cell in sorted(values.items(), key=lambda kv: _natural(kv[0]))
                }
                for name, values in sorted(self.by_category.items())
            },
        }


def _natural(value: str) -> tuple:
    """Numbers in numeric order, before other values (antecedent distance 2 before 10)."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def evaluate_suite(
    translator: Translator,
    items: Iterable[ContrastiveItem],
    max_context: int = 0,
    item_scores: Optional[IO[str]] = None,
) -> dict:
    """Accuracy overall and per category; with ``item_scores``, one JSON line per item."""
    acc = Accuracy()
    for item, scores in score_suite(translator, items, max_context):
        ok = acc.add(item, scores)
        if item_scores is not None:
            item_scores.write(
                json.dumps({"item": item.where, "correct": ok, "scores": scores, "categories": item.categories}) + "\n"
            )
    if not acc.total:
        raise DataError("the suite has no items")
    return acc.summary()


def format_table(results: dict[str, dict]) -> str:
    """A console table: one column per ablation, one row for the total and per category value."""
    modes = list(results)
    rows = [("all", "", {m: results[m] for m in modes})]
    names = sorted({n for r in results.values() for n in r["categories"]})
    for name in names:
        values = sorted({v for r in results.values() for v in r["categories"].get(name, {})}, key=_natural)
        rows += [(name, v, {m: results[m]["categories"].get(name, {}).get(v) for m in modes}) for v in values]
    head = f"{'category':<18} {'value':<10} {'items':>7} " + " ".join(f"{'ctx=' + m:>14}" for m in modes)
    lines = [head, "-" * len(head)]
    for name, value, cells in rows:
        total = next((c["total"] for c in cells.values() if c), 0)
        acc = " ".join(f"{c['accuracy']:>13.1f}%" if c else f"{'-':>14}" for c in cells.values())
        lines.append(f"{name[:18]:<18} {value[:10]:<10} {total:>7} {acc}")
    return "\n".join(lines)
