"""Shared fixtures: a toy corpus the project writes itself and tiny model configs."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from onmt_doc.toy.corpus import write_corpus

# Under pytest-xdist (the README's command runs two workers) each worker, and every process it starts,
# uses one thread: two torch processes each spinning two threads on two cores slow each other ~10x.
if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"
# OMP_NUM_THREADS, when set, wins (several test runs sharing the cores); else at most 2 threads
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 0) or min(2, os.cpu_count() or 1))

REPO = Path(__file__).resolve().parent.parent
# tools/hostile/fixtures.py builds the fakes (an OpenNMT-py checkpoint, a Marian folder) the review and
# the import tests share: ``from hostile.fixtures import ...`` (appended, so nothing of tests/ is shadowed)
sys.path.append(str(REPO / "tools"))

# the devices present: device-sensitive tests run on each (``-m devices`` selects them on a GPU machine)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES, ids=DEVICES)
def device(request) -> torch.device:
    """Each device present in turn. On CUDA, TF32 is off while the test runs (restored after), so
    float32 tolerances such as 1e-5 mean there what they mean on the CPU."""
    dev = torch.device(request.param)
    if dev.type != "cuda":
        yield dev
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield dev
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def pytest_collection_modifyitems(config, items) -> None:
    """Tests that take the ``device`` fixture carry the ``devices`` marker."""
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.devices)


@pytest.fixture(scope="session")
def toy_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("toy")
    write_corpus(d, seed=3, train_docs=2500, valid_docs=60, test_docs=40)
    return d


def tiny_config(toy: Path, run_dir: Path, **sections) -> dict:
    """A 2+2-layer, d=64 Transformer on the toy corpus; ``sections`` update top-level sections."""
    cfg = {
        "data": {
            "train": {"src": str(toy / "train.src"), "tgt": str(toy / "train.tgt")},
            "valid": {"src": str(toy / "valid.src"), "tgt": str(toy / "valid.tgt")},
        },
        "vocab": {"subword": "bpe", "size": 300, "shared": True},
        "model": {
            "d_model": 64,
            "dropout": 0.1,
            "attention_dropout": 0.0,
            "encoder": {"type": "transformer", "layers": 2, "heads": 4, "ff": 128},
            "decoder": {"type": "transformer", "layers": 2, "heads": 4, "ff": 128},
        },
        "optim": {"type": "adam", "lr": 2.0e-3, "schedule": {"type": "inverse_sqrt", "warmup": 100}},
        "train": {
            "batch_tokens": 1024,
            "max_steps": 20,
            "valid_every": 1000,
            "save_every": 1000,
            "valid_bleu": False,
            "seed": 1,
        },
        "translate": {"beam": 3},
        "log": {"dir": str(run_dir), "tensorboard": False, "every": 10},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def write_config(cfg: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Run a command in a fresh interpreter (what a user gets), capturing its output."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(list(args), cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def module_cmd(module: str) -> list[str]:
    return [sys.executable, "-m", module]


@pytest.fixture(scope="session")
def trained_run(toy_dir, tmp_path_factory) -> Path:
    """A tiny sentence-level model trained for a few steps (enough to produce real output)."""
    from onmt_doc.config import config_from_dict
    from onmt_doc.train.trainer import train

    run = tmp_path_factory.mktemp("trained")
    cfg = tiny_config(toy_dir, run, train={"max_steps": 60, "save_every": 60, "valid_every": 60})
    train(config_from_dict(cfg))
    return run


def make_trainer(cfg: dict):
    """A single-process CPU Trainer for ``cfg`` (a dict as tiny_config gives)."""
    from onmt_doc.config import config_from_dict
    from onmt_doc.train import distributed
    from onmt_doc.train.trainer import Trainer

    ctx = distributed.init_distributed("cpu")
    try:
        return Trainer(config_from_dict(cfg), ctx)
    finally:
        distributed.shutdown(ctx)


def init_from_run(source: Path, run: Path) -> Path:
    """Prepare ``run`` to start from ``source``'s last checkpoint: copy its subword model and
    vocabulary (init_from needs the same ones); return the checkpoint path."""
    run.mkdir(parents=True, exist_ok=True)
    for name in ("subword.model", "vocab.txt"):
        shutil.copy(source / name, run / name)
    return source / "checkpoints" / "last.pt"


@pytest.fixture()
def warnings_of_onmt_doc(caplog):
    """The onmt_doc logger's warnings (it may not propagate when a CLI test set up logging)."""
    logger = logging.getLogger("onmt_doc")
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.WARNING)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.propagate = propagate
