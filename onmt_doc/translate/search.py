"""Batched search: one decoding loop, pluggable strategies (beam, greedy, sampling) and length penalties.

:class:`Search` runs the loop every strategy shares: encode, step the model, apply the decoding
rules, record finished hypotheses, drop finished sentences from the batch and reorder the
decoding state. A strategy only says, per step, which continuations of each sentence to look at
(:meth:`Search.select`): :class:`BeamSearch` the best ``2·beam``, :class:`GreedySearch` the best
one, :class:`SamplingSearch` draws them (temperature, top-k, top-p, seeded). Strategies are a
registry (:data:`SEARCHES`, ``registry_for("search")``): ``translate.strategy`` names one, and
``beam`` with ``translate.beam: 1`` runs ``greedy`` (same output, less work). An ensemble is a
model with the same ``encode``/``init_state``/``step`` (:mod:`onmt_doc.translate.ensemble`).
Finished scores are divided by a :mod:`~onmt_doc.translate.length_penalty`.

Rules (every strategy): the decoder's own ``Decoder.constrain``, then the rules the model's unit
asks for (:mod:`onmt_doc.translate.rules`: sentence markup, the source's sentence count, forbidden
tokens, a forced target prefix, the length cap), so a non-empty source line never gives an empty
output line and forced tokens keep their model scores. Output length per sentence:
``min(max_len_ratio × source + max_len_add, max_length)``; at the cap only ``<eos>`` is allowed.

A sentence is done when its best candidate ends in ``<eos>`` (with ``n_best`` hypotheses
collected), when it reaches its length cap, or when nothing may follow; its rows then leave the
decoding state. Sentences start one row wide and widen only once they have more than one live
candidate, so the first step (every beam would be the same ``<bos>`` prefix) and forced steps
(``<s>`` after ``<bos>``) run on one row per sentence.

Reading the device (``translate.read_every``): whether a hypothesis ended, a sentence finished or
the beam may narrow is known on the device; the loop reads it on the host once every
``read_every`` steps (0 = 1 on the packed path, a CPU's, and :data:`FUSED_READ_EVERY` on the fused
path, a GPU's). Between reads a finished sentence stays in the batch, masked (it collects nothing
more), ended candidates wait on the device, and the beam keeps its width, so a GPU queues several
steps ahead instead of waiting for each one; the output is the same, at the cost of a few steps of
finished rows. On a CPU a read costs nothing and dropping finished rows at once is the saving.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from onmt_doc import devices
from onmt_doc.config.translate import TranslateConfig
from onmt_doc.contracts import Batch, LengthLimit
from onmt_doc.data.vocab import BOS_ID, EOS_ID, PAD_ID
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.registry import Registry
from onmt_doc.translate.length_penalty import GNMTPenalty, LengthPenalty, build_length_penalty
from onmt_doc.translate.rules import Step, search_rules


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
    # 0-dim bool, or None: keep only the first column of ``keep`` (no sentence has a second live
    # candidate); a tensor so the loop reads it with its other flags, in one device read a step
    narrow: Optional[torch.Tensor] = None


@dataclass
class _Ended:
    """One step's candidates that end in ``<eos>``, kept on the device until the loop next reads it
    (the tensors are that step's: the loop replaces, never modifies, them)."""

    t: int
    alive: torch.Tensor  # [b] batch row of each sentence
    width: int
    ends: torch.Tensor  # [b, c] the candidates that finish (sentences already done masked out)
    choice: Choice
    seqs: torch.Tensor  # [b·width, t+1] the live rows' tokens before this step's


# steps between the loop's device reads on the fused (GPU) path when ``translate.read_every`` is 0
FUSED_READ_EVERY = 8


def fill_holes(done: torch.Tensor) -> torch.Tensor:
    """The batch positions of the sentences that go on, in their new order: each keeps its place
    unless it lies past the new end, in which case it moves into the place of a finished sentence.
    Pruning then moves as few rows as possible (states rewrite their ``owned_fields`` in place).
    Planned on the host from one read of ``done`` (numpy's array of it)."""
    flags = done.cpu().numpy()
    n = int((~flags).sum())
    order = np.arange(n)
    order[np.flatnonzero(flags[:n])] = np.flatnonzero(~flags[n:]) + n
    return torch.from_numpy(order).to(done.device)


# the strategies by name (``translate.strategy``; ``greedy`` is beam search with ``beam: 1``);
# registry_for("search") reads REGISTRY
SEARCHES = REGISTRY = Registry("search")


def _loop_options(opt: TranslateConfig) -> dict:
    """The arguments of the shared loop (length caps, device reads, compilation) every strategy takes from the
    ``translate`` section."""
    return dict(
        max_len_ratio=opt.max_len_ratio,
        max_len_add=opt.max_len_add,
        max_length=opt.max_length,
        read_every=opt.read_every,
        compile=opt.compile,
    )


class Search(ABC):
    """The decoding loop; subclasses choose each step's continuations (:meth:`select`)."""

    # a strategy whose choices depend on the rows in the batch (sampling's draws) reads every step,
    # so that finished rows kept for a few steps change nothing
    reads_every_step = False

    def __init__(
        self,
        n_best: int = 1,
        penalty: LengthPenalty = GNMTPenalty(1.0),
        max_len_ratio: float = 1.5,
        max_len_add: int = 10,
        max_length: int = 250,
        read_every: int = 0,
        compile: str = "off",
    ):
        self.n_best, self.penalty = n_best, penalty
        self.limit = LengthLimit(max_len_ratio, max_len_add, max_length)
        self.read_every, self.compile = read_every, compile
        self._step: Optional[tuple[EncoderDecoder, Callable]] = None  # the last model and its (compiled) step
        self.device_reads = 0  # times the loop has waited for the device (a statistic for benchmarks)

    def read_interval(self, device: torch.device) -> int:
        """Steps between the loop's device reads (``translate.read_every``; 0: per kernel path)."""
        if self.reads_every_step:
            return 1
        if self.read_every:
            return self.read_every
        return FUSED_READ_EVERY if devices.fused(device) else 1

    def step_of(self, model: EncoderDecoder, device: torch.device) -> Callable:
        """``model.step``, compiled where ``translate.compile`` asks for it on ``device``
        (:func:`onmt_doc.devices.compiled`): once for a translator's model, whose later searches reuse
        the compiled code (the search keeps one model's, as a translator holds one model)."""
        if self._step is None or self._step[0] is not model:
            step = devices.compiled(model.step, self.compile, device, "translate.compile", duck_shapes=False)
            self._step = (model, step)
        return self._step[1]

    def _read(self, x: torch.Tensor) -> list:
        """``x`` on the host, counted: the loop's reads of its flags and finished hypotheses (with
        ``fill_holes``' read, counted beside it, all the waits a search makes for the device)."""
        self.device_reads += 1
        return x.tolist()

    @classmethod
    @abstractmethod
    def from_options(cls, opt: TranslateConfig, penalty: LengthPenalty) -> "Search":
        """The strategy as the ``translate`` section configures it, ranking by ``penalty``."""

    @abstractmethod
    def select(self, scores: torch.Tensor, log_probs: torch.Tensor) -> Choice:
        """This step's candidates from ``scores`` [b, width] (each live row's cumulative
        log-probability) and ``log_probs`` [b, width, V] (next-token log-probabilities, -inf where
        the rules forbid a token)."""

    @torch.no_grad()
    def search(
        self, model: EncoderDecoder, batch: Batch, prefix: Optional[torch.Tensor] = None, markup: bool = True
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` hypotheses of every batch row, best first, under the rules the model's
        unit asks for (:func:`~onmt_doc.translate.rules.search_rules`). ``prefix`` [B, P] (padded
        with ``<pad>``): target tokens forced after ``<bos>``, row by row (``k_to_k``'s previous
        translations, a request's context translations); hypotheses start with them, a row's length
        cap grows by its prefix length, and a hypothesis' ``log_prob`` and ``score`` are those of the
        tokens generated after its prefix (the prefix was given, not chosen). ``markup``: the
        model's ``data.sentence_markup`` (false: the batch holds bare sentences of the ``sentence``
        unit, and so does the output)."""
        device, n = batch.src.device, batch.size
        state = model.init_state(model.encode(batch), batch, self.limit)  # one row per sentence: width 1
        caps = model.decoder.max_output_lengths(batch, self.limit).to(device)
        rules = search_rules(model.unit, batch, caps, prefix, markup)
        every = self.read_interval(device)
        # every sentence is at its cap by this step: the loop reads then, whatever the interval
        last = self._read(rules.cap.caps.max()) if every > 1 else 0
        alive = torch.arange(n, device=device)  # original row of each alive sentence
        width = 1  # rows per alive sentence
        scores = torch.zeros(n, 1, device=device)
        seqs = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)
        finished: list[list[Hypothesis]] = [[] for _ in range(n)]
        n_finished = torch.zeros(n, dtype=torch.long, device=device)  # len(finished[i]), kept on the device
        gone = torch.zeros(n, dtype=torch.bool, device=device)  # alive sentences done, dropped at the next read
        pending: list[_Ended] = []  # steps whose ended candidates are not collected yet
        given = _Given(prefix, n, device)
        model_step = self.step_of(model, device)
        last_tokens = seqs[:, 0]  # [rows] contiguous (a view of seqs' last column would change strides every step)
        t = 0
        while alive.numel():
            b = alive.numel()
            log_probs, state = model_step(last_tokens, state)
            step = Step(t, last_tokens, alive.repeat_interleave(width))  # origin: the batch row of each live row
            log_probs = rules.apply(model.decoder.constrain(log_probs, state), step)
            choice = self.select(scores, log_probs.view(b, width, -1))
            ends = choice.ends & ~gone[:, None]  # a sentence already done finishes nothing more
            n_done = n_finished[alive] + ends.sum(1)  # with this step's finished candidates
            n_finished[alive] = n_done
            at_cap = rules.cap.reached(alive, t)
            first = choice.scores.gather(1, choice.keep[:, :1])[:, 0]  # the best live candidate (any width)
            gone = gone | (ends[:, 0] & n_done.ge(self.n_best)) | at_cap | first.eq(float("-inf"))
            pending.append(_Ended(t, alive, width, ends, choice, seqs))
            # read now: every `every` steps, at the last cap, and while one row per sentence may stay one
            read = every == 1 or (t + 1) % every == 0 or t >= last or (width == 1 and choice.narrow is not None)
            any_done = narrow = False
            if read:
                any_done, narrow = self._catch_up(finished, pending, gone, choice.narrow, given)
                pending = []
            keep = choice.keep[:, :1] if narrow else choice.keep
            new_scores = choice.scores.gather(1, keep)
            given.record(alive, new_scores, t)
            new_width = keep.size(1)
            rows = (choice.origin.gather(1, keep) + torch.arange(b, device=device)[:, None] * width).view(-1)
            # a candidate at -inf leads nowhere (a finished sentence's, or a beam wider than its live
            # candidates): its row is fed <pad>, which no decoder or rule counts, not what it drew
            new_tokens = choice.tokens.gather(1, keep).masked_fill(new_scores.eq(float("-inf")), PAD_ID).view(-1, 1)
            t += 1
            if any_done:
                self.device_reads += 1  # fill_holes reads gone
                still = fill_holes(gone)
                alive, new_scores, gone = alive[still], new_scores[still], gone[still]
                rows = rows.view(b, new_width)[still].view(-1)
                new_tokens = new_tokens.view(b, new_width)[still].view(-1, 1)
                if rows.numel():
                    state = state.reorder(rows)
            elif rows.numel():
                state = state.reorder(rows, same_sources=new_width == width)
            seqs = torch.cat([seqs.index_select(0, rows), new_tokens], dim=1)
            last_tokens = new_tokens.view(-1)
            rules.advance(rows, last_tokens)
            scores, width = new_scores, new_width
        return [sorted(h, key=lambda x: -x.score)[: self.n_best] for h in finished]

    def _catch_up(
        self,
        finished: list[list[Hypothesis]],
        pending: list[_Ended],
        gone: torch.Tensor,
        narrow: Optional[torch.Tensor],
        given: "_Given",
    ) -> tuple[bool, bool]:
        """The loop's device read, in one transfer: which ``pending`` steps had candidates end (they
        are collected now, together), whether a sentence is ``gone`` (done), and whether the beam may
        ``narrow`` (None: the strategy never narrows)."""
        flags = [p.ends.any() for p in pending] + [gone.any()] + ([narrow] if narrow is not None else [])
        values = self._read(torch.stack(flags))
        ended = [p for p, any_ended in zip(pending, values) if any_ended]
        if ended:
            self._collect(finished, ended, given)
        n = len(pending)
        return values[n], narrow is not None and values[n + 1]

    def _collect(self, finished: list[list[Hypothesis]], steps: list[_Ended], given: "_Given") -> None:
        """Record the candidates of ``steps`` that end in <eos> as finished hypotheses, in step order
        (length counts <eos>; a forced prefix counts neither in the length nor in the
        log-probability). The steps since a read share their sentences and width (the loop drops
        sentences and narrows only at reads), so their tensors stack: three device reads for all
        (where the ended candidates are, their tokens, their sentences and scores)."""

        def stack(xs: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack(xs) if len(xs) > 1 else xs[0][None]

        width, alive = steps[0].width, steps[0].alive
        at, row, j = stack([p.ends for p in steps]).nonzero().unbind(1)  # [E] each: step, sentence, column
        src_row = row * width + stack([p.choice.origin for p in steps])[at, row, j]
        sentence = alive[row]
        scores = stack([p.choice.scores for p in steps])[at, row, j].double()
        t = torch.tensor([float(p.t) for p in steps], dtype=torch.float64, device=scores.device)[at]
        numbers = torch.stack([sentence.double(), scores, given.log_probs_of(sentence), t], 1)
        longest = steps[-1].seqs.size(1)  # the last step's rows hold the most tokens
        seqs = stack([_pad_to(p.seqs, longest) for p in steps])
        tokens = self._read(seqs[at, src_row, 1:])  # each hypothesis' tokens, then <pad> to the longest
        numbers = self._read(numbers)
        lengths = torch.tensor([t + 1 - given.length(int(sent)) for sent, _, _, t in numbers])
        penalties = self.penalty(lengths).tolist()  # a host tensor: elementwise, as one length at a time
        for (sent, score, before, t), toks, penalty in zip(numbers, tokens, penalties):
            log_prob = score - before
            finished[int(sent)].append(Hypothesis(toks[: int(t)], log_prob / penalty, log_prob))


def _pad_to(seqs: torch.Tensor, length: int) -> torch.Tensor:
    """``seqs`` [rows, T] padded with ``<pad>`` to ``length`` columns (itself when it has them)."""
    return seqs if seqs.size(1) == length else torch.nn.functional.pad(seqs, (0, length - seqs.size(1)), value=PAD_ID)


class _Given:
    """The forced prefix of each batch row: its length and, once forced, its log-probability, so
    finished hypotheses report what the search chose after it."""

    def __init__(self, prefix: Optional[torch.Tensor], rows: int, device: torch.device) -> None:
        self.lengths = None if prefix is None else prefix.ne(PAD_ID).sum(1).to(device)  # [B]
        self.host_lengths = None if self.lengths is None else self.lengths.tolist()  # read once per search
        self.log_probs = torch.zeros(rows, device=device)

    def record(self, alive: torch.Tensor, scores: torch.Tensor, t: int) -> None:
        """After step ``t``: the rows whose prefix ended there keep their cumulative score (the
        prefix is forced, so their best live candidate holds it). Written on the device, unread."""
        if self.lengths is None:
            return
        ended = self.lengths[alive].eq(t + 1)
        kept = self.log_probs[alive]
        self.log_probs[alive] = torch.where(ended, scores[:, 0].to(kept.dtype), kept)

    def log_probs_of(self, rows: torch.Tensor) -> torch.Tensor:
        """[n] the forced prefixes' log-probabilities of batch rows ``rows`` (float64; 0 without prefix)."""
        return self.log_probs.index_select(0, rows).double()

    def length(self, row: int) -> int:
        return 0 if self.host_lengths is None else self.host_lengths[row]


@SEARCHES.register("beam", TranslateConfig)
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
        read_every: int = 0,
        compile: str = "off",
    ):
        if n_best > beam:
            raise ValueError(f"n_best ({n_best}) cannot exceed the beam size ({beam})")
        super().__init__(n_best, penalty, max_len_ratio, max_len_add, max_length, read_every, compile)
        self.beam = beam

    @classmethod
    def from_options(cls, opt: TranslateConfig, penalty: LengthPenalty) -> "BeamSearch":
        """See :meth:`Search.from_options`: ``beam``, ``n_best``."""
        return cls(opt.beam, opt.n_best, penalty, **_loop_options(opt))

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
        narrow = ~top_scores.gather(1, keep[:, 1:]).isfinite().any()  # one live candidate per sentence
        ends = is_eos & rank.lt(k)
        return Choice(top_scores, origin, tokens, ends, keep, narrow)


@SEARCHES.register("greedy", TranslateConfig)
class GreedySearch(Search):
    """The best continuation of each sentence; the same output as beam 1, with less work."""

    def __init__(
        self,
        penalty: LengthPenalty = GNMTPenalty(1.0),
        max_len_ratio: float = 1.5,
        max_len_add: int = 10,
        max_length: int = 250,
        read_every: int = 0,
        compile: str = "off",
    ):
        super().__init__(1, penalty, max_len_ratio, max_len_add, max_length, read_every, compile)

    @classmethod
    def from_options(cls, opt: TranslateConfig, penalty: LengthPenalty) -> "GreedySearch":
        """See :meth:`Search.from_options`: one hypothesis."""
        return cls(penalty, **_loop_options(opt))

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


@SEARCHES.register("sampling", TranslateConfig)
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
    generator is never used. It reads the device every step (``translate.read_every`` does not
    apply): a finished row kept in the batch would draw, and change the later draws."""

    reads_every_step = True

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
        read_every: int = 0,
        compile: str = "off",
    ):
        super().__init__(n_best, penalty, max_len_ratio, max_len_add, max_length, read_every, compile)
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.generator: torch.Generator | None = None

    @classmethod
    def from_options(cls, opt: TranslateConfig, penalty: LengthPenalty) -> "SamplingSearch":
        """See :meth:`Search.from_options`: ``temperature``, ``top_k``, ``top_p``, ``seed``, ``n_best``."""
        return cls(opt.temperature, opt.top_k, opt.top_p, opt.seed, opt.n_best, penalty, **_loop_options(opt))

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


def strategy_name(opt: TranslateConfig) -> str:
    """The registered strategy a ``translate`` section runs: its ``strategy``, except that beam
    search with ``beam: 1`` runs ``greedy`` (the same output with less work)."""
    return "greedy" if opt.strategy == "beam" and opt.beam == 1 else opt.strategy


def build_search(opt: TranslateConfig) -> Search:
    """The search the ``translate`` section asks for (:func:`strategy_name`, from the
    :data:`SEARCHES` registry; an unknown one is a ConfigError with the closest name). Checks the
    section first (options changed after loading, e.g. by command-line flags, are checked too)."""
    opt.validate("translate", None)
    penalty = build_length_penalty(opt.length_penalty_type, opt.length_penalty)
    return SEARCHES.get(strategy_name(opt), "translate.strategy").cls.from_options(opt, penalty)
