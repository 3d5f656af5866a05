"""CTranslate2 export: CTranslate2 decodes a trained tiny model exactly as onmt_doc does (greedy
tokens, per-token log-probabilities within 1e-3), pre- and post-norm, shared and separate
vocabularies; other models are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import module_cmd, run_cli, tiny_config

from onmt_doc.config import config_from_dict, config_to_dict
from onmt_doc.data.batching import collate
from onmt_doc.data.codec import Codec
from onmt_doc.data.mapped import build_instances
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import EOS, EOS_ID, EOS_SENT, EOS_SENT_ID, SOS, SOS_ID, SPECIALS, Vocab
from onmt_doc.models.builder import build_model
from onmt_doc.models.checkpoint import load_model, save_checkpoint
from onmt_doc.models.model import full_log_probs
from onmt_doc.translate.search import GreedySearch

ctranslate2 = pytest.importorskip("ctranslate2", reason="the export extra: pip install -e '.[export]'")

from onmt_doc.export.ctranslate2 import (  # noqa: E402
    build_spec,
    source_tokens,
    target_prefix,
    translation_options,
)

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

N_TEST = 60  # toy test sentences compared


def _train(toy: Path, run: Path, pre_norm: bool, shared: bool) -> Path:
    from onmt_doc.train.trainer import train

    part = {"type": "transformer", "layers": 2, "heads": 4, "ff": 64, "pre_norm": pre_norm}
    cfg = tiny_config(
        toy,
        run,
        vocab={"subword": "bpe", "size": 300, "shared": shared},
        model={
            "d_model": 32,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "share_embeddings": shared,
            "tie_output": shared,
            "encoder": part,
            "decoder": part,
        },
        optim={"type": "adam", "lr": 3.0e-3, "schedule": {"type": "inverse_sqrt", "warmup": 50}},
        train={"max_steps": 150, "save_every": 150, "valid_every": 1000, "batch_tokens": 1024},
    )
    train(config_from_dict(cfg))
    return run / "checkpoints" / "last.pt"


@pytest.fixture(scope="module", params=[(True, True), (False, False)], ids=["prenorm-shared", "postnorm-separate"])
def exported(request, toy_dir, tmp_path_factory):
    pre_norm, shared = request.param
    run = tmp_path_factory.mktemp("ct2run")
    ckpt = _train(toy_dir, run, pre_norm, shared)
    out = run / "ct2"
    r = run_cli(*module_cmd("onmt_doc.bin.release"), "-model", str(ckpt), "-output", str(out))
    assert r.returncode == 0, r.stderr
    return ckpt, out, shared


def _test_lines(toy: Path) -> list[str]:
    return [line for line in (toy / "test.src").read_text(encoding="utf-8").splitlines() if line.strip()][:N_TEST]


def test_greedy_and_scores_match(exported, toy_dir):
    ckpt, out, shared = exported
    model, _, codec = load_model(str(ckpt))
    files = {p.name for p in out.iterdir()}
    assert {"model.bin", "config.json", "onmt_doc_export.json", "README.md"} <= files
    assert ("shared_vocabulary.json" in files) == shared
    info = json.loads((out / "onmt_doc_export.json").read_text())
    assert info["tokenization"]["source"]["kind"] == "bpe"

    lines = _test_lines(toy_dir)
    ids = codec.encode(lines, "src")
    examples, _ = build_instances("sentence", [[(s, None) for s in ids]])
    hyps = GreedySearch().search(model, collate(examples))
    ours = [codec.tgt_vocab.tokens(h[0].tokens) for h in hyps]
    assert sum(len(t) for t in ours) > 4 * len(ours)  # the model translates (not empty outputs)

    translator = ctranslate2.Translator(str(out), device="cpu", inter_threads=1, intra_threads=1)
    src_tokens = [source_tokens(codec.src_vocab.tokens(s)) for s in ids]
    results = translator.translate_batch(
        src_tokens, target_prefix=[["<s>"]] * len(lines), beam_size=1, return_end_token=True, **translation_options()
    )
    theirs = [[t for t in r.hypotheses[0] if t != EOS] for r in results]
    assert theirs == ours

    # forced decoding of our outputs: every token's log-probability, <eos> included
    targets = [t[1:-1] for t in ours]
    tgt_ids = [np.array(codec.tgt_vocab.ids(t)) for t in targets]
    examples, _ = build_instances("sentence", [[(s, t) for s, t in zip(ids, tgt_ids)]])
    batch = collate(examples)
    with torch.no_grad():
        lp = full_log_probs(model, batch).gather(2, batch.tgt_out[..., None]).squeeze(2)
    scored = translator.score_batch(src_tokens, [["<s>", *t, "</s>"] for t in targets])
    for row, res in zip(range(len(targets)), scored):
        want = lp[row][batch.tgt_out[row].ne(0)].numpy()
        assert res.tokens[-1] == EOS and len(res.log_probs) == len(want)
        np.testing.assert_allclose(np.array(res.log_probs), want, atol=1e-3)


def test_int8_export_translates(exported, tmp_path, toy_dir):
    ckpt, _, _ = exported
    out = tmp_path / "int8"
    r = run_cli(*module_cmd("onmt_doc.bin.release"), "-model", str(ckpt), "-output", str(out), "-quantization", "int8")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "onmt_doc_export.json").read_text())["quantization"] == "int8"
    # an existing folder is kept unless -force
    r = run_cli(*module_cmd("onmt_doc.bin.release"), "-model", str(ckpt), "-output", str(out))
    assert r.returncode == 1 and "-force" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli(*module_cmd("onmt_doc.bin.release"), "-model", str(ckpt), "-output", str(out), "-force")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "onmt_doc_export.json").read_text())["quantization"] == "float32"


def _tiny_codec() -> Codec:
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(20)])
    sw = Subword("none", "space")
    return Codec(sw, sw, vocab, vocab)


def test_no_empty_sentence_rule(tmp_path):
    """translation_options() reproduce forbid_empty: a model that always prefers </s> still
    writes one word after <s>, as our search does."""
    codec = _tiny_codec()
    cfg = config_from_dict(
        {
            "data": {"train": {"src": "x", "tgt": "y"}},
            "model": {
                "d_model": 16,
                "encoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32},
                "decoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32},
            },
        }
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, codec).eval()
    with torch.no_grad():
        model.generator.bias[EOS_SENT_ID] = 50.0
    src = [np.array(codec.src_vocab.ids(["w1", "w2"]))]
    examples, _ = build_instances("sentence", [[(s, None) for s in src]])
    ours = codec.tgt_vocab.tokens(GreedySearch().search(model, collate(examples))[0][0].tokens)
    assert len(ours) == 3 and ours[0] == "<s>" and ours[2] == "</s>"
    spec = build_spec(model, codec, 64)
    spec.optimize()
    (tmp_path / "m").mkdir()
    spec.save(str(tmp_path / "m"))
    tr = ctranslate2.Translator(str(tmp_path / "m"), device="cpu", intra_threads=1)
    res = tr.translate_batch(
        [source_tokens(["w1", "w2"])], target_prefix=[["<s>"]], beam_size=1, return_end_token=True,
        **translation_options(64),
    )  # fmt: skip
    assert res[0].hypotheses[0] == ours


def test_markup_free_model_exports(tmp_path):
    """A model without sentence markup (``data.sentence_markup: false``, as an OpenNMT-py import
    writes it) exports with a bare source and no target prefix: CTranslate2's greedy output is our
    search's, token for token, though the generator prefers ``<s>`` and ``</s>`` (never generated
    without markup), and its scores are our forced-decoding log-probabilities."""
    codec = _tiny_codec()
    part = {"layers": 1, "heads": 2, "ff": 32}
    raw = {
        "data": {"train": {"src": "x", "tgt": "y"}, "sentence_markup": False},
        "model": {
            "d_model": 16,
            "encoder": {"type": "transformer", **part},
            "decoder": {"type": "transformer", **part},
        },
    }
    cfg = config_from_dict(raw)
    torch.manual_seed(1)
    model = build_model(cfg.model, codec).eval()
    with torch.no_grad():  # varied outputs: a generator far from its small initial weights
        for p in model.parameters():
            p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
        model.generator.bias[SOS_ID] += 4.0
        model.generator.bias[EOS_SENT_ID] += 4.0
        model.generator.bias[EOS_ID] += 4.0
    ckpt = tmp_path / "bare.pt"
    save_checkpoint({"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict()}, str(ckpt))
    out = tmp_path / "ct2"
    r = run_cli(*module_cmd("onmt_doc.bin.release"), "-model", str(ckpt), "-output", str(out))
    assert r.returncode == 0, r.stderr
    info = json.loads((out / "onmt_doc_export.json").read_text())
    assert info["source_markup"] == {"prefix": [], "suffix": []} and info["target_prefix"] == []
    assert info["translate_options"] == translation_options(markup=False)

    rng = np.random.default_rng(0)
    words = [[f"w{i}" for i in rng.integers(0, 20, 5)] for _ in range(12)]  # one length: one cap (8 tokens)
    ids = [np.array(codec.src_vocab.ids(w)) for w in words]
    examples, _ = build_instances("sentence", [[(s, None) for s in ids]], sentence_markup=False)
    hyps = GreedySearch(max_len_ratio=1.0, max_len_add=3).search(model, collate(examples), markup=False)
    ours = [codec.tgt_vocab.tokens(h[0].tokens) for h in hyps]
    assert all(ours) and not {SOS, EOS_SENT} & {t for o in ours for t in o}
    assert any(len(o) < 8 for o in ours), ours  # some end before the cap
    tr = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    src = [source_tokens(w, markup=False) for w in words]
    assert src == words and target_prefix(False) == []
    res = tr.translate_batch(src, beam_size=1, **{**translation_options(markup=False), "max_decoding_length": 8})
    assert [r.hypotheses[0] for r in res] == ours

    targets = [np.array(codec.tgt_vocab.ids(o)) for o in ours]
    examples, _ = build_instances("sentence", [[(s, t) for s, t in zip(ids, targets)]], sentence_markup=False)
    batch = collate(examples)
    with torch.no_grad():
        lp = full_log_probs(model, batch).gather(2, batch.tgt_out[..., None]).squeeze(2)
    for row, scored in enumerate(tr.score_batch(src, ours)):
        want = lp[row][batch.tgt_out[row].ne(0)].numpy()
        assert scored.tokens[-1] == EOS and len(scored.log_probs) == len(want)
        np.testing.assert_allclose(np.array(scored.log_probs), want, atol=1e-4)


def test_non_exportable_model_is_one_line_error(tmp_path):
    codec = _tiny_codec()
    part = {"layers": 2, "heads": 2, "ff": 32}
    cfg = config_from_dict(
        {
            "data": {"train": {"src": "x", "tgt": "y"}},
            "model": {
                "d_model": 16,
                "encoder": {"type": "g_transformer", **part},
                "decoder": {"type": "g_transformer", **part},
            },
        }
    )
    model = build_model(cfg.model, codec)
    ckpt = tmp_path / "gt.pt"
    save_checkpoint({"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict()}, str(ckpt))
    r = run_cli(*module_cmd("onmt_doc.bin.release"), "-model", str(ckpt), "-output", str(tmp_path / "out"))
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1
    assert "GTransformerEncoder is not exportable to CTranslate2" in r.stderr
    assert not (tmp_path / "out").exists()
