"""What the hostile review prepares and the tests build their fakes from, written once: the
workspace (a toy corpus, a tiny Transformer and a tiny context-gates model, a PMI table, a
hypothesis file), a fake OpenNMT-py 3.x checkpoint and a fake Marian (OPUS-MT) folder in the
Hugging Face layout (tests/test_import_opennmt.py and tests/test_import_marian.py use the same
builders), and the hostile bytes (a flipped tensor, a malicious pickle, a cut line).

torch, numpy, sentencepiece and safetensors are imported inside the functions that need them: the
review's own process stays small, and ``python tools/hostile/fixtures.py tensors|marian BASE``
makes those files in a process of their own."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import re
import shlex
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Optional

PWNED = "PWNED"  # the marker file a malicious pickle or YAML tag creates when it runs
PREP_VERSION = "3: one OpenNMT-py and one Marian builder, shared with the tests\n"  # older workspaces are made again

# ----------------------------------------------------------------------------- hostile bytes


def record_span(data: bytes, name_suffix: str) -> tuple[int, int]:
    """(start, end) of the stored bytes of the largest zip record whose name matches
    ``name_suffix`` (``data/N`` records hold tensor storages; ``data.pkl`` the pickle)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        infos = [i for i in z.infolist() if re.search(name_suffix, i.filename)]
    if not infos:
        raise ValueError(f"no zip record matches {name_suffix!r}")
    info = max(infos, key=lambda i: i.file_size)
    off = info.header_offset
    n_name, n_extra = struct.unpack("<HH", data[off + 26 : off + 30])
    start = off + 30 + n_name + n_extra
    return start, start + info.compress_size


def flip_middle(data: bytes, record: str = r"/data/\d+$", width: int = 16) -> bytes:
    """``data`` with ``width`` bytes inverted in the middle of a zip record (by default the largest
    tensor storage): the zip stays well-formed, only that record's bytes (and its CRC) disagree."""
    start, end = record_span(data, record)
    mid = max(start, min((start + end) // 2, end - width))
    out = bytearray(data)
    for i in range(mid, min(mid + width, end)):
        out[i] ^= 0xFF
    return bytes(out)


class _Evil:
    """Pickles as a call to os.system: what a malicious checkpoint would run when unpickled."""

    def __reduce__(self):
        return (os.system, (f"touch {PWNED}",))


def evil_pickle() -> bytes:
    """A pickle that creates the PWNED marker in the current folder when loaded without restrictions."""
    return pickle.dumps({"model": _Evil(), "format_version": 1}, protocol=2)


def evil_zip(data: bytes) -> bytes:
    """A torch.save archive whose ``data.pkl`` is replaced by :func:`evil_pickle`, checksums intact:
    only a restricted unpickler stops it."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, evil_pickle() if info.filename.endswith("data.pkl") else src.read(info))
    return out.getvalue()


def insert_in_line(data: bytes, junk: bytes, line: int = 2) -> bytes:
    """``data`` with ``junk`` inserted at the start of line ``line`` (0-based), or appended."""
    lines = data.split(b"\n")
    if len(lines) > line:
        lines[line] = junk + lines[line]
        return b"\n".join(lines)
    return data + junk


def drop_line(data: bytes, line: int = 4) -> bytes:
    """``data`` without its line ``line``: a file misaligned with its partner from there on."""
    lines = data.split(b"\n")
    return b"\n".join(lines[:line] + lines[line + 1 :])


# ----------------------------------------------------------------------------- a fake OpenNMT-py checkpoint

ONMT_WORDS = [f"w{i}" for i in range(13)]
ONMT_VOCAB = ["<unk>", "<blank>", "<s>", "</s>", *ONMT_WORDS, "averyunlikelytoken0"]  # 3.x order, padded to x8


def onmt_opt(
    d: int = 16, heads: int = 2, ff: int = 24, enc: int = 2, dec: int = 2, eps: float = 1e-6, **over: Any
) -> argparse.Namespace:
    """OpenNMT-py 3.5's options (``checkpoint["opt"]``) of a pre-norm Transformer; ``over`` replaces any."""
    opt = dict(
        model_task="seq2seq", encoder_type="transformer", decoder_type="transformer", enc_layers=enc,
        dec_layers=dec, enc_hid_size=d, dec_hid_size=d, src_word_vec_size=d, tgt_word_vec_size=d, heads=heads,
        transformer_ff=ff, dropout=[0.1], attention_dropout=[0.1], position_encoding=True,
        position_encoding_type="SinusoidalInterleaved", max_relative_positions=0, layer_norm="standard",
        norm_eps=eps, pos_ffn_activation_fn="relu", parallel_residual=False, num_kv=0, num_experts=0,
        self_attn_type="scaled-dot", copy_attn=False, add_qkvbias=False, add_ffnbias=True,
        share_embeddings=True, share_decoder_embeddings=True,
    )  # fmt: skip
    opt.update(over)
    return argparse.Namespace(**opt)


def onmt_state(
    shared: bool = True,
    tied: bool = True,
    qkv_bias: bool = False,
    seed: int = 0,
    d: int = 16,
    ff: int = 24,
    enc: int = 2,
    dec: int = 2,
) -> tuple[dict, dict]:
    """(model state, generator state) with OpenNMT-py 3.5's parameter names and shapes
    (onmt/encoders/transformer.py, decoders/transformer.py, modules/multi_headed_attn.py,
    position_ffn.py, embeddings.py), random values: what onmt_doc_import_opennmt reads."""
    import torch

    g = torch.Generator().manual_seed(seed)
    V = len(ONMT_VOCAB)

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    sd: dict = {}

    def linear(name, n_out, n_in, bias):
        sd[f"{name}.weight"] = r(n_out, n_in)
        if bias:
            sd[f"{name}.bias"] = r(n_out, scale=0.1)

    def norm(name):
        sd[f"{name}.weight"] = 1 + r(d, scale=0.1)
        sd[f"{name}.bias"] = r(d, scale=0.1)

    def attn(prefix):
        for n in ("linear_keys", "linear_values", "linear_query", "final_linear"):
            linear(f"{prefix}.{n}", d, d, qkv_bias)

    def ffn(prefix):
        linear(f"{prefix}.w_1", ff, d, True)
        linear(f"{prefix}.w_2", d, ff, True)
        norm(f"{prefix}.layer_norm")

    pe = torch.zeros(5000, d)  # OpenNMT-py's interleaved sinusoids, saved as a (len, 1, dim) buffer
    pos = torch.arange(5000.0)[:, None]
    div = torch.exp(torch.arange(0, d, 2).float() * -(math.log(10000.0) / d))
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    emb = r(V, d)
    emb[1] = 0  # <blank> is the padding_idx
    for side in ("encoder", "decoder"):
        if side == "decoder" and not shared:
            emb = r(V, d)
            emb[1] = 0
        sd[f"{side}.embeddings.make_embedding.emb_luts.0.weight"] = emb
        sd[f"{side}.embeddings.make_embedding.pe.pe"] = pe[:, None, :].clone()
    for i in range(enc):
        attn(f"encoder.transformer.{i}.self_attn")
        norm(f"encoder.transformer.{i}.layer_norm")
        ffn(f"encoder.transformer.{i}.feed_forward")
    norm("encoder.layer_norm")
    for i in range(dec):
        p = f"decoder.transformer_layers.{i}"
        attn(f"{p}.self_attn")
        norm(f"{p}.layer_norm_1")
        attn(f"{p}.context_attn")
        norm(f"{p}.layer_norm_2")
        ffn(f"{p}.feed_forward")
    norm("decoder.layer_norm")
    dec_emb = sd["decoder.embeddings.make_embedding.emb_luts.0.weight"]
    gen = {"weight": dec_emb if tied else r(V, d), "bias": r(V, scale=0.5)}
    return sd, gen


def write_onmt(path: Path, sd: dict, gen: dict, opt: argparse.Namespace, tgt_vocab: Optional[list] = None) -> Path:
    """An OpenNMT-py 3.x checkpoint file (``torch.save`` of model, generator, vocab, opt, optim)."""
    import torch

    vocab = {"src": ONMT_VOCAB, "tgt": tgt_vocab or ONMT_VOCAB, "data_task": "seq2seq", "decoder_start_token": "<s>"}
    optim = {"optimizer": {"state": {}, "param_groups": [{"lr": 1.0, "params": [0]}]}, "training_step": 3}
    torch.save({"model": sd, "generator": gen, "vocab": vocab, "opt": opt, "optim": optim}, path)
    return Path(path)


# ----------------------------------------------------------------------------- a fake Marian (OPUS-MT) folder

MARIAN_SETTINGS = dict(  # config.json of the fake; vocab_size and the pad ids follow the vocabulary
    model_type="marian", d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
    decoder_attention_heads=4, encoder_ffn_dim=24, decoder_ffn_dim=40, max_position_embeddings=64,
    activation_function="swish", scale_embedding=True, eos_token_id=0, forced_eos_token_id=None, dropout=0.1,
    attention_dropout=0.0, init_std=0.3, tie_word_embeddings=True, share_encoder_decoder_embeddings=True,
)  # fmt: skip
SPECIAL_PIECES = {"<unk>", "<s>", "</s>"}
MARIAN_SRC = [
    "the cat sat on the mat .", "a dog saw the cat .", "she gave him the book .", "they went home early .",
    "he said that it was late .", "we like green apples .", "the house is big and old .", "it rains today .",
]  # fmt: skip
MARIAN_TGT = [
    "die katze sass auf der matte .", "ein hund sah die katze .", "sie gab ihm das buch .", "sie gingen frueh heim .",
    "er sagte dass es spaet war .", "wir moegen gruene aepfel .", "das haus ist gross und alt .", "es regnet heute .",
]  # fmt: skip


def _spm(lines: list[str], size: int) -> tuple[bytes, list[str]]:
    """A tiny SentencePiece model trained here, and its ordinary pieces."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 4), model_writer=buf, vocab_size=size, character_coverage=1.0,
        model_type="unigram", minloglevel=2,
    )  # fmt: skip
    proc = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
    return buf.getvalue(), [p for p in pieces if p not in SPECIAL_PIECES]


def marian_tensors(config: dict, seed: int = 0) -> dict:
    """The weights ``MarianMTModel.save_pretrained`` writes for ``config``, random as its
    initialization (normal(0, init_std)), with random norms, biases and output bias too, so that a
    mapping mistake shows; ``<unk>`` made unlikely and ``</s>`` likely (sentences of several lengths)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n, d, std, pad = config["vocab_size"], config["d_model"], config["init_std"], config["pad_token_id"]

    def r(*shape, scale=std):
        return torch.randn(*shape, generator=g) * scale

    t: dict = {}

    def embedding(name):
        t[name] = r(n, d)
        t[name][pad] = 0

    def lin(name, n_out, n_in):
        t[name + ".weight"], t[name + ".bias"] = r(n_out, n_in), r(n_out, scale=std / 3)

    def norm(name):
        t[name + ".weight"], t[name + ".bias"] = 1 + r(d, scale=0.2), r(d, scale=0.2)

    if config["share_encoder_decoder_embeddings"]:
        embedding("model.shared.weight")
    else:
        embedding("model.encoder.embed_tokens.weight")
        embedding("model.decoder.embed_tokens.weight")
    for side in ("encoder", "decoder"):
        ff = config[f"{side}_ffn_dim"]
        for i in range(config[f"{side}_layers"]):
            p = f"model.{side}.layers.{i}."
            for attn in ("self_attn",) + (("encoder_attn",) if side == "decoder" else ()):
                for x in "qkv":
                    lin(p + attn + "." + x + "_proj", d, d)
                lin(p + attn + ".out_proj", d, d)
                norm(p + attn + "_layer_norm")
            lin(p + "fc1", ff, d)
            lin(p + "fc2", d, ff)
            norm(p + "final_layer_norm")
    if not config["tie_word_embeddings"]:
        t["lm_head.weight"] = r(n, d)
    t["final_logits_bias"] = r(1, n, scale=0.5)
    t["final_logits_bias"][0, 1] -= 4.0  # <unk>: random models otherwise repeat it
    t["final_logits_bias"][0, 0] += 2.5  # </s>
    return t


def write_marian(
    folder: Path, seed: int = 0, safetensors: bool = True, text: Optional[tuple] = None, pieces: int = 40, **over: Any
) -> Path:
    """A random Marian model in the Hugging Face layout (what ``huggingface-cli download`` gives:
    ``model.safetensors``, or the older ``pytorch_model.bin`` with ``safetensors=False``; two
    SentencePiece models of ``pieces`` pieces learned on ``text`` (source lines, target lines;
    :data:`MARIAN_SRC` and :data:`MARIAN_TGT` by default);
    ``vocab.json``; ``config.json`` of :data:`MARIAN_SETTINGS` updated by ``over``). transformers'
    ``MarianMTModel.from_pretrained`` reads it (the import tests' reference); nothing here needs it."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = text or (MARIAN_SRC, MARIAN_TGT)
    src_model, src_pieces = _spm(text[0], pieces)
    tgt_model, tgt_pieces = _spm(text[1], pieces)
    vocab = ["</s>", "<unk>", *sorted(set(src_pieces) | set(tgt_pieces)), "<pad>"]  # Marian's order
    pad = len(vocab) - 1
    config = {**MARIAN_SETTINGS, "vocab_size": len(vocab), "pad_token_id": pad, "decoder_start_token_id": pad}
    config.update(over)
    tensors = marian_tensors(config, seed)
    if safetensors:
        from safetensors.torch import save_file

        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(tensors, folder / "pytorch_model.bin")
    (folder / "source.spm").write_bytes(src_model)
    (folder / "target.spm").write_bytes(tgt_model)
    (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(vocab)}), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


# ----------------------------------------------------------------------------- the review's workspace


def tiny_config(log_dir: str, decoder: str = "transformer", max_steps: int = 10) -> str:
    """The tiny Transformer every case trains or translates with: seconds, not minutes."""
    return (
        "data:\n"
        "  train: {src: toy/train.src, tgt: toy/train.tgt}\n"
        "  valid: {src: toy/valid.src, tgt: toy/valid.tgt}\n"
        "vocab: {subword: bpe, size: 300, shared: true}\n"
        "model:\n"
        "  d_model: 32\n"
        "  encoder: {type: transformer, layers: 1, heads: 2, ff: 64}\n"
        f"  decoder: {{type: {decoder}, layers: 1, heads: 2, ff: 64}}\n"
        "loss:\n"
        "  - {type: label_smoothed_ce, smoothing: 0.1}\n"
        "optim: {type: adam, lr: 1.0e-3}\n"
        f"train: {{batch_tokens: 1024, max_steps: {max_steps}, valid_every: {max_steps}, save_every: 5, "
        "keep_last: 5, seed: 1}\n"
        "translate: {beam: 2}\n"
        f"log: {{dir: {log_dir}, tensorboard: false, every: 5}}\n"
    )


def log(msg: str) -> None:
    """Progress on stderr (the results go to files)."""
    print(f"[hostile {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def env() -> dict:
    """The environment of every command the review runs: one thread, no bytecode, no warnings filter."""
    out = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    out.pop("PYTHONWARNINGS", None)
    return out


def console(name: str) -> str:
    """The console script of this interpreter (not a pyenv shim: the shim costs a shell per case)."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def _prep_run(cmd: list[str], cwd: Path, fatal: bool = True) -> bool:
    r = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True)
    if r.returncode != 0 and fatal:
        raise SystemExit(f"workspace preparation failed: {shlex.join(cmd)}\n{r.stderr[-3000:]}")
    if r.returncode != 0:
        log(f"{shlex.join(cmd[:3])} failed: {r.stderr.strip()[-300:]}")
    return r.returncode == 0


def prepare_workspace(work: Path) -> Path:
    """The files cases copy from, made once per --work: corpus, runs, checkpoints, damaged variants."""
    base = work / "base"
    if (base / ".complete").exists() and (base / ".complete").read_text() == PREP_VERSION:
        return base
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    log(f"preparing the workspace in {base}")
    toy = ["--out", "toy", "--train-docs", "300", "--valid-docs", "10", "--test-docs", "10"]
    _prep_run([console("onmt_doc_make_toy_corpus"), *toy], base)
    (base / "tiny.yaml").write_text(tiny_config("run"), encoding="utf-8")
    (base / "gates.yaml").write_text(tiny_config("gates_run", "gated_transformer"), encoding="utf-8")
    _prep_run([console("onmt_doc_train"), "-config", "tiny.yaml"], base)
    ck = base / "run" / "checkpoints"
    for name, src in (("model.pt", "best.pt"), ("last.pt", "last.pt"), ("step_5.pt", "step_5.pt")):
        shutil.copy(ck / src, base / name)
    shutil.copy(ck / "step_10.pt", base / "step_10.pt")
    _prep_run([console("onmt_doc_train"), "-config", "gates.yaml"], base)
    shutil.copy(base / "gates_run" / "checkpoints" / "best.pt", base / "gates.pt")
    _prep_run([console("onmt_doc_build_pmi_table"), "-config", "gates.yaml", "-output", "pmi.npz"], base)
    hyp = ["-model", "model.pt", "-src", "toy/test.src", "-beam", "1", "-output", "hyp.txt"]
    _prep_run([console("onmt_doc_translate"), *hyp], base)
    (base / "lexicon.tsv").write_text("the\tdie\ncat\tkatze\ndog\thund\n", encoding="utf-8")
    _prep_run([sys.executable, __file__, "tensors", str(base)], base)
    if not _prep_run([sys.executable, __file__, "marian", str(base)], base, fatal=False):
        log("no Marian folder for the import cases (needs sentencepiece and safetensors)")
    (base / ".complete").write_text(PREP_VERSION)
    log("workspace ready")
    return base


def prep_tensors(base: Path) -> None:
    """Checkpoints only torch can make: a fake OpenNMT-py checkpoint (one with a tensor of the
    wrong shape, one with a NaN), onmt_doc checkpoints with valid checksums whose tensors or stored
    config do not fit, and a PMI table whose object array is a malicious pickle."""
    import numpy as np
    import torch

    from onmt_doc.models.checkpoint import save_checkpoint

    os.chdir(base)
    sd, gen = onmt_state(enc=1, dec=1)
    opt = onmt_opt(enc=1, dec=1)
    write_onmt(Path("onmt.pt"), sd, gen, opt)
    key = "encoder.transformer.0.feed_forward.w_1.weight"
    write_onmt(Path("onmt_shapes.pt"), {**sd, key: torch.zeros(7, 5)}, gen, opt)
    nan = sd[key].clone()
    nan[0, 0] = math.nan
    write_onmt(Path("onmt_nan.pt"), {**sd, key: nan}, gen, opt)
    ck = torch.load("model.pt", weights_only=True)
    name = max((k for k, v in ck["model"].items() if v.dim() == 2), key=lambda k: ck["model"][k].numel())
    save_checkpoint(dict(ck, model=dict(ck["model"], **{name: torch.zeros(3, 5)})), "shapes.pt")
    for out, d_model in (("cfgmismatch.pt", 64), ("huge.pt", 10**8)):
        cfg = dict(ck["config"], model=dict(ck["config"]["model"], d_model=d_model))
        save_checkpoint(dict(ck, config=cfg), out)
    table = dict(np.load("pmi.npz"))
    arr = np.empty(1, dtype=object)
    arr[0] = _Evil()
    np.savez("evil_pmi.npz", **dict(table, **{list(table)[0]: arr}))


def prep_marian(base: Path) -> None:
    """A tiny random Marian model (:func:`write_marian`) whose SentencePiece models are learned on
    the toy corpus (``marian/``), and its older ``pytorch_model.bin`` twin (``marian_bin/``)."""
    lines = [[x for x in (base / f"toy/train.{s}").read_text(encoding="utf-8").splitlines() if x.strip()]
             for s in ("src", "tgt")]  # fmt: skip
    small = dict(encoder_layers=1, decoder_layers=1, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32)
    write_marian(base / "marian", text=tuple(lines), pieces=60, **small)
    write_marian(base / "marian_bin", text=tuple(lines), pieces=60, safetensors=False, **small)


if __name__ == "__main__":  # python tools/hostile/fixtures.py tensors|marian BASE (prepare_workspace runs it)
    {"tensors": prep_tensors, "marian": prep_marian}[sys.argv[1]](Path(sys.argv[2]))
