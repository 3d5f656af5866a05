"""Analysis collected during validation and explanation (attention entropy, gate values, and
the attention weights and gates themselves).

Parts record statistics only inside :func:`collecting` (the trainer's validation wraps its forward
passes in it), so training and translation never pay for materialising attention probabilities.
A statistic is a (sum, count) pair; validation reports ``sum / count`` as ``valid/<name>``.

Inside :func:`capturing` (the context pictures, ``onmt_doc/evaluation/context_reading.py``) parts
also hand over the tensors themselves: attention probabilities under their probe's name (or the
attention module's name in the capture's ``names``), gate values under ``gate/<name>``. A part
that runs its rows in length buckets passes each bucket's ``rows`` (batch rows, in the bucket's
order), so the reader can put them back in batch order.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional

import torch

_SINK: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("onmt_doc_analysis", default=None)
COUNT_SUFFIX = "#n"  # key of the count that divides a statistic (see reporting.summarize)


def _open(var: contextvars.ContextVar) -> Optional[object]:
    """``var``'s block, or None while ``torch.compile`` traces: compiled code is the training step's,
    which records nothing, and a ContextVar read there would split the compiled graph at every
    attention call (torch's dynamo cannot trace it)."""
    return None if torch.compiler.is_compiling() else var.get()


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
    """Whether a :func:`collecting` or :func:`capturing` block is open: parts test it before
    materialising anything to record."""
    return _open(_SINK) is not None or _open(_CAPTURE) is not None


def record(name: str, total: float, count: float) -> None:
    """Add ``total`` and ``count`` to statistic ``name``; a no-op outside :func:`collecting`, and zero
    counts are dropped so a reported mean never divides by zero."""
    sink = _open(_SINK)
    if sink is not None and count > 0:
        sink[name] = sink.get(name, 0.0) + float(total)
        sink[name + COUNT_SUFFIX] = sink.get(name + COUNT_SUFFIX, 0.0) + float(count)


def record_entropy(name: str, probs: torch.Tensor, queries: torch.Tensor) -> None:
    """Mean entropy in bits of attention distributions ``probs`` [..., H, Tq, Tk] over heads and
    the queries where ``queries`` [..., Tq] is True."""
    if _open(_SINK) is None:
        return
    p = probs.float()
    ent = -(p * torch.log2(p.clamp_min(1e-30))).sum(-1)  # [..., H, Tq]
    ent = ent * queries.unsqueeze(-2)
    record(f"entropy/{name}", ent.sum().item(), queries.sum().item() * probs.size(-3))


def record_mean(name: str, values: torch.Tensor, where: torch.Tensor) -> None:
    """Mean of ``values`` [..., D] over the positions where ``where`` [...] is True."""
    if _open(_SINK) is not None:
        record(name, (values.float() * where.unsqueeze(-1)).sum().item(), where.sum().item() * values.size(-1))


# ----------------------------------------------------------------------------- capturing tensors


@dataclass
class Captured:
    """One captured tensor (detached, float32) and, for a part run in length buckets, the batch
    rows its first dimension holds (None: the batch's rows in order)."""

    value: torch.Tensor
    rows: Optional[torch.Tensor] = None


@dataclass
class Capture:
    """What a :func:`capturing` block collects: tensors by name, in the order the parts ran (one
    per layer for a name every layer uses). ``names`` names attention modules that have no probe."""

    names: Mapping[int, str] = field(default_factory=dict)  # id(module) -> name
    tensors: dict[str, list[Captured]] = field(default_factory=dict)

    def get(self, name: str) -> list[Captured]:
        """The tensors captured under ``name`` (empty when the model has no such part)."""
        return self.tensors.get(name, [])


_CAPTURE: contextvars.ContextVar[Optional[Capture]] = contextvars.ContextVar("onmt_doc_capture", default=None)


@contextlib.contextmanager
def capturing(names: Optional[Mapping[torch.nn.Module, str]] = None) -> Iterator[Capture]:
    """Capture the attention probabilities and gates of the forward passes inside the block;
    ``names`` gives attention modules without a probe (a Transformer's cross-attention) a name."""
    capture = Capture({id(module): name for module, name in (names or {}).items()})
    token = _CAPTURE.set(capture)
    try:
        yield capture
    finally:
        _CAPTURE.reset(token)


def capture_key(module: torch.nn.Module, probe: Optional[str]) -> Optional[str]:
    """The name an attention call of ``module`` is captured under inside :func:`capturing`: its
    probe's name, else the name the capture gives the module; None (nothing to capture) otherwise."""
    capture = _open(_CAPTURE)
    if capture is None:
        return None
    return probe if probe is not None else capture.names.get(id(module))


def capture(name: str, value: torch.Tensor, rows: Optional[torch.Tensor] = None) -> None:
    """Keep ``value`` under ``name`` (a no-op outside :func:`capturing`)."""
    sink = _open(_CAPTURE)
    if sink is not None:
        sink.tensors.setdefault(name, []).append(Captured(value.detach().float(), rows))
