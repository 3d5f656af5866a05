"""Training a system of a spec through the library (``onmt_doc.train.trainer.train``) and reading
what it did from its ``log.metrics_file``; shared by the stages that train."""

from __future__ import annotations

import copy
import gc
import json
import os
import shutil
import time
from typing import Any, Optional

import yaml

from benchmarks.suite.spec import System
from benchmarks.suite.stage import StageContext

VOCAB_FILES = ("subword.model", "vocab.txt")  # what a run folder's codec is made of (prepare_codec)


def merge(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` merged in, nested mappings key by key (lists and values replaced)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def system_config(ctx: StageContext, system: System, *layers: dict) -> dict:
    """The system's config example with its overrides, then ``layers`` (the stage's data paths,
    run folder …) merged on top, as a plain dict."""
    with open(os.path.join(ctx.repo, system.config), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw = merge(raw, system.overrides)
    for layer in layers:
        raw = merge(raw, layer)
    return merge(raw, system.smoke) if ctx.smoke else raw


def share_vocab(from_run: str, to_run: str) -> None:
    """Give ``to_run`` the subword model and vocabulary of ``from_run``, so that ``train.init_from``
    can copy parameters and systems compare models, not vocabularies."""
    os.makedirs(to_run, exist_ok=True)
    for name in VOCAB_FILES:
        src = os.path.join(from_run, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(to_run, name))


def train_system(ctx: StageContext, raw: dict) -> dict:
    """Train one config (a dict) in this process; a summary of its metrics file: steps, seconds,
    target tokens/s, last training loss, peak GPU memory, the last validation's metrics."""
    from onmt_doc.config import config_from_dict
    from onmt_doc.train.reporting import setup_logging
    from onmt_doc.train.trainer import train

    run_dir = raw["log"]["dir"]
    raw = merge(raw, {"log": {"metrics_file": "metrics.jsonl", "tensorboard": False}, "train": {"device": ctx.device}})
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    setup_logging()
    cfg = config_from_dict(raw, source=run_dir)
    t0 = time.time()
    try:
        train(cfg)
    finally:
        seconds = time.time() - t0
        free_memory()
    return {**read_metrics(metrics), "wall_s": seconds}


def read_metrics(path: str) -> dict:
    """The summary of a ``log.metrics_file``: the last step, summed training seconds and tokens,
    the last loss, the peak memory and the last validation (``valid_<metric>``)."""
    train_rows: list[dict] = []
    valid: dict = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                if row["event"] == "train":
                    train_rows.append(row)
                elif row["event"] == "valid":
                    valid = row
    seconds = sum(r["seconds"] for r in train_rows)
    tokens = sum(r["tokens"] for r in train_rows)
    out: dict[str, Any] = {
        "steps": train_rows[-1]["step"] if train_rows else 0,
        "train_s": seconds,
        "tok_per_s": tokens / seconds if seconds else None,
        "loss": train_rows[-1]["loss"] if train_rows else None,
        "peak_mib": max((r.get("max_memory_mib") or 0 for r in train_rows), default=None) or None,
    }
    out.update({f"valid_{k}": v for k, v in valid.items() if k in ("loss", "ppl", "acc", "bleu")})
    return out


def losses(path: str) -> list[tuple[int, float]]:
    """(step, loss) of every training line of a metrics file."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [(r["step"], r["loss"]) for r in rows if r["event"] == "train"]


def free_memory() -> None:
    """Give back the GPU memory of a finished system before the next one starts."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    except ImportError:
        pass


def checkpoint(run_dir: str, name: Optional[str] = "last.pt") -> str:
    """The path of a run's checkpoint."""
    return os.path.join(run_dir, "checkpoints", name)
