"""Rows of a batch packed per document, and attention of every row over its own document.

Context-unit models (HM-GDC) put each sentence of a document in its own batch row; ``doc_index``
says which document a row belongs to. Per-document computations (the document encoder over
sentence vectors, attention from a sentence to the words of its whole document) gather the rows
of each document into one packed sequence: [G documents, M slots]. No row ever sees another
document's slots, and padding costs only the difference between document sizes, which the
batching keeps small (windows of one size are batched together).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from onmt_doc.modules import analysis
from onmt_doc.modules.attention import KV, MultiHeadAttention, Probe, attention_probs


def group_slots(group: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For items with group ids [K]: each item's position among the items of its group (in their
    order of appearance) and the item count of every group [n_groups]."""
    counts = torch.bincount(group, minlength=n_groups)
    order = torch.sort(group, stable=True).indices
    slot = torch.empty_like(group)
    slot[order] = torch.arange(group.numel(), device=group.device) - (counts.cumsum(0) - counts)[group[order]]
    return slot, counts


@dataclass
class Packing:
    """Where the kept positions of [R rows, L] sit in a packed [G documents, M slots] layout."""

    index: torch.Tensor  # [K] flat packed position (doc * M + slot) of each kept position
    keep: Optional[torch.Tensor]  # [R * L] kept positions (None = all)
    rows: int
    length: int  # L
    docs: int  # G
    slots: int  # M

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[R, L, ...] -> [G, M, ...], zeros in empty slots."""
        flat = x.reshape(self.rows * self.length, *x.shape[2:])
        if self.keep is not None:
            flat = flat[self.keep]
        out = flat.new_zeros(self.docs * self.slots, *x.shape[2:])
        return out.index_copy(0, self.index, flat).view(self.docs, self.slots, *x.shape[2:])

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """[G, M, ...] -> [R, L, ...], zeros at positions that were not kept."""
        picked = y.reshape(self.docs * self.slots, *y.shape[2:]).index_select(0, self.index)
        if self.keep is None:
            return picked.view(self.rows, self.length, *y.shape[2:])
        out = picked.new_zeros(self.rows * self.length, *y.shape[2:])
        out[self.keep] = picked
        return out.view(self.rows, self.length, *y.shape[2:])

    def padding(self) -> torch.Tensor:
        """[G, M] True at empty slots."""
        pad = torch.ones(self.docs * self.slots, dtype=torch.bool, device=self.index.device)
        pad[self.index] = False
        return pad.view(self.docs, self.slots)


def plan_packing(row_doc: torch.Tensor, n_docs: int, length: int = 1, keep: Optional[torch.Tensor] = None) -> Packing:
    """Packing of [R, length] positions (only ``keep`` [R, length] where given) by document
    ``row_doc`` [R]; positions keep their row-major order inside a document."""
    rows = row_doc.numel()
    doc = row_doc.repeat_interleave(length)
    flat_keep = None if keep is None else keep.reshape(-1)
    if flat_keep is not None:
        doc = doc[flat_keep]
    slot, counts = group_slots(doc, n_docs)
    slots = max(int(counts.max()), 1) if counts.numel() else 1
    return Packing(doc * slots + slot, flat_keep, rows, length, n_docs, slots)


@dataclass
class DocumentMemory:
    """Keys/values of one attention over every document's packed sequence (one cache per layer)."""

    kv: KV  # [G, H, N, d_head] each
    mask: torch.Tensor  # [G, 1, 1, N] True at real positions


def document_memory(attn: MultiHeadAttention, memory: torch.Tensor, pad: torch.Tensor) -> DocumentMemory:
    """Project packed document sequences [G, N, D] (``pad`` [G, N]) for ``attend_documents``."""
    return DocumentMemory(attn.memory_kv(memory), (~pad)[:, None, None, :])


def attend_documents(
    attn: MultiHeadAttention,
    h: torch.Tensor,
    row_doc: torch.Tensor,
    memory: DocumentMemory,
    probe: Optional[str] = None,
) -> torch.Tensor:
    """Cross-attention of every row's queries h [R, T, D] over its own document's memory.

    The rows of a document are packed into one query sequence [G, M·T] so the document's keys and
    values are used once, not copied per row (a document of n sentences would otherwise hold n
    copies). Returns [R, T, D]."""
    return attend_documents_rows(attn, [h], [row_doc], memory, probe=probe)[0]


def attend_documents_rows(
    attn: MultiHeadAttention,
    hs: Sequence[torch.Tensor],
    row_docs: Sequence[torch.Tensor],
    memory: DocumentMemory,
    keeps: Optional[Sequence[torch.Tensor]] = None,
    probe: Optional[str] = None,
    rows: Optional[Sequence[torch.Tensor]] = None,
) -> list[torch.Tensor]:
    """:func:`attend_documents` for rows in several groups at once (length buckets, ``row_buckets``):
    queries hs[i] [r_i, T_i, D] of rows of documents row_docs[i] [r_i]. The query positions of
    every group (only the ``keeps[i]`` [r_i, T_i] ones where given) are packed per document in one
    sequence, so a document's rows spread over buckets still share one packed query sequence.
    Returns [r_i, T_i, D] per group, zeros at positions not kept. Inside ``analysis.capturing``
    the probabilities are captured per group as [r_i, T_i, H, N] under ``probe``, with the
    group's batch ``rows`` where given."""
    queries, docs = [], []
    for i, (h, row_doc) in enumerate(zip(hs, row_docs)):
        r, t, d = h.shape
        doc = row_doc[:, None].expand(r, t)
        if keeps is None:
            h, doc = h.reshape(r * t, d), doc.reshape(-1)
        else:
            h, doc = h[keeps[i]], doc[keeps[i]]
        queries.append(attn.q(h).view(-1, 1, attn.heads, attn.d_head))  # [K_i, 1, H, d_head]
        docs.append(doc)
    packing = plan_packing(torch.cat(docs), memory.mask.size(0))
    q = packing.pack(torch.cat(queries)).transpose(1, 2)  # [G, H, M, d_head]
    query_probe: Optional[Probe] = None
    capturing = probe is not None and analysis.capture_key(attn, probe) is not None
    if probe is not None and not capturing:  # captured below, row by row, not packed
        query_probe = (probe, ~packing.padding())
    if capturing:
        _capture_rows(probe, attention_probs(q, memory.kv[0], memory.mask), packing, hs, docs, keeps, rows)
    out = packing.unpack(attn.attend(q, memory.kv[0], memory.kv[1], memory.mask, probe=query_probe))[:, 0]
    results = []
    for h, part, keep in zip(hs, out.split([len(d) for d in docs]), keeps or [None] * len(hs)):
        r, t, d = h.shape
        if keep is None:
            results.append(part.view(r, t, d))
        else:
            where = keep.reshape(-1).nonzero().squeeze(1)
            results.append(part.new_zeros(r * t, d).index_copy(0, where, part).view(r, t, d))
    return results


def _capture_rows(
    name: str,
    probs: torch.Tensor,
    packing: Packing,
    hs: Sequence[torch.Tensor],
    docs: Sequence[torch.Tensor],
    keeps: Optional[Sequence[torch.Tensor]],
    rows: Optional[Sequence[torch.Tensor]],
) -> None:
    """Capture packed probabilities [G, H, M, N] back in the queries' rows: [r_i, T_i, H, N] per group."""
    per_query = packing.unpack(probs.transpose(1, 2))[:, 0]  # [K, H, N]
    for i, (h, part) in enumerate(zip(hs, per_query.split([len(d) for d in docs]))):
        r, t = h.shape[:2]
        if keeps is None:
            full = part
        else:
            where = keeps[i].reshape(-1).nonzero().squeeze(1)
            full = part.new_zeros(r * t, *part.shape[1:]).index_copy(0, where, part)
        analysis.capture(name, full.view(r, t, *part.shape[1:]), None if rows is None else rows[i])
