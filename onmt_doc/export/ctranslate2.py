"""Export a Transformer to CTranslate2 (its Python spec API, ``ctranslate2.specs``): a sentence model,
or a concatenation model (``model.unit: k_to_1 | k_to_k``, docs/models/concatenation.md), which is
the same network over concatenated sentences.

CTranslate2's ``TransformerSpec`` is the same network as our ``transformer`` encoder + decoder:
embeddings scaled by sqrt(d) plus sinusoidal positions from 0 (we pass our own table, so the
interleaved sin/cos layout is kept exactly), fused q/k/v (self-attention) and k/v (cross-attention)
projections in our row order, ReLU feed-forward, pre-norm with a final layer norm or post-norm,
layer norm eps 1e-5 (``nn.LayerNorm``'s default; CTranslate2's default is 1e-6, so it is set).
The model options an imported Marian model sets (onmt_doc/convert/marian.py) map to the spec's
own: ``model.activation`` (swish, gelu), ``model.scale_embedding`` (``scale_embeddings``),
``model.position_layout`` (the table we pass is in that layout), ``model.layer_norm_eps``
(``layer_norm_epsilon``); the output bias is the projection's bias; the decoder starts from our
``<bos>``, whose row the import took from Marian's start token; a source :class:`Subword` suffix
(Marian's ``</s>``) is recorded with the tokenization settings.

Our markup is kept: a source sentence is ``<s> w1 … wn </s>``; the decoder starts from ``<bos>``,
``<s>`` is the forced first target token and ``</s>`` (then ``<eos>``) ends a sentence
(onmt_doc/data/vocab.py). A model without markup (``data.sentence_markup: false``, e.g. one
imported from OpenNMT-py) exports as CTranslate2's own Transformers run: the bare source, no
target prefix (the decoder starts from ``<bos>``), ``<eos>`` ends it. :func:`translation_options`,
:func:`source_tokens` and :func:`target_prefix` give what a CTranslate2 caller needs to decode as
onmt_doc's search does; ``onmt_doc_export.json`` and the README beside the model say the same for
callers without onmt_doc. The JSON file records the unit and k (``unit``, ``context_sentences``) and
the onmt_doc config sections that build the inputs and the translate defaults (``onmt_doc_config``),
so ``Translator.load(folder, engine="ctranslate2")`` (onmt_doc/translate/ctranslate2_engine.py,
where these helpers live) builds exactly the inputs onmt_doc's translator builds.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import numpy as np
import torch

from onmt_doc.config import Config, config_to_dict
from onmt_doc.data.codec import Codec
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import BOS, EOS, EOS_SENT, SOS, UNK
from onmt_doc.decoders.transformer import TransformerDecoder, TransformerDecoderLayer
from onmt_doc.encoders.transformer import TransformerEncoder, TransformerEncoderLayer
from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import load_model
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.modules.attention import MultiHeadAttention
from onmt_doc.modules.embeddings import sinusoid_table
from onmt_doc.outputs import output_folder, write_text
from onmt_doc.translate.ctranslate2_engine import (  # noqa: F401 (the export's decoding helpers, used from here)
    INFO_FILE,
    UNITS,
    import_ctranslate2,
    source_tokens,
    target_prefix,
    target_words,
    translation_options,
)

QUANTIZATIONS = ("float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16")
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, used by every norm of our Transformer
# model.activation -> the spec's activation (ctranslate2.specs.common_spec.Activation member names)
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}


def check_exportable(model: EncoderDecoder) -> None:
    """Only the plain ``transformer`` encoder + ``transformer`` decoder have a CTranslate2
    counterpart, over sentences or concatenated sentences (:data:`UNITS`); anything else is named in
    a one-line error."""
    enc, dec = type(model.encoder), type(model.decoder)
    if enc is not TransformerEncoder:
        raise UserError(
            f"encoder {enc.__name__} is not exportable to CTranslate2: only the `transformer` encoder + "
            "`transformer` decoder are (sentence, k_to_1 and k_to_k models)"
        )
    if dec is not TransformerDecoder:
        raise UserError(
            f"decoder {dec.__name__} is not exportable to CTranslate2: only the `transformer` encoder + "
            "`transformer` decoder are (sentence, k_to_1 and k_to_k models)"
        )
    if model.unit not in UNITS:
        raise UserError(
            f"a model of translation unit {model.unit!r} is not exportable to CTranslate2 (only {', '.join(UNITS)})"
        )


class _Weights:
    """Hands out parameters by name and remembers which were used, so a parameter that the
    export does not map (a future addition to the Transformer) is an error, not silently lost."""

    def __init__(self, model: EncoderDecoder, eps: float = LAYER_NORM_EPS) -> None:
        self.model, self.eps = model, eps
        self.used: set[int] = set()

    def take(self, p: torch.Tensor) -> np.ndarray:
        self.used.add(id(p))
        return p.detach().float().cpu().numpy().copy()

    def linear(self, spec: Any, layer: torch.nn.Linear) -> None:
        spec.weight = self.take(layer.weight)
        spec.bias = self.take(layer.bias)

    def norm(self, spec: Any, norm: torch.nn.Module) -> None:
        if not isinstance(norm, torch.nn.LayerNorm) or abs(norm.eps - self.eps) > 1e-12:
            raise UserError(f"layer norm {norm!r} is not exportable (expected LayerNorm with eps {self.eps})")
        spec.gamma = self.take(norm.weight)
        spec.beta = self.take(norm.bias)

    def attention(self, spec: Any, attn: MultiHeadAttention) -> None:
        if attn.self_attention:  # linear[0]: fused q/k/v (rows q, k, v as ours), linear[1]: output
            self.linear(spec.linear[0], attn.qkv)
            self.linear(spec.linear[1], attn.out)
        else:  # linear[0]: q, linear[1]: fused k/v (rows k, v), linear[2]: output
            self.linear(spec.linear[0], attn.q)
            self.linear(spec.linear[1], attn.kv)
            self.linear(spec.linear[2], attn.out)

    def ffn(self, spec: Any, layer: Any, activation: str) -> None:
        if layer.ff.activation != activation:
            raise UserError("a model mixing feed-forward activations is not exportable to CTranslate2")
        self.norm(spec.layer_norm, layer.ff_res.norm)
        self.linear(spec.linear_0, layer.ff.w1)
        self.linear(spec.linear_1, layer.ff.w2)

    def unused(self) -> list[str]:
        return [n for n, p in self.model.named_parameters() if id(p) not in self.used]


def build_spec(model: EncoderDecoder, codec: Codec, max_positions: int) -> Any:
    """A validated ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights (float32)."""
    import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    check_exportable(model)
    enc, dec = model.encoder, model.decoder
    enc_pre = enc.layers[0].attn_res.pre_norm if len(enc.layers) else True
    dec_pre = dec.layers[0].self_res.pre_norm if len(dec.layers) else True
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    eps = norms[0].eps if norms else LAYER_NORM_EPS  # model.layer_norm_eps: one value for all (checked per norm)
    ffs = [layer.ff.activation for layer in [*enc.layers, *dec.layers]]
    activation = ffs[0] if ffs else "relu"
    act = getattr(common_spec.Activation, ACTIVATIONS[activation])
    enc_spec = transformer_spec.TransformerEncoderSpec(
        len(enc.layers), enc.layers[0].self_attn.heads, pre_norm=enc_pre, activation=act
    )
    dec_spec = transformer_spec.TransformerDecoderSpec(
        len(dec.layers), dec.layers[0].self_attn.heads, pre_norm=dec_pre, activation=act
    )
    spec = transformer_spec.TransformerSpec(enc_spec, dec_spec)
    w = _Weights(model, eps)
    # E[x]·sqrt(d) + PE (Vaswani et al., 2017, sec. 3.5), or E[x] + PE (model.scale_embedding: false);
    # our position table (model.position_layout, positions from 0) replaces CTranslate2's own.
    for side, s, module in (("encoder", enc_spec, enc), ("decoder", dec_spec, dec)):
        if module.embeddings.positions is None:
            raise UserError(f"{side} without sinusoidal positions is not exportable to CTranslate2")
        s.scale_embeddings = module.embeddings.scale_embedding
        layout = module.embeddings.positions.layout
        s.position_encodings.encodings = sinusoid_table(max_positions, module.embeddings.d_model, layout).numpy()
    enc_spec.embeddings[0].weight = w.take(enc.embeddings.tokens.weight)
    for layer_spec, layer in zip(enc_spec.layer, enc.layers):
        assert isinstance(layer, TransformerEncoderLayer)
        w.attention(layer_spec.self_attention, layer.self_attn)
        w.norm(layer_spec.self_attention.layer_norm, layer.attn_res.norm)
        w.ffn(layer_spec.ffn, layer, activation)
        if layer.attn_res.pre_norm != enc_pre or layer.ff_res.pre_norm != enc_pre:
            raise UserError("an encoder mixing pre- and post-norm layers is not exportable to CTranslate2")
    if enc_pre:
        w.norm(enc_spec.layer_norm, enc.final_norm)
    dec_spec.embeddings.weight = w.take(dec.embeddings.tokens.weight)
    for layer_spec, layer in zip(dec_spec.layer, dec.layers):
        assert isinstance(layer, TransformerDecoderLayer)
        w.attention(layer_spec.self_attention, layer.self_attn)
        w.norm(layer_spec.self_attention.layer_norm, layer.self_res.norm)
        w.attention(layer_spec.attention, layer.cross_attn)
        w.norm(layer_spec.attention.layer_norm, layer.cross_res.norm)
        w.ffn(layer_spec.ffn, layer, activation)
        if {layer.self_res.pre_norm, layer.cross_res.pre_norm, layer.ff_res.pre_norm} != {dec_pre}:
            raise UserError("a decoder mixing pre- and post-norm layers is not exportable to CTranslate2")
    if dec_pre:
        w.norm(dec_spec.layer_norm, dec.final_norm)
    w.linear(dec_spec.projection, model.generator)
    unused = w.unused()
    if unused:
        raise UserError(f"parameters not exportable to CTranslate2: {', '.join(unused[:5])}")
    spec.register_source_vocabulary(list(codec.src_vocab.itos))
    spec.register_target_vocabulary(list(codec.tgt_vocab.itos))
    spec.config.unk_token = UNK
    spec.config.bos_token = BOS
    spec.config.eos_token = EOS
    spec.config.decoder_start_token = BOS
    spec.config.add_source_bos = False  # our <s> … </s> markup, if any, is added by source_tokens()
    spec.config.add_source_eos = False
    spec.config.layer_norm_epsilon = eps
    spec.validate()
    return spec


MAX_POSITIONS = 65536  # a position table beyond this is memory, not a use: no sentence is this long


def export_ctranslate2(
    checkpoint: str, output: str, quantization: Optional[str] = None, force: bool = False, max_positions: int = 1024
) -> dict:
    """Write a CTranslate2 model of ``checkpoint`` into ``output``, with the subword model(s), the
    tokenization settings (``onmt_doc_export.json``) and a README; returns the settings."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UserError(f"-quantization must be one of {', '.join(QUANTIZATIONS)} (got {quantization!r})")
    if not 2 <= max_positions <= MAX_POSITIONS:
        raise UserError(f"-max_positions must be in [2, {MAX_POSITIONS}] (got {max_positions})")
    with output_folder(output, [("-model", checkpoint)], force=force) as folder:
        model, cfg, codec = load_model(checkpoint)
        spec = build_spec(model, codec, max_positions)
        spec.optimize(quantization=quantization)
        spec.save(folder)
        info = export_info(codec, quantization or "float32", max_positions, cfg.data.sentence_markup, model.unit, cfg)
        for side, subword in (("source", codec.src_subword), ("target", codec.tgt_subword)):
            name = info["tokenization"][side]["subword_model"]
            if name:
                subword.save(os.path.join(folder, name))
        write_text(os.path.join(folder, INFO_FILE), json.dumps(info, indent=2, sort_keys=True) + "\n", flag="")
        write_text(os.path.join(folder, "README.md"), _readme(info), flag="")
    return info


def _tokenizer_settings(subword: Subword, name: str) -> dict:
    """pyonmttok ``Tokenizer`` arguments that reproduce :class:`Subword` (onmt_doc/data/tokenizer.py),
    and its ``mode`` (what rebuilds the :class:`Subword`)."""
    mode, options = Subword._options(subword.kind, subword.mode)
    if subword.kind != "none" and subword.model is not None:
        options = {**options, ("sp_model_path" if subword.kind == "sentencepiece" else "bpe_model_path"): name}
    model = name if subword.model is not None else None
    settings = {"kind": subword.kind, "mode": subword.mode, "subword_model": model,
                "pyonmttok_mode": mode, "pyonmttok_options": options}  # fmt: skip
    return {**settings, "suffix": list(subword.suffix)} if subword.suffix else settings  # Marian's source </s>


# the data keys that decide a translation input (the unit's own, e.g. context_sentences, are among them)
_DATA_KEYS = ("documents", "max_tokens", "max_sentences", "context_sentences", "max_line_chars", "sentence_markup")


def export_info(
    codec: Codec,
    quantization: str,
    max_positions: int,
    markup: bool = True,
    unit: str = "sentence",
    cfg: Optional[Config] = None,
) -> dict:
    """How to build inputs, tokenize and decode with the exported model (written as
    ``onmt_doc_export.json``); ``markup``: the model's ``data.sentence_markup``; ``unit`` its
    translation unit, with k (``data.context_sentences``) for ``k_to_1``/``k_to_k``; ``cfg``: the
    checkpoint's config, whose data keys that shape inputs (no file paths), vocab, model and
    translate sections are recorded for the ctranslate2 engine."""
    same = codec.src_subword.to_dict() == codec.tgt_subword.to_dict()
    src_name = "subword.model" if same else "source_subword.model"
    tgt_name = "subword.model" if same else "target_subword.model"
    info: dict[str, Any] = {
        "format": "onmt_doc CTranslate2 export 1",
        "quantization": quantization,
        "max_positions": max_positions,
        "unit": unit,
        "context_sentences": cfg.data.context_sentences if cfg is not None and unit != "sentence" else None,
        "tokenization": {
            "source": _tokenizer_settings(codec.src_subword, src_name),
            "target": _tokenizer_settings(codec.tgt_subword, tgt_name),
        },
        "source_markup": {"prefix": [SOS], "suffix": [EOS_SENT]} if markup else {"prefix": [], "suffix": []},
        "target_prefix": target_prefix(markup),
        "translate_options": translation_options(max_positions, markup),
    }
    if unit == "k_to_k":
        info["context_translate_options"] = translation_options(max_positions, markup, last=False)
    if cfg is not None:
        raw = config_to_dict(cfg)
        info["onmt_doc_config"] = {
            "data": {key: raw["data"][key] for key in _DATA_KEYS},
            **{section: raw[section] for section in ("vocab", "model", "translate")},
        }
    return info


def _readme(info: dict) -> str:
    src, tgt = info["tokenization"]["source"], info["tokenization"]["target"]
    if not info["target_prefix"]:
        return _readme_bare(info, src, tgt)
    opts = info["translate_options"]
    return f"""# CTranslate2 model exported by onmt_doc

Translation unit: `{info["unit"]}`{_k_of(info)}. Quantization: {info["quantization"]}. Tokenization (pyonmttok):
source `Tokenizer("{src["pyonmttok_mode"]}", **{src["pyonmttok_options"]!r})`, target
`Tokenizer("{tgt["pyonmttok_mode"]}", **{tgt["pyonmttok_options"]!r})` (paths relative to this folder).

Each source sentence is `<s> tokens… </s>`. Translate with `target_prefix=[["<s>"]]` per sentence and
the options of `onmt_doc_export.json` (`translate_options`), drop the `<s>` of the output, detokenize:

```python
import ctranslate2, pyonmttok
tok = pyonmttok.Tokenizer("{src["pyonmttok_mode"]}", **{src["pyonmttok_options"]!r})
detok = pyonmttok.Tokenizer("{tgt["pyonmttok_mode"]}", **{tgt["pyonmttok_options"]!r})
tr = ctranslate2.Translator(".", device="cpu", inter_threads=1, intra_threads=1)
src = [["<s>", *tok.tokenize(line)[0], "</s>"] for line in ["Hello world ."]]
out = tr.translate_batch(src, target_prefix=[["<s>"]] * len(src), beam_size=4,
                         end_token={opts["end_token"]!r},
                         suppress_sequences={opts["suppress_sequences"]!r},
                         max_decoding_length={opts["max_decoding_length"]})
print([detok.detokenize([t for t in r.hypotheses[0] if t != "<s>"]) for r in out])
```
{_readme_unit(info)}
Position encodings cover {info["max_positions"]} positions (source or target, markup included);
export again with a larger `-max_positions` for longer inputs. With onmt_doc installed,
`onmt_doc_translate -engine ctranslate2 -model <this folder> -src FILE` does all of this, documents
and contexts included.
"""


def _k_of(info: dict) -> str:
    return (
        f" (k = {info['context_sentences']}: the previous sentences in context)" if info["unit"] != "sentence" else ""
    )


def _readme_unit(info: dict) -> str:
    """How a concatenation model's inputs are built (nothing for a sentence model)."""
    k = info["context_sentences"]
    if info["unit"] == "sentence":
        return ""
    window = (
        f"The model is a concatenation model (`{info['unit']}`, k = {k}): the source of sentence i of a\n"
        "document is the marked sentences i-k … i concatenated (fewer at the document's start, never across\n"
        "a document break), e.g. `<s> previous … </s> <s> current … </s>`."
    )
    if info["unit"] == "k_to_1":
        return f"\n{window}\nThe output is the translation of sentence i alone, decoded as above.\n"
    return f"""
{window}
The target holds the translations of the same sentences, each `<s> … </s>`; keep the last.
onmt_doc decodes the whole window (by default): for each sentence of the window in turn, continue
the tokens decoded so far (`target_prefix` = them + `<s>`), with the options of
`context_translate_options` for the context sentences (they end at `</s>`) and `translate_options`
for the last; with greedy search this equals onmt_doc's own search. Or (onmt_doc's
`translate.force_context_prefix`) translate a document sentence by sentence and force the
translations already made of the previous sentences as the prefix,
`<s> y(i-k) </s> … <s> y(i-1) </s> <s>`, with the options `translate_options`.
"""


def _readme_bare(info: dict, src: dict, tgt: dict) -> str:
    """The README of a model without sentence markup (``data.sentence_markup: false``)."""
    suffix = f" + {src['suffix']!r}" if src.get("suffix") else ""  # a Marian import's source </s>
    return f"""# CTranslate2 model exported by onmt_doc

Quantization: {info["quantization"]}. Tokenization (pyonmttok): source `Tokenizer("{src["pyonmttok_mode"]}",
**{src["pyonmttok_options"]!r})`, target `Tokenizer("{tgt["pyonmttok_mode"]}",
**{tgt["pyonmttok_options"]!r})` (paths relative to this folder).

The model reads sentences without markup: each source sentence is its tokens, no target prefix.
Translate with the options of `onmt_doc_export.json` (`translate_options`), detokenize:

```python
import ctranslate2, pyonmttok
tok = pyonmttok.Tokenizer("{src["pyonmttok_mode"]}", **{src["pyonmttok_options"]!r})
detok = pyonmttok.Tokenizer("{tgt["pyonmttok_mode"]}", **{tgt["pyonmttok_options"]!r})
tr = ctranslate2.Translator(".", device="cpu", inter_threads=1, intra_threads=1)
src = [tok.tokenize(line)[0]{suffix} for line in ["Hello world ."]]
out = tr.translate_batch(src, beam_size=4, end_token={info["translate_options"]["end_token"]!r},
                         suppress_sequences={info["translate_options"]["suppress_sequences"]!r},
                         min_decoding_length=1, max_decoding_length={info["translate_options"]["max_decoding_length"]})
print([detok.detokenize(r.hypotheses[0]) for r in out])
```

Position encodings cover {info["max_positions"]} positions (source or target); export again with a
larger `-max_positions` for longer inputs.
"""
