"""Encoders: one file per registered encoder."""

from onmt_doc.encoders.base import REGISTRY, Encoder
from onmt_doc.encoders import transformer  # noqa: F401
from onmt_doc.encoders import g_transformer  # noqa: F401
from onmt_doc.encoders import hierarchical  # noqa: F401
from onmt_doc.encoders import embedding  # noqa: F401

__all__ = ["REGISTRY", "Encoder"]
