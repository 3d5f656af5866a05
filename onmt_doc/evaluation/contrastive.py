"""Contrastive test suites: does a model score the correct translation above minimally different
wrong ones, given the context? (ContraPro, Müller et al., 2018; Voita et al., 2019; Bawden et al.,
2018.)

The project's two formats (JSON, TSV) are read by :mod:`onmt_doc.evaluation.suite_files`, the
field's published suites from their own files by :mod:`onmt_doc.evaluation.published_suites`
(formats ``contrapro``, ``voita``, ``bawden``); :func:`read_suite` picks the reader.

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
from onmt_doc.evaluation import published_suites
from onmt_doc.evaluation.suite_files import FORMATS, ContrastiveItem, _utf8, detect_format, iter_json, iter_tsv

if TYPE_CHECKING:
    from onmt_doc.translate.translator import Translator

log = logging.getLogger("onmt_doc")

SHUFFLE_BLOCK = 256  # items whose contexts are exchanged in the "shuffle" ablation
ABLATIONS = ("none", "remove", "shuffle")
RULES = ("strict", "first_best", "block")
# the rule each suite's own evaluation script computes (docs/evaluation.md, "Published suites")
DEFAULT_RULE = {"json": "strict", "tsv": "strict", "contrapro": "strict", "voita": "first_best", "bawden": "strict"}


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
    return _utf8(published_suites.read(fmt, path, context_src, context_tgt, context_lines, text_src, text_tgt), path)


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
