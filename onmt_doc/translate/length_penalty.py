"""Length penalties: what a finished hypothesis' log-probability is divided by.

Log-probabilities only fall as a hypothesis grows, so ranking finished hypotheses by their raw sum
favours short outputs; a length penalty divides the sum by a growing function of the length
(counting ``<eos>``). It is its own piece so a search can take any of them
(``translate.length_penalty_type``, the :data:`PENALTIES` registry, ``registry_for("length_penalty")``):
GNMT's ``((5 + |Y|) / 6)^α`` (Wu et al., 2016; α = ``translate.length_penalty``), OpenNMT-py's
``avg`` (mean log-probability per token) or none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from onmt_doc.config.translate import TranslateConfig
from onmt_doc.errors import ConfigError
from onmt_doc.registry import Registry


class LengthPenalty(Protocol):
    """Maps hypothesis lengths (tokens, ``<eos>`` counted) to the divisor of their log-probability."""

    def __call__(self, length: torch.Tensor) -> torch.Tensor:
        """Divisors, same shape as ``length``, so a search can apply any penalty to a whole beam at once."""

    @classmethod
    def of(cls, alpha: float) -> "LengthPenalty":
        """The penalty for ``translate.length_penalty`` = ``alpha`` (which only some penalties use)."""


# the penalties by name (translate.length_penalty_type); registry_for("length_penalty") reads REGISTRY
PENALTIES = REGISTRY = Registry("length penalty")


@PENALTIES.register("gnmt", TranslateConfig)
@dataclass(frozen=True)
class GNMTPenalty:
    """GNMT (Wu et al., 2016): ``((5 + |Y|) / 6)^alpha``; alpha = 0 is no penalty."""

    alpha: float = 1.0

    @classmethod
    def of(cls, alpha: float) -> "GNMTPenalty":
        """See :meth:`LengthPenalty.of`."""
        return cls(alpha)

    def __call__(self, length: torch.Tensor) -> torch.Tensor:
        """``((5 + length) / 6)^alpha``; alpha = 0 skips the power so the divisor is exactly 1."""
        return ((5.0 + length) / 6.0) ** self.alpha if self.alpha else torch.ones_like(length)


@PENALTIES.register("avg", TranslateConfig)
@dataclass(frozen=True)
class AveragePenalty:
    """OpenNMT-py's ``avg``: ``|Y|``, so scores are mean log-probabilities per token."""

    @classmethod
    def of(cls, alpha: float) -> "AveragePenalty":
        """See :meth:`LengthPenalty.of`: ``alpha`` is not used."""
        return cls()

    def __call__(self, length: torch.Tensor) -> torch.Tensor:
        """The lengths themselves (a copy: callers may divide in place)."""
        return length.clone()


@PENALTIES.register("none", TranslateConfig)
@dataclass(frozen=True)
class NoPenalty:
    """Raw log-probabilities (divisor 1)."""

    @classmethod
    def of(cls, alpha: float) -> "NoPenalty":
        """See :meth:`LengthPenalty.of`: ``alpha`` is not used."""
        return cls()

    def __call__(self, length: torch.Tensor) -> torch.Tensor:
        """Ones, so the ranking is by the raw log-probability sum."""
        return torch.ones_like(length)


def build_length_penalty(kind: str, alpha: float = 1.0) -> LengthPenalty:
    """The penalty named by ``translate.length_penalty_type``; ``alpha`` is used by ``gnmt`` only.
    An unknown ``kind`` (which the config loader refuses first) is a ValueError with the closest name."""
    try:
        entry = PENALTIES.get(kind, "translate.length_penalty_type")
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return entry.cls.of(alpha)
