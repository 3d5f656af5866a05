"""Text ↔ ids for one language pair: the subword models and vocabularies of a run.

A :class:`Codec` is what a checkpoint carries besides the weights, so translation needs nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import SPECIALS, Vocab

_SPECIAL_SET = frozenset(SPECIALS)


@dataclass
class Codec:
    """Both sides' subword models and vocabularies, kept together so a checkpoint alone can translate."""

    src_subword: Subword
    tgt_subword: Subword
    src_vocab: Vocab
    tgt_vocab: Vocab

    @property
    def shared(self) -> bool:
        """One vocabulary for both sides: what lets a model tie its source and target embeddings."""
        return self.src_vocab == self.tgt_vocab

    def encode(self, lines: Sequence[str], side: str) -> list[np.ndarray]:
        """Subword ids (no markup) for each line of one side."""
        subword, vocab = (self.src_subword, self.src_vocab) if side == "src" else (self.tgt_subword, self.tgt_vocab)
        get, unk = vocab.stoi.get, vocab.stoi["<unk>"]
        return [
            np.fromiter((get(t, unk) for t in toks), dtype=np.int32, count=len(toks))
            for toks in subword.tokenize_batch(lines)
        ]

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized target text of one sentence; markup tokens are dropped."""
        tokens = [t for t in self.tgt_vocab.tokens(ids) if t not in _SPECIAL_SET or t == "<unk>"]
        return self.tgt_subword.detokenize(tokens)

    def to_dict(self) -> dict:
        """Plain data (bytes, lists) for the checkpoint, so loading needs no pickled classes."""
        return {
            "src_subword": self.src_subword.to_dict(),
            "tgt_subword": self.tgt_subword.to_dict(),
            "src_vocab": self.src_vocab.itos,
            "tgt_vocab": self.tgt_vocab.itos,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Codec":
        """Inverse of :meth:`to_dict`; a shared subword model is built once and used for both sides."""
        src_sw = Subword.from_dict(d["src_subword"])
        tgt_sw = src_sw if d["tgt_subword"] == d["src_subword"] else Subword.from_dict(d["tgt_subword"])
        return cls(src_sw, tgt_sw, Vocab(d["src_vocab"]), Vocab(d["tgt_vocab"]))
