"""Learning-rate schedules: a factor of the step, multiplied into ``optim.lr × lr_scale``.

A schedule is a pure function of the step, so resuming needs only the step counter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onmt_doc.config.options import PartConfig, option
from onmt_doc.registry import Registry

REGISTRY = Registry("schedule")


@dataclass
class WarmupConfig(PartConfig):
    """Keys of a schedule with linear warmup (``optim.schedule``)."""

    warmup: int = option(4000, "warmup steps; the schedule peaks at this step", minimum=0)


@dataclass
class LinearDecayConfig(WarmupConfig):
    """Warmup keys plus the factor reached at the last step."""

    min_factor: float = option(0.0, "factor reached at `train.max_steps`; at least 0", minimum=0)


class Schedule:
    """Base of learning-rate schedules: :meth:`factor` is a pure function of the step."""

    def __init__(self, cfg: PartConfig, d_model: int, max_steps: int) -> None:
        """``d_model`` (for ``noam``) and ``max_steps`` (for ``linear_decay``) come from the run's config."""
        self.cfg, self.d_model, self.max_steps = cfg, d_model, max_steps

    def factor(self, step: int) -> float:  # pragma: no cover - interface
        """The multiplier of ``optim.lr × lr_scale`` at ``step`` (1-based; step 0 is read as 1)."""
        raise NotImplementedError


@REGISTRY.register("inverse_sqrt", WarmupConfig)
class InverseSqrt(Schedule):
    """Linear warmup to optim.lr, then lr · sqrt(warmup / step)."""

    def factor(self, step: int) -> float:
        """Linear warmup to 1, then ``sqrt(warmup / step)``."""
        step, w = max(step, 1), max(self.cfg.warmup, 1)
        return step / w if step < w else math.sqrt(w / step)


@REGISTRY.register("noam", WarmupConfig)
class Noam(Schedule):
    """Vaswani et al. (2017): optim.lr · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)."""

    def factor(self, step: int) -> float:
        """``d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)`` (Vaswani et al., 2017, eq. 3)."""
        step, w = max(step, 1), max(self.cfg.warmup, 1)
        return self.d_model**-0.5 * min(step**-0.5, step * w**-1.5)


@REGISTRY.register("linear_decay", LinearDecayConfig)
class LinearDecay(Schedule):
    """Linear warmup, then linear decay to ``min_factor`` at train.max_steps."""

    def factor(self, step: int) -> float:
        """``step / warmup`` during warmup, then linear from 1 to ``min_factor`` at ``max_steps``."""
        step, w = max(step, 1), max(self.cfg.warmup, 1)
        if step < w:
            return step / w
        frac = min(1.0, (step - w) / max(1, self.max_steps - w))
        return 1.0 - (1.0 - self.cfg.min_factor) * frac


@REGISTRY.register("constant", WarmupConfig)
class Constant(Schedule):
    """Linear warmup, then constant."""

    def factor(self, step: int) -> float:
        """``min(1, step / warmup)``."""
        return min(1.0, max(step, 1) / max(self.cfg.warmup, 1))


def build_schedule(cfg: PartConfig, d_model: int, max_steps: int) -> Schedule:
    """Build the schedule named by ``cfg.type``."""
    return REGISTRY.build(cfg, d_model, max_steps)
