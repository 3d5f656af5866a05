"""Training and translation instances built from tokenized documents.

Markup is the same for every model: each sentence is ``<s> w1 … wn </s>``; a document instance
concatenates consecutive sentences of one document. ``<bos>``/``<eos>`` are added at collation.
The ``sentence`` unit alone can go without (``data.sentence_markup: false``): ``w1 … wn`` on both
sides, the sequences of OpenNMT-py and most sentence-level toolkits (imported models read them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional, Sequence

import numpy as np

from onmt_doc.data.vocab import EOS_SENT_ID, SOS_ID
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

    ``declared``: the unit is declared by encoder and decoder parts (``sentence``, ``document``,
    ``context``); the others are chosen with ``model.unit`` for sentence-level parts. ``rows``: the
    sentences of a row's output: ``one``, as many as its ``source`` has (search counts them), or
    ``decoder`` (the decoder's ``constrain`` states the structure). ``keep_last``: a row's output
    is its last sentence only (the others are context). ``input_keys``: the ``data`` keys that
    change what the model is given for the same input."""

    declared: ClassVar[bool] = True
    rows: ClassVar[str] = "one"
    keep_last: ClassVar[bool] = False
    input_keys: ClassVar[tuple[str, ...]] = ("documents",)

    def __init__(self, options: UnitOptions) -> None:
        self.options = options

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:  # pragma: no cover
        """The examples of tokenized ``docs`` and the number of pairs dropped by ``max_len``."""
        raise NotImplementedError

    @classmethod
    def check_parts(cls, name: str, part_units: set[str], where: str = "model.unit") -> None:
        """``model.unit: name`` fits the parts' own units: a chosen unit needs sentence-level parts;
        a declared one must be the parts' own."""
        own = (part_units - {"sentence"}) or {"sentence"}
        if cls.declared and own != {name}:
            raise ConfigError(
                f"{where}: '{name}' is declared by the encoder and decoder, whose unit is {'/'.join(own)}"
            )
        if not cls.declared and own != {"sentence"}:
            raise ConfigError(
                f"{where}: '{name}' needs sentence-level encoder and decoder parts, not {'/'.join(own)} ones"
            )


UNITS = REGISTRY = Registry("unit")  # REGISTRY: what registry_for("unit") reads


@UNITS.register("sentence", UnitOptions)
class SentenceUnit(Unit):
    """One instance per sentence pair (the Transformer), with or without markup (``data.sentence_markup``)."""

    input_keys = ("documents", "sentence_markup")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        return sentence_instances(docs, self.options.max_len, self.options.sentence_markup)


@UNITS.register("document", UnitOptions)
class DocumentUnit(Unit):
    """Consecutive sentences packed up to ``max_tokens`` per side, one search per instance (G-Transformer)."""

    rows = "decoder"
    input_keys = ("documents", "max_tokens")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        return document_instances(docs, self.options.max_tokens), 0


@UNITS.register("context", UnitOptions)
class ContextUnit(Unit):
    """Document windows whose sentences are batch rows sharing the window's context (HM-GDC)."""

    input_keys = ("documents", "max_tokens", "max_sentences")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        o = self.options
        return context_instances(docs, o.max_sentences, o.max_len, o.window_tokens)


@UNITS.register("k_to_1", UnitOptions)
class KTo1Unit(Unit):
    """k previous source sentences + the current one in, the current target sentence out."""

    declared = False
    input_keys = ("documents", "context_sentences")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        return concatenation_instances(docs, self.options.context_sentences, False, self.options.max_len)


@UNITS.register("k_to_k", UnitOptions)
class KToKUnit(Unit):
    """k+1 sentences in, the same k+1 out (loss on all); translation keeps the last sentence."""

    declared = False
    rows = "source"
    keep_last = True
    input_keys = ("documents", "context_sentences")

    def instances(self, docs: Sequence[Sequence[tuple]]) -> tuple[list[Example], int]:
        """See :meth:`Unit.instances`."""
        return concatenation_instances(docs, self.options.context_sentences, True, self.options.max_len)


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
