"""Subword tokenization with pyonmttok (BPE or SentencePiece).

The learned model travels inside every checkpoint as bytes, so translating needs the checkpoint
alone: :meth:`Subword.to_dict` / :meth:`Subword.from_dict` are the checkpoint format.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterable, Optional, Sequence

import pyonmttok

from onmt_doc.errors import DataError
from onmt_doc.outputs import write_bytes


class Subword:
    """A pyonmttok tokenizer plus the bytes of its subword model.

    ``suffix``: tokens appended to every tokenized line, as a model's own tokenizer adds them (a
    Marian model reads its source as ``pieces… </s>``: transformers' ``MarianTokenizer`` appends the
    end token; onmt_doc's ``</s>`` is the token an import maps it to, onmt_doc/convert/marian.py).
    Empty for every model trained here, whose markup comes from the data pipeline instead."""

    def __init__(self, kind: str, mode: str, model: Optional[bytes] = None, suffix: Sequence[str] = ()):
        self.kind, self.mode, self.model, self.suffix = kind, mode, model, tuple(suffix)
        self._tok = self._make(kind, mode, model)

    @staticmethod
    def _options(kind: str, mode: str) -> tuple[str, dict]:
        if kind == "sentencepiece":
            return "none", {}
        return (mode, {"joiner_annotate": True}) if mode != "none" else ("space", {})

    @classmethod
    def _make(cls, kind: str, mode: str, model: Optional[bytes]) -> pyonmttok.Tokenizer:
        tok_mode, options = cls._options(kind, mode)
        if kind == "none" or model is None:
            return pyonmttok.Tokenizer(tok_mode, **options)
        # pyonmttok reads its model from a path; the file is only needed while constructing.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model")
            with open(path, "wb") as f:
                f.write(model)
            key = "sp_model_path" if kind == "sentencepiece" else "bpe_model_path"
            return pyonmttok.Tokenizer(tok_mode, **options, **{key: path})

    def tokenize(self, line: str) -> list[str]:
        """Subword tokens of one line, with joiners so :meth:`detokenize` restores the text."""
        return self._tok.tokenize(line)[0] + list(self.suffix)

    def tokenize_batch(self, lines: Sequence[str]) -> list[list[str]]:
        """:meth:`tokenize` of many lines in one pyonmttok call (much faster than a Python loop)."""
        if not lines:
            return []
        batch = self._tok.tokenize_batch(list(lines))[0]
        return [tokens + list(self.suffix) for tokens in batch] if self.suffix else batch

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Text of subword tokens: joiners and SentencePiece markers are merged away."""
        return self._tok.detokenize(list(tokens))

    def to_dict(self) -> dict:
        """The checkpoint format: plain data with the model bytes, so translating needs no model file."""
        d = {"kind": self.kind, "mode": self.mode, "model": self.model}
        return {**d, "suffix": list(self.suffix)} if self.suffix else d  # older checkpoints: no key

    @classmethod
    def from_dict(cls, d: dict) -> "Subword":
        """Inverse of :meth:`to_dict`."""
        return cls(d["kind"], d["mode"], d["model"], d.get("suffix", ()))

    @staticmethod
    def model_problem(kind: str, data: bytes) -> Optional[str]:
        """Why ``data`` is not a ``kind`` model (None if it may be): pyonmttok takes almost any
        bytes as BPE merges, so a wrong file would tokenize silently into nonsense."""
        if kind != "bpe":
            return None  # SentencePiece's own parser refuses what is not its protobuf
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"not UTF-8 text at byte {e.start}"
        for number, line in enumerate(text.splitlines(), 1):
            if line and not line.startswith("#") and len(line.split(" ")) != 2:
                return f"line {number} is not a merge of two symbols"
        return None

    def save(self, path: str) -> None:
        """Write the raw subword model (usable by other pyonmttok/SentencePiece tools)."""
        if self.model is not None:
            write_bytes(path, self.model, flag="")

    @classmethod
    def learn(cls, kind: str, mode: str, size: int, lines: Iterable[str]) -> "Subword":
        """Learn a BPE or SentencePiece model of ``size`` symbols on ``lines``."""
        if kind == "none":
            return cls("none", mode, None)
        with tempfile.TemporaryDirectory() as tmp:
            corpus = os.path.join(tmp, "corpus.txt")
            n = 0
            with open(corpus, "w", encoding="utf-8") as f:
                for line in lines:
                    if line:
                        f.write(line + "\n")
                        n += 1
            if n == 0:
                raise DataError("no text to learn a subword model from")
            path = os.path.join(tmp, "model")
            if kind == "sentencepiece":
                learner = pyonmttok.SentencePieceLearner(vocab_size=size, character_coverage=1.0)
            else:
                tok_mode, options = cls._options(kind, mode)
                learner = pyonmttok.BPELearner(
                    tokenizer=pyonmttok.Tokenizer(tok_mode, **options), symbols=size, min_frequency=2
                )
            learner.ingest_file(corpus)
            try:
                learner.learn(path)
            except Exception as e:  # SentencePiece rejects e.g. a vocab size larger than possible
                raise DataError(f"learning the {kind} model failed: {str(e).splitlines()[0]}") from None
            with open(path, "rb") as f:
                return cls(kind, mode, f.read())
