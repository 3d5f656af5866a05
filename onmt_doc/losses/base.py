"""The loss interface.

A loss returns a *sum* over target tokens (or whatever it counts) and a dict of summed statistics;
the trainer divides by the number of target tokens of the whole optimizer step (over accumulation
and ranks), so every loss is normalised the same way and distributed training equals one process.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from onmt_doc.config import LossConfig
from onmt_doc.data.batching import Batch
from onmt_doc.data.instances import Example

if TYPE_CHECKING:
    from onmt_doc.models.model import ModelOut


class Loss:
    """Subclasses implement ``__call__``; extra statistics use "group/name" keys."""

    training_only = False   # skipped in validation (e.g. regularisers)

    def __init__(self, cfg: LossConfig, **context):
        self.cfg = cfg
        self.weight = cfg.weight

    def prepare(self, examples: Sequence[Example], docs: Sequence) -> None:
        """Attach what the loss reads from ``Batch.extra`` to the training examples (their
        ``extra`` arrays, aligned with the target); ``docs`` are the tokenized documents they come
        from. Called once, before training; default: nothing."""

    def __call__(self, out: "ModelOut", batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:  # pragma: no cover
        raise NotImplementedError


def build_losses(cfgs: Sequence[LossConfig], **context) -> list[Loss]:
    from onmt_doc.losses import REGISTRY
    return [REGISTRY.build(c, **context) for c in cfgs]
