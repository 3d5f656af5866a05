"""Learning-rate schedules against their formulas, written out here independently of the code."""

from __future__ import annotations

import math

import pytest

from onmt_doc.config import config_from_dict
from onmt_doc.optim.schedules import build_schedule

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

STEPS = [1, 2, 3, 50, 99, 100, 101, 250, 400, 999, 1000]


def schedule(section: dict, d_model: int = 64, max_steps: int = 1000):
    cfg = config_from_dict(
        {
            "model": {"d_model": d_model, "encoder": {"heads": 4}, "decoder": {"heads": 4}},
            "optim": {"schedule": section},
            "train": {"max_steps": max_steps},
        }
    )
    return build_schedule(cfg.optim.schedule, cfg.model.d_model, cfg.train.max_steps)


def test_inverse_sqrt_warms_up_linearly_then_decays_with_the_inverse_square_root():
    s = schedule({"type": "inverse_sqrt", "warmup": 100})
    for step in STEPS:
        expected = step / 100 if step <= 100 else (100 / step) ** 0.5
        assert s.factor(step) == pytest.approx(expected, rel=1e-12), step
    assert s.factor(100) == pytest.approx(1.0)  # the peak is optim.lr at warmup
    assert s.factor(400) == pytest.approx(0.5)


def test_noam_matches_vaswani_et_al():
    d_model, warmup = 64, 100
    s = schedule({"type": "noam", "warmup": warmup}, d_model=d_model)
    for step in STEPS:
        expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert s.factor(step) == pytest.approx(expected, rel=1e-12), step
    # the peak: 1 / sqrt(d_model * warmup) at the warmup step (docs/config.md)
    assert s.factor(warmup) == pytest.approx(1 / math.sqrt(d_model * warmup))
    assert max(s.factor(t) for t in range(1, 1000)) == pytest.approx(s.factor(warmup))


def test_linear_decay_reaches_min_factor_at_max_steps():
    s = schedule({"type": "linear_decay", "warmup": 100, "min_factor": 0.1}, max_steps=1000)
    for step in STEPS:
        if step < 100:
            expected = step / 100
        else:  # a straight line from (100, 1.0) to (1000, 0.1)
            expected = 1.0 + (0.1 - 1.0) * (step - 100) / (1000 - 100)
        assert s.factor(step) == pytest.approx(expected, rel=1e-12), step
    assert s.factor(1000) == pytest.approx(0.1) and s.factor(5000) == pytest.approx(0.1)
    assert s.factor(550) == pytest.approx(0.55)


def test_constant_after_warmup_and_warmup_one_is_constant_from_the_start():
    s = schedule({"type": "constant", "warmup": 10})
    assert [s.factor(t) for t in (1, 5, 10, 11, 1000)] == pytest.approx([0.1, 0.5, 1.0, 1.0, 1.0])
    flat = schedule({"type": "constant", "warmup": 1})
    assert {flat.factor(t) for t in STEPS} == {1.0}


@pytest.mark.parametrize("kind", ["inverse_sqrt", "noam", "linear_decay", "constant"])
def test_warmup_zero_does_not_divide_by_zero(kind):
    s = schedule({"type": kind, "warmup": 0})
    assert all(math.isfinite(s.factor(t)) and s.factor(t) >= 0 for t in STEPS)
    assert s.factor(1) > 0


def test_trainer_sets_every_group_lr_to_lr_times_scale_times_factor(trained_run, toy_dir, tmp_path):
    """The trainer, not only the schedule: after step k the optimizer used optim.lr × lr_scale ×
    factor(k) in each parameter group (the initialised group of a fine-tuning run at its scale)."""
    from conftest import init_from_run, make_trainer, tiny_config

    init_from_run(trained_run, tmp_path / "run")  # reuse its vocabulary (no BPE learning)
    cfg = tiny_config(
        toy_dir,
        tmp_path / "run",
        data={"cache_dir": str(trained_run / "cache")},
        optim={"type": "adam", "lr": 2.0e-3, "schedule": {"type": "inverse_sqrt", "warmup": 4}},
    )
    trainer = make_trainer(cfg)
    trainer.optimizer.param_groups[0]["lr_scale"] = 0.25  # as init_lr_scale gives a group
    batches = iter(trainer.sampler)
    seen = []
    for k in range(1, 7):
        trainer.train_step([next(batches)])
        seen.append(trainer.optimizer.param_groups[0]["lr"])
    expected = [2.0e-3 * 0.25 * (k / 4 if k <= 4 else (4 / k) ** 0.5) for k in range(1, 7)]
    assert seen == pytest.approx(expected, rel=1e-12)
