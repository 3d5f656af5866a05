"""The fused (GPU) path of group attention: sentences as variable-length sequences in one kernel call
(onmt_doc/modules/varlen_attention.py). It must compute eq. 8 exactly as the N×N masked reference,
forward and backward, with padding, one-sentence rows, a target sentence without a source sentence
and rows holding only ``<bos>``. On CUDA the flash kernel runs in bf16; elsewhere the padded kernel."""

from __future__ import annotations

import pytest
import torch
from test_g_transformer import dense_reference, random_tags

from onmt_doc import devices
from onmt_doc.modules.group_attention import cross_plan, group_attend, self_plan
from onmt_doc.modules.varlen_attention import SegmentPlan, padded_varlen_attention, plan_self_segments

# sentences of very different lengths; row 1 one sentence; row 4 no sentence at all (only <bos> on the
# target side, nothing on the source side)
SRC_ROWS = [[2, 31, 1, 6, 17], [40], [3, 3, 25, 2], [9, 1], []]
TGT_ROWS = [[3, 28, 2, 5, 20], [35], [1, 4, 30, 2], [8, 2, 3], []]  # row 3's third sentence has no source


def _inputs(device, q_rows, k_rows, q_bos, k_bos, seed=0):
    nq, nk = 2 + max(sum(r) for r in q_rows), 2 + max(sum(r) for r in k_rows)
    q_tags, q_keep = random_tags(None, q_rows, nq, q_bos)
    k_tags, k_keep = random_tags(None, k_rows, nk, k_bos)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(len(q_rows), 2, nq, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(len(k_rows), 2, nk, 16, generator=g, dtype=torch.float64) for _ in range(2))
    dev = [t.to(device) for t in (q_tags, q_keep, k_tags, k_keep)]
    return dev, (q_tags, q_keep), (k_tags, k_keep), (q, k, v)


def _check(plan, q64, k64, v64, dense_args, q_keep, device):
    """The fused output and gradients against the float64 dense reference: exact on the CPU (float64
    through the padded kernel), to bf16 rounding on CUDA (the flash kernel)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float64
    q, k, v = (x.to(device, dtype).requires_grad_() for x in (q64, k64, v64))
    ref_q, ref_k, ref_v = (x.clone().requires_grad_() for x in (q64, k64, v64))
    out = group_attend(plan, q, k, v)
    dense = dense_reference(ref_q, ref_k, ref_v, *dense_args)
    keep = q_keep[:, None, :, None].expand_as(dense)
    got = out.detach().to("cpu", torch.float64)
    assert got[~keep].abs().sum() == 0  # padding queries: zero
    w = torch.randn(dense.shape, dtype=torch.float64) * keep
    grads = torch.autograd.grad((out * w.to(device, dtype)).sum(), (q, k, v))
    want = torch.autograd.grad((dense * w).sum(), (ref_q, ref_k, ref_v))
    tol = 2e-2 if device.type == "cuda" else 1e-9
    for a, b in [(got[keep], dense[keep].detach())] + list(zip(grads, want)):
        a = a.to("cpu", torch.float64)
        assert (a - b).norm() <= tol * b.norm() + 1e-12, float((a - b).norm() / b.norm())


@pytest.mark.parametrize("causal,with_bos", [(False, False), (True, True), (True, False)])
def test_fused_self_attention_equals_dense_reference(causal, with_bos, device):
    dev, (tags, keep), _, (q, k, v) = _inputs(device, SRC_ROWS, SRC_ROWS, with_bos, with_bos)
    with devices.forced_path("fused"):
        plan = self_plan(dev[0], dev[1], causal, host=(tags, keep))
    assert isinstance(plan, SegmentPlan) and plan.cu_q.numel() - 1 == sum(len(r) for r in SRC_ROWS)
    _check(plan, q, k, v, (tags, keep, tags, keep, causal), keep, device)


def test_fused_cross_attention_equals_dense_reference(device):
    """Target sentence k with source sentence k; a target sentence without its source sentence and a
    row with only <bos> get what the reference gives (zero, and the whole (empty) row)."""
    dev, (qt, qk), (kt, kk), (q, k, v) = _inputs(device, TGT_ROWS, SRC_ROWS, True, False)
    with devices.forced_path("fused"):
        plan = cross_plan(*dev, q_host=(qt, qk), k_host=(kt, kk))
    assert plan.cu_q.numel() == plan.cu_k.numel() == sum(len(r) for r in SRC_ROWS) + 1  # matched sentences
    # rows whose <bos> has source keys to see (the reference gives the empty row's NaN-free zero too)
    _check(plan, q, k, v, (qt, qk, kt, kk, False), qk, device)
    out = group_attend(plan, q.to(device), k.to(device), v.to(device))
    assert out[3, :, 1 + 8 + 2 : 1 + 8 + 2 + 3].abs().sum() == 0  # row 3's third sentence: no source
    assert out[3, :, 1 : 1 + 8].abs().sum() > 0


def test_the_plan_is_built_on_the_host():
    """No plan field is read from the device: offsets and sizes come from host copies, and the plan is
    only moved (so a GPU step never waits for it)."""
    tags, keep = random_tags(None, SRC_ROWS, 50, False)
    plan = plan_self_segments(tags, keep, causal=False)
    assert isinstance(plan.max_q, int) and plan.max_q == 40
    assert plan.cu_q.dtype == torch.int32 and plan.cu_q.tolist()[-1] == int(keep.sum())


def test_padded_kernel_equals_each_sequence_alone():
    """The padded kernel (the flash kernel's reference) against attention over each sequence alone."""
    g = torch.Generator().manual_seed(3)
    lens_q, lens_k = [3, 1, 7], [4, 2, 7]
    q = torch.randn(sum(lens_q), 2, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(sum(lens_k), 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(x).cumsum(0).tolist(), dtype=torch.int32) for x in (lens_q, lens_k))
    out = padded_varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
    for i in range(3):
        qi, ki, vi = q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]]
        want = torch.softmax(qi.transpose(0, 1) @ ki.permute(1, 2, 0) / 8**0.5, -1) @ vi.transpose(0, 1)
        assert torch.allclose(out[cu_q[i] : cu_q[i + 1]], want.transpose(0, 1), atol=1e-12)


@pytest.mark.parametrize("path", ["fused", "packed"])
def test_g_transformer_stepwise_equals_teacher_forced_on_each_path(path, device):
    """The whole model on either path: the teacher-forced pass (varlen group attention on the fused
    path) and stepwise decoding (sentence caches masked at their capacity, source blocks at the longest
    sentence, no device read) give the same log-probabilities (1e-5), and the fused pass equals the
    packed one."""
    from model_helpers import random_model
    from test_decoding import stepwise_log_probs
    from test_g_transformer import G, doc_batch

    from onmt_doc.data.vocab import PAD_ID
    from onmt_doc.models.model import full_log_probs

    model, _ = random_model(G, device=device)
    batch = doc_batch().to(device)
    with torch.no_grad(), devices.forced_path(path):
        forced = full_log_probs(model, batch)
        stepped = stepwise_log_probs(model, batch, batch.tgt_in)
    with torch.no_grad(), devices.forced_path("packed"):
        packed = full_log_probs(model, batch)
    mask = batch.tgt_out.ne(PAD_ID)
    assert torch.allclose(forced[mask], stepped[mask], atol=1e-5), (forced - stepped)[mask].abs().max()
    assert torch.allclose(forced[mask], packed[mask], atol=1e-5)
