"""Per-example padded lengths: what the token budget of a batch counts and the bucketing sorts by.

Its own module because both the batching code and the mapped instances (which compute lengths from
corpus offsets, ``onmt_doc/data/mapped.py``) build them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class Lengths:
    """Per example: padded source and target row length as collation makes them (targets get
    <bos>/<eos>) and the number of rows (sentences of a context instance, else 1)."""

    src: np.ndarray
    tgt: np.ndarray
    rows: np.ndarray
    # context instances (HM-GDC): the sums over their rows of the real source length and of
    # max(source, target) length; such models compute rows in length buckets (modules/row_buckets.py),
    # so the budget counts these sums rather than rows x the longest
    real_src: Optional[np.ndarray] = None
    real: Optional[np.ndarray] = None

    def sort_order(self, noise: Optional[np.ndarray] = None, by_source_only: bool = False) -> np.ndarray:
        """Bucketing order: by rows (context windows of one size together, so that per-document
        attention pads little), then target and source length (for context windows their summed
        real lengths: windows of similar size in tokens share a batch)."""
        src, tgt = (self.src, self.tgt) if self.real is None else (self.real_src, self.real)
        keys = [src] + ([] if by_source_only else [tgt]) + [self.rows]
        return np.lexsort(([noise] if noise is not None else []) + keys)

    def take(self, index: np.ndarray) -> "Lengths":
        """The lengths of the examples at ``index`` (repeats allowed), in that order."""
        if self.real is None:
            return Lengths(self.src[index], self.tgt[index], self.rows[index])
        return Lengths(self.src[index], self.tgt[index], self.rows[index], self.real_src[index], self.real[index])
