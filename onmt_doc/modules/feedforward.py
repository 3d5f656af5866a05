"""Position-wise feed-forward network."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from onmt_doc.modules.dropout import Dropout

# The feed-forward activations by their config name (``model.activation``): ReLU (Vaswani et al.,
# 2017), GELU (exact, erf; BERT, mBART) and swish = SiLU, x·sigmoid(x) (Marian / OPUS-MT models).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "gelu": F.gelu,
    "swish": F.silu,
}


class FeedForward(nn.Module):
    """FFN(x) = W2 · dropout(act(W1 x + b1)) + b2, act = ReLU unless ``activation`` says otherwise."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu") -> None:
        """``d_ff``: the inner width (4·d_model in the base Transformer); ``activation``: a key of
        :data:`ACTIVATIONS` (``build_model`` sets ``model.activation`` on every feed-forward of a model)."""
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)
        self.activation = activation

    @property
    def activation(self) -> str:
        """The activation's name (a key of :data:`ACTIVATIONS`)."""
        return self._activation

    @activation.setter
    def activation(self, name: str) -> None:
        if name not in ACTIVATIONS:
            raise ValueError(f"unknown feed-forward activation {name!r} (one of {', '.join(ACTIVATIONS)})")
        self._activation, self._act = name, ACTIVATIONS[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., D] -> [..., D], each position independently."""
        return self.w2(self.dropout(self._act(self.w1(x))))
