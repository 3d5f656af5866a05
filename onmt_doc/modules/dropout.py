"""Inverted dropout with fast masks on CPU.

torch's CPU dropout draws its Bernoulli mask element by element on one thread, which made dropout
about 16% of a training step of the benchmark model (docs/benchmarks.md). Here the mask comes from
bulk 64-bit random words read as four 16-bit uniforms: about 3× faster, with p rounded to a
multiple of 1/65536. It uses torch's default generator, so seeding and the RNG state saved in
checkpoints work unchanged. Other devices use torch's fused dropout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_INT16_RANGE = 65536


def dropout_mask(shape: tuple[int, ...], p: float, like: torch.Tensor) -> torch.Tensor:
    """Inverted-dropout multiplier of ``shape`` (0 with probability p, else 1/(1-p)) in ``like``'s
    dtype and device; a shape with size-1 axes gives noise shared along them (Dropout1d/2d)."""
    if like.device.type != "cpu":
        return F.dropout(torch.ones(shape, dtype=like.dtype, device=like.device), p, True)
    n = math.prod(shape)
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64)
    uniform16 = words.view(torch.int16)[:n].view(shape)
    keep = uniform16 >= int(round(p * _INT16_RANGE)) - _INT16_RANGE // 2
    return keep.to(like.dtype) * (1.0 / (1.0 - p))


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Zero each element with probability p (to 1/65536), scale the rest by 1/(1-p)."""
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * dropout_mask(tuple(x.shape), p, x)


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout`` that draws its mask with :func:`fast_dropout` on CPU (module docstring: why)."""

    def __init__(self, p: float) -> None:
        """Raises ValueError for ``p`` outside [0, 1)."""
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Identity in eval mode or at p = 0, else :func:`fast_dropout`; any shape."""
        if not self.training or self.p == 0.0:
            return x
        return fast_dropout(x, self.p)

    def extra_repr(self) -> str:
        """Shown by ``print(module)``, like ``nn.Dropout``."""
        return f"p={self.p}"
