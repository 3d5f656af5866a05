"""What the training machine offers: CPU threads and the mixed-precision type.

Kept apart from the trainer so the training loop never probes hardware itself, and so the rules
(OMP_NUM_THREADS under torchrun, bf16 only where AMX makes it pay) live in one place.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import ContextManager, Optional

import torch

from onmt_doc.config import Config
from onmt_doc.devices import check_count, cpu_cores
from onmt_doc.train.distributed import DistContext

log = logging.getLogger("onmt_doc")


def cpu_has_amx_bf16() -> bool:
    """True on CPUs with AMX bf16 tiles, where bf16 matrix products are several times faster."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return any(line.startswith("flags") and " amx_bf16" in line for line in f)
    except OSError:
        return False


def set_threads(cfg: Config, ctx: DistContext) -> None:
    """CPU threads of this process: train.threads, else OMP_NUM_THREADS for a single process, else
    the usable cores shared out among the processes of this machine (so ranks do not oversubscribe)."""
    if ctx.device.type != "cpu":
        return
    if cfg.train.threads:
        torch.set_num_threads(check_count(cfg.train.threads, "train.threads"))
        return
    if ctx.local_world == 1 and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        # a single process respects the usual variable (several jobs sharing a machine); under
        # torchrun it is set to 1 for every process by default, so there the cores are shared out
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
        return
    torch.set_num_threads(max(1, cpu_cores() // max(1, ctx.local_world)))


def amp_dtype(amp: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast type for ``train.amp`` on ``device`` (None: float32).

    auto: bf16 autocast on GPUs (fp16 where bf16 is missing), float32 on CPUs. On CPUs with
    AMX, ``bf16`` is faster for models of d_model >= 256 but slower for tiny ones (the casts
    dominate), so it is opt-in there (docs/benchmarks.md has the measurements)."""
    if amp == "fp32":
        return None
    if device.type == "cuda":
        if amp == "fp16" or (amp == "auto" and not torch.cuda.is_bf16_supported()):
            return torch.float16
        return torch.bfloat16
    if amp == "fp16":
        log.warning("train.amp=fp16 ignored: CPUs use bf16 mixed precision (train.amp=bf16)")
        return None
    if amp == "bf16" and not cpu_has_amx_bf16():
        log.warning("train.amp=bf16 on a CPU without AMX: bf16 is emulated and likely slower")
    return torch.bfloat16 if amp == "bf16" else None


def autocast(device: torch.device, dtype: Optional[torch.dtype]) -> ContextManager:
    """Mixed precision with ``dtype`` on ``device``, or nothing for float32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
