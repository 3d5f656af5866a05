"""Import an OpenNMT-py 3.x Transformer checkpoint as an onmt_doc checkpoint.

OpenNMT-py 3.x's ``transformer`` encoder + decoder is our pre-norm ``transformer`` pair: embeddings
scaled by sqrt(d) plus interleaved sinusoids from position 0, LN before every sublayer and a final LN
on both stacks, ReLU feed-forward. Every tensor of its ``model`` and ``generator`` entries is mapped
by name (``_Source`` fails on anything left over); projections it stores without a bias
(``add_qkvbias``/``add_ffnbias`` off, the 3.x default) get zero biases, which computes the same
function. Architectures we do not have (relative positions, rotary, ALiBi, RMS norm, gated or
non-ReLU feed-forward, parallel residual, multi-query, MoE, average attention, copy attention, source
features, language models) are refused in one line.

Sequences: the checkpoint says ``data.sentence_markup: false``, so the model reads what OpenNMT-py
3.x fed it in training: the bare source (``onmt/inputters/text_utils.py`` ``numericalize`` adds
nothing to a seq2seq source), the decoder input ``<bos> w…`` (our ``<bos>`` is its ``<s>``, its
``decoder_start_token``) and the output ``w… <eos>`` (our ``<eos>`` is its ``</s>``). ``markup=True``
(``-sentence_markup``) keeps onmt_doc's ``<s> … </s>`` instead, for fine-tuning into a document model.

Vocabularies: ours start with our fixed specials (onmt_doc/data/vocab.py), then OpenNMT-py's entries
in its order minus its specials. Our rows take OpenNMT-py's rows by meaning: ``<pad>`` ← ``<blank>``,
``<unk>`` ← ``<unk>``, ``<s>`` and ``<bos>`` ← ``<s>``, ``</s>`` and ``<eos>`` ← ``</s>``, ``<mask>`` ←
``<mask>`` (``<unk>`` if absent). The generator rows of ``<bos>``, ``<mask>`` and, without markup,
``</s>`` (never generated) get their bias lowered by :data:`NEVER_OFFSET`, so they take exp(-30) of
the probability of the row they copy: without markup our softmax is OpenNMT-py's (``<s>`` keeps its
row once, as ``<s>``; ``<eos>`` alone holds the end probability). With markup ``<eos>`` and ``</s>``
share the end probability p (our search may end a sentence with ``<eos>`` straight after a word;
every other token loses log(1+p)), and a ``</s>`` it does emit is followed by a forced ``<eos>``
whose score is finite; lowering ``<eos>`` instead would make that forced token cost ~30.

Loading: OpenNMT-py pickles its options as an ``argparse.Namespace``. We load with
``weights_only=True`` and allow exactly that one class (``torch.serialization.safe_globals``), never
a full unpickler on a user's file; a checkpoint that needs more is refused with the class named.

Not exact: OpenNMT-py's layer norms use ``norm_eps`` (1e-6 by default), ours ``nn.LayerNorm``'s 1e-5
(a relative change of about 5e-6 on unit-variance activations). Translations differ from
``onmt_translate``'s only by search details (its length cap ``1.25 × the batch's longest source +
5``, its ``avg`` length normalisation by length + 1): 10.52 vs 10.54 BLEU on the Multi30k model of
docs/benchmarks.md, where the markup cost 0.39.
"""

from __future__ import annotations

import argparse
import numbers
import os
from typing import Any, Optional, Sequence

import torch
from torch import nn

from onmt_doc.config import config_from_dict, config_to_dict
from onmt_doc.convert import check_finite
from onmt_doc.data.codec import Codec
from onmt_doc.data.prepare import save_codec
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import BOS, EOS, EOS_SENT, MASK, PAD, SOS, SPECIALS, UNK, Vocab
from onmt_doc.errors import UserError
from onmt_doc.models.builder import build_model
from onmt_doc.models.checkpoint import read_torch_file, save_checkpoint
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.modules.attention import MultiHeadAttention
from onmt_doc.modules.embeddings import sinusoid_table
from onmt_doc.outputs import read_input_bytes

# OpenNMT-py 3.x DefaultTokens (onmt/constants.py)
ONMT_PAD, ONMT_UNK, ONMT_BOS, ONMT_EOS, ONMT_MASK = "<blank>", "<unk>", "<s>", "</s>", "<mask>"
ONMT_SPECIALS = (ONMT_PAD, ONMT_UNK, ONMT_BOS, ONMT_EOS, ONMT_MASK)
# our row -> the OpenNMT-py token whose row it takes
ROW_SOURCE = {PAD: ONMT_PAD, UNK: ONMT_UNK, SOS: ONMT_BOS, EOS_SENT: ONMT_EOS, BOS: ONMT_BOS, EOS: ONMT_EOS}
NEVER_OFFSET = 30.0  # logit offset of <bos>/<mask>: exp(-30) ≈ 1e-13 of the <s> or <unk> row they copy
SUBWORD_BYTES = 256 << 20  # the largest subword model read (real ones are a few MB)
SAFE_GLOBALS = [argparse.Namespace]  # the only class an OpenNMT-py 3.x checkpoint pickles besides tensors


def load_opennmt_checkpoint(path: str) -> dict:
    """The checkpoint dict, read with ``weights_only=True`` plus ``argparse.Namespace`` (its options),
    after checking the CRC-32 of every record of its zip archive (``torch.load`` does not)."""
    ckpt = read_torch_file(path, "OpenNMT-py checkpoint", "use another copy of it", SAFE_GLOBALS)
    if not isinstance(ckpt, dict) or not {"model", "vocab", "opt"} <= set(ckpt):
        raise UserError(f"{path}: not an OpenNMT-py checkpoint (no model/vocab/opt entries)")
    if not isinstance(ckpt["opt"], argparse.Namespace) or not isinstance(ckpt["vocab"], dict):
        raise UserError(f"{path}: not an OpenNMT-py 3.x checkpoint (opt is not a Namespace or vocab not a dict)")
    for key in ("model", "generator"):
        part = ckpt.get(key) or {}
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise UserError(f"{path}: not an OpenNMT-py checkpoint ({key} is not a state dict of tensors)")
        check_finite(part, path)
    return ckpt


def _get(opt: argparse.Namespace, name: str, default: Any = None) -> Any:
    value = getattr(opt, name, default)
    return value[0] if isinstance(value, list) and name in ("dropout", "attention_dropout") and value else value


NUMBER_OPTIONS = {"max_relative_positions": 0, "num_kv": 0, "num_experts": 0, "norm_eps": 1e-6}


def check_types(opt: argparse.Namespace, vocab: dict) -> None:
    """Refuse options of the wrong type before they are compared (a string ``max_relative_positions``
    failed inside a comparison): numbers are numbers, the vocabularies lists of strings."""
    for name, default in NUMBER_OPTIONS.items():
        value = _get(opt, name, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value):
            raise UserError(f"OpenNMT-py model not importable: {name} {value!r} is not a number")
    for side in ("src", "tgt"):
        tokens = vocab.get(side)
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise UserError(f"OpenNMT-py model not importable: vocab['{side}'] is not a list of tokens")


def check_architecture(opt: argparse.Namespace, vocab: dict) -> None:
    """Refuse, in one line, every OpenNMT-py option whose network onmt_doc does not have."""
    check_types(opt, vocab)
    refusals = [
        (_get(opt, "model_task", "seq2seq") != "seq2seq", f"model_task {_get(opt, 'model_task')}"),
        (vocab.get("data_task", "seq2seq") != "seq2seq", f"data_task {vocab.get('data_task')}"),
        (_get(opt, "encoder_type") != "transformer", f"encoder_type {_get(opt, 'encoder_type')}"),
        (_get(opt, "decoder_type") != "transformer", f"decoder_type {_get(opt, 'decoder_type')}"),
        ((_get(opt, "max_relative_positions", 0) or 0) > 0, "relative positions (max_relative_positions > 0)"),
        ((_get(opt, "max_relative_positions", 0) or 0) == -1, "rotary embeddings (max_relative_positions -1)"),
        ((_get(opt, "max_relative_positions", 0) or 0) == -2, "ALiBi (max_relative_positions -2)"),
        (not _get(opt, "position_encoding", False), "no sinusoidal position encoding (position_encoding false)"),
        (
            _get(opt, "position_encoding_type", "SinusoidalInterleaved") != "SinusoidalInterleaved",
            f"position_encoding_type {_get(opt, 'position_encoding_type')}",
        ),
        (_get(opt, "layer_norm", "standard") != "standard", f"layer_norm {_get(opt, 'layer_norm')}"),
        (
            _get(opt, "pos_ffn_activation_fn", "relu") != "relu",
            f"feed-forward activation {_get(opt, 'pos_ffn_activation_fn')} (gated or non-ReLU)",
        ),
        (bool(_get(opt, "parallel_residual", False)), "parallel_residual"),
        (
            (_get(opt, "num_kv", 0) or 0) not in (0, _get(opt, "heads")),
            f"multi-query attention, num_kv {_get(opt, 'num_kv')}",
        ),
        ((_get(opt, "num_experts", 0) or 0) > 0, "mixture of experts (num_experts > 0)"),
        (
            _get(opt, "self_attn_type", "scaled-dot") not in ("scaled-dot", "scaled-dot-flash"),
            f"self_attn_type {_get(opt, 'self_attn_type')}",
        ),
        (bool(_get(opt, "copy_attn", False)), "copy attention"),
        (bool(vocab.get("src_feats")), "source features"),
        (vocab.get("decoder_start_token", ONMT_BOS) != ONMT_BOS, f"decoder_start_token {vocab['decoder_start_token']}"),
        ((_get(opt, "norm_eps", 1e-6) or 0) > 1e-5, f"norm_eps {_get(opt, 'norm_eps')} (ours is 1e-5)"),
    ]  # fmt: skip
    for refused, what in refusals:
        if refused:
            raise UserError(f"OpenNMT-py model not importable: {what} has no onmt_doc counterpart")
    check_sizes(opt)
    named = {k: _get(opt, k) for k in ("enc_hid_size", "dec_hid_size", "src_word_vec_size", "tgt_word_vec_size")}
    for k, value in named.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise UserError(f"OpenNMT-py model not importable: {k} {value!r} is not a positive integer")
    sizes = {v for v in named.values() if v is not None}
    if len(sizes) != 1:
        raise UserError(f"OpenNMT-py model not importable: hidden and embedding sizes differ ({sorted(sizes)})")


SIZE_OPTIONS = ("enc_hid_size", "heads", "transformer_ff", "enc_layers", "dec_layers")


def check_sizes(opt: argparse.Namespace) -> None:
    """Refuse, in one line, sizes no network can have (zero, negative or fractional heads, layers
    or widths, a width not divisible by the heads, a dropout outside [0, 1)): they would fail deep
    inside torch, or worse build a model that computes something else (``int(2.5)`` heads)."""
    for name in SIZE_OPTIONS:
        value = _get(opt, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise UserError(f"OpenNMT-py model not importable: {name} {value!r} is not a positive integer")
    d, heads = int(_get(opt, "enc_hid_size")), int(_get(opt, "heads"))
    if d % heads:
        raise UserError(f"OpenNMT-py model not importable: enc_hid_size {d} is not divisible by heads {heads}")
    for name in ("dropout", "attention_dropout"):
        value = _get(opt, name, 0.0)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
            raise UserError(f"OpenNMT-py model not importable: {name} {value!r} is not a probability in [0, 1)")


def _vocab(tokens: Sequence[str], side: str) -> tuple[Vocab, torch.Tensor]:
    """Our vocabulary for OpenNMT-py's ``tokens`` and, per our id, the OpenNMT-py row it copies."""
    stoi = {t: i for i, t in enumerate(tokens)}
    missing = [t for t in (ONMT_PAD, ONMT_UNK, ONMT_BOS, ONMT_EOS) if t not in stoi]
    if missing:
        raise UserError(f"OpenNMT-py {side} vocabulary lacks its special tokens {' '.join(missing)}")
    clash = [t for t in tokens if t in SPECIALS and t not in ONMT_SPECIALS]
    if clash:
        raise UserError(f"OpenNMT-py {side} vocabulary has ordinary entries named like onmt_doc specials: {clash[:3]}")
    source = {**ROW_SOURCE, MASK: ONMT_MASK if ONMT_MASK in stoi else ONMT_UNK}
    ours = list(SPECIALS) + [t for t in tokens if t not in ONMT_SPECIALS]
    rows = torch.tensor([stoi[source.get(t, t)] for t in ours])
    return Vocab(ours), rows


class _Source:
    """OpenNMT-py tensors handed out by name; whatever is never taken is an error (nothing is lost)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = {k: v.detach().float() for k, v in tensors.items()}
        self.taken: set[str] = set()

    def take(self, name: str, shape: Optional[tuple[int, ...]] = None) -> torch.Tensor:
        if name not in self.tensors:
            raise UserError(f"OpenNMT-py checkpoint has no parameter {name}")
        t = self.tensors[name]
        if shape is not None and tuple(t.shape) != shape:
            raise UserError(f"OpenNMT-py parameter {name} has shape {tuple(t.shape)}, expected {shape}")
        self.taken.add(name)
        return t

    def bias(self, name: str, size: int) -> torch.Tensor:
        """A projection's bias, or zeros where OpenNMT-py has none (add_qkvbias/add_ffnbias off)."""
        return self.take(name, (size,)) if name in self.tensors else torch.zeros(size)

    def left(self) -> list[str]:
        return sorted(set(self.tensors) - self.taken)


class _Target:
    """Our parameters, each set exactly once (a shared or tied one must receive equal values)."""

    def __init__(self, model: EncoderDecoder) -> None:
        self.model = model
        self.done: dict[int, torch.Tensor] = {}

    def set(self, p: torch.Tensor, value: torch.Tensor, what: str) -> None:
        if tuple(p.shape) != tuple(value.shape):
            raise UserError(f"{what}: shape {tuple(value.shape)} does not fit onmt_doc's {tuple(p.shape)}")
        if id(p) in self.done and not torch.equal(self.done[id(p)], value):
            raise UserError(f"{what}: onmt_doc shares this matrix but the OpenNMT-py model holds different values")
        self.done[id(p)] = value
        with torch.no_grad():
            p.copy_(value)

    def linear(self, layer: nn.Linear, src: _Source, names: Sequence[str], what: str) -> None:
        """``layer`` from one or more OpenNMT-py linears stacked by rows (fused q/k/v, k/v)."""
        weights = [src.take(f"{n}.weight") for n in names]
        if any(w.dim() != 2 or w.size(1) != layer.in_features for w in weights):
            shapes = ", ".join(str(tuple(w.shape)) for w in weights)
            raise UserError(f"{what}: weight shapes {shapes} do not fit onmt_doc's {tuple(layer.weight.shape)}")
        self.set(layer.weight, torch.cat(weights), what)
        self.set(layer.bias, torch.cat([src.bias(f"{n}.bias", w.size(0)) for n, w in zip(names, weights)]), what)

    def norm(self, norm: nn.Module, src: _Source, name: str) -> None:
        if not isinstance(norm, nn.LayerNorm):
            raise UserError(f"{name}: onmt_doc has no layer norm here (the model is not pre-norm)")
        self.set(norm.weight, src.take(f"{name}.weight"), name)
        self.set(norm.bias, src.take(f"{name}.bias"), name)

    def attention(self, attn: MultiHeadAttention, src: _Source, prefix: str) -> None:
        q, k, v = (f"{prefix}.linear_{n}" for n in ("query", "keys", "values"))
        if attn.self_attention:
            self.linear(attn.qkv, src, (q, k, v), prefix)
        else:
            self.linear(attn.q, src, (q,), prefix)
            self.linear(attn.kv, src, (k, v), prefix)
        self.linear(attn.out, src, (f"{prefix}.final_linear",), prefix)

    def ffn(self, layer: nn.Module, src: _Source, prefix: str) -> None:
        self.norm(layer.ff_res.norm, src, f"{prefix}.layer_norm")
        self.linear(layer.ff.w1, src, (f"{prefix}.w_1",), prefix)
        self.linear(layer.ff.w2, src, (f"{prefix}.w_2",), prefix)

    def missing(self) -> list[str]:
        return [n for n, p in self.model.named_parameters() if id(p) not in self.done]


def _check_positions(src: _Source, prefix: str, d_model: int) -> None:
    """OpenNMT-py stores its sinusoid table; it must be ours (interleaved sin/cos from position 0)."""
    name = f"{prefix}.embeddings.make_embedding.pe.pe"
    if name not in src.tensors:
        return  # older files do not save the buffer; position_encoding_type was checked
    pe = src.take(name)
    if pe.dim() == 0 or pe.numel() == 0 or pe.shape[-1] != d_model:
        raise UserError(f"OpenNMT-py parameter {name} has shape {tuple(pe.shape)}, expected (positions, 1, {d_model})")
    pe = pe.reshape(-1, d_model)
    if not torch.allclose(pe, sinusoid_table(pe.size(0), d_model), atol=1e-4):
        raise UserError(f"{name}: position encodings differ from onmt_doc's interleaved sinusoids")


def convert(ckpt: dict, src_subword: Subword, tgt_subword: Subword, markup: bool = False) -> dict:
    """An onmt_doc checkpoint payload (config, codec, model) equal to the OpenNMT-py model ``ckpt``.

    ``markup`` false (the default): ``data.sentence_markup: false``, so the model reads OpenNMT-py's
    own sequences, and the generator rows of ``<s>``/``</s>`` as ours (never generated then) are
    lowered like ``<bos>``'s: ``<eos>`` alone holds OpenNMT-py's end probability. True: onmt_doc's
    markup, ``</s>`` and ``<eos>`` sharing it (a start for fine-tuning into a document model)."""
    opt, vocab = ckpt["opt"], ckpt["vocab"]
    check_architecture(opt, vocab)
    src_vocab, src_rows = _vocab(vocab["src"], "source")
    tgt_vocab, tgt_rows = _vocab(vocab["tgt"], "target")
    codec = Codec(src_subword, tgt_subword, src_vocab, tgt_vocab)
    tensors = dict(ckpt["model"])
    for k, v in (ckpt.get("generator") or {}).items():
        tensors[f"generator.{k}"] = v
    src = _Source(tensors)
    d = int(_get(opt, "enc_hid_size"))
    gen_w = src.take("generator.weight", (len(vocab["tgt"]), d))
    dec_emb = src.tensors.get("decoder.embeddings.make_embedding.emb_luts.0.weight")
    tied = dec_emb is not None and torch.equal(gen_w, dec_emb)
    if bool(_get(opt, "share_decoder_embeddings", False)) and not tied:
        raise UserError("OpenNMT-py share_decoder_embeddings is on but its generator and decoder embeddings differ")
    shared = bool(_get(opt, "share_embeddings", False))
    if shared and vocab["src"] != vocab["tgt"]:
        raise UserError("OpenNMT-py share_embeddings is on but its source and target vocabularies differ")
    part = {"type": "transformer", "heads": int(_get(opt, "heads")), "ff": int(_get(opt, "transformer_ff"))}
    raw = {
        "data": {"sentence_markup": markup},
        "vocab": {
            "subword": src_subword.kind,
            "shared": codec.shared and src_subword.to_dict() == tgt_subword.to_dict(),
            "tokenizer": src_subword.mode,
        },
        "model": {
            "d_model": d,
            "share_embeddings": shared,
            "tie_output": tied,
            "dropout": float(_get(opt, "dropout", 0.1)),
            "attention_dropout": float(_get(opt, "attention_dropout", 0.1)),
            "encoder": {**part, "layers": int(_get(opt, "enc_layers")), "pre_norm": True},
            "decoder": {**part, "layers": int(_get(opt, "dec_layers")), "pre_norm": True},
        },
    }
    cfg = config_from_dict(raw, "imported OpenNMT-py options")
    model = build_model(cfg.model, codec)
    dst = _Target(model)
    enc, dec = model.encoder, model.decoder
    for prefix, emb, rows, onmt_vocab in (
        ("encoder", enc.embeddings, src_rows, vocab["src"]),
        ("decoder", dec.embeddings, tgt_rows, vocab["tgt"]),
    ):
        name = f"{prefix}.embeddings.make_embedding.emb_luts.0.weight"
        dst.set(emb.tokens.weight, src.take(name, (len(onmt_vocab), d))[rows], name)
        _check_positions(src, prefix, d)
    for i, layer in enumerate(enc.layers):
        p = f"encoder.transformer.{i}"
        dst.attention(layer.self_attn, src, f"{p}.self_attn")
        dst.norm(layer.attn_res.norm, src, f"{p}.layer_norm")
        dst.ffn(layer, src, f"{p}.feed_forward")
    dst.norm(enc.final_norm, src, "encoder.layer_norm")
    for i, layer in enumerate(dec.layers):
        p = f"decoder.transformer_layers.{i}"
        dst.attention(layer.self_attn, src, f"{p}.self_attn")
        dst.norm(layer.self_res.norm, src, f"{p}.layer_norm_1")
        dst.attention(layer.cross_attn, src, f"{p}.context_attn")
        dst.norm(layer.cross_res.norm, src, f"{p}.layer_norm_2")
        dst.ffn(layer, src, f"{p}.feed_forward")
    dst.norm(dec.final_norm, src, "decoder.layer_norm")
    bias = src.bias("generator.bias", len(vocab["tgt"]))[tgt_rows].clone()
    never = (BOS, MASK) if markup else (BOS, MASK, EOS_SENT)
    bias[[tgt_vocab.stoi[t] for t in never]] -= NEVER_OFFSET
    dst.set(model.generator.weight, gen_w[tgt_rows], "generator.weight")
    dst.set(model.generator.bias, bias, "generator.bias")
    left, missing = src.left(), dst.missing()
    if left:
        raise UserError(f"OpenNMT-py parameters with no onmt_doc counterpart: {', '.join(left[:4])}")
    if missing:
        raise UserError(f"onmt_doc parameters the OpenNMT-py model does not provide: {', '.join(missing[:4])}")
    return {"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict()}


def import_opennmt(
    checkpoint: str,
    output: str,
    src_subword_model: Optional[str],
    tgt_subword_model: Optional[str] = None,
    subword: str = "bpe",
    tokenizer: str = "aggressive",
    force: bool = False,
    run_dir: Optional[str] = None,
    markup: bool = False,
) -> dict:
    """Convert ``checkpoint`` (OpenNMT-py 3.x) and save it atomically as the onmt_doc checkpoint ``output``;
    ``run_dir`` also gets the subword model(s) and vocabularies as a run folder holds them, so a run
    there (``log.dir``) can fine-tune it with ``train.init_from``. ``markup``: see :func:`convert`."""
    if os.path.exists(output) and not force:
        raise UserError(f"{output} exists; add -force to overwrite it")
    if subword == "none" and (src_subword_model or tgt_subword_model):
        raise UserError("a subword model was given with -subword_type none")
    if subword != "none" and not src_subword_model:
        raise UserError("-src_subword_model is required (or -subword_type none for text the model reads as is)")
    subwords: list[Subword] = []
    for flag, path in (("-src_subword_model", src_subword_model), ("-tgt_subword_model", tgt_subword_model)):
        if path is None:  # no subword model at all, or the target side shares the source's
            subwords.append(subwords[0] if subwords else Subword("none", tokenizer))
            continue
        data = read_input_bytes(path, flag, limit=SUBWORD_BYTES, what=f"{subword} model")
        problem = Subword.model_problem(subword, data)
        if problem:
            raise UserError(f"{flag}: {path} is not a {subword} model ({problem})")
        try:
            subwords.append(Subword(subword, tokenizer, data))
        except Exception as e:  # pyonmttok rejects a file that is not a model of this kind
            raise UserError(f"{flag}: {path} is not a {subword} model ({str(e).splitlines()[0][:120]})") from None
    payload = convert(load_opennmt_checkpoint(checkpoint), subwords[0], subwords[1], markup)
    save_checkpoint(payload, output, [("-model", checkpoint)], "-output")
    if run_dir:
        inputs = [
            ("-model", checkpoint),
            ("-src_subword_model", src_subword_model),
            ("-tgt_subword_model", tgt_subword_model),
        ]
        save_codec(Codec.from_dict(payload["codec"]), run_dir, payload["config"]["vocab"]["shared"], inputs, force)
    return payload
