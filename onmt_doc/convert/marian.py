"""Import a Marian / OPUS-MT model in the Hugging Face layout as an onmt_doc checkpoint.

The folder (``huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de``, see
docs/pretrained.md) holds ``config.json``, ``model.safetensors`` or ``pytorch_model.bin``,
``source.spm``, ``target.spm`` and ``vocab.json``. Nothing is downloaded here.

The network (transformers ``models/marian/modeling_marian.py``, ``MarianMTModel``) is our
``transformer`` encoder + decoder with the model options it needs, set in the checkpoint's config:
post-norm blocks (``pre_norm: false``: LN after each residual sum, no final norm) with
``nn.LayerNorm``'s eps 1e-5 (``model.layer_norm_eps``), the feed-forward activation of
``activation_function`` (``swish`` = SiLU, ``gelu``, ``relu``: ``model.activation``), token
embeddings scaled by sqrt(d) or not (``scale_embedding``), sinusoids with all sines then all
cosines from position 0 (``MarianSinusoidalPositionalEmbedding``: ``model.position_layout:
halves``), the output bias ``final_logits_bias`` (our generator's bias), tied or separate output
matrix (``tie_word_embeddings``). Its q/k/v projections are stacked into our fused ones.

Vocabulary: Marian's ids (``vocab.json``; ``</s>`` = ``eos_token_id``, ``<unk>``, ``<pad>`` =
``pad_token_id``, usually the last) are reordered into ours, whose specials have fixed ids in every
onmt_doc model (onmt_doc/data/vocab.py): our specials first, then Marian's entries in its order,
and the embedding and output rows are permuted the same way. Keeping Marian's order instead would
need every special id of the toolkit (search, data, losses) to become a per-model value; a
permutation is exact and leaves them alone. Our rows take Marian's by meaning: ``<pad>`` ← pad,
``<unk>`` and ``<mask>`` ← unk, ``<eos>`` and ``</s>`` ← eos, and ``<bos>`` and ``<s>`` ← the row of
``decoder_start_token_id`` (Marian starts decoding from ``<pad>``; a Marian entry ``<s>`` or
``<mask>`` gives that special its row instead): our search and teacher forcing start every
target with ``<bos>``, whose row is now Marian's start token's, so no start-token option is needed
anywhere else. The output rows of ``<pad>``, ``<s>``, ``<bos>``, ``<mask>`` and, without
markup, ``</s>`` get their bias lowered by :data:`NEVER_OFFSET` (never generated): our distribution
is Marian's with ``<pad>`` excluded, as transformers' generation does (``bad_words_ids`` of the
OPUS-MT generation configs), to within exp(-30).

Sequences: Marian reads ``pieces… </s>`` (``MarianTokenizer`` appends the end token) and predicts
``pieces… </s>``. By default the checkpoint has ``data.sentence_markup: false`` and a source
:class:`Subword` that appends ``</s>`` (onmt_doc/data/tokenizer.py), so the model reads exactly
Marian's input. ``markup=True`` keeps onmt_doc's ``<s> … </s>`` instead (``</s>`` is then Marian's
end token and ``<s>`` its start token's row), the start for fine-tuning into a document model.

Loading: ``model.safetensors`` through the ``safetensors`` package, else ``pytorch_model.bin`` with
``torch.load(weights_only=True)``: never an arbitrary pickle. Every tensor is mapped by name; one
left over, a missing one, a wrong shape, or a config value we do not implement is a one-line error.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import re
from typing import Any, Optional

import torch
import yaml

from onmt_doc.config import config_from_dict, config_to_dict
from onmt_doc.convert import check_finite
from onmt_doc.data.codec import Codec
from onmt_doc.data.prepare import save_codec
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import BOS, EOS, EOS_SENT, MASK, PAD, SOS, SPECIALS, UNK, Vocab
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.models.builder import build_model
from onmt_doc.models.checkpoint import read_torch_file, save_checkpoint
from onmt_doc.modules.embeddings import sinusoid_table
from onmt_doc.outputs import input_problem, parse_json, read_input_bytes, write_text

CONFIG, SAFETENSORS, PICKLE = "config.json", "model.safetensors", "pytorch_model.bin"
SOURCE_SPM, TARGET_SPM, VOCAB = "source.spm", "target.spm", "vocab.json"
FOLDER_FILES = (CONFIG, SAFETENSORS, PICKLE, SOURCE_SPM, TARGET_SPM, VOCAB)  # what an output must never be
IMPORT_SECTIONS = "marian_import.yaml"  # written into -run_dir: the config sections a fine-tuning run keeps
NEVER_OFFSET = 30.0  # logit offset of rows never generated: exp(-30) ≈ 1e-13 of the row they copy
SMALL_FILE = 256 << 20  # the largest config / vocabulary / SentencePiece model read
# transformers' activation names (ACT2FN) -> ours (``model.activation``)
ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}
# config.json keys of the older BART-style Marian configs whose non-default values change the
# network; transformers' Marian ignores them, we refuse rather than guess: (key, the value we support)
# config.json's switches (transformers' MarianConfig defaults): JSON booleans only
BOOL_KEYS = {"scale_embedding": False, "tie_word_embeddings": True, "share_encoder_decoder_embeddings": True}
FIXED_KEYS = (
    ("normalize_before", False),
    ("add_final_layer_norm", False),
    ("normalize_embedding", False),
    ("add_bias_logits", False),
    ("static_position_embeddings", True),
    ("is_encoder_decoder", True),
)


def marian_error(what: str) -> UserError:
    """The one-line refusal of a Marian model we cannot import exactly."""
    return UserError(f"Marian model not importable: {what}")


def read_folder(folder: str) -> dict[str, Any]:
    """config.json, the weights, both SentencePiece models and vocab.json of ``folder``, each
    checked against the sha256 the Hugging Face download recorded for it where there is one
    (:func:`verify_download`; ``verified``: the names checked); a missing, unreadable or damaged
    file is a one-line error naming it."""
    if not os.path.isdir(folder):
        problem = input_problem(folder)
        what = "not found" if problem == "file not found" else "is a file, not a folder"
        raise UserError(f"{folder}: {what} (expected a Hugging Face Marian folder: {CONFIG}, {VOCAB}, …)")

    def need(name: str) -> str:
        path = os.path.join(folder, name)
        problem = input_problem(path)
        if problem == "file not found":
            raise UserError(f"{path}: missing; a Marian model folder holds {CONFIG}, {SAFETENSORS} or "
                            f"{PICKLE}, {SOURCE_SPM}, {TARGET_SPM} and {VOCAB}")  # fmt: skip
        if problem:
            raise UserError(f"{path}: {problem}")
        return path

    if os.path.lexists(os.path.join(folder, "target_vocab.json")):
        raise marian_error("separate source and target vocabularies (target_vocab.json) are not supported")
    weights = SAFETENSORS if os.path.lexists(os.path.join(folder, SAFETENSORS)) else PICKLE
    paths = {name: need(name) for name in (CONFIG, VOCAB, SOURCE_SPM, TARGET_SPM, weights)}
    verified = [name for name, path in paths.items() if verify_download(folder, name, path)]
    config = _json(paths[CONFIG])
    vocab = _json(paths[VOCAB])
    spm = {name: read_input_bytes(paths[name], limit=SMALL_FILE, what="SentencePiece model")
           for name in (SOURCE_SPM, TARGET_SPM)}  # fmt: skip
    tensors = load_safetensors(paths[weights]) if weights == SAFETENSORS else load_pickle(paths[weights])
    check_finite(tensors, paths[weights])
    return {"config": config, "vocab": vocab, "tensors": tensors, "verified": verified, **spm}


# where ``huggingface-cli download … --local-dir DIR`` records each file it wrote: commit, ETag, time
DOWNLOAD_RECORDS = os.path.join(".cache", "huggingface", "download")
SHA256 = re.compile(r"^[0-9a-f]{64}$")  # an LFS file's ETag is the sha256 of its bytes (huggingface_hub's rule)


def download_sha256(folder: str, name: str) -> Optional[str]:
    """The sha256 the Hugging Face download of ``folder`` recorded for ``name``, or None (no
    record: a folder written by ``save_pretrained`` or copied; a file stored without LFS)."""
    record = os.path.join(folder, DOWNLOAD_RECORDS, f"{name}.metadata")
    try:
        with open(record, "rb") as f:
            lines = f.read(4096).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    etag = lines[1].strip().strip('"') if len(lines) > 1 else ""
    return etag if SHA256.match(etag) else None


def verify_download(folder: str, name: str, path: str) -> bool:
    """Check ``path`` against its download record (:func:`download_sha256`): one more read of the
    file; True when checked, a one-line ``UserError`` when its bytes differ (safetensors holds no
    checksum of its own, so a flipped byte would otherwise import as a slightly different model)."""
    expected = download_sha256(folder, name)
    if expected is None:
        return False
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror or e})") from None
    if h.hexdigest() != expected:
        record = os.path.join(DOWNLOAD_RECORDS, f"{name}.metadata")
        raise UserError(
            f"{path}: damaged: its sha256 differs from the one its download recorded ({record}); download it "
            f"again (or, for a file you changed on purpose, delete that record)"
        )
    return True


def _json(path: str) -> Any:
    data = read_input_bytes(path, limit=SMALL_FILE, what="JSON file")
    return parse_json(data, path)


def load_safetensors(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file (a format that holds nothing but tensors)."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise UserError(
            f"{path}: reading safetensors needs the safetensors package: pip install safetensors "
            "(or pip install 'onmt_doc[marian]')"
        ) from None
    try:
        return load_file(path, device="cpu")
    except Exception as e:  # a damaged or foreign file: safetensors raises its own error types
        raise UserError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0][:160]})") from None


def load_pickle(path: str) -> dict[str, torch.Tensor]:
    """The state dict of a ``pytorch_model.bin``: its records checked against their CRC-32s, read
    with ``weights_only=True`` (tensors only)."""
    state = read_torch_file(path, "PyTorch state dict", "download it again")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: not a state dict of tensors")
    return state


def _int(config: dict, key: str, minimum: int = 1) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise marian_error(f"config.json {key} {value!r} is not an integer >= {minimum}")
    return int(value)


def _probability(config: dict, key: str) -> float:
    value = config.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise marian_error(f"config.json {key} {value!r} is not a probability in [0, 1)")
    return float(value)


def _bool(config: dict, key: str, default: bool) -> bool:
    """A JSON true/false, never a truthy string (``"false"``) or number."""
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise marian_error(f"config.json {key} {value!r} is not true or false")
    return value


def check_config(config: Any) -> None:
    """Refuse, in one line naming the key, every config.json value whose network we do not build,
    and every value of the wrong type (strictly: ``"false"`` is a string, not false)."""
    if not isinstance(config, dict):
        raise marian_error("config.json is not a JSON object")
    if config.get("model_type") != "marian":
        raise marian_error(f"config.json model_type {config.get('model_type')!r} (expected 'marian')")
    activation = config.get("activation_function", "gelu")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise marian_error(f"config.json activation_function {activation!r} (supported: {', '.join(ACTIVATIONS)})")
    for key, supported in FIXED_KEYS:
        if key in config and (not isinstance(config[key], bool) or config[key] != supported):
            raise marian_error(f"config.json {key} {config[key]!r} (only {str(supported).lower()} is supported)")
    for key in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size"):  # fmt: skip
        _int(config, key, 0 if key.endswith("_layers") else 1)
    for key in ("encoder_attention_heads", "decoder_attention_heads"):
        if config["d_model"] % config[key]:
            raise marian_error(f"config.json d_model {config['d_model']} is not divisible by {key} {config[key]}")
    if config.get("decoder_vocab_size") is not None:
        _int(config, "decoder_vocab_size")
    if config.get("decoder_vocab_size") not in (None, config["vocab_size"]):
        raise marian_error(f"config.json decoder_vocab_size {config['decoder_vocab_size']} (a separate target "
                           f"vocabulary) differs from vocab_size {config['vocab_size']}")  # fmt: skip
    for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
        _int(config, key, 0)
    if "max_position_embeddings" in config:
        _int(config, "max_position_embeddings")
    for key in ("dropout", "attention_dropout"):
        _probability(config, key)
    for key, default in BOOL_KEYS.items():
        _bool(config, key, default)


def marian_vocab(vocab: Any, config: dict, rows: int) -> tuple[Vocab, dict[str, int]]:
    """Our vocabulary for Marian's ``vocab.json`` (token -> id) and, per our special, the Marian id
    whose row it takes; the ids must be 0..n-1 and n the embeddings' row count."""
    if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
        raise marian_error("vocab.json is not a JSON object of token -> integer id")
    by_id = {i: t for t, i in vocab.items()}
    if sorted(by_id) != list(range(len(vocab))):
        raise marian_error("vocab.json ids are not 0 … n-1, each once")
    if len(vocab) != rows or len(vocab) != config["vocab_size"]:
        raise marian_error(f"vocab.json has {len(vocab)} entries but the embeddings {rows} rows "
                           f"(config.json vocab_size {config['vocab_size']})")  # fmt: skip
    ids = {key: config[key] for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id")}
    for key, i in ids.items():
        if i >= len(vocab):
            raise marian_error(f"config.json {key} {i} is not an id of vocab.json ({len(vocab)} entries)")
    if UNK not in vocab:
        raise marian_error(f"vocab.json has no {UNK}")
    start, eos, pad, unk = ids["decoder_start_token_id"], ids["eos_token_id"], ids["pad_token_id"], vocab[UNK]
    source = {PAD: pad, UNK: unk, SOS: start, EOS_SENT: eos, BOS: start, EOS: eos, MASK: unk}
    # an ordinary Marian entry "<s>" or "<mask>" is that special of ours; other specials' names must not be entries
    source.update({t: vocab[t] for t in (SOS, MASK) if t in vocab and vocab[t] not in (pad, eos, unk)})
    merged = set(source.values())
    clash = [t for t in SPECIALS if t in vocab and vocab[t] not in merged]
    if clash:
        raise marian_error(f"vocab.json has ordinary entries named like onmt_doc specials: {clash[:3]}")
    ours = list(SPECIALS) + [by_id[i] for i in range(len(vocab)) if i not in merged]
    return Vocab(ours), {t: source.get(t, vocab.get(t, -1)) for t in ours}


class _Source:
    """Marian tensors handed out by name; whatever is never taken is an error (nothing is lost)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = {k.removeprefix("model."): v.detach().float() for k, v in tensors.items()}
        self.taken: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.tensors:
            raise marian_error(f"the weights have no tensor {name}")
        t = self.tensors[name]
        if tuple(t.shape) != shape:
            raise marian_error(f"tensor {name} has shape {tuple(t.shape)}, expected {shape}")
        self.taken.add(name)
        return t

    def first(self, names: tuple[str, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The first of ``names`` present (a tied matrix is saved under one of its names); the
        others, when also saved, must hold the same values."""
        present = [n for n in names if n in self.tensors]
        if not present:
            raise marian_error(f"the weights have none of {', '.join(names)}")
        t = self.take(present[0], shape)
        for other in present[1:]:
            if not torch.equal(self.take(other, shape), t):
                raise marian_error(f"{other} differs from {present[0]}, which the config says are one matrix")
        return t

    def left(self) -> list[str]:
        return sorted(set(self.tensors) - self.taken)


def _layer_tensors(src: _Source, ours: str, theirs: str, d: int, ff: int, decoder: bool) -> dict[str, torch.Tensor]:
    """Our tensors of one encoder or decoder layer from Marian's layer ``theirs``."""

    def lin(name: str, out: int, inp: int) -> tuple[torch.Tensor, torch.Tensor]:
        return src.take(f"{theirs}.{name}.weight", (out, inp)), src.take(f"{theirs}.{name}.bias", (out,))

    def norm(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return src.take(f"{theirs}.{name}.weight", (d,)), src.take(f"{theirs}.{name}.bias", (d,))

    def put(name: str, wb: tuple[torch.Tensor, torch.Tensor]) -> None:
        out[f"{ours}.{name}.weight"], out[f"{ours}.{name}.bias"] = wb

    def stack(prefix: str, parts: str) -> tuple[torch.Tensor, torch.Tensor]:
        got = [lin(f"{prefix}.{p}_proj", d, d) for p in parts]
        return torch.cat([w for w, _ in got]), torch.cat([b for _, b in got])

    out: dict[str, torch.Tensor] = {}
    put("self_attn.qkv", stack("self_attn", "qkv"))
    put("self_attn.out", lin("self_attn.out_proj", d, d))
    put("self_res.norm" if decoder else "attn_res.norm", norm("self_attn_layer_norm"))
    if decoder:
        put("cross_attn.q", lin("encoder_attn.q_proj", d, d))
        put("cross_attn.kv", stack("encoder_attn", "kv"))
        put("cross_attn.out", lin("encoder_attn.out_proj", d, d))
        put("cross_res.norm", norm("encoder_attn_layer_norm"))
    put("ff.w1", lin("fc1", ff, d))
    put("ff.w2", lin("fc2", d, ff))
    put("ff_res.norm", norm("final_layer_norm"))
    return out


def _check_positions(src: _Source, side: str, d: int) -> None:
    """A stored position table (older files save it) must be the ``halves`` sinusoids we compute."""
    name = f"{side}.embed_positions.weight"
    if src.has(name):
        table = src.tensors[name]
        if table.dim() != 2 or table.size(1) != d:
            raise marian_error(f"tensor {name} has shape {tuple(table.shape)}, expected (positions, {d})")
        src.take(name, tuple(table.shape))
        if not torch.allclose(table, sinusoid_table(table.size(0), d, "halves"), atol=1e-4):
            raise marian_error(f"{name} is not Marian's sinusoidal table (learned positions are not supported)")


def model_config(config: dict, shared_spm: bool, markup: bool) -> dict:
    """The onmt_doc config (as a dict) of the Marian network described by ``config``."""
    share = _bool(config, "share_encoder_decoder_embeddings", True)
    return {
        "data": {"sentence_markup": markup},
        "vocab": {"subword": "sentencepiece", "shared": shared_spm, "tokenizer": "none"},
        "model": {
            "d_model": config["d_model"],
            # one embedding module needs vocab.shared (one subword model): with two SentencePiece
            # models the two sides get equal copies instead (the same function; fine-tuning may part them)
            "share_embeddings": share and shared_spm,
            "tie_output": _bool(config, "tie_word_embeddings", True),
            "dropout": _probability(config, "dropout"),
            "attention_dropout": _probability(config, "attention_dropout"),
            "max_positions": _int(config, "max_position_embeddings") if "max_position_embeddings" in config else 1024,
            "activation": ACTIVATIONS[config.get("activation_function", "gelu")],
            "position_layout": "halves",
            "scale_embedding": _bool(config, "scale_embedding", False),
            "layer_norm_eps": 1e-5,  # nn.LayerNorm's default, what transformers' Marian layers use
            "encoder": {"type": "transformer", "layers": config["encoder_layers"], "pre_norm": False,
                        "heads": config["encoder_attention_heads"], "ff": config["encoder_ffn_dim"]},
            "decoder": {"type": "transformer", "layers": config["decoder_layers"], "pre_norm": False,
                        "heads": config["decoder_attention_heads"], "ff": config["decoder_ffn_dim"]},
        },
    }  # fmt: skip


def convert(folder_data: dict, markup: bool = False) -> dict:
    """An onmt_doc checkpoint payload (config, codec, model) computing the Marian model of
    :func:`read_folder`'s ``folder_data``; ``markup``: see the module docstring."""
    config = folder_data["config"]
    check_config(config)
    src = _Source(folder_data["tensors"])
    d, n = config["d_model"], config["vocab_size"]
    share = _bool(config, "share_encoder_decoder_embeddings", True)
    enc_names = ("shared.weight", "encoder.embed_tokens.weight") if share else ("encoder.embed_tokens.weight",)
    dec_names = ("shared.weight", "decoder.embed_tokens.weight") if share else ("decoder.embed_tokens.weight",)
    present = [src.tensors[name] for name in enc_names if name in src.tensors]
    vocab, row_source = marian_vocab(folder_data["vocab"], config, present[0].size(0) if present else n)
    enc_emb, dec_emb = src.first(enc_names, (n, d)), src.first(dec_names, (n, d))
    tied = _bool(config, "tie_word_embeddings", True)
    out_w = dec_emb if tied and not src.has("lm_head.weight") else src.take("lm_head.weight", (n, d))
    if tied and not torch.equal(out_w, dec_emb):
        raise marian_error("tie_word_embeddings is true but lm_head.weight differs from the decoder embeddings")
    bias = src.take("final_logits_bias", (1, n))[0] if src.has("final_logits_bias") else torch.zeros(n)
    for side in ("encoder", "decoder"):
        _check_positions(src, side, d)
    src_sw = Subword("sentencepiece", "none", folder_data[SOURCE_SPM], () if markup else (EOS_SENT,))
    tgt_sw = Subword("sentencepiece", "none", folder_data[TARGET_SPM])
    shared_spm = folder_data[SOURCE_SPM] == folder_data[TARGET_SPM]
    codec = Codec(src_sw, tgt_sw, vocab, vocab)
    try:
        cfg = config_from_dict(model_config(config, shared_spm, markup), "imported Marian config.json")
    except ConfigError as e:
        raise marian_error(str(e)) from None
    model = build_model(cfg.model, codec)
    rows = torch.tensor([row_source[t] for t in vocab.itos])
    gen_bias = bias[rows].clone()
    never = (PAD, SOS, BOS, MASK) if markup else (PAD, SOS, BOS, MASK, EOS_SENT)
    gen_bias[[vocab.stoi[t] for t in never]] -= NEVER_OFFSET
    state = {
        "encoder.embeddings.tokens.weight": enc_emb[rows],
        "decoder.embeddings.tokens.weight": dec_emb[rows],
        "generator.weight": out_w[rows],
        "generator.bias": gen_bias,
    }
    for i in range(config["encoder_layers"]):
        state.update(_layer_tensors(src, f"encoder.layers.{i}", f"encoder.layers.{i}", d,
                                    config["encoder_ffn_dim"], decoder=False))  # fmt: skip
    for i in range(config["decoder_layers"]):
        state.update(_layer_tensors(src, f"decoder.layers.{i}", f"decoder.layers.{i}", d,
                                    config["decoder_ffn_dim"], decoder=True))  # fmt: skip
    left = src.left()
    if left:
        raise marian_error(f"tensors with no onmt_doc counterpart: {', '.join(left[:4])}")
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise marian_error(f"onmt_doc parameters the Marian model does not provide: {', '.join(missing[:4])}")
    for name, value in state.items():
        if own[name].shape != value.shape:
            raise marian_error(f"{name}: shape {tuple(value.shape)} does not fit onmt_doc's {tuple(own[name].shape)}")
    model.load_state_dict(state, strict=True)
    return {"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict()}


def import_marian(
    folder: str, output: str, force: bool = False, run_dir: Optional[str] = None, markup: bool = False
) -> tuple[dict, list[str]]:
    """Convert the Marian model of ``folder`` and save it atomically as the onmt_doc checkpoint
    ``output``; ``run_dir`` also gets the SentencePiece models and vocabularies as a run folder holds
    them, so a run there (``log.dir``) can fine-tune it with ``train.init_from``. Returns the
    checkpoint's payload and the files checked against their download's sha256."""
    if os.path.exists(output) and not force:
        raise UserError(f"{output} exists; add -force to overwrite it")
    data = read_folder(folder)
    payload = convert(data, markup)
    inputs = [("-model", os.path.join(folder, name)) for name in FOLDER_FILES]
    save_checkpoint(payload, output, inputs, "-output")
    if run_dir:
        save_codec(Codec.from_dict(payload["codec"]), run_dir, payload["config"]["vocab"]["shared"], inputs, force)
        sections = {key: payload["config"][key] for key in ("vocab", "model")}
        note = (
            f"# the vocab and model sections of {output} (onmt_doc_import_marian): a run that fine-tunes it\n"
            "# (train.init_from) keeps these keys; change model.encoder/decoder type for a document model\n"
        )
        write_text(os.path.join(run_dir, IMPORT_SECTIONS), note + yaml.safe_dump(sections, sort_keys=False), inputs)
    return payload, data["verified"]
