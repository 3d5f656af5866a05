"""Context-gated Transformer decoder (Li et al., 2020, "Regularized Context Gates on Transformer").

Every layer is the Transformer decoder layer with its cross-attention residual sum replaced by a
context gate: the target context t (after self-attention) and the source context s
(cross-attention over the encoder output) are mixed as ``(1 − z) ⊗ t + z ⊗ s`` before the
feed-forward sublayer (eqs. 2–4). Decoding state, caches and ``step`` are the Transformer's; the
teacher-forced pass also returns every layer's gates in ``aux["gates"]`` ([L, B, T, D]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from onmt_doc.config import Config
from onmt_doc.config.options import PartConfig, check_heads, option
from onmt_doc.contracts import Batch, DecoderOut, EncoderOut, PartContext
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.decoders.base import REGISTRY, Decoder
from onmt_doc.decoders.transformer import TransformerDecoder, TransformerDecoderLayer
from onmt_doc.modules.attention import KV
from onmt_doc.modules.context_gate import GatedResidual, GateType, Placement, residual_block


@dataclass
class GatedTransformerDecoderConfig(PartConfig):
    """``model.decoder`` keys of ``type: gated_transformer`` (help text in each field's ``option``)."""

    layers: int = option(6, "number of layers", minimum=0)
    heads: int = option(8, "attention heads (self and cross); must divide `model.d_model`", minimum=1)
    ff: int = option(2048, "inner size of the feed-forward network", minimum=1)
    norm: Placement = option(
        "post",
        "layer norm placement: `post` = the Transformer's post-norm blocks with the "
        "gate (the default: it trained best on Multi30k at the benchmark budget, and the "
        "authors' THUMT Transformer is post-norm); `pre` = pre-norm blocks with a final layer "
        "norm; `paper` = every block is `x + dropout(LN(f(x)))` with "
        "`s = dropout(LN(cross-attention(t)))` (eqs. 2–3, read literally) and a final layer "
        "norm. See docs/models/context_gates.md",
    )
    gate: GateType = option(
        "vector",
        "`vector` = the context gate of eq. 4; `sum` = the paper's Remark, `t + s` "
        "with no gate: the Transformer decoder with the blocks of `norm` (no `gates` for "
        "`pmi_gate_hinge`)",
    )

    def validate(self, path: str, root: Config) -> None:
        """Self- and cross-attention split model.d_model into ``heads`` slices."""
        check_heads(self.heads, path, root)


class GatedDecoderLayer(TransformerDecoderLayer):
    """``step`` is inherited (the gated block is a drop-in residual); ``forward`` also returns z."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ff: int,
        dropout: float,
        attention_dropout: float,
        norm: Placement,
        gate: GateType = "vector",
    ) -> None:
        """``norm``: block placement (:data:`Placement`); ``gate``: ``vector`` (eq. 4) or ``sum`` (Remark)."""
        super().__init__(d_model, heads, ff, dropout, attention_dropout, pre_norm=norm == "pre")
        self.self_res = residual_block(d_model, dropout, norm)  # eq. 2: t = rn∘ln∘att(c, c<i)
        self.cross_res = GatedResidual(d_model, dropout, norm, gate)  # eqs. 2, 4: s, z
        self.ff_res = residual_block(d_model, dropout, norm)  # eq. 3: c = rn∘ln∘ff(...)

    def forward(
        self, x: torch.Tensor, memory_kv: KV, memory_mask: torch.Tensor
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``x`` [B, T, D] -> ([B, T, D], gate z [B, T, D], None for ``gate: sum``)."""
        t = self.self_res(x, lambda h: self.self_attn(h, is_causal=True))
        mixed, z = self.cross_res.gated(t, lambda h: self.cross_attn.cross(h, memory_kv, memory_mask))
        return self.ff_res(mixed, self.ff), z


def gate_stats(gates: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
    """Validation sums for TensorBoard (valid/gate/mean, valid/gate/var after division by the
    target tokens): per token the mean gate over layers and dimensions, and the batch's gate
    variance weighted by its tokens (the exact variance over a set: onmt_doc_gate_analysis)."""
    z = gates.float()[:, keep]  # [L, N, D]
    n = z.size(1)
    if n == 0:
        return {"gate/mean": 0.0, "gate/var": 0.0}
    return {"gate/mean": z.mean((0, 2)).sum().item(), "gate/var": z.var(unbiased=False).item() * n}


@REGISTRY.register("gated_transformer", GatedTransformerDecoderConfig)
class GatedTransformerDecoder(TransformerDecoder):
    """``init_state`` and ``step`` are the Transformer decoder's."""

    def __init__(self, cfg: GatedTransformerDecoderConfig, ctx: PartContext) -> None:
        """Builds :class:`GatedDecoderLayer` stacks; skips ``TransformerDecoder.__init__``, whose layers
        take ``pre_norm`` rather than ``norm`` and ``gate``."""
        Decoder.__init__(self)
        self.embeddings = ctx.tgt_embeddings
        self.layers = nn.ModuleList(
            GatedDecoderLayer(ctx.d_model, cfg.heads, cfg.ff, ctx.dropout, ctx.attention_dropout, cfg.norm, cfg.gate)
            for _ in range(cfg.layers)
        )
        # the paper's blocks never normalise the residual stream itself: normalise it once on top
        self.final_norm = nn.Identity() if cfg.norm == "post" else nn.LayerNorm(ctx.d_model)

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:
        """Teacher-forced pass: ``hidden`` [B, T, D], the gates ``aux["gates"]`` [L, B, T, D] (vector
        gate only) and, in eval mode, their validation sums ``aux["stats"]``."""
        x = self.embeddings(tgt_in)
        mask = enc_out.attention_mask()
        gates = []
        for layer in self.layers:
            x, z = layer(x, layer.cross_attn.memory_kv(enc_out.memory), mask)
            gates.append(z)
        if not gates or gates[0] is None:  # gate: sum, nothing to report
            return DecoderOut(self.final_norm(x))
        aux = {"gates": torch.stack(gates)}  # [L, B, T, D]
        if not self.training:
            aux["stats"] = gate_stats(aux["gates"], tgt_in.ne(PAD_ID))
        return DecoderOut(self.final_norm(x), aux)
