"""Building blocks of the joint-representation Reformer (Li et al., 2020, "Neural Machine
Translation with Joint Representation"): separable attention, Dropout1d/2d and Reduction.

The joint representation is laid out ``[B, T, S, E]``: target position first, so a decoding step
appends one ``[B, 1, S, E]`` row. Attention along one axis folds the other axis into the batch
(eq. 5) and runs the ordinary :class:`MultiHeadAttention`; nothing here re-implements attention.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from onmt_doc.modules.attention import KV, MultiHeadAttention
from onmt_doc.modules.dropout import dropout_mask
from onmt_doc.modules.sublayer import Residual

# axes of the joint representation [B, T, S, E]
TARGET_AXIS, SOURCE_AXIS = 1, 2


# ----------------------------------------------------------------------------- separable attention


class TargetAttention(nn.Module):
    """Causal self-attention along T, one independent sequence per (batch, source position)
    (eq. 5 with D = T). Decoding caches its keys/values per layer as ``[B, S, H, t, d_head]``."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        """``heads`` must divide ``d_model`` (:class:`MultiHeadAttention`)."""
        super().__init__()
        self.attn = MultiHeadAttention(d_model, heads, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, T, S, E] -> [B, T, S, E], causal along T."""
        b, t, s, e = x.shape
        folded = x.transpose(1, 2).reshape(b * s, t, e)  # S folded into the batch
        out = self.attn(folded, is_causal=True)
        return out.view(b, s, t, e).transpose(1, 2)

    def step(self, x: torch.Tensor, cache: Optional[KV]) -> tuple[torch.Tensor, KV]:
        """The new row ``x`` [B, 1, S, E] attends over the cached rows and itself; only this row is
        computed (the T×S block is never recomputed)."""
        b, _, s, e = x.shape
        folded = None if cache is None else tuple(c.flatten(0, 1) for c in cache)
        out, (k, v) = self.attn.step(x.reshape(b * s, 1, e), folded)
        heads, length, d_head = k.shape[1:]
        return out.view(b, 1, s, e), (k.reshape(b, s, heads, length, d_head), v.reshape(b, s, heads, length, d_head))


class SourceAttention(nn.Module):
    """Self-attention along S, one independent sequence per (batch, target position) (eq. 5 with
    D = S); source padding is never attended to."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        """``heads`` must divide ``d_model`` (:class:`MultiHeadAttention`)."""
        super().__init__()
        self.attn = MultiHeadAttention(d_model, heads, dropout)

    def forward(self, x: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        """``x`` [B, T, S, E]; ``src_keep`` [B, S] True on real source tokens."""
        b, t, s, e = x.shape
        mask = src_keep[:, None, None, None, :].expand(b, t, 1, 1, s).reshape(b * t, 1, 1, s)
        return self.attn(x.reshape(b * t, s, e), mask).view(b, t, s, e)  # T folded into the batch


# ----------------------------------------------------------------------------- Dropout1d / Dropout2d


class SharedDropout(nn.Module):
    """Inverted dropout whose noise is drawn once and shared along ``shared_axes``: a feature
    dropped at one position is dropped at every position of those axes, so the model cannot read
    it back from a copy (the joint input repeats each source token along T and each target token
    along S)."""

    def __init__(self, p: float, shared_axes: tuple[int, ...]) -> None:
        """``shared_axes`` index the input's dimensions; raises ValueError for ``p`` outside [0, 1)."""
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p, self.shared_axes = p, shared_axes

    def mask_shape(self, shape: torch.Size) -> tuple[int, ...]:
        """The noise shape: size 1 on the shared axes, so one draw broadcasts along them."""
        return tuple(1 if axis in self.shared_axes else n for axis, n in enumerate(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Identity in eval mode or at p = 0, else ``x`` times a mask shared along ``shared_axes``."""
        if not self.training or self.p == 0.0:
            return x
        return x * dropout_mask(self.mask_shape(x.shape), self.p, x)

    def extra_repr(self) -> str:
        """Shown by ``print(module)``."""
        return f"p={self.p}, shared_axes={self.shared_axes}"


class Dropout1d(SharedDropout):
    """Noise shared along one axis: on the target attention's output along S, on the source
    attention's output along T (the axis the attention does not aggregate)."""

    def __init__(self, p: float, shared_axis: int) -> None:
        """``shared_axis``: ``TARGET_AXIS`` or ``SOURCE_AXIS`` of [B, T, S, E]."""
        super().__init__(p, (shared_axis,))


class Dropout2d(SharedDropout):
    """Noise shared along S and T: on the FFN outputs, which act on the whole T×S plane."""

    def __init__(self, p: float) -> None:
        """Noise shared along ``TARGET_AXIS`` and ``SOURCE_AXIS``, drawn per (batch, feature)."""
        super().__init__(p, (TARGET_AXIS, SOURCE_AXIS))


class JointResidual(Residual):
    """Pre-norm residual (eq. 1) whose dropout is a given module (Dropout1d/2d or plain)."""

    def __init__(self, d_model: int, dropout: nn.Module) -> None:
        """``dropout`` replaces the base block's plain dropout (whose p is then unused)."""
        super().__init__(d_model, 0.0, pre_norm=True)
        self.dropout = dropout


# ----------------------------------------------------------------------------- Reduction


class Reduction(nn.Module):
    """Reduction (eq. 6): ``[B, T, S, E] -> [B, T, E]``, one vector per target position.

    Per channel i, ``head_i = softmax_s(W_i x_s) x_{s,i}``: all E features of a source position
    score feature i, normalised over the S positions (padding excluded). Layer norms on the input
    and the output.
    """

    def __init__(self, d_model: int) -> None:
        """``d_model``: E, the feature size of the joint representation."""
        super().__init__()
        self.input_norm = nn.LayerNorm(d_model)
        self.score = nn.Linear(d_model, d_model, bias=False)  # row i is W_i
        self.output_norm = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        """``x`` [B, T, S, E], ``src_keep`` [B, S] True on real source tokens -> [B, T, E]."""
        x = self.input_norm(x)
        scores = self.score(x).masked_fill(~src_keep[:, None, :, None], float("-inf"))  # [B, T, S, E]
        weights = scores.softmax(dim=SOURCE_AXIS)  # eq. 6 softmax over S
        return self.output_norm((weights * x).sum(SOURCE_AXIS))
