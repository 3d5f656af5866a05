"""G-Transformer encoder (Bao et al., 2021, sec. 4): group self-attention (tags x/x) on every layer,
combined group + global attention on the top ``global_layers`` layers (or, ``top_attention:
global``, global attention alone there: the ablation of table 6).

Parameter names follow the Transformer encoder (``layers.N.self_attn`` is the group attention), so a
sentence-level Transformer checkpoint initialises it through ``train.init_from``; the global
attention and the gates are new.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
from torch import nn

from onmt_doc.config import Config
from onmt_doc.config.options import check_top_layers, option
from onmt_doc.contracts import Batch, EncoderOut, PartContext
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.encoders.base import REGISTRY, Encoder
from onmt_doc.encoders.transformer import TransformerEncoderConfig, TransformerEncoderLayer
from onmt_doc.modules.attention import MultiHeadAttention
from onmt_doc.modules.group_attention import (
    COMBINED,
    ENC_SELF,
    GLOBAL,
    GROUP,
    Plan,
    attention_modes,
    group_attend,
    prepared_plan,
    self_plan,
)
from onmt_doc.modules.local_global_gate import GateSum
from onmt_doc.modules.varlen_attention import plan_self_segments


@dataclass
class GTransformerEncoderConfig(TransformerEncoderConfig):
    """``model.encoder`` keys of ``type: g_transformer``; adds group/global attention switches to the
    Transformer encoder's keys."""

    heads: int = option(8, "attention heads (group and global); must divide `model.d_model`", minimum=1)
    group_attention: bool = option(
        True,
        "`false` = the document-Transformer baseline: every layer attends over "
        "the whole instance, no gates (`global_layers` then has no effect); with the "
        "decoder's `group_self_attention: false` it removes the paper's language "
        "locality (table 5)",
    )
    global_layers: int = option(
        2,
        "top layers with combined (group + global) attention; between 0 and "
        '`layers`; `0` = the paper\'s "only group attention" (table 6)',
    )
    top_attention: Literal["combined", "global"] = option(
        "combined",
        "what the top `global_layers` layers use: group + global attention gate-summed (eq. 10), or "
        'global attention alone, no group attention and no gate (table 6, "only global attention")',
    )

    def validate(self, path: str, root: Config) -> None:
        """The combined-attention layers are the top of the stack, so at most ``layers`` of them."""
        super().validate(path, root)
        check_top_layers(self, "global_layers", path)


class GTransformerEncoderLayer(TransformerEncoderLayer):
    """A Transformer encoder layer whose self-attention is group, global or combined (``mode``)."""

    def __init__(
        self, d_model: int, heads: int, ff: int, dropout: float, attention_dropout: float, pre_norm: bool, mode: str
    ) -> None:
        """``mode`` is one of :func:`~onmt_doc.modules.group_attention.attention_modes`' values; only
        ``combined`` adds the global attention and the gate (eq. 10)."""
        super().__init__(d_model, heads, ff, dropout, attention_dropout, pre_norm)
        self.mode = mode  # group / global / combined (attention_modes)
        combined = mode == COMBINED
        self.global_attn = MultiHeadAttention(d_model, heads, attention_dropout) if combined else None
        self.gate = GateSum(d_model, "enc_self") if combined else None

    def forward(self, x: torch.Tensor, plan: Optional[Plan], keep: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` [B, N, D] -> [B, N, D]; ``plan`` is None only when no layer uses group attention."""
        x = self.attn_res(x, lambda h: self.attention(h, plan, keep, mask))
        return self.ff_res(x, self.ff)

    def attention(self, h: torch.Tensor, plan: Optional[Plan], keep: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The layer's self-attention of ``h`` [B, N, D]: eq. 8 (group), eq. 5 (global) or their gate-sum
        (eq. 10); ``keep`` [B, N] True on real tokens, ``mask`` [B, 1, 1, N] the global keep-mask."""
        if self.mode == GLOBAL:  # eq. 5 over the whole instance
            return self.self_attn(h, mask, probe=("enc_self_global", keep))
        attn = self.self_attn
        local = attn.merge(
            group_attend(plan, *attn.project_qkv(h), attn.dropout if self.training else 0.0, probe="enc_self_group")
        )  # eq. 8
        if self.mode == GROUP:
            return local
        return self.gate(local, self.global_attn(h, mask, probe=("enc_self_global", keep)), keep)


@REGISTRY.register("g_transformer", GTransformerEncoderConfig)
class GTransformerEncoder(Encoder):
    """The G-Transformer encoder over a whole document instance (``unit = "document"``)."""

    unit = "document"

    def __init__(self, cfg: GTransformerEncoderConfig, ctx: PartContext) -> None:
        """Builds one layer per :func:`attention_modes` entry; embeddings shared with the model."""
        super().__init__()
        modes = attention_modes(cfg.layers, cfg.group_attention, cfg.global_layers, cfg.top_attention)
        self.group = any(m != GLOBAL for m in modes)  # some layer needs the block plan
        self.embeddings = ctx.src_embeddings
        self.layers = nn.ModuleList(
            GTransformerEncoderLayer(
                ctx.d_model, cfg.heads, cfg.ff, ctx.dropout, ctx.attention_dropout, cfg.pre_norm, mode
            )
            for mode in modes
        )
        self.final_norm = nn.LayerNorm(ctx.d_model) if cfg.pre_norm else nn.Identity()

    def host_plans(self, batch: Batch) -> dict[str, Any]:
        """The sentence offsets of the group self-attention (fused path), from the host batch."""
        if not self.group:
            return {}
        return {ENC_SELF: plan_self_segments(batch.src_groups, batch.src.ne(PAD_ID), causal=False)}

    def forward(self, batch: Batch) -> EncoderOut:
        """``batch.src`` [B, N] with sentence tags ``batch.src_groups`` [B, N] -> memory [B, N, D]."""
        pad = batch.src.eq(PAD_ID)
        keep = ~pad
        plan = prepared_plan(batch.plans, ENC_SELF) if self.group else None
        if self.group and plan is None:
            host = (batch.host.src_groups, batch.host.src.ne(PAD_ID)) if batch.host is not None else None
            plan = self_plan(batch.src_groups, keep, causal=False, host=host)
        mask = keep[:, None, None, :]
        x = self.embeddings(batch.src)
        for layer in self.layers:
            x = layer(x, plan, keep, mask)
        return EncoderOut(self.final_norm(x), pad, batch.src_groups)
