"""One document as a self-contained HTML page: source and translation sentence by sentence, each
target token coloured by its context reliance, every number of the pictures on hover, and the
pictures themselves, embedded (``onmt_doc_evaluate -explain``).

The page is one file that needs nothing else: the style is inline, the pictures are embedded (the
same PNG files are written beside it), and it works without JavaScript. The colour levels
(:data:`LEVELS`, :func:`level`) are the ones the server's page (``onmt_doc/serve/page.py``) uses, so
both read alike.
"""

from __future__ import annotations

import base64
import html
from typing import Optional, Sequence

from onmt_doc.evaluation.context_reading import DocumentReading, SentenceReading

LEVELS = 5  # colour classes r0 (no context) … r4 (mostly context)
# shared with the server's page: one colour per reliance level, white to deep orange
STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 80em; }
table.doc { border-collapse: collapse; width: 100%; }
table.doc td, table.doc th { border-top: 1px solid #ddd; padding: 0.4em 0.6em; vertical-align: top; text-align: left; }
.tok { padding: 0.1em 0.05em; border-radius: 0.2em; }
.r0 { background: #ffffff; } .r1 { background: #fde2c8; } .r2 { background: #fbbf85; }
.r3 { background: #f68d3f; } .r4 { background: #d9530f; color: #fff; }
.legend span { display: inline-block; padding: 0.1em 0.6em; margin-right: 0.2em; border: 1px solid #ddd; }
.bar { display: inline-block; height: 0.7em; background: #d9530f; vertical-align: middle; }
.ctx { font-size: 0.85em; color: #555; white-space: nowrap; }
.note { color: #555; font-size: 0.9em; }
img.picture { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
"""


LEGEND = (
    '<p class="legend">reliance: '
    + "".join(f'<span class="r{k}">{k / LEVELS:.1f}–{(k + 1) / LEVELS:.1f}</span>' for k in range(LEVELS))
    + "</p>"
)


def level(value: float) -> int:
    """The colour class of a reliance in [0, 1]: ``LEVELS`` equal steps (0 exactly is level 0)."""
    if not value > 0:
        return 0
    return min(LEVELS - 1, max(1, int(value * LEVELS)))


def _tokens(tokens: Sequence[tuple[str, bool]], measures: Optional[dict] = None, colour_by: str = "reliance") -> str:
    """Tokens as spans: coloured by ``colour_by``, every measure in the hover title."""
    parts = []
    for i, (text, space) in enumerate(tokens):
        if measures is None:
            parts.append((" " if space else "") + html.escape(text))
            continue
        values = {name: v[i] for name, v in measures.items() if i < len(v)}
        title = html.escape("; ".join(f"{name} {v:.3f}" for name, v in values.items()), quote=True)
        css = f"r{level(values.get(colour_by, 0.0))}"
        parts.append(f'{" " if space else ""}<span class="tok {css}" title="{title}">{html.escape(text)}</span>')
    return "".join(parts)


def _context_cell(sentence: SentenceReading, j: int) -> str:
    """What a sentence read: its tokens' mean attention on each other source sentence ("src k") and,
    for a model with global self-attention, on each earlier target sentence ("tgt k")."""
    shares = [(f"src {k + 1}", v) for k, v in enumerate(sentence.context) if k != j and v >= 0.005]
    shares += [(f"tgt {k + 1}", v) for k, v in enumerate(sentence.target_context) if k != j and v >= 0.005]
    if not shares:
        return '<span class="ctx">no other sentence</span>'
    return "<br>".join(
        f'<span class="ctx">{name} <span class="bar" style="width:{max(1, round(60 * v))}px"></span> '
        f"{100 * v:.0f}%</span>"
        for name, v in shares
    )


def render(
    reading: DocumentReading,
    title: str,
    translations: Sequence[str],
    references: Optional[Sequence[str]] = None,
    pictures: Sequence[tuple[bytes, str]] = (),
) -> str:
    """The page: ``reading`` (of the references when given, else of ``translations``), the
    translations beside it, and ``pictures`` as (PNG bytes, title) pairs, embedded."""
    explained = "reference" if references is not None else "translation"
    rows = []
    for j, (sentence, hyp) in enumerate(zip(reading.sentences, translations)):
        cells = [
            f"<td>{j + 1}</td>",
            f"<td>{_tokens(sentence.source)}</td>",
            f'<td class="translation">{html.escape(hyp)}</td>',
        ]
        if references is not None:
            cells.append(f'<td class="reading">{_tokens(sentence.target, sentence.measures)}</td>')
        else:
            cells[2] = f'<td class="translation reading">{_tokens(sentence.target, sentence.measures)}</td>'
        cells.append(f"<td>{_context_cell(sentence, j)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = ["#", "source", "translation"] + (["reference"] if references is not None else []) + ["read from"]
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in reading.notes)
    figures = "".join(
        f'<h3>{html.escape(t)}</h3><img class="picture" alt="{html.escape(t, quote=True)}" '
        f'src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'
        for data, t in pictures
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>Model: {html.escape(reading.model)}. Each {explained} token is coloured by its <b>context reliance</b>,
the share of what the model reads for it that comes from other sentences: {html.escape(reading.reliance)}.
Hover a token for every number. "Read from" gives each sentence's mean attention on the other source
sentences (src) and, where the model has global self-attention, on the earlier target sentences (tgt).</p>
{LEGEND}
{notes}
<table class="doc"><tr>{"".join(f"<th>{h}</th>" for h in header)}</tr>
{"".join(rows)}
</table>
{figures}
</body></html>
"""
