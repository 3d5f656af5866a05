"""Joint-representation Reformer: separable attention against per-slice references, Reduction,
Dropout1d/2d mask sharing, stepwise decoding == teacher forcing (with beam reordering), gradient
checkpointing, and a small Reformer-fast that learns the toy corpus."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config
from model_helpers import random_batch, random_model
from test_decoding import SIZES, stepwise_log_probs

from onmt_doc.config import config_from_dict
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.models.model import full_log_probs
from onmt_doc.modules.separable import (
    SOURCE_AXIS,
    TARGET_AXIS,
    Dropout1d,
    Dropout2d,
    Reduction,
    SourceAttention,
    TargetAttention,
)
from onmt_doc.train.trainer import train
from onmt_doc.translate.length_penalty import GNMTPenalty
from onmt_doc.translate.search import BeamSearch

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

REFORMER = {"layers": 2, "heads": 4, "ff": 64}
BASE = {"encoder": {"type": "embedding"}, "decoder": {"type": "reformer", **REFORMER}}
FAST = {
    "encoder": {"type": "transformer", "layers": 1, "heads": 4, "ff": 64},
    "decoder": {"type": "reformer", **REFORMER},
}


# ----------------------------------------------------------------------------- references


def explicit_attention(mha, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √d + mask) v per head, written out from the module's weights; x [L, E] one
    slice, keep [L, L] True where query i may see key j."""
    heads, d_head = mha.heads, mha.d_head
    q, k, v = (x @ mha.qkv.weight.T + mha.qkv.bias).split(heads * d_head, dim=-1)
    outs = []
    for h in range(heads):
        cols = slice(h * d_head, (h + 1) * d_head)
        scores = q[:, cols] @ k[:, cols].T / d_head**0.5
        probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
        outs.append(probs @ v[:, cols])
    return torch.cat(outs, -1) @ mha.out.weight.T + mha.out.bias


def joint_example(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A [B=2, T=5, S=4, E=16] joint tensor and a source keep-mask with padding in row 1."""
    torch.manual_seed(seed)
    x = torch.randn(2, 5, 4, 16)
    keep = torch.tensor([[True, True, True, True], [True, True, False, False]])
    return x, keep


# ----------------------------------------------------------------------------- separable attention


def test_target_attention_equals_causal_attention_per_source_slice(device):
    x, _ = joint_example()
    attn = TargetAttention(16, 4, 0.0).eval().to(device)
    x = x.to(device)
    t = x.size(1)
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    with torch.no_grad():
        out = attn(x)
        for b in range(x.size(0)):
            for s in range(x.size(2)):  # eq. 5: one attention along T per source position
                ref = explicit_attention(attn.attn, x[b, :, s], causal)
                assert torch.allclose(out[b, :, s], ref, atol=1e-5), (b, s)


def test_source_attention_equals_masked_attention_per_target_slice(device):
    x, keep = joint_example(1)
    attn = SourceAttention(16, 4, 0.0).eval().to(device)
    x, keep = x.to(device), keep.to(device)
    with torch.no_grad():
        out = attn(x, keep)
        for b in range(x.size(0)):
            for t in range(x.size(1)):  # eq. 5: one attention along S per target position
                visible = keep[b][None, :].expand(x.size(2), -1)
                ref = explicit_attention(attn.attn, x[b, t], visible)
                assert torch.allclose(out[b, t], ref, atol=1e-5), (b, t)


def test_reduction_equals_per_channel_softmax_over_real_source_positions(device):
    x, keep = joint_example(2)
    red = Reduction(16).eval()
    with torch.no_grad():
        torch.nn.init.normal_(red.score.weight)  # drawn on the CPU: the same weights on every device
        red, x, keep = red.to(device), x.to(device), keep.to(device)
        out = red(x, keep)
        for b in range(x.size(0)):
            for t in range(x.size(1)):
                xs = red.input_norm(x[b, t][keep[b]])  # [S_real, E]
                heads = []
                for i in range(xs.size(1)):  # eq. 6, head_i = softmax(W_i xᵀ) x_i
                    w = (red.score.weight[i] @ xs.T).softmax(-1)
                    heads.append(w @ xs[:, i])
                ref = red.output_norm(torch.stack(heads))
                assert torch.allclose(out[b, t], ref, atol=1e-5), (b, t)
        # padded source positions cannot leak into the output
        x2 = x.clone()
        x2[1, :, 2:] = 1e3
        assert torch.allclose(red(x2, keep), out, atol=1e-5)


# ----------------------------------------------------------------------------- Dropout1d / 2d


def kept(module, shape) -> torch.Tensor:
    torch.manual_seed(0)
    return module.train()(torch.ones(shape)) != 0


def varies_along(mask: torch.Tensor, axis: int) -> bool:
    return bool((mask != mask.narrow(axis, 0, 1)).any())


@pytest.mark.parametrize(
    "module, shared",
    [
        (Dropout1d(0.5, SOURCE_AXIS), [SOURCE_AXIS]),  # target attention output
        (Dropout1d(0.5, TARGET_AXIS), [TARGET_AXIS]),  # source attention output
        (Dropout2d(0.5), [TARGET_AXIS, SOURCE_AXIS]),  # FFN output
    ],
    ids=["1d_along_S", "1d_along_T", "2d"],
)
def test_shared_dropout_masks_are_constant_exactly_along_their_axes(module, shared):
    shape = (3, 6, 7, 32)  # [B, T, S, E]
    mask = kept(module, shape)
    for axis in range(4):
        if axis in shared:
            assert not varies_along(mask, axis), f"noise differs along axis {axis}"
        else:
            assert varies_along(mask, axis), f"noise is shared along axis {axis} too"
    assert module.mask_shape(torch.Size(shape)) == tuple(1 if a in shared else n for a, n in enumerate(shape))
    y = module.train()(torch.ones(shape))
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 2.0))  # inverted scaling
    assert 0.35 < mask.float().mean() < 0.65
    assert torch.equal(module.eval()(torch.ones(shape)), torch.ones(shape))


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize(
    "section, perm",
    [(BASE, None), (FAST, None), (FAST, [2, 0, 3, 1]), (BASE, [3, 3, 0, 1])],
    ids=["base", "fast", "fast_reordered", "base_reordered"],
)
def test_stepwise_equals_teacher_forced(section, perm, device):
    """Row by row through every layer with cached target-axis keys/values == the whole T×S block;
    with ``perm`` the state is reordered at step 3 as beam search does (rows repeated too)."""
    model, _ = random_model(section, device=device)
    batch = random_batch(SIZES, device=device)
    perm = torch.arange(len(SIZES), device=device) if perm is None else torch.tensor(perm, device=device)
    with torch.no_grad():
        forced = full_log_probs(model, batch)[perm]
        stepped = stepwise_log_probs(model, batch, batch.tgt_in, reorder_at=3, perm=perm)
    mask = batch.tgt_out[perm].ne(PAD_ID)
    assert torch.allclose(forced[mask], stepped[mask], atol=1e-5), (forced - stepped)[mask].abs().max()


def test_beam_internal_reorder_keeps_source_fields(device):
    """Rows expanded per beam, then shuffled inside their sentence with same_sources=True: the
    memory is not reordered, the target-axis caches are."""
    model, _ = random_model(BASE, device=device)
    batch = random_batch(SIZES[:2], device=device)
    expand = torch.arange(2, device=device).repeat_interleave(3)
    within = torch.tensor([2, 0, 1, 4, 5, 3], device=device)
    with torch.no_grad():
        state = model.init_state(model.encode(batch), batch).reorder(expand)
        tgt, steps = batch.tgt_in[expand], []
        for t in range(tgt.size(1)):
            if t == 2:
                state, tgt, steps = state.reorder(within, same_sources=True), tgt[within], [s[within] for s in steps]
            lp, state = model.step(tgt[:, t], state)
            steps.append(lp)
        expected = full_log_probs(model, batch)[expand][within]
    mask = batch.tgt_out[expand][within].ne(PAD_ID)
    assert torch.allclose(expected[mask], torch.stack(steps, 1)[mask], atol=1e-5)


def test_decoding_cache_holds_one_row_per_step_and_layer():
    """The state grows by one S-row per step per layer; nothing of size T×S is recomputed or kept."""
    model, _ = random_model(FAST)
    batch = random_batch(SIZES)
    b, s = batch.src.shape
    with torch.no_grad():
        state = model.init_state(model.encode(batch), batch)
        for t in range(3):
            _, state = model.step(batch.tgt_in[:, t], state)
    for k, v in state.target_kv:
        assert k.shape == v.shape == (b, s, 4, 3, 32 // 4)


def test_beam_search_finished_sentences_do_not_change_results(device):
    model, _ = random_model(FAST, seed=7, device=device)
    search = BeamSearch(beam=3, penalty=GNMTPenalty(0.6), max_len_ratio=1.5, max_len_add=3)
    batch = random_batch(SIZES, seed=4, device=device)
    with torch.no_grad():
        together = search.search(model, batch)
        for i in range(len(SIZES)):
            n = int(batch.src[i].ne(PAD_ID).sum())
            one = type(batch)(src=batch.src[i : i + 1, :n], src_groups=batch.src_groups[i : i + 1, :n])
            alone = search.search(model, one)
            assert alone[0][0].tokens == together[i][0].tokens
            assert abs(alone[0][0].score - together[i][0].score) < 1e-4


# ----------------------------------------------------------------------------- training


def test_checkpointed_layers_save_less_and_give_the_same_gradients():
    """Recomputing layers in backward (dropout on: the RNG state must be replayed) changes no
    gradient, and autograd keeps far fewer activation elements until the backward pass."""
    grads, saved = [], []
    for flag in (False, True):
        model, _ = random_model({**FAST, "dropout": 0.3, "decoder": {**FAST["decoder"], "checkpoint_layers": flag}})
        model.train()
        torch.manual_seed(11)
        count = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            count[0] += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(random_batch(SIZES))
            loss = torch.nn.functional.cross_entropy(out.logits, out.target)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        saved.append(count[0])
    assert saved[1] < 0.5 * saved[0], saved
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def test_reformer_config_rejects_heads_that_do_not_divide_d_model():
    from onmt_doc.errors import ConfigError

    with pytest.raises(ConfigError, match="model.decoder.heads"):
        config_from_dict({"model": {"d_model": 32, "decoder": {"type": "reformer", "heads": 5}}})


def test_small_reformer_fast_learns_sentence_level_toy(toy_dir, tmp_path):
    """Bound as for the Transformer: validation accuracy > 90% and ppl < 1.6 after 300 steps
    (untrained: ~0% and ~vocabulary size). 1 PreNet + 1 Reformer layer, batches of 512 tokens (a
    Reformer step costs ~S times a Transformer's), a higher learning rate than the Transformer test's."""
    cfg = tiny_config(
        toy_dir,
        tmp_path / "run",
        train={"max_steps": 300, "valid_every": 300, "save_every": 300, "batch_tokens": 512},
        optim={"lr": 5.0e-3},
        model={
            "encoder": {"type": "transformer", "layers": 1, "heads": 4, "ff": 128},
            "decoder": {"type": "reformer", "layers": 1, "heads": 4, "ff": 128},
        },
    )
    metrics = train(config_from_dict(cfg))
    assert metrics["acc"] > 90.0, metrics
    assert metrics["ppl"] < 1.6, metrics
