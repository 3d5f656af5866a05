"""Training and translation instances built from tokenized documents.

Markup is the same for every model: each sentence is ``<s> w1 … wn </s>``; a document instance
concatenates consecutive sentences of one document. ``<bos>``/``<eos>`` are added at collation.
The ``sentence`` unit alone can go without (``data.sentence_markup: false``): ``w1 … wn`` on both
sides, the sequences of OpenNMT-py and most sentence-level toolkits (imported models read them).
:func:`mark_sentence` writes the markup; :func:`markup_sentences` and :func:`split_sentences` read
generated ids back into sentences by it.

Units (the :data:`UNITS` registry) turn documents into a model's instances and say what search and
translation do with a row's output (:class:`Unit`). A unit states its instances once, as sentence
ranges computed from arrays of sentence lengths (:meth:`Unit.bounds`, with the token-window and
length-filter rules of this module); ``data/mapped.py`` makes them into Examples and batches over a
corpus's arrays, memory-mapped for training or built in memory for translation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Optional, Sequence

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


def mark_concat(
    tokens: np.ndarray,
    lens: np.ndarray,
    open_id: int = SOS_ID,
    close_id: int = EOS_SENT_ID,
    dtype: np.dtype = np.dtype(np.int64),
) -> np.ndarray:
    """Sentences of ``lens`` values one after the other in ``tokens``, each wrapped as
    ``open_id … close_id``: with the defaults, the concatenation of their :func:`mark_sentence`
    arrays; a per-token field (z*) gets 0 at the markup the same way (``open_id = close_id = 0``)."""
    marked = np.asarray(lens, dtype=np.int64) + 2
    out = np.empty(int(marked.sum()), dtype)
    out_ends = np.cumsum(marked)
    out_starts = out_ends - marked
    inner = np.ones(len(out), bool)
    inner[out_starts] = False
    inner[out_ends - 1] = False
    out[out_starts] = open_id
    out[out_ends - 1] = close_id
    out[inner] = tokens
    return out


# ----------------------------------------------------------------------------- the rules
#
# Every unit states its instances once, here, over arrays: the subword count of each sentence and
# the documents' bounds (:class:`SentenceLengths`). Training reads them from the mapped cache's
# offsets; a small corpus, a request or a document being translated builds the same arrays in memory
# (``MappedCorpus.from_documents``), so both run this code. ``data/mapped.py``'s ``MappedExamples``
# turns the bounds into Examples and batches.

MARKUP = 2  # <s> and </s> around a sentence: what its instance holds besides its ids
BUDGET_START = 1  # the <bos> (or <eos>) the decoder adds: counted once per side of a token window


@dataclass(frozen=True)
class SentenceLengths:
    """What a unit's instances depend on: each sentence's subword count per side (without markup)
    and where each document starts and ends."""

    src: np.ndarray  # [S] int64
    tgt: Optional[np.ndarray]  # [S] int64; None: a corpus without targets (translation)
    doc_offsets: np.ndarray  # [D + 1] int64: document d holds sentences doc_offsets[d]:doc_offsets[d + 1]

    @property
    def n(self) -> int:
        """Sentences."""
        return len(self.src)

    def doc_start(self) -> np.ndarray:
        """[S]: the first sentence of each sentence's document."""
        return np.repeat(self.doc_offsets[:-1], np.diff(self.doc_offsets))

    def doc_end(self) -> np.ndarray:
        """[S]: the end (exclusive) of each sentence's document."""
        return np.repeat(self.doc_offsets[1:], np.diff(self.doc_offsets))


class Bounds(NamedTuple):
    """A unit's instances: each one's sentences ``[a, b)`` (corpus indices, in instance order) and
    the number of sentence pairs ``data.max_len`` dropped (for the log)."""

    a: np.ndarray
    b: np.ndarray
    dropped: int


def token_windows(lengths: SentenceLengths, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of the runs of consecutive sentences of each document within ``max_tokens`` per side,
    markup and the decoder's <bos>/<eos> counted (a side without targets counts nothing); a
    longer sentence is a run of its own. A loop over the sentences, on Python ints."""
    starts, ends = [], []
    ls_all = (lengths.src + MARKUP).tolist()
    lt_all = (lengths.tgt + MARKUP).tolist() if lengths.tgt is not None else [0] * lengths.n
    doc_off = lengths.doc_offsets.tolist()
    for d0, d1 in zip(doc_off[:-1], doc_off[1:]):
        start, src_len, tgt_len = d0, BUDGET_START, BUDGET_START
        for i in range(d0, d1):
            ls, lt = ls_all[i], lt_all[i]
            if i > start and (src_len + ls > max_tokens or tgt_len + lt > max_tokens):
                starts.append(start)
                ends.append(i)
                start, src_len, tgt_len = i, BUDGET_START, BUDGET_START
            src_len += ls
            tgt_len += lt
        if d1 > d0:
            starts.append(start)
            ends.append(d1)
    return np.array(starts, np.int64), np.array(ends, np.int64)


def fitting(lengths: Sequence[int], first_length: int, max_tokens: int) -> int:
    """How many of the last ``lengths`` fit one token window (:func:`token_windows`' budget) with a
    sentence of ``first_length`` after them: the context a document's first sentence keeps."""
    used, kept = BUDGET_START + first_length + MARKUP, 0
    for length in reversed(lengths):
        if used + length + MARKUP > max_tokens:
            break
        used += length + MARKUP
        kept += 1
    return kept


def too_long(lengths: SentenceLengths, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The length filter (``data.max_len``), per sentence: its source is longer, its target is
    longer (all False without ``max_len``, and for a side without targets)."""
    none = np.zeros(lengths.n, bool)
    if not max_len:
        return none, none
    return lengths.src > max_len, (lengths.tgt > max_len if lengths.tgt is not None else none)


def any_in(flags: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per range ``[a, b)``: whether any of its ``flags`` is set."""
    cs = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    return cs[b] - cs[a] > 0


def drop_windows(a: np.ndarray, b: np.ndarray, long: np.ndarray, per_window: bool) -> Bounds:
    """The windows ``[a, b)`` holding no ``long`` sentence; the dropped count is of windows
    (``per_window``) or of the pairs in them."""
    drop = any_in(long, a, b)
    return Bounds(a[~drop], b[~drop], int(drop.sum()) if per_window else int((b - a)[drop].sum()))


def concatenation_bounds(lengths: SentenceLengths, k: int, max_len: int, whole_target: bool) -> Bounds:
    """One instance per sentence i with its ``k`` previous sentences of the same document (fewer at
    the document's start): sources ``[max(doc start, i - k), i + 1)``, all marked and concatenated,
    the ``</s> <s>`` between two sentences being the separator (Tiedemann & Scherrer, 2017's
    ``_BREAK_``, so no vocabulary entry is added). With ``max_len``, a window holding a longer
    sentence in a side the instance uses is dropped: every target with ``whole_target`` (k-to-k),
    else only the current one (k-to-1); the count is of instances."""
    idx = np.arange(lengths.n, dtype=np.int64)
    a, b = np.maximum(lengths.doc_start(), idx - k), idx + 1
    long_src, long_tgt = too_long(lengths, max_len)
    if whole_target:
        return drop_windows(a, b, long_src | long_tgt, per_window=True)
    drop = any_in(long_src, a, b) | long_tgt
    return Bounds(a[~drop], b[~drop], int(drop.sum()))


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

    A unit states its instances once, over arrays (:meth:`bounds`: the sentences ``[a, b)`` of
    each, from :class:`SentenceLengths`), and says what an instance holds (:meth:`target_span`:
    which target sentences; :meth:`rows_are_sentences`; :meth:`marked`): ``MappedExamples``
    (``data/mapped.py``) asks these to make the Examples and batches of training (the mapped
    cache), translation, the server and ``-stream`` (arrays built in memory), for a registered
    plugin unit as for a built-in one.

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

    def bounds(self, lengths: SentenceLengths) -> Bounds:  # pragma: no cover
        """The instances of a corpus of sentences of ``lengths``: each one's source sentences
        ``[a, b)`` (within one document, in order) and the pairs ``max_len`` dropped."""
        raise NotImplementedError

    @classmethod
    def target_span(cls, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The target sentences of instances whose sources are sentences ``[a, b)``: the same ones.
        The first of them is the instance's ``first``, their number its ``n_sents``."""
        return a, b

    @classmethod
    def rows_are_sentences(cls) -> bool:
        """Whether each sentence of an instance is a batch row of its own (rows of one instance
        share its ``doc_index``: ``context``), rather than the instance being one row."""
        return False

    def marked(self) -> bool:
        """Whether the instances' sentences carry ``<s> … </s>`` (every unit's do, but
        ``data.sentence_markup: false`` where :meth:`markup_optional`)."""
        return self.options.sentence_markup or not self.markup_optional()

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

    def bounds(self, lengths: SentenceLengths) -> Bounds:
        """See :meth:`Unit.bounds`: every sentence pair, those with a side longer than ``max_len`` dropped."""
        long_src, long_tgt = too_long(lengths, self.options.max_len)
        keep = np.flatnonzero(~(long_src | long_tgt))
        return Bounds(keep, keep + 1, lengths.n - len(keep))

    @classmethod
    def markup_optional(cls) -> bool:
        """See :meth:`Unit.markup_optional`: bare sentences are what OpenNMT-py's models read."""
        return True


@UNITS.register("document", UnitOptions)
class DocumentUnit(Unit):
    """Consecutive sentences packed up to ``max_tokens`` per side, one search per instance (G-Transformer)."""

    _input_keys = ("documents", "max_tokens")

    def bounds(self, lengths: SentenceLengths) -> Bounds:
        """See :meth:`Unit.bounds`: :func:`token_windows` of ``max_tokens``; nothing is dropped (a
        longer sentence is an instance of its own)."""
        a, b = token_windows(lengths, self.options.max_tokens)
        return Bounds(a, b, 0)

    def context_kept(self, src_lengths: Sequence[int], first_length: int) -> int:
        """See :meth:`Unit.context_kept`: those that fit ``max_tokens`` with the first sentence."""
        return fitting(src_lengths, first_length, self.options.max_tokens)

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

    def bounds(self, lengths: SentenceLengths) -> Bounds:
        """See :meth:`Unit.bounds`: whole documents, or windows of at most ``max_sentences``
        consecutive sentences; with ``max_sentences`` 0 and ``window_tokens`` set (translation),
        :func:`token_windows` of that many tokens instead of whole documents, so a long document
        costs linear time. With ``max_len``, a window holding a longer pair is dropped whole
        (dropping one sentence would change its neighbours' context), its pairs counted."""
        o = self.options
        if o.max_sentences or not o.window_tokens:
            idx, doc_start = np.arange(lengths.n, dtype=np.int64), lengths.doc_start()
            doc_sizes = np.diff(lengths.doc_offsets)
            whole = np.repeat(doc_sizes, doc_sizes)  # every sentence: its document's size
            sizes = np.full(lengths.n, o.max_sentences, np.int64) if o.max_sentences else whole
            is_start = (idx - doc_start) % sizes == 0
            a = idx[is_start]
            b = np.minimum(a + sizes[is_start], lengths.doc_end()[is_start])
        else:
            a, b = token_windows(lengths, o.window_tokens)
        long_src, long_tgt = too_long(lengths, o.max_len)
        return drop_windows(a, b, long_src | long_tgt, per_window=False)

    @classmethod
    def rows_are_sentences(cls) -> bool:
        """See :meth:`Unit.rows_are_sentences`: each sentence is decoded with its own memory and
        the context of its window."""
        return True

    def context_kept(self, src_lengths: Sequence[int], first_length: int) -> int:
        """See :meth:`Unit.context_kept`: ``max_sentences`` - 1 (the window), or, for windows packed to
        ``window_tokens``, those that fit with the first sentence."""
        o = self.options
        if o.max_sentences or not o.window_tokens:
            return min(len(src_lengths), max(o.max_sentences - 1, 0)) if o.max_sentences else len(src_lengths)
        return fitting(src_lengths, first_length, o.window_tokens)

    @classmethod
    def context_sides(cls) -> tuple[str, ...]:
        """See :meth:`Unit.context_sides`: the window's sources (HM-GDC's encoder reads no target context)."""
        return ("src",)


@UNITS.register("k_to_1", UnitOptions)
class KTo1Unit(ChosenUnit):
    """k previous source sentences + the current one in, the current target sentence out."""

    _input_keys = ("documents", "context_sentences")

    def bounds(self, lengths: SentenceLengths) -> Bounds:
        """See :meth:`Unit.bounds`: :func:`concatenation_bounds`; the context's targets are not
        read, so only the current target counts for ``max_len``."""
        return concatenation_bounds(lengths, self.options.context_sentences, self.options.max_len, False)

    @classmethod
    def target_span(cls, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """See :meth:`Unit.target_span`: the current (last) sentence alone."""
        return b - 1, b

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

    def bounds(self, lengths: SentenceLengths) -> Bounds:
        """See :meth:`Unit.bounds`: :func:`concatenation_bounds`, every target of the window read."""
        return concatenation_bounds(lengths, self.options.context_sentences, self.options.max_len, True)

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
