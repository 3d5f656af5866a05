"""Transformer decoder (Vaswani et al., 2017) with cached self- and cross-attention keys/values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch
from torch import nn

from onmt_doc.config import Config
from onmt_doc.config.options import PartConfig, check_heads, option
from onmt_doc.contracts import Batch, DecoderOut, DecoderState, EncoderOut, LengthLimit, PartContext
from onmt_doc.decoders.base import REGISTRY, Decoder
from onmt_doc.modules.attention import KV, MultiHeadAttention
from onmt_doc.modules.feedforward import FeedForward
from onmt_doc.modules.sublayer import Residual


@dataclass
class TransformerDecoderConfig(PartConfig):
    """``model.decoder`` keys of ``type: transformer`` (help text in each field's ``option``)."""

    layers: int = option(6, "number of layers", minimum=0)
    heads: int = option(8, "attention heads (self and cross); must divide `model.d_model`", minimum=1)
    ff: int = option(2048, "inner size of the feed-forward network", minimum=1)
    pre_norm: bool = option(True, "pre-norm with final layer norm, or post-norm")

    def validate(self, path: str, root: Config) -> None:
        """Self- and cross-attention split model.d_model into ``heads`` slices."""
        check_heads(self.heads, path, root)


@dataclass
class TransformerState(DecoderState):
    """Per layer, the self-attention cache (``capacity`` slots allocated at the first step and
    written in place, one position a step) and the cross-attention keys/values of the memory
    (computed once; ``source_fields``, so beams of one sentence share them)."""

    source_fields: ClassVar[tuple[str, ...]] = ("cross_kv", "memory_mask")
    owned_fields: ClassVar[tuple[str, ...]] = ("self_kv", "cross_kv")
    step: int
    capacity: int  # slots of a self-attention cache: the search's longest output; doubles if a prefix needs more
    self_kv: list[Optional[KV]]
    cross_kv: list[KV]
    memory_mask: torch.Tensor  # [B, 1, 1, S]

    def filled_slots(self, name: str) -> Optional[int]:
        """The self-attention caches hold the ``step`` positions fed so far: a reorder moves those only."""
        return self.step if name == "self_kv" else None


class TransformerDecoderLayer(nn.Module):
    """Causal self-attention, cross-attention and feed-forward, each in a residual block;
    :meth:`source_attention` is the hook for layers that read more than the sentence memory."""

    def __init__(
        self, d_model: int, heads: int, ff: int, dropout: float, attention_dropout: float, pre_norm: bool
    ) -> None:
        """``attention_dropout`` applies to attention probabilities, ``dropout`` to the residual branches."""
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, heads, attention_dropout, self_attention=False)
        self.ff = FeedForward(d_model, ff, dropout)
        self.self_res = Residual(d_model, dropout, pre_norm)
        self.cross_res = Residual(d_model, dropout, pre_norm)
        self.ff_res = Residual(d_model, dropout, pre_norm)

    def source_attention(
        self, h: torch.Tensor, memory_kv: KV, memory_mask: torch.Tensor, context: Any = None
    ) -> torch.Tensor:
        """What the cross-attention sublayer adds; ``context`` is for layers that attend to more
        than the sentence memory (HM-GDC's document context)."""
        return self.cross_attn.cross(h, memory_kv, memory_mask)

    def forward(self, x: torch.Tensor, memory_kv: KV, memory_mask: torch.Tensor, context: Any = None) -> torch.Tensor:
        """``x`` [B, T, D] -> [B, T, D]; ``memory_mask`` [B, 1, 1, S] True on real source tokens."""
        x = self.self_res(x, lambda h: self.self_attn(h, is_causal=True))
        x = self.cross_res(x, lambda h: self.source_attention(h, memory_kv, memory_mask, context))
        return self.ff_res(x, self.ff)

    def step(
        self,
        x: torch.Tensor,
        cache: Optional[KV],
        position: int,
        capacity: int,
        memory_kv: KV,
        memory_mask: torch.Tensor,
        context: Any = None,
    ) -> tuple[torch.Tensor, KV]:
        """One position ``x`` [B, 1, D] at ``position``, after the self-attention ``cache`` ([B, H, C, d]
        with ``capacity`` slots, allocated at the first step); returns its output and the cache,
        written in place (the search's steps allocate nothing, and a step's shapes are its capacity's)."""
        new_cache = None

        def attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal new_cache
            out, new_cache = self.self_attn.step_at(h, cache, position, capacity)
            return out

        x = self.self_res(x, attend)
        x = self.cross_res(x, lambda h: self.source_attention(h, memory_kv, memory_mask, context))
        return self.ff_res(x, self.ff), new_cache


@REGISTRY.register("transformer", TransformerDecoderConfig)
class TransformerDecoder(Decoder):
    """The Transformer decoder (Vaswani et al., 2017, sec. 3.1).

    Subclasses change ``layer_type`` and the ``layer_contexts``/``state_contexts`` hooks rather than
    re-implement teacher forcing and stepwise decoding.
    """

    layer_type: ClassVar[type] = TransformerDecoderLayer  # subclasses with other layers set theirs

    def __init__(self, cfg: TransformerDecoderConfig, ctx: PartContext) -> None:
        """Embeddings are shared with the model (``ctx.tgt_embeddings``), so they can be tied."""
        super().__init__()
        self.embeddings = ctx.tgt_embeddings
        self.layers = nn.ModuleList(
            self.layer_type(ctx.d_model, cfg.heads, cfg.ff, ctx.dropout, ctx.attention_dropout, cfg.pre_norm)
            for _ in range(cfg.layers)
        )
        self.final_norm = nn.LayerNorm(ctx.d_model) if cfg.pre_norm else nn.Identity()

    def layer_contexts(self, enc_out: EncoderOut) -> list[Any]:
        """Per layer, what ``source_attention`` reads besides the sentence memory (none here)."""
        return [None] * len(self.layers)

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:
        """Teacher-forced pass: ``tgt_in`` [B, T] -> ``hidden`` [B, T, D]."""
        x = self.embeddings(tgt_in)
        mask = enc_out.attention_mask()
        for layer, context in zip(self.layers, self.layer_contexts(enc_out)):
            x = layer(x, layer.cross_attn.memory_kv(enc_out.memory), mask, context)
        return DecoderOut(self.final_norm(x))

    def init_state(self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None) -> TransformerState:
        """Empty self-attention caches of the batch's longest output under ``limit`` (from the
        source's padded width: a shape, read without waiting for a GPU) and the memory's
        cross-attention keys/values, computed once per source."""
        return TransformerState(
            step=0,
            capacity=cache_capacity(batch.src.size(1), limit),
            self_kv=[None] * len(self.layers),
            cross_kv=[layer.cross_attn.memory_kv(enc_out.memory) for layer in self.layers],
            memory_mask=enc_out.attention_mask(),
        )

    def step(self, tokens: torch.Tensor, state: TransformerState) -> tuple[torch.Tensor, TransformerState]:
        """Feed ``tokens`` [B] at position ``state.step``: hidden [B, D] and the advanced state."""
        x = self.embeddings(tokens[:, None], offset=state.step)
        contexts = self.state_contexts(state)
        for i, layer in enumerate(self.layers):
            x, state.self_kv[i] = layer.step(
                x, state.self_kv[i], state.step, state.capacity, state.cross_kv[i], state.memory_mask, contexts[i]
            )
        state.step += 1
        return self.final_norm(x)[:, 0], state

    def state_contexts(self, state: TransformerState) -> list[Any]:
        """``layer_contexts`` as the decoding state holds them."""
        return [None] * len(self.layers)


def cache_capacity(src_width: int, limit: Optional[LengthLimit], default: int = 64) -> int:
    """Self-attention cache slots for a search over sources of ``src_width`` tokens: ``<bos>`` and the
    tokens before the cap's ``<eos>`` (``default`` without a limit: tests, forced decoding); a longer
    forced prefix doubles the caches (``grow_kv``)."""
    if limit is None:
        return default
    cap = min(int(src_width * limit.ratio) + limit.add, max(limit.max_length, 1))  # LengthLimit's, on the host
    return max(cap, 3) + 1
