"""What every encoder and decoder receives besides its own config section."""
from __future__ import annotations

from dataclasses import dataclass

from onmt_doc.modules.embeddings import Embeddings


@dataclass
class PartContext:
    d_model: int
    dropout: float
    attention_dropout: float
    src_embeddings: Embeddings
    tgt_embeddings: Embeddings
