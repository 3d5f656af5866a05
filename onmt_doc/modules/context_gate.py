"""Context gates on residual blocks (Li et al., 2020, "Regularized Context Gates on Transformer").

A gated block replaces the residual sum ``t + s`` of a sublayer by ``(1 − z) ⊗ t + z ⊗ s`` with a
vector gate ``z = σ(W [t ‖ s] + b)`` (eqs. 3–4): ``t`` is the block's input, ``s`` what the plain
block would add to it. The paper's Remark: with ``t + s`` instead of the gated sum, the model is
the Transformer again (gate type ``sum``, for every placement). The residual blocks of the paper
normalise the sublayer *output* before the residual sum (``rn∘ln∘f``, eqs. 2–3); the Transformer's
pre-norm and post-norm blocks take the same gate.
"""

from __future__ import annotations

from typing import Callable, Literal, Optional

import torch
from torch import nn

from onmt_doc.modules.sublayer import Residual

Placement = Literal["paper", "pre", "post"]
GateType = Literal["vector", "sum"]
Sublayer = Callable[[torch.Tensor], torch.Tensor]


class OutputNormResidual(Residual):
    """The paper's ``rn∘ln∘f``: ``x + dropout(LN(f(x)))`` (eqs. 2–3)."""

    def __init__(self, d_model: int, dropout: float) -> None:
        """The layer norm always applies to the sublayer output, so there is no ``pre_norm`` choice."""
        super().__init__(d_model, dropout, pre_norm=False)

    def forward(self, x: torch.Tensor, fn: Sublayer) -> torch.Tensor:
        """``x`` [..., D] -> ``x + dropout(LN(fn(x)))``."""
        return x + self.dropout(self.norm(fn(x)))


def residual_block(d_model: int, dropout: float, placement: Placement) -> Residual:
    """A plain residual block with the layer norm where ``placement`` puts it."""
    if placement == "paper":
        return OutputNormResidual(d_model, dropout)
    return Residual(d_model, dropout, pre_norm=placement == "pre")


class GatedResidual(Residual):
    """A residual block whose sum is gated; ``forward`` is a drop-in :class:`Residual`, ``gated``
    also returns the gate (for the hinge loss and analysis). ``gate_type="sum"`` is the paper's
    Remark: ``t + s`` with no gate (z is None), i.e. the plain residual block of ``placement``."""

    def __init__(self, d_model: int, dropout: float, placement: Placement, gate_type: GateType = "vector") -> None:
        """``placement``: where the layer norm sits (``paper`` = rn∘ln∘f, ``pre``, ``post``); ``gate_type``:
        ``vector`` (eq. 4) or ``sum`` (the Remark, no gate parameters)."""
        super().__init__(d_model, dropout, pre_norm=placement == "pre")
        self.placement = placement
        self.gate = nn.Linear(2 * d_model, d_model) if gate_type == "vector" else None

    def branch(self, x: torch.Tensor, fn: Sublayer) -> torch.Tensor:
        """``s``: what the plain block adds to ``x``."""
        if self.placement == "paper":
            return self.dropout(self.norm(fn(x)))  # eq. 2: s = ln∘att(t, h)
        return self.dropout(fn(self.normed(x)))

    def gated(self, t: torch.Tensor, fn: Sublayer) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The gated sum and the gate z, both [..., D] (z None for the plain sum)."""
        s = self.branch(t, fn)
        if self.gate is None:
            out, z = t + s, None  # Remark: t + s, the Transformer
        else:
            z = torch.sigmoid(self.gate(torch.cat([t, s], dim=-1)))  # eq. 4: z = σ(ff(t ‖ s))
            out = t + z * (s - t)  # eq. 3: (1 − z) ⊗ t + z ⊗ s
        return (self.norm(out) if self.placement == "post" else out), z

    def forward(self, x: torch.Tensor, fn: Sublayer) -> torch.Tensor:
        """The gated sum [..., D], as :meth:`gated` without the gate."""
        return self.gated(x, fn)[0]
