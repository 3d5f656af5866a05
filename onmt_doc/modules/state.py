"""Explicit decoding state: what a decoder carries from one step to the next.

Beam search only ever calls :meth:`DecoderState.reorder`. Fields listed in ``source_fields``
depend on the source alone (e.g. cached cross-attention keys/values); they are the same for all
beams of one sentence, so reordering beams inside their sentence skips them. Fields listed in
``shared_fields`` are not per row at all (e.g. one key/value cache per document that several
rows index into); reordering never touches them. Fields listed in ``owned_fields`` hold tensors
that this state alone refers to (caches that grow with the output, keys/values computed for the
state): whenever a reorder keeps or shrinks the number of rows, they are rewritten in place, only
at the rows that change, and cut to the new number of rows. In long beam searches about four rows
in five keep their place at a step, and beam search prunes finished sentences by moving the last
ones into their places (:func:`~onmt_doc.translate.search.fill_holes`), so a reorder copies a
small part of what a full gather would.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Optional

import torch


@dataclass
class _Moves:
    """The rows a reorder changes: row ``targets[j]`` takes the old row ``sources[j]``."""

    index: torch.Tensor
    targets: torch.Tensor
    sources: torch.Tensor

    @staticmethod
    def of(index: torch.Tensor) -> "_Moves":
        targets = index.ne(torch.arange(index.numel(), device=index.device)).nonzero().squeeze(1)
        return _Moves(index, targets, index.index_select(0, targets))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Moves the rows of ``x`` in place (the moved rows are gathered before any is written) and
        cuts it to the new number of rows; a reorder that adds rows gathers as usual."""
        n = self.index.numel()
        if x.size(0) < n:
            return x.index_select(0, self.index)
        if self.targets.numel():
            x.index_copy_(0, self.targets, x.index_select(0, self.sources))
        return x if x.size(0) == n else x[:n]


def _reorder(value: Any, index: torch.Tensor, same_sources: bool, moves: Optional[_Moves] = None) -> Any:
    if isinstance(value, torch.Tensor):
        return moves.apply(value) if moves is not None else value.index_select(0, index)
    if isinstance(value, DecoderState):
        return value.reorder(index, same_sources)
    if isinstance(value, (list, tuple)):
        return type(value)(_reorder(v, index, same_sources, moves) for v in value)
    if isinstance(value, dict):
        return {k: _reorder(v, index, same_sources, moves) for k, v in value.items()}
    return value


@dataclass
class DecoderState:
    """Base of every decoder's state dataclass.

    Subclasses only declare fields: :meth:`reorder` walks tensors, nested states, lists and dicts
    generically, so beam search needs no per-decoder code. ``source_fields`` and ``shared_fields``
    name the fields reordering may skip (see the module docstring).
    """

    source_fields: ClassVar[tuple[str, ...]] = ()
    shared_fields: ClassVar[tuple[str, ...]] = ()
    owned_fields: ClassVar[tuple[str, ...]] = ()

    def reorder(self, index: torch.Tensor, same_sources: bool = False) -> "DecoderState":
        """Select batch rows ``index``; ``same_sources`` when rows only move within a sentence's beam."""
        moves = _Moves.of(index) if self.owned_fields else None
        for f in fields(self):
            if f.name in self.shared_fields or (same_sources and f.name in self.source_fields):
                continue
            owned = moves if f.name in self.owned_fields else None
            setattr(self, f.name, _reorder(getattr(self, f.name), index, False, owned))
        return self

    def nbytes(self) -> int:
        """Bytes held in tensors (used to check that constant-size states stay constant)."""
        total = 0

        def visit(v: Any) -> None:
            nonlocal total
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
            elif isinstance(v, DecoderState):
                total += v.nbytes()
            elif isinstance(v, (list, tuple)):
                for x in v:
                    visit(x)
            elif isinstance(v, dict):
                for x in v.values():
                    visit(x)

        for f in fields(self):
            visit(getattr(self, f.name))
        return total
