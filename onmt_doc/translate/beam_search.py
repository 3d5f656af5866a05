"""Batched beam search with length penalty; finished sentences leave the batch.

Per step each sentence keeps its ``beam`` best unfinished continuations out of the 2·beam best
candidates; a candidate ending in ``<eos>`` among the top ``beam`` becomes a finished hypothesis.
A sentence is done when its best candidate ends in ``<eos>`` (with ``n_best`` hypotheses
collected) or it reaches its length cap; its rows are then removed from the decoding state.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from onmt_doc.data.batching import Batch
from onmt_doc.data.vocab import BOS_ID, EOS_ID
from onmt_doc.decoders.base import LengthLimit
from onmt_doc.models.model import EncoderDecoder


@dataclass
class Hypothesis:
    tokens: list[int]      # generated ids, <eos> excluded
    score: float           # log-probability / length penalty
    log_prob: float


def length_penalty(length: torch.Tensor, alpha: float) -> torch.Tensor:
    """GNMT (Wu et al., 2016): ((5 + |Y|) / 6) ^ alpha."""
    return ((5.0 + length) / 6.0) ** alpha if alpha else torch.ones_like(length)


class BeamSearch:
    def __init__(self, beam: int = 5, n_best: int = 1, alpha: float = 1.0, max_len_ratio: float = 1.5,
                 max_len_add: int = 10):
        if n_best > beam:
            raise ValueError(f"n_best ({n_best}) cannot exceed the beam size ({beam})")
        self.beam, self.n_best, self.alpha = beam, n_best, alpha
        self.max_len_ratio, self.max_len_add = max_len_ratio, max_len_add


    @torch.no_grad()
    def search(self, model: EncoderDecoder, batch: Batch) -> list[list[Hypothesis]]:
        """The ``n_best`` hypotheses of every batch row, best first."""
        k, device = self.beam, batch.src.device
        n = batch.size
        enc_out = model.encode(batch)
        limit = LengthLimit(self.max_len_ratio, self.max_len_add)
        state = model.init_state(enc_out, batch, limit).reorder(torch.arange(n, device=device).repeat_interleave(k))
        max_len = model.decoder.max_output_lengths(batch, limit).to(device)
        alive = torch.arange(n, device=device)                       # original row of each alive sentence
        scores = torch.full((n, k), float("-inf"), device=device)
        scores[:, 0] = 0.0
        seqs = torch.full((n * k, 1), BOS_ID, dtype=torch.long, device=device)
        finished: list[list[Hypothesis]] = [[] for _ in range(n)]
        t = 0
        while alive.numel():
            b = alive.numel()
            lp, state = model.step(seqs[:, -1], state)
            lp = model.decoder.constrain(lp, state)
            vocab = lp.size(-1)
            at_cap = (max_len <= t).repeat_interleave(k)
            if at_cap.any():
                eos_only = torch.full_like(lp[0], float("-inf"))
                eos_only[EOS_ID] = 0.0
                lp[at_cap] = lp[at_cap, EOS_ID, None] + eos_only
            cand = (scores.view(-1, 1) + lp).view(b, k * vocab)
            top_scores, top_ids = cand.topk(min(2 * k, k * vocab), dim=1)
            origin, token = top_ids // vocab, top_ids % vocab
            is_eos = token.eq(EOS_ID) & top_scores.gt(float("-inf"))
            self._collect(finished, alive, is_eos[:, :k], top_scores[:, :k], origin[:, :k], seqs, k, t)
            # keep the k best candidates that do not end in <eos>
            rank = torch.arange(top_ids.size(1), device=device).expand_as(top_ids)
            keep = (rank + is_eos.long() * top_ids.size(1)).topk(k, dim=1, largest=False).indices
            new_scores = top_scores.gather(1, keep)
            rows = (origin.gather(1, keep) + torch.arange(b, device=device)[:, None] * k).view(-1)
            new_tokens = token.gather(1, keep).view(-1, 1)
            n_done = torch.tensor([len(finished[i]) for i in alive.tolist()], device=device)
            done = (is_eos[:, 0] & n_done.ge(self.n_best)) | max_len.le(t) | new_scores[:, 0].eq(float("-inf"))
            t += 1
            if done.any():
                still = (~done).nonzero().squeeze(1)
                alive, max_len, new_scores = alive[still], max_len[still], new_scores[still]
                rows = rows.view(b, k)[still].view(-1)
                new_tokens = new_tokens.view(b, k)[still].view(-1, 1)
                if rows.numel():
                    state = state.reorder(rows)
            elif rows.numel():
                state = state.reorder(rows, same_sources=True)
            seqs = torch.cat([seqs.index_select(0, rows), new_tokens], dim=1)
            scores = new_scores
        return [sorted(h, key=lambda x: -x.score)[: self.n_best] for h in finished]

    def _collect(self, finished, alive, is_eos, scores, origin, seqs, k, t) -> None:
        """Record candidates ending in <eos> as finished hypotheses (length includes <eos>)."""
        if not is_eos.any():
            return
        where = is_eos.nonzero().tolist()
        lp = float(length_penalty(torch.tensor(float(t + 1)), self.alpha))
        alive_list = alive.tolist()
        for row, j in where:
            s = float(scores[row, j])
            src_row = row * k + int(origin[row, j])
            finished[alive_list[row]].append(Hypothesis(seqs[src_row, 1:].tolist(), s / lp, s))
