"""Decoders: one file per registered decoder."""

from onmt_doc.decoders.base import REGISTRY, Decoder
from onmt_doc.decoders import transformer  # noqa: F401
from onmt_doc.decoders import gated_transformer  # noqa: F401
from onmt_doc.decoders import g_transformer  # noqa: F401
from onmt_doc.decoders import mhplstm  # noqa: F401
from onmt_doc.decoders import doc_context  # noqa: F401
from onmt_doc.decoders import reformer  # noqa: F401

__all__ = ["REGISTRY", "Decoder"]
