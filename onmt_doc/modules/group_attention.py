"""Group attention (G-Transformer, Bao et al. 2021, sec. 4.1, eq. 8) in packed blocks.

A query with group tag k attends only to keys with tag k (its own sentence in self-attention, the
aligned source sentence in cross-attention); a query with tag 0 (``<bos>``) is not restricted.
Masking an N×N score matrix would cost O(N²) for an N-token instance. Instead the tokens of each
sentence are gathered into a block of their own, attention runs over batches of blocks, and the
outputs are scattered back: O(N·L) time and memory. Sentences differ widely in length, so the
blocks are sorted by length and cut into a few length buckets (``row_buckets``), each padded
only to its own longest sentence: one SDPA call per bucket.

A :class:`BlockPlan` holds the gather/scatter indices of one batch; it is built once per forward
pass and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F

from onmt_doc import devices
from onmt_doc.modules import analysis
from onmt_doc.modules.attention import attention_probs, grow_kv
from onmt_doc.modules.document_packing import group_slots
from onmt_doc.modules.host_planning import host_planning
from onmt_doc.modules.row_buckets import bucket_rows
from onmt_doc.modules.varlen_attention import SegmentPlan, plan_cross_segments, plan_self_segments, segment_attend


@dataclass
class Blocks:
    """One length bucket of g blocks: the sentences of similar length, padded to the bucket's longest."""

    q_index: torch.Tensor  # [g, Lq] flat query positions (row * Nq + i) of each block
    k_index: torch.Tensor  # [g, Lk] flat key positions of the same sentence
    q_valid: torch.Tensor  # [g, Lq] slot holds a real query
    mask: torch.Tensor  # [g, 1, Lq, Lk] True where a query may attend
    has_keys: Optional[torch.Tensor]  # [g, 1, 1, 1] (cross-attention) the sentence has source keys


@dataclass
class BlockPlan:
    """Gather/scatter indices of one batch's group attention, from :func:`plan_self` or :func:`plan_cross`.

    The blocks come in length buckets; Nq/Nk are the query/key positions of a row. Built once per
    forward pass and shared by every layer, so the index arithmetic is not repeated per layer.
    """

    buckets: list[Blocks]
    free_pos: torch.Tensor  # [M] flat positions of tag-0 queries, which see their whole row
    free_row: torch.Tensor  # [M] batch row of each
    free_mask: torch.Tensor  # [M, 1, 1, Nk]
    source: torch.Tensor  # [K] row of [block slots of every bucket; free queries] holding each real output
    target: torch.Tensor  # [K] its flat query position (row * Nq + i); the other positions are padding (zero)


GROUP, GLOBAL, COMBINED = "group", "global", "combined"
Plan = Union[BlockPlan, SegmentPlan]  # packed blocks (CPU) or variable-length sentences (GPU): devices.fused
HostPair = Optional[tuple[torch.Tensor, torch.Tensor]]  # (tags, keep) as the batch's host copy holds them


def attention_modes(layers: int, group: bool, top_layers: int, top: str) -> list[str]:
    """The attention of each layer of a stack, bottom first: ``group`` (eq. 8), ``global`` (eq. 5)
    or ``combined`` (both, gate-summed, eq. 10). Without group attention every layer is global
    (the document Transformer); otherwise the top ``top_layers`` layers use ``top`` (``combined``,
    sec. 4.2, or ``global`` alone, the ablation of table 6) and the layers below use group attention."""
    if not group:
        return [GLOBAL] * layers
    return [GROUP if i < layers - top_layers else top for i in range(layers)]


def _blocks(tags: torch.Tensor, keep: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block table [B*K, L] of flat positions for group ids row * K + tag - 1, and its validity.

    Padding slots point at positions spread over the batch rather than all at position 0: their
    gradient is zero either way (masked keys, discarded queries), but the backward of a gather
    sums per position, and on CUDA thousands of duplicates of one position serialise that sum
    (pytorch/pytorch#41162): it made a G-Transformer step take seconds on an H100."""
    b, n = tags.shape
    pos = (keep & tags.gt(0)).reshape(-1).nonzero().squeeze(1)
    gid = (pos // n) * n_groups + tags.reshape(-1)[pos] - 1
    slot, counts = group_slots(gid, b * n_groups)
    length = max(int(counts.max()), 1) if counts.numel() else 1
    index = torch.arange(b * n_groups * length, device=tags.device).remainder_(b * n).view(b * n_groups, length)
    valid = torch.zeros(b * n_groups, length, dtype=torch.bool, device=tags.device)
    index[gid, slot] = pos
    valid[gid, slot] = True
    return index, valid


def _free_queries(tags: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pos = (keep & tags.eq(0)).reshape(-1).nonzero().squeeze(1)
    return pos, pos // tags.size(1)


def _bucketed(
    q_index: torch.Tensor,
    q_valid: torch.Tensor,
    k_index: torch.Tensor,
    k_valid: torch.Tensor,
    causal: bool,
    cross: bool,
    overhead: Optional[int],
) -> list[Blocks]:
    """Blocks [G, L] cut into length buckets by their query length (:func:`~onmt_doc.modules.row_buckets.bucket_rows`),
    each trimmed to its longest query and key sentence; masks as for one bucket."""
    buckets = []
    k_len = k_valid.sum(1)
    for rb in bucket_rows(q_valid.sum(1), overhead):
        lq = rb.length
        lk = max(int(k_len[rb.rows].max()), 1) if cross else lq
        qi, qv = q_index[rb.rows, :lq], q_valid[rb.rows, :lq]
        ki, kv = k_index[rb.rows, :lk], k_valid[rb.rows, :lk]
        if cross:
            has_keys = kv.any(1)[:, None, None, None]
            # a target sentence without a source sentence (malformed input) gets a zero output, not NaN
            mask = (kv[:, None, None, :] | ~has_keys).expand(-1, 1, lq, -1)
        else:
            has_keys = None
            mask = kv[:, None, None, :]
            if causal:  # slots hold a sentence's tokens in order, so causality is the block's lower triangle
                mask = mask & torch.ones(lq, lq, dtype=torch.bool, device=qi.device).tril()
        buckets.append(Blocks(qi, ki, qv, mask, has_keys))
    return buckets


def _finish(
    q_tags: torch.Tensor,
    buckets: list[Blocks],
    free_pos: torch.Tensor,
    free_row: torch.Tensor,
    free_mask: torch.Tensor,
) -> BlockPlan:
    """Complete a plan with where each real output sits among the attention outputs and where it
    goes: a one-to-one map (padding queries are left at zero rather than all copied from one zero
    row, whose gradient would be summed over thousands of duplicates; see :func:`_blocks`)."""
    device = q_tags.device
    sources, targets, offset = [], [], 0
    for b in buckets:
        slots = b.q_valid.reshape(-1).nonzero().squeeze(1)
        sources.append(slots + offset)
        targets.append(b.q_index.reshape(-1)[slots])
        offset += b.q_index.numel()
    sources.append(offset + torch.arange(free_pos.numel(), device=device))
    targets.append(free_pos)
    return BlockPlan(buckets, free_pos, free_row, free_mask, torch.cat(sources), torch.cat(targets))


def plan_self(tags: torch.Tensor, keep: torch.Tensor, causal: bool, overhead: Optional[int] = None) -> BlockPlan:
    """Self-attention blocks (tags x/x in the encoder, y/y plus causal in the decoder). ``overhead``:
    the cost of one more length bucket in positions (None: ``row_buckets.BUCKET_OVERHEAD``; a huge
    value gives a single bucket padded to the longest sentence)."""
    n_groups = max(int(tags.max()), 1)
    index, valid = _blocks(tags, keep, n_groups)
    used = valid[:, 0]
    index, valid = index[used], valid[used]
    buckets = _bucketed(index, valid, index, valid, causal, False, overhead)
    free_pos, free_row = _free_queries(tags, keep)
    free_mask = keep[free_row]
    if causal:
        n = tags.size(1)
        free_mask = free_mask & (torch.arange(n, device=tags.device) <= (free_pos % n)[:, None])
    return _finish(tags, buckets, free_pos, free_row, free_mask[:, None, None, :])


def plan_cross(
    q_tags: torch.Tensor,
    q_keep: torch.Tensor,
    k_tags: torch.Tensor,
    k_keep: torch.Tensor,
    overhead: Optional[int] = None,
) -> BlockPlan:
    """Cross-attention blocks: target sentence k attends to source sentence k (tags y/x); buckets by
    target length, each block's keys trimmed to the bucket's longest source sentence."""
    n_groups = max(int(q_tags.max()), int(k_tags.max()), 1)
    q_index, q_valid = _blocks(q_tags, q_keep, n_groups)
    k_index, k_valid = _blocks(k_tags, k_keep, n_groups)
    used = q_valid[:, 0]
    q_index, q_valid, k_index, k_valid = q_index[used], q_valid[used], k_index[used], k_valid[used]
    buckets = _bucketed(q_index, q_valid, k_index, k_valid, False, True, overhead)
    free_pos, free_row = _free_queries(q_tags, q_keep)
    return _finish(q_tags, buckets, free_pos, free_row, k_keep[free_row][:, None, None, :])


def _fused(device: torch.device) -> bool:
    """The fused path, unless analysis statistics are collected (validation's attention entropies
    are recorded per block, on the packed path)."""
    return devices.fused(device) and not analysis.active()


# the keys of the G-Transformer's plans in ``Batch.plans`` (made by the parts' ``host_plans``)
ENC_SELF, DEC_SELF, DEC_CROSS = "g_transformer.enc_self", "g_transformer.dec_self", "g_transformer.dec_cross"


def prepared_plan(plans: dict, key: str) -> Optional[Plan]:
    """The plan ``key`` made before the batch moved to the device (``Batch.plans``), or None: the
    batch was not prepared, or analysis statistics are collected (they are recorded per block, on
    the packed path: see :func:`_fused`)."""
    return None if analysis.active() else plans.get(key)


@host_planning
def self_plan(tags: torch.Tensor, keep: torch.Tensor, causal: bool, host: HostPair = None) -> Plan:
    """The self-attention plan of the device's path (:func:`onmt_doc.devices.fused`): sentence
    offsets built on the host from ``host`` (the batch's host copies of ``tags`` and ``keep``) for the
    fused path, packed blocks (:func:`plan_self`) otherwise."""
    if _fused(tags.device):
        host_tags, host_keep = host if host is not None else (tags.cpu(), keep.cpu())
        return plan_self_segments(host_tags, host_keep, causal).to(tags.device)
    return plan_self(tags, keep, causal)


@host_planning
def cross_plan(
    q_tags: torch.Tensor,
    q_keep: torch.Tensor,
    k_tags: torch.Tensor,
    k_keep: torch.Tensor,
    q_host: HostPair = None,
    k_host: HostPair = None,
) -> Plan:
    """:func:`self_plan` for cross-attention (:func:`plan_cross` on the packed path)."""
    if _fused(q_tags.device):
        qt, qk = q_host if q_host is not None else (q_tags.cpu(), q_keep.cpu())
        kt, kk = k_host if k_host is not None else (k_tags.cpu(), k_keep.cpu())
        return plan_cross_segments(qt, qk, kt, kk).to(q_tags.device)
    return plan_cross(q_tags, q_keep, k_tags, k_keep)


def group_attend(
    plan: Plan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout: float = 0.0,
    probe: Optional[str] = None,
) -> torch.Tensor:
    """Attention of q [B, H, Nq, d] over k, v [B, H, Nk, d] within blocks; returns [B, H, Nq, d]
    (zeros at padding queries). ``probe`` names the entropy statistic recorded during analysis.
    A :class:`~onmt_doc.modules.varlen_attention.SegmentPlan` runs the fused path."""
    if isinstance(plan, SegmentPlan):
        return segment_attend(plan, q, k, v, dropout)
    b, h, nq, d = q.shape
    flat = [x.transpose(1, 2).reshape(-1, h, d) for x in (q, k, v)]
    outputs = []
    for blk in plan.buckets:  # one SDPA call per length bucket
        qb, kb, vb = (_take(x, i).transpose(1, 2) for x, i in zip(flat, (blk.q_index, blk.k_index, blk.k_index)))
        ob = _attend(qb, kb, vb, blk.mask, dropout, probe, blk.q_valid)
        if blk.has_keys is not None:
            ob = ob * blk.has_keys
        outputs.append(ob.transpose(1, 2).reshape(-1, h, d))
    if plan.free_pos.numel():
        qf = flat[0][plan.free_pos][:, :, None]  # [M, H, 1, d]
        of = _attend(
            qf,
            k[plan.free_row],
            v[plan.free_row],
            plan.free_mask,
            dropout,
            probe,
            torch.ones(qf.size(0), 1, dtype=torch.bool, device=q.device),
        )
        outputs.append(of[:, :, 0])
    out = q.new_zeros(b * nq, h, d)  # padding queries stay zero
    if outputs:
        real = torch.cat(outputs).index_select(0, plan.source)
        out = out.to(real.dtype).index_copy(0, plan.target, real)
    return out.view(b, nq, h, d).transpose(1, 2)


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of x [P, ...] at ``index`` [g, L] -> [g, L, ...] (``index_select``: a plain gather)."""
    return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    dropout: float,
    probe: Optional[str],
    queries: torch.Tensor,
) -> torch.Tensor:
    if probe is not None and analysis.active():
        probs = attention_probs(q, k, mask)
        analysis.record_entropy(probe, probs, queries)
        return probs.to(v.dtype) @ v
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)


# ---------------------------------------------------------------- incremental decoding
# A decoding step feeds one token per row. A query of sentence k sees only the keys of sentence k
# (eq. 8), so a group layer's cache need hold only each row's current sentence, and its
# cross-attention only the aligned source sentence: per step O(sentence), not O(instance), which
# keeps a token's cost flat however long the instance grows. Tag-0 queries after the first step
# (<eos>, <pad>) are never followed by a scored token, so they need no exact output.


def source_spans(src_tags: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, K+1] first position and length of each source sentence k (column 0, the tag of no
    sentence, has length 0). A source instance's tags are contiguous runs (``group_tags``)."""
    tags = src_tags * keep
    width = max(int(tags.max()), 1) + 1
    length = torch.zeros(tags.size(0), width, dtype=torch.long, device=tags.device)
    length.scatter_add_(1, tags, keep.long())
    length[:, 0] = 0
    positions = torch.arange(tags.size(1), device=tags.device).expand_as(tags)
    start = torch.full_like(length, tags.size(1))
    start.scatter_reduce_(1, tags, positions, "amin")
    return start.masked_fill(length.eq(0), 0), length


def source_block(
    start: torch.Tensor, length: torch.Tensor, tag: torch.Tensor, width: Optional[int] = None
) -> tuple[torch.Tensor, ...]:
    """Each row's aligned source sentence as a block of W slots, W the longest of these sentences
    (not of the whole source: a step reads only what its rows need), or ``width`` when given (the
    fused path: the batch's longest source sentence, known without a device read): the source positions [B, W],
    the attention mask [B, 1, 1, W] and whether the sentence exists [B, 1, 1, 1] (without one, e.g.
    at a tag-0 query, every slot is allowed and the output is zeroed, as in :func:`plan_cross`)."""
    first, n = start.gather(1, tag[:, None]), length.gather(1, tag[:, None])
    slots = torch.arange(width if width is not None else max(int(n.max()), 1), device=tag.device)
    valid, has = slots < n, n.gt(0)
    mask = (valid | ~has)[:, None, None, :]
    return first + slots, mask, has[:, :, None, None]


def rows_layout(x: torch.Tensor) -> torch.Tensor:
    """Keys or values [B, H, S, d] -> contiguous [B, S, H·d]: a source position is one row, so
    :func:`gather_block` copies whole rows."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d)


def heads_layout(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, S, H·d] from :func:`rows_layout` -> a [B, H, S, d] view."""
    b, s, hd = x.shape
    return x.view(b, s, heads, hd // heads).transpose(1, 2)


def gather_block(x: torch.Tensor, positions: torch.Tensor, heads: int) -> torch.Tensor:
    """x [B, S, H·d] (:func:`rows_layout`) at ``positions`` [B, L] (clamped to S) -> [B, H, L, d]."""
    b, s, hd = x.shape
    index = positions.clamp(max=s - 1) + torch.arange(b, device=x.device)[:, None] * s
    return heads_layout(x.view(b * s, hd).index_select(0, index.view(-1)).view(b, -1, hd), heads)


def write_sentence_cache(
    cache: Optional[tuple[torch.Tensor, torch.Tensor]],
    k: torch.Tensor,
    v: torch.Tensor,
    slot: torch.Tensor,
    capacity: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the new keys/values k, v [B, H, 1, d] at ``slot`` [B] of each row's sentence cache
    [B, H, C, d] (C starts at ``capacity``, doubles when a slot is beyond it)."""
    if cache is None:
        b, h, _, d = k.shape
        cache = (k.new_zeros(b, h, capacity, d), v.new_zeros(b, h, capacity, d))
    cache = grow_kv(cache, capacity)
    rows = torch.arange(k.size(0), device=k.device)
    cache[0][rows, :, slot] = k[:, :, 0]
    cache[1][rows, :, slot] = v[:, :, 0]
    return cache
