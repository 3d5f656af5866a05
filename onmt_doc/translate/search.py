"""Batched search: one decoding loop, pluggable strategies (beam, greedy) and length penalties.

:class:`Search` runs the loop every strategy shares: encode, step the model, apply the decoding
rules, record finished hypotheses, drop finished sentences from the batch and reorder the
decoding state. A strategy only says, per step, which continuations of each sentence to look at
(:meth:`Search.select`): :class:`BeamSearch` the best ``2·beam``, :class:`GreedySearch` the best
one, :class:`SamplingSearch` draws them (temperature, top-k, top-p, seeded). An ensemble is a
model with the same ``encode``/``init_state``/``step`` (:mod:`onmt_doc.translate.ensemble`).
Finished scores are divided by a :mod:`~onmt_doc.translate.length_penalty`.

Rules (every strategy): when every row holds one sentence (translation units ``sentence``,
``context`` and ``k_to_1``) the output is ``<s> w1 … wn </s> <eos>``: ``<s>`` is forced after
``<bos>`` and ``<eos>`` after ``</s>``, keeping their model scores; a ``k_to_k`` row holds as many
sentences as its source (``<s>`` after ``</s>`` until then, no ``<eos>`` before); document decoders
state their own rules in ``Decoder.constrain``. A target ``prefix`` (``k_to_k`` with
``translate.force_context_prefix``) is forced token by token before every other rule. Every decoder
also obeys :func:`~onmt_doc.decoders.base.forbid_empty` (no ``</s>``/``<eos>`` before a sentence
has a word): a non-empty source line never gives an empty output line. Without markup
(``data.sentence_markup: false``, ``sentence`` unit) nothing is forced but the cap: the output is
``w1 … wn <eos>``, ``<s>``/``</s>`` never generated, ``<eos>`` not before the first word. Output
length per sentence: ``min(max_len_ratio × source + max_len_add, max_length)``; at the cap only
``<eos>`` is allowed.

A sentence is done when its best candidate ends in ``<eos>`` (with ``n_best`` hypotheses
collected), when it reaches its length cap, or when nothing may follow; its rows then leave the
decoding state. Sentences start one row wide and widen only once they have more than one live
candidate, so the first step (every beam would be the same ``<bos>`` prefix) and forced steps
(``<s>`` after ``<bos>``) run on one row per sentence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional

import torch

from onmt_doc.config.translate import TranslateConfig
from onmt_doc.contracts import Batch, LengthLimit
from onmt_doc.data.instances import UNITS, unit_class
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, PAD_ID, SOS_ID
from onmt_doc.decoders.base import count_words, forbid_empty, force_tokens
from onmt_doc.errors import ConfigError
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.translate.length_penalty import GNMTPenalty, LengthPenalty, build_length_penalty


@dataclass
class Hypothesis:
    """A finished translation of one source row."""

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


def forced_next(
    last: torch.Tensor,
    at_cap: torch.Tensor,
    one_sentence: bool,
    left: Optional[torch.Tensor] = None,
    prefix_next: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """[rows] token each row must emit next (-1: free): ``<eos>`` at the length cap and, for rows
    whose sentences the search counts (``one_sentence``), ``<s>`` after ``<bos>`` and ``<eos>`` after
    ``</s>``, or ``<s>`` where the row still has sentences to go (``left`` [rows] > 0: sentences
    not yet closed, unit ``k_to_k``). ``prefix_next`` [rows]: the forced target prefix' next token
    (-1 past it), before every rule but the cap."""
    force = torch.full_like(last, -1)
    if one_sentence:
        after = EOS_ID if left is None else torch.where(left.gt(0), SOS_ID, EOS_ID)
        force = torch.where(last.eq(BOS_ID), SOS_ID, torch.where(last.eq(EOS_SENT_ID), after, force))
    if prefix_next is not None:
        force = torch.where(prefix_next.ge(0), prefix_next, force)
    return torch.where(at_cap, EOS_ID, force)


def allowed_log_probs(
    log_probs: torch.Tensor,
    last: torch.Tensor,
    words: torch.Tensor,
    at_cap: torch.Tensor,
    one_sentence: bool,
    left: Optional[torch.Tensor] = None,
    prefix_next: Optional[torch.Tensor] = None,
    markup: bool = True,
) -> torch.Tensor:
    """[rows, V] log-probabilities with what the rules forbid at -inf: forced tokens
    (:func:`forced_next`) keep their score, every other token of their row is forbidden; a row
    with more than its current sentence to go (``left`` > 1) may not end with ``<eos>``.
    ``markup`` false: sentences without ``<s> … </s>``, so only the cap forces a token."""
    force = forced_next(last, at_cap, one_sentence and markup, left, prefix_next)
    free = forbid_empty(log_probs, last, words, markup)
    if left is not None:
        free[:, EOS_ID] = free[:, EOS_ID].masked_fill(left.gt(1), float("-inf"))
    return torch.where(force.ge(0)[:, None], force_tokens(log_probs, force), free) if force.ge(0).any() else free


def fill_holes(done: torch.Tensor) -> torch.Tensor:
    """The batch positions of the sentences that go on, in their new order: each keeps its place
    unless it lies past the new end, in which case it moves into the place of a finished sentence.
    Pruning then moves as few rows as possible (states rewrite their ``owned_fields`` in place)."""
    n = int((~done).sum())
    order = torch.arange(n, device=done.device)
    holes = done[:n].nonzero().squeeze(1)
    order[holes] = (~done[n:]).nonzero().squeeze(1) + n
    return order


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
    def search(
        self, model: EncoderDecoder, batch: Batch, prefix: Optional[torch.Tensor] = None, markup: bool = True
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` hypotheses of every batch row, best first. ``prefix`` [B, P] (padded with
        ``<pad>``): target tokens forced after ``<bos>``, row by row, keeping their model scores
        (``k_to_k``'s previous translations); hypotheses start with them, and a row's length cap
        grows by its prefix length. ``markup``: the model's ``data.sentence_markup`` (false: the
        batch holds bare sentences of the ``sentence`` unit, and so does the output)."""
        device, n = batch.src.device, batch.size
        state = model.init_state(model.encode(batch), batch, self.limit)  # one row per sentence: width 1
        max_len = model.decoder.max_output_lengths(batch, self.limit).to(device)
        unit = unit_class(model.unit)
        one_sentence = unit.rows != "decoder"
        if not markup and unit is not UNITS.get("sentence").cls:
            raise ConfigError(f"sentences without markup are for the sentence unit only, not {model.unit}")
        # unit k_to_k: a row's output holds as many sentences as its source
        n_sents = batch.src.eq(SOS_ID).sum(1) if unit.rows == "source" else None
        plen = None
        if prefix is not None:
            prefix = prefix.to(device)
            plen = prefix.ne(PAD_ID).sum(1)
            max_len = max_len + plen
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
            origin = alive.repeat_interleave(width)  # the batch row of each live row
            left = None if n_sents is None else n_sents[origin] - seqs.eq(EOS_SENT_ID).sum(1)
            prefix_next = None
            if plen is not None:
                at = prefix[origin, min(t, prefix.size(1) - 1)] if prefix.size(1) else plen[origin]
                prefix_next = torch.where(plen[origin].gt(t), at, -1)
            log_probs = allowed_log_probs(
                model.decoder.constrain(log_probs, state),
                seqs[:, -1],
                words,
                (max_len <= t).repeat_interleave(width),
                one_sentence,
                left,
                prefix_next,
                markup,
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
                still = fill_holes(done)
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
        """See :meth:`Search.select`."""
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
        """See :meth:`Search.select`."""
        b, width, vocab = log_probs.shape
        top_scores, top_ids = (scores[:, :, None] + log_probs).view(b, width * vocab).topk(1, dim=1)
        tokens = top_ids % vocab
        ends = tokens.eq(EOS_ID) & top_scores.gt(float("-inf"))
        return Choice(top_scores, top_ids // vocab, tokens, ends, torch.zeros_like(top_ids))


def sampling_probs(
    log_probs: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """[rows, V] the distribution a sample is drawn from, in the usual order (temperature, then
    top-k, then top-p, as in Hugging Face's and fairseq's samplers): ``softmax(log_probs / T)``
    restricted to the ``top_k`` most probable tokens (0 = all), then to the smallest set of most
    probable tokens whose probability sums to at least ``top_p`` (nucleus; Holtzman et al., 2020),
    renormalised. Tokens at -inf (forbidden by the rules) keep probability 0. Every row needs a
    finite entry."""
    logits = log_probs.float() / temperature
    if 0 < top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass of the more probable tokens
        cut = before >= top_p  # the most probable token always stays (its "before" is 0)
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(cut, float("-inf")))
    return logits.softmax(-1)


class SamplingSearch(Search):
    """Each live row draws its next token from the model's distribution (:func:`sampling_probs`),
    for back-translation and diverse outputs; the loop's rules (forced tokens, forbidden tokens,
    the decoder's ``constrain``, length caps) hold as for beam search, so a sampled document keeps
    its sentence count. A sample's score is its model log-probability (untempered, unfiltered)
    divided by the length penalty.

    ``n_best`` > 1: that many independent samples per sentence (they branch at the first step and
    are ranked by score). The random numbers come from the search's own ``torch.Generator``,
    seeded with ``seed`` when the search first runs on a device and continued by later calls: a
    new search object (a new translator, one command run) gives the same samples for the same
    input and batches, further calls on the same one draw new samples, and torch's global
    generator is never used."""

    def __init__(
        self,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 1,
        n_best: int = 1,
        penalty: LengthPenalty = GNMTPenalty(1.0),
        max_len_ratio: float = 1.5,
        max_len_add: int = 10,
        max_length: int = 250,
    ):
        super().__init__(n_best, penalty, max_len_ratio, max_len_add, max_length)
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.generator: torch.Generator | None = None

    def _generator(self, device: torch.device) -> torch.Generator:
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device=device).manual_seed(self.seed)
        return self.generator

    def select(self, scores: torch.Tensor, log_probs: torch.Tensor) -> Choice:
        """See :meth:`Search.select`."""
        b, width, vocab = log_probs.shape
        draws = self.n_best if width == 1 else 1  # the n samples of a sentence branch at its first step
        flat = log_probs.reshape(b * width, vocab)
        usable = flat.isfinite().any(1)  # a row with every token forbidden draws anything, at -inf
        probs = sampling_probs(torch.where(usable[:, None], flat, 0.0), self.temperature, self.top_k, self.top_p)
        tokens = torch.multinomial(probs, draws, replacement=True, generator=self._generator(flat.device))
        cand = (scores.reshape(-1, 1) + flat.gather(1, tokens)).view(b, width * draws)
        tokens = tokens.view(b, width * draws)
        c = width * draws
        origin = torch.arange(width, device=flat.device).repeat_interleave(draws).expand(b, c)
        ends = tokens.eq(EOS_ID) & cand.isfinite()
        live = cand.isfinite() & ~ends
        # c placeholder columns at -inf stand in for samples that ended or died, so every sentence
        # keeps c rows (live samples first: a sentence whose first kept row is -inf is done)
        dead = torch.full_like(cand, float("-inf"))
        all_scores = torch.cat([cand, dead], 1)
        all_origin = torch.cat([origin, torch.zeros_like(origin)], 1)
        all_tokens = torch.cat([tokens, torch.full_like(tokens, EOS_ID)], 1)
        all_ends = torch.cat([ends, torch.zeros_like(ends)], 1)
        rank = torch.cat([(~live).long() * 2, torch.ones_like(tokens)], 1)
        keep = rank.sort(dim=1, stable=True).indices[:, :c]
        return Choice(all_scores, all_origin, all_tokens, all_ends, keep)


def build_search(opt: TranslateConfig) -> Search:
    """The search the ``translate`` section asks for: sampling for ``strategy: sampling``, else
    greedy for beam 1 and beam search otherwise. Checks the section first (options changed after
    loading, e.g. by command-line flags, are checked too)."""
    opt.validate("translate", None)
    penalty = build_length_penalty(opt.length_penalty_type, opt.length_penalty)
    limits = dict(max_len_ratio=opt.max_len_ratio, max_len_add=opt.max_len_add, max_length=opt.max_length)
    if opt.strategy == "sampling":
        return SamplingSearch(opt.temperature, opt.top_k, opt.top_p, opt.seed, opt.n_best, penalty, **limits)
    if opt.strategy != "beam":
        raise ConfigError(f"translate.strategy: unknown strategy {opt.strategy!r}; expected beam or sampling")
    if opt.beam == 1:
        return GreedySearch(penalty, **limits)
    return BeamSearch(opt.beam, opt.n_best, penalty, **limits)
