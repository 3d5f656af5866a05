"""Training a system of a spec through the library (``onmt_doc.train.trainer.train``) and reading
what it did from its ``log.metrics_file``; shared by the stages that train."""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import shutil
import time
from typing import Any, Optional

import yaml

from benchmarks.suite.stage import StageContext
from benchmarks.suite.system import System

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


def train_system(ctx: StageContext, raw: dict, profile: Optional["Profile"] = None) -> dict:
    """Train one config (a dict) in this process; a summary of its metrics file: steps, seconds,
    target tokens/s, last training loss, peak GPU memory, the last validation's metrics. With a
    ``profile``, some of its steps are profiled (:class:`Profile`)."""
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
        with profile.around_steps() if profile else contextlib.nullcontext():
            train(cfg)
    finally:
        seconds = time.time() - t0
        free_memory()
    return {**read_metrics(metrics), "wall_s": seconds}


class Profile:
    """torch.profiler over ``steps`` whole trainer iterations after the first ``skip`` (the data,
    the step, the logging between steps: everything the loop does), then one record per op of the
    ``top`` by device time and by CPU time, in ms per step, and one summary record. The CPU time of
    an op that waits for the GPU (a ``.item()``, a copy to the host) shows where the loop syncs."""

    def __init__(self, ctx: StageContext, system: str, skip: int = 5, steps: int = 5, top: int = 12):
        self.ctx, self.system, self.skip, self.steps, self.top = ctx, system, skip, steps, top

    @contextlib.contextmanager
    def around_steps(self):
        """Patch ``Trainer.train_step`` (benchmark instrumentation only) to start and stop the profiler."""
        from unittest import mock

        import torch

        from onmt_doc.train.trainer import Trainer

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and self.ctx.device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities)
        calls, window = [0], [0.0]
        original = Trainer.train_step

        def train_step(trainer, batches):
            out = original(trainer, batches)
            calls[0] += 1
            if calls[0] == self.skip:
                window[0] = time.perf_counter()
                prof.start()
            elif calls[0] == self.skip + self.steps:
                prof.stop()
                window[0] = time.perf_counter() - window[0]
            return out

        with mock.patch.object(Trainer, "train_step", train_step):
            yield
        if calls[0] >= self.skip + self.steps:
            self._record(prof, window[0])
        else:
            self.ctx.record(what="profile", system=self.system, profile="skipped", why=f"only {calls[0]} steps")

    def _record(self, prof, seconds: float) -> None:
        n = self.steps
        events = prof.key_averages()
        device = lambda e: getattr(e, "self_device_time_total", 0.0) or 0.0  # noqa: E731
        busy = sum(device(e) for e in events) / 1e3 / n
        self.ctx.record(what="profile", system=self.system, profile="summary", step_ms=1e3 * seconds / n,
                        device_busy_ms=busy)  # fmt: skip
        chosen = sorted(events, key=device, reverse=True)[: self.top] if busy else []
        chosen += [e for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[: self.top]]
        seen = set()
        for e in chosen:
            if e.key in seen:
                continue
            seen.add(e.key)
            self.ctx.record(what="profile", system=self.system, profile="op", op=e.key[:80], calls=e.count / n,
                            cpu_ms=e.self_cpu_time_total / 1e3 / n, device_ms=device(e) / 1e3 / n)  # fmt: skip


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
