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
from functools import partial
from typing import Any, Callable, ClassVar, Literal, NamedTuple, Optional, Union

import numpy as np
import torch

from onmt_doc import devices
from onmt_doc.config.options import option
from onmt_doc.contracts import Batch, DecoderOut, EncoderOut, LengthLimit, PartContext
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.decoders.base import REGISTRY
from onmt_doc.decoders.transformer import (
    TransformerDecoder,
    TransformerDecoderConfig,
    TransformerDecoderLayer,
    TransformerState,
)
from onmt_doc.modules.attention import KV, MultiHeadAttention
from onmt_doc.modules.document_packing import (
    DocumentMemory,
    FlatDocuments,
    RowsPlan,
    attend_documents,
    attend_documents_rows,
    attend_own_document,
    document_memory,
    flat_documents,
    host_array,
    plan_document_rows,
)
from onmt_doc.modules.host_planning import host_planning
from onmt_doc.modules.row_buckets import RowBucket, row_plan, unbucket, whole_batch


@dataclass
class DocContextDecoderConfig(TransformerDecoderConfig):
    """``model.decoder`` keys of ``type: doc_context`` (HM-GDC): the Transformer decoder's plus ``context``."""

    heads: int = option(8, "attention heads (self, cross and document); must divide `model.d_model`", minimum=1)
    context: Literal["document", "own_sentence"] = option(
        "document",
        "what the DocEnc–Decoder attention reads (eqs. 8–9): `document` = C, the words (with context) "
        "of every sentence of the document; `own_sentence` = only the sentence's own words h^ctx_i (useful with "
        "the encoder's `word_context: false`)",
    )


class DocumentContext(NamedTuple):
    """What a layer's document attention reads besides the sentence memory."""

    memory: DocumentMemory  # the layer's keys/values of C, one entry per document
    row_doc: torch.Tensor  # [R] row -> entry
    flat: Optional[FlatDocuments] = None  # the entries as one sequence (decoding on the fused path)


@dataclass
class DocContextState(TransformerState):
    """The Transformer's state plus each layer's document keys/values (``shared_fields``: rows index
    into them, so they are never reordered) and the entry ``row_doc`` each row reads."""

    source_fields: ClassVar[tuple[str, ...]] = ("cross_kv", "memory_mask", "row_doc")
    shared_fields: ClassVar[tuple[str, ...]] = ("doc_memory", "doc_flat")
    owned_fields: ClassVar[tuple[str, ...]] = ("self_kv",)
    doc_memory: list[DocumentMemory]  # per layer, one entry per document (own_sentence: per source row)
    row_doc: torch.Tensor  # [R] entry of doc_memory each row reads
    doc_flat: Optional[list[FlatDocuments]] = None  # per layer, on the fused path: doc_memory as one sequence


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
        """H = E + G (eq. 10) for queries ``h`` [R, T, D]; ``context`` is the layer's :class:`DocumentContext`
        (with ``flat``, a decoding step on the fused path: one masked attention call, no packing plan)."""
        e = self.cross_attn.cross(h, memory_kv, memory_mask)  # E: encoder-decoder attention
        if context.flat is not None and h.size(1) == 1:  # eq. 9: G
            g = attend_own_document(self.doc_attn, h, context.row_doc, context.flat, probe="dec_doc_context")
        else:
            g = attend_documents(self.doc_attn, h, context.row_doc, context.memory, probe="dec_doc_context")
        return e + g  # eq. 10: H = E + G

    def forward_buckets(
        self,
        xs: list[torch.Tensor],
        memory_kvs: list[KV],
        memory_masks: list[torch.Tensor],
        doc_attention: Callable[[list[torch.Tensor]], list[torch.Tensor]],
    ) -> list[torch.Tensor]:
        """:meth:`forward` for rows in length buckets xs[i] [r_i, T_i, D], each with its memory; the
        DocEnc–Decoder attention G of all buckets is one call of ``doc_attention`` (queries of every
        bucket -> G of every bucket), so it can pack them per document across buckets."""
        xs = [self.self_res(x, lambda h: self.self_attn(h, is_causal=True)) for x in xs]
        gs = doc_attention([self.cross_res.normed(x) for x in xs])  # eq. 9: G
        xs = [
            self.cross_res(x, lambda h, kv=kv, mask=mask, g=g: self.cross_attn.cross(h, kv, mask) + g)  # eq. 10
            for x, kv, mask, g in zip(xs, memory_kvs, memory_masks, gs)
        ]
        return [self.ff_res(x, self.ff) for x in xs]


ROWS_PLAN = "hm_gdc.decoder_rows"  # the decoder's plan in ``Batch.plans`` (made by ``host_plans``)


@host_planning
def _plan_rows(
    batch: Batch, buckets: list[RowBucket], keep: torch.Tensor, row_doc: torch.Tensor, n_docs: int
) -> RowsPlan:
    """The DocEnc–Decoder attention's plan of the target rows in ``buckets``, from the batch's host copy
    where it has one (``Batch.host``: no device read on a GPU)."""
    host = batch.host
    host_doc = host_array(host.doc_index if host is not None else row_doc)
    host_keep = host_array(host.tgt_in.ne(PAD_ID) if host is not None else keep)
    shapes = [(len(b.host_rows), b.length) for b in buckets]
    docs = [host_doc[b.host_rows] for b in buckets]
    keeps = [host_keep[b.host_rows, : b.length] for b in buckets]
    return plan_document_rows(shapes, docs, n_docs, keep.device, keeps)


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
        return [DocumentContext(doc, row_doc) for doc in self._document_memories(enc_out)]

    def host_plans(self, batch: Batch) -> dict[str, Any]:
        """The fused path's plan of the DocEnc–Decoder attention from the host batch, one bucket of
        every row: ``context: document``, the real target positions of every row packed per document;
        ``own_sentence``, every row its own document."""
        if batch.tgt_in is None:
            return {}
        width = whole_batch(batch.size, batch.tgt_in.size(1), "cpu").length
        if self.context == "own_sentence":  # one plan per bucket (one bucket), every row its own document
            return {ROWS_PLAN: [_plan_own_rows(batch.size, width, "cpu")]}
        doc, keep = batch.doc_index.numpy(), batch.tgt_in.ne(PAD_ID).numpy()
        plan = plan_document_rows([(batch.size, width)], [doc], int(doc.max()) + 1, "cpu", [keep[:, :width]])
        return {ROWS_PLAN: plan}

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:
        """Teacher-forced pass, ``tgt_in`` [R, T] -> ``hidden`` [R, T, D], run per length bucket of the
        target rows (``row_buckets``): each bucket reads its rows' memory trimmed to their longest
        source. With ``context: document`` the keys/values of C are computed once and every layer's
        DocEnc–Decoder attention packs the real target positions of all buckets per document."""
        src_len = enc_out.pad_mask.eq(0).sum(1)
        keep = tgt_in.ne(PAD_ID)
        buckets = row_plan(keep)
        fused = devices.fused(tgt_in.device)  # one bucket of every row: the whole memory too, no device read
        xs, memories, masks = [], [], []
        for b in buckets:
            width = enc_out.memory.size(1) if fused else max(int(src_len.index_select(0, b.rows).max()), 1)
            memory_rows = RowBucket(b.rows, width)
            memories.append(memory_rows.take(enc_out.memory))
            masks.append((~memory_rows.take(enc_out.pad_mask))[:, None, None, :])
            xs.append(self.embeddings(b.take(tgt_in)))
        if self.context == "document":  # eq. 8: C, shared by every bucket
            row_doc, keeps = enc_out.extra["row_doc"], [b.take(keep) for b in buckets]
            row_docs = [row_doc.index_select(0, b.rows) for b in buckets]
            documents = self._document_memories(enc_out)
            plan = batch.plans.get(ROWS_PLAN)
            if plan is None:  # not prepared (EncoderDecoder.prepare): planned here
                plan = _plan_rows(batch, buckets, keep, row_doc, documents[0].mask.size(0))
        else:  # h^ctx_i: each row reads its own (the bucket's rows, trimmed like the memory)
            own = [
                RowBucket(b.rows, m.size(1)).take(enc_out.extra["sentence_context"]) for b, m in zip(buckets, memories)
            ]
            rows = [torch.arange(b.rows.numel(), device=tgt_in.device) for b in buckets]
            own_plans = batch.plans.get(ROWS_PLAN)
            if own_plans is None:  # not prepared: planned here, once for every layer
                own_plans = [_plan_own_rows(b.rows.numel(), b.length, tgt_in.device) for b in buckets]
        for layer_number, layer in enumerate(self.layers):
            if self.context == "document":
                doc_attention = partial(
                    attend_documents_rows,
                    layer.doc_attn,
                    row_docs=row_docs,
                    memory=documents[layer_number],
                    keeps=keeps,
                    probe="dec_doc_context",
                    rows=[b.rows for b in buckets],  # analysis: captured attention back in batch order
                    plan=plan,  # one plan for every layer
                )
            else:
                doc_attention = partial(own_attention, layer.doc_attn, rows=rows, own=own, masks=masks, plans=own_plans)
            kvs = [layer.cross_attn.memory_kv(m) for m in memories]
            xs = layer.forward_buckets(xs, kvs, masks, doc_attention)
        return DecoderOut(unbucket([self.final_norm(x) for x in xs], buckets, tgt_in.size(1)))

    def init_state(self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None) -> DocContextState:
        """The Transformer's state plus the document memories, computed once per batch."""
        base = super().init_state(enc_out, batch, limit)
        memories = self._document_memories(enc_out)
        fused = devices.fused(enc_out.memory.device)  # the steps' document attention: one masked call
        return DocContextState(
            step=base.step,
            capacity=base.capacity,
            self_kv=base.self_kv,
            cross_kv=base.cross_kv,
            memory_mask=base.memory_mask,
            doc_memory=memories,
            row_doc=self._row_memory(enc_out),
            doc_flat=[flat_documents(m) for m in memories] if fused else None,
        )

    def state_contexts(self, state: DocContextState) -> list[DocumentContext]:
        """``layer_contexts`` from the decoding state, so steps do not recompute the document memories."""
        flats = state.doc_flat or [None] * len(state.doc_memory)
        return [DocumentContext(doc, state.row_doc, flat) for doc, flat in zip(state.doc_memory, flats)]


def own_attention(
    attn: MultiHeadAttention,
    hs: list[torch.Tensor],
    rows: list[torch.Tensor],
    own: list[torch.Tensor],
    masks: list[torch.Tensor],
    plans: list[RowsPlan],
) -> list[torch.Tensor]:
    """``context: own_sentence`` per bucket: queries hs[i] [r_i, T_i, D] attend to their own row's
    words h^ctx_i, own[i] [r_i, S_i, D] (memory keep-masks [r_i, 1, 1, S_i]); ``rows`` [r_i] = arange,
    each row its own document, packed by ``plans[i]`` (:func:`_plan_own_rows`)."""
    return [
        attend_documents_rows(attn, [h], [r], document_memory(attn, c, ~m[:, 0, 0]), probe="dec_doc_context", plan=p)[0]
        for h, r, c, m, p in zip(hs, rows, own, masks, plans)
    ]


@host_planning
def _plan_own_rows(rows: int, length: int, device: Union[str, torch.device]) -> RowsPlan:
    """The packing of ``rows`` rows of ``length`` queries when every row is its own document
    (``context: own_sentence``): rows 0..rows - 1 are known without reading the device."""
    return plan_document_rows([(rows, length)], [np.arange(rows)], rows, device)
