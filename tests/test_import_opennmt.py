"""OpenNMT-py import: a tiny OpenNMT-py 3.x checkpoint (built here from a state dict with its names and
shapes, not by running OpenNMT-py) imports, and our forced-decoding log-probabilities equal those of an
independent plain-torch implementation of OpenNMT-py's pre-norm Transformer; other architectures,
unmapped parameters and unsafe pickles are refused in one line."""

from __future__ import annotations

import fractions
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import module_cmd, run_cli
from hostile.fixtures import ONMT_VOCAB, ONMT_WORDS, onmt_opt, onmt_state, write_onmt

from onmt_doc.config import config_from_dict
from onmt_doc.convert.opennmt import import_opennmt
from onmt_doc.data.batching import collate
from onmt_doc.data.mapped import build_instances
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.models.checkpoint import load_model
from onmt_doc.models.model import full_log_probs
from onmt_doc.translate.translator import Translator

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

# the fake checkpoint's sizes: tools/hostile/fixtures.py's defaults (the hostile review builds its fakes there too)
D, HEADS, FF, ENC, DEC, EPS = 16, 2, 24, 2, 2, 1e-6
WORDS = ONMT_WORDS


# --- the reference: OpenNMT-py's pre-norm Transformer in plain torch ops, on OpenNMT-py ids, one sentence


def _reference_log_probs(sd: dict, gen: dict, src: list[int], tgt_in: list[int], eps: float = EPS) -> torch.Tensor:
    """[T, V] log-probabilities of OpenNMT-py's network for one (unpadded) sentence; ``eps``: its
    layer norms' epsilon (OpenNMT-py's 1e-6 by default; onmt_doc's is 1e-5)."""

    def ln(x, name):
        return F.layer_norm(x, (D,), sd[f"{name}.weight"], sd[f"{name}.bias"], eps)

    def lin(x, name):
        y = x @ sd[f"{name}.weight"].T
        return y + sd[f"{name}.bias"] if f"{name}.bias" in sd else y

    def mha(xq, xkv, name, causal):
        dh = D // HEADS
        q = lin(xq, f"{name}.linear_query").view(-1, HEADS, dh).transpose(0, 1) / math.sqrt(dh)
        k = lin(xkv, f"{name}.linear_keys").view(-1, HEADS, dh).transpose(0, 1)
        v = lin(xkv, f"{name}.linear_values").view(-1, HEADS, dh).transpose(0, 1)
        s = q @ k.transpose(1, 2)
        if causal:
            s = s.masked_fill(torch.ones(s.shape[1:], dtype=torch.bool).triu(1), float("-inf"))
        o = (s.softmax(-1) @ v).transpose(0, 1).reshape(-1, D)
        return lin(o, f"{name}.final_linear")

    def ffn(x, name):
        return x + lin(torch.relu(lin(ln(x, f"{name}.layer_norm"), f"{name}.w_1")), f"{name}.w_2")

    def embed(ids, side):
        pe = torch.zeros(len(ids), D)
        for p in range(len(ids)):
            for i in range(0, D, 2):
                pe[p, i] = math.sin(p / 10000 ** (i / D))
                pe[p, i + 1] = math.cos(p / 10000 ** (i / D))
        return sd[f"{side}.embeddings.make_embedding.emb_luts.0.weight"][ids] * math.sqrt(D) + pe

    x = embed(src, "encoder")
    for i in range(ENC):
        p = f"encoder.transformer.{i}"
        h = ln(x, f"{p}.layer_norm")
        x = ffn(x + mha(h, h, f"{p}.self_attn", False), f"{p}.feed_forward")
    memory = ln(x, "encoder.layer_norm")
    y = embed(tgt_in, "decoder")
    for i in range(DEC):
        p = f"decoder.transformer_layers.{i}"
        h = ln(y, f"{p}.layer_norm_1")
        y = y + mha(h, h, f"{p}.self_attn", True)
        y = ffn(y + mha(ln(y, f"{p}.layer_norm_2"), memory, f"{p}.context_attn", False), f"{p}.feed_forward")
    return torch.log_softmax(ln(y, "decoder.layer_norm") @ gen["weight"].T + gen["bias"], -1)


def _sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    rng = np.random.default_rng(seed)
    pick = lambda k: [WORDS[j] for j in rng.integers(0, len(WORDS), k)]  # noqa: E731
    return [(pick(int(rng.integers(1, 9))), pick(int(rng.integers(1, 9)))) for _ in range(n)]


def _import(tmp_path: Path, shared: bool = True, tied: bool = True, qkv_bias: bool = False, *flags: str, seed=0):
    """An OpenNMT-py checkpoint imported by the command; its state, generator and our loaded model."""
    sd, gen = onmt_state(shared, tied, qkv_bias, seed)
    opt = onmt_opt(share_embeddings=shared, share_decoder_embeddings=tied, add_qkvbias=qkv_bias)
    ckpt = write_onmt(tmp_path / f"onmt{seed}.pt", sd, gen, opt)
    out = tmp_path / f"model{seed}.pt"
    r = run_cli(
        *module_cmd("onmt_doc.bin.import_opennmt"), "-model", str(ckpt), "-output", str(out),
        "-subword_type", "none", "-tokenizer", "space", *flags,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return sd, gen, out


ONMT = {t: i for i, t in enumerate(ONMT_VOCAB)}


@pytest.mark.parametrize(
    "shared,tied,qkv_bias",
    [(True, True, False), (False, False, True), (False, True, False)],
    ids=["shared-tied-nobias", "separate-untied-bias", "separate-tied"],
)
def test_forced_decoding_matches_reference(tmp_path, shared, tied, qkv_bias):
    """Without markup (the import's default) the model reads OpenNMT-py's own sequences (source
    ``w…``, decoder ``<s> w…``) and gives OpenNMT-py's log-probabilities for ``w… </s>``, our
    ``<eos>`` being its ``</s>``: no correction, only float and layer-norm epsilon differences."""
    sd, gen, out = _import(tmp_path, shared, tied, qkv_bias)
    model, cfg, codec = load_model(str(out))
    assert (cfg.model.share_embeddings, cfg.model.tie_output) == (shared, tied)
    assert cfg.data.sentence_markup is False
    assert codec.src_vocab.itos[7:] == WORDS + ["averyunlikelytoken0"]

    pairs = _sentences(6, seed=1)
    ids = [(np.array(codec.src_vocab.ids(s)), np.array(codec.tgt_vocab.ids(t))) for s, t in pairs]
    examples, _ = build_instances("sentence", [ids], sentence_markup=False)
    batch = collate(examples)  # padded batch of 6: our masks are exercised too
    with torch.no_grad():
        ours = full_log_probs(model, batch)
    checked = 0
    for row, (s, t) in enumerate(pairs):
        targets = [*t, "<eos>"]
        got = [ours[row, j, codec.tgt_vocab.stoi[w]].item() for j, w in enumerate(targets)]
        # OpenNMT-py 3.x: bare source, decoder input <s> t, output t </s>; with our layer-norm epsilon
        # the same numbers up to float error, with OpenNMT-py's within what 1e-6 vs 1e-5 makes
        for eps, atol in ((1e-5, 2e-6), (EPS, 1e-4)):
            with torch.no_grad():
                ref = _reference_log_probs(sd, gen, [ONMT[w] for w in s], [ONMT["<s>"], *(ONMT[w] for w in t)], eps)
            want = [ref[j, ONMT["</s>" if w == "<eos>" else w]].item() for j, w in enumerate(targets)]
            np.testing.assert_allclose(got, want, atol=atol)
        checked += len(targets)
    assert checked > 20
    # -score (the translator's forced decoding) is the sum of those log-probabilities
    translator = Translator.load(str(out), device="cpu")
    scores = translator.score([[" ".join(s) for s, _ in pairs]], [[" ".join(t) for _, t in pairs]])[0]
    for score, (s, t) in zip(scores, pairs):
        with torch.no_grad():
            ref = _reference_log_probs(sd, gen, [ONMT[w] for w in s], [ONMT["<s>"], *(ONMT[w] for w in t)], 1e-5)
        want = sum(ref[j, ONMT[w]].item() for j, w in enumerate([*t, "</s>"]))
        assert score == pytest.approx(want, abs=1e-5)


def test_forced_decoding_with_markup(tmp_path):
    """``-sentence_markup`` keeps onmt_doc's markup (for fine-tuning into a document model): the
    network reads ``<s> src </s>`` and ``<bos>=<s> <s> tgt </s>``, and p(</s>) is held twice."""
    sd, gen, out = _import(tmp_path, True, True, False, "-sentence_markup")
    model, cfg, codec = load_model(str(out))
    assert cfg.data.sentence_markup is True
    pairs = _sentences(6, seed=1)
    ids = [(np.array(codec.src_vocab.ids(s)), np.array(codec.tgt_vocab.ids(t))) for s, t in pairs]
    examples, _ = build_instances("sentence", [ids])
    with torch.no_grad():
        ours = full_log_probs(model, collate(examples))
    for row, (s, t) in enumerate(pairs):
        src = [ONMT["<s>"], *(ONMT[w] for w in s), ONMT["</s>"]]
        tgt_in = [ONMT["<s>"], ONMT["<s>"], *(ONMT[w] for w in t), ONMT["</s>"]]
        with torch.no_grad():
            ref = _reference_log_probs(sd, gen, src, tgt_in, 1e-5)
        # our targets <s> tgt </s> <eos>; <eos> is OpenNMT-py's </s> again, so every position's softmax
        # holds OpenNMT-py's end probability p twice: log q(x) = log p(x) - log(1 + p(</s>)), and <eos>
        # has p(</s>)'s value; <bos> and <mask> take exp(-30) of their rows (negligible)
        targets = ["<s>", *t, "</s>", "<eos>"]
        got = [ours[row, j, codec.tgt_vocab.stoi[w]].item() for j, w in enumerate(targets)]
        dup = torch.log1p(ref[:, ONMT["</s>"]].exp())
        want = [(ref[j, ONMT["</s>" if w == "<eos>" else w]] - dup[j]).item() for j, w in enumerate(targets)]
        np.testing.assert_allclose(got, want, atol=2e-6)


def _reference_greedy(sd: dict, gen: dict, src: list[int], cap: int) -> list[int]:
    """Greedy decoding of the reference network under OpenNMT-py's sequences and our rules: never
    ``<s>``/``<blank>``, no ``</s>`` before the first word, ``</s>`` at the cap."""
    out: list[int] = []
    while True:
        with torch.no_grad():
            lp = _reference_log_probs(sd, gen, src, [ONMT["<s>"], *out], 1e-5)[-1].clone()
        lp[[ONMT["<s>"], ONMT["<blank>"]]] = float("-inf")
        if not out:
            lp[ONMT["</s>"]] = float("-inf")
        nxt = ONMT["</s>"] if len(out) == cap else int(lp.argmax())
        if nxt == ONMT["</s>"]:
            return out
        out.append(nxt)


def test_translation_without_markup(tmp_path):
    """Greedy, beam with n-best, sampling and an ensemble of markup-free models: no ``<s>``/``</s>``
    and no empty line, though the generator is biased towards ``<s>`` and ``</s>`` (OpenNMT-py's)
    so that a missing rule would show; greedy output equals the reference network's greedy decode."""
    sd, gen = onmt_state(True, True, False, seed=2)
    gen["bias"][ONMT["<s>"]] += 6.0
    gen["bias"][ONMT["</s>"]] += 4.0
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt())
    out = tmp_path / "model.pt"
    import_opennmt(str(ckpt), str(out), None, subword="none", tokenizer="space")
    srcs = [s for s, _ in _sentences(12, seed=4)]
    doc = [" ".join(s) for s in srcs]
    greedy = Translator.load(str(out), device="cpu", beam=1, max_len_ratio=1.0, max_len_add=2).translate([doc])[0]
    want = [" ".join(ONMT_VOCAB[i] for i in _reference_greedy(sd, gen, [ONMT[w] for w in s], len(s) + 2)) for s in srcs]
    assert greedy == want
    sampler = Translator.load(str(out), device="cpu", strategy="sampling", n_best=2, seed=3)
    runs = {
        "beam": Translator.load(str(out), device="cpu", beam=4, n_best=3).nbest([doc])[0],
        "sampling": sampler.nbest([doc])[0],
        "ensemble": Translator.load([str(out), str(out)], device="cpu", beam=3, n_best=2).nbest([doc])[0],
    }
    for name, lines in [("greedy", [[(x, 0.0)] for x in greedy]), *runs.items()]:
        assert len(lines) == len(doc), name
        for fields in lines:
            for text, _ in fields:
                assert text and text != "<unk>", (name, text)
                assert not {"<s>", "</s>", "<bos>", "<eos>"} & set(text.split()), (name, text)
    assert runs["ensemble"] == Translator.load(str(out), device="cpu", beam=3, n_best=2).nbest([doc])[0]


def test_ensemble_members_must_agree_on_markup(tmp_path):
    _, _, bare = _import(tmp_path, seed=0)
    _, _, marked = _import(tmp_path, True, True, False, "-sentence_markup", seed=1)
    with pytest.raises(UserError, match=r"different data.sentence_markup \(False vs True\)"):
        Translator.load([str(bare), str(marked)], device="cpu")


def test_training_without_markup(toy_dir, tmp_path):
    """``data.sentence_markup: false`` reaches training too: instances are the bare sentences, the
    checkpoint keeps the key, and its translations hold no markup and no empty line."""
    from conftest import tiny_config

    from onmt_doc.data.prepare import load_codec, load_examples
    from onmt_doc.data.vocab import EOS_SENT_ID, SOS_ID
    from onmt_doc.train.trainer import train

    run = tmp_path / "run"
    raw = tiny_config(toy_dir, run, data={"sentence_markup": False}, train={"max_steps": 20, "valid_every": 20})
    cfg = config_from_dict(raw)
    train(cfg)
    codec = load_codec(cfg.vocab, str(run))
    examples, docs = load_examples(
        cfg.data, codec, raw["data"]["valid"]["src"], raw["data"]["valid"]["tgt"], "sentence", str(run)
    )
    pairs = [p for d in docs for p in d]
    assert len(examples) == len(pairs) and all(np.array_equal(e.src, s) for e, (s, _) in zip(examples, pairs))
    assert not any(np.isin([SOS_ID, EOS_SENT_ID], np.concatenate([e.src, e.tgt])).any() for e in examples)
    translator = Translator.load(str(run / "checkpoints" / "last.pt"), device="cpu", beam=2, max_len_add=3)
    assert translator.cfg.data.sentence_markup is False
    lines = (toy_dir / "test.src").read_text(encoding="utf-8").splitlines()
    out = translator.translate([[line for line in lines if line.strip()][:20]])[0]
    assert len(out) == 20 and all(out) and not any({"<s>", "</s>"} & set(x.split()) for x in out)


def test_markup_free_key_is_for_the_sentence_unit_only():
    ok = config_from_dict({"data": {"sentence_markup": False}})
    assert ok.data.sentence_markup is False
    g = {"encoder": {"type": "g_transformer"}, "decoder": {"type": "g_transformer"}}
    for model, unit in ((g, "document"), ({"unit": "k_to_1"}, "k_to_1"), ({"unit": "k_to_k"}, "k_to_k")):
        with pytest.raises(ConfigError, match=f"data.sentence_markup: false is for the sentence unit only, not {unit}"):
            config_from_dict({"data": {"sentence_markup": False}, "model": model})


def test_subword_model_travels(tmp_path, toy_dir):
    from onmt_doc.data.prepare import load_codec
    from onmt_doc.data.tokenizer import Subword

    lines = (toy_dir / "train.src").read_text(encoding="utf-8").splitlines()[:300]
    bpe = Subword.learn("bpe", "aggressive", 50, lines)
    bpe.save(str(tmp_path / "bpe.model"))
    sd, gen = onmt_state(True, True, False)
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt())
    run = tmp_path / "run"
    payload = import_opennmt(str(ckpt), str(tmp_path / "m.pt"), str(tmp_path / "bpe.model"), run_dir=str(run))
    assert payload["codec"]["src_subword"] == payload["codec"]["tgt_subword"] == bpe.to_dict()
    _, cfg, codec = load_model(str(tmp_path / "m.pt"))
    assert cfg.vocab.subword == "bpe" and codec.src_subword.tokenize(lines[0]) == bpe.tokenize(lines[0])
    # the run folder a fine-tuning run (log.dir) reads: the same codec as the checkpoint's
    assert load_codec(cfg.vocab, str(run)).to_dict() == codec.to_dict()


REFUSED = [
    ({"max_relative_positions": 20}, "relative positions"),
    ({"max_relative_positions": -1}, "rotary"),
    ({"pos_ffn_activation_fn": "silu"}, "activation silu"),
    ({"layer_norm": "rms"}, "layer_norm rms"),
    ({"parallel_residual": True}, "parallel_residual"),
    ({"num_kv": 1}, "multi-query"),
    ({"encoder_type": "rnn"}, "encoder_type rnn"),
    ({"position_encoding_type": "SinusoidalConcat"}, "SinusoidalConcat"),
]


@pytest.mark.parametrize("over,message", REFUSED, ids=[m for _, m in REFUSED])
def test_other_architectures_are_refused(tmp_path, over, message):
    sd, gen = onmt_state(True, True, False)
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt(**over))
    with pytest.raises(UserError, match=message):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")
    assert not (tmp_path / "m.pt").exists()


def test_unmapped_and_missing_parameters_are_refused(tmp_path):
    sd, gen = onmt_state(True, True, False)
    extra = dict(sd, **{"encoder.transformer.0.self_attn.relative_positions_embeddings.weight": torch.zeros(41, 8)})
    ckpt = write_onmt(tmp_path / "extra.pt", extra, gen, onmt_opt())
    with pytest.raises(UserError, match="no onmt_doc counterpart: encoder.transformer.0.self_attn.relative"):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")
    missing = {k: v for k, v in sd.items() if k != "decoder.transformer_layers.1.layer_norm_2.weight"}
    ckpt = write_onmt(tmp_path / "missing.pt", missing, gen, onmt_opt())
    with pytest.raises(UserError, match="no parameter decoder.transformer_layers.1.layer_norm_2.weight"):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")
    ckpt = write_onmt(tmp_path / "shape.pt", sd, gen, onmt_opt(transformer_ff=FF + 1))
    with pytest.raises(UserError, match="does not fit"):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")


def test_cli_errors_are_one_line(tmp_path):
    sd, gen = onmt_state(True, True, False)
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt(max_relative_positions=-2))
    out = tmp_path / "m.pt"
    r = run_cli(*module_cmd("onmt_doc.bin.import_opennmt"), "-model", str(ckpt), "-output", str(out))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "-src_subword_model is required" in r.stderr
    r = run_cli(
        *module_cmd("onmt_doc.bin.import_opennmt"), "-model", str(ckpt), "-output", str(out), "-subword_type", "none"
    )
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "ALiBi" in r.stderr and not out.exists()


def test_only_namespace_is_unpickled(tmp_path):
    """weights_only loading plus argparse.Namespace: any other pickled class is refused, by name."""
    sd, gen = onmt_state(True, True, False)
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt(learning_rate=fractions.Fraction(1, 2)))
    with pytest.raises(UserError, match="fractions.Fraction"):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")


IMPOSSIBLE = [
    ({"heads": 0}, "heads 0 is not a positive integer"),
    ({"heads": -2}, "heads -2 is not a positive integer"),
    ({"heads": 2.5}, "heads 2.5 is not a positive integer"),
    ({"heads": None}, "heads None is not a positive integer"),
    ({"heads": 3}, "enc_hid_size 16 is not divisible by heads 3"),
    ({"transformer_ff": -5}, "transformer_ff -5 is not a positive integer"),
    ({"enc_layers": 0}, "enc_layers 0 is not a positive integer"),
    ({f"{k}_size": 0 for k in ("enc_hid", "dec_hid", "src_word_vec", "tgt_word_vec")}, "enc_hid_size 0 is not"),
    ({"dropout": [1.5]}, r"dropout 1\.5 is not a probability in \[0, 1\)"),
]


@pytest.mark.parametrize("over,message", IMPOSSIBLE, ids=[str(next(iter(o.items()))) for o, _ in IMPOSSIBLE])
def test_impossible_sizes_are_refused(tmp_path, over, message):
    """Sizes no network has: they used to end in a ZeroDivisionError or a torch RuntimeError, or
    (negative or fractional heads) to import a model that computes something else."""
    sd, gen = onmt_state(True, True, False)
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt(**over))
    with pytest.raises(UserError, match=f"OpenNMT-py model not importable: {message}"):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")
    assert not (tmp_path / "m.pt").exists()


BAD_TENSORS = [
    ("encoder.transformer.0.self_attn.linear_keys.weight", (D, D // 2), r"weight shapes .* do not fit onmt_doc's"),
    ("encoder.transformer.0.self_attn.linear_query.weight", (), r"weight shapes \(\), .* do not fit onmt_doc's"),
    ("encoder.embeddings.make_embedding.pe.pe", (50, 1, D - 1), r"pe\.pe has shape \(50, 1, 15\), expected"),
]


@pytest.mark.parametrize("name,shape,message", BAD_TENSORS, ids=[n.split(".", 2)[-1] for n, _, _ in BAD_TENSORS])
def test_tensors_of_impossible_shapes_are_refused(tmp_path, name, shape, message):
    sd, gen = onmt_state(True, True, False)
    sd[name] = torch.zeros(shape)
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt())
    with pytest.raises(UserError, match=message):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")


def test_impossible_sizes_are_one_line_from_the_command(tmp_path):
    sd, gen = onmt_state(True, True, False)
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt(heads=0))
    out = tmp_path / "m.pt"
    r = run_cli(
        *module_cmd("onmt_doc.bin.import_opennmt"), "-model", str(ckpt), "-output", str(out), "-subword_type", "none"
    )
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "heads 0 is not a positive integer" in r.stderr and not out.exists()


def test_a_flipped_byte_in_an_opennmt_checkpoint_is_refused(tmp_path):
    """torch.load reads it (one weight changed); the CRC-32 of its zip record does not match."""
    from test_checkpoint import flip_tensor_byte

    sd, gen = onmt_state(True, True, False)
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt())
    flip_tensor_byte(ckpt)
    torch.load(ckpt, weights_only=False)  # loads: the damage is silent without the check
    with pytest.raises(UserError, match=r"onmt\.pt: damaged OpenNMT-py checkpoint \(record data/\d+: CRC mismatch\)"):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")
    assert not (tmp_path / "m.pt").exists()


def test_nan_weights_and_options_of_the_wrong_type_are_refused(tmp_path):
    """Weights holding NaN or an infinity would import as a model that translates garbage; an
    option of the wrong type failed inside a comparison (a TypeError traceback)."""
    sd, gen = onmt_state(True, True, False)
    name = next(k for k in sd if k.endswith("w_1.weight"))
    sd[name] = sd[name].clone()
    sd[name][0, 0] = float("nan")
    ckpt = write_onmt(tmp_path / "nan.pt", sd, gen, onmt_opt())
    with pytest.raises(UserError, match=rf"nan\.pt: tensor {re.escape(name)} holds 1 NaN or infinite values"):
        import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")
    sd, gen = onmt_state(True, True, False)
    for key, value in (("max_relative_positions", "0"), ("norm_eps", [1e-6]), ("dec_hid_size", "16")):
        ckpt = write_onmt(tmp_path / f"{key}.pt", sd, gen, onmt_opt(**{key: value}))
        with pytest.raises(UserError, match=f"{key} {re.escape(repr(value))} is not a"):
            import_opennmt(str(ckpt), str(tmp_path / "m.pt"), None, subword="none")
    assert not (tmp_path / "m.pt").exists()
