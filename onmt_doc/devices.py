"""Which device a command runs on: one rule for training (``train.device``), translation
(``translate`` options, ``-device``), evaluation and the server, so ``auto`` means the same
everywhere; and how many CPU processes or threads a user may ask for (:func:`check_count`). A
foundation module: the translator and the trainer both read it, neither owns it. torch is
imported where a device is picked, so that counting cores does not load it."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, TypeVar

from onmt_doc.errors import ConfigError

if TYPE_CHECKING:
    import torch

PER_CORE = 8  # the most worker processes or threads per CPU core a user may ask for
# torch.compile's backend for `train.compile` and `translate.compile` (tests choose a cheaper one)
COMPILE_BACKEND = "inductor"
COMPILE_SETTINGS = ("off", "on", "auto", "graphs")

log = logging.getLogger("onmt_doc")
Fn = TypeVar("Fn", bound=Callable)


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
    return configure(_parse(spec, local_rank, key))


def configure(device: "torch.device") -> "torch.device":
    """``device`` after the process-wide settings it needs (CUDA: :func:`avoid_cudnn_attention`).
    Every entry point that picks a device (:func:`pick_device`) or is handed one (``Translator.load``
    with a ``torch.device``, the benchmark stages) calls it, so no way in runs CUDA with cuDNN
    attention's per-shape plans."""
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


# ----------------------------------------------------------------------------- kernel paths
# Which implementation the device-dependent parts of a model use: one rule, read by every part.
#
# Group attention (the G-Transformer), the per-row parts and document packing of HM-GDC and the
# search's reorders each have two implementations that compute the same function:
#
# - ``packed`` (CPU): sentences gathered into blocks cut into length buckets, padded per bucket
#   (``modules/group_attention``, ``modules/row_buckets``), plans and reorders that read their sizes
#   on the host. On a CPU every padded position costs its arithmetic and a read costs nothing.
# - ``fused`` (GPU): one kernel per attention call over variable-length sentences
#   (``modules/varlen_attention``: flash attention with cumulative offsets) and one bucket of rows,
#   every plan built on the host from the batch's own host copy, nothing read back from the device.
#   On a GPU the cost of a step is the number of kernels and of host synchronisations, not padding:
#   the packed plans made a G-Transformer step thousands of small kernels (docs/benchmarks.md, "GPU").
#
# ``auto`` (the default) picks ``fused`` on CUDA and ``packed`` elsewhere. :func:`forced_path` makes a
# process use one path on every device: the tests run the fused path's plumbing on a CPU against the
# dense reference, and the operator-count benchmark counts what a GPU step dispatches on a CPU.
Path = Literal["packed", "fused"]
PATHS = ("packed", "fused")
# forced_path's choice for the process: a plain global, which torch.compile reads as a constant
# (guarded); a ContextVar would split every compiled graph where a part asks for its path
_FORCED = ["auto"]


def fused(device: "torch.device") -> bool:
    """Whether the parts on ``device`` take the fused (GPU) path."""
    chosen = _FORCED[0]
    return device.type == "cuda" if chosen == "auto" else chosen == "fused"


@contextlib.contextmanager
def forced_path(path: str) -> Iterator[None]:
    """Use ``path`` (``packed``, ``fused`` or ``auto``) on every device inside the block."""
    if path not in PATHS + ("auto",):
        raise ValueError(f"unknown kernel path {path!r} (one of {', '.join(PATHS)}, auto)")
    before, _FORCED[0] = _FORCED[0], path
    try:
        yield
    finally:
        _FORCED[0] = before


def compiled(fn: Fn, setting: str, device: "torch.device", key: str, duck_shapes: bool = True) -> Fn:
    """``fn`` (a module or a function) compiled by ``torch.compile`` where the setting at ``key``
    (``train.compile``, ``translate.compile``) asks for it (``auto``: on CUDA), else itself: the one
    place either asks torch. Dynamic shapes: batches and decoding states change shape, and one
    compilation must serve them all (a static one recompiles per shape and gives up after a few).
    ``graphs`` also records each shape's kernels once as a CUDA graph (``mode="reduce-overhead"``;
    on a CPU there is nothing to record and it is ``on``). ``duck_shapes=False`` compiles without
    torch's duck shaping (equal sizes taken for one symbol): a decoding state whose row count happens
    to equal a head size or a source length otherwise specialises the step and compiles it again,
    and a document decoder's searches reached torch's limit of 8 compilations on toy batches."""
    import torch

    if setting == "off" or (setting == "auto" and device.type != "cuda"):
        return fn
    log.info("%s=%s: the first calls compile (a minute or more)", key, setting)
    mode = "reduce-overhead" if setting == "graphs" else None
    compiled_fn = torch.compile(fn, dynamic=True, mode=mode, backend=COMPILE_BACKEND)
    if duck_shapes:
        return compiled_fn
    from torch.fx.experimental import _config as fx_config  # torch compiles on the first calls, inside them

    @functools.wraps(fn)
    def without_duck_shapes(*args: Any, **kwargs: Any) -> Any:
        # torch's setting is process-wide (a patch() costs ~25 µs a call; this, nothing): set for the
        # call; a compilation in another thread meanwhile would see it too
        before, fx_config.use_duck_shape = fx_config.use_duck_shape, False
        try:
            return compiled_fn(*args, **kwargs)
        finally:
            fx_config.use_duck_shape = before

    return without_duck_shapes  # type: ignore[return-value]
