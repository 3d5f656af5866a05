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


def sentence_log_probs(model: EncoderDecoder, batch: Batch, sentences: Sequence[int]) -> list[list[float]]:
    """Per batch row, the summed log-probability of each of its ``sentences[row]`` target sentences.

    Sentence k owns its ``<s> … </s>`` tokens; the final ``<eos>`` counts for the last sentence, so
    a sentence's score includes the decision to stop after it. A row without markup
    (``data.sentence_markup: false``) is one sentence: all its tokens and ``<eos>``.
    """
    lp = full_log_probs(model, batch).gather(2, batch.tgt_out[..., None]).squeeze(2)
    lp = lp.masked_fill(batch.tgt_out.eq(PAD_ID), 0.0)
    tags = torch.cat([batch.tgt_groups[:, 1:], torch.zeros_like(batch.tgt_groups[:, :1])], 1)
    bare = batch.tgt_groups.amax(1, keepdim=True).eq(0)  # no <s>: one sentence without markup
    tags = torch.where(bare & batch.tgt_out.ne(PAD_ID), 1, tags)
    tags = torch.where(batch.tgt_out.eq(EOS_ID), tags.max(1, keepdim=True).values, tags)
    out = []
    for row, n in enumerate(sentences):
        sums = torch.zeros(n + 1, dtype=lp.dtype).index_add_(0, tags[row].cpu(), lp[row].cpu())
        out.append([float(sums[j + 1]) for j in range(n)])
    return out
