"""Accuracy of the toy corpus's context-dependent pronouns in a translation (``.ctx`` files).

The generator (``onmt_doc.toy.corpus``) writes, per split, the line, word index and expected form
of every target word that only the previous sentence determines; this scores a hypothesis file.
"""

from __future__ import annotations

from pathlib import Path

from onmt_doc.data.corpus import bounded_lines
from onmt_doc.errors import DataError
from onmt_doc.outputs import open_input
from onmt_doc.toy.corpus import ALL_PRONOUN_FORMS

__all__ = ["read_ctx", "score_context"]


def _read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 file, split on '\\n' only (not on Unicode separators)."""
    lines = []
    with open_input(path) as f:
        for number, raw in enumerate(bounded_lines(f, str(path), 0), 1):
            try:
                lines.append(raw.decode("utf-8").rstrip("\n").rstrip("\r"))
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{number}: invalid UTF-8 at byte {e.start}") from None
    return lines


def read_ctx(ctx_path: str | Path) -> list[tuple[int, int, str]]:
    """Parse a ``.ctx`` file into (line_no, word_index, expected_word) triples."""
    path = Path(ctx_path)
    entries: list[tuple[int, int, str]] = []
    for n, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        try:
            if len(parts) != 3:
                raise ValueError
            line_no, word_index, word = int(parts[0]), int(parts[1]), parts[2]
            if line_no < 1 or word_index < 0 or not word:
                raise ValueError
        except ValueError:
            raise DataError(f"{path}:{n}: expected 'line_no<TAB>word_index<TAB>word', got {line!r}") from None
        entries.append((line_no, word_index, word))
    return entries


def score_context(
    hyp_path: str | Path,
    ctx_path: str | Path,
    ref_path: str | Path | None = None,
) -> dict[str, int | float]:
    """Accuracy of the context-dependent target words in a hypothesis file.

    The hypothesis must be line-aligned with the reference ``.tgt`` (default:
    ``ctx_path`` with suffix ``.tgt``), blank document-separator lines
    included; otherwise a ``DataError`` naming the file is raised.  If no
    reference file exists, the hypothesis only needs to cover every line_no
    and an entry is correct if either rule below accepts it.

    Matching rule: if the hypothesis line has as many words as the reference
    line, the word at ``word_index`` must equal the expected word.  If the
    length differs (the model dropped or added words, so positions shifted),
    the entry counts as correct iff the expected form occurs in the line and
    no *other* pronoun form of :data:`ALL_PRONOUN_FORMS` (er/sie/es/ihn) does;
    toy sentences hold at most one pronoun, so this is unambiguous.
    ``accuracy`` is 0.0 when there are no entries.
    """
    hyp_file = Path(hyp_path)
    ctx_file = Path(ctx_path)
    ref_file = Path(ref_path) if ref_path is not None else ctx_file.with_suffix(".tgt")
    entries = read_ctx(ctx_file)
    hyp = _read_lines(hyp_file)
    ref: list[str] | None = None
    if ref_path is not None or ref_file.is_file():
        ref = _read_lines(ref_file)
        if len(hyp) != len(ref):
            raise DataError(
                f"{hyp_file}: has {len(hyp)} lines but reference {ref_file} has "
                f"{len(ref)} (keep one output line per input line, blank lines included)"
            )
    last = max((e[0] for e in entries), default=0)
    if last > len(hyp):
        raise DataError(f"{hyp_file}: has {len(hyp)} lines but {ctx_file} refers to line {last}")

    correct = 0
    for line_no, word_index, expected in entries:
        hyp_words = hyp[line_no - 1].split()
        ref_len = len(ref[line_no - 1].split()) if ref is not None else None
        positional = word_index < len(hyp_words) and hyp_words[word_index] == expected
        if ref_len is None:  # no reference: length unknown, accept either rule
            ok = positional or _bag_match(hyp_words, expected)
        elif len(hyp_words) == ref_len:
            ok = positional
        else:
            ok = _bag_match(hyp_words, expected)
        correct += ok
    total = len(entries)
    return {
        "total": total,
        "correct": correct,
        "accuracy": correct / total if total else 0.0,
    }


def _bag_match(hyp_words: list[str], expected: str) -> bool:
    """Length-mismatch fallback: expected form present, no competing form."""
    present = ALL_PRONOUN_FORMS.intersection(hyp_words)
    return expected in hyp_words and present <= {expected}
