"""The decoding rules: what the search forbids or forces at each step, one small object per rule.

At every step the search has the next-token log-probabilities ``[rows, V]`` of its live rows. The
decoder's own :meth:`~onmt_doc.decoders.base.Decoder.constrain` restricts them first (a document
decoder's structure), then the rules below, before the strategy picks continuations:

- :class:`SentenceMarkup`: a row's output is marked sentences, ``<s> w1 … wn </s> <eos>``:
  ``<s>`` after ``<bos>``, ``<eos>`` after ``</s>`` and nowhere else (every unit whose rows the search frames, i.e.
  all but ``document``, whose decoder frames its own; not without ``data.sentence_markup``);
- :class:`SentenceCount` (``k_to_k``): as many sentences as the row's source: ``<s>`` after
  ``</s>`` while sentences are to go, no ``<eos>`` before the last one;
- :class:`ForbiddenTokens` (every search): ``<pad>``, ``<bos>``, ``<mask>`` never; ``<s>`` only
  after ``<bos>`` or ``</s>``; ``</s>`` and ``<eos>`` not before the current sentence has a word,
  so a non-empty source line never gives an empty output line; without markup ``<s>`` and
  ``</s>`` never (the output is ``w1 … wn <eos>``, n ≥ 1);
- :class:`TargetPrefix` (``k_to_k`` with ``translate.force_context_prefix``): the given target
  prefix, token by token;
- :class:`LengthCap` (every search): ``<eos>`` at the row's length cap.

How they combine (:func:`apply_rules`): every rule's forbidden tokens are set to -inf in turn; a
rule may also force a row's next token, and a later rule's forced token replaces an earlier one's.
The order of the list is therefore the rules' priority: the unit's sentence rules, the forbidden
tokens, the prefix (which wins over the sentence rules), the cap last (which wins over
everything). A forced row may continue with its token only, at the score the model (after
``constrain``) gives it, whatever the other rules forbid and even at -inf: a hypothesis' score is
always the model's log-probability of its tokens (:func:`~onmt_doc.decoders.base.force_tokens`,
which lives with the decoders because their ``constrain`` forces tokens the same way).

A rule with per-row state (the words of the current sentence, the sentences closed) follows the
search's rows in :meth:`Rule.advance`. As in fairseq's constraint strategies and Sockeye's step
modules, each rule is a small object tested on its own (``tests/test_search_rules.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from onmt_doc import devices
from onmt_doc.contracts import Batch
from onmt_doc.data.instances import unit_class
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, MASK_ID, PAD_ID, SOS_ID, SPECIALS, UNK_ID
from onmt_doc.decoders.base import force_tokens
from onmt_doc.errors import ConfigError

NEG_INF = float("-inf")
# never generated: padding, a second <bos>, the word-dropout mask
NEVER = (PAD_ID, BOS_ID, MASK_ID)


def is_word(tokens: torch.Tensor) -> torch.Tensor:
    """Tokens that are text (every non-special token, and <unk>)."""
    return tokens.ge(len(SPECIALS)) | tokens.eq(UNK_ID)


def count_words(words: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Words in each row's current sentence after emitting ``tokens``: <s> starts a sentence."""
    return torch.where(tokens.eq(SOS_ID), 0, words + is_word(tokens).long())


@dataclass
class Step:
    """What the rules read at one search step, per live row."""

    t: int  # tokens generated after <bos> so far: the next one is output position t
    last: torch.Tensor  # [rows] each row's last token (<bos> at t = 0)
    origin: torch.Tensor  # [rows] the batch row (the source) each live row continues


class Rule:
    """One decoding rule: the tokens it forces (:meth:`forced`) and forbids (:meth:`forbid`) at a
    step. Forcing and forbidding are separate hooks because they combine differently: forbidden
    tokens add up, while one forced token per row wins (:func:`apply_rules`)."""

    def forced(self, step: Step) -> Optional[torch.Tensor]:
        """[rows] the token each row must emit next, -1 where the rule leaves it free; None when the
        rule forces nothing at this step."""
        return None

    def forbid(self, log_probs: torch.Tensor, step: Step) -> None:
        """Set what the rule forbids to -inf in ``log_probs`` [rows, V], in place (:func:`apply_rules`
        hands the rules one copy of the scores: the model's stay for the forced tokens)."""

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """After a step, for rules with per-row state: the live rows are now this step's ``rows``
        [n] (beams reordered, widened or pruned, as the decoding state), each extended by
        ``tokens`` [n]."""


def _free(like: torch.Tensor) -> torch.Tensor:
    """No row forced: -1 per row."""
    return torch.full_like(like, -1)


class SentenceMarkup(Rule):
    """Each row's output is ``<s> … </s>`` then ``<eos>``: ``<s>`` forced after ``<bos>`` and
    ``<eos>`` after ``</s>`` (one sentence; :class:`SentenceCount`, later in the list, turns that
    ``<eos>`` into the next ``<s>`` while a ``k_to_k`` row has sentences to go), and ``<eos>``
    nowhere else: a sentence is closed by ``</s>``, so a hypothesis is scored on the tokens
    forced decoding scores (``<s> w1 … wn </s> <eos>``), not on a shorter ``<s> w1 … wn <eos>``."""

    def forced(self, step: Step) -> torch.Tensor:
        """See :meth:`Rule.forced`."""
        last = step.last
        return torch.where(last.eq(BOS_ID), SOS_ID, torch.where(last.eq(EOS_SENT_ID), EOS_ID, _free(last)))

    def forbid(self, log_probs: torch.Tensor, step: Step) -> None:
        """See :meth:`Rule.forbid`: no ``<eos>`` but where it is forced (after ``</s>``, at the cap)."""
        log_probs[:, EOS_ID] = NEG_INF


class SentenceCount(Rule):
    """A row's output holds as many sentences as its source (``k_to_k``): after ``</s>``, ``<s>``
    while sentences are to go; ``<eos>`` forbidden while sentences besides the current one are."""

    def __init__(self, sentences: torch.Tensor):
        """``sentences`` [B]: the source sentences of each batch row (its ``<s>`` tokens)."""
        self.sentences = sentences
        self.closed = torch.zeros_like(sentences)  # [rows] sentences each live row has closed (</s>)

    def _left(self, step: Step) -> torch.Tensor:
        """[rows] sentences not closed yet, the current one included."""
        return self.sentences[step.origin] - self.closed

    def forced(self, step: Step) -> torch.Tensor:
        """See :meth:`Rule.forced`."""
        to_go = step.last.eq(EOS_SENT_ID) & self._left(step).gt(0)
        return torch.where(to_go, SOS_ID, _free(step.last))

    def forbid(self, log_probs: torch.Tensor, step: Step) -> None:
        """See :meth:`Rule.forbid`."""
        log_probs[:, EOS_ID].masked_fill_(self._left(step).gt(1), NEG_INF)

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """See :meth:`Rule.advance`."""
        self.closed = self.closed.index_select(0, rows) + tokens.eq(EOS_SENT_ID).long()


class ForbiddenTokens(Rule):
    """What no search may generate: ``<pad>``, ``<bos>`` and ``<mask>``; ``<s>`` but after ``<bos>``
    or ``</s>``; ``</s>`` and ``<eos>`` while the current sentence (since its ``<s>``, or since
    ``<bos>``) has no word, so a non-empty source line never gives an empty output line. Without
    markup (``data.sentence_markup: false``) ``<s>`` and ``</s>`` are never generated either: the
    output is ``w1 … wn <eos>`` with n ≥ 1."""

    def __init__(self, rows: int, device: torch.device, markup: bool = True):
        """``rows``: the live rows at the first step (one per batch row)."""
        # made once: a tensor made from a list at every step is, on a GPU, a blocking copy from host memory
        self.never = torch.tensor(NEVER if markup else (*NEVER, SOS_ID, EOS_SENT_ID), device=device)
        self.words = torch.zeros(rows, dtype=torch.long, device=device)  # [rows] words in the current sentence

    def forbid(self, log_probs: torch.Tensor, step: Step) -> None:
        """See :meth:`Rule.forbid`."""
        log_probs.index_fill_(1, self.never, NEG_INF)
        log_probs[:, SOS_ID].masked_fill_(~(step.last.eq(BOS_ID) | step.last.eq(EOS_SENT_ID)), NEG_INF)
        empty = self.words.eq(0)
        log_probs[:, EOS_SENT_ID].masked_fill_(empty, NEG_INF)
        log_probs[:, EOS_ID].masked_fill_(empty, NEG_INF)

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """See :meth:`Rule.advance`."""
        self.words = count_words(self.words.index_select(0, rows), tokens)


class TargetPrefix(Rule):
    """Target tokens forced after ``<bos>``, row by row (``k_to_k``'s previous translations with
    ``translate.force_context_prefix``); a row's hypotheses start with its prefix."""

    def __init__(self, prefix: torch.Tensor):
        """``prefix`` [B, P]: each batch row's prefix, padded with ``<pad>``."""
        self.prefix = prefix
        self.lengths = prefix.ne(PAD_ID).sum(1)  # [B]

    def forced(self, step: Step) -> Optional[torch.Tensor]:
        """See :meth:`Rule.forced`."""
        if step.t >= self.prefix.size(1):  # every row is past its prefix
            return None
        return torch.where(self.lengths[step.origin].gt(step.t), self.prefix[step.origin, step.t], -1)


class LengthCap(Rule):
    """``<eos>`` forced once a row has generated its cap of tokens; the search stops a sentence there."""

    def __init__(self, caps: torch.Tensor):
        """``caps`` [B]: most tokens each batch row may generate before its ``<eos>``."""
        self.caps = caps

    def reached(self, sentences: torch.Tensor, t: int) -> torch.Tensor:
        """[n] whether the batch rows ``sentences`` [n] are at their cap after ``t`` tokens."""
        return self.caps[sentences].le(t)

    def forced(self, step: Step) -> torch.Tensor:
        """See :meth:`Rule.forced`."""
        return torch.where(self.reached(step.origin, step.t), EOS_ID, _free(step.origin))


def apply_rules(rules: Sequence[Rule], log_probs: torch.Tensor, step: Step) -> torch.Tensor:
    """``log_probs`` [rows, V] (the model's, after ``Decoder.constrain``) with every rule applied:
    what any rule forbids at -inf; a row some rule forces may only continue with the last such
    rule's token, at its score in ``log_probs``."""
    allowed, force = log_probs.clone(), None
    for rule in rules:
        rule.forbid(allowed, step)
        token = rule.forced(step)
        if token is not None:
            force = token if force is None else torch.where(token.ge(0), token, force)
    # the packed (CPU) path skips the forcing when a step forces nothing; on a GPU asking costs a device read
    if force is None or (not devices.fused(force.device) and not force.ge(0).any()):
        return allowed
    return force_tokens(log_probs, force, out=allowed)


class SearchRules:
    """The rules of one search over one batch, in the order they apply, the length cap last; the
    search asks the cap when a sentence is done (:meth:`LengthCap.reached`)."""

    def __init__(self, rules: Sequence[Rule], cap: LengthCap):
        self.rules, self.cap = [*rules, cap], cap

    def apply(self, log_probs: torch.Tensor, step: Step) -> torch.Tensor:
        """See :func:`apply_rules`."""
        return apply_rules(self.rules, log_probs, step)

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """See :meth:`Rule.advance`."""
        for rule in self.rules:
            rule.advance(rows, tokens)


def search_rules(
    unit: str, batch: Batch, caps: torch.Tensor, prefix: Optional[torch.Tensor] = None, markup: bool = True
) -> SearchRules:
    """The rules a search over ``batch`` obeys, as the model's ``unit`` asks for them
    (``onmt_doc/data/instances.py``: units say what their rows' outputs are, this builds the rules).
    ``caps`` [B]: each row's length cap (``Decoder.max_output_lengths``), which grows by the row's
    ``prefix`` length; ``markup``: the model's ``data.sentence_markup`` (false for the ``sentence``
    unit only: bare sentences)."""
    kind = unit_class(unit)
    if not markup and not kind.markup_optional():
        raise ConfigError(f"sentences without markup are for the sentence unit only, not {unit}")
    rules: list[Rule] = []
    if markup and kind.search_marks_sentences():
        rules.append(SentenceMarkup())
    if kind.counts_source_sentences():
        rules.append(SentenceCount(batch.src.eq(SOS_ID).sum(1)))
    rules.append(ForbiddenTokens(batch.size, batch.src.device, markup))
    if prefix is not None:
        forced_prefix = TargetPrefix(prefix.to(caps.device))
        rules.append(forced_prefix)
        caps = caps + forced_prefix.lengths
    return SearchRules(rules, LengthCap(caps))
