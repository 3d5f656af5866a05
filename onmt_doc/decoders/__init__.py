"""Decoders: one file per registered decoder."""

from onmt_doc.registry import Registry

REGISTRY = Registry("decoder")

from onmt_doc.decoders.base import Decoder  # noqa: E402
from onmt_doc.decoders import transformer  # noqa: E402,F401
from onmt_doc.decoders import gated_transformer  # noqa: E402,F401
from onmt_doc.decoders import g_transformer  # noqa: E402,F401
from onmt_doc.decoders import mhplstm  # noqa: E402,F401
from onmt_doc.decoders import doc_context  # noqa: E402,F401
from onmt_doc.decoders import reformer  # noqa: E402,F401

__all__ = ["REGISTRY", "Decoder"]
