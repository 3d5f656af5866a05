"""HM-GDC decoder (Tan et al., 2019, sec. 2.2): the Transformer decoder with a DocEnc–Decoder
attention in every layer.

Besides the encoder–decoder attention over its own sentence (E), every layer attends from the
same queries to the document context C = [h^ctx_1; …; h^ctx_N] of the sentence's document
(G, eqs. 8–9), and the sublayer adds both: H = E + G (eq. 10). C comes from the ``hierarchical``
encoder, packed per document; each document's keys/values are computed once and shared by all
its sentences (and beams) through ``attend_documents``. With ``context: own_sentence`` the
attention reads only the sentence's own words h^ctx_i: every row is then its own "document" of
``attend_documents`` (row i reads memory i), so the same code and decoding state serve both
readings. Decoding state: the Transformer's, plus
the per-layer document keys/values (shared, never reordered) and each row's document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional

import torch

from onmt_doc.config import option
from onmt_doc.data.batching import Batch
from onmt_doc.decoders import REGISTRY
from onmt_doc.decoders.base import LengthLimit
from onmt_doc.decoders.transformer import (
    TransformerDecoder,
    TransformerDecoderConfig,
    TransformerDecoderLayer,
    TransformerState,
)
from onmt_doc.modules.attention import KV, MultiHeadAttention
from onmt_doc.modules.document_packing import DocumentMemory, attend_documents, document_memory
from onmt_doc.parts import EncoderOut, PartContext


@dataclass
class DocContextDecoderConfig(TransformerDecoderConfig):
    """``model.decoder`` keys of ``type: doc_context`` (HM-GDC): the Transformer decoder's plus ``context``."""

    heads: int = option(8, "attention heads (self, cross and document); must divide `model.d_model`")
    context: Literal["document", "own_sentence"] = option(
        "document",
        "what the DocEnc–Decoder attention reads (eqs. 8–9): `document` = C, the words (with context) "
        "of every sentence of the document; `own_sentence` = only the sentence's own words h^ctx_i (useful with "
        "the encoder's `word_context: false`)",
    )


DocumentContext = tuple[DocumentMemory, torch.Tensor]  # (a layer's keys/values of C, row -> document)


@dataclass
class DocContextState(TransformerState):
    """The Transformer's state plus each layer's document keys/values (``shared_fields``: rows index
    into them, so they are never reordered) and the entry ``row_doc`` each row reads."""

    source_fields: ClassVar[tuple[str, ...]] = ("cross_kv", "memory_mask", "row_doc")
    shared_fields: ClassVar[tuple[str, ...]] = ("doc_memory",)
    doc_memory: list[DocumentMemory]  # per layer, one entry per document (own_sentence: per source row)
    row_doc: torch.Tensor  # [R] entry of doc_memory each row reads


class DocContextDecoderLayer(TransformerDecoderLayer):
    """A Transformer decoder layer whose cross-attention sublayer also attends to the document context."""

    def __init__(
        self, d_model: int, heads: int, ff: int, dropout: float, attention_dropout: float, pre_norm: bool
    ) -> None:
        """Adds ``doc_attn``, the DocEnc–Decoder attention (eq. 9), beside the Transformer layer's."""
        super().__init__(d_model, heads, ff, dropout, attention_dropout, pre_norm)
        self.doc_attn = MultiHeadAttention(d_model, heads, attention_dropout, self_attention=False)

    def source_attention(
        self, h: torch.Tensor, memory_kv: KV, memory_mask: torch.Tensor, context: Any = None
    ) -> torch.Tensor:
        """H = E + G (eq. 10) for queries ``h`` [R, T, D]; ``context`` is the layer's :data:`DocumentContext`."""
        doc, row_doc = context
        e = self.cross_attn.cross(h, memory_kv, memory_mask)  # E: encoder-decoder attention
        g = attend_documents(self.doc_attn, h, row_doc, doc, probe="dec_doc_context")  # eq. 9: G
        return e + g  # eq. 10: H = E + G


@REGISTRY.register("doc_context", DocContextDecoderConfig)
class DocContextDecoder(TransformerDecoder):
    """HM-GDC's decoder, reading the ``hierarchical`` encoder's document context (``needs``) in every layer."""

    unit = "context"
    needs = ("doc_memory", "doc_memory_pad", "row_doc", "sentence_context")
    layer_type = DocContextDecoderLayer

    def __init__(self, cfg: DocContextDecoderConfig, ctx: PartContext) -> None:
        """``cfg.context`` chooses what the document attention reads (module docstring)."""
        super().__init__(cfg, ctx)
        self.context = cfg.context

    def _document_memories(self, enc_out: EncoderOut) -> list[DocumentMemory]:
        if self.context == "own_sentence":  # h^ctx_i per row
            c, pad = enc_out.extra["sentence_context"], enc_out.pad_mask
        else:  # eq. 8: C
            c, pad = enc_out.extra["doc_memory"], enc_out.extra["doc_memory_pad"]
        return [document_memory(layer.doc_attn, c, pad) for layer in self.layers]

    def _row_memory(self, enc_out: EncoderOut) -> torch.Tensor:
        """[R] the entry of the document memories each row reads: its document, or itself."""
        row_doc = enc_out.extra["row_doc"]
        if self.context == "own_sentence":
            return torch.arange(row_doc.numel(), device=row_doc.device)
        return row_doc

    def layer_contexts(self, enc_out: EncoderOut) -> list[DocumentContext]:
        """Per layer, the keys/values of C and the entry each row reads (eqs. 8–9)."""
        row_doc = self._row_memory(enc_out)
        return [(doc, row_doc) for doc in self._document_memories(enc_out)]

    def init_state(self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None) -> DocContextState:
        """The Transformer's state plus the document memories, computed once per batch."""
        base = super().init_state(enc_out, batch, limit)
        return DocContextState(
            step=base.step,
            self_kv=base.self_kv,
            cross_kv=base.cross_kv,
            memory_mask=base.memory_mask,
            doc_memory=self._document_memories(enc_out),
            row_doc=self._row_memory(enc_out),
        )

    def state_contexts(self, state: DocContextState) -> list[DocumentContext]:
        """``layer_contexts`` from the decoding state, so steps do not recompute the document memories."""
        return [(doc, state.row_doc) for doc in state.doc_memory]
