"""Gate-sum of two representations (G-Transformer eq. 10, after Zhang et al. 2016, Tu et al. 2017)."""

from __future__ import annotations

import torch
from torch import nn

from onmt_doc.modules import analysis


class GateSum(nn.Module):
    """g = sigmoid(W [h_local; h_global] + b),  h = g ⊙ h_local + (1 − g) ⊙ h_global."""

    def __init__(self, d_model: int, name: str) -> None:
        """``name`` labels the analysis statistic ``gate/<name>``, the mean gate value."""
        super().__init__()
        self.proj = nn.Linear(2 * d_model, d_model)
        self.name = name  # analysis statistic gate/<name>: the mean gate value

    def forward(self, local: torch.Tensor, global_: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """``local``, ``global_`` [B, T, D] -> their gate-sum [B, T, D]; ``keep`` [B, T] is True on real
        tokens, the positions the gate statistic averages over."""
        g = torch.sigmoid(self.proj(torch.cat([local, global_], dim=-1)))  # eq. 10
        analysis.record_mean(f"gate/{self.name}", g, keep)
        analysis.capture(f"gate/{self.name}", g)  # the context pictures: g per token and dimension
        return g * local + (1.0 - g) * global_
