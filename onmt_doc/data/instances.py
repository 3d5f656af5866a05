"""Training and translation instances built from tokenized documents.

Markup is the same for every model: each sentence is ``<s> w1 … wn </s>``; a document instance
concatenates consecutive sentences of one document. ``<bos>``/``<eos>`` are added at collation.
The ``sentence`` unit alone can go without (``data.sentence_markup: false``): ``w1 … wn`` on both
sides, the sequences of OpenNMT-py and most sentence-level toolkits (imported models read them).
:func:`mark_sentence` writes the markup; :func:`markup_sentences` and :func:`split_sentences` read
generated ids back into sentences by it.

Units (the :data:`UNITS` registry) turn documents into a model's instances and say what search and
translation do with a row's output (:class:`Unit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence

import numpy as np

from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, PAD_ID, SOS_ID
from onmt_doc.errors import ConfigError
from onmt_doc.registry import Registry


@dataclass
class Example:
    """One training or translation instance as id arrays, with where it comes from."""

    src: np.ndarray  # int64 ids with markup
    tgt: Optional[np.ndarray]  # int64 ids with markup (no <bos>/<eos>), None when translating
    doc: int  # document index in its corpus
    first: int  # index of the instance's first sentence in the document
    n_sents: int
    extra: dict = field(default_factory=dict)  # per-target-token arrays added by losses (e.g. z*)
    # context instances only: [n_sents, 2] marked (src, tgt) length of each sentence; collation
    # makes one batch row per sentence (rows of one instance share a doc_index)
    sent_lens: Optional[np.ndarray] = None

    @property
    def rows(self) -> int:
        """Batch rows this example becomes."""
        return 1 if self.sent_lens is None else len(self.sent_lens)


def mark_sentence(ids: Sequence[int]) -> np.ndarray:
    """``<s> ids </s>``: the sentence markup every unit uses."""
    out = np.empty(len(ids) + 2, dtype=np.int64)
    out[0], out[-1] = SOS_ID, EOS_SENT_ID
    out[1:-1] = ids
    return out


# not part of any sentence when generated ids are read back
_SKIP = {BOS_ID, EOS_ID, PAD_ID}


def markup_sentences(ids: Sequence[int]) -> list[list[int]]:
    """The sentences of generated ids, by their ``<s> … </s>`` markup (ids without markup,
    ``data.sentence_markup: false``, are one sentence): the inverse of :func:`mark_sentence`."""
    sents: list[list[int]] = []
    cur: list[int] = []
    for i in ids:
        if i == SOS_ID:
            if cur:
                sents.append(cur)
            cur = []
        elif i == EOS_SENT_ID:
            sents.append(cur)
            cur = []
        elif i not in _SKIP:
            cur.append(i)
    if cur:
        sents.append(cur)
    return sents


def split_sentences(ids: Sequence[int], n: int) -> list[list[int]]:
    """Split generated ids into ``n`` sentences by their ``<s> … </s>`` markup.

    Sentence models make one sentence; if a model makes too few or too many, missing sentences are
    empty and extra ones are joined to the last, so the output never loses its alignment (the
    translator counts such repairs).
    """
    sents = markup_sentences(ids)
    if n == 1:
        return [[t for s in sents for t in s]]
    if len(sents) > n:
        sents = sents[: n - 1] + [[t for s in sents[n - 1 :] for t in s]]
    return sents + [[] for _ in range(n - len(sents))]


def _bare(ids: Sequence[int]) -> np.ndarray:
    """A sentence without markup (``data.sentence_markup: false``): its ids as they are."""
    return np.array(ids, dtype=np.int64)


def sentence_instances(
    docs: Sequence[Sequence[tuple]], max_len: int = 0, markup: bool = True
) -> tuple[list[Example], int]:
    """One example per sentence pair; pairs with a side longer than ``max_len`` (if set) are dropped.

    ``docs`` holds, per document, (src_ids, tgt_ids or None) pairs; ``markup`` false keeps the ids
    bare (no ``<s> … </s>``). Returns the examples and the number dropped, which callers log.
    """
    mark = mark_sentence if markup else _bare
    examples, dropped = [], 0
    for d, doc in enumerate(docs):
        for i, (s, t) in enumerate(doc):
            if max_len and (len(s) > max_len or (t is not None and len(t) > max_len)):
                dropped += 1
                continue
            examples.append(Example(mark(s), None if t is None else mark(t), d, i, 1))
    return examples, dropped


def document_instances(docs: Sequence[Sequence[tuple]], max_tokens: int) -> list[Example]:
    """Consecutive sentences of one document packed up to ``max_tokens`` per side.

    Instances never cross documents; a sentence longer than the budget is an instance of its own.
    The budget counts markup and the ``<bos>``/``<eos>`` the decoder adds.
    """
    return [_pack(doc, d, start, end) for d, doc in enumerate(docs) for start, end in _token_windows(doc, max_tokens)]


def _token_windows(doc: Sequence[tuple], max_tokens: int) -> list[tuple[int, int]]:
    """(start, end) of runs of consecutive sentences within ``max_tokens`` per side (markup and
    ``<bos>``/``<eos>`` counted); a longer sentence is a run of its own."""
    windows, start, src_len, tgt_len = [], 0, 1, 1
    for i, (s, t) in enumerate(doc):
        ls, lt = len(s) + 2, (len(t) + 2 if t is not None else 0)
        if i > start and (src_len + ls > max_tokens or tgt_len + lt > max_tokens):
            windows.append((start, i))
            start, src_len, tgt_len = i, 1, 1
        src_len += ls
        tgt_len += lt
    if doc:
        windows.append((start, len(doc)))
    return windows


def _fitting(lengths: Sequence[int], first_length: int, max_tokens: int) -> int:
    """How many of the last ``lengths`` fit one :func:`_token_windows` window with a sentence of
    ``first_length`` after them (the window a document's first sentence starts with them)."""
    used, kept = 1 + first_length + 2, 0
    for length in reversed(lengths):
        if used + length + 2 > max_tokens:
            break
        used += length + 2
        kept += 1
    return kept


def _pack(doc: Sequence[tuple], d: int, start: int, end: int) -> Example:
    src = np.concatenate([mark_sentence(s) for s, _ in doc[start:end]])
    has_tgt = doc[start][1] is not None
    tgt = np.concatenate([mark_sentence(t) for _, t in doc[start:end]]) if has_tgt else None
    return Example(src, tgt, d, start, end - start)


def context_instances(
    docs: Sequence[Sequence[tuple]], max_sentences: int = 0, max_len: int = 0, window_tokens: int = 0
) -> tuple[list[Example], int]:
    """Whole documents, or windows of at most ``max_sentences`` consecutive sentences (HM-GDC).
    With ``max_sentences`` 0 and ``window_tokens`` set (translation), windows are packed to that
    many tokens per side instead of whole documents, so a long document costs linear time.

    Each sentence becomes its own batch row, decoded with its own memory and the context of its
    window. The window's position is ``first``. With ``max_len``, a window holding a longer pair is
    dropped whole (dropping one sentence would change its neighbours' context); the number of pairs
    dropped is returned for the log.
    """
    examples, dropped = [], 0
    for d, doc in enumerate(docs):
        if max_sentences or not window_tokens:
            size = max_sentences or len(doc)
            spans = [(start, min(start + size, len(doc))) for start in range(0, len(doc), size)]
        else:
            spans = _token_windows(doc, window_tokens)
        for start, end in spans:
            window = doc[start:end]
            if max_len and any(len(s) > max_len or (t is not None and len(t) > max_len) for s, t in window):
                dropped += len(window)
                continue
            ex = _pack(doc, d, start, start + len(window))
            ex.sent_lens = np.array([(len(s) + 2, 0 if t is None else len(t) + 2) for s, t in window], dtype=np.int64)
            examples.append(ex)
    return examples, dropped


def _too_long(pairs: Sequence[tuple], max_len: int) -> bool:
    return bool(max_len) and any(len(s) > max_len or (t is not None and len(t) > max_len) for s, t in pairs)


def concatenation_instances(
    docs: Sequence[Sequence[tuple]], k: int, whole_target: bool, max_len: int = 0
) -> tuple[list[Example], int]:
    """One example per sentence i with its ``k`` previous sentences of the same document (fewer at
    the document's start), all marked and concatenated: the ``</s> <s>`` between two sentences is
    the separator (Tiedemann & Scherrer, 2017's ``_BREAK_``), so no vocabulary entry is added.

    ``whole_target`` false (k-to-1): the target is sentence i alone and the example starts at i
    (``first`` = i, one sentence). True (k-to-k): the target holds the same sentences as the source,
    the example starts at the window's first sentence and ``n_sents`` counts the window, so the
    loss covers every target sentence and translation keeps the last. With ``max_len``, a window
    holding a longer sentence (in a side the example uses) is dropped; the count is returned."""
    examples, dropped = [], 0
    for d, doc in enumerate(docs):
        for i in range(len(doc)):
            start = max(0, i - k)
            window = doc[start : i + 1]
            used = window if whole_target else [(s, None) for s, _ in window[:-1]] + [window[-1]]
            if _too_long(used, max_len):
                dropped += 1
                continue
            src = np.concatenate([mark_sentence(s) for s, _ in window])
            if whole_target:
                tgt = None if doc[i][1] is None else np.concatenate([mark_sentence(t) for _, t in window])
                examples.append(Example(src, tgt, d, start, len(window)))
            else:
                tgt = None if doc[i][1] is None else mark_sentence(doc[i][1])
                examples.append(Example(src, tgt, d, i, 1))
    return examples, dropped


# ----------------------------------------------------------------------------- units


@dataclass(frozen=True)
class UnitOptions:
    """What instances depend on besides the documents: the ``data`` keys (``max_tokens``,
    ``max_len``, ``max_sentences``, ``context_sentences``, ``sentence_markup``) and translation's
    ``window_tokens``."""

    max_tokens: int = 512
    max_len: int = 0
    max_sentences: int = 0
    window_tokens: int = 0
    context_sentences: int = 1
    sentence_markup: bool = True


class Unit:
    """How documents become a model's instances, and what search and translation do with a row.

    Search and the translator ask a unit (class methods: the answers do not depend on options):
    :meth:`search_marks_sentences` and :meth:`counts_source_sentences` (what the search's rules
    enforce on a row's output; ``onmt_doc/translate/rules.py`` builds the rules from them, so this
    data module imports nothing of the search), :meth:`markup_optional`,
    :meth:`output_sentences` (which sentences of the document a row's output translates),
    :meth:`has_target_context` and :meth:`input_settings` (what ensemble members must share).

    A unit is declared by encoder and decoder parts (``sentence``, ``document``, ``context``,
    checked by :meth:`check_parts`); a :class:`ChosenUnit` is chosen with ``model.unit`` for
    sentence-level parts."""

    _input_keys: ClassVar[tuple[str, ...]] = ("documents",)  # the data keys input_settings reads

    def __init__(self, options: UnitOptions) -> None:
        self.options = options

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:  # pragma: no cover
        """The examples of tokenized ``docs`` and the number of pairs dropped by ``max_len``."""
        raise NotImplementedError

    def context_kept(self, src_lengths: Sequence[int], first_length: int) -> int:
        """How many of the sentences before a document (their source lengths in subwords, oldest
        first) share an instance with its first sentence: the model's own window, so a request's
        context beyond it changes nothing. ``first_length``: the first sentence's length."""
        return 0

    @classmethod
    def check_parts(cls, name: str, part_units: set[str], where: str = "model.unit") -> None:
        """``model.unit: name`` fits the parts' own units: a declared unit must be the parts' own."""
        own = _own_unit(part_units)
        if own != {name}:
            raise ConfigError(
                f"{where}: '{name}' is declared by the encoder and decoder, whose unit is {'/'.join(own)}"
            )

    @classmethod
    def search_marks_sentences(cls) -> bool:
        """Whether the search frames a row's output as marked sentences, ``<s> … </s>`` then
        ``<eos>`` (rows of one sentence, or of their source's sentences), rather than leaving the
        structure to the decoder's ``constrain`` (``document``)."""
        return True

    @classmethod
    def counts_source_sentences(cls) -> bool:
        """Whether a row's output holds as many sentences as its source, which the search enforces
        (``k_to_k``); otherwise a row is one sentence, or the decoder says how many."""
        return False

    @classmethod
    def markup_optional(cls) -> bool:
        """Whether its instances may go without ``<s> … </s>`` (``data.sentence_markup: false``);
        every unit but ``sentence`` finds its sentences by the markup."""
        return False

    @classmethod
    def output_sentences(cls, first: int, n: int) -> range:
        """The positions in its document of the sentences a row's output translates, for a row
        whose ``n`` sentences start at position ``first``: all of them."""
        return range(first, first + n)

    @classmethod
    def has_target_context(cls) -> bool:
        """Whether a row's target holds, before the sentence it translates, translations of the
        context sentences, which translation may force as a prefix (``translate.force_context_prefix``)."""
        return False

    @classmethod
    def context_sides(cls) -> tuple[str, ...]:
        """What of a document's preceding sentences (context passed with a request,
        ``Translator.translate(..., context=...)``) the unit's model reads: ``("src", "tgt")`` when
        their translations are part of its target, forced as a prefix; ``("src",)`` their sources
        only; ``()`` nothing (a sentence model)."""
        return ()

    @classmethod
    def input_settings(cls, data: Any) -> dict[str, Any]:
        """The settings of a ``data`` section that change what the model is given for the same
        input (members of an ensemble must agree on them)."""
        return {key: getattr(data, key) for key in cls._input_keys}


def _own_unit(part_units: set[str]) -> set[str]:
    """The unit the parts declare: the non-``sentence`` ones, else ``sentence``."""
    return (part_units - {"sentence"}) or {"sentence"}


class ChosenUnit(Unit):
    """A unit chosen with ``model.unit`` for sentence-level encoder and decoder parts."""

    @classmethod
    def check_parts(cls, name: str, part_units: set[str], where: str = "model.unit") -> None:
        """See :meth:`Unit.check_parts`: a chosen unit needs sentence-level parts."""
        own = _own_unit(part_units)
        if own != {"sentence"}:
            raise ConfigError(
                f"{where}: '{name}' needs sentence-level encoder and decoder parts, not {'/'.join(own)} ones"
            )


UNITS = REGISTRY = Registry("unit")  # REGISTRY: what registry_for("unit") reads


@UNITS.register("sentence", UnitOptions)
class SentenceUnit(Unit):
    """One instance per sentence pair (the Transformer), with or without markup (``data.sentence_markup``)."""

    _input_keys = ("documents", "sentence_markup")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        return sentence_instances(docs, self.options.max_len, self.options.sentence_markup)

    @classmethod
    def markup_optional(cls) -> bool:
        """See :meth:`Unit.markup_optional`: bare sentences are what OpenNMT-py's models read."""
        return True


@UNITS.register("document", UnitOptions)
class DocumentUnit(Unit):
    """Consecutive sentences packed up to ``max_tokens`` per side, one search per instance (G-Transformer)."""

    _input_keys = ("documents", "max_tokens")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        return document_instances(docs, self.options.max_tokens), 0

    def context_kept(self, src_lengths: Sequence[int], first_length: int) -> int:
        """See :meth:`Unit.context_kept`: those that fit ``max_tokens`` with the first sentence."""
        return _fitting(src_lengths, first_length, self.options.max_tokens)

    @classmethod
    def search_marks_sentences(cls) -> bool:
        """See :meth:`Unit.search_marks_sentences`: the document decoder's ``constrain`` keeps the structure."""
        return False

    @classmethod
    def context_sides(cls) -> tuple[str, ...]:
        """See :meth:`Unit.context_sides`: the preceding sentences join the window, their
        translations forced as the target prefix (the G-Transformer's own document context)."""
        return ("src", "tgt")


@UNITS.register("context", UnitOptions)
class ContextUnit(Unit):
    """Document windows whose sentences are batch rows sharing the window's context (HM-GDC)."""

    _input_keys = ("documents", "max_tokens", "max_sentences")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        o = self.options
        return context_instances(docs, o.max_sentences, o.max_len, o.window_tokens)

    def context_kept(self, src_lengths: Sequence[int], first_length: int) -> int:
        """See :meth:`Unit.context_kept`: ``max_sentences`` - 1 (the window), or, for windows packed to
        ``window_tokens``, those that fit with the first sentence."""
        o = self.options
        if o.max_sentences or not o.window_tokens:
            return min(len(src_lengths), max(o.max_sentences - 1, 0)) if o.max_sentences else len(src_lengths)
        return _fitting(src_lengths, first_length, o.window_tokens)

    @classmethod
    def context_sides(cls) -> tuple[str, ...]:
        """See :meth:`Unit.context_sides`: the window's sources (HM-GDC's encoder reads no target context)."""
        return ("src",)


@UNITS.register("k_to_1", UnitOptions)
class KTo1Unit(ChosenUnit):
    """k previous source sentences + the current one in, the current target sentence out."""

    _input_keys = ("documents", "context_sentences")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        return concatenation_instances(docs, self.options.context_sentences, False, self.options.max_len)

    def context_kept(self, src_lengths: Sequence[int], first_length: int) -> int:
        """See :meth:`Unit.context_kept`: the ``context_sentences`` last."""
        return min(len(src_lengths), self.options.context_sentences)

    @classmethod
    def context_sides(cls) -> tuple[str, ...]:
        """See :meth:`Unit.context_sides`: the k previous sources."""
        return ("src",)


@UNITS.register("k_to_k", UnitOptions)
class KToKUnit(ChosenUnit):
    """k+1 sentences in, the same k+1 out (loss on all); translation keeps the last sentence."""

    _input_keys = ("documents", "context_sentences")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        return concatenation_instances(docs, self.options.context_sentences, True, self.options.max_len)

    def context_kept(self, src_lengths: Sequence[int], first_length: int) -> int:
        """See :meth:`Unit.context_kept`: the ``context_sentences`` last."""
        return min(len(src_lengths), self.options.context_sentences)

    @classmethod
    def counts_source_sentences(cls) -> bool:
        """See :meth:`Unit.counts_source_sentences`: the k context sentences and the current one."""
        return True

    @classmethod
    def output_sentences(cls, first: int, n: int) -> range:
        """See :meth:`Unit.output_sentences`: the last one; the others are its context."""
        return range(first + n - 1, first + n)

    @classmethod
    def has_target_context(cls) -> bool:
        """See :meth:`Unit.has_target_context`: the k previous sentences' translations."""
        return True

    @classmethod
    def context_sides(cls) -> tuple[str, ...]:
        """See :meth:`Unit.context_sides`: the k previous sources, their translations forced as the prefix."""
        return ("src", "tgt")


def unit_class(name: str, where: str = "model.unit") -> type[Unit]:
    """The registered unit ``name``; an unknown one is a ConfigError with the closest name."""
    return UNITS.get(name, where).cls


def check_unit(name: str, part_units: set[str], where: str = "model.unit") -> None:
    """``model.unit`` chosen in a config: registered, and fitting the parts' own units (a chosen
    unit needs sentence-level parts; a declared one must be the parts' own)."""
    unit_class(name, where).check_parts(name, part_units, where)


def build_instances(
    unit: str,
    docs: Sequence[Sequence[tuple]],
    max_tokens: int,
    max_len: int = 0,
    max_sentences: int = 0,
    window_tokens: int = 0,
    context_sentences: int = 1,
    sentence_markup: bool = True,
) -> tuple[list[Example], int]:
    """Instances for a model's unit (the :data:`UNITS` registry): ``document`` packs consecutive
    sentences of a document up to ``max_tokens``; ``context`` takes document windows of
    ``max_sentences`` (0 = whole documents, or, with ``window_tokens`` as translation sets it,
    windows packed to that many tokens) whose sentences are batch rows; ``sentence`` uses one
    instance per sentence pair; ``k_to_1`` / ``k_to_k`` concatenate ``context_sentences`` previous
    sentences (:func:`concatenation_instances`); ``sentence_markup`` false: ``sentence`` instances
    without ``<s> … </s>`` (the config allows it for that unit only)."""
    options = UnitOptions(max_tokens, max_len, max_sentences, window_tokens, context_sentences, sentence_markup)
    return unit_class(unit, "unit")(options).instances(docs)
