"""Length penalties: what a finished hypothesis' log-probability is divided by.

Log-probabilities only fall as a hypothesis grows, so ranking finished hypotheses by their raw sum
favours short outputs; a length penalty divides the sum by a growing function of the length
(counting ``<eos>``). It is its own piece so a search can take any of them
(``translate.length_penalty_type``): GNMT's ``((5 + |Y|) / 6)^α`` (Wu et al., 2016; α =
``translate.length_penalty``), OpenNMT-py's ``avg`` (mean log-probability per token) or none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class LengthPenalty(Protocol):
    """Maps hypothesis lengths (tokens, ``<eos>`` counted) to the divisor of their log-probability."""

    def __call__(self, length: torch.Tensor) -> torch.Tensor:
        """Divisors, same shape as ``length``, so a search can apply any penalty to a whole beam at once."""


@dataclass(frozen=True)
class GNMTPenalty:
    """GNMT (Wu et al., 2016): ``((5 + |Y|) / 6)^alpha``; alpha = 0 is no penalty."""

    alpha: float = 1.0

    def __call__(self, length: torch.Tensor) -> torch.Tensor:
        """``((5 + length) / 6)^alpha``; alpha = 0 skips the power so the divisor is exactly 1."""
        return ((5.0 + length) / 6.0) ** self.alpha if self.alpha else torch.ones_like(length)


@dataclass(frozen=True)
class AveragePenalty:
    """OpenNMT-py's ``avg``: ``|Y|``, so scores are mean log-probabilities per token."""

    def __call__(self, length: torch.Tensor) -> torch.Tensor:
        """The lengths themselves (a copy: callers may divide in place)."""
        return length.clone()


@dataclass(frozen=True)
class NoPenalty:
    """Raw log-probabilities (divisor 1)."""

    def __call__(self, length: torch.Tensor) -> torch.Tensor:
        """Ones, so the ranking is by the raw log-probability sum."""
        return torch.ones_like(length)


PENALTY_TYPES = ("gnmt", "avg", "none")


def build_length_penalty(kind: str, alpha: float = 1.0) -> LengthPenalty:
    """The penalty named by ``translate.length_penalty_type``; ``alpha`` is used by ``gnmt`` only."""
    if kind == "gnmt":
        return GNMTPenalty(alpha)
    if kind == "avg":
        return AveragePenalty()
    if kind == "none":
        return NoPenalty()
    raise ValueError(f"unknown length penalty {kind!r}: expected one of {', '.join(PENALTY_TYPES)}")
