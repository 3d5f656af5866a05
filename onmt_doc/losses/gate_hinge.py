"""Hinge regulariser of context gates towards PMI supervision z* (Li et al., 2020, eq. 5).

``λ Σ_{l,i} [z*_i max(0.5 − z_il, 0) + (1 − z*_i) max(z_il − 0.5, 0)]``: a gate dimension costs
nothing once it is on the side of 0.5 that z* names. The vector term is averaged over the D gate
dimensions (so λ does not depend on d_model) and summed over layers and target tokens; like every
loss it is a sum the trainer divides by the step's target tokens. Tokens without supervision
(markup ``<s>``/``</s>``, ``<eos>``, padding) add nothing. Training only.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from onmt_doc.config import LossConfig
from onmt_doc.data.batching import Batch
from onmt_doc.errors import ConfigError
from onmt_doc.losses import REGISTRY
from onmt_doc.losses.base import Loss
from onmt_doc.pmi import PMITable, attach_z_star

log = logging.getLogger("onmt_doc")


@dataclass
class PMIGateHingeConfig(LossConfig):
    table: Optional[str] = None    # PMI table of the training corpus (tools/build_pmi_table.py)


def gate_hinge(gates: torch.Tensor, z_star: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token hinge [B, T] (eq. 5: summed over layers, averaged over dimensions) and the
    per-token fraction of gate values on the wrong side, for gates [L, B, T, D]."""
    target = z_star.to(gates.dtype)[None, :, :, None]
    hinge = target * (0.5 - gates).clamp(min=0) + (1 - target) * (gates - 0.5).clamp(min=0)   # eq. 5
    keep = mask.to(gates.dtype)
    wrong = (hinge > 0).to(gates.dtype).mean((0, 3))
    return hinge.mean(3).sum(0) * keep, wrong * keep


@REGISTRY.register("pmi_gate_hinge", PMIGateHingeConfig)
class PMIGateHinge(Loss):
    """Stats (per target token in the logs): gate/hinge, gate/wrong (gate values on the wrong
    side, averaged over layers and dimensions, summed over supervised tokens), gate/labeled
    (supervised tokens) and gate/source (tokens with z* = 1)."""

    training_only = True

    def __init__(self, cfg: PMIGateHingeConfig, codec=None, config=None, run_dir: Optional[str] = None, **context):
        super().__init__(cfg)
        if not cfg.table:
            raise ConfigError("loss pmi_gate_hinge: key 'table' is required (a PMI table built with "
                              "tools/build_pmi_table.py)")
        self.table = PMITable.load(cfg.table, codec)
        cache = config.data.cache_dir if config is not None else None
        self.cache_dir = cache or (os.path.join(run_dir, "cache") if run_dir else None)

    def prepare(self, examples: Sequence, docs: Sequence) -> None:
        attach_z_star(examples, docs, self.table, self.cache_dir)
        labeled = sum(int(e.extra["z_star_mask"].sum()) for e in examples)
        source = sum(int(e.extra["z_star"].sum()) for e in examples)
        log.info("pmi_gate_hinge: z* of %d target tokens, %.1f%% on the source side (z* = 1)",
                 labeled, 100.0 * source / max(labeled, 1))

    def __call__(self, out, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        gates = out.aux.get("gates")
        if gates is None:
            raise ConfigError("loss pmi_gate_hinge needs a decoder with context gates "
                              "(model.decoder.type: gated_transformer)")
        if "z_star" not in batch.extra:
            raise ConfigError("loss pmi_gate_hinge: the batch has no z* (training data not prepared by the loss)")
        mask = batch.extra["z_star_mask"]
        hinge, wrong = gate_hinge(gates.float(), batch.extra["z_star"], mask)
        return hinge.sum(), {"gate/hinge": hinge.detach().sum().item(), "gate/wrong": wrong.sum().item(),
                             "gate/labeled": float(mask.sum()), "gate/source": float(batch.extra["z_star"].sum())}
