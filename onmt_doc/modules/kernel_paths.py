"""Which implementation the device-dependent parts of a model use: one rule, read by every part.

Group attention (the G-Transformer) and the per-row parts of HM-GDC each have two implementations
that compute the same function:

- ``packed`` (CPU): sentences gathered into blocks cut into length buckets, padded per bucket
  (``group_attention``, ``row_buckets``). On a CPU every padded position costs its arithmetic, so
  the least padding wins; the bucket plans read their sizes on the host.
- ``fused`` (GPU): one kernel per attention call over variable-length sentences
  (``varlen_attention``: flash attention with cumulative sequence offsets) and one bucket of rows,
  with every plan built on the host from the batch's own host copy. On a GPU the cost of a step is
  the number of kernels and of host synchronisations, not padding: the packed plans made a
  G-Transformer step thousands of small kernels (docs/benchmarks.md, "GPU").

``auto`` (the default) picks ``fused`` on CUDA and ``packed`` elsewhere. :func:`forced` makes a
process use one path on every device: the tests run the fused path's plumbing on a CPU against the
dense reference, and the operator-count benchmark counts what a GPU step dispatches on a CPU.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Literal

import torch

Path = Literal["packed", "fused"]
PATHS = ("packed", "fused")
_FORCED: contextvars.ContextVar[str] = contextvars.ContextVar("onmt_doc_kernel_path", default="auto")


def fused(device: torch.device) -> bool:
    """Whether the parts on ``device`` take the fused (GPU) path."""
    chosen = _FORCED.get()
    return device.type == "cuda" if chosen == "auto" else chosen == "fused"


@contextlib.contextmanager
def forced(path: str) -> Iterator[None]:
    """Use ``path`` (``packed``, ``fused`` or ``auto``) on every device inside the block."""
    if path not in PATHS + ("auto",):
        raise ValueError(f"unknown kernel path {path!r} (one of {', '.join(PATHS)}, auto)")
    token = _FORCED.set(path)
    try:
        yield
    finally:
        _FORCED.reset(token)
