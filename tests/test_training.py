"""The trainer: learning, exact resume, TensorBoard scalars, distributed equivalence."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_config, write_config

from onmt_doc.config import config_from_dict
from onmt_doc.models.checkpoint import load_checkpoint
from onmt_doc.train.trainer import train

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)


def small_corpus(toy: Path, out: Path, lines: int = 120) -> Path:
    """The first ``lines`` lines of the toy training files (several epochs in a few steps)."""
    out.mkdir(parents=True, exist_ok=True)
    for ext in ("src", "tgt"):
        text = (toy / f"train.{ext}").read_text(encoding="utf-8").split("\n")[:lines]
        (out / f"train.{ext}").write_text("\n".join(text).strip("\n") + "\n", encoding="utf-8")
    return out


def test_tiny_transformer_learns_sentence_level_toy(toy_dir, tmp_path):
    """Bound: after 300 steps (~30 s on 2 cores) validation token accuracy > 90% and ppl < 1.6
    (an untrained model is at ~0% accuracy and ppl ~ vocabulary size)."""
    cfg = tiny_config(
        toy_dir, tmp_path / "run", train={"max_steps": 300, "valid_every": 300, "save_every": 300, "valid_bleu": True}
    )
    metrics = train(config_from_dict(cfg))
    assert metrics["acc"] > 90.0, metrics
    assert metrics["ppl"] < 1.6, metrics
    assert metrics["bleu"] > 70.0, metrics


def tb_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_resume_equals_straight_run(toy_dir, tmp_path):
    """2N steps straight == N steps, stop, resume, N steps: same losses and same parameters.

    Dropout is on (RNG state must be restored) and the small corpus makes the run cross epochs
    (data position must be restored).
    """
    data = small_corpus(toy_dir, tmp_path / "data")

    def cfg(run, steps):
        c = tiny_config(
            toy_dir,
            run,
            train={"max_steps": steps, "save_every": 6, "valid_every": 6, "batch_tokens": 400},
            log={"tensorboard": True, "every": 1},
        )
        c["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
        return config_from_dict(c)

    train(cfg(tmp_path / "straight", 12))
    train(cfg(tmp_path / "resumed", 6))
    train(cfg(tmp_path / "resumed", 12))
    a = load_checkpoint(str(tmp_path / "straight" / "checkpoints" / "last.pt"))
    b = load_checkpoint(str(tmp_path / "resumed" / "checkpoints" / "last.pt"))
    assert a["train_state"]["sampler"]["epoch"] >= 2  # the run crossed epochs
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    sa, sb = tb_scalars(tmp_path / "straight"), tb_scalars(tmp_path / "resumed")
    assert [s for s, _ in sb["train/loss"]] == list(range(1, 13))  # one continuous curve
    assert sa["train/loss"] == sb["train/loss"]


def test_tensorboard_has_documented_tags(trained_run, toy_dir, tmp_path):
    cfg = tiny_config(
        toy_dir,
        tmp_path / "tb",
        train={"max_steps": 4, "valid_every": 4, "valid_bleu": True},
        log={"tensorboard": True, "every": 2},
    )
    train(config_from_dict(cfg))
    tags = set(tb_scalars(tmp_path / "tb"))
    expected = {f"train/{k}" for k in ("loss", "ppl", "acc", "lr", "tok_per_s", "grad_norm")}
    expected |= {f"valid/{k}" for k in ("loss", "ppl", "acc", "bleu")}
    assert expected <= tags, expected - tags


def test_two_gloo_processes_equal_one_process_with_same_global_batch(toy_dir, tmp_path):
    """torchrun with 2 CPU processes (accum 1) == 1 process with accum 2, with the default
    optimizer setup (Adam, eps 1e-9, inverse_sqrt warmup, gradient clipping at 1.0).

    Same parameters after 4 steps, same loss and same (unclipped) gradient norm at every step.
    Adam and clipping are blind to a constant factor on the gradients, so the logged gradient
    norm is what catches a wrong loss scale across processes. Measured: bitwise equal (the
    all-reduce of two gradients sums the same two numbers as accumulation does).

    Dropout is 0 here: a rank draws its masks from its own stream (seed + rank), while one process
    draws both batches' masks from one stream, so with dropout the runs differ by design (the
    per-rank streams are checked by test_two_process_resume_equals_straight_run).
    """
    data = small_corpus(toy_dir, tmp_path / "data", lines=1000)  # no epoch end in 4 steps

    def cfg(run, accum):
        c = tiny_config(
            toy_dir,
            run,
            train={
                "max_steps": 4,
                "accum": accum,
                "batch_tokens": 300,
                "save_every": 4,
                "valid_every": 100,
                "threads": 1,
            },
            model={"dropout": 0.0},
            log={"tensorboard": True, "every": 1},
        )
        c["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
        c["optim"] = {"type": "adam", "lr": 2.0e-3, "schedule": {"type": "inverse_sqrt", "warmup": 100}}
        assert "max_grad_norm" not in c["train"] and "eps" not in c["optim"]  # the defaults
        return write_config(c, tmp_path / f"{run.name}.yaml")

    one = run_cli(sys.executable, "-m", "onmt_doc.bin.train", "-config", str(cfg(tmp_path / "one", 2)))
    assert one.returncode == 0, one.stderr
    two = run_cli(
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "onmt_doc.bin.train",
        "-config",
        str(cfg(tmp_path / "two", 1)),
    )
    assert two.returncode == 0, two.stderr
    assert "2 process(es)" in two.stderr
    a = load_checkpoint(str(tmp_path / "one" / "checkpoints" / "last.pt"))["model"]
    b = load_checkpoint(str(tmp_path / "two" / "checkpoints" / "last.pt"))["model"]
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=1e-6), (name, (a[name] - b[name]).abs().max())
    sa, sb = tb_scalars(tmp_path / "one"), tb_scalars(tmp_path / "two")
    for tag in ("train/loss", "train/grad_norm"):
        assert [s for s, _ in sa[tag]] == [s for s, _ in sb[tag]] == [1, 2, 3, 4], tag
        assert [v for _, v in sa[tag]] == pytest.approx([v for _, v in sb[tag]], rel=1e-6), tag
    assert max(v for _, v in sa["train/grad_norm"]) > 1.0  # clipping was active


def test_early_stopping_and_checkpoint_retention(toy_dir, tmp_path):
    """With a zero learning rate the validation loss cannot improve: training stops after
    `early_stopping` validations without improvement; keep_last bounds step_N.pt files."""
    cfg = tiny_config(
        toy_dir,
        tmp_path / "es",
        optim={"type": "sgd", "lr": 0.0, "schedule": {"type": "constant", "warmup": 1}},
        train={"max_steps": 50, "valid_every": 2, "save_every": 2, "early_stopping": 2, "keep_last": 2},
    )
    train(config_from_dict(cfg))
    ckpts = sorted(p.name for p in (tmp_path / "es" / "checkpoints").iterdir())
    # validations at steps 2 (best), 4 (bad 1), 6 (bad 2 -> stop)
    assert ckpts == ["best.pt", "last.pt", "step_4.pt", "step_6.pt"]
    assert load_checkpoint(str(tmp_path / "es" / "checkpoints" / "last.pt"))["step"] == 6
    assert load_checkpoint(str(tmp_path / "es" / "checkpoints" / "best.pt"))["step"] == 2


def test_max_epochs_ends_at_the_epoch_boundary_with_a_final_save(toy_dir, tmp_path):
    data = small_corpus(toy_dir, tmp_path / "data", lines=60)
    cfg = tiny_config(
        toy_dir,
        tmp_path / "ep",
        train={"max_steps": 1000, "max_epochs": 1, "batch_tokens": 300, "save_every": 1000, "valid_every": 1000},
    )
    cfg["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
    c = config_from_dict(cfg)
    from onmt_doc.train.distributed import DistContext
    from onmt_doc.train.trainer import Trainer

    trainer = Trainer(c, DistContext())
    per_epoch = len(trainer.sampler.epoch_batches(0))
    trainer.train()
    last = load_checkpoint(str(tmp_path / "ep" / "checkpoints" / "last.pt"))
    assert last["step"] == per_epoch
    assert last["train_state"]["sampler"] == {"epoch": 0, "position": per_epoch, "seed": 1}


def test_two_process_resume_equals_straight_run(toy_dir, tmp_path):
    """Under torchrun with dropout on, each rank's RNG stream is saved and restored."""
    data = small_corpus(toy_dir, tmp_path / "data", lines=1000)

    def cfg(run, steps):
        c = tiny_config(
            toy_dir,
            run,
            train={"max_steps": steps, "batch_tokens": 300, "save_every": 2, "valid_every": 100, "threads": 1},
        )
        c["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
        return str(write_config(c, tmp_path / f"{run.name}_{steps}.yaml"))

    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "onmt_doc.bin.train",
        "-config",
    ]
    for run, steps in (("straight", 4), ("resumed", 2), ("resumed", 4)):
        proc = run_cli(*torchrun, cfg(tmp_path / run, steps))
        assert proc.returncode == 0, proc.stderr
    a = load_checkpoint(str(tmp_path / "straight" / "checkpoints" / "last.pt"))
    b = load_checkpoint(str(tmp_path / "resumed" / "checkpoints" / "last.pt"))
    assert len(b["train_state"]["rng"]) == 2
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


FAST_CLOCK = """import os, time
if os.environ.get("RANK") == "1":  # this rank's clock runs four times as fast as the others'
    _real, _start = time.time, time.time()
    time.time = lambda: _start + 4 * (_real() - _start)
"""


def test_two_processes_end_at_the_same_step_when_max_minutes_runs_out(toy_dir, tmp_path):
    """Under torchrun ``train.max_minutes`` ends every rank at the same step, whatever each rank's clock
    says: rank 0's decides. Here rank 1's clock runs four times as fast (a ``sitecustomize`` on the
    workers' path: clocks that started apart do the same); when each rank read its own, rank 1 stopped
    first and rank 0 waited for it in the gradient reduction."""
    data = small_corpus(toy_dir, tmp_path / "data", lines=1000)
    c = tiny_config(
        toy_dir,
        tmp_path / "run",
        train={"max_steps": 100_000, "max_minutes": 0.15, "batch_tokens": 300, "save_every": 100_000,
               "valid_every": 100_000, "threads": 1},
    )  # fmt: skip
    c["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAST_CLOCK)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = run_cli(
        *torchrun, "-m", "onmt_doc.bin.train", "-config", str(write_config(c, tmp_path / "run.yaml")),
        env={"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ends = re.findall(r"reached train.max_minutes=0.15 at step (\d+)", proc.stderr)
    assert ends, proc.stderr[-3000:]
    step = load_checkpoint(str(tmp_path / "run" / "checkpoints" / "last.pt"))["train_state"]["step"]
    assert {int(e) for e in ends} == {step} and step > 10


def _fast_trainer(trained_run, toy_dir, run: Path, **sections):
    """A Trainer reusing trained_run's vocabulary and binarized cache (no BPE learning)."""
    from conftest import init_from_run, make_trainer

    init_from_run(trained_run, run)
    cfg = tiny_config(toy_dir, run, data={"cache_dir": str(trained_run / "cache")}, **sections)
    return make_trainer(cfg)


def test_gradient_clipping_scales_the_norm_to_max_grad_norm(trained_run, toy_dir, tmp_path):
    """The gradients the optimizer sees have total norm max_grad_norm when the norm exceeds it
    (norm computed here over all parameters); the logged grad_norm is the norm before clipping;
    max_grad_norm 0 leaves the gradients alone."""

    def norms_at_step(max_norm: float, run: str):
        trainer = _fast_trainer(trained_run, toy_dir, tmp_path / run, train={"max_grad_norm": max_norm})
        seen = []
        step = trainer.optimizer.step

        def recording_step(*args, **kwargs):  # the real step; notes the gradients it gets
            grads = [p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]
            seen.append(float(torch.linalg.vector_norm(torch.cat(grads).double())))
            return step(*args, **kwargs)

        trainer.optimizer.step = recording_step
        batch = next(iter(trainer.sampler))
        logged = trainer.train_step([batch])["grad_norm"]
        return seen[0], logged

    applied, logged = norms_at_step(0.05, "clip")
    assert logged > 0.05 * 2  # clipping had to act
    assert applied == pytest.approx(0.05, rel=1e-4)
    applied_free, logged_free = norms_at_step(0.0, "free")
    assert applied_free == pytest.approx(logged_free, rel=1e-4) and logged_free == pytest.approx(logged, rel=1e-4)


def test_bf16_mixed_precision_on_cpu_trains_and_fp16_falls_back(trained_run, toy_dir, tmp_path, warnings_of_onmt_doc):
    trainer = _fast_trainer(
        trained_run,
        toy_dir,
        tmp_path / "bf16",
        train={"amp": "bf16"},
        optim={"type": "adam", "lr": 2.0e-3, "schedule": {"type": "constant", "warmup": 1}},
    )
    assert trainer.amp_dtype == torch.bfloat16
    dtypes = []
    trainer.model.generator.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    batch = next(iter(trainer.sampler))
    losses = [trainer.train_step([batch])["loss"] for _ in range(12)]
    assert dtypes and set(dtypes) == {torch.bfloat16}  # the forward really ran in bf16
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights fp32
    assert losses[-1] < 0.8 * losses[0], losses  # it learns (memorises the batch)
    fp16 = _fast_trainer(trained_run, toy_dir, tmp_path / "fp16", train={"amp": "fp16"})
    assert fp16.amp_dtype is None and fp16.scaler is None
    assert any("train.amp=fp16" in r.getMessage() for r in warnings_of_onmt_doc.records)


def test_metrics_file_has_one_json_line_per_report_and_validation(trained_run, toy_dir, tmp_path):
    """``log.metrics_file``: what scripts read instead of the log (step, tokens, seconds, loss …)."""
    import json

    trainer = _fast_trainer(
        trained_run,
        toy_dir,
        tmp_path / "m",
        train={"max_steps": 6, "valid_every": 3, "save_every": 1000},
        log={"every": 2, "metrics_file": "metrics.jsonl"},
    )
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["event"] == "train"]
    valid_rows = [r for r in rows if r["event"] == "valid"]
    assert [r["step"] for r in train_rows] == [2, 4, 6]
    assert [r["step"] for r in valid_rows] == [3, 6]
    for r in train_rows:
        assert r["tokens"] > 0 and r["seconds"] > 0 and r["loss"] > 0
        assert abs(r["tok_per_s"] - r["tokens"] / r["seconds"]) < 1e-6 * r["tok_per_s"]
    assert all("ppl" in r and "loss" in r for r in valid_rows)


def test_max_minutes_stops_early_with_a_validation_and_a_save(trained_run, toy_dir, tmp_path):
    trainer = _fast_trainer(
        trained_run,
        toy_dir,
        tmp_path / "t",
        train={"max_steps": 100000, "max_minutes": 1e-5, "valid_every": 100000, "save_every": 100000},
    )
    metrics = trainer.train()
    assert 0 < trainer.step < 100000
    assert "loss" in metrics  # validated at the step the time budget ended
    assert load_checkpoint(str(tmp_path / "t" / "checkpoints" / "last.pt"))["step"] == trainer.step
