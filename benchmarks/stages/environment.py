"""``environment``: in the first seconds of a run, check that everything the later stages need is
there (packages, data files, the device) and measure the matmul peaks the model-FLOPs utilisation
of later stages is read against."""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass, field

from benchmarks.suite.stage import StageContext, stage
from onmt_doc.errors import UserError


@dataclass
class EnvironmentParams:
    packages: list = field(default_factory=list)  # importable names, e.g. pyonmttok, torch_optimizer
    data_files: list = field(default_factory=list)  # paths under the data folder
    matmul_size: int = 8192  # n of the n×n×n products timed for the peaks
    matmul_dtypes: list = field(default_factory=lambda: ["bfloat16", "float32"])
    repeats: int = 10


@stage("environment", EnvironmentParams)
def environment(p: EnvironmentParams, ctx: StageContext) -> None:
    """Record package versions and the peaks; raise (stage failed) on anything missing."""
    missing = []
    for name in p.packages:
        try:
            module = importlib.import_module(name)
            ctx.record(check="package", name=name, version=getattr(module, "__version__", "?"))
        except Exception as e:  # any import failure is a missing package here
            missing.append(f"package {name} ({type(e).__name__}: {e})")
    for rel in p.data_files:
        path = os.path.join(ctx.data, rel)
        if os.path.isfile(path):
            ctx.record(check="data", name=rel, bytes=os.path.getsize(path))
        else:
            missing.append(f"data file {path}")
    if missing:
        raise UserError("missing: " + "; ".join(missing))
    for dtype in p.matmul_dtypes:
        ctx.record(check="matmul_peak", dtype=dtype, n=p.matmul_size, tflops=matmul_peak(ctx.device, dtype, p))


def matmul_peak(device: str, dtype_name: str, p: EnvironmentParams) -> float:
    """TFLOP/s of an n×n×n product on random data, the mean of ``repeats`` after warm-up (TF32 off
    for float32: the peak of true fp32)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, dtype_name)
    n = p.matmul_size
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(p.repeats):
        a @ b
    sync(device)
    return 2 * n**3 * p.repeats / (time.perf_counter() - t0) / 1e12


def sync(device: str) -> None:
    """Wait for the GPU's queued work (timers need it); nothing on CPU."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
