"""Batched search: one decoding loop, pluggable strategies (beam, greedy) and length penalties.

:class:`Search` runs the loop every strategy shares: encode, step the model, apply the decoding
rules, record finished hypotheses, drop finished sentences from the batch and reorder the
decoding state. A strategy only says, per step, which continuations of each sentence to look at
(:meth:`Search.select`): :class:`BeamSearch` the best ``2·beam``, :class:`GreedySearch` the best
one. A sampling strategy would draw them instead; an ensemble would be a model with the same
``encode``/``init_state``/``step``. Finished scores are divided by a
:mod:`~onmt_doc.translate.length_penalty`.

Rules (every strategy): when every row holds one sentence (translation units ``sentence`` and
``context``) the output is ``<s> w1 … wn </s> <eos>``: ``<s>`` is forced after ``<bos>`` and
``<eos>`` after ``</s>``, keeping their model scores (document decoders state their own rules in
``Decoder.constrain``). Every decoder also obeys :func:`~onmt_doc.decoders.base.forbid_empty` (no
``</s>``/``<eos>`` before a sentence has a word): a non-empty source line never gives an empty
output line. Output length per sentence: ``min(max_len_ratio × source + max_len_add,
max_length)``; at the cap only ``<eos>`` is allowed.

A sentence is done when its best candidate ends in ``<eos>`` (with ``n_best`` hypotheses
collected), when it reaches its length cap, or when nothing may follow; its rows then leave the
decoding state. Sentences start one row wide and widen only once they have more than one live
candidate, so the first step (every beam would be the same ``<bos>`` prefix) and forced steps
(``<s>`` after ``<bos>``) run on one row per sentence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from onmt_doc.config import TranslateConfig
from onmt_doc.data.batching import Batch
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, SOS_ID
from onmt_doc.decoders.base import LengthLimit, count_words, forbid_empty, force_tokens
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.translate.length_penalty import GNMTPenalty, LengthPenalty, build_length_penalty


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, <eos> excluded
    score: float  # log-probability / length penalty
    log_prob: float


@dataclass
class Choice:
    """A strategy's pick for one step, for ``b`` alive sentences and ``c`` candidates each."""

    scores: torch.Tensor  # [b, c] cumulative log-probability of each candidate, best first
    origin: torch.Tensor  # [b, c] the sentence's live row (0 … width-1) each candidate extends
    tokens: torch.Tensor  # [b, c] the token each candidate appends
    ends: torch.Tensor  # [b, c] bool: the candidate ends in <eos> and becomes a finished hypothesis
    keep: torch.Tensor  # [b, w] candidates (columns) that stay live, best first: the next width is w


def forced_next(last: torch.Tensor, at_cap: torch.Tensor, one_sentence: bool) -> torch.Tensor:
    """[rows] token each row must emit next (-1: free): ``<eos>`` at the length cap and, for rows
    that hold one sentence, ``<s>`` after ``<bos>`` and ``<eos>`` after ``</s>``."""
    force = torch.full_like(last, -1)
    if one_sentence:
        force = torch.where(last.eq(BOS_ID), SOS_ID, torch.where(last.eq(EOS_SENT_ID), EOS_ID, force))
    return torch.where(at_cap, EOS_ID, force)


def allowed_log_probs(
    log_probs: torch.Tensor, last: torch.Tensor, words: torch.Tensor, at_cap: torch.Tensor, one_sentence: bool
) -> torch.Tensor:
    """[rows, V] log-probabilities with what the rules forbid at -inf: forced tokens
    (:func:`forced_next`) keep their score, every other token of their row is forbidden."""
    force = forced_next(last, at_cap, one_sentence)
    free = forbid_empty(log_probs, last, words)
    return torch.where(force.ge(0)[:, None], force_tokens(log_probs, force), free) if force.ge(0).any() else free


class Search(ABC):
    """The decoding loop; subclasses choose each step's continuations (:meth:`select`)."""

    def __init__(
        self,
        n_best: int = 1,
        penalty: LengthPenalty = GNMTPenalty(1.0),
        max_len_ratio: float = 1.5,
        max_len_add: int = 10,
        max_length: int = 250,
    ):
        self.n_best, self.penalty = n_best, penalty
        self.limit = LengthLimit(max_len_ratio, max_len_add, max_length)

    @abstractmethod
    def select(self, scores: torch.Tensor, log_probs: torch.Tensor) -> Choice:
        """This step's candidates from ``scores`` [b, width] (each live row's cumulative
        log-probability) and ``log_probs`` [b, width, V] (next-token log-probabilities, -inf where
        the rules forbid a token)."""

    @torch.no_grad()
    def search(self, model: EncoderDecoder, batch: Batch) -> list[list[Hypothesis]]:
        """The ``n_best`` hypotheses of every batch row, best first."""
        device, n = batch.src.device, batch.size
        state = model.init_state(model.encode(batch), batch, self.limit)  # one row per sentence: width 1
        max_len = model.decoder.max_output_lengths(batch, self.limit).to(device)
        one_sentence = model.unit != "document"
        alive = torch.arange(n, device=device)  # original row of each alive sentence
        width = 1  # rows per alive sentence
        scores = torch.zeros(n, 1, device=device)
        seqs = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)
        words = torch.zeros(n, dtype=torch.long, device=device)  # words in each row's current sentence
        finished: list[list[Hypothesis]] = [[] for _ in range(n)]
        t = 0
        while alive.numel():
            b = alive.numel()
            log_probs, state = model.step(seqs[:, -1], state)
            log_probs = allowed_log_probs(
                model.decoder.constrain(log_probs, state),
                seqs[:, -1],
                words,
                (max_len <= t).repeat_interleave(width),
                one_sentence,
            )
            choice = self.select(scores, log_probs.view(b, width, -1))
            self._collect(finished, alive, choice, seqs, width, t)
            new_scores = choice.scores.gather(1, choice.keep)
            new_width = choice.keep.size(1)
            rows = (choice.origin.gather(1, choice.keep) + torch.arange(b, device=device)[:, None] * width).view(-1)
            new_tokens = choice.tokens.gather(1, choice.keep).view(-1, 1)
            n_done = torch.tensor([len(finished[i]) for i in alive.tolist()], device=device)
            done = (choice.ends[:, 0] & n_done.ge(self.n_best)) | max_len.le(t) | new_scores[:, 0].eq(float("-inf"))
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

    def _collect(
        self,
        finished: list[list[Hypothesis]],
        alive: torch.Tensor,
        choice: Choice,
        seqs: torch.Tensor,
        width: int,
        t: int,
    ) -> None:
        """Record the candidates that end in <eos> as finished hypotheses (length counts <eos>)."""
        if not choice.ends.any():
            return
        penalty = float(self.penalty(torch.tensor(float(t + 1))))
        alive_list = alive.tolist()
        for row, j in choice.ends.nonzero().tolist():
            log_prob = float(choice.scores[row, j])
            src_row = row * width + int(choice.origin[row, j])
            finished[alive_list[row]].append(Hypothesis(seqs[src_row, 1:].tolist(), log_prob / penalty, log_prob))


class BeamSearch(Search):
    """Each sentence looks at its ``2·beam`` best candidates: those ending in ``<eos>`` among the
    top ``beam`` finish, the ``beam`` best others stay live."""

    def __init__(
        self,
        beam: int = 5,
        n_best: int = 1,
        penalty: LengthPenalty = GNMTPenalty(1.0),
        max_len_ratio: float = 1.5,
        max_len_add: int = 10,
        max_length: int = 250,
    ):
        if n_best > beam:
            raise ValueError(f"n_best ({n_best}) cannot exceed the beam size ({beam})")
        super().__init__(n_best, penalty, max_len_ratio, max_len_add, max_length)
        self.beam = beam

    def select(self, scores: torch.Tensor, log_probs: torch.Tensor) -> Choice:
        k = self.beam
        b, width, vocab = log_probs.shape
        cand = (scores[:, :, None] + log_probs).view(b, width * vocab)
        top_scores, top_ids = cand.topk(min(2 * k, width * vocab), dim=1)
        origin, tokens = top_ids // vocab, top_ids % vocab
        is_eos = tokens.eq(EOS_ID) & top_scores.gt(float("-inf"))
        # keep the k best candidates that do not end in <eos>
        rank = torch.arange(top_ids.size(1), device=cand.device).expand_as(top_ids)
        keep = (rank + is_eos.long() * top_ids.size(1)).topk(min(k, top_ids.size(1)), dim=1, largest=False).indices
        if not top_scores.gather(1, keep[:, 1:]).isfinite().any():  # one live candidate per sentence
            keep = keep[:, :1]
        ends = is_eos & rank.lt(k)
        return Choice(top_scores, origin, tokens, ends, keep)


class GreedySearch(Search):
    """The best continuation of each sentence; the same output as beam 1, with less work."""

    def __init__(
        self,
        penalty: LengthPenalty = GNMTPenalty(1.0),
        max_len_ratio: float = 1.5,
        max_len_add: int = 10,
        max_length: int = 250,
    ):
        super().__init__(1, penalty, max_len_ratio, max_len_add, max_length)

    def select(self, scores: torch.Tensor, log_probs: torch.Tensor) -> Choice:
        b, width, vocab = log_probs.shape
        top_scores, top_ids = (scores[:, :, None] + log_probs).view(b, width * vocab).topk(1, dim=1)
        tokens = top_ids % vocab
        ends = tokens.eq(EOS_ID) & top_scores.gt(float("-inf"))
        return Choice(top_scores, top_ids // vocab, tokens, ends, torch.zeros_like(top_ids))


def build_search(opt: TranslateConfig) -> Search:
    """The search the ``translate`` section asks for: greedy for beam 1, else beam search."""
    penalty = build_length_penalty(opt.length_penalty_type, opt.length_penalty)
    limits = dict(max_len_ratio=opt.max_len_ratio, max_len_add=opt.max_len_add, max_length=opt.max_length)
    if opt.beam == 1:
        return GreedySearch(penalty, **limits)
    return BeamSearch(opt.beam, opt.n_best, penalty, **limits)
