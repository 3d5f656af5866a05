"""Hierarchical document encoder of HM-GDC (Tan et al., 2019, "Hierarchical Modeling of Global
Context for Document-Level Neural Machine Translation", sec. 2).

Every sentence of a document is a batch row (translation unit ``context``); ``batch.doc_index``
groups the rows by document. A Transformer sentence encoder encodes each row (eq. 1); a
multi-head self-attention over each sentence's words, pooled, gives one vector per sentence
(eqs. 2–3); Transformer layers over the sentence vectors of a document give the global context
H^S (eq. 4); the multi-head context attention of eqs. 5–6 gives every word its share d^ctx of the
context, added to the word by a residual with dropout (eq. 7). ``context`` chooses what a word
reads (docs/models/hm_gdc.md discusses the readings): ``own_sentence`` (default), H^S_i of its
own sentence's slot, weighted per head by a gate the word computes from itself (queries and keys
both from h_{i,j}, as eq. 5 writes them); ``document``, an attention over every H^S_k of its
document.

Outputs: ``memory`` (the sentence memory the decoder's cross-attention reads: the words with
context, or without it for the paper's "decoder only" ablation) and, in ``extra``, the
document context C = [h^ctx_1; …; h^ctx_N] packed per document (eq. 8) for the ``doc_context``
decoder. Parameter names of the sentence encoder equal the Transformer encoder's, so a sentence
model initialises it (two-step training, ``train.init_from``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from onmt_doc.config import Config
from onmt_doc.config.options import option
from onmt_doc.contracts import Batch, EncoderOut, PartContext
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.encoders.base import REGISTRY
from onmt_doc.encoders.transformer import TransformerEncoder, TransformerEncoderConfig, TransformerEncoderLayer
from onmt_doc.errors import ConfigError
from onmt_doc.modules import analysis
from onmt_doc.modules.attention import MultiHeadAttention
from onmt_doc.modules.document_packing import (
    Packing,
    RowsPlan,
    attend_documents_rows,
    document_memory,
    host_array,
    plan_document_rows,
    plan_packing,
)
from onmt_doc.modules.dropout import Dropout
from onmt_doc.modules.embeddings import SinusoidalPositions
from onmt_doc.modules.host_planning import host_planning
from onmt_doc.modules.row_buckets import RowBucket, batch_order, row_plan, unbucket, whole_batch
from onmt_doc.registry import registry_for

ENCODER_PLAN = "hm_gdc.encoder"  # the encoder's plan in ``Batch.plans`` (made by ``host_plans``)


@dataclass
class HierarchicalEncoderConfig(TransformerEncoderConfig):
    """``model.encoder`` keys of ``type: hierarchical`` (HM-GDC); ``layers`` etc. configure the sentence encoder."""

    layers: int = option(6, "sentence encoder layers", minimum=0)
    heads: int = option(8, "attention heads (every attention of the encoder); must divide `model.d_model`", minimum=1)
    ff: int = option(2048, "inner size of the feed-forward networks (sentence and document layers)", minimum=1)
    pre_norm: bool = option(True, "as for `transformer`; also for the document layers")
    doc_layers: int = option(
        2,
        "document encoder layers over the sentence vectors (eq. 4); with `share_attention` at most `layers`",
        minimum=0,
    )
    share_attention: bool = option(
        True,
        "the document encoder reuses the sentence encoder's self-attention "
        "parameters (paper, sec. 2.3): the pooling attention (eq. 2) is the top "
        "sentence layer's, document layer k's is sentence layer k's; `false` = their own",
    )
    pooling: Literal["mean", "max"] = option(
        "mean", "how eq. 3 turns a sentence's self-attention outputs into one vector"
    )
    doc_positions: bool = option(
        True,
        "add a sinusoidal encoding of each sentence's position in its document "
        "(window) to the sentence vectors before the document layers",
    )
    word_context: bool = option(
        True,
        "the decoder's cross-attention reads the words with document context "
        "(eq. 7); `false` = the words alone, which with the `doc_context` decoder is the "
        'paper\'s "decoder only" integration (with another decoder the context would be '
        "unused: a config error)",
    )
    context_dropout: float = option(
        0.1, "P of the residual dropout that adds the context to each word (eq. 7); in [0, 1)", minimum=0, below=1
    )
    context: Literal["own_sentence", "document"] = option(
        "own_sentence",
        "what a word's context attention reads (eqs. 5–6): `own_sentence` = H^S_i, the document "
        "encoder's output at the word's own sentence slot, weighted per head by σ(q·k/√d_head) with query and key "
        "from the word (the other sentences reach it through eq. 4); `document` = attention over every H^S_k of "
        "its document. See [models/hm_gdc.md](models/hm_gdc.md#eqs-56-what-a-word-reads-encodercontext)",
    )

    def validate(self, path: str, root: Config) -> None:
        """Shared document layers borrow sentence layers' attention; without word context the
        document context reaches the output only through a decoder that reads ``doc_memory``."""
        super().validate(path, root)
        if self.share_attention and self.doc_layers > self.layers:
            raise ConfigError(
                f"{path}.doc_layers: with share_attention each document layer reuses a sentence "
                f"layer's self-attention, so at most {path}.layers ({self.layers}), got "
                f"{self.doc_layers}; or set share_attention: false"
            )
        decoder = root.model.decoder.type
        if not self.word_context and "doc_memory" not in registry_for("decoder").get(decoder).cls.needs:
            raise ConfigError(
                f"{path}.word_context: false leaves the document context unused with decoder "
                f"{decoder}; use decoder doc_context (decoder-only integration) or set it true"
            )


@REGISTRY.register("hierarchical", HierarchicalEncoderConfig)
class HierarchicalEncoder(TransformerEncoder):
    """HM-GDC's hierarchical encoder; one batch row per sentence, grouped by ``batch.doc_index``."""

    unit = "context"
    provides = ("doc_memory", "doc_memory_pad", "row_doc", "sentence_context")

    def __init__(self, cfg: HierarchicalEncoderConfig, ctx: PartContext) -> None:
        """The sentence encoder is the Transformer encoder (same parameter names, for ``init_from``)."""
        super().__init__(cfg, ctx)
        d = ctx.d_model
        shared = cfg.share_attention
        self.sentence_attn = (
            self.layers[-1].self_attn if shared else MultiHeadAttention(d, cfg.heads, ctx.attention_dropout)
        )  # eq. 2
        self.doc_layers = nn.ModuleList(
            TransformerEncoderLayer(d, cfg.heads, cfg.ff, ctx.dropout, ctx.attention_dropout, cfg.pre_norm)
            for _ in range(cfg.doc_layers)
        )  # eq. 4
        if shared:
            for doc_layer, sent_layer in zip(self.doc_layers, self.layers):
                doc_layer.self_attn = sent_layer.self_attn
        self.doc_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.doc_positions = SinusoidalPositions(d) if cfg.doc_positions else None
        self.context_attn = MultiHeadAttention(d, cfg.heads, ctx.attention_dropout, self_attention=False)  # eq. 5
        self.context_dropout = Dropout(cfg.context_dropout)
        self.pooling, self.word_context, self.context = cfg.pooling, cfg.word_context, cfg.context

    def host_plans(self, batch: Batch) -> dict[str, Any]:
        """The fused path's :class:`EncoderPlan` (one bucket of every row) from the host batch."""
        keep = batch.src.ne(PAD_ID)
        buckets = [whole_batch(batch.size, batch.src.size(1), "cpu")]
        plan = encoder_plan(buckets, batch.doc_index.numpy(), keep.numpy(), self.context == "document", "cpu")
        return {ENCODER_PLAN: plan}

    def forward(self, batch: Batch) -> EncoderOut:
        """Rows [R, S] of ``batch.src`` -> words with context [R, S, D] (eqs. 1–7) and, in ``extra``, the
        packed document context (eq. 8). The per-row parts run per length bucket (``row_buckets``),
        the document encoder over the sentence vectors of the whole batch."""
        pad = batch.src.eq(PAD_ID)
        keep = ~pad
        row_doc = batch.doc_index.to(batch.src.device)
        plan = batch.plans.get(ENCODER_PLAN)
        if plan is None:  # not prepared (EncoderDecoder.prepare): planned here
            plan = plan_encoder(batch, keep, self.context == "document")
        buckets = plan.buckets
        keeps = [b.take(keep) for b in buckets]
        h_parts, sentences = [], []
        for b, keep_b in zip(buckets, keeps):
            sub = replace(batch, src=b.take(batch.src), src_groups=b.take(batch.src_groups))
            h_b = super().forward(sub).memory  # eq. 1: H_i = SentEnc(S_i)
            sentences.append(self.pool(self.sentence_attn(h_b, keep_b[:, None, None, :]), keep_b))  # eqs. 2-3
            h_parts.append(h_b)
        sentences = torch.cat(sentences).index_select(0, batch_order(buckets))  # [R, D] in batch order
        h_s, sent_pad = self.encode_document(sentences, plan.sentences)  # eq. 4: [G, N, D]
        if plan.rows is None:  # eqs. 5-6, H^S_i
            own_slot = plan.sentences.unpack(h_s)  # [R, 1, D]
            d_ctx = [
                own_sentence_context(self.context_attn, h_b, own_slot.index_select(0, b.rows), keep_b, b.rows)
                for b, h_b, keep_b in zip(buckets, h_parts, keeps)
            ]
        else:  # eqs. 5-6, all H^S_k; the real words of all buckets packed per document
            d_ctx = attend_documents_rows(
                self.context_attn,
                h_parts,
                [row_doc.index_select(0, b.rows) for b in buckets],
                document_memory(self.context_attn, h_s, sent_pad),
                keeps,
                "enc_doc_context",
                rows=[b.rows for b in buckets],
                plan=plan.rows,
            )
        ctx_parts = [h_b + self.context_dropout(d) for h_b, d in zip(h_parts, d_ctx)]  # eq. 7
        length = batch.src.size(1)
        h_ctx = unbucket(ctx_parts, buckets, length)
        extra = {
            "doc_memory": plan.words.pack(h_ctx),
            "doc_memory_pad": plan.words.padding(),
            "row_doc": row_doc,  # eq. 8
            "sentence_context": h_ctx,
        }
        memory = h_ctx if self.word_context else unbucket(h_parts, buckets, length)
        return EncoderOut(memory, pad, batch.src_groups, extra)

    def pool(self, a: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """eq. 3: one vector per sentence from the self-attention outputs a [R, S, D]."""
        if self.pooling == "max":
            return a.masked_fill(~keep[..., None], float("-inf")).amax(1)
        return (a * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1)

    def encode_document(self, sentences: torch.Tensor, packing: Packing) -> tuple[torch.Tensor, torch.Tensor]:
        """eq. 4: H^S = DocEnc(h^S) over each document's sentence vectors [R, D], packed per document
        by ``packing`` to [G, N, D]; and the padding of the packed sequences [G, N]."""
        x, pad = packing.pack(sentences[:, None]), packing.padding()
        if self.doc_positions is not None:
            x = x + self.doc_positions(0, x.size(1))
        mask = (~pad)[:, None, None, :]
        for layer in self.doc_layers:
            x = layer(x, mask, probe=("doc_sentences", ~pad))  # analysis: the sentence-level attention
        return self.doc_norm(x), pad


@dataclass
class EncoderPlan:
    """Where a forward pass puts the batch's rows, planned once on the host: every layer and reading
    uses it, and a compiled forward leaves its graph once for it, not once per packing."""

    buckets: list[RowBucket]  # the per-row parts' length buckets (one bucket on the fused path)
    sentences: Packing  # the sentence vectors [R] per document: [G documents, N sentences] (eq. 4)
    words: Packing  # the real words [R, L] per document: [G, M] (eq. 8's C)
    rows: Optional[RowsPlan]  # the buckets' words as queries over their document (``context: document``)


@host_planning
def plan_encoder(batch: Batch, keep: torch.Tensor, document_reading: bool) -> EncoderPlan:
    """The :class:`EncoderPlan` of ``batch`` (``keep`` [R, L]: its real positions), from the batch's
    host copy where it has one (``Batch.host``: no device read on a GPU)."""
    host = batch.host
    host_doc = host_array(host.doc_index if host is not None else batch.doc_index)
    host_keep = host_array(host.src.ne(PAD_ID) if host is not None else keep)
    return encoder_plan(row_plan(keep), host_doc, host_keep, document_reading, batch.src.device)


def encoder_plan(
    buckets: list[RowBucket],
    host_doc: np.ndarray,
    host_keep: np.ndarray,
    document_reading: bool,
    device: Union[str, torch.device],
) -> EncoderPlan:
    """The :class:`EncoderPlan` of rows of documents ``host_doc`` [R] with real positions ``host_keep``
    [R, L] in length ``buckets``, its indices on ``device``: numpy work, on the host."""
    n_docs = int(host_doc.max()) + 1
    rows = None
    if document_reading:
        shapes = [(len(b.host_rows), b.length) for b in buckets]
        docs = [host_doc[b.host_rows] for b in buckets]
        keeps = [host_keep[b.host_rows, : b.length] for b in buckets]
        rows = plan_document_rows(shapes, docs, n_docs, device, keeps)
    return EncoderPlan(
        buckets,
        plan_packing(host_doc, n_docs, device=device),
        plan_packing(host_doc, n_docs, host_keep.shape[1], host_keep, device=device),
        rows,
    )


def own_sentence_context(
    attn: MultiHeadAttention,
    h: torch.Tensor,
    own_slot: torch.Tensor,
    keep: torch.Tensor,
    rows: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """eqs. 5-6 with the value H^S_i alone: α_{i,j} = MultiHead-Ctx(h_{i,j}, h_{i,j}, H^S_i),
    d^ctx_{i,j} = α_{i,j} H^S_i. A softmax over one value would be 1 for every word, so α is read
    as one weight per head in (0, 1): σ(q·k / √d_head) with query and key both from the word
    h_{i,j} [R, L, D]; the values are the head projections of the own slot H^S_i [R, 1, D].
    Reuses ``attn``'s q, k, v and output projections (the same parameters as the ``document``
    reading). Returns d^ctx [R, L, D], zeros at padding (``keep`` [R, L] False). ``rows``: the
    batch rows of a length bucket, for the captured gate (``analysis.capturing``)."""
    d = h.size(-1)

    def heads(x: torch.Tensor) -> torch.Tensor:  # [R, T, D] -> [R, H, T, d_head]
        return x.view(x.size(0), x.size(1), attn.heads, attn.d_head).transpose(1, 2)

    q = attn.project_q(h)  # [R, H, L, d_head]
    k = heads(F.linear(h, attn.kv.weight[:d], attn.kv.bias[:d]))  # keys from the word too
    v = heads(F.linear(own_slot, attn.kv.weight[d:], attn.kv.bias[d:]))  # [R, H, 1, d_head]
    alpha = torch.sigmoid((q * k).sum(-1, keepdim=True) / attn.d_head**0.5)  # eq. 5: [R, H, L, 1]
    analysis.record_mean("gate/enc_context", alpha.squeeze(-1).transpose(1, 2), keep)
    analysis.capture("gate/enc_context", alpha.squeeze(-1).transpose(1, 2), rows)  # [R, L, H]
    return attn.merge(alpha * v) * keep[..., None]  # eq. 6
