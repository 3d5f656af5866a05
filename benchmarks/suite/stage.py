"""The stage contract: what a stage function receives (:class:`StageContext`) and the registry it
joins (``STAGES``). A stage is ``fn(params, ctx) -> None``: ``params`` is its own dataclass, filled
from the spec (unknown keys refused), and every measurement goes through ``ctx.record`` at once, so
a run cut off mid-stage still reports what it took."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from onmt_doc.registry import Registry

STAGES = Registry("benchmark stage")
STAGE_MARK = ".benchmark-stage"  # in every stage folder the suite made; only such folders are ever removed


def stage(name: str, params: type):
    """Register ``fn(params, ctx)`` under ``name`` with its parameter dataclass."""
    return STAGES.register(name, params)


@dataclass
class StageContext:
    """What a running stage sees: where to write, which device, how long it may take."""

    name: str  # the stage's name in the spec (results' "stage" field)
    out: str  # the run folder (OUT); the stage's own files go under work_dir()
    device: str  # "cuda" or "cpu"
    smoke: bool  # toy sizes (CI, CPU rehearsal)
    data: str  # the real data sets (../shared/data, or the copy a GPU run carries)
    repo: str  # the repository root (config_examples/, docs/)
    deadline: float  # time.time() by which the stage must be done
    systems: dict = field(default_factory=dict)  # name -> system (spec.System)
    results: str = ""  # OUT/results.jsonl

    def seconds_left(self) -> float:
        """Seconds until this stage's budget runs out (negative once over)."""
        return self.deadline - time.time()

    def work_dir(self, *parts: str) -> str:
        """``OUT/<stage>/<parts…>``, created."""
        path = os.path.join(self.out, self.name, *parts)
        os.makedirs(path, exist_ok=True)
        open(os.path.join(self.out, self.name, STAGE_MARK), "a").close()  # ours: a re-run may clear it
        return path

    def record(self, **row: Any) -> dict:
        """Append one measurement to ``OUT/results.jsonl`` now (flushed and synced)."""
        row = {"stage": self.name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **row}
        with open(self.results, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=_plain) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.log(" ".join(f"{k}={_short(v)}" for k, v in row.items() if k not in ("stage", "time")))
        return row

    def log(self, msg: str) -> None:
        """One progress line on stderr, tagged with the stage and the seconds left."""
        print(f"[{self.name} {self.seconds_left():5.0f}s left] {msg}", file=sys.stderr, flush=True)


def _plain(value: Any) -> Any:
    """JSON for values json cannot write (tensors' items, paths, tuples)."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _short(value: Any) -> str:
    """A measurement as a progress line shows it."""
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def gpu_name(device: str) -> Optional[str]:
    """The CUDA device's name, None on CPU."""
    if device != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(0)


def rss_mib(key: str = "VmRSS", reset: bool = False) -> Optional[float]:
    """The process's resident (``VmRSS``) or peak (``VmHWM``) memory in MiB; ``reset`` starts a new
    peak (Linux ``clear_refs``), so a measurement's peak is its own, not an earlier step's."""
    try:
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))
    except (OSError, StopIteration):
        return None
