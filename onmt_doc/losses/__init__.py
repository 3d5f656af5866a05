"""Losses: ``loss(model_out, batch) -> (summed loss, stats)``; the ``loss:`` list sums them with weights."""

from onmt_doc.registry import Registry

REGISTRY = Registry("loss")

from onmt_doc.losses.base import Loss, build_losses, loss_fields  # noqa: E402
from onmt_doc.losses import label_smoothing  # noqa: E402,F401
from onmt_doc.losses import gate_hinge  # noqa: E402,F401

__all__ = ["REGISTRY", "Loss", "build_losses", "loss_fields"]
