"""Packed group attention in length buckets (issue 16): cutting the blocks into buckets, each padded
to its own longest sentence, changes nothing but the padding computed."""

from __future__ import annotations

import pytest
import torch
from test_g_transformer import dense_reference, random_tags

from onmt_doc.modules.group_attention import group_attend, plan_cross, plan_self

ONE_BUCKET = 10**9  # a bucket costs more than any padding: the single-bucket plan
# sentences of very different lengths, several rows, a row with padding after its last sentence
SRC_ROWS = [[2, 31, 1, 6, 17], [40], [3, 3, 25, 2], [9, 1]]
TGT_ROWS = [[3, 28, 2, 5, 20], [35], [1, 4, 30, 2], [8, 2, 3]]  # row 3's third sentence has no source


def qkv(b: int, nq: int, nk: int, seed: int = 0, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drawn on the CPU (the same values on every device), then moved to ``device`` as leaves."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, 2, nq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, 2, nk, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return tuple(t.to(device).requires_grad_() for t in (q, k, v))


def assert_same(plan_a, plan_b, q, k, v, keep):
    out_a, out_b = group_attend(plan_a, q, k, v), group_attend(plan_b, q, k, v)
    assert torch.allclose(out_a, out_b, atol=1e-5)
    assert out_a[~keep[:, None, :, None].expand_as(out_a)].abs().sum() == 0  # padding queries: zero
    w = torch.randn_like(out_a)
    for ga, gb in zip(
        torch.autograd.grad((out_a * w).sum(), (q, k, v)), torch.autograd.grad((out_b * w).sum(), (q, k, v))
    ):
        assert torch.allclose(ga, gb, atol=1e-5)


def assert_equals_dense(plan, dense, q, k, v, keep):
    """Outputs and gradients of the packed attention equal the N×N masked reference (eq. 8) at real
    queries (the bucketed-vs-single comparison alone cannot see a fault both plans share)."""
    out = group_attend(plan, q, k, v)
    sel = keep[:, None, :, None].expand_as(dense)
    assert torch.allclose(out[sel], dense[sel], atol=1e-5)
    w = torch.randn_like(out) * sel
    for got, want in zip(
        torch.autograd.grad((out * w).sum(), (q, k, v)), torch.autograd.grad((dense * w).sum(), (q, k, v))
    ):
        assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("causal,with_bos", [(False, False), (True, True)])
def test_bucketed_self_attention_equals_single_bucket(causal, with_bos, device):
    n = 2 + max(sum(r) for r in SRC_ROWS)
    tags, keep = (t.to(device) for t in random_tags(None, SRC_ROWS, n, with_bos))
    bucketed, single = plan_self(tags, keep, causal, overhead=0), plan_self(tags, keep, causal, overhead=ONE_BUCKET)
    assert len(single.buckets) == 1 and len(bucketed.buckets) > 3  # the test compares different packings
    real = int(keep.logical_and(tags.gt(0)).sum())
    assert sum(int(b.q_valid.sum()) for b in bucketed.buckets) == real
    assert sum(b.q_valid.numel() for b in bucketed.buckets) < single.buckets[0].q_valid.numel()
    q, k, v = qkv(len(SRC_ROWS), n, n, device=device)
    assert_same(bucketed, single, q, k, v, keep)
    dense = dense_reference(q, k, v, tags, keep, tags, keep, causal)  # and both equal the N×N masks (eq. 8)
    assert_equals_dense(bucketed, dense, q, k, v, keep)


def test_bucketed_cross_attention_equals_single_bucket(device):
    """Target sentence k with source sentence k across buckets; a target sentence without a source
    sentence still gets a zero output."""
    src_tags, src_keep = random_tags(None, SRC_ROWS, 2 + max(sum(r) for r in SRC_ROWS), with_bos=False)
    tgt_tags, tgt_keep = random_tags(None, TGT_ROWS, 2 + max(sum(r) for r in TGT_ROWS), with_bos=True)
    src_tags, src_keep, tgt_tags, tgt_keep = (t.to(device) for t in (src_tags, src_keep, tgt_tags, tgt_keep))
    bucketed = plan_cross(tgt_tags, tgt_keep, src_tags, src_keep, overhead=0)
    single = plan_cross(tgt_tags, tgt_keep, src_tags, src_keep, overhead=ONE_BUCKET)
    assert len(single.buckets) == 1 and len(bucketed.buckets) > 3
    q, k, v = qkv(len(TGT_ROWS), tgt_tags.size(1), src_tags.size(1), device=device)
    assert_same(bucketed, single, q, k, v, tgt_keep)
    dense = dense_reference(q, k, v, tgt_tags, tgt_keep, src_tags, src_keep, causal=False)
    assert_equals_dense(bucketed, dense, q, k, v, tgt_keep)
    out = group_attend(bucketed, q, k, v)
    assert out[3, :, 1 + 8 + 2 : 1 + 8 + 2 + 3].abs().sum() == 0
    assert out[3, :, 1 : 1 + 8].abs().sum() > 0


def test_default_plan_uses_buckets_on_uneven_sentences():
    """The models' plans (default overhead) bucket blocks of very different lengths."""
    lengths = [[2] * 30 + [60] * 2]
    tags, keep = random_tags(None, lengths, 200, with_bos=False)
    buckets = plan_self(tags, keep, causal=True).buckets
    assert sorted(b.q_index.size(1) for b in buckets) == [2, 60]


def test_plan_gathers_have_no_hot_positions():
    """Padding slots must not all gather one position, nor padding queries all copy one zero row:
    the backward of a gather sums per position, and on CUDA thousands of duplicates of one position
    serialise that sum (pytorch/pytorch#41162; it made a G-Transformer step take 2.8 s on an H100)."""
    lengths = [[2] * 30 + [60] * 2, [3] * 5]  # short sentences padded to long ones, a short row
    tags, keep = random_tags(None, lengths, 200, with_bos=True)
    for plan in (plan_self(tags, keep, causal=True, overhead=ONE_BUCKET), plan_cross(tags, keep, tags, keep)):
        gathered = torch.cat([i.reshape(-1) for b in plan.buckets for i in (b.q_index, b.k_index)])
        fair = -(-gathered.numel() // tags.numel())  # every position gathered about equally often
        assert int(torch.bincount(gathered).max()) <= fair + 2
        assert plan.target.unique().numel() == plan.target.numel()  # each real output copied once
        assert plan.target.numel() == int(keep.sum())  # … and only real queries: padding stays zero
