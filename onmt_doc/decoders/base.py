"""The decoder interface: teacher-forced ``forward`` for training, ``init_state``/``step`` for
incremental decoding. A stepwise decode must give the same outputs as ``forward`` (tested for
every decoder)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from onmt_doc.data.batching import Batch
from onmt_doc.encoders.base import EncoderOut
from onmt_doc.modules.state import DecoderState


@dataclass
class DecoderOut:
    hidden: torch.Tensor                      # [B, T, D], fed to the generator
    # what losses and analysis read (gates, attention); aux["stats"] holds per-token sums that
    # validation reports, keys "group/name" (TensorBoard valid/group/name, divided by target tokens)
    aux: dict = field(default_factory=dict)


class Decoder(nn.Module):
    unit: ClassVar[str] = "sentence"

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:  # pragma: no cover
        raise NotImplementedError

    def init_state(self, enc_out: EncoderOut, batch: Batch) -> DecoderState:  # pragma: no cover
        raise NotImplementedError

    def step(self, tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:  # pragma: no cover
        """Hidden state [B, D] for the next tokens [B], and the updated state."""
        raise NotImplementedError

    def constrain(self, log_probs: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """Restrict the next token during search (e.g. document structure); default: no rule."""
        return log_probs
