"""The decoder interface: teacher-forced ``forward`` for training, ``init_state``/``step`` for
incremental decoding. A stepwise decode must give the same outputs as ``forward`` (tested for
every decoder)."""

from __future__ import annotations

from typing import ClassVar, Optional

import torch
from torch import nn

from onmt_doc.contracts import Batch, DecoderOut, DecoderState, EncoderOut, LengthLimit
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, MASK_ID, PAD_ID, SOS_ID, SPECIALS, UNK_ID
from onmt_doc.registry import Registry

# never generated: padding, a second <bos>, the word-dropout mask
_NEVER = (PAD_ID, BOS_ID, MASK_ID)


# the decoders by YAML name; each decoder module registers itself here, and the package's
# __init__ imports them all (registry_for("decoder") reads it there)
REGISTRY = Registry("decoder")


def is_word(tokens: torch.Tensor) -> torch.Tensor:
    """Tokens that are text (every non-special token, and <unk>)."""
    return tokens.ge(len(SPECIALS)) | tokens.eq(UNK_ID)


def forbid_empty(log_probs: torch.Tensor, last: torch.Tensor, words: torch.Tensor, markup: bool = True) -> torch.Tensor:
    """The rule every decoder's search obeys, so a non-empty source line never gives an empty
    output line: ``</s>`` and ``<eos>`` are forbidden while the current sentence (since its
    ``<s>``, or since ``<bos>``) has no word; ``<s>`` may only follow ``<bos>`` or ``</s>``;
    padding, ``<bos>`` and ``<mask>`` are never generated. ``last`` [rows]: each row's last token;
    ``words`` [rows]: words in its current sentence (:func:`count_words`). ``markup`` false
    (``data.sentence_markup``): ``<s>`` and ``</s>`` are never generated either, so the output is
    ``w1 … wn <eos>`` with n ≥ 1."""
    inf = float("-inf")
    never = _NEVER if markup else (*_NEVER, SOS_ID, EOS_SENT_ID)
    lp = log_probs.index_fill(1, torch.tensor(never, device=log_probs.device), inf)
    lp[:, SOS_ID] = lp[:, SOS_ID].masked_fill(~(last.eq(BOS_ID) | last.eq(EOS_SENT_ID)), inf)
    empty = words.eq(0)
    lp[:, EOS_SENT_ID] = lp[:, EOS_SENT_ID].masked_fill(empty, inf)
    lp[:, EOS_ID] = lp[:, EOS_ID].masked_fill(empty, inf)
    return lp


def count_words(words: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Words in each row's current sentence after emitting ``tokens``: <s> starts a sentence."""
    return torch.where(tokens.eq(SOS_ID), 0, words + is_word(tokens).long())


def force_tokens(log_probs: torch.Tensor, force: torch.Tensor) -> torch.Tensor:
    """Rows with ``force`` ≥ 0 may only continue with that token, which keeps its model score
    (so hypothesis scores stay the model's log-probabilities); rows with -1 are unchanged."""
    index = force.clamp(min=0)[:, None]
    only = torch.full_like(log_probs, float("-inf")).scatter_(1, index, log_probs.gather(1, index))
    return torch.where(force.ge(0)[:, None], only, log_probs)


class Decoder(nn.Module):
    """Base of every decoder: teacher-forced :meth:`forward` for training, :meth:`init_state` and
    :meth:`step` for search, which must give the same outputs.

    ``unit``: the instances it decodes (``sentence``, ``document``, ``context``); ``needs``: the
    :class:`EncoderOut` ``extra`` keys it reads, checked against the encoder's ``provides`` when the
    model is built.
    """

    unit: ClassVar[str] = "sentence"
    needs: ClassVar[tuple[str, ...]] = ()  # EncoderOut.extra keys it reads (checked when building)

    def max_output_lengths(self, batch: Batch, limit: LengthLimit) -> torch.Tensor:
        """[B] most tokens beam search may generate per row (the final <eos> forced at the cap);
        at least 3, room for ``<s> word </s>``."""
        return limit(batch.src.ne(PAD_ID).sum(1)).clamp(min=3)

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:  # pragma: no cover
        """Teacher-forced pass: ``tgt_in`` [B, T] (the target shifted right) -> ``hidden`` [B, T, D]."""
        raise NotImplementedError

    def init_state(
        self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None
    ) -> DecoderState:  # pragma: no cover
        """The state before the first step; ``limit`` is for decoders that cap parts of the output."""
        raise NotImplementedError

    def step(self, tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:  # pragma: no cover
        """Hidden state [B, D] for the next tokens [B], and the updated state."""
        raise NotImplementedError

    def constrain(self, log_probs: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """Restrict the next token during search (e.g. document structure); default: no rule.
        Beam search applies :func:`forbid_empty` to every decoder after this."""
        return log_probs
