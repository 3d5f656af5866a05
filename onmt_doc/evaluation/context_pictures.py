"""The context pictures drawn: heatmaps of :mod:`onmt_doc.evaluation.context_reading` as PNG
files and as image arrays for TensorBoard.

matplotlib is an optional extra (``pip install -e .[viz]``): :func:`require_matplotlib` turns its
absence into one line naming the extra. Every picture uses one colour scale, 0 to 1 (the values
are attention shares and gates), so two pictures compare at a glance; thin white lines mark the
sentence boundaries of both axes.
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

import numpy as np

from onmt_doc.errors import UserError
from onmt_doc.evaluation.context_reading import Heatmap

CELL = 0.16  # inches per row or column
MOST_INCHES = 40.0  # a long document's picture stays within this (labels get small, not the picture huge)


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, or a one-line UserError naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("the context pictures need matplotlib: pip install -e .[viz] (or pip install matplotlib)")
    return plt


def _figure(heatmap: Heatmap) -> Any:
    """The heatmap drawn on a figure sized by its rows and columns."""
    plt = require_matplotlib()
    n_rows, n_cols = heatmap.values.shape
    width = min(MOST_INCHES, max(6.0, 2.5 + CELL * n_cols))  # at least wide enough for the title
    height = min(MOST_INCHES, max(3.0, 2.0 + CELL * n_rows))
    fig, ax = plt.subplots(figsize=(width, height), dpi=80)
    image = ax.imshow(heatmap.values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", interpolation="nearest")
    font = 7 if max(n_rows, n_cols) <= 80 else 5
    ax.set_xticks(range(n_cols), heatmap.cols, rotation=90, fontsize=font)
    ax.set_yticks(range(n_rows), heatmap.rows, fontsize=font)
    for start in heatmap.row_starts[1:]:
        ax.axhline(start - 0.5, color="white", linewidth=1.2)
    for start in heatmap.col_starts[1:]:
        ax.axvline(start - 0.5, color="white", linewidth=1.2)
    ax.set_xlabel(heatmap.col_label)
    ax.set_ylabel(heatmap.row_label)
    ax.set_title(textwrap.fill(heatmap.title, 70), fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    fig.tight_layout()
    return fig


def png(heatmap: Heatmap) -> bytes:
    """The picture as PNG bytes."""
    plt = require_matplotlib()
    fig = _figure(heatmap)
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)


def rgb(heatmap: Heatmap) -> np.ndarray:
    """The picture as an [H, W, 3] uint8 array (TensorBoard's ``add_image``, ``dataformats="HWC"``)."""
    plt = require_matplotlib()
    fig = _figure(heatmap)
    try:
        fig.canvas.draw()
        return np.asarray(fig.canvas.buffer_rgba())[:, :, :3].copy()
    finally:
        plt.close(fig)
