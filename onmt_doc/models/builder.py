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


def build_model(cfg: ModelConfig, codec: Codec) -> EncoderDecoder:
    """Build embeddings, encoder, decoder and generator from ``model`` and the vocabularies' sizes:
    Xavier for every matrix except the embeddings, optional sharing and tying; raises ConfigError
    for a sharing the vocabularies or parts do not allow."""
    src_n, tgt_n = len(codec.src_vocab), len(codec.tgt_vocab)
    if cfg.share_embeddings and not codec.shared:
        raise ConfigError("model.share_embeddings: true needs one shared vocabulary (vocab.shared: true)")
    src_emb = Embeddings(src_n, cfg.d_model, cfg.dropout, cfg.max_positions)
    tgt_emb = src_emb if cfg.share_embeddings else Embeddings(tgt_n, cfg.d_model, cfg.dropout, cfg.max_positions)
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
    if cfg.unit:  # a chosen unit (k_to_1, k_to_k: checked against the parts when the config is read)
        model.unit = cfg.unit
    return model
