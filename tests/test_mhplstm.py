"""MHPLSTM decoder (Xu et al., 2021): the parallel sublayer against a step-by-step loop of
eqs. 9–18, the cell scan on long sequences, stepwise decoding against the teacher-forced pass,
the constant decoding state, config errors and learning the toy corpus."""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from conftest import tiny_config
from model_helpers import random_batch, random_model
from test_decoding import SIZES, TRANSFORMER, assert_stepwise_matches

from onmt_doc import devices
from onmt_doc.config import config_from_dict
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.errors import ConfigError
from onmt_doc.models.model import full_log_probs
from onmt_doc.modules.hplstm import MultiHeadHPLSTM, linear_scan
from onmt_doc.train.trainer import train

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

MHPLSTM = {"encoder": TRANSFORMER["encoder"], "decoder": {"type": "mhplstm", "layers": 2, "heads": 4, "ff": 64}}


def mhplstm(**keys) -> dict:
    return {**MHPLSTM, "decoder": {**MHPLSTM["decoder"], **keys}}


# ----------------------------------------------------------------------------- reference loop


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-5) * weight + bias


def normed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, over_heads: bool) -> torch.Tensor:
    """Layer norm of [H, F]: each head's row on its own, or the whole block as one group."""
    if over_heads:
        return layer_norm(x.reshape(-1), weight.reshape(-1), bias.reshape(-1)).view_as(x)
    return torch.stack([layer_norm(x[k], weight[k], bias[k]) for k in range(x.size(0))])


def reference_row(m: MultiHeadHPLSTM, x: torch.Tensor, over_heads: bool = False) -> torch.Tensor:
    """Eqs. 9–21 for one unpadded row x [T, D], one position at a time. Layer norms per head, or
    (``over_heads``) over all heads as the released code groups them: LN(s), the output gate and
    eq. 14's hidden layer over d_model; both gates together; with eq. 13 both gates and h together."""
    h, d = m.heads, m.d_head
    hid = m.d_hidden
    joint = over_heads and m.hidden_out is None
    w_v = m.gates_hidden.weight.view(h, 2 * d, 2 * d + hid)
    b_v = m.gates_hidden.bias.view(h, 2 * d + hid)
    w_o, b_o = m.out_gate.weight.view(h, 2 * d, d), m.out_gate.bias.view(h, d)
    norms = [m.sum_norm, m.gate_norm, m.out_gate_norm] + ([] if joint else [m.hidden_norm])
    g_s, g_g, g_o, *g_h = (n.weight.view(h, -1) for n in norms)
    a_s, a_g, a_o, *a_h = (n.bias.view(h, -1) for n in norms)
    inputs = m.split(x)  # eq. 19
    rows, c = [], torch.zeros(h, d, device=x.device)
    for t in range(x.size(0)):
        i = inputs[t].view(h, d)
        s = inputs[:t].sum(0).view(h, d) if t else torch.zeros(h, d, device=x.device)  # eq. 9: s_1 = 0
        v = torch.cat([i, normed(s, g_s, a_s, over_heads)], -1)  # eq. 10
        pre = torch.einsum("hi,hio->ho", v, w_v) + b_v
        if joint:  # released eq. 13: one LN
            n = normed(pre, g_g, a_g, True)
            gate_in, hidden_in = n[:, : 2 * d], n[:, 2 * d :]
        elif over_heads:
            gate_in = normed(pre[:, : 2 * d], g_g, a_g, True)  # both gates, all heads
            hidden_in = normed(pre[:, 2 * d :], g_h[0], a_h[0], True)
        else:
            gate_in = torch.cat(
                [
                    normed(pre[:, :d], g_g[:, :d], a_g[:, :d], False),  # eq. 11
                    normed(pre[:, d : 2 * d], g_g[:, d:], a_g[:, d:], False),
                ],
                -1,
            )  # eq. 12
            hidden_in = normed(pre[:, 2 * d :], g_h[0], a_h[0], False)
        i_g, f_g = torch.sigmoid(gate_in[:, :d]), torch.sigmoid(gate_in[:, d:])
        hidden = torch.relu(hidden_in)  # eq. 13
        if m.hidden_out is not None:  # eq. 14
            hidden = torch.einsum("hi,hio->ho", hidden, m.hidden_out.weight.view(h, hid, d)) + m.hidden_out.bias.view(
                h, d
            )
        c = c * f_g + hidden * i_g  # eqs. 15, 16
        o_pre = torch.einsum("hi,hio->ho", torch.cat([i, c], -1), w_o) + b_o
        o_g = torch.sigmoid(normed(o_pre, g_o, a_o, over_heads))  # eq. 17
        rows.append(m.merge((c * o_g).reshape(-1)))  # eqs. 18, 21
    return torch.stack(rows)


@pytest.mark.parametrize("hidden_layers", [2, 1])
@pytest.mark.parametrize("norm_group", ["per_head", "all_heads"])
def test_parallel_sublayer_equals_step_by_step_loop(hidden_layers, norm_group, device):
    """Outputs and gradients (input and every parameter) of the parallel pass equal the loop of
    eqs. 9–18 on the real positions of a padded batch whose padding holds large garbage, with
    layer-norm statistics over the group ``norm_group`` names. Drawn on the CPU, run on ``device``."""
    torch.manual_seed(0)
    m = MultiHeadHPLSTM(16, 2, 0.0, hidden_layers=hidden_layers, norm_group=norm_group)
    for p in m.parameters():  # move norms and biases away from 1 / 0
        torch.nn.init.normal_(p, std=0.5)
    lengths = [9, 4, 6]
    x = torch.randn(3, 9, 16)
    for row, n in enumerate(lengths):
        x[row, n:] = 100.0
    weights = torch.randn(3, 9, 16)
    m, x, weights = m.to(device), x.to(device).requires_grad_(), weights.to(device)
    out, _ = m(x)
    fast = sum((out[r, :n] * weights[r, :n]).sum() for r, n in enumerate(lengths))
    fast_grads = torch.autograd.grad(fast, [x, *m.parameters()])
    over = norm_group == "all_heads"
    ref_out = [reference_row(m, x[r, :n], over) for r, n in enumerate(lengths)]
    ref = sum((o * weights[r, :n]).sum() for r, (o, n) in enumerate(zip(ref_out, lengths)))
    ref_grads = torch.autograd.grad(ref, [x, *m.parameters()])
    for r, n in enumerate(lengths):
        assert torch.allclose(out[r, :n], ref_out[r], atol=1e-5), (out[r, :n] - ref_out[r]).abs().max()
    names = ["x"] + [name for name, _ in m.named_parameters()]
    for name, a, b in zip(names, fast_grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (name, (a - b).abs().max())
    assert fast_grads[0][0].abs().sum() > 0 and fast_grads[0][1, 4:].abs().sum() == 0  # padding gets none
    if hidden_layers == 2:  # same parameters in both groupings: the other one's reference differs
        assert not torch.allclose(out[0].detach(), reference_row(m, x[0].detach(), not over), atol=1e-3)


@pytest.mark.parametrize("parts", [1, 2])
def test_layer_norm_statistics_per_head_or_over_all_heads(parts):
    """GroupedLayerNorm with unit gain and zero bias on [H, N, (parts,) d] whose heads have very
    different scales: per head, every head's features (each part's) have mean 0 and variance 1 and
    a head ignores the others; over all heads, only a position's whole [H, (parts,) d] block has,
    and changing one head moves the others."""
    from onmt_doc.modules.hplstm import GroupedLayerNorm

    h, d = 3, 8
    tail = (parts, d) if parts > 1 else (d,)
    x = torch.randn(h, 5, *tail) * torch.tensor([1.0, 10.0, 100.0]).view(h, 1, *([1] * len(tail))) + 3.0
    if parts > 1:
        x[..., 1, :] *= 7.0  # parts of unequal scale
    bumped = x.clone()
    bumped[2] *= 5.0  # change head 2 only
    per_head = GroupedLayerNorm(h, d, parts, over_heads=False)
    all_heads = GroupedLayerNorm(h, d, parts, over_heads=True)
    y = per_head(x)
    assert torch.allclose(y.mean(-1), torch.zeros(()), atol=1e-5)
    assert torch.allclose(y.var(-1, unbiased=False), torch.ones(()), atol=1e-3)
    assert torch.allclose(per_head(bumped)[:2], y[:2])
    z = all_heads(x)
    block = z.movedim(0, 1).reshape(5, -1)  # a position's H·parts·d features
    assert torch.allclose(block.mean(-1), torch.zeros(()), atol=1e-5)
    assert torch.allclose(block.var(-1, unbiased=False), torch.ones(()), atol=1e-3)
    assert not torch.allclose(z.var(-1, unbiased=False), torch.ones(()), atol=0.1)  # heads are not
    if parts > 1:  # nor is one part over all heads
        assert not torch.allclose(
            z[..., 0, :].movedim(0, 1).reshape(5, -1).var(-1, unbiased=False), torch.ones(()), atol=0.1
        )
    assert not torch.allclose(all_heads(bumped)[:2], z[:2], atol=1e-3)


def loop_scan(f: torch.Tensor, hr: torch.Tensor, c0: Optional[torch.Tensor] = None) -> torch.Tensor:
    c, out = torch.zeros_like(hr[:, 0]) if c0 is None else c0, []
    for t in range(f.size(1)):
        c = c * f[:, t] + hr[:, t]
        out.append(c)
    return torch.stack(out, 1)


@pytest.mark.parametrize("path", devices.PATHS)
@pytest.mark.parametrize("gate_bias", [-12.0, 0.0, 8.0], ids=["f_near_0", "f_mid", "f_near_1"])
def test_scan_is_exact_on_long_sequences(gate_bias, path, device):
    """T = 256 in float32 on ``device`` and either kernel path (a loop; recursive doubling) against a
    float64 loop on the CPU, with forget gates down to ~1e-6: values and gradients within 1e-5 of the
    largest reference value, nothing infinite or NaN."""
    g = torch.Generator().manual_seed(1)  # drawn on the CPU: the same inputs on every device
    f = torch.sigmoid(torch.randn(2, 256, 24, generator=g) * 2 + gate_bias)
    hr = torch.randn(2, 256, 24, generator=g)
    probe = torch.randn(2, 256, 24, generator=g)
    f_dev, hr_dev = (t.to(device).requires_grad_() for t in (f, hr))
    with devices.forced_path(path):
        c = linear_scan(f_dev, hr_dev)
        grads = torch.autograd.grad((c * probe.to(device)).sum(), [f_dev, hr_dev])
    f64, hr64 = (t.double().requires_grad_() for t in (f, hr))
    c64 = loop_scan(f64, hr64)
    grads64 = torch.autograd.grad((c64 * probe.double()).sum(), [f64, hr64])
    for a, b in zip([c, *grads], [c64, *grads64]):
        a = a.detach().cpu()
        assert torch.isfinite(a).all()
        assert (a.double() - b).abs().max() <= 1e-5 * b.abs().max()


@pytest.mark.parametrize("path", devices.PATHS)
def test_the_scan_continues_from_a_cell_at_every_length(path):
    """Every length from 2 to 33 (each round count of the doubling, and the lengths between powers of
    two), continued from a cell c0: cells and the gradients of f, h_r and c0 equal a float64
    step-by-step loop's (1e-12)."""
    g = torch.Generator().manual_seed(3)
    for t in range(2, 34):
        f = torch.rand(2, t, 3, 4, generator=g, dtype=torch.float64)
        hr, probe = torch.randn(2, 2, t, 3, 4, generator=g, dtype=torch.float64)
        c0 = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
        inputs = [x.clone().requires_grad_() for x in (f, hr, c0)]
        with devices.forced_path(path):
            c = linear_scan(*inputs)
            got = [c, *torch.autograd.grad((c * probe).sum(), inputs)]
        ref_inputs = [x.clone().requires_grad_() for x in (f, hr, c0)]
        ref = loop_scan(*ref_inputs)
        want = [ref, *torch.autograd.grad((ref * probe).sum(), ref_inputs)]
        for a, b in zip(got, want):
            assert torch.allclose(a, b, rtol=0, atol=1e-12), t


@pytest.mark.parametrize("path", devices.PATHS)
def test_the_scan_operators_pass_torchs_custom_operator_checks(path):
    """``torch.library.opcheck`` on both scan operators with head-major (non-contiguous) inputs, as the
    sublayer passes them: schema, fake (traced) shapes and strides against the real kernels, autograd
    registration and AOT dispatch. A fake output with the input's strides passed eager tests and failed
    only inside an inductor-compiled backward."""
    from onmt_doc.modules.hplstm import scan_backward_op, scan_op

    g = torch.Generator().manual_seed(5)

    def head_major(*shape: int) -> torch.Tensor:  # [B, T, H, d] storage seen as [H, T, B, d]
        return torch.rand(*shape, generator=g).permute(2, 1, 0, 3)

    f, hr = head_major(3, 6, 2, 4), head_major(3, 6, 2, 4)
    c0 = torch.randn(2, 3, 4, generator=g)
    with devices.forced_path(path):
        torch.library.opcheck(scan_op, (f.requires_grad_(), hr.requires_grad_(), c0.requires_grad_()))
        torch.library.opcheck(scan_backward_op, (f.detach(), head_major(3, 6, 2, 4)))


@pytest.mark.parametrize("path", devices.PATHS)
def test_torch_compile_traces_the_sublayer_in_one_graph(path):
    """``torch.compile`` sees the cell scan as one operator: the sublayer's forward is one graph on
    either kernel path (a TorchScript function cut it into five at one layer, eleven graphs for a
    two-layer decoder's training step), and the compiled forward and backward equal eager ones for
    lengths it has not seen (dynamic shapes: one compilation)."""
    torch.manual_seed(0)
    m = MultiHeadHPLSTM(32, 4, 0.0)

    def loss(x: torch.Tensor) -> torch.Tensor:
        return (m(x)[0] * torch.linspace(-1, 1, x.size(1)).view(1, -1, 1)).sum()

    with devices.forced_path(path):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(loss)(torch.randn(3, 7, 32))
        assert explained.graph_count == 1, [str(b.reason)[:120] for b in explained.break_reasons]
        torch._dynamo.reset()
        compiled = torch.compile(loss, backend="aot_eager", dynamic=True)
        for t in (5, 9, 17):
            x = torch.randn(3, t, 32, requires_grad=True)
            want = torch.autograd.grad(loss(x), [x, *m.parameters()])
            got = torch.autograd.grad(compiled(x), [x, *m.parameters()])
            assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want)), t
        torch._dynamo.reset()


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize(
    "keys",
    [
        {},
        {"ffn": False},
        {"positions": False},
        {"hidden_layers": 1},
        {"pre_norm": False},
        {"norm_group": "all_heads"},
        {"norm_group": "all_heads", "hidden_layers": 1},
    ],
    ids=[
        "default",
        "no_ffn",
        "no_positions",
        "hidden_1_layer",
        "post_norm",
        "norm_all_heads",
        "norm_all_heads_hidden_1_layer",
    ],
)
def test_stepwise_equals_teacher_forced(keys, device):
    """Token-by-token decoding equals the teacher-forced pass, also with the batch permuted (a
    full beam reorder) after 3 steps."""
    model, _ = random_model(mhplstm(**keys), device=device)
    assert_stepwise_matches(model, random_batch(SIZES, device=device), torch.tensor([2, 0, 3, 1]), reorder_at=3)


def test_beams_shuffled_within_sentences_at_every_step(device):
    """As in beam search: rows expanded per beam and reordered within their sentence
    (same_sources=True) before every step; each row's step equals the teacher-forced pass. The
    shuffles are drawn on the CPU (the same on every device)."""
    model, _ = random_model(MHPLSTM, device=device)
    batch = random_batch(SIZES[:2], device=device)
    k, g = 3, torch.Generator().manual_seed(0)
    with torch.no_grad():
        expected = full_log_probs(model, batch).repeat_interleave(k, 0)
        tgt_in, keep = batch.tgt_in.repeat_interleave(k, 0), batch.tgt_out.repeat_interleave(k, 0).ne(PAD_ID)
        expand = torch.arange(2, device=device).repeat_interleave(k)
        state = model.init_state(model.encode(batch), batch).reorder(expand)
        held = torch.arange(2 * k, device=device)  # which expanded row each state row holds
        for t in range(tgt_in.size(1)):
            within = torch.cat([torch.randperm(k, generator=g) + j * k for j in range(2)]).to(device)
            state, held = state.reorder(within, same_sources=True), held[within]
            lp, state = model.step(tgt_in[held, t], state)
            real = keep[held, t]
            assert torch.allclose(lp[real], expected[held, t][real], atol=1e-5), t


def state_sizes(section: dict, steps: int) -> list[int]:
    model, _ = random_model(section)
    batch = random_batch(SIZES)
    sizes = []
    with torch.no_grad():
        state = model.init_state(model.encode(batch), batch)
        tokens = batch.tgt_in[:, 0]
        for _ in range(steps):
            lp, state = model.step(tokens, state)
            tokens = lp.argmax(-1)
            sizes.append(state.nbytes())
    return sizes


def test_decoding_state_does_not_grow():
    """The MHPLSTM state holds the same bytes after 1 and after 80 steps, on both kernel paths; the
    Transformer's (same shapes) holds its self-attention caches, so the measure sees growth: the
    prefix itself on the packed path (one slot a step), on the fused path allocated for 64 positions
    without a length limit and doubled past them."""
    for path in ("packed", "fused"):
        with devices.forced_path(path):
            sizes = state_sizes(MHPLSTM, 80)
            grown = state_sizes(TRANSFORMER, 80)
        assert len(set(sizes)) == 1, (path, sizes)
        if path == "packed":
            assert all(a < b for a, b in zip(grown, grown[1:]))
        else:
            assert grown[0] == grown[63] < grown[64] == grown[79]


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("hidden_layers", 3, "hidden_layers: must be 1 or 2"),
        ("hidden_ratio", 0, "hidden_ratio: must be at least 1"),
        ("norm_group", "per_model", "norm_group"),
    ],
)
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ConfigError, match=f"model.decoder.{message}"):
        random_model(mhplstm(**{key: value}))


# ----------------------------------------------------------------------------- learning


def test_tiny_mhplstm_learns_sentence_level_toy_like_the_transformer(toy_dir, tmp_path):
    """The bars of tests/test_training.py's Transformer of the same size (acc > 90%, ppl < 1.6,
    BLEU > 70 after 300 steps), with the MHPLSTM decoder and a parameter count within 15% of it."""
    from onmt_doc.data.prepare import build_codec
    from onmt_doc.models.builder import build_model

    decoder = {"type": "mhplstm", "layers": 2, "heads": 4, "ff": 128}
    cfg = tiny_config(
        toy_dir, tmp_path / "run", train={"max_steps": 300, "valid_every": 300, "save_every": 300, "valid_bleu": True}
    )
    transformer_cfg = config_from_dict(cfg)
    cfg["model"]["decoder"] = decoder
    metrics = train(config_from_dict(cfg))
    assert metrics["acc"] > 90.0, metrics
    assert metrics["ppl"] < 1.6, metrics
    assert metrics["bleu"] > 70.0, metrics
    codec = build_codec(transformer_cfg.data, transformer_cfg.vocab, str(tmp_path / "run"))
    ours = build_model(config_from_dict(cfg).model, codec).n_params()
    theirs = build_model(transformer_cfg.model, codec).n_params()
    assert abs(ours / theirs - 1) < 0.15, (ours, theirs)
