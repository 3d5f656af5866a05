"""Contrastive test suites: does a model score the correct translation above minimally different
wrong ones, given the context? (ContraPro, Müller et al., 2018; Voita et al., 2019; Bawden et al.,
2018.)

The project's two formats, both read as a stream (memory does not grow with the suite):

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

The field's published suites are read from their own files by
:mod:`onmt_doc.evaluation.published_suites` (formats ``contrapro``, ``voita``, ``bawden``).

Every candidate is scored by forced decoding in context through :meth:`Translator.score_items`,
the code path of ``onmt_doc_translate -score``: a candidate's score is the log-probability of its
sentence (markup and final ``<eos>`` included) as the last sentence of a document made of the
context pairs (reference context translations; a suite may give each candidate its own, as Voita
et al.'s and Bawden et al.'s do) and the (source, candidate) pair. Identical candidate documents are
scored once, so a duplicate candidate ties exactly.

An item is right under one of three rules (:data:`RULES`): ``strict`` (the correct candidate scores
strictly above every contrastive one: ContraPro's evaluate.py, each pair of Bawden et al.'s
evaluate.py), ``first_best`` (the correct candidate is the first of the best-scoring ones in the
suite's own order: Voita et al.'s ``np.argmin(loss) == true_ind``, so a tie with a candidate listed
after the correct one counts right) or ``block`` (a block of items, Bawden et al.'s example blocks,
is right when all its items are right under ``strict``).
"""

from __future__ import annotations

import json
import logging
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import IO, TYPE_CHECKING, Iterable, Iterator, Optional, Sequence

from onmt_doc.errors import DataError, UserError
from onmt_doc.outputs import check_readable_file

if TYPE_CHECKING:
    from onmt_doc.translate.translator import Translator

log = logging.getLogger("onmt_doc")

CONTEXT_SEP = " ||| "
TSV_COLUMNS = ("context_src", "context_tgt", "source", "correct", "contrastive")
SHUFFLE_BLOCK = 256  # items whose contexts are exchanged in the "shuffle" ablation
ABLATIONS = ("none", "remove", "shuffle")
FORMATS = ("json", "tsv", "contrapro", "voita", "bawden")
RULES = ("strict", "first_best", "block")
# the rule each suite's own evaluation script computes (docs/evaluation.md, "Published suites")
DEFAULT_RULE = {"json": "strict", "tsv": "strict", "contrapro": "strict", "voita": "first_best", "bawden": "strict"}


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
    blocks with ``src`` and ``trg`` or ``examples``) or else ``json``, judged by its first value.
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
            isinstance(v, dict) and "src" in v and ("trg" in v or "examples" in v) for v in first.values()
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


def suite_format(path: str, fmt: str = "auto") -> str:
    """``fmt``, or with ``auto`` the format :func:`detect_format` finds."""
    if fmt == "auto":
        return detect_format(path)
    if fmt not in FORMATS:
        raise UserError(f"unknown suite format {fmt!r} (auto, {', '.join(FORMATS)})")
    return fmt


def check_rule(fmt: str, rule: Optional[str]) -> str:
    """The accuracy rule for a suite of format ``fmt``: ``rule``, or the suite's own (:data:`DEFAULT_RULE`)."""
    rule = rule or DEFAULT_RULE[fmt]
    if rule not in RULES:
        raise UserError(f"unknown rule {rule!r} ({', '.join(RULES)})")
    if rule == "block" and fmt != "bawden":
        raise UserError(f"-rule block needs a suite with blocks of items (-format bawden), not {fmt}")
    return rule


def read_suite(
    path: str,
    fmt: str = "auto",
    context_src: Optional[str] = None,
    context_tgt: Optional[str] = None,
    context_lines: Optional[int] = None,
    text_src: Optional[str] = None,
    text_tgt: Optional[str] = None,
) -> Iterator[ContrastiveItem]:
    """The items of a suite file, streamed. ``context_*`` and ``text_*`` are line files that go
    with it: per item for ``json`` (``context_lines`` each, default 1), per candidate for the
    published formats (:mod:`onmt_doc.evaluation.published_suites`). Files that do not line up
    with the suite are refused here, before any item is scored, where their lengths tell."""
    fmt = suite_format(path, fmt)
    if bool(context_src) != bool(context_tgt):
        raise UserError("context files come in pairs: give both -context_src and -context_tgt")
    if bool(text_src) != bool(text_tgt):
        raise UserError("-text_src and -text_tgt go together")
    if fmt in ("json", "tsv") and text_src:
        raise UserError("-text_src/-text_tgt go with -format contrapro, voita or bawden (per-candidate line files)")
    if fmt == "tsv":
        if context_src or context_tgt:
            raise UserError("context files go with JSON suites; a TSV suite has its context in its rows")
        return _utf8(iter_tsv(path), path)
    if fmt == "json":
        return _utf8(iter_json(path, context_src, context_tgt, 1 if context_lines is None else context_lines), path)
    from onmt_doc.evaluation import published_suites

    return _utf8(published_suites.read(fmt, path, context_src, context_tgt, context_lines, text_src, text_tgt), path)


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
        return (replace(i, ctx_src=[], ctx_tgt=[], candidate_ctx_tgt=None) for i in items)
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
    (of any other item when the whole block is one document): the donor's source context and its
    correct candidate's target context, for every candidate."""
    for i, item in enumerate(block):
        others = [j for j in range(len(block)) if j != i and _doc_key(block[j]) != _doc_key(item)]
        others = others or [j for j in range(len(block)) if j != i] or [i]
        donor = block[rng.choice(others)]
        yield replace(item, ctx_src=donor.ctx_src, ctx_tgt=donor.ctx_tgt, candidate_ctx_tgt=None)


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
        """The (source, target) context pairs the model reads for ``item`` (its correct candidate's),
        oldest first."""
        return self.contexts(item)[0]

    def contexts(self, item: ContrastiveItem) -> list[list[tuple[str, str]]]:
        """The context pairs each candidate is scored with (:meth:`ContrastiveItem.candidates` order):
        the same number of most recent sentences for all, as many as fit with every candidate."""
        candidates = item.candidates()
        targets = item.target_contexts()
        n = len(item.ctx_src)
        keep_max = n if self.max_sentences is None else min(n, self.max_sentences)
        if self.unit == "sentence" or keep_max <= 0:
            return [[] for _ in candidates]
        first = n - keep_max
        src = self.codec.encode(item.ctx_src[first:] + [item.src], "src")
        sentences = list(dict.fromkeys([*candidates, *(t for ctx in targets for t in ctx[first:])]))
        length = dict(zip(sentences, map(len, self.codec.encode(sentences, "tgt"))))
        src_len = 1 + len(src[-1]) + 2
        tgt_len = [1 + length[c] + 2 for c in candidates]
        keep = 0
        for k in range(n - 1, first - 1, -1):
            src_len += len(src[k - first]) + 2
            tgt_len = [t + length[ctx[k]] + 2 for t, ctx in zip(tgt_len, targets)]
            if src_len > self.max_tokens or max(tgt_len) > self.max_tokens:
                break
            keep += 1
        return [list(zip(item.ctx_src[n - keep :], ctx[n - keep :])) for ctx in targets]


def score_suite(
    translator: Translator, items: Iterable[ContrastiveItem], max_context: int = 0
) -> Iterator[tuple[ContrastiveItem, list[float]]]:
    """Each item with the forced-decoding scores of its candidates (correct first), in order.

    Every candidate is one document (its context pairs + the candidate pair) scored by
    ``translator.score_items`` exactly as ``onmt_doc_translate -score`` scores it; identical
    documents of an item are scored once (a duplicate candidate ties exactly, not up to rounding
    noise). The translator's read-ahead buffer bounds memory.
    """
    window = ContextWindow(translator, max_context)
    pending: deque = deque()  # (item, index of each candidate's document among the unique ones, unique count)

    def documents() -> Iterator[list[tuple[str, str]]]:
        for item in items:
            docs = [(*ctx, (item.src, cand)) for ctx, cand in zip(window.contexts(item), item.candidates())]
            unique = list(dict.fromkeys(docs))
            pending.append((item, [unique.index(d) for d in docs], len(unique)))
            for doc in unique:
                yield list(doc)

    scores: list[float] = []
    for out in translator.score_items(documents(), exact=True):
        scores.append(float(out[-1]))
        if len(scores) == pending[0][2]:
            item, index, _ = pending.popleft()
            yield item, [scores[i] for i in index]
            scores = []


def item_right(scores: Sequence[float], correct_index: int = 0, rule: str = "strict") -> bool:
    """Whether an item is right (``scores`` in :meth:`ContrastiveItem.candidates` order, higher is
    better). ``strict``: the correct candidate scores above every contrastive one, a tie is wrong.
    ``first_best``: the correct candidate is the first of the best-scoring ones in the suite's own
    order (``correct_index`` contrastive candidates are listed before it), as Voita et al.'s
    ``np.argmin(loss) == true_ind``, which returns the first minimum: a tie with a candidate listed
    after the correct one counts right, with one listed before it wrong."""
    correct, others = scores[0], scores[1:]
    if rule == "strict":
        return all(correct > s for s in others)
    if rule == "first_best":
        before, after = others[:correct_index], others[correct_index:]
        return all(correct > s for s in before) and all(correct >= s for s in after)
    raise UserError(f"unknown item rule {rule!r} (strict or first_best)")


@dataclass
class Accuracy:
    """Accuracy under ``rule`` (:data:`RULES`), overall and per category value, with the other rules'
    overall figures beside it. Under ``block`` a block's categories are those all its items share."""

    correct: int = 0
    total: int = 0
    by_category: dict = field(default_factory=dict)  # name -> value -> [correct, total]
    rule: str = "strict"
    by_rule: dict = field(default_factory=lambda: {"strict": [0, 0], "first_best": [0, 0]})
    blocks: list = field(default_factory=lambda: [0, 0])  # [right, total] blocks (items with a block id)
    duplicates: int = 0  # items with a contrastive candidate identical to the correct one
    _open_block: Optional[list] = None  # [block id, all right so far, shared categories]

    def add(self, item: ContrastiveItem, scores: Sequence[float]) -> bool:
        """Count one scored item (``scores`` in :meth:`ContrastiveItem.candidates` order); True if it
        is right under the rule (under ``strict`` when the rule is ``block``)."""
        right = {r: item_right(scores, item.correct_index, r) for r in self.by_rule}
        for r, ok in right.items():
            self.by_rule[r][0] += ok
            self.by_rule[r][1] += 1
        self.duplicates += item.has_duplicate()
        if item.block is not None:
            self._add_to_block(item, right["strict"])
        if self.rule != "block":
            self._count(right[self.rule], item.categories)
        return right["first_best" if self.rule == "first_best" else "strict"]

    def _add_to_block(self, item: ContrastiveItem, ok: bool) -> None:
        if self._open_block is not None and self._open_block[0] != item.block:
            self._close_block()
        if self._open_block is None:
            self._open_block = [item.block, ok, dict(item.categories)]
        else:
            shared = self._open_block[2]
            self._open_block[1] &= ok
            self._open_block[2] = {k: v for k, v in shared.items() if item.categories.get(k) == v}

    def _close_block(self) -> None:
        if self._open_block is None:
            return
        _, ok, categories = self._open_block
        self._open_block = None
        self.blocks[0] += ok
        self.blocks[1] += 1
        if self.rule == "block":
            self._count(ok, categories)

    def _count(self, ok: bool, categories: dict[str, str]) -> None:
        self.correct += ok
        self.total += 1
        for name, value in categories.items():
            cell = self.by_category.setdefault(name, {}).setdefault(value, [0, 0])
            cell[0] += ok
            cell[1] += 1

    def summary(self) -> dict:
        """Accuracy in percent under the rule, overall and per category value, with the counts; every
        rule's overall figure under ``rules``; ``duplicates`` (JSON-ready)."""
        self._close_block()

        def pct(c: int, n: int) -> float:
            return 100.0 * c / n if n else 0.0

        rules = dict(self.by_rule)
        if self.blocks[1]:
            rules["block"] = self.blocks
        return {
            "accuracy": pct(self.correct, self.total),
            "correct": self.correct,
            "total": self.total,
            "rule": self.rule,
            "rules": {r: {"accuracy": pct(*cell), "correct": cell[0], "total": cell[1]} for r, cell in rules.items()},
            "duplicates": self.duplicates,
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
    rule: str = "strict",
) -> dict:
    """Accuracy under ``rule`` overall and per category, every rule's beside it; with ``item_scores``,
    one JSON line per item. Items holding a contrastive candidate identical to the correct one are
    counted and logged as a warning: they tie by construction, so the rule alone decides them."""
    if rule not in RULES:
        raise UserError(f"unknown rule {rule!r} ({', '.join(RULES)})")
    acc = Accuracy(rule=rule)
    for item, scores in score_suite(translator, items, max_context):
        ok = acc.add(item, scores)
        if item_scores is not None:
            line = {"item": item.where, "correct": ok, "scores": scores, "categories": item.categories}
            if item.correct_index:
                line["correct_index"] = item.correct_index
            if item.block is not None:
                line["block"] = item.block
            item_scores.write(json.dumps(line) + "\n")
    if not acc.total:
        raise DataError("the suite has no items")
    result = acc.summary()
    if acc.duplicates:
        strict, first = result["rules"]["strict"], result["rules"]["first_best"]
        log.warning(
            "%d of %d items hold a contrastive candidate identical to the correct one (sentence and context "
            "translation, as scored): a tie, right under first_best, wrong under strict (accuracy %.1f%% first_best, "
            "%.1f%% strict)",
            acc.duplicates,
            strict["total"],
            first["accuracy"],
            strict["accuracy"],
        )
    return result


def format_table(results: dict[str, dict]) -> str:
    """A console table: one column per ablation, one row for the total and per category value, and
    one per other rule whose accuracy differs from the headline rule's in some column."""
    modes = list(results)
    rows = [("all", "", {m: results[m] for m in modes})]
    rules = [r for r in RULES if any(r in results[m].get("rules", {}) for m in modes)]
    for r in rules:
        cells = {m: results[m].get("rules", {}).get(r) for m in modes}
        if any(
            r != results[m].get("rule", "strict") and c and c["accuracy"] != results[m]["accuracy"]
            for m, c in cells.items()
        ):
            rows.append(("rule", r, cells))
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
    rule = next((results[m]["rule"] for m in modes if "rule" in results[m]), None)
    if rule:
        lines.append(f"accuracy rule: {rule}")
    return "\n".join(lines)
