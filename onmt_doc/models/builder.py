"""Build an EncoderDecoder from the ``model`` section and the vocabularies."""

from __future__ import annotations

from torch import nn

from onmt_doc.config.model import ModelConfig
from onmt_doc.contracts import PartContext
from onmt_doc.data.codec import Codec
from onmt_doc.data.vocab import MASK_ID, UNK_ID
from onmt_doc.decoders.base import Decoder
from onmt_doc.encoders.base import Encoder
from onmt_doc.errors import ConfigError
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.modules.embeddings import Embeddings
from onmt_doc.modules.feedforward import FeedForward
from onmt_doc.registry import registry_for


def check_parts_fit(cfg: ModelConfig, encoder: Encoder, decoder: Decoder) -> None:
    """The decoder gets what it reads from the encoder (part-specific rules live in each part
    config's ``validate``, checked when the config is read)."""
    missing = [k for k in decoder.needs if k not in encoder.provides]
    if missing:
        raise ConfigError(
            f"model.decoder.type: {cfg.decoder.type} reads {', '.join(missing)} from the encoder, "
            f"which encoder {cfg.encoder.type} does not provide"
        )


def configure_layers(model: nn.Module, activation: str, layer_norm_eps: float) -> None:
    """Set ``model.activation`` on every feed-forward and ``model.layer_norm_eps`` on every layer norm.

    Model-wide options reach the blocks from here rather than through each part's constructor, so
    every part built of Transformer blocks (G-Transformer, HM-GDC, gated and concatenation models…)
    honours them with no code of its own: a sentence model imported with Marian's swish and
    fine-tuned into a document model keeps its activation. The defaults (ReLU, 1e-5) are what the
    blocks are built with, so existing models are unchanged."""
    for module in model.modules():
        if isinstance(module, FeedForward):
            module.activation = activation
        elif isinstance(module, nn.LayerNorm):
            module.eps = layer_norm_eps


def layer_options(model: nn.Module) -> dict:
    """The model-wide block options as ``model`` was built with them (``model.activation``,
    ``layer_norm_eps``, ``position_layout``, ``scale_embedding``; a key is absent where the model
    has no such block), so ``train.init_from`` can refuse weights made for other blocks."""
    found: dict = {}
    for module in model.modules():
        if isinstance(module, FeedForward):
            found.setdefault("activation", module.activation)
        elif isinstance(module, nn.LayerNorm):
            found.setdefault("layer_norm_eps", module.eps)
        elif isinstance(module, Embeddings):
            found.setdefault("scale_embedding", module.scale_embedding)
            if module.positions is not None:
                found.setdefault("position_layout", module.positions.layout)
    return found


def build_model(cfg: ModelConfig, codec: Codec) -> EncoderDecoder:
    """Build embeddings, encoder, decoder and generator from ``model`` and the vocabularies' sizes:
    Xavier for every matrix except the embeddings, optional sharing and tying; raises ConfigError
    for a sharing the vocabularies or parts do not allow."""
    src_n, tgt_n = len(codec.src_vocab), len(codec.tgt_vocab)
    if cfg.share_embeddings and not codec.shared:
        raise ConfigError("model.share_embeddings: true needs one shared vocabulary (vocab.shared: true)")
    emb = {"layout": cfg.position_layout, "scale": cfg.scale_embedding}
    src_emb = Embeddings(src_n, cfg.d_model, cfg.dropout, cfg.max_positions, **emb)
    tgt_emb = src_emb if cfg.share_embeddings else Embeddings(tgt_n, cfg.d_model, cfg.dropout, cfg.max_positions, **emb)
    ctx = PartContext(cfg.d_model, cfg.dropout, cfg.attention_dropout, src_emb, tgt_emb)
    encoder = registry_for("encoder").build(cfg.encoder, ctx)
    decoder = registry_for("decoder").build(cfg.decoder, ctx)
    check_parts_fit(cfg, encoder, decoder)
    generator = nn.Linear(cfg.d_model, tgt_n)
    embeddings = {id(src_emb.weight), id(tgt_emb.weight)}
    for module in (encoder, decoder, generator):
        for p in module.parameters():
            if p.dim() > 1 and id(p) not in embeddings:
                nn.init.xavier_uniform_(p)
    nn.init.zeros_(generator.bias)
    if cfg.tie_output:
        generator.weight = tgt_emb.tokens.weight
    token = MASK_ID if cfg.word_dropout_token == "mask" else UNK_ID
    model = EncoderDecoder(encoder, decoder, generator, cfg.word_dropout, token)
    configure_layers(model, cfg.activation, cfg.layer_norm_eps)
    if cfg.unit:  # a chosen unit (k_to_1, k_to_k: checked against the parts when the config is read)
        model.unit = cfg.unit
    return model
