"""Which device a command runs on: one rule for training (``train.device``), translation
(``translate`` options, ``-device``), evaluation and the server, so ``auto`` means the same
everywhere. A foundation module: the translator and the trainer both read it, neither owns it."""

from __future__ import annotations

import torch

from onmt_doc.errors import ConfigError


def pick_device(spec: str, local_rank: int = 0, key: str = "train.device") -> torch.device:
    """``auto`` (the local rank's GPU if CUDA is available, else CPU), ``cpu``, ``cuda`` (the local
    rank's GPU) or ``cuda:N``; raises ConfigError at ``key`` for unavailable or invalid devices."""
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
