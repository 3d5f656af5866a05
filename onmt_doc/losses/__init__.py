"""Losses: ``loss(model_out, batch) -> (summed loss, stats)``; the ``loss:`` list sums them with weights."""

from onmt_doc.losses.base import REGISTRY, Loss, build_losses, loss_fields
from onmt_doc.losses import label_smoothing  # noqa: F401
from onmt_doc.losses import gate_hinge  # noqa: F401

__all__ = ["REGISTRY", "Loss", "build_losses", "loss_fields"]
