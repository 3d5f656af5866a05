"""MHPLSTM decoder (Xu et al., 2021): the Transformer decoder with its self-attention sublayer
replaced by a multi-head highly parallelized LSTM (``onmt_doc/modules/hplstm.py``).

Layers are ``MHPLSTM → cross-attention → feed-forward`` (the feed-forward sublayer can be dropped,
the paper's table 3), with the Transformer's residual blocks and norm placement. Training runs
every position at once; decoding carries per layer only the running input sum and the cell
(``[B, D]`` each), so a step costs the same at position 5 and at position 500.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

import torch
from torch import nn

from onmt_doc.config import Config
from onmt_doc.config.options import PartConfig, check_heads, option
from onmt_doc.contracts import Batch, DecoderOut, DecoderState, EncoderOut, LengthLimit, PartContext
from onmt_doc.decoders.base import REGISTRY, Decoder
from onmt_doc.errors import ConfigError
from onmt_doc.modules.attention import KV, MultiHeadAttention
from onmt_doc.modules.feedforward import FeedForward
from onmt_doc.modules.hplstm import HPLSTMState, MultiHeadHPLSTM
from onmt_doc.modules.sublayer import Residual


@dataclass
class MHPLSTMDecoderConfig(PartConfig):
    """``model.decoder`` keys of ``type: mhplstm`` (help text in each field's ``option``)."""

    layers: int = option(6, "number of layers", minimum=0)
    heads: int = option(
        8, "MHPLSTM heads (eqs. 19–21) and cross-attention heads; must divide `model.d_model`", minimum=1
    )
    ff: int = option(2048, "inner size of the feed-forward sublayer", minimum=1)
    ffn: bool = option(True, '`false` drops the feed-forward sublayer (the paper\'s table 3, "− FFN")')
    hidden_layers: int = option(
        2, "hidden state from a 2-layer network (eq. 14, the paper's choice) or 1 layer (eq. 13); must be 1 or 2"
    )
    hidden_ratio: int = option(
        4, "inner width of eq. 14's network in multiples of the head size (`d_model / heads`); at least 1", minimum=1
    )
    positions: bool = option(
        True, "add sinusoidal positions to the target embeddings; `false` leaves word order to the recurrence"
    )
    norm_group: Literal["per_head", "all_heads"] = option(
        "per_head",
        "which features share a layer norm's mean and deviation: each head's own (the paper's "
        "independent per-head HPLSTMs, eq. 20), or all heads of a position together, as the authors' released code "
        "does (LN(s), output gate and eq. 14's inner layer over d_model; both gates together; with "
        "`hidden_layers: 1` both gates and h together). Same parameter count either way (with `hidden_layers: 2` "
        "also the same names and shapes). See "
        "[models/mhplstm.md](models/mhplstm.md#layer-normalisation-per-head-or-over-all-heads)",
    )
    pre_norm: bool = option(True, "pre-norm with final layer norm, or post-norm, as for `transformer`")

    def validate(self, path: str, root: Config) -> None:
        """Eq. 13 and eq. 14 are the only hidden-state networks; heads split model.d_model."""
        check_heads(self.heads, path, root)
        if self.hidden_layers not in (1, 2):
            raise ConfigError(f"{path}.hidden_layers: must be 1 or 2, got {self.hidden_layers}")


@dataclass
class MHPLSTMState(DecoderState):
    """Per layer only ``(running input sum, cell)`` [B, D] each: constant size whatever the prefix
    length, plus the memory's cross-attention keys/values."""

    source_fields: ClassVar[tuple[str, ...]] = ("cross_kv", "memory_mask")
    owned_fields: ClassVar[tuple[str, ...]] = ("cross_kv",)
    step: int
    recurrent: list[HPLSTMState]  # per layer (running input sum, cell), [B, D] each
    cross_kv: list[KV]
    memory_mask: torch.Tensor  # [B, 1, 1, S]


class MHPLSTMDecoderLayer(nn.Module):
    """MHPLSTM (in place of self-attention), cross-attention and an optional feed-forward sublayer."""

    def __init__(self, cfg: MHPLSTMDecoderConfig, d_model: int, dropout: float, attention_dropout: float) -> None:
        """Reads ``heads``, ``ff``, ``ffn``, ``hidden_layers``, ``hidden_ratio``, ``norm_group`` and
        ``pre_norm`` from ``cfg``."""
        super().__init__()
        self.hplstm = MultiHeadHPLSTM(d_model, cfg.heads, dropout, cfg.hidden_layers, cfg.hidden_ratio, cfg.norm_group)
        self.cross_attn = MultiHeadAttention(d_model, cfg.heads, attention_dropout, self_attention=False)
        self.hplstm_res = Residual(d_model, dropout, cfg.pre_norm)
        self.cross_res = Residual(d_model, dropout, cfg.pre_norm)
        self.ff = FeedForward(d_model, cfg.ff, dropout) if cfg.ffn else None
        self.ff_res = Residual(d_model, dropout, cfg.pre_norm) if cfg.ffn else None

    def forward(
        self, x: torch.Tensor, memory_kv: KV, memory_mask: torch.Tensor, state: Optional[HPLSTMState] = None
    ) -> tuple[torch.Tensor, HPLSTMState]:
        """All positions of ``x`` after the prefix in ``state`` (None for a whole target)."""
        new_state = state

        def recur(h: torch.Tensor) -> torch.Tensor:
            nonlocal new_state
            out, new_state = self.hplstm(h, state)
            return out

        x = self.hplstm_res(x, recur)
        x = self.cross_res(x, lambda h: self.cross_attn.cross(h, memory_kv, memory_mask))
        if self.ff is not None:
            x = self.ff_res(x, self.ff)
        return x, new_state


@REGISTRY.register("mhplstm", MHPLSTMDecoderConfig)
class MHPLSTMDecoder(Decoder):
    """The MHPLSTM decoder (Xu et al., 2021)."""

    def __init__(self, cfg: MHPLSTMDecoderConfig, ctx: PartContext) -> None:
        """Embeddings are shared with the model; ``cfg.positions`` decides whether they add positions."""
        super().__init__()
        self.embeddings = ctx.tgt_embeddings
        self.positions = cfg.positions
        self.layers = nn.ModuleList(
            MHPLSTMDecoderLayer(cfg, ctx.d_model, ctx.dropout, ctx.attention_dropout) for _ in range(cfg.layers)
        )
        self.final_norm = nn.LayerNorm(ctx.d_model) if cfg.pre_norm else nn.Identity()

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:
        """Teacher-forced pass: ``tgt_in`` [B, T] -> ``hidden`` [B, T, D], every position at once."""
        x = self.embeddings(tgt_in, with_positions=self.positions)
        mask = enc_out.attention_mask()
        for layer in self.layers:
            x, _ = layer(x, layer.cross_attn.memory_kv(enc_out.memory), mask)
        return DecoderOut(self.final_norm(x))

    def init_state(self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None) -> MHPLSTMState:
        """Zero recurrent states and the memory's cross-attention keys/values; ``limit`` is unused."""
        b, d = enc_out.memory.size(0), enc_out.memory.size(2)
        zeros = enc_out.memory.new_zeros(b, d)
        return MHPLSTMState(
            step=0,
            recurrent=[(zeros, zeros)] * len(self.layers),
            cross_kv=[layer.cross_attn.memory_kv(enc_out.memory) for layer in self.layers],
            memory_mask=enc_out.attention_mask(),
        )

    def step(self, tokens: torch.Tensor, state: MHPLSTMState) -> tuple[torch.Tensor, MHPLSTMState]:
        """Feed ``tokens`` [B] at position ``state.step``: hidden [B, D] and the advanced state."""
        x = self.embeddings(tokens[:, None], offset=state.step, with_positions=self.positions)
        for i, layer in enumerate(self.layers):
            x, state.recurrent[i] = layer(x, state.cross_kv[i], state.memory_mask, state.recurrent[i])
        state.step += 1
        return self.final_norm(x)[:, 0], state
