"""Training and translation instances built from tokenized documents.

Markup is the same for every model: each sentence is ``<s> w1 … wn </s>``; a document instance
concatenates consecutive sentences of one document. ``<bos>``/``<eos>`` are added at collation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from onmt_doc.data.vocab import EOS_SENT_ID, SOS_ID

UNITS = ("sentence", "document", "context")


@dataclass
class Example:
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
    out = np.empty(len(ids) + 2, dtype=np.int64)
    out[0], out[-1] = SOS_ID, EOS_SENT_ID
    out[1:-1] = ids
    return out


def sentence_instances(docs: Sequence[Sequence[tuple]], max_len: int = 0) -> tuple[list[Example], int]:
    """One example per sentence pair; pairs with a side longer than ``max_len`` (if set) are dropped.

    ``docs`` holds, per document, (src_ids, tgt_ids or None) pairs. Returns the examples and the
    number dropped, which callers log.
    """
    examples, dropped = [], 0
    for d, doc in enumerate(docs):
        for i, (s, t) in enumerate(doc):
            if max_len and (len(s) > max_len or (t is not None and len(t) > max_len)):
                dropped += 1
                continue
            examples.append(Example(mark_sentence(s), None if t is None else mark_sentence(t), d, i, 1))
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


def build_instances(
    unit: str,
    docs: Sequence[Sequence[tuple]],
    max_tokens: int,
    max_len: int = 0,
    max_sentences: int = 0,
    window_tokens: int = 0,
) -> tuple[list[Example], int]:
    """Instances for a model's unit: ``document`` packs consecutive sentences of a document up to
    ``max_tokens``; ``context`` takes document windows of ``max_sentences`` (0 = whole documents,
    or, with ``window_tokens`` as translation sets it, windows packed to that many tokens) whose
    sentences are batch rows; ``sentence`` uses one instance per sentence pair."""
    if unit == "document":
        return document_instances(docs, max_tokens), 0
    if unit == "context":
        return context_instances(docs, max_sentences, max_len, window_tokens)
    return sentence_instances(docs, max_len)
