"""Hinge regulariser of context gates towards PMI supervision z* (Li et al., 2020, eq. 5).

``λ Σ_{l,i} [z*_i max(0.5 − z_il, 0) + (1 − z*_i) max(z_il − 0.5, 0)]``: a gate dimension costs
nothing once it is on the side of 0.5 that z* names. The vector term is averaged over the D gate
dimensions (so λ does not depend on d_model) and summed over the regularised layers (``layers``,
default all; the paper's table 5 regularises single layers) and target tokens; like every loss it
is a sum the trainer divides by the step's target tokens. Tokens without supervision
(markup ``<s>``/``</s>``, ``<eos>``, padding) add nothing. Training only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from onmt_doc.config import Config
from onmt_doc.config.options import LossConfig, option
from onmt_doc.contracts import Batch, ModelOut
from onmt_doc.data.pmi import Z_STAR, Normaliser
from onmt_doc.errors import ConfigError
from onmt_doc.losses.base import REGISTRY, Loss


@dataclass
class PMIGateHingeConfig(LossConfig):
    """``loss`` entry keys of ``type: pmi_gate_hinge``; ``validate`` checks ``layers`` against the decoder."""

    weight: float = option(1.0, "λ of eq. 5; at least 0", minimum=0)
    table: Optional[str] = option(
        None,
        "PMI table built with `onmt_doc_build_pmi_table` with this run's "
        "vocabularies; override with `loss.1.table=PATH`",
        shown="(required)",
    )
    normaliser: Normaliser = option(
        "shared",
        "Z of eq. 6 for z*: `shared` = one Z for the bilingual and monolingual PMI (log Z cancels in "
        "eq. 7); `per_scenario` = each scenario its own Z (adds log(Z_bi/Z_mono) ≈ log 2 to every bilingual PMI: "
        "z* = 1 for 94% instead of 81% of Multi30k's target tokens). The table holds counts only; cached z* "
        "records its normaliser",
    )
    layers: list[int] = option(
        [],
        "decoder layers (from 1) whose gates are regularised, e.g. `[1]` for table 5's "
        "single-layer rows; empty = all layers",
    )

    def validate(self, path: str, root: Config) -> None:
        """Layer numbers index the decoder's gates: each once, from 1 to model.decoder.layers."""
        if any(i < 1 for i in self.layers) or len(set(self.layers)) != len(self.layers):
            raise ConfigError(f"{path}.layers: must list distinct layer numbers from 1, got {self.layers}")
        n_layers = getattr(root.model.decoder, "layers", None)
        if isinstance(n_layers, int) and self.layers and max(self.layers) > n_layers:
            raise ConfigError(f"{path}.layers: names layer {max(self.layers)}, model.decoder.layers is {n_layers}")


def select_layers(gates: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """The gates [L, B, T, D] of the 1-based ``layers`` (all when empty)."""
    if not layers:
        return gates
    if min(layers) < 1 or max(layers) > gates.size(0):
        bad = min(layers) if min(layers) < 1 else max(layers)
        raise ConfigError(f"loss pmi_gate_hinge: key 'layers' names layer {bad}, the decoder has {gates.size(0)}")
    return gates[[i - 1 for i in layers]]


def gate_hinge(gates: torch.Tensor, z_star: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token hinge [B, T] (eq. 5: summed over layers, averaged over dimensions) and the
    per-token fraction of gate values on the wrong side, for gates [L, B, T, D]."""
    target = z_star.to(gates.dtype)[None, :, :, None]
    hinge = target * (0.5 - gates).clamp(min=0) + (1 - target) * (gates - 0.5).clamp(min=0)  # eq. 5
    keep = mask.to(gates.dtype)
    wrong = (hinge > 0).to(gates.dtype).mean((0, 3))
    return hinge.mean(3).sum(0) * keep, wrong * keep


@REGISTRY.register("pmi_gate_hinge", PMIGateHingeConfig)
class PMIGateHinge(Loss):
    """Stats (per target token in the logs): gate/hinge, gate/wrong (gate values on the wrong
    side, averaged over layers and dimensions, summed over supervised tokens), gate/labeled
    (supervised tokens) and gate/source (tokens with z* = 1)."""

    training_only = True
    needs_fields = (Z_STAR,)  # the data pipeline attaches z* (onmt_doc/pmi.py, read from `table`, `normaliser`)

    def __call__(self, out: ModelOut, batch: Batch) -> tuple[torch.Tensor, dict]:
        """Eq. 5 summed over regularised layers and supervised tokens; raises ConfigError when the
        decoder has no vector gates or the batch no z*. Statistics stay on the device."""
        gates = out.aux.get("gates")
        if gates is None:
            raise ConfigError(
                "loss pmi_gate_hinge needs a decoder with context gates "
                "(model.decoder.type: gated_transformer with gate: vector)"
            )
        if "z_star" not in batch.extra:
            raise ConfigError("loss pmi_gate_hinge: the batch has no z* (training data without the z_star field)")
        mask = batch.extra["z_star_mask"]
        hinge, wrong = gate_hinge(select_layers(gates.float(), self.cfg.layers), batch.extra["z_star"], mask)
        return hinge.sum(), {
            "gate/hinge": hinge.detach().sum(),
            "gate/wrong": wrong.detach().sum(),
            "gate/labeled": mask.sum(),
            "gate/source": batch.extra["z_star"].sum(),
        }
