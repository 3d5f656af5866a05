"""Single-shot gradient-based scaling (Reformer paper, eqs. 7-11): the solver on synthetic losses
and the paper's own numbers, the variant configs, and tools/scale_model.py's contract."""

from __future__ import annotations

import sys

import pytest
import yaml
from conftest import REPO, run_cli, write_config
from test_cli import assert_one_line_error

from onmt_doc.config import config_from_dict, load_config
from onmt_doc.errors import UserError
from onmt_doc.models.depth_width_scaling import layer_units, plan_scaling, scaled_config, solve_step, variant_overrides

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

FAST = {
    "d_model": 256,
    "encoder": {"type": "transformer", "layers": 3, "heads": 4, "ff": 1024},
    "decoder": {"type": "reformer", "layers": 2, "heads": 4, "ff": 1024},
}
TOOL = [sys.executable, str(REPO / "tools" / "scale_model.py")]


def synthetic_loss(layers: float, width: float) -> float:
    """A validation loss that falls 0.03 per layer and 0.01 per unit of width."""
    return 4.0 - 0.03 * layers - 0.01 * width


def test_step_reaches_the_parameter_ratio_along_the_gradient():
    layers, w = 6, 4
    losses = (synthetic_loss(layers, w), synthetic_loss(layers + 1, w), synthetic_loss(layers, w + 1))
    plan = plan_scaling(layers, 4 * 256, 256, losses, epsilon=1, beta=2.0)
    assert plan.grad_layers == pytest.approx(0.03) and plan.grad_width == pytest.approx(0.01)
    new_l, new_w = layers + plan.alpha * 0.03, w + plan.alpha * 0.01
    assert layer_units(new_l, new_w) == pytest.approx(2.0 * layer_units(layers, w))  # eq. 11
    # by hand: (6 + 0.03α)(12 + 0.02α) = 2·6·12, i.e. 0.0006α² + 0.48α − 72 = 0
    alpha = (-(0.36 + 0.12) + ((0.36 + 0.12) ** 2 + 4 * 0.0006 * 72) ** 0.5) / (2 * 0.0006)
    assert plan.alpha == pytest.approx(alpha)


def test_paper_gradients_give_two_more_layers_and_half_more_width():
    """The paper: L'_l = 0.01063, L'_w = 0.01069 (ε = 1), β = 2 on a 5-layer Reformer-fast with
    w = 4 -> 'adding 2 layers and 1/2 hidden size'."""
    base = 3.0
    losses = (base, base - 0.01063, base - 0.01069)
    plan = plan_scaling(5, 1024, 256, losses, epsilon=1, beta=2.0)
    assert plan.new_layers == 7
    assert 1.45 < plan.new_ff / 1024 < 1.65
    assert 1.8 < plan.achieved_beta < 2.2


def test_only_depth_grows_when_width_does_not_help():
    alpha = solve_step(4, 4.0, 0.02, 0.0, beta=1.5)
    assert 4 + alpha * 0.02 == pytest.approx(6.0)


def test_no_helpful_direction_is_a_user_error():
    with pytest.raises(UserError, match="no scaling reaches"):
        solve_step(4, 4.0, -0.02, -0.01, beta=2.0)
    with pytest.raises(UserError, match="-beta"):
        solve_step(4, 4.0, 0.02, 0.01, beta=1.0)


def test_variants_and_scaled_config_move_the_prenet_with_the_decoder():
    cfg = config_from_dict({"model": FAST})
    assert variant_overrides(cfg, 1, "layers") == ["model.decoder.layers=3", "model.encoder.layers=4"]
    assert variant_overrides(cfg, 1, "width") == ["model.decoder.ff=1280", "model.encoder.ff=1280"]
    plan = plan_scaling(2, 1024, 256, (3.0, 2.97, 2.99), epsilon=1, beta=2.0)
    raw = scaled_config(cfg, plan)
    assert raw["model"]["decoder"]["layers"] == plan.new_layers
    assert raw["model"]["encoder"]["layers"] == 3 + plan.new_layers - 2
    assert raw["model"]["decoder"]["ff"] == raw["model"]["encoder"]["ff"] == plan.new_ff
    config_from_dict(raw)


def test_tool_writes_a_loadable_scaled_config(tmp_path):
    path = write_config({"model": FAST, "log": {"dir": str(tmp_path / "run")}}, tmp_path / "fast.yaml")
    out = tmp_path / "scaled.yaml"
    proc = run_cli(
        *TOOL,
        "-config",
        str(path),
        "-beta",
        "2",
        "-losses",
        "3.0,2.98937,2.98931",
        "-output",
        str(out),
        "model.decoder.layers=5",
        "model.encoder.layers=5",
    )
    assert proc.returncode == 0, proc.stderr
    scaled = load_config(str(out))
    assert scaled.model.decoder.layers == scaled.model.encoder.layers == 7
    assert "layers 5 -> 7" in proc.stderr
    assert yaml.safe_load(out.read_text())["model"]["decoder"]["type"] == "reformer"


def test_tool_errors_are_one_line(tmp_path):
    path = write_config({"model": FAST}, tmp_path / "fast.yaml")
    out = str(tmp_path / "o.yaml")
    assert_one_line_error(run_cli(*TOOL, "-config", str(path), "-losses", "3.0,2.9", "-output", out), "-losses")
    assert_one_line_error(
        run_cli(*TOOL, "-config", str(path), "-losses", "3.0,3.1,3.2", "-output", out), "no scaling reaches"
    )
    assert_one_line_error(
        run_cli(
            *TOOL,
            "-config",
            str(path),
            "model.decoder.layerz=2",
            "-losses",
            "3,2,2",
            "-output",
            str(tmp_path / "o.yaml"),
        ),
        "model.decoder.layerz",
    )
