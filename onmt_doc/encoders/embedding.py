"""The ``embedding`` encoder: source token embeddings + positions, no layers. With the ``reformer``
decoder it makes Reformer-base (Li et al., 2020), whose joint representation starts from the raw
source embeddings (eq. 4)."""

from __future__ import annotations

from dataclasses import dataclass

from onmt_doc.config.options import PartConfig
from onmt_doc.contracts import Batch, EncoderOut, PartContext
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.encoders.base import REGISTRY, Encoder


@dataclass
class EmbeddingEncoderConfig(PartConfig):
    """No keys of its own: the embeddings come from ``model`` (d_model, dropout, share_embeddings)."""


@REGISTRY.register("embedding", EmbeddingEncoderConfig)
class EmbeddingEncoder(Encoder):
    """Source embeddings + positions as the memory: no layers, so a decoder builds its own source
    representation (Reformer-base)."""

    def __init__(self, cfg: EmbeddingEncoderConfig, ctx: PartContext) -> None:
        """Shares the model's source embeddings (``ctx.src_embeddings``); ``cfg`` has no keys."""
        super().__init__()
        self.embeddings = ctx.src_embeddings

    def forward(self, batch: Batch) -> EncoderOut:
        """``batch.src`` [B, S] -> embedded memory [B, S, D]."""
        return EncoderOut(self.embeddings(batch.src), batch.src.eq(PAD_ID), batch.src_groups)
