"""Joint-representation Reformer (Li et al., 2020): a stack over the T×S×E joint representation
that produces one vector per target position.

Reformer-base is this decoder after the ``embedding`` encoder (source embeddings + positions);
Reformer-fast puts a Transformer encoder (the paper's PreNet) in front of it. Decoding computes
only the new 1×S×E row per step, through every layer, with the target-axis keys/values cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from onmt_doc.config import Config
from onmt_doc.config.options import PartConfig, check_heads, option
from onmt_doc.contracts import Batch, DecoderOut, DecoderState, EncoderOut, LengthLimit, PartContext
from onmt_doc.decoders.base import REGISTRY, Decoder
from onmt_doc.modules.attention import KV
from onmt_doc.modules.dropout import Dropout
from onmt_doc.modules.feedforward import FeedForward
from onmt_doc.modules.separable import (
    SOURCE_AXIS,
    TARGET_AXIS,
    Dropout1d,
    Dropout2d,
    JointResidual,
    Reduction,
    SourceAttention,
    TargetAttention,
)


@dataclass
class ReformerDecoderConfig(PartConfig):
    """``model.decoder`` keys of ``type: reformer`` (help text in each field's ``option``)."""

    layers: int = option(6, "number of Reformer layers (4 sublayers each)", minimum=0)
    heads: int = option(8, "attention heads of both separable attentions; must divide `model.d_model`", minimum=1)
    ff: int = option(2048, "inner size of the two feed-forward networks of a layer", minimum=1)
    shared_dropout: bool = option(
        True,
        "`model.dropout` as the paper's Dropout1d on attention outputs (noise "
        "shared along S after target attention, along T after source attention) and "
        "Dropout2d on FFN outputs (shared along S and T); `false` = elementwise dropout "
        "(the ablation). The FFNs have no inner dropout",
    )
    checkpoint_layers: bool = option(
        False,
        "gradient checkpointing per layer: keep only each layer's input for the "
        "backward pass and recompute the rest; activation memory of one layer instead "
        "of `layers`, at about one more forward pass",
    )

    def validate(self, path: str, root: Config) -> None:
        """Both separable attentions split model.d_model into ``heads`` slices."""
        check_heads(self.heads, path, root)


@dataclass
class ReformerState(DecoderState):
    """The source side of the joint input (computed once) and, per layer, the target-axis cache."""

    source_fields: ClassVar[tuple[str, ...]] = ("memory", "src_keep")
    owned_fields: ClassVar[tuple[str, ...]] = ("target_kv",)
    step: int
    memory: torch.Tensor  # [B, S, E] source side of the joint input
    src_keep: torch.Tensor  # [B, S] True on real source tokens
    target_kv: list[Optional[KV]]  # per layer, keys/values along T: [B, S, heads, t, d_head]


def joint_input(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """eq. 4: X[t, s] = source_s + target_t, [B, S, E] and [B, T, E] -> [B, T, S, E]. Both sides come
    from ``Embeddings`` (tokens × √E + sinusoidal positions) or, for the source, from the PreNet."""
    return target[:, :, None, :] + source[:, None, :, :]


class ReformerLayer(nn.Module):
    """Target attention (causal, along T), FFN, source attention (along S), FFN; each pre-norm with
    a residual (eq. 1)."""

    def __init__(
        self, d_model: int, heads: int, ff: int, dropout: float, attention_dropout: float, shared_dropout: bool
    ) -> None:
        """``shared_dropout``: the paper's Dropout1d/2d on the residual branches instead of elementwise dropout."""
        super().__init__()

        def drop_1d(shared_axis: int) -> nn.Module:
            return Dropout1d(dropout, shared_axis) if shared_dropout else Dropout(dropout)

        def drop_2d() -> nn.Module:
            return Dropout2d(dropout) if shared_dropout else Dropout(dropout)

        self.target_attn = TargetAttention(d_model, heads, attention_dropout)
        self.source_attn = SourceAttention(d_model, heads, attention_dropout)
        self.target_ff = FeedForward(d_model, ff, 0.0)  # no inner dropout (fairseq's default)
        self.source_ff = FeedForward(d_model, ff, 0.0)
        self.target_attn_res = JointResidual(d_model, drop_1d(SOURCE_AXIS))  # aggregates T: noise shared along S
        self.target_ff_res = JointResidual(d_model, drop_2d())
        self.source_attn_res = JointResidual(d_model, drop_1d(TARGET_AXIS))  # aggregates S: noise shared along T
        self.source_ff_res = JointResidual(d_model, drop_2d())

    def forward(self, x: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        """``x`` [B, T, S, E] -> [B, T, S, E]; ``src_keep`` [B, S] True on real source tokens."""
        x = self.target_attn_res(x, self.target_attn)
        return self.after_target_attention(x, src_keep)

    def after_target_attention(self, x: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        """The three sublayers that act on each target row independently (shared with ``step``)."""
        x = self.target_ff_res(x, self.target_ff)
        x = self.source_attn_res(x, lambda h: self.source_attn(h, src_keep))
        return self.source_ff_res(x, self.source_ff)

    def step(self, row: torch.Tensor, cache: Optional[KV], src_keep: torch.Tensor) -> tuple[torch.Tensor, KV]:
        """The new target row [B, 1, S, E] through the layer, with the target-axis cache."""
        new_cache = None

        def attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal new_cache
            out, new_cache = self.target_attn.step(h, cache)
            return out

        row = self.target_attn_res(row, attend)
        return self.after_target_attention(row, src_keep), new_cache


@REGISTRY.register("reformer", ReformerDecoderConfig)
class ReformerDecoder(Decoder):
    """The joint-representation Reformer (Li et al., 2020) as a decoder over the encoder's memory."""

    def __init__(self, cfg: ReformerDecoderConfig, ctx: PartContext) -> None:
        """Embeddings are shared with the model; ``cfg.checkpoint_layers`` enables gradient checkpointing."""
        super().__init__()
        self.embeddings = ctx.tgt_embeddings
        self.layers = nn.ModuleList(
            ReformerLayer(ctx.d_model, cfg.heads, cfg.ff, ctx.dropout, ctx.attention_dropout, cfg.shared_dropout)
            for _ in range(cfg.layers)
        )
        self.reduction = Reduction(ctx.d_model)
        self.checkpoint_layers = cfg.checkpoint_layers

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:
        """Teacher-forced pass: joint input (eq. 4) through the layers, reduced (eq. 6) to ``hidden`` [B, T, E]."""
        x = joint_input(enc_out.memory, self.embeddings(tgt_in))
        keep = ~enc_out.pad_mask
        recompute = self.checkpoint_layers and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            # memory O(L·T·S·E) -> O(T·S·E) + one layer's activations, at one more forward pass
            x = checkpoint(layer, x, keep, use_reentrant=False) if recompute else layer(x, keep)
        return DecoderOut(self.reduction(x, keep))

    def init_state(self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None) -> ReformerState:
        """The memory as the source side of the joint input and empty target caches; ``limit`` is unused."""
        return ReformerState(
            step=0, memory=enc_out.memory, src_keep=~enc_out.pad_mask, target_kv=[None] * len(self.layers)
        )

    def step(self, tokens: torch.Tensor, state: ReformerState) -> tuple[torch.Tensor, ReformerState]:
        """Feed ``tokens`` [B]: only the new row [B, 1, S, E] runs through the layers; hidden [B, E]."""
        row = joint_input(state.memory, self.embeddings(tokens[:, None], offset=state.step))  # [B, 1, S, E]
        for i, layer in enumerate(self.layers):
            row, state.target_kv[i] = layer.step(row, state.target_kv[i], state.src_keep)
        state.step += 1
        return self.reduction(row, state.src_keep)[:, 0], state
