"""Analysis statistics collected during validation (attention entropy, gate values).

Parts record statistics only inside :func:`collecting` (the trainer's validation wraps its forward
passes in it), so training and translation never pay for materialising attention probabilities.
A statistic is a (sum, count) pair; validation reports ``sum / count`` as ``valid/<name>``.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch

_SINK: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("onmt_doc_analysis", default=None)
COUNT_SUFFIX = "#n"  # key of the count that divides a statistic (see reporting.summarize)


@contextlib.contextmanager
def collecting() -> Iterator[dict]:
    """Collect statistics recorded inside the block into the yielded dict ({name: sum, name#n: count})."""
    sink: dict = {}
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def active() -> bool:
    """Whether a :func:`collecting` block is open: parts test it before materialising anything to record."""
    return _SINK.get() is not None


def record(name: str, total: float, count: float) -> None:
    """Add ``total`` and ``count`` to statistic ``name``; a no-op outside :func:`collecting`, and zero
    counts are dropped so a reported mean never divides by zero."""
    sink = _SINK.get()
    if sink is not None and count > 0:
        sink[name] = sink.get(name, 0.0) + float(total)
        sink[name + COUNT_SUFFIX] = sink.get(name + COUNT_SUFFIX, 0.0) + float(count)


def record_entropy(name: str, probs: torch.Tensor, queries: torch.Tensor) -> None:
    """Mean entropy in bits of attention distributions ``probs`` [..., H, Tq, Tk] over heads and
    the queries where ``queries`` [..., Tq] is True."""
    if not active():
        return
    p = probs.float()
    ent = -(p * torch.log2(p.clamp_min(1e-30))).sum(-1)  # [..., H, Tq]
    ent = ent * queries.unsqueeze(-2)
    record(f"entropy/{name}", ent.sum().item(), queries.sum().item() * probs.size(-3))


def record_mean(name: str, values: torch.Tensor, where: torch.Tensor) -> None:
    """Mean of ``values`` [..., D] over the positions where ``where`` [...] is True."""
    if active():
        record(name, (values.float() * where.unsqueeze(-1)).sum().item(), where.sum().item() * values.size(-1))
