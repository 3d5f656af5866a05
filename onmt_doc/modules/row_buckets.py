"""Rows of one batch in length buckets, so that a context-unit model (HM-GDC) computes little padding.

A context batch holds every sentence of its document windows as a row, and the sentences of a
window differ widely in length: padded to the batch's longest row, most positions would be
padding. The per-row parts (sentence encoder, decoder) run per bucket instead: rows sorted by
length and cut into a few groups, each trimmed to its own longest row. Padding is masked
everywhere, so a row's outputs do not depend on which bucket it lands in (exact up to float
rounding); the document-level parts read the rows back in batch order (:func:`unbucket`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from onmt_doc import devices

# what one more bucket costs, in row positions: a bucket is one more pass through every layer
# (per-op overhead, smaller matrix products); the cut trades it against the padding it saves.
# 16 measured best of 8-128 on TED at d_model 256 (docs/benchmarks.md, "Document-level cost")
BUCKET_OVERHEAD = 16


@dataclass
class RowBucket:
    """Rows (indices into the batch, ascending length) and the length they are trimmed to."""

    rows: torch.Tensor  # [r] long
    length: int
    host_rows: Optional[np.ndarray] = None  # the same rows on the host (plans made from host copies)

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """[R, L, ...] -> this bucket's rows, trimmed to its length: [r, length, ...]."""
        return x[:, : self.length].index_select(0, self.rows)


def bucket_cuts(lengths: Sequence[int], overhead: int) -> list[tuple[int, int]]:
    """Cut ascending ``lengths`` into runs [i, j) minimising Σ (j - i)·lengths[j-1] + overhead per run
    (computed positions plus the bucket cost); exact dynamic programme, O(R²) in numpy."""
    n = len(lengths)
    lens = np.asarray(lengths, dtype=np.int64)
    cost = np.zeros(n + 1, dtype=np.int64)
    cut = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        starts = np.arange(j)
        c = cost[:j] + (j - starts) * lens[j - 1] + overhead
        k = int(np.argmin(c))
        cost[j], cut[j] = c[k], k
    runs, j = [], n
    while j > 0:
        runs.append((int(cut[j]), j))
        j = int(cut[j])
    return runs[::-1]


def bucket_rows(lengths: torch.Tensor, overhead: Optional[int] = None) -> list[RowBucket]:
    """Buckets of the rows with real lengths [R]: sorted by length (stable), cut by :func:`bucket_cuts`
    (``overhead`` None: :data:`BUCKET_OVERHEAD`, read at call time). Every bucket is at least one
    position long."""
    overhead = BUCKET_OVERHEAD if overhead is None else overhead
    lens = lengths.clamp(min=1)
    order = torch.sort(lens.cpu(), stable=True).indices
    sorted_lens = lens.cpu()[order].tolist()
    host = order.numpy()
    order = order.to(lengths.device)
    cuts = bucket_cuts(sorted_lens, overhead)
    return [RowBucket(order[i:j], int(sorted_lens[j - 1]), host[i:j]) for i, j in cuts]


def row_plan(keep: torch.Tensor, overhead: Optional[int] = None) -> list[RowBucket]:
    """The buckets of the rows of ``keep`` [R, L] (True on real positions) for the device's path
    (:func:`onmt_doc.devices.fused`): length buckets on the packed path; on the fused path one
    bucket of every row at the full width, which costs padding but no device read and a third of the
    kernels (a GPU's step is bound by kernel launches, not by padded arithmetic)."""
    if devices.fused(keep.device):
        return [whole_batch(keep.size(0), keep.size(1), keep.device)]
    return bucket_rows(keep.sum(1), overhead)


def whole_batch(rows: int, length: int, device: Union[str, torch.device]) -> RowBucket:
    """The fused path's one bucket: every row, at the full width ``length``."""
    return RowBucket(torch.arange(rows, device=device), max(length, 1), np.arange(rows))


def computed_positions(lengths: torch.Tensor, overhead: Optional[int] = None) -> int:
    """Positions the buckets of rows with real ``lengths`` compute (Σ rows × bucket length)."""
    return sum(b.rows.numel() * b.length for b in bucket_rows(lengths, overhead))


def unbucket(parts: Sequence[torch.Tensor], buckets: Sequence[RowBucket], length: int) -> torch.Tensor:
    """Per-bucket outputs [r_b, L_b, ...] back into batch order [R, length, ...], zeros past each
    bucket's length (differentiable: pad, concatenate, one gather)."""
    padded = [F.pad(p, (0, 0) * (p.dim() - 2) + (0, length - p.size(1))) for p in parts]
    return torch.cat(padded).index_select(0, batch_order(buckets))


def batch_order(buckets: Sequence[RowBucket]) -> torch.Tensor:
    """[R] where each batch row sits in the buckets' concatenation (``torch.cat(parts)[batch_order]``
    puts per-bucket rows back in batch order)."""
    rows = torch.cat([b.rows for b in buckets])
    inverse = torch.empty_like(rows)
    inverse[rows] = torch.arange(rows.numel(), device=rows.device)
    return inverse
