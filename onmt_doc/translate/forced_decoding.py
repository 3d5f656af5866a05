"""Forced decoding: the log-probability a model gives to given target sentences.

One function serves ``onmt_doc_translate -score`` (through :class:`Translator`) and
``onmt_doc_evaluate`` (contrastive suites), so a contrastive score is exactly a ``-score`` score.
"""

from __future__ import annotations

from typing import Sequence

import torch

from onmt_doc.contracts import Batch
from onmt_doc.data.vocab import EOS_ID, PAD_ID
from onmt_doc.models.model import EncoderDecoder, full_log_probs

TokenScores = list[tuple[int, float]]  # (target id, log-probability) of each token of a sentence


def _owned_log_probs(model: EncoderDecoder, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced log-probability of every target token [B, T] (0 at padding) and the sentence
    that owns it [B, T] (1-based; 0: padding). Sentence k owns its ``<s> … </s>`` tokens; the
    final ``<eos>`` belongs to the last sentence, so a sentence's score includes the decision to
    stop after it. A row without markup (``data.sentence_markup: false``) is one sentence."""
    lp = full_log_probs(model, batch).gather(2, batch.tgt_out[..., None]).squeeze(2)
    lp = lp.masked_fill(batch.tgt_out.eq(PAD_ID), 0.0)
    tags = torch.cat([batch.tgt_groups[:, 1:], torch.zeros_like(batch.tgt_groups[:, :1])], 1)
    bare = batch.tgt_groups.amax(1, keepdim=True).eq(0)  # no <s>: one sentence without markup
    tags = torch.where(bare & batch.tgt_out.ne(PAD_ID), 1, tags)
    tags = torch.where(batch.tgt_out.eq(EOS_ID), tags.max(1, keepdim=True).values, tags)
    return lp, tags


def sentence_log_probs(model: EncoderDecoder, batch: Batch, sentences: Sequence[int]) -> list[list[float]]:
    """Per batch row, the summed log-probability of each of its ``sentences[row]`` target sentences
    (the tokens each owns: :func:`_owned_log_probs`)."""
    lp, tags = _owned_log_probs(model, batch)
    out = []
    for row, n in enumerate(sentences):
        sums = torch.zeros(n + 1, dtype=lp.dtype).index_add_(0, tags[row].cpu(), lp[row].cpu())
        out.append([float(sums[j + 1]) for j in range(n)])
    return out


def sentence_token_log_probs(model: EncoderDecoder, batch: Batch, sentences: Sequence[int]) -> list[list[TokenScores]]:
    """Per batch row, the (target id, log-probability) of every token each of its ``sentences[row]``
    sentences owns, in order (what :func:`sentence_log_probs` sums): point-wise measures (CXMI)."""
    lp, tags = _owned_log_probs(model, batch)
    lp, tags, ids = lp.cpu().tolist(), tags.cpu().tolist(), batch.tgt_out.cpu().tolist()
    out = []
    for row, n in enumerate(sentences):
        owned: list[TokenScores] = [[] for _ in range(n)]
        for tag, token, value in zip(tags[row], ids[row], lp[row]):
            if 0 < tag <= n:
                owned[tag - 1].append((token, value))
        out.append(owned)
    return out
