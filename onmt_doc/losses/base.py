"""The loss interface.

A loss returns a *sum* over target tokens (or whatever it counts) and a dict of summed statistics;
the trainer divides by the number of target tokens of the whole optimizer step (over accumulation
and ranks), so every loss is normalised the same way and distributed training equals one process.
A loss gets only its own config section; per-token data it needs beyond the batch (e.g. z*) it
declares in ``needs_fields``, and the data pipeline attaches it (``onmt_doc/data/example_fields.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import torch

from onmt_doc.config.options import LossConfig
from onmt_doc.contracts import Batch, ModelOut
from onmt_doc.data.example_fields import FieldContext, FieldProvider, build_field
from onmt_doc.registry import Registry

# the losses by YAML name; each loss module registers itself here, and the package's
# __init__ imports them all (registry_for("loss") reads it there)
REGISTRY = Registry("loss")


class Loss:
    """Subclasses implement ``__call__``; extra statistics use "group/name" keys."""

    training_only = False  # skipped in validation (e.g. regularisers)
    needs_fields: ClassVar[tuple[str, ...]] = ()  # per-example fields it reads from Batch.extra

    def __init__(self, cfg: LossConfig, **context: Any) -> None:
        """``cfg``: the loss's own config section; ``context``: build-time objects the trainer passes by
        keyword (e.g. ``codec``), ignored by losses that do not need them."""
        self.cfg = cfg
        self.weight = cfg.weight

    def __call__(self, out: ModelOut, batch: Batch) -> tuple[torch.Tensor, dict]:  # pragma: no cover
        """The loss summed over what it counts, and summed statistics for the logs (the trainer divides
        both by the step's target tokens). A statistic is a float or a 0-dim tensor, which stays on
        the device: reading it (``.item()``) would make the host wait for the GPU every step, so the
        trainer sums tensors as they are and reads them once per progress line."""
        raise NotImplementedError


def build_losses(cfgs: Sequence[LossConfig], **context: Any) -> list[Loss]:
    """Build one loss per ``loss`` config entry; ``context`` is passed to each constructor."""

    return [REGISTRY.build(c, **context) for c in cfgs]


def loss_fields(losses: Sequence[Loss], ctx: FieldContext) -> tuple[list[FieldProvider], list[FieldProvider]]:
    """Providers of the fields ``losses`` ask for, for the training data and for the validation
    data (losses run there only); each is built from the asking loss's own section, whose keys say
    where the data comes from."""
    train, valid = [], []
    for loss in losses:
        for name in loss.needs_fields:
            provider = build_field(name, loss.cfg, ctx)
            train.append(provider)
            if not loss.training_only:
                valid.append(provider)
    return train, valid
