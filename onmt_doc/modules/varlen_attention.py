"""Group attention (G-Transformer, Bao et al. 2021, eq. 8) over variable-length sentences: the fused path.

Every sentence of every row is one sequence. The real tokens of a batch are gathered sentence after
sentence into one [T, H, d] tensor, attention runs once over all of them with cumulative offsets
(flash attention's variable-length mode on CUDA) and the outputs are scattered back: one kernel per
attention call, no padding inside it. The plan is built on the host, from the batch's host copy,
so nothing is read back from the GPU during a step (``devices.fused`` says when this path is
taken; ``group_attention`` holds the packed CPU path, which computes the same function). Tag-0
queries (``<bos>``), which see their whole row, are one per row and attend in one SDPA call.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F

FLASH_DTYPES = (torch.float16, torch.bfloat16)  # what flash attention computes in; float32 takes the padded kernel


@dataclass
class SegmentPlan:
    """Where one batch's group attention reads and writes: the queries and keys of every sentence as
    consecutive runs of flat positions (row * N + i), their offsets, and the tag-0 queries."""

    q_pos: torch.Tensor  # [Tq] flat query positions, sentence after sentence
    k_pos: torch.Tensor  # [Tk] flat key positions of the same sentences, in the same order
    cu_q: torch.Tensor  # [G + 1] int32 offsets of each sentence's queries in q_pos
    cu_k: torch.Tensor  # [G + 1] int32 offsets of its keys in k_pos
    max_q: int  # the longest sentence's queries (a host number: the kernel's grid, no device read)
    max_k: int
    causal: bool  # each query sees the keys up to its own position in the sentence (decoder self-attention)
    free_pos: torch.Tensor  # [M] flat positions of tag-0 queries, which see their whole row
    free_row: torch.Tensor  # [M] the row of each
    free_mask: torch.Tensor  # [M, 1, 1, Nk] the keys each may see

    def to(self, device: torch.device) -> "SegmentPlan":
        """The plan on ``device``, copied without blocking the host (pinned first)."""
        if device.type == "cpu":
            return self
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.pin_memory().to(device, non_blocking=True)
            moved[f.name] = value
        return SegmentPlan(**moved)


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def _segments(tags: np.ndarray, keep: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions of the kept tokens with a tag, ordered by (row, tag) and by position inside a
    sentence, and their sentence id ``row * width + tag``."""
    n = tags.shape[1]
    flat = tags.reshape(-1)
    pos = np.flatnonzero(keep.reshape(-1) & (flat > 0))
    seg = (pos // n) * width + flat[pos]
    order = np.argsort(seg, kind="stable")  # a sentence's tokens are contiguous runs; sorting keeps it exact
    return pos[order], seg[order]


def _offsets(seg: np.ndarray) -> tuple[torch.Tensor, int]:
    """int32 offsets [G + 1] of the runs of equal ids in sorted ``seg`` and the longest run."""
    starts = np.flatnonzero(np.diff(seg, prepend=-1)) if len(seg) else np.zeros(0, dtype=np.int64)
    cu = np.append(starts, len(seg)).astype(np.int32)
    return torch.from_numpy(cu), int(np.diff(cu).max()) if len(seg) else 0


def _free(tags: np.ndarray, keep: np.ndarray, k_keep: np.ndarray, causal: bool) -> tuple[torch.Tensor, ...]:
    """Tag-0 queries: their flat positions, rows and key masks [M, 1, 1, Nk] (causal: up to themselves)."""
    n = tags.shape[1]
    pos = np.flatnonzero(keep.reshape(-1) & (tags.reshape(-1) == 0))
    row = pos // n
    mask = k_keep[row]
    if causal:
        mask = mask & (np.arange(k_keep.shape[1]) <= (pos % n)[:, None])
    return torch.from_numpy(pos), torch.from_numpy(row), torch.from_numpy(mask[:, None, None, :].copy())


def plan_self_segments(tags: torch.Tensor, keep: torch.Tensor, causal: bool) -> SegmentPlan:
    """Self-attention plan (tags x/x in the encoder; y/y and ``causal`` in the decoder) from host
    tensors ``tags`` [B, N] (sentence k = tag k, 0 = no sentence) and ``keep`` [B, N]. Computed in
    numpy: host work by construction, never a device read."""
    tags, keep = _numpy(tags), _numpy(keep)
    width = int(tags.max()) + 1 if tags.size else 1
    pos, seg = _segments(tags, keep, width)
    cu, longest = _offsets(seg)
    pos_t = torch.from_numpy(pos)
    return SegmentPlan(pos_t, pos_t, cu, cu, longest, longest, causal, *_free(tags, keep, keep, causal))


def plan_cross_segments(
    q_tags: torch.Tensor, q_keep: torch.Tensor, k_tags: torch.Tensor, k_keep: torch.Tensor
) -> SegmentPlan:
    """Cross-attention plan: target sentence k of a row attends to source sentence k of the same row.
    A target sentence without its source sentence is left out (its output stays zero, as on the
    packed path); so is a source sentence without a target."""
    q_tags, q_keep, k_tags, k_keep = (_numpy(t) for t in (q_tags, q_keep, k_tags, k_keep))
    width = max(int(q_tags.max()) if q_tags.size else 0, int(k_tags.max()) if k_tags.size else 0) + 1
    q_pos, q_seg = _segments(q_tags, q_keep, width)
    k_pos, k_seg = _segments(k_tags, k_keep, width)
    q_in, k_in = np.isin(q_seg, k_seg), np.isin(k_seg, q_seg)  # the sentences both sides have
    q_pos, q_seg, k_pos, k_seg = q_pos[q_in], q_seg[q_in], k_pos[k_in], k_seg[k_in]
    (cu_q, max_q), (cu_k, max_k) = _offsets(q_seg), _offsets(k_seg)
    free = _free(q_tags, q_keep, k_keep, causal=False)
    return SegmentPlan(torch.from_numpy(q_pos), torch.from_numpy(k_pos), cu_q, cu_k, max_q, max_k, False, *free)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    dropout: float = 0.0,
    causal: bool = False,
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v within each sequence: q [Tq, H, d], k and v [Tk, H, d], sequence i at
    rows ``cu[i]:cu[i + 1]`` of each; returns [Tq, H, d]. CUDA in fp16/bf16: flash attention's
    variable-length kernel (torch's ``_flash_attention_forward``, the op under
    ``torch.nn.attention.varlen``, which unlike that wrapper takes dropout and causality in every torch
    from 2.9); elsewhere :func:`padded_varlen_attention`, the same function in one padded SDPA call."""
    if q.is_cuda and q.dtype in FLASH_DTYPES:
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal, False)[0]
    return padded_varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal)


def _slots(cu: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's sequence and its place in it, from offsets [G + 1] (no device read: the output size is given)."""
    g = cu.numel() - 1
    cu = cu.long()
    seq = torch.repeat_interleave(torch.arange(g, device=cu.device), cu[1:] - cu[:-1], output_size=total)
    return seq, torch.arange(total, device=cu.device) - cu[seq]


def padded_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    dropout: float = 0.0,
    causal: bool = False,
) -> torch.Tensor:
    """:func:`varlen_attention` as every sequence padded to the longest, one masked SDPA call: the
    reference the flash kernel is tested against, and the kernel where flash does not apply."""
    g, h, d = cu_q.numel() - 1, q.size(1), q.size(2)
    q_seq, q_slot = _slots(cu_q, q.size(0))
    k_seq, k_slot = _slots(cu_k, k.size(0))
    qb = q.new_zeros(g, max_q, h, d).index_put((q_seq, q_slot), q)
    kb = k.new_zeros(g, max_k, h, d).index_put((k_seq, k_slot), k)
    vb = v.new_zeros(g, max_k, h, d).index_put((k_seq, k_slot), v)
    keys = torch.zeros(g, max_k, dtype=torch.bool, device=q.device).index_put((k_seq, k_slot), torch.tensor(True))
    mask = keys[:, None, None, :]
    if causal:  # a sentence's queries and keys are the same tokens in the same order
        mask = mask & torch.ones(max_q, max_k, dtype=torch.bool, device=q.device).tril()
    out = F.scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), mask, dropout)
    return out.transpose(1, 2)[q_seq, q_slot]


def segment_attend(
    plan: SegmentPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """Group attention of q [B, H, Nq, d] over k, v [B, H, Nk, d] along ``plan``; returns [B, H, Nq, d],
    zeros at padding queries (as :func:`~onmt_doc.modules.group_attention.group_attend`)."""
    b, h, nq, d = q.shape
    flat_q, flat_k, flat_v = (x.transpose(1, 2).reshape(-1, h, d) for x in (q, k, v))  # views of the projections
    out = flat_q.new_zeros(b * nq, h, d)
    if plan.q_pos.numel():
        qs, ks, vs = flat_q[plan.q_pos], flat_k[plan.k_pos], flat_v[plan.k_pos]
        inner = varlen_attention(qs, ks, vs, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, dropout, plan.causal)
        out = out.index_copy(0, plan.q_pos, inner.to(out.dtype))
    if plan.free_pos.numel():
        qf = flat_q[plan.free_pos][:, :, None]  # [M, H, 1, d]
        of = F.scaled_dot_product_attention(qf, k[plan.free_row], v[plan.free_row], plan.free_mask, dropout)
        out = out.index_copy(0, plan.free_pos, of[:, :, 0].to(out.dtype))
    return out.view(b, nq, h, d).transpose(1, 2)
