"""MHPLSTM decoder (Xu et al., 2021): the parallel sublayer against a step-by-step loop of
eqs. 9–18, the cell scan on long sequences, stepwise decoding against the teacher-forced pass,
the constant decoding state, config errors and learning the toy corpus."""
from __future__ import annotations

import pytest
import torch

from onmt_doc.config import config_from_dict
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.errors import ConfigError
from onmt_doc.models.model import full_log_probs
from onmt_doc.modules.hplstm import MultiHeadHPLSTM, linear_scan
from onmt_doc.train.trainer import train

from conftest import tiny_config
from model_helpers import random_batch, random_model
from test_decoding import SIZES, TRANSFORMER, assert_stepwise_matches

MHPLSTM = {"encoder": TRANSFORMER["encoder"],
           "decoder": {"type": "mhplstm", "layers": 2, "heads": 4, "ff": 64}}


def mhplstm(**keys) -> dict:
    return {**MHPLSTM, "decoder": {**MHPLSTM["decoder"], **keys}}


# ----------------------------------------------------------------------------- reference loop

def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-5) * weight + bias


def reference_row(m: MultiHeadHPLSTM, x: torch.Tensor) -> torch.Tensor:
    """Eqs. 9–21 for one unpadded row x [T, D], one position and one head at a time."""
    h, d = m.heads, m.d_head
    hid = m.d_hidden
    w_v = m.gates_hidden.weight.view(h, 2 * d, 2 * d + hid)
    b_v = m.gates_hidden.bias.view(h, 2 * d + hid)
    w_o, b_o = m.out_gate.weight.view(h, 2 * d, d), m.out_gate.bias.view(h, d)
    g_s, g_g, g_h, g_o = (n.weight.view(h, -1) for n in (m.sum_norm, m.gate_norm, m.hidden_norm, m.out_gate_norm))
    a_s, a_g, a_h, a_o = (n.bias.view(h, -1) for n in (m.sum_norm, m.gate_norm, m.hidden_norm, m.out_gate_norm))
    inputs = m.split(x)                                                   # eq. 19
    rows = []
    for t in range(x.size(0)):
        heads = []
        for k in range(h):
            hd = slice(k * d, (k + 1) * d)
            i = inputs[t, hd]
            s = sum((inputs[j, hd] for j in range(t)), torch.zeros(d))   # eq. 9: s_1 = 0
            v = torch.cat([i, layer_norm(s, g_s[k], a_s[k])])            # eq. 10
            pre = v @ w_v[k] + b_v[k]
            i_g = torch.sigmoid(layer_norm(pre[:d], g_g[k, :d], a_g[k, :d]))         # eq. 11
            f_g = torch.sigmoid(layer_norm(pre[d:2 * d], g_g[k, d:], a_g[k, d:]))    # eq. 12
            hidden = torch.relu(layer_norm(pre[2 * d:], g_h[k], a_h[k]))             # eq. 13
            if m.hidden_out is not None:                                              # eq. 14
                hidden = hidden @ m.hidden_out.weight.view(h, hid, d)[k] + m.hidden_out.bias.view(h, d)[k]
            prev = heads_c[k] if t else torch.zeros(d)
            c = prev * f_g + hidden * i_g                                 # eqs. 15, 16
            o_g = torch.sigmoid(layer_norm(torch.cat([i, c]) @ w_o[k] + b_o[k], g_o[k], a_o[k]))  # eq. 17
            heads.append((c, c * o_g))                                   # eq. 18
        heads_c = [c for c, _ in heads]
        rows.append(m.merge(torch.cat([o for _, o in heads])))          # eq. 21
    return torch.stack(rows)


@pytest.mark.parametrize("hidden_layers", [2, 1])
def test_parallel_sublayer_equals_step_by_step_loop(hidden_layers):
    """Outputs and gradients (input and every parameter) of the parallel pass equal the loop of
    eqs. 9–18 on the real positions of a padded batch whose padding holds large garbage."""
    torch.manual_seed(0)
    m = MultiHeadHPLSTM(16, 2, 0.0, hidden_layers=hidden_layers)
    for p in m.parameters():                     # move norms and biases away from 1 / 0
        torch.nn.init.normal_(p, std=0.5)
    lengths = [9, 4, 6]
    x = torch.randn(3, 9, 16)
    for row, n in enumerate(lengths):
        x[row, n:] = 100.0
    x.requires_grad_()
    weights = torch.randn(3, 9, 16)
    out, _ = m(x)
    fast = sum((out[r, :n] * weights[r, :n]).sum() for r, n in enumerate(lengths))
    fast_grads = torch.autograd.grad(fast, [x, *m.parameters()])
    ref_out = [reference_row(m, x[r, :n]) for r, n in enumerate(lengths)]
    ref = sum((o * weights[r, :n]).sum() for r, (o, n) in enumerate(zip(ref_out, lengths)))
    ref_grads = torch.autograd.grad(ref, [x, *m.parameters()])
    for r, n in enumerate(lengths):
        assert torch.allclose(out[r, :n], ref_out[r], atol=1e-5), (out[r, :n] - ref_out[r]).abs().max()
    names = ["x"] + [name for name, _ in m.named_parameters()]
    for name, a, b in zip(names, fast_grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (name, (a - b).abs().max())
    assert fast_grads[0][0].abs().sum() > 0 and fast_grads[0][1, 4:].abs().sum() == 0   # padding gets none


def loop_scan(f: torch.Tensor, hr: torch.Tensor) -> torch.Tensor:
    c, out = torch.zeros_like(hr[:, 0]), []
    for t in range(f.size(1)):
        c = c * f[:, t] + hr[:, t]
        out.append(c)
    return torch.stack(out, 1)


@pytest.mark.parametrize("gate_bias", [-12.0, 0.0, 8.0], ids=["f_near_0", "f_mid", "f_near_1"])
def test_scan_is_exact_on_long_sequences(gate_bias):
    """T = 256 in float32 against a float64 loop, with forget gates down to ~1e-6: values and
    gradients within 1e-5 of the largest reference value, nothing infinite or NaN."""
    g = torch.Generator().manual_seed(1)
    f = torch.sigmoid(torch.randn(2, 256, 24, generator=g) * 2 + gate_bias).requires_grad_()
    hr = torch.randn(2, 256, 24, generator=g).requires_grad_()
    probe = torch.randn(2, 256, 24, generator=g)
    c = linear_scan(f, hr)
    grads = torch.autograd.grad((c * probe).sum(), [f, hr])
    f64, hr64 = (t.detach().double().requires_grad_() for t in (f, hr))
    c64 = loop_scan(f64, hr64)
    grads64 = torch.autograd.grad((c64 * probe.double()).sum(), [f64, hr64])
    for a, b in zip([c, *grads], [c64, *grads64]):
        assert torch.isfinite(a).all()
        assert (a.double() - b).abs().max() <= 1e-5 * b.abs().max()


# ----------------------------------------------------------------------------- decoding

@pytest.mark.parametrize("keys", [{}, {"ffn": False}, {"positions": False}, {"hidden_layers": 1},
                                  {"pre_norm": False}], ids=["default", "no_ffn", "no_positions",
                                                             "hidden_1_layer", "post_norm"])
def test_stepwise_equals_teacher_forced(keys):
    """Token-by-token decoding equals the teacher-forced pass, also with the batch permuted (a
    full beam reorder) after 3 steps."""
    model, _ = random_model(mhplstm(**keys))
    assert_stepwise_matches(model, random_batch(SIZES), torch.tensor([2, 0, 3, 1]), reorder_at=3)


def test_beams_shuffled_within_sentences_at_every_step():
    """As in beam search: rows expanded per beam and reordered within their sentence
    (same_sources=True) before every step; each row's step equals the teacher-forced pass."""
    model, _ = random_model(MHPLSTM)
    batch = random_batch(SIZES[:2])
    k, g = 3, torch.Generator().manual_seed(0)
    with torch.no_grad():
        expected = full_log_probs(model, batch).repeat_interleave(k, 0)
        tgt_in, keep = batch.tgt_in.repeat_interleave(k, 0), batch.tgt_out.repeat_interleave(k, 0).ne(PAD_ID)
        state = model.init_state(model.encode(batch), batch).reorder(torch.arange(2).repeat_interleave(k))
        held = torch.arange(2 * k)                       # which expanded row each state row holds
        for t in range(tgt_in.size(1)):
            within = torch.cat([torch.randperm(k, generator=g) + j * k for j in range(2)])
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
    """The MHPLSTM state holds the same bytes after 1 and after 60 steps; the Transformer's
    (same shapes) grows with every step, so the measure sees growth."""
    sizes = state_sizes(MHPLSTM, 60)
    assert len(set(sizes)) == 1, sizes
    grown = state_sizes(TRANSFORMER, 3)
    assert grown[0] < grown[1] < grown[2]


@pytest.mark.parametrize("key, value, message", [("hidden_layers", 3, "hidden_layers: must be 1 or 2"),
                                                 ("hidden_ratio", 0, "hidden_ratio: must be at least 1")])
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
    cfg = tiny_config(toy_dir, tmp_path / "run",
                      train={"max_steps": 300, "valid_every": 300, "save_every": 300, "valid_bleu": True})
    transformer_cfg = config_from_dict(cfg)
    cfg["model"]["decoder"] = decoder
    metrics = train(config_from_dict(cfg))
    assert metrics["acc"] > 90.0, metrics
    assert metrics["ppl"] < 1.6, metrics
    assert metrics["bleu"] > 70.0, metrics
    codec = build_codec(transformer_cfg, str(tmp_path / "run"))
    ours = build_model(config_from_dict(cfg).model, codec).n_params()
    theirs = build_model(transformer_cfg.model, codec).n_params()
    assert abs(ours / theirs - 1) < 0.15, (ours, theirs)
