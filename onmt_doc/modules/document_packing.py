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
from typing import Optional, Sequence, Union

import numpy as np
import torch

from onmt_doc.modules import analysis
from onmt_doc.modules.attention import KV, MultiHeadAttention, Probe, attention_probs
from onmt_doc.modules.host_planning import host_planning


def group_slots(group: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For items with group ids [K]: each item's position among the items of its group (in their
    order of appearance) and the item count of every group [n_groups]."""
    counts = torch.bincount(group, minlength=n_groups)
    order = torch.sort(group, stable=True).indices
    slot = torch.empty_like(group)
    slot[order] = torch.arange(group.numel(), device=group.device) - (counts.cumsum(0) - counts)[group[order]]
    return slot, counts


HostArray = Union[np.ndarray, torch.Tensor]  # an index a plan is built from, best the batch's host copy


def host_array(x: HostArray) -> np.ndarray:
    """``x`` as a numpy array: free for numpy arrays and CPU tensors, a device read for GPU tensors
    (so callers on the fused path hand in the batch's host copies, ``Batch.host``)."""
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


def to_device(x: np.ndarray, device: Union[str, torch.device]) -> torch.Tensor:
    """A host index array on ``device``: pinned and copied without blocking the host on a GPU."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.pin_memory().to(device, non_blocking=True) if torch.device(device).type == "cuda" else t


@dataclass
class Packing:
    """Where the kept positions of [R rows, L] sit in a packed [G documents, M slots] layout."""

    index: torch.Tensor  # [K] flat packed position (doc * M + slot) of each kept position
    keep_pos: Optional[torch.Tensor]  # [K] flat positions (row * L + i) kept (None = all)
    rows: int
    length: int  # L
    docs: int  # G
    slots: int  # M

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[R, L, ...] -> [G, M, ...], zeros in empty slots."""
        flat = x.reshape(self.rows * self.length, *x.shape[2:])
        if self.keep_pos is not None:
            flat = flat.index_select(0, self.keep_pos)
        out = flat.new_zeros(self.docs * self.slots, *x.shape[2:])
        return out.index_copy(0, self.index, flat).view(self.docs, self.slots, *x.shape[2:])

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """[G, M, ...] -> [R, L, ...], zeros at positions that were not kept."""
        picked = y.reshape(self.docs * self.slots, *y.shape[2:]).index_select(0, self.index)
        if self.keep_pos is None:
            return picked.view(self.rows, self.length, *y.shape[2:])
        out = picked.new_zeros(self.rows * self.length, *y.shape[2:])
        return out.index_copy(0, self.keep_pos, picked).view(self.rows, self.length, *y.shape[2:])

    def padding(self) -> torch.Tensor:
        """[G, M] True at empty slots."""
        pad = torch.ones(self.docs * self.slots, dtype=torch.bool, device=self.index.device)
        return pad.index_fill(0, self.index, False).view(self.docs, self.slots)


@host_planning
def plan_packing(
    row_doc: HostArray,
    n_docs: int,
    length: int = 1,
    keep: Optional[HostArray] = None,
    device: Optional[Union[str, torch.device]] = None,
) -> Packing:
    """Packing of [R, length] positions (only ``keep`` [R, length] where given) by document
    ``row_doc`` [R]; positions keep their row-major order inside a document. Planned on the host
    (numpy) from ``row_doc``/``keep``, best host copies (:func:`host_array`), so a GPU step never waits
    for it; the plan's indices go to ``device`` (default: ``row_doc``'s)."""
    if device is None:
        device = row_doc.device if isinstance(row_doc, torch.Tensor) else "cpu"
    rows = len(row_doc)
    doc = np.repeat(host_array(row_doc).astype(np.int64), length)
    keep_pos = None if keep is None else np.flatnonzero(host_array(keep).reshape(-1))
    if keep_pos is not None:
        doc = doc[keep_pos]
    counts = np.bincount(doc, minlength=n_docs)
    order = np.argsort(doc, kind="stable")
    slot = np.empty_like(doc)
    slot[order] = np.arange(len(doc)) - (np.cumsum(counts) - counts)[doc[order]]
    slots = max(int(counts.max()), 1) if counts.size else 1
    index = to_device(doc * slots + slot, device)
    return Packing(index, None if keep_pos is None else to_device(keep_pos, device), rows, length, n_docs, slots)


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
    host_row_doc: Optional[HostArray] = None,
) -> torch.Tensor:
    """Cross-attention of every row's queries h [R, T, D] over its own document's memory.

    The rows of a document are packed into one query sequence [G, M·T] so the document's keys and
    values are used once, not copied per row (a document of n sentences would otherwise hold n
    copies). ``host_row_doc``: ``row_doc``'s host copy, which plans without a device read. Returns [R, T, D]."""
    host = None if host_row_doc is None else [host_row_doc]
    return attend_documents_rows(attn, [h], [row_doc], memory, probe=probe, host_row_docs=host)[0]


@dataclass
class RowsPlan:
    """Where the queries of rows in several groups (length buckets) go when packed per document:
    the packing of all groups' kept positions, and per group its documents (one entry per kept
    query) and kept positions (None: all)."""

    packing: Packing
    docs: list[np.ndarray]
    wheres: list[Optional[torch.Tensor]]


@host_planning
def plan_document_rows(
    shapes: Sequence[tuple[int, int]],
    row_docs: Sequence[HostArray],
    n_docs: int,
    device: Union[str, torch.device],
    keeps: Optional[Sequence[HostArray]] = None,
) -> RowsPlan:
    """The :class:`RowsPlan` of groups of [r_i, T_i] (``shapes``) rows of documents ``row_docs[i]``
    [r_i], keeping the positions ``keeps[i]`` [r_i, T_i] where given; best from host copies (device
    tensors are read). One plan serves every layer of a forward pass."""
    docs, wheres = [], []
    for i, ((_, t), row_doc) in enumerate(zip(shapes, row_docs)):
        doc, where = np.repeat(host_array(row_doc), t), None
        if keeps is not None:
            pos = np.flatnonzero(host_array(keeps[i]).reshape(-1))
            doc, where = doc[pos], to_device(pos, device)
        docs.append(doc)
        wheres.append(where)
    return RowsPlan(plan_packing(np.concatenate(docs), n_docs, device=device), docs, wheres)


def attend_documents_rows(
    attn: MultiHeadAttention,
    hs: Sequence[torch.Tensor],
    row_docs: Sequence[torch.Tensor],
    memory: DocumentMemory,
    keeps: Optional[Sequence[torch.Tensor]] = None,
    probe: Optional[str] = None,
    host_row_docs: Optional[Sequence[HostArray]] = None,
    host_keeps: Optional[Sequence[HostArray]] = None,
    rows: Optional[Sequence[torch.Tensor]] = None,
    plan: Optional[RowsPlan] = None,
) -> list[torch.Tensor]:
    """:func:`attend_documents` for rows in several groups at once (length buckets, ``row_buckets``):
    queries hs[i] [r_i, T_i, D] of rows of documents row_docs[i] [r_i]. The query positions of
    every group (only the ``keeps[i]`` [r_i, T_i] ones where given) are packed per document in one
    sequence, so a document's rows spread over buckets still share one packed query sequence.
    ``plan``: :func:`plan_document_rows` of the same rows, made once for every layer; without it
    the plan is made here, from ``host_row_docs`` / ``host_keeps`` (host copies of ``row_docs`` /
    ``keeps``) where given, else by reading the device. Returns [r_i, T_i, D] per group, zeros at
    positions not kept. Inside ``analysis.capturing`` the probabilities are captured per group as
    [r_i, T_i, H, N] under ``probe``, with the group's batch ``rows`` where given."""
    if plan is None:
        host_keeps = host_keeps if host_keeps is not None else keeps
        shapes = [tuple(h.shape[:2]) for h in hs]
        docs_of = host_row_docs if host_row_docs is not None else row_docs
        plan = plan_document_rows(shapes, docs_of, memory.mask.size(0), hs[0].device, host_keeps)
    packing, docs, wheres = plan.packing, plan.docs, plan.wheres
    queries = []
    for h, where in zip(hs, wheres):
        r, t, d = h.shape
        flat = h.reshape(r * t, d) if where is None else h.reshape(r * t, d).index_select(0, where)
        queries.append(attn.q(flat).view(-1, 1, attn.heads, attn.d_head))  # [K_i, 1, H, d_head]
    q = packing.pack(torch.cat(queries)).transpose(1, 2)  # [G, H, M, d_head]
    query_probe: Optional[Probe] = None
    capturing = probe is not None and analysis.capture_key(attn, probe) is not None
    if probe is not None and not capturing:  # captured below, row by row, not packed
        query_probe = (probe, ~packing.padding())
    if capturing:
        _capture_rows(probe, attention_probs(q, memory.kv[0], memory.mask), packing, hs, docs, wheres, rows)
    out = packing.unpack(attn.attend(q, memory.kv[0], memory.kv[1], memory.mask, probe=query_probe))[:, 0]
    results = []
    for h, part, where in zip(hs, out.split([len(d) for d in docs]), wheres):
        r, t, d = h.shape
        if where is None:
            results.append(part.view(r, t, d))
        else:
            results.append(part.new_zeros(r * t, d).index_copy(0, where, part).view(r, t, d))
    return results


def _capture_rows(
    name: str,
    probs: torch.Tensor,
    packing: Packing,
    hs: Sequence[torch.Tensor],
    docs: Sequence[np.ndarray],
    wheres: Sequence[Optional[torch.Tensor]],
    rows: Optional[Sequence[torch.Tensor]],
) -> None:
    """Capture packed probabilities [G, H, M, N] back in the queries' rows: [r_i, T_i, H, N] per group
    (``wheres[i]``: the kept query positions of group i, None for all)."""
    per_query = packing.unpack(probs.transpose(1, 2))[:, 0]  # [K, H, N]
    for i, (h, part) in enumerate(zip(hs, per_query.split([len(d) for d in docs]))):
        r, t = h.shape[:2]
        if wheres[i] is None:
            full = part
        else:
            full = part.new_zeros(r * t, *part.shape[1:]).index_copy(0, wheres[i], part)
        analysis.capture(name, full.view(r, t, *part.shape[1:]), None if rows is None else rows[i])


@dataclass
class FlatDocuments:
    """A layer's :class:`DocumentMemory` as one sequence of every document's keys, for steps of one
    query per row (decoding) on the fused path: made once per search, read by
    :func:`attend_own_document`."""

    kv: KV  # [1, H, G·N, d_head] each: document g's keys at g·N … g·N + N - 1
    key_doc: torch.Tensor  # [G·N] the document of each key; -1 at padding


def flat_documents(memory: DocumentMemory) -> FlatDocuments:
    """``memory`` [G, H, N, d_head] laid out as one sequence [1, H, G·N, d_head] (a copy, once)."""
    g, h, n, d = memory.kv[0].shape
    k, v = (x.transpose(0, 1).reshape(1, h, g * n, d) for x in memory.kv)
    key_doc = torch.arange(g, device=k.device).repeat_interleave(n)
    return FlatDocuments((k, v), key_doc.masked_fill(~memory.mask.reshape(g * n), -1))


def attend_own_document(
    attn: MultiHeadAttention, h: torch.Tensor, row_doc: torch.Tensor, docs: FlatDocuments, probe: Optional[str] = None
) -> torch.Tensor:
    """:func:`attend_documents` for one query per row, h [R, 1, D]: every row's query over all the
    documents' keys in one attention call, masked to its own document's real keys (``row_doc`` [R]
    equal to the key's document). The same attention as packing the rows per document, without a
    host plan or a device read, at R·G·N scores instead of R·N: the fused (GPU) path's decoding step,
    where a step is a few rows over a few documents. Returns [R, 1, D]."""
    r = h.size(0)
    q = attn.project_q(h.view(1, r, -1))  # [1, H, R, d_head]: the rows as the query positions of one sequence
    mask = row_doc[:, None].eq(docs.key_doc[None, :])[None, None]  # [1, 1, R, G·N]
    every_query = torch.ones(1, r, dtype=torch.bool, device=h.device)
    query_probe: Optional[Probe] = None if probe is None else (probe, every_query)
    return attn.attend(q, docs.kv[0], docs.kv[1], mask, probe=query_probe).view(r, 1, -1)
