"""Static batch shapes (``train.static_shapes``): every training batch padded to one of a few shapes.

A token-budget batch has its own number of rows, its own longest sentence and its own number of
target tokens, so compiled code specialised on shapes, and CUDA graphs, which replay one recorded
shape, would be made again for almost every step. Here a batch whose longest side (source, or
target with ``<bos>``) has ``m`` tokens is padded to

- ``L = rung(m)`` columns on both sides: 8, 16, …, 64, then eight lengths per doubling (72, 80,
  …, 128, 144, …), so padding adds at most 1/8 of the length;
- ``R = rung(rows, 4)`` rows (8, 16, …, 64, then four per doubling: at most 1/4 more); added rows
  hold one source token (``<eos>``) and ``<bos>`` with no target, so every row attends somewhere
  and no gradient is NaN;
- ``N'`` target rows of the output layer: the real target tokens rounded up to a quarter of
  ``R × L``; the extra rows carry ``<pad>`` targets, which the losses weigh out.

With sorted token-budget batches a rung of L meets one or two rungs of R, so a run uses a few
dozen to a few hundred shapes, each compiled or recorded once, instead of one per step.
Only models whose rows are independent sentences (or concatenations) can take extra rows: the
config check refuses the others (``TrainConfig.validate``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onmt_doc.data.vocab import BOS_ID, EOS_ID, PAD_ID

TARGET_PARTS = 4  # the output layer's rows: a multiple of R x L / TARGET_PARTS


def rung(n: int, per_doubling: int = 8) -> int:
    """``n`` rounded up to the ladder 8, 16, …, 64, then ``per_doubling`` evenly spaced values per
    doubling (72, 80, … 128, 144, … for 8): padding adds at most 1/``per_doubling``."""
    step = max(8, 1 << max((n - 1).bit_length() - per_doubling.bit_length(), 0))
    return max(-(-n // step) * step, 8)


@dataclass(frozen=True)
class StaticShapes:
    """The padded shapes of training batches (see the module docstring)."""

    def length(self, longest: int) -> int:
        """Columns of both sides for a batch whose longest side has ``longest`` tokens."""
        return rung(longest)

    def rows(self, rows: int) -> int:
        """Rows of a batch of ``rows`` rows (4 rungs per doubling: at most 1/4 more)."""
        return rung(rows, 4)

    def target_step(self, rows: int, length: int) -> int:
        """The output layer's rows in a [rows, length] batch are a multiple of this."""
        return max(rows * length // TARGET_PARTS, 8)


def pad_batch_arrays(
    shapes: StaticShapes, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``src``, ``tgt_in`` and ``tgt_out`` [rows, *] padded to the batch's static shape [R, L]; the
    added rows are ``<eos>`` on the source side and ``<bos>`` then padding on the target side."""
    real = src.shape[0]
    length = shapes.length(max(src.shape[1], tgt_in.shape[1]))
    rows = shapes.rows(real)

    def pad(x: np.ndarray, first: int) -> np.ndarray:
        out = np.full((rows, length), PAD_ID, dtype=x.dtype)
        out[:real, : x.shape[1]] = x
        out[real:, 0] = first
        return out

    return pad(src, EOS_ID), pad(tgt_in, BOS_ID), pad(tgt_out, PAD_ID)
