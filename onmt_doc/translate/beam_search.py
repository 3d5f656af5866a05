"""Batched beam search with length penalty; finished sentences leave the batch.

Per step each sentence keeps its ``beam`` best unfinished continuations out of the 2·beam best
candidates; a candidate ending in ``<eos>`` among the top ``beam`` becomes a finished hypothesis.
A sentence is done when its best candidate ends in ``<eos>`` (with ``n_best`` hypotheses
collected) or it reaches its length cap; its rows are then removed from the decoding state.

Beams start one row wide per sentence and widen to ``beam`` rows only once a sentence has more
than one live candidate: the first step (all beams would be the same ``<bos>`` prefix) and steps
whose token is forced (``<s>`` after ``<bos>``) run on one row per sentence, not ``beam``.

When every row holds one sentence (translation units ``sentence`` and ``context``) the output
is ``<s> w1 … wn </s> <eos>``: ``<s>`` is forced after ``<bos>`` and ``<eos>`` after ``</s>``,
keeping their model scores (document decoders state their own rules in ``Decoder.constrain``).
Every decoder also obeys :func:`~onmt_doc.decoders.base.forbid_empty` (no ``</s>``/``<eos>``
before a sentence has a word): a non-empty source line never gives an empty output line.
Output length per sentence: ``min(max_len_ratio × source + max_len_add, max_length)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from onmt_doc.data.batching import Batch
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, SOS_ID
from onmt_doc.decoders.base import LengthLimit, count_words, forbid_empty, force_tokens
from onmt_doc.models.model import EncoderDecoder


@dataclass
class Hypothesis:
    tokens: list[int]      # generated ids, <eos> excluded
    score: float           # log-probability / length penalty
    log_prob: float


def length_penalty(length: torch.Tensor, alpha: float) -> torch.Tensor:
    """GNMT (Wu et al., 2016): ((5 + |Y|) / 6) ^ alpha."""
    return ((5.0 + length) / 6.0) ** alpha if alpha else torch.ones_like(length)


def forced_next(last: torch.Tensor, at_cap: torch.Tensor, one_sentence: bool) -> torch.Tensor:
    """[rows] token each row must emit next (-1: free): ``<eos>`` at the length cap and, for rows
    that hold one sentence, ``<s>`` after ``<bos>`` and ``<eos>`` after ``</s>``."""
    force = torch.full_like(last, -1)
    if one_sentence:
        force = torch.where(last.eq(BOS_ID), SOS_ID, torch.where(last.eq(EOS_SENT_ID), EOS_ID, force))
    return torch.where(at_cap, EOS_ID, force)


class BeamSearch:
    def __init__(self, beam: int = 5, n_best: int = 1, alpha: float = 1.0, max_len_ratio: float = 1.5,
                 max_len_add: int = 10, max_length: int = 250):
        if n_best > beam:
            raise ValueError(f"n_best ({n_best}) cannot exceed the beam size ({beam})")
        self.beam, self.n_best, self.alpha = beam, n_best, alpha
        self.limit = LengthLimit(max_len_ratio, max_len_add, max_length)


    @torch.no_grad()
    def search(self, model: EncoderDecoder, batch: Batch) -> list[list[Hypothesis]]:
        """The ``n_best`` hypotheses of every batch row, best first."""
        k, device = self.beam, batch.src.device
        n = batch.size
        enc_out = model.encode(batch)
        limit = self.limit
        state = model.init_state(enc_out, batch, limit)              # one row per sentence: width 1
        max_len = model.decoder.max_output_lengths(batch, limit).to(device)
        one_sentence = model.unit != "document"
        alive = torch.arange(n, device=device)                       # original row of each alive sentence
        width = 1                                                    # rows per alive sentence
        scores = torch.zeros(n, 1, device=device)
        seqs = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)
        words = torch.zeros(n, dtype=torch.long, device=device)     # words in each row's current sentence
        finished: list[list[Hypothesis]] = [[] for _ in range(n)]
        t = 0
        while alive.numel():
            b = alive.numel()
            lp, state = model.step(seqs[:, -1], state)
            lp = model.decoder.constrain(lp, state)
            force = forced_next(seqs[:, -1], (max_len <= t).repeat_interleave(width), one_sentence)
            free = forbid_empty(lp, seqs[:, -1], words)
            lp = torch.where(force.ge(0)[:, None], force_tokens(lp, force), free) if force.ge(0).any() else free
            vocab = lp.size(-1)
            cand = (scores.view(-1, 1) + lp).view(b, width * vocab)
            top_scores, top_ids = cand.topk(min(2 * k, width * vocab), dim=1)
            origin, token = top_ids // vocab, top_ids % vocab
            is_eos = token.eq(EOS_ID) & top_scores.gt(float("-inf"))
            self._collect(finished, alive, is_eos[:, :k], top_scores[:, :k], origin[:, :k], seqs, width, t)
            # keep the k best candidates that do not end in <eos>
            rank = torch.arange(top_ids.size(1), device=device).expand_as(top_ids)
            keep = (rank + is_eos.long() * top_ids.size(1)).topk(min(k, top_ids.size(1)), dim=1, largest=False).indices
            new_scores = top_scores.gather(1, keep)
            if not new_scores[:, 1:].isfinite().any():                  # one live candidate per sentence
                keep, new_scores = keep[:, :1], new_scores[:, :1]
            new_width = keep.size(1)
            rows = (origin.gather(1, keep) + torch.arange(b, device=device)[:, None] * width).view(-1)
            new_tokens = token.gather(1, keep).view(-1, 1)
            n_done = torch.tensor([len(finished[i]) for i in alive.tolist()], device=device)
            done = (is_eos[:, 0] & n_done.ge(self.n_best)) | max_len.le(t) | new_scores[:, 0].eq(float("-inf"))
            t += 1
            if done.any():
                still = (~done).nonzero().squeeze(1)
                alive, max_len, new_scores = alive[still], max_len[still], new_scores[still]
                rows = rows.view(b, new_width)[still].view(-1)
                new_tokens = new_tokens.view(b, new_width)[still].view(-1, 1)
                if rows.numel():
                    state = state.reorder(rows)
            elif rows.numel():
                state = state.reorder(rows, same_sources=new_width == width)
            seqs = torch.cat([seqs.index_select(0, rows), new_tokens], dim=1)
            words = count_words(words.index_select(0, rows), new_tokens.view(-1))
            scores, width = new_scores, new_width
        return [sorted(h, key=lambda x: -x.score)[: self.n_best] for h in finished]

    def _collect(self, finished, alive, is_eos, scores, origin, seqs, width, t) -> None:
        """Record candidates ending in <eos> as finished hypotheses (length includes <eos>)."""
        if not is_eos.any():
            return
        where = is_eos.nonzero().tolist()
        lp = float(length_penalty(torch.tensor(float(t + 1)), self.alpha))
        alive_list = alive.tolist()
        for row, j in where:
            s = float(scores[row, j])
            src_row = row * width + int(origin[row, j])
            finished[alive_list[row]].append(Hypothesis(seqs[src_row, 1:].tolist(), s / lp, s))
