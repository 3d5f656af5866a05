"""The interfaces encoders and decoders share: what every part receives besides its own config
section (``PartContext``) and what an encoder hands to a decoder (``EncoderOut``), so decoders never
import the encoders package."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from onmt_doc.modules.embeddings import Embeddings


@dataclass
class PartContext:
    """What every part's constructor receives besides its own config section: the model-wide
    sizes and dropouts, and the embeddings (shared, so encoder, decoder and generator can tie them)."""

    d_model: int
    dropout: float
    attention_dropout: float
    src_embeddings: Embeddings
    tgt_embeddings: Embeddings


@dataclass
class EncoderOut:
    """What an encoder hands to a decoder: ``memory`` [B, S, D], ``pad_mask`` [B, S] True on
    padding, the source sentence tags of document models, and ``extra`` (the keys the encoder
    ``provides`` and the decoder ``needs``)."""

    memory: torch.Tensor  # [B, S, D]
    pad_mask: torch.Tensor  # [B, S] True on padding
    groups: Optional[torch.Tensor] = None  # [B, S] sentence tags (document models)
    extra: dict = field(default_factory=dict)

    def attention_mask(self) -> torch.Tensor:
        """[B, 1, 1, S] keep-mask for attention over the memory."""
        return (~self.pad_mask)[:, None, None, :]
