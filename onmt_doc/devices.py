"""Which device a command runs on: one rule for training (``train.device``), translation
(``translate`` options, ``-device``), evaluation and the server, so ``auto`` means the same
everywhere; and how many CPU processes or threads a user may ask for (:func:`check_count`). A
foundation module: the translator and the trainer both read it, neither owns it. torch is
imported where a device is picked, so that counting cores does not load it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from onmt_doc.errors import ConfigError

if TYPE_CHECKING:
    import torch

PER_CORE = 8  # the most worker processes or threads per CPU core a user may ask for


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, e.g. a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_count(value: int, name: str, per_core: int = PER_CORE) -> int:
    """``value`` worker processes or threads (``data.workers``, ``-threads``), refused above
    ``per_core`` per core of this machine: a typo of 10^6 would otherwise start a million
    processes, or ask torch for a million-thread pool, before anything else went wrong."""
    cores = cpu_cores()
    if value > per_core * cores:
        raise ConfigError(
            f"{name} {value}: more than {per_core} per CPU core of this machine ({cores} cores: at most "
            f"{per_core * cores}); 0 picks a number from the cores"
        )
    return value


def pick_device(spec: str, local_rank: int = 0, key: str = "train.device") -> "torch.device":
    """``auto`` (the local rank's GPU if CUDA is available, else CPU), ``cpu``, ``cuda`` (the local
    rank's GPU) or ``cuda:N``; raises ConfigError at ``key`` for unavailable or invalid devices."""
    device = _parse(spec, local_rank, key)
    if device.type == "cuda":
        avoid_cudnn_attention()
    return device


def _parse(spec: str, local_rank: int, key: str) -> "torch.device":
    import torch

    if spec == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{key}: {spec} requested but CUDA is not available")
    if spec == "cuda":
        return torch.device(f"cuda:{local_rank}")
    try:
        return torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"{key}: '{spec}' is not a device (auto, cpu, cuda, cuda:N)") from None


def avoid_cudnn_attention() -> None:
    """Turn off the cuDNN backend of ``scaled_dot_product_attention`` (flash and memory-efficient
    attention remain). cuDNN builds an execution plan for every new shape, and our batches change
    shape every step (token-budget batches, length buckets, beam search, group-attention blocks): on
    an H100 with torch 2.11 that cost ~10 ms of CPU per attention call, 9× slower sentence training
    and 10 s G-Transformer steps (docs/benchmarks.md, "GPU"). A process-wide switch, as PyTorch
    offers it; every command that picks a CUDA device sets it."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)
