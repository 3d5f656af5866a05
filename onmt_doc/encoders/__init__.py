"""Encoders: one file per registered encoder."""

from onmt_doc.registry import Registry

REGISTRY = Registry("encoder")

from onmt_doc.encoders.base import Encoder  # noqa: E402
from onmt_doc.encoders import transformer  # noqa: E402,F401
from onmt_doc.encoders import g_transformer  # noqa: E402,F401
from onmt_doc.encoders import hierarchical  # noqa: E402,F401
from onmt_doc.encoders import embedding  # noqa: E402,F401

__all__ = ["REGISTRY", "Encoder"]
