"""Marian / OPUS-MT import: a tiny random Marian model in the Hugging Face layout with SentencePiece
models trained here (tools/hostile/fixtures.py's ``write_marian``, the hostile review's builder too),
imports; our forced-decoding
log-probabilities equal transformers' own forward pass, greedy translations equal its ``generate``;
the CTranslate2 export gives the same tokens; ``init_from`` carries the weights into document
models; unsupported configs, missing files and mismatched vocabularies are refused in one line.
No network: nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import module_cmd, run_cli
from hostile.fixtures import MARIAN_SRC, MARIAN_TGT, write_marian

transformers = pytest.importorskip(
    "transformers", reason="the Marian reference is transformers' MarianMTModel: pip install -e '.[marian]'"
)
pytest.importorskip("sentencepiece", reason="tiny SentencePiece models are trained here: '.[marian]'")
pytest.importorskip("safetensors", reason="the Marian folder's weights are model.safetensors: '.[marian]'")

from onmt_doc.convert.marian import import_marian  # noqa: E402
from onmt_doc.data.batching import collate  # noqa: E402
from onmt_doc.data.mapped import build_instances  # noqa: E402
from onmt_doc.errors import UserError  # noqa: E402
from onmt_doc.models.checkpoint import load_model  # noqa: E402
from onmt_doc.models.model import full_log_probs  # noqa: E402
from onmt_doc.translate.translator import Translator  # noqa: E402

pytestmark = [
    pytest.mark.integration,  # builds models and starts processes
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),  # MarianTokenizer's, not ours
]

SRC_TEXT, TGT_TEXT = MARIAN_SRC, MARIAN_TGT  # write_marian's default text


@pytest.fixture(scope="module")
def marian(tmp_path_factory) -> tuple[Path, Path]:
    """(the Marian folder, its import without markup)."""
    tmp = tmp_path_factory.mktemp("marian")
    folder = write_marian(tmp / "opus-mt-xx-yy", seed=3)  # a random model whose greedy outputs differ (see below)
    out = tmp / "imported.pt"
    r = run_cli(*module_cmd("onmt_doc.bin.import_marian"), "-model", str(folder), "-output", str(out))
    assert r.returncode == 0, r.stderr
    return folder, out


def _hf(folder: Path):
    model = transformers.MarianMTModel.from_pretrained(folder).eval()
    tok = transformers.MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")
    )  # fmt: skip
    return model, tok


def _reference_log_probs(model, src_ids: list[int], tgt_in: list[int]) -> torch.Tensor:
    """transformers' log-probabilities [T, V] with ``<pad>`` excluded (as its generation does)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([src_ids]), decoder_input_ids=torch.tensor([tgt_in])).logits[0]
    logits[:, model.config.pad_token_id] = float("-inf")
    return torch.log_softmax(logits.double(), dim=-1)


def _marian_ids(tok, vocab_itos: list[str], ids) -> list[int]:
    """Our ids as Marian's, by token (our ``<eos>`` and ``</s>`` are both its ``</s>``)."""
    return [tok.encoder["</s>" if vocab_itos[i] in ("<eos>", "</s>") else vocab_itos[i]] for i in ids]


VARIANTS = {
    "safetensors-swish-scaled-tied": dict(safetensors=True),
    "bin-gelu-unscaled-untied-separate": dict(
        safetensors=False, activation_function="gelu", scale_embedding=False, tie_word_embeddings=False,
        share_encoder_decoder_embeddings=False,
    ),
}  # fmt: skip


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_forced_decoding_matches_transformers(tmp_path, variant):
    """Raw text through our codec gives MarianTokenizer's ids (``</s>`` appended to the source);
    our log-probabilities of every target token equal transformers' within 1e-4."""
    over = VARIANTS[variant]
    folder = write_marian(tmp_path / "m", seed=1, **over)
    out = tmp_path / "model.pt"
    import_marian(str(folder), str(out))
    model, cfg, codec = load_model(str(out))
    want_cfg = (over.get("activation_function", "swish"), "halves", over.get("scale_embedding", True))
    assert (cfg.model.activation, cfg.model.position_layout, cfg.model.scale_embedding) == want_cfg
    assert cfg.model.tie_output == over.get("tie_word_embeddings", True)
    assert cfg.data.sentence_markup is False
    hf, tok = _hf(folder)
    src_ids = codec.encode(SRC_TEXT, "src")
    tgt_ids = codec.encode(TGT_TEXT, "tgt")
    itos = codec.tgt_vocab.itos
    for text, ids in zip(SRC_TEXT, src_ids):  # the model's own segmentation, raw text in
        assert _marian_ids(tok, itos, ids) == tok(text)["input_ids"]
    examples, _ = build_instances("sentence", [list(zip(src_ids, tgt_ids))], sentence_markup=False)
    with torch.no_grad():
        ours = full_log_probs(model, collate(examples))  # a padded batch: masks exercised
    checked = 0
    for row, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        targets = [*t, codec.tgt_vocab.stoi["<eos>"]]
        ref = _reference_log_probs(hf, _marian_ids(tok, itos, s), [hf.config.decoder_start_token_id,
                                                                   *_marian_ids(tok, itos, t)])  # fmt: skip
        want = [ref[j, m].item() for j, m in enumerate(_marian_ids(tok, itos, targets))]
        got = [ours[row, j, i].item() for j, i in enumerate(targets)]
        np.testing.assert_allclose(got, want, atol=1e-4)
        checked += len(targets)
    assert checked > 40


def test_greedy_matches_generate(marian):
    """Greedy translation of raw text equals transformers' ``generate(num_beams=1)`` (``<pad>``
    banned, at least one token, the same length cap), detokenized the same way."""
    folder, out = marian
    hf, tok = _hf(folder)
    cap = 12
    translator = Translator.load(str(out), device="cpu", beam=1, max_len_add=cap, max_length=cap)
    ours = translator.translate([SRC_TEXT])[0]
    want = []
    for text in SRC_TEXT:
        with torch.no_grad():
            gen = hf.generate(
                **tok([text], return_tensors="pt"), num_beams=1, do_sample=False, max_new_tokens=cap + 1,
                min_new_tokens=1, bad_words_ids=[[hf.config.pad_token_id]], forced_eos_token_id=0,
            )  # fmt: skip
        want.append(tok.decode(gen[0], skip_special_tokens=True))
    assert ours == want
    assert len(set(ours)) > 2 and len({len(x) for x in ours}) > 2  # not one degenerate output


def test_ctranslate2_export_gives_the_same_tokens(marian, tmp_path):
    """``onmt_doc_release`` of the imported model (swish, halves positions, scaled embeddings,
    post-norm, output bias, source ``</s>``): the same greedy translations through CTranslate2,
    by the engine and by the README's own recipe (plain ctranslate2 + pyonmttok)."""
    ct2 = pytest.importorskip("ctranslate2", reason="the CTranslate2 export needs the export extra")
    pyonmttok = pytest.importorskip("pyonmttok")
    _, out = marian
    folder = tmp_path / "ct2"
    r = run_cli(*module_cmd("onmt_doc.bin.release"), "-model", str(out), "-output", str(folder))
    assert r.returncode == 0, r.stderr
    options = dict(beam=1, max_len_add=12, max_length=12)
    ours = Translator.load(str(out), device="cpu", **options).translate([SRC_TEXT])[0]
    theirs = Translator.load(str(folder), device="cpu", engine="ctranslate2", **options).translate([SRC_TEXT])[0]
    assert theirs == ours
    info = json.loads((folder / "onmt_doc_export.json").read_text())
    src, tgt = info["tokenization"]["source"], info["tokenization"]["target"]
    assert src["suffix"] == ["</s>"] and "suffix" not in tgt
    tok = pyonmttok.Tokenizer(src["pyonmttok_mode"], sp_model_path=str(folder / src["subword_model"]))
    detok = pyonmttok.Tokenizer(tgt["pyonmttok_mode"], sp_model_path=str(folder / tgt["subword_model"]))
    opts = info["translate_options"]
    batch = [tok.tokenize(line)[0] + src["suffix"] for line in SRC_TEXT]
    res = ct2.Translator(str(folder), device="cpu").translate_batch(
        batch, beam_size=1, end_token=opts["end_token"], suppress_sequences=opts["suppress_sequences"],
        min_decoding_length=1, max_decoding_length=12,
    )  # fmt: skip
    plain = [detok.detokenize([t for t in x.hypotheses[0] if t not in ("<eos>", "</s>")]) for x in res]
    assert plain == ours
    # and the same numbers: CTranslate2's log-probabilities of the reference targets are ours (float32)
    model, _, codec = load_model(str(out))
    src_ids, tgt_ids = codec.encode(SRC_TEXT, "src"), codec.encode(TGT_TEXT, "tgt")
    examples, _ = build_instances("sentence", [list(zip(src_ids, tgt_ids))], sentence_markup=False)
    with torch.no_grad():
        lp = full_log_probs(model, collate(examples))
    itos = codec.tgt_vocab.itos
    scored = ct2.Translator(str(folder), device="cpu").score_batch(
        [[itos[i] for i in s] for s in src_ids], [[itos[i] for i in t] for t in tgt_ids]
    )  # fmt: skip
    for row, (t, res) in enumerate(zip(tgt_ids, scored)):
        targets = [*t, codec.tgt_vocab.stoi["<eos>"]]
        np.testing.assert_allclose(res.log_probs, [lp[row, j, i].item() for j, i in enumerate(targets)], atol=1e-4)


def _import_error(tmp_path: Path, folder: Path, cli: bool = False) -> str:
    """The refusal of importing ``folder``: in this process, or (``cli``) from the command, as one line."""
    out = tmp_path / "x.pt"
    if cli:
        r = run_cli(*module_cmd("onmt_doc.bin.import_marian"), "-model", str(folder), "-output", str(out))
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        err = r.stderr
    else:
        with pytest.raises(UserError) as e:
            import_marian(str(folder), str(out))
        err = str(e.value)
        assert "\n" not in err
    assert not out.exists()
    return err


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory) -> Path:
    return write_marian(tmp_path_factory.mktemp("plain") / "m", seed=3)


def _copy(plain_folder: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    shutil.copytree(plain_folder, folder)
    return folder


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("activation_function", "gelu_new", "activation_function 'gelu_new'"),
        ("normalize_before", True, "normalize_before True"),
        ("add_bias_logits", True, "add_bias_logits True"),
        ("static_position_embeddings", False, "static_position_embeddings False"),
        ("add_final_layer_norm", True, "add_final_layer_norm True"),
        ("model_type", "bart", "model_type 'bart'"),
        ("decoder_vocab_size", 7, "decoder_vocab_size 7"),
        # strict types (issue 42): a string is not a boolean, 0 is not replaced by a default
        ("scale_embedding", "false", "scale_embedding 'false' is not true or false"),
        ("tie_word_embeddings", 1, "tie_word_embeddings 1 is not true or false"),
        ("share_encoder_decoder_embeddings", "true", "share_encoder_decoder_embeddings 'true' is not true or false"),
        ("max_position_embeddings", 0, "max_position_embeddings 0 is not an integer >= 1"),
        ("max_position_embeddings", None, "max_position_embeddings None is not an integer >= 1"),
        ("activation_function", ["swish"], "activation_function ['swish']"),
    ],
)
def test_unsupported_config_values_are_refused(plain_folder, tmp_path, key, value, message):
    folder = _copy(plain_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    err = _import_error(tmp_path, folder, cli=key == "activation_function")
    assert "not importable" in err and message in err, err


@pytest.mark.parametrize("name", ["config.json", "source.spm", "target.spm", "vocab.json", "model.safetensors"])
def test_missing_files_are_named(plain_folder, tmp_path, name):
    folder = _copy(plain_folder, tmp_path)
    (folder / name).unlink()
    err = _import_error(tmp_path, folder, cli=name == "vocab.json")
    missing = "pytorch_model.bin" if name == "model.safetensors" else name  # no weights at all
    assert f"{missing}: missing" in err, err


def test_vocab_not_matching_the_embeddings_is_refused(plain_folder, tmp_path):
    folder = _copy(plain_folder, tmp_path)
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["▁extra"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    err = _import_error(tmp_path, folder)
    assert f"vocab.json has {len(vocab)} entries but the embeddings {len(vocab) - 1} rows" in err, err


def test_only_tensors_are_unpickled(plain_folder, tmp_path):
    """A pytorch_model.bin that needs a class beyond tensors is refused, never unpickled."""
    folder = _copy(plain_folder, tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save({"weights": torch.zeros(2), "opt": Path("x")}, folder / "pytorch_model.bin")
    err = _import_error(tmp_path, folder)
    assert "pytorch_model.bin: not a readable PyTorch state dict" in err, err


MARIAN_MODEL_KEYS = {  # what write_marian's config means in onmt_doc's model section
    "d_model": 16, "share_embeddings": False, "tie_output": True, "activation": "swish",
    "position_layout": "halves", "scale_embedding": True, "layer_norm_eps": 1e-5, "dropout": 0.1,
    "attention_dropout": 0.0,
}  # fmt: skip
DOCUMENT_MODELS = {
    "g_transformer": {
        "encoder": {"type": "g_transformer", "layers": 2, "heads": 2, "ff": 24, "global_layers": 1, "pre_norm": False},
        "decoder": {"type": "g_transformer", "layers": 2, "heads": 4, "ff": 40, "global_layers": 1,
                    "global_cross_layers": 1, "pre_norm": False},
    },
    "hm_gdc": {
        "encoder": {"type": "hierarchical", "layers": 2, "heads": 2, "ff": 24, "doc_layers": 1, "pre_norm": False},
        "decoder": {"type": "doc_context", "layers": 2, "heads": 4, "ff": 40, "pre_norm": False},
    },
    "k_to_1": {
        "unit": "k_to_1",
        "encoder": {"type": "transformer", "layers": 2, "heads": 2, "ff": 24, "pre_norm": False},
        "decoder": {"type": "transformer", "layers": 2, "heads": 4, "ff": 40, "pre_norm": False},
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def toy_marian(toy_dir, tmp_path_factory) -> tuple[Path, Path]:
    """A Marian model whose SentencePiece models were learned on the toy corpus, imported with
    onmt_doc's markup into a run folder: (its checkpoint, the run folder's files)."""
    tmp = tmp_path_factory.mktemp("toy_marian")
    src = (toy_dir / "train.src").read_text(encoding="utf-8").split("\n")[:3000]
    tgt = (toy_dir / "train.tgt").read_text(encoding="utf-8").split("\n")[:3000]
    folder = write_marian(
        tmp / "m", seed=6, text=([x for x in src if x], [x for x in tgt if x]), pieces=90, init_std=0.05
    )
    run = tmp / "run"
    r = run_cli(
        *module_cmd("onmt_doc.bin.import_marian"), "-model", str(folder), "-output", str(tmp / "imported.pt"),
        "-run_dir", str(run), "-sentence_markup",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return tmp / "imported.pt", run


@pytest.mark.parametrize("kind", list(DOCUMENT_MODELS))
def test_init_from_an_imported_model_into_document_models(toy_marian, toy_dir, tmp_path, kind):
    """G-Transformer, HM-GDC and k-to-1 from an imported Marian model: every parameter the sentence
    model has is copied (shapes checked by name), only document-level ones are new; the run's
    vocabulary is the import's (onmt_doc's markup tokens are already in it: nothing to grow)."""
    from conftest import make_trainer, tiny_config

    ckpt, imported_run = toy_marian
    run = tmp_path / "run"
    shutil.copytree(imported_run, run)
    model = {**MARIAN_MODEL_KEYS, **DOCUMENT_MODELS[kind]}
    vocab = {"subword": "sentencepiece", "shared": False, "tokenizer": "none"}
    trainer = make_trainer(tiny_config(toy_dir, run, vocab=vocab, model=model, train={"init_from": str(ckpt)}))
    sentence = torch.load(ckpt, weights_only=True)["model"]
    params = dict(trainer.model.named_parameters())
    shared = set(params) & set(sentence)
    assert all(params[n].shape == sentence[n].shape and torch.equal(params[n].detach(), sentence[n]) for n in shared)
    assert {"encoder.layers.1.ff.w1.weight", "decoder.layers.0.cross_attn.kv.weight", "generator.bias"} <= shared
    new = set(params) - shared
    document_level = ("global_", "gate", "doc_layers.", "doc_norm.", "context_attn.", "doc_attn.")
    assert all(any(p in n for p in document_level) for n in new), sorted(new)
    assert bool(new) == (kind != "k_to_1")


def test_a_run_with_other_blocks_is_refused(toy_marian, toy_dir, tmp_path):
    """init_from into ReLU blocks of a swish-trained (imported) model: a one-line error naming the key."""
    from conftest import make_trainer, tiny_config

    ckpt, imported_run = toy_marian
    shutil.copytree(imported_run, tmp_path / "run")
    model = {**MARIAN_MODEL_KEYS, **DOCUMENT_MODELS["g_transformer"], "activation": "relu"}
    vocab = {"subword": "sentencepiece", "shared": False, "tokenizer": "none"}
    cfg = tiny_config(toy_dir, tmp_path / "run", vocab=vocab, model=model, train={"init_from": str(ckpt)})
    with pytest.raises(UserError, match="model.activation: swish but this run relu"):
        make_trainer(cfg)


def test_fine_tuning_an_imported_model_into_a_g_transformer_learns(toy_marian, toy_dir, tmp_path):
    """A short fine-tune of the imported model as a G-Transformer on toy documents: the loss on
    held-out batches drops."""
    from conftest import make_trainer, tiny_config

    ckpt, imported_run = toy_marian
    run = tmp_path / "run"
    shutil.copytree(imported_run, run)
    model = {**MARIAN_MODEL_KEYS, **DOCUMENT_MODELS["g_transformer"]}
    vocab = {"subword": "sentencepiece", "shared": False, "tokenizer": "none"}
    optim = {"type": "adam", "lr": 5.0e-3, "schedule": {"type": "constant", "warmup": 1}}
    trainer = make_trainer(
        tiny_config(toy_dir, run, vocab=vocab, model=model, optim=optim, data={"max_tokens": 96},
                    train={"init_from": str(ckpt), "init_lr_scale": 1.0, "batch_tokens": 768})
    )  # fmt: skip
    batches = iter(trainer.sampler)
    held_out = [next(batches) for _ in range(3)]

    def loss() -> float:
        trainer.model.eval()
        with torch.no_grad():
            return sum(trainer._losses(b, training=False)[1]["loss"] for b in held_out) / len(held_out)

    before = loss()
    for _ in range(60):
        trainer.train_step([next(batches)])
    after = loss()
    assert after < 0.8 * before, (before, after)


def test_damaged_weights_and_outputs_onto_inputs_are_refused(plain_folder, tmp_path):
    """A truncated model.safetensors is a one-line error; -output naming a file of the folder is
    refused before anything is written (the folder is left as it was)."""
    folder = _copy(plain_folder, tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "model.safetensors: not a readable safetensors file" in _import_error(tmp_path, folder)
    before = (folder / "vocab.json").read_bytes()
    r = run_cli(*module_cmd("onmt_doc.bin.import_marian"), "-model", str(folder), "-output", str(folder / "vocab.json"))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert (folder / "vocab.json").read_bytes() == before


@pytest.mark.parametrize("dim", [512, 17])
def test_halves_layout_is_marians_table(dim):
    """``model.position_layout: halves`` is transformers' MarianSinusoidalPositionalEmbedding table
    (float64 there, float32 here); ``interleaved`` is not."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from onmt_doc.modules.embeddings import sinusoid_table

    theirs = MarianSinusoidalPositionalEmbedding(512, dim).create_weight()
    assert torch.allclose(sinusoid_table(512, dim, "halves"), theirs, atol=1e-4)
    assert not torch.allclose(sinusoid_table(512, dim, "interleaved"), theirs, atol=1e-1)


# ------------------------------------------------------------------ issue 42: every reader verifies


def _record(folder: Path, name: str, digest: str) -> None:
    """The download record ``huggingface-cli download --local-dir`` leaves: commit, ETag (an LFS
    file's sha256), time."""
    records = folder / ".cache" / "huggingface" / "download"
    records.mkdir(parents=True, exist_ok=True)
    (records / f"{name}.metadata").write_text(f"{'0' * 40}\n{digest}\n1700000000.0\n")


def test_weights_are_checked_against_their_download_record(plain_folder, tmp_path):
    """safetensors holds no checksum: a byte flipped in a tensor imported as a slightly different
    model. Where the download recorded the file's sha256 it is checked (and said so); a mismatch is
    refused naming the file."""
    folder = _copy(plain_folder, tmp_path)
    weights = folder / "model.safetensors"
    _record(folder, "model.safetensors", hashlib.sha256(weights.read_bytes()).hexdigest())
    r = run_cli(*module_cmd("onmt_doc.bin.import_marian"), "-model", str(folder), "-output", str(tmp_path / "ok.pt"))
    assert r.returncode == 0 and "1 files matching their download's sha256" in r.stderr, r.stderr
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0x01  # inside the last tensor: safetensors itself reads it without complaint
    weights.write_bytes(bytes(data))
    err = _import_error(tmp_path, folder)
    assert "model.safetensors: damaged: its sha256 differs from the one its download recorded" in err, err


def test_a_damaged_pytorch_model_bin_is_refused_by_its_crc(tmp_path):
    """pytorch_model.bin is a torch.save zip: its records' CRC-32s are checked as a checkpoint's are."""
    folder = write_marian(tmp_path / "bin", seed=4, safetensors=False)
    data = (folder / "pytorch_model.bin").read_bytes()
    with zipfile.ZipFile(folder / "pytorch_model.bin") as z:
        record = max((r for r in z.infolist() if "/data/" in r.filename), key=lambda r: r.file_size)
    with open(folder / "pytorch_model.bin", "rb") as f:
        f.seek(record.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
    start = record.header_offset + 30 + name_len + extra_len
    flipped = bytearray(data)
    flipped[start + record.file_size // 2] ^= 0x10
    (folder / "pytorch_model.bin").write_bytes(bytes(flipped))
    err = _import_error(tmp_path, folder)
    assert "pytorch_model.bin: damaged PyTorch state dict (record data/" in err and "CRC mismatch" in err, err


def test_nan_or_infinite_weights_are_refused(plain_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(plain_folder, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    name = next(k for k in tensors if k.endswith("fc1.weight"))
    tensors[name][0, 0], tensors[name][1, 1] = float("nan"), float("inf")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    err = _import_error(tmp_path, folder)
    assert f"tensor {name} holds 2 NaN or infinite values" in err, err


@pytest.mark.parametrize("name", ["config.json", "vocab.json"])
def test_json_nested_past_the_bound_is_one_line(plain_folder, tmp_path, name):
    folder = _copy(plain_folder, tmp_path)
    (folder / name).write_text("[" * 100_000 + "]" * 100_000)
    err = _import_error(tmp_path, folder, cli=name == "config.json")
    assert f"{name}: JSON nested more than 64 deep" in err, err


def test_a_folder_where_a_file_is_expected_says_so(plain_folder, tmp_path):
    folder = _copy(plain_folder, tmp_path)
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    assert "config.json: is a directory, not a file" in _import_error(tmp_path, folder)


def test_a_pickle_refusal_is_one_sentence(plain_folder, tmp_path):
    """torch's refusal is a paragraph advising weights_only=False; cut to a line it ended
    mid-sentence. The line says what the file asked for, and that nothing ran."""
    folder = _copy(plain_folder, tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(2), "opt": Path("x")}, folder / "pytorch_model.bin")
    err = _import_error(tmp_path, folder, cli=True)
    assert "asks for the Python object pathlib" in err and "loading runs no code" in err, err
    assert "weights_only" not in err and err.rstrip().endswith(")"), err
