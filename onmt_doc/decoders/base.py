"""The decoder interface: teacher-forced ``forward`` for training, ``init_state``/``step`` for
incremental decoding. A stepwise decode must give the same outputs as ``forward`` (tested for
every decoder)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch
from torch import nn

from onmt_doc.data.batching import Batch
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.encoders.base import EncoderOut
from onmt_doc.modules.state import DecoderState


@dataclass
class DecoderOut:
    hidden: torch.Tensor                      # [B, T, D], fed to the generator
    # what losses and analysis read (gates, attention); aux["stats"] holds per-token sums that
    # validation reports, keys "group/name" (TensorBoard valid/group/name, divided by target tokens)
    aux: dict = field(default_factory=dict)


@dataclass(frozen=True)
class LengthLimit:
    """Output length cap ``ratio × source length + add`` (of a sentence, or of each sentence of a
    document for document decoders)."""
    ratio: float = 1.5
    add: int = 10

    def __call__(self, src_len: torch.Tensor) -> torch.Tensor:
        return (src_len.float() * self.ratio).long() + self.add


def force_tokens(log_probs: torch.Tensor, force: torch.Tensor) -> torch.Tensor:
    """Rows with ``force`` ≥ 0 may only continue with that token, which keeps its model score
    (so hypothesis scores stay the model's log-probabilities); rows with -1 are unchanged."""
    index = force.clamp(min=0)[:, None]
    only = torch.full_like(log_probs, float("-inf")).scatter_(1, index, log_probs.gather(1, index))
    return torch.where(force.ge(0)[:, None], only, log_probs)


class Decoder(nn.Module):
    unit: ClassVar[str] = "sentence"
    needs: ClassVar[tuple[str, ...]] = ()      # EncoderOut.extra keys it reads (checked when building)

    def max_output_lengths(self, batch: Batch, limit: LengthLimit) -> torch.Tensor:
        """[B] most tokens beam search may generate per row (the final <eos> forced at the cap)."""
        return limit(batch.src.ne(PAD_ID).sum(1))

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:  # pragma: no cover
        raise NotImplementedError

    def init_state(self, enc_out: EncoderOut, batch: Batch,
                   limit: Optional[LengthLimit] = None) -> DecoderState:  # pragma: no cover
        """The state before the first step; ``limit`` is for decoders that cap parts of the output."""
        raise NotImplementedError

    def step(self, tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:  # pragma: no cover
        """Hidden state [B, D] for the next tokens [B], and the updated state."""
        raise NotImplementedError

    def constrain(self, log_probs: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """Restrict the next token during search (e.g. document structure); default: no rule."""
        return log_probs
