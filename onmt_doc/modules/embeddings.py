"""Token embeddings with sinusoidal positions (Vaswani et al., 2017, sec. 3.5)."""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import nn

from onmt_doc.data.vocab import PAD_ID
from onmt_doc.modules.dropout import Dropout

# where the sines and cosines of frequency i go (``model.position_layout``)
POSITION_LAYOUTS = ("interleaved", "halves")


def sinusoid_table(length: int, dim: int, layout: str = "interleaved") -> torch.Tensor:
    """Sinusoidal position encodings [length, dim] (Vaswani et al., 2017, sec. 3.5); odd ``dim`` works.

    ``interleaved`` (ours, OpenNMT-py's): column 2i holds sin(pos / 10000^(2i/d)), column 2i+1 its
    cosine. ``halves`` (Marian, tensor2tensor, fairseq-style; transformers'
    ``MarianSinusoidalPositionalEmbedding``): the same sines in the first ceil(d/2) columns, then the
    cosines; both start at position 0."""
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    sin, cos = torch.sin(pos * div), torch.cos(pos * div)[:, : dim // 2]
    if layout == "halves":
        return torch.cat([sin, cos], dim=1)
    if layout != "interleaved":
        raise ValueError(f"unknown position layout {layout!r} (one of {', '.join(POSITION_LAYOUTS)})")
    table = torch.zeros(length, dim)
    table[:, 0::2] = sin
    table[:, 1::2] = cos
    return table


class SinusoidalPositions(nn.Module):
    """Fixed position encodings, grown on demand (not saved in checkpoints)."""

    def __init__(self, dim: int, max_positions: int = 4096, layout: str = "interleaved") -> None:
        """``max_positions`` only sizes the initial table: longer inputs grow it; ``layout``: see
        :func:`sinusoid_table`."""
        super().__init__()
        self.dim, self.layout = dim, layout
        self.register_buffer("table", sinusoid_table(max_positions, dim, layout), persistent=False)

    def forward(self, positions: Union[int, torch.Tensor], length: int = 1) -> torch.Tensor:
        """Encodings for ``length`` positions from an int offset, or for a [B, T] position tensor."""
        needed = (positions + length) if isinstance(positions, int) else int(positions.max()) + 1
        if needed > self.table.size(0):
            grown = sinusoid_table(max(needed, 2 * self.table.size(0)), self.dim, self.layout)
            self.table = grown.to(self.table.device)
        if isinstance(positions, int):
            return self.table[positions : positions + length]
        return self.table[positions]


class Embeddings(nn.Module):
    """``dropout(E[x] * sqrt(d) + PE)``; the matrix may be shared by source, target and output."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        dropout: float,
        max_positions: int = 4096,
        positions: bool = True,
        layout: str = "interleaved",
        scale: bool = True,
    ) -> None:
        """``positions=False`` for parts that encode order themselves: no sinusoid table is built;
        ``layout``: the sinusoids' (:func:`sinusoid_table`); ``scale=False`` leaves out the sqrt(d)
        factor (``model.scale_embedding``: models such as some Marian ones were trained without it)."""
        super().__init__()
        self.d_model = d_model
        self.tokens = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.tokens.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.tokens.weight[PAD_ID].zero_()
        self.positions = SinusoidalPositions(d_model, max_positions, layout) if positions else None
        self.dropout = Dropout(dropout)
        self.scale_embedding = scale
        self.scale = math.sqrt(d_model) if scale else 1.0

    @property
    def weight(self) -> torch.Tensor:
        """The [V, D] token matrix, for tying with other embeddings and the output projection."""
        return self.tokens.weight

    def forward(
        self,
        ids: torch.Tensor,
        offset: Union[int, torch.Tensor] = 0,
        positions: Optional[torch.Tensor] = None,
        with_positions: bool = True,
    ) -> torch.Tensor:
        """Embed [B, T] ids whose first position is ``offset`` (or explicit [B, T] ``positions``);
        ``with_positions=False`` leaves positions out (a user of a shared module whose order
        comes from elsewhere, e.g. the MHPLSTM decoder's recurrence)."""
        x = self.tokens(ids) * self.scale
        if self.positions is not None and with_positions:
            x = x + (self.positions(positions) if positions is not None else self.positions(offset, ids.size(1)))
        return self.dropout(x)
