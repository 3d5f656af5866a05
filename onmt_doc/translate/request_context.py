"""Context passed with a request: the sentences that came before a document.

Text often arrives a sentence at a time (subtitles, chat, a translator's CAT tool), and a document
model needs the sentences before the new ones. Rather than keeping state between requests, the
caller passes them with each request (``Translator.translate(documents, context=...)``, the
server's ``"context"``, ``onmt_doc_translate -stream``): per document, the preceding sentences as
``source`` strings or ``(source, target)`` pairs, the target being the translation the caller
kept (possibly a person's post-edit) or None where there is none.

What a model reads of it is its unit's (``Unit.context_sides``): the G-Transformer and k-to-k
both sides, their targets forced as the prefix of the new sentences' translation; k-to-1 and
HM-GDC the sources; a sentence model nothing. How much of it is the unit's own window
(``Unit.context_kept``): what a whole-document translation would have put in the same instance.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence, Union

from onmt_doc.errors import UserError

ContextPair = tuple[str, Optional[str]]
# per document, its preceding sentences: "source" or (source, target or None)
Contexts = Sequence[Sequence[Union[str, Sequence[Optional[str]]]]]

# UTF-16 halves, which a str may hold (json.loads("\\ud800"), surrogateescape) but no tokenizer takes
_SURROGATE = re.compile("[\ud800-\udfff]")


class DocumentWithContext(list):
    """A document as the translator's items are (a list of (source, target) pairs) with the
    (source, target or None) pairs before it."""

    def __init__(self, pairs: Sequence[tuple], context: Sequence[ContextPair]) -> None:
        super().__init__(pairs)
        self.context = list(context)


def check_sentence(value: object, where: str) -> None:
    """One sentence as the API takes it: a non-blank, one-line str of text."""
    if not isinstance(value, str):
        raise UserError(f"{where}: expected a sentence (str), got {type(value).__name__}")
    if not value.strip():
        raise UserError(f"{where}: empty sentence (a document is a list of non-blank sentences)")
    if len(value.splitlines()) != 1:
        raise UserError(f"{where}: holds a line break; a sentence is one line")
    surrogate = _SURROGATE.search(value)
    if surrogate:
        raise UserError(
            f"{where}: column {surrogate.start() + 1} holds a lone surrogate "
            f"U+{ord(surrogate.group()):04X}, not text (decode input as strict UTF-8)"
        )


def check_contexts(contexts: object, n_documents: int, what: str = "context") -> list[list[ContextPair]]:
    """``contexts`` checked and normalised: one list per document of (source, target or None)."""
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, Sequence):
        raise UserError(f"{what}: expected one list of preceding sentences per document, got {type(contexts).__name__}")
    if len(contexts) != n_documents:
        raise UserError(
            f"{what}: {len(contexts)} lists for {n_documents} documents; give one per document ([] for none)"
        )
    checked = []
    for d, ctx in enumerate(contexts):
        if isinstance(ctx, (str, bytes)) or not isinstance(ctx, Sequence):
            raise UserError(f"{what}[{d}]: expected a list of preceding sentences, got {type(ctx).__name__}")
        checked.append([_pair(entry, f"{what}[{d}][{i}]") for i, entry in enumerate(ctx)])
    return checked


def _pair(entry: object, where: str) -> ContextPair:
    """A context entry: ``source`` or ``(source, target)``, target None where unknown."""
    if isinstance(entry, str):
        check_sentence(entry, where)
        return entry, None
    if isinstance(entry, bytes) or not isinstance(entry, Sequence) or len(entry) != 2:
        raise UserError(f"{where}: expected a source sentence or a [source, target] pair (target may be null)")
    src, tgt = entry
    check_sentence(src, f"{where}[0]")
    if tgt is not None:
        check_sentence(tgt, f"{where}[1]")
    return src, tgt
