"""The encoder interface."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch
from torch import nn

from onmt_doc.data.batching import Batch


@dataclass
class EncoderOut:
    memory: torch.Tensor                    # [B, S, D]
    pad_mask: torch.Tensor                  # [B, S] True on padding
    groups: Optional[torch.Tensor] = None   # [B, S] sentence tags (document models)
    extra: dict = field(default_factory=dict)

    def attention_mask(self) -> torch.Tensor:
        """[B, 1, 1, S] keep-mask for attention over the memory."""
        return (~self.pad_mask)[:, None, None, :]


class Encoder(nn.Module):
    """``forward(batch) -> EncoderOut``. ``unit`` says which instances the encoder needs."""

    unit: ClassVar[str] = "sentence"
    provides: ClassVar[tuple[str, ...]] = ()   # EncoderOut.extra keys it fills for decoders

    def forward(self, batch: Batch) -> EncoderOut:  # pragma: no cover - interface
        raise NotImplementedError
