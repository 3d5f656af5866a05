"""The training loop's counters: the step, early stopping's patience and the statistics summed
since the last progress line.

Kept apart from the loop because a checkpoint carries them (``train_state``: ``step``,
``early_stopping``, ``pending``) and a resume puts them back, so the loop (``trainer.py``) and the
checkpoint code (``checkpointing.py``) both read them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class EarlyStopping:
    """Patience on one validation metric (lower loss / higher BLEU is better); its counters are
    part of the training state so a resumed run stops where the uninterrupted one would."""

    metric: str
    patience: int
    best: Optional[float] = None
    bad: int = 0

    def update(self, value: float) -> bool:
        """Record a validation value; True when it is the best so far."""
        better = self.best is None or (value > self.best if self.metric == "bleu" else value < self.best)
        if better:
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        return better

    @property
    def stop(self) -> bool:
        """Whether ``patience`` validations in a row brought no improvement (0 = never stop)."""
        return self.patience > 0 and self.bad >= self.patience


@dataclass
class StepStats:
    """Statistics summed since the last report. A statistic given as a tensor is summed on its
    device in float64 (exactly the float sums of reading it every step) and read only by
    :meth:`floats`, once per progress line: a GPU step never waits for the host on its account."""

    values: dict = field(default_factory=dict)
    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, stats: dict) -> None:
        """Accumulate one step's loss statistics (sums, so the report divides once)."""
        for k, v in stats.items():
            v = v.detach().to(torch.float64) if isinstance(v, torch.Tensor) else float(v)
            self.values[k] = self.values.get(k, 0.0) + v

    def floats(self) -> dict[str, float]:
        """The sums as Python floats (reads the device once for all of them)."""
        keys = [k for k, v in self.values.items() if isinstance(v, torch.Tensor)]
        read = torch.stack([self.values[k] for k in keys]).tolist() if keys else []
        return {**self.values, **dict(zip(keys, read))}


@dataclass
class Progress:
    """Where the loop stands: optimizer steps done, the step of the checkpoint last written or
    resumed (None before either; a signal saves only when it differs from ``step``), early
    stopping and the statistics not yet reported."""

    early: EarlyStopping
    step: int = 0
    saved_step: Optional[int] = None
    pending: StepStats = field(default_factory=StepStats)

    def finished_reason(self, max_steps: int, max_epochs: int) -> str:
        """Which limit a run that is at its end reached, for the "nothing to do" warning."""
        if self.early.stop and self.step < max_steps:
            return (
                f"early stopping: no improvement in {self.early.bad} validations "
                f"(train.early_stopping={self.early.patience})"
            )
        return f"train.max_steps={max_steps}" if self.step >= max_steps else f"train.max_epochs={max_epochs}"
