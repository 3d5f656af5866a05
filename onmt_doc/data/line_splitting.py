"""Cutting an over-long source line into pieces at word boundaries, by the tokenizers' subword marks.

The translator bounds the work of one input line (``translate.max_input_tokens``: attention is
quadratic in its length): a longer line is cut into pieces translated on their own and joined
with a space. A cut should not fall inside a word, and which subword starts a word is written in
the tokens themselves: pyonmttok (``joiner_annotate``, :class:`~onmt_doc.data.tokenizer.Subword`)
marks a token that attaches to its neighbour with the joiner ``￭``, on either side (``d￭ e`` or
``d ￭e``); SentencePiece marks a token that starts a word with ``▁``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import Vocab

JOINER = "\uffed"  # pyonmttok's joiner: the token attaches to its neighbour
SPACER = "\u2581"  # SentencePiece's word-start mark


def starts_word(tokens: Sequence[str], i: int, sentencepiece: bool) -> bool:
    """Whether token ``i`` (> 0) starts a word, so the line may be cut before it."""
    if sentencepiece:
        return tokens[i].startswith(SPACER)
    return not (tokens[i - 1].endswith(JOINER) or tokens[i].startswith(JOINER))


def piece_spans(tokens: Sequence[str], limit: int, sentencepiece: bool) -> list[tuple[int, int]]:
    """Cut a subword sequence into spans of at most ``limit`` tokens, each cut at the last word
    boundary in the second half of its span (else at the limit itself)."""
    spans, start = [], 0
    while len(tokens) - start > limit:
        end = start + limit
        cut = next((i for i in range(end, start + limit // 2, -1) if starts_word(tokens, i, sentencepiece)), end)
        spans.append((start, cut))
        start = cut
    spans.append((start, len(tokens)))
    return spans


def split_line(ids: np.ndarray, limit: int, vocab: Vocab, subword: Subword) -> list[np.ndarray]:
    """A tokenized line (``ids`` in ``vocab``, tokenized by ``subword``) as pieces of at most
    ``limit`` subwords, cut at word boundaries (:func:`piece_spans`); the line itself when it fits."""
    if len(ids) <= limit:
        return [ids]
    spans = piece_spans(vocab.tokens(ids.tolist()), limit, subword.kind == "sentencepiece")
    return [ids[a:b] for a, b in spans]
