"""Single-shot gradient-based model scaling (Li et al., 2020, "Toward Optimal Model Scaling").

Depth l (layers) and width w (FFN size / d_model) are scaled along the finite-difference gradient
of the validation loss, with a step chosen so that the parameter count grows by a given ratio β.
Used by ``onmt_doc_scale_model``; the maths here is tested on synthetic losses.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Optional

from onmt_doc.config import Config, config_to_dict
from onmt_doc.errors import ConfigError, UserError


def layer_units(layers: float, width: float) -> float:
    """eq. 8: P(l, w) = 2l(4 + 2w), parameters in units of e² (biases, norms, embeddings left out)."""
    return 2 * layers * (4 + 2 * width)


def loss_gradient(base_loss: float, scaled_loss: float, epsilon: float) -> float:
    """eq. 10 for the loss *decrease* (eq. 9 maximises performance; we measure cross entropy):
    L' ≈ (loss(x) − loss(x + ε)) / ε, positive when growing x helps."""
    return (base_loss - scaled_loss) / epsilon


def solve_step(layers: float, width: float, grad_layers: float, grad_width: float, beta: float) -> float:
    """eq. 11: the step α > 0 with P(l + α L'_l, w + α L'_w) = β P(l, w).

    With a = L'_l, b = L'_w, c = 4 + 2w, eq. 8 makes this 2ab α² + (ac + 2lb) α + lc(1 − β) = 0.
    """
    if beta <= 1.0:
        raise UserError(f"-beta must be above 1 (the parameter ratio to grow to), got {beta}")
    a, b, c = grad_layers, grad_width, 4 + 2 * width
    quad, lin, const = 2 * a * b, a * c + 2 * layers * b, layers * c * (1 - beta)
    if abs(quad) < 1e-15:
        roots = [-const / lin] if abs(lin) > 1e-15 else []
    else:
        disc = lin * lin - 4 * quad * const
        roots = [] if disc < 0 else [(-lin + sign * math.sqrt(disc)) / (2 * quad) for sign in (1, -1)]
    positive = [r for r in roots if r > 0 and layers + r * a > 0 and width + r * b > 0]
    if not positive:
        raise UserError(
            f"no scaling reaches β = {beta} along the measured gradient (L'_l = {a:.4g}, "
            f"L'_w = {b:.4g}): neither more depth nor more width lowered the validation loss"
        )
    return min(positive)


@dataclass
class ScalingPlan:
    """The outcome of one scaling step: the measured gradients, the eq. 11 step α and the new
    depth and FFN size rounded to what a config can hold."""

    layers: int  # current l
    width: float  # current w = ff / d_model
    grad_layers: float  # L'_l
    grad_width: float  # L'_w
    alpha: float  # eq. 11 step
    new_layers: int  # l̂ rounded to a whole layer
    new_ff: int  # ŵ · d_model rounded to ``ff_multiple``
    beta: float  # requested ratio
    achieved_beta: float  # eq. 8 ratio after rounding
    ff_multiple: int = 8  # FFN sizes are rounded to this

    def summary(self) -> str:
        """One line for the console: gradients, α, old -> new depth/width and the parameter ratio."""
        return (
            f"L'_l = {self.grad_layers:.5f}, L'_w = {self.grad_width:.5f}, alpha = {self.alpha:.4g}: "
            f"layers {self.layers} -> {self.new_layers}, w {self.width:g} -> "
            f"{self.width + self.alpha * self.grad_width:.3f} (ff {self.new_ff}), "
            f"parameters x{self.achieved_beta:.2f} (asked x{self.beta:g})"
        )


def plan_scaling(
    layers: int,
    ff: int,
    d_model: int,
    losses: tuple[float, float, float],
    epsilon: float,
    beta: float,
    ff_multiple: int = 8,
) -> ScalingPlan:
    """From the validation losses of (base, l + ε, w + ε) to the scaled depth and FFN size."""
    if epsilon <= 0:
        raise UserError(f"-epsilon must be positive, got {epsilon}")
    width = ff / d_model
    base, deeper, wider = losses
    g_l, g_w = loss_gradient(base, deeper, epsilon), loss_gradient(base, wider, epsilon)
    alpha = solve_step(layers, width, g_l, g_w, beta)
    new_layers = max(1, round(layers + alpha * g_l))
    new_ff = max(ff_multiple, ff_multiple * round((width + alpha * g_w) * d_model / ff_multiple))
    achieved = layer_units(new_layers, new_ff / d_model) / layer_units(layers, width)
    return ScalingPlan(layers, width, g_l, g_w, alpha, new_layers, new_ff, beta, achieved, ff_multiple)


# ----------------------------------------------------------------------------- configs


def scaled_parts(cfg: Config) -> list[str]:
    """The model parts whose depth and width are scaled: the decoder, and the encoder when it has
    layers (Reformer-fast's PreNet shares the decoder's hyper-parameters)."""
    parts = [p for p in ("decoder", "encoder") if hasattr(getattr(cfg.model, p), "layers")]
    if "decoder" not in parts or not hasattr(cfg.model.decoder, "ff"):
        raise ConfigError(f"model.decoder ({cfg.model.decoder.type}) has no 'layers' and 'ff' to scale")
    return parts


def variant_overrides(cfg: Config, epsilon: int, which: str) -> list[str]:
    """Dotted overrides for the l + ε ('layers') or w + ε ('width') variant of every scaled part."""
    out = []
    for p in scaled_parts(cfg):
        section = getattr(cfg.model, p)
        if which == "layers":
            out.append(f"model.{p}.layers={section.layers + epsilon}")
        elif hasattr(section, "ff"):
            out.append(f"model.{p}.ff={section.ff + epsilon * cfg.model.d_model}")
    return out


def scaled_config(cfg: Config, plan: ScalingPlan) -> dict:
    """The resolved config with every scaled part moved by the plan's layer and FFN increments."""
    raw = copy.deepcopy(config_to_dict(cfg))
    extra_layers = plan.new_layers - plan.layers
    ff_ratio = plan.new_ff / (plan.width * cfg.model.d_model)
    for p in scaled_parts(cfg):
        section = raw["model"][p]
        section["layers"] = max(1, section["layers"] + extra_layers)
        if "ff" in section:
            m = plan.ff_multiple
            section["ff"] = plan.new_ff if p == "decoder" else max(m, m * round(section["ff"] * ff_ratio / m))
    return raw


def measure_losses(
    cfg_for: Callable[[str, list[str]], Config], cfg: Config, epsilon: int, run: Callable[[Config], dict]
) -> tuple[float, float, float]:
    """Validation losses of base, l + ε, w + ε. ``cfg_for(name, overrides)`` gives a variant's
    short-budget config, ``run`` trains it and returns its final metrics (the trainer's ``train``)."""
    losses = []
    for name, overrides in (
        ("base", []),
        ("deeper", variant_overrides(cfg, epsilon, "layers")),
        ("wider", variant_overrides(cfg, epsilon, "width")),
    ):
        metrics = run(cfg_for(name, overrides))
        if "loss" not in metrics:
            raise ConfigError("the short runs need validation data (data.valid) to measure their loss")
        losses.append(float(metrics["loss"]))
    return losses[0], losses[1], losses[2]


def parse_losses(text: Optional[str]) -> Optional[tuple[float, float, float]]:
    """``-losses BASE,DEEPER,WIDER`` as three floats (None when not given); raises UserError otherwise."""
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise UserError(f"-losses must be three numbers BASE,DEEPER,WIDER (validation losses), got '{text}'")
    return values  # type: ignore[return-value]
