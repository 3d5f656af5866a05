"""Residual connection with layer norm, pre-norm (default) or post-norm."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from onmt_doc.modules.dropout import Dropout


class Residual(nn.Module):
    """pre-norm: ``x + dropout(f(LN(x)))``; post-norm: ``LN(x + dropout(f(x)))``."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool = True) -> None:
        """``pre_norm=False`` gives the original (post-norm) Transformer block."""
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Apply sublayer ``fn`` to ``x`` [..., D] inside the residual block."""
        if self.pre_norm:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """The sublayer's input as ``fn`` sees it (for sublayers that also need it elsewhere)."""
        return self.norm(x) if self.pre_norm else x
