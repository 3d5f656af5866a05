"""Hierarchical document encoder of HM-GDC (Tan et al., 2019, "Hierarchical Modeling of Global
Context for Document-Level Neural Machine Translation", sec. 2).

Every sentence of a document is a batch row (translation unit ``context``); ``batch.doc_index``
groups the rows by document. A Transformer sentence encoder encodes each row (eq. 1); a
multi-head self-attention over each sentence's words, pooled, gives one vector per sentence
(eqs. 2–3); Transformer layers over the sentence vectors of a document give the global context
H^S (eq. 4); a context attention from every word to H^S of its document (eqs. 5–6) is added to
the word by a residual with dropout (eq. 7).

Outputs: ``memory`` (the sentence memory the decoder's cross-attention reads: the words with
context, or without it for the paper's "decoder only" ablation) and, in ``extra``, the
document context C = [h^ctx_1; …; h^ctx_N] packed per document (eq. 8) for the ``doc_context``
decoder. Parameter names of the sentence encoder equal the Transformer encoder's, so a sentence
model initialises it (two-step training, ``train.init_from``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from onmt_doc.data.batching import Batch
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.encoders import REGISTRY
from onmt_doc.encoders.base import EncoderOut
from onmt_doc.encoders.transformer import TransformerEncoder, TransformerEncoderConfig, TransformerEncoderLayer
from onmt_doc.modules.attention import MultiHeadAttention
from onmt_doc.modules.document_packing import attend_documents, document_memory, plan_packing
from onmt_doc.modules.dropout import Dropout
from onmt_doc.modules.embeddings import SinusoidalPositions
from onmt_doc.parts import PartContext


@dataclass
class HierarchicalEncoderConfig(TransformerEncoderConfig):
    doc_layers: int = 2            # Transformer layers over the sentence vectors (eq. 4)
    # the document encoder reuses the sentence encoder's self-attention parameters (paper, sec. 2.3):
    # eq. 2 the top sentence layer's, document layer k sentence layer k's
    share_attention: bool = True
    pooling: Literal["mean", "max"] = "mean"   # eq. 3: one vector per sentence
    doc_positions: bool = True     # sinusoidal position of each sentence in its document window
    # eq. 7: the decoder's cross-attention reads the words with document context; false = the
    # words alone (with the doc_context decoder: the paper's "decoder only" integration)
    word_context: bool = True
    context_dropout: float = 0.1   # P of ResidualDrop (eq. 7)


@REGISTRY.register("hierarchical", HierarchicalEncoderConfig)
class HierarchicalEncoder(TransformerEncoder):
    unit = "context"
    provides = ("doc_memory", "doc_memory_pad", "row_doc")

    def __init__(self, cfg: HierarchicalEncoderConfig, ctx: PartContext):
        super().__init__(cfg, ctx)
        d = ctx.d_model
        shared = cfg.share_attention
        self.sentence_attn = (self.layers[-1].self_attn if shared
                              else MultiHeadAttention(d, cfg.heads, ctx.attention_dropout))          # eq. 2
        self.doc_layers = nn.ModuleList(
            TransformerEncoderLayer(d, cfg.heads, cfg.ff, ctx.dropout, ctx.attention_dropout, cfg.pre_norm)
            for _ in range(cfg.doc_layers))                                                         # eq. 4
        if shared:
            for doc_layer, sent_layer in zip(self.doc_layers, self.layers):
                doc_layer.self_attn = sent_layer.self_attn
        self.doc_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.doc_positions = SinusoidalPositions(d) if cfg.doc_positions else None
        self.context_attn = MultiHeadAttention(d, cfg.heads, ctx.attention_dropout, self_attention=False)  # eq. 5
        self.context_dropout = Dropout(cfg.context_dropout)
        self.pooling, self.word_context = cfg.pooling, cfg.word_context

    def forward(self, batch: Batch) -> EncoderOut:
        sent = super().forward(batch)                                 # eq. 1: H_i = SentEnc(S_i)
        h, pad = sent.memory, sent.pad_mask
        row_doc = batch.doc_index.to(h.device)
        n_docs = int(row_doc.max()) + 1
        keep = ~pad
        sentences = self.pool(self.sentence_attn(h, keep[:, None, None, :]), keep)   # eqs. 2-3: [R, D]
        h_s, sent_pad = self.encode_document(sentences, row_doc, n_docs)           # eq. 4: [G, N, D]
        d_ctx = attend_documents(self.context_attn, h, row_doc,                    # eqs. 5-6
                                 document_memory(self.context_attn, h_s, sent_pad), probe="enc_doc_context")
        h_ctx = h + self.context_dropout(d_ctx)                                    # eq. 7
        words = plan_packing(row_doc, n_docs, h.size(1), keep)
        extra = {"doc_memory": words.pack(h_ctx), "doc_memory_pad": words.padding(), "row_doc": row_doc}  # eq. 8
        return EncoderOut(h_ctx if self.word_context else h, pad, batch.src_groups, extra)

    def pool(self, a: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """eq. 3: one vector per sentence from the self-attention outputs a [R, S, D]."""
        if self.pooling == "max":
            return a.masked_fill(~keep[..., None], float("-inf")).amax(1)
        return (a * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1)

    def encode_document(self, sentences: torch.Tensor, row_doc: torch.Tensor,
                        n_docs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """eq. 4: H^S = DocEnc(h^S) over each document's sentence vectors, packed [G, N, D]; and
        the padding of the packed sequences [G, N]."""
        packing = plan_packing(row_doc, n_docs)
        x, pad = packing.pack(sentences[:, None]), packing.padding()
        if self.doc_positions is not None:
            x = x + self.doc_positions(0, x.size(1))
        mask = (~pad)[:, None, None, :]
        for layer in self.doc_layers:
            x = layer(x, mask)
        return self.doc_norm(x), pad
