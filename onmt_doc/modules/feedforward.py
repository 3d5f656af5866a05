"""Position-wise feed-forward network."""

from __future__ import annotations

import torch
from torch import nn

from onmt_doc.modules.dropout import Dropout


class FeedForward(nn.Module):
    """FFN(x) = W2 · dropout(relu(W1 x + b1)) + b2."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        """``d_ff``: the inner width (4·d_model in the base Transformer)."""
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., D] -> [..., D], each position independently."""
        return self.w2(self.dropout(torch.relu(self.w1(x))))
