"""Vocabularies with the toolkit's fixed special tokens.

Every sentence is ``<s> w1 … wn </s>`` for every model, the decoder input starts with ``<bos>`` and
the decoder predicts ``<eos>`` after the last ``</s>``. The specials have the same ids in every
vocabulary, so sentence and document checkpoints can initialise each other.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from onmt_doc.errors import DataError
from onmt_doc.outputs import input_problem, read_input_bytes, write_text

PAD, UNK, SOS, EOS_SENT, BOS, EOS, MASK = "<pad>", "<unk>", "<s>", "</s>", "<bos>", "<eos>", "<mask>"
SPECIALS = (PAD, UNK, SOS, EOS_SENT, BOS, EOS, MASK)
PAD_ID, UNK_ID, SOS_ID, EOS_SENT_ID, BOS_ID, EOS_ID, MASK_ID = range(len(SPECIALS))


class Vocab:
    """Token ↔ id table whose first ids are always ``SPECIALS``, so every model agrees on the markup ids."""

    def __init__(self, tokens: Sequence[str]):
        if tuple(tokens[: len(SPECIALS)]) != SPECIALS:
            raise DataError(f"vocabulary must start with the special tokens {' '.join(SPECIALS)}")
        self.itos = list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise DataError("vocabulary has duplicate entries")

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def ids(self, tokens: Iterable[str]) -> list[int]:
        """Ids of ``tokens``; an unknown token maps to ``UNK_ID`` rather than failing."""
        get = self.stoi.get
        return [get(t, UNK_ID) for t in tokens]

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids``, specials included (callers drop the markup they do not want)."""
        return [self.itos[i] for i in ids]

    @classmethod
    def build(cls, counts: Counter, min_freq: int = 1, max_size: int = 0) -> "Vocab":
        """Most frequent first; ties broken alphabetically so the result is deterministic."""
        items = sorted(
            ((t, c) for t, c in counts.items() if c >= min_freq and t not in SPECIALS), key=lambda tc: (-tc[1], tc[0])
        )
        if max_size:
            items = items[: max(0, max_size - len(SPECIALS))]
        return cls(list(SPECIALS) + [t for t, _ in items])

    def save(self, path: str) -> None:
        """One token a line, written atomically so a crashed run never leaves a truncated vocabulary."""
        write_text(path, self.text(), flag="")

    def text(self) -> str:
        """The file format of :meth:`save`: one token a line."""
        return "\n".join(self.itos) + "\n"

    @classmethod
    def load(cls, path: str, limit: int = 1 << 30) -> "Vocab":
        """Read a :meth:`save` file (at most ``limit`` bytes); a missing, unreadable or malformed
        file is a ``DataError`` naming it, not a traceback."""
        problem = input_problem(path)
        if problem:
            raise DataError(f"{path}: {'vocabulary file not found' if problem == 'file not found' else problem}")
        data = read_input_bytes(path, limit=limit, what="vocabulary")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise DataError(f"{path}:{line}: invalid UTF-8; not a vocabulary (one token a line)") from None
        try:
            return cls([line for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n") if line])
        except DataError as e:
            raise DataError(f"{path}: {e}") from None
