"""Transformer encoder (Vaswani et al., 2017), pre-norm by default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from onmt_doc.config import Config
from onmt_doc.config.options import PartConfig, check_heads, option
from onmt_doc.contracts import Batch, EncoderOut, PartContext
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.encoders.base import REGISTRY, Encoder
from onmt_doc.modules.attention import MultiHeadAttention, Probe
from onmt_doc.modules.feedforward import FeedForward
from onmt_doc.modules.sublayer import Residual


@dataclass
class TransformerEncoderConfig(PartConfig):
    """``model.encoder`` keys of ``type: transformer`` (help text in each field's ``option``)."""

    layers: int = option(6, "number of layers", minimum=0)
    heads: int = option(8, "attention heads; must divide `model.d_model`", minimum=1)
    ff: int = option(2048, "inner size of the feed-forward network", minimum=1)
    pre_norm: bool = option(
        True,
        "layer norm before each sublayer plus a final layer norm (`true`), or after "
        "each residual sum (`false`, the original post-norm)",
    )

    def validate(self, path: str, root: Config) -> None:
        """Every attention of the stack splits model.d_model into ``heads`` slices."""
        check_heads(self.heads, path, root)


class TransformerEncoderLayer(nn.Module):
    """One encoder layer: self-attention then feed-forward, each in a :class:`Residual` block."""

    def __init__(
        self, d_model: int, heads: int, ff: int, dropout: float, attention_dropout: float, pre_norm: bool
    ) -> None:
        """``attention_dropout`` applies to the attention probabilities, ``dropout`` to the residual branches."""
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, attention_dropout)
        self.ff = FeedForward(d_model, ff, dropout)
        self.attn_res = Residual(d_model, dropout, pre_norm)
        self.ff_res = Residual(d_model, dropout, pre_norm)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, probe: Optional[Probe] = None) -> torch.Tensor:
        """``x`` [B, S, D] -> [B, S, D]; ``mask`` [B, 1, 1, S] True on keys that may be attended;
        ``probe`` names the self-attention for analysis (``MultiHeadAttention.attend``)."""
        x = self.attn_res(x, lambda h: self.self_attn(h, mask, probe=probe))
        return self.ff_res(x, self.ff)


@REGISTRY.register("transformer", TransformerEncoderConfig)
class TransformerEncoder(Encoder):
    """The sentence-level Transformer encoder (Vaswani et al., 2017, sec. 3.1), pre-norm by default."""

    def __init__(self, cfg: TransformerEncoderConfig, ctx: PartContext) -> None:
        """Embeddings are shared with the model (``ctx.src_embeddings``), so they can be tied."""
        super().__init__()
        self.embeddings = ctx.src_embeddings
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(ctx.d_model, cfg.heads, cfg.ff, ctx.dropout, ctx.attention_dropout, cfg.pre_norm)
            for _ in range(cfg.layers)
        )
        self.final_norm = nn.LayerNorm(ctx.d_model) if cfg.pre_norm else nn.Identity()

    def forward(self, batch: Batch) -> EncoderOut:
        """``batch.src`` [B, S] -> memory [B, S, D] and pad mask [B, S] (True on padding)."""
        pad = batch.src.eq(PAD_ID)
        x = self.embeddings(batch.src)
        mask = (~pad)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return EncoderOut(self.final_norm(x), pad, batch.src_groups)
