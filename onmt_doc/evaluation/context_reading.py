"""What a model reads from context, token by token: the numbers behind the context pictures.

One teacher-forced pass over a document (source and a target: a reference, or the model's own
translation) inside :func:`onmt_doc.modules.analysis.capturing` collects the attention weights
and gates of the model's parts; this module puts them on the document's axes:

* **rows** are the target words of the document, sentence after sentence (the token the model
  predicts at that step: the attention of the query that predicts it);
* **columns** are the source tokens of the document with their ``<s> … </s>`` markup, so a row of
  attention over them sums to one (an instance sees only its own window; elsewhere the row is 0);
  for the G-Transformer's global self-attention, the target tokens before the word (its earlier
  sentences), with the ``<bos>`` that starts each instance in a column of its own.

Per target word, ``reliance`` is the share of what the model reads that comes from other
sentences than the word's own; what it is computed from depends on the model
(:data:`RELIANCE`): the G-Transformer's global cross- and self-attention weighted by their gates,
HM-GDC's DocEnc–Decoder attention, a concatenation model's cross-attention. A sentence model reads no
other sentence, so its reliance is exactly 0. Model-specific measures sit beside it (the
G-Transformer's global weight 1 − g, the context gates' z and z*), and the pictures
(:class:`Heatmap`) show the full matrices. ``onmt_doc_evaluate -explain``, ``log.pictures`` and
the server's ``"explain": true`` all read this module (docs/seeing_context.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import torch

from onmt_doc.data.batching import collate, sentence_rows
from onmt_doc.data.instances import Example, unit_class
from onmt_doc.data.vocab import EOS_SENT_ID, PAD_ID, SOS_ID
from onmt_doc.errors import UserError
from onmt_doc.modules import analysis
from onmt_doc.modules.attention import MultiHeadAttention
from onmt_doc.modules.document_packing import plan_packing

if TYPE_CHECKING:
    from onmt_doc.translate.translator import Translator

# what ``reliance`` is read from, per kind of model (shown in the page and the docs)
RELIANCE = {
    "g_transformer": "(1 − g) × the global attention's share on other sentences, mean over the layers with "
    "global cross-attention (on the source) and global self-attention (on the earlier target sentences); "
    "g: the gate's weight of the local attention, eq. 10",
    "doc_context": "the DocEnc–Decoder attention's share on other sentences' words, mean over layers and heads",
    "cross": "the cross-attention's share on other sentences' source tokens, mean over layers and heads "
    "(a sentence model sees none: 0)",
    "none": "a sentence model reads no other sentence: 0",
}


@dataclass
class Heatmap:
    """One picture: ``values`` [rows, cols] with tokens (or sentences, layers) on the axes and the
    first row and column of every sentence, where a boundary is drawn."""

    key: str  # file name stem and TensorBoard tag
    title: str
    values: np.ndarray
    rows: list[str]
    cols: list[str]
    row_starts: list[int]
    col_starts: list[int]
    row_label: str
    col_label: str


@dataclass
class SentenceReading:
    """One sentence of the document: its source and target tokens (display text, whether a space
    comes before), each target token's measures, and how its target tokens' attention spreads over
    the document's source sentences and, for a model that attends to them (the G-Transformer), its
    earlier target sentences (means over the tokens; empty when the model has no such attention)."""

    source: list[tuple[str, bool]]
    target: list[tuple[str, bool]]
    measures: dict[str, list[float]]
    context: list[float] = field(default_factory=list)
    target_context: list[float] = field(default_factory=list)


@dataclass
class DocumentReading:
    """A document as the model reads it: sentence by sentence, and its pictures."""

    model: str  # "encoder + decoder, unit"
    reliance: str  # what reliance is read from (RELIANCE)
    sentences: list[SentenceReading]
    heatmaps: list[Heatmap]
    notes: list[str] = field(default_factory=list)  # measures that could not be shown, and why

    def to_json(self) -> dict:
        """The reading without its pictures, as the server's ``"explain": true`` returns it."""
        return {
            "model": self.model,
            "reliance_from": self.reliance,
            "notes": self.notes,
            "sentences": [
                {
                    "source": [[t, space] for t, space in s.source],
                    "target": [[t, space] for t, space in s.target],
                    "measures": {k: [round(float(x), 4) for x in v] for k, v in s.measures.items()},
                    "context": [round(float(x), 4) for x in s.context],
                    "target_context": [round(float(x), 4) for x in s.target_context],
                }
                for s in self.sentences
            ],
        }

    def measure(self, name: str) -> np.ndarray:
        """Measure ``name`` of every target token of the document, sentence after sentence."""
        return np.array([v for s in self.sentences for v in s.measures.get(name, [])], dtype=np.float64)


# ----------------------------------------------------------------------------- tokens


def display_tokens(tokens: Sequence[str]) -> list[tuple[str, bool]]:
    """Subword tokens as (text, space before): joiners (``￭``) or SentencePiece's ``▁`` say where
    the words are, so the page prints the sentence as text while each token stays its own span."""
    if any(tok.startswith("▁") for tok in tokens):  # SentencePiece: ▁ starts a word
        return [(tok.lstrip("▁") or tok, i > 0 and tok.startswith("▁")) for i, tok in enumerate(tokens)]
    out: list[tuple[str, bool]] = []
    glue = True  # no space before the first token
    for tok in tokens:
        space = not glue and not tok.startswith("￭")
        glue = tok.endswith("￭")
        out.append((tok.strip("￭") or tok, space))
    return out


# ----------------------------------------------------------------------------- the batch's layout


@dataclass
class _Layout:
    """Where a batch's rows sit in the document: each source position's column (-1 for padding),
    and the target words: (row, query position, document sentence, token id)."""

    columns: np.ndarray  # [B, S]
    words: list[tuple[int, int, int, int]]
    col_sentence: np.ndarray  # [C] source sentence of each column
    src_tokens: list[list[int]]  # per source sentence, its ids with markup
    tgt_columns: np.ndarray  # [B, T] column of each decoder input position: 0 for <bos>, else 1 + target token
    tgt_col_sentence: np.ndarray  # [1 + C'] target sentence of each of those columns (-1: <bos>)
    tgt_tokens: list[list[int]]  # per target sentence, its ids with markup


def _tags(ids: np.ndarray) -> np.ndarray:
    """Sentence number (from 1) of each position of marked ids; bare ids (no markup) are one sentence."""
    if not (ids == SOS_ID).any():
        return np.ones(len(ids), dtype=np.int64)
    return np.cumsum(ids == SOS_ID)


def _layout(rows: Sequence[Example], tok_doc: Sequence[tuple], unit: str, width: int) -> _Layout:
    """The columns of every row's source and the target words each row's output translates."""
    marked = any((r.src == SOS_ID).any() for r in rows)
    src_tokens = [[SOS_ID, *map(int, s), EOS_SENT_ID] if marked else list(map(int, s)) for s, _ in tok_doc]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in src_tokens])])
    columns = np.full((len(rows), width), -1, dtype=np.int64)
    tgt_tokens = [[SOS_ID, *map(int, t), EOS_SENT_ID] if marked else list(map(int, t)) for _, t in tok_doc]
    tgt_offsets = 1 + np.concatenate([[0], np.cumsum([len(t) for t in tgt_tokens])])
    tgt_columns = np.full((len(rows), 1 + max(len(r.tgt) for r in rows)), -1, dtype=np.int64)
    words = []
    output_sentences = unit_class(unit).output_sentences
    for r, ex in enumerate(rows):
        n = ex.n_sents if ex.sent_lens is None else 1
        tags = _tags(ex.src)
        last = ex.first + n - 1
        for p, k in enumerate(tags):
            sentence = last - (int(tags[-1]) - int(k))
            start = int(np.argmax(tags == k))
            columns[r, p] = offsets[sentence] + p - start
        tgt_tags = _tags(ex.tgt)
        kept = set(output_sentences(ex.first, n))
        tgt_columns[r, 0] = 0  # <bos>
        for t, (token, k) in enumerate(zip(ex.tgt.tolist(), tgt_tags)):
            sentence = ex.first + int(k) - 1
            start = int(np.argmax(tgt_tags == k))
            tgt_columns[r, t + 1] = tgt_offsets[sentence] + t - start  # decoder input t + 1 holds target t
            if token not in (SOS_ID, EOS_SENT_ID) and sentence in kept:
                words.append((r, t, sentence, token))
    words.sort(key=lambda w: (w[2], w[0], w[1]))
    col_sentence = np.repeat(np.arange(len(src_tokens)), [len(t) for t in src_tokens])
    tgt_col_sentence = np.concatenate([[-1], np.repeat(np.arange(len(tgt_tokens)), [len(t) for t in tgt_tokens])])
    return _Layout(columns, words, col_sentence, src_tokens, tgt_columns, tgt_col_sentence, tgt_tokens)


# ----------------------------------------------------------------------------- reading captures


def _batch_order(entries: Sequence[analysis.Captured], n_rows: int) -> torch.Tensor:
    """Per-bucket captures [r_i, T_i, ...] with their rows, back in batch order [B, T, ...]."""
    if len(entries) == 1 and entries[0].rows is None:
        return entries[0].value
    length = max(e.value.size(1) for e in entries)
    first = entries[0].value
    out = first.new_zeros(n_rows, length, *first.shape[2:])
    for e in entries:
        out[e.rows, : e.value.size(1)] = e.value
    return out


def _per_layer(entries: Sequence[analysis.Captured], per_layer: int) -> list[list[analysis.Captured]]:
    """Captures of one name split into layers of ``per_layer`` calls (buckets) each."""
    return [list(entries[i : i + per_layer]) for i in range(0, len(entries), per_layer)]


def _spread(probs: torch.Tensor, layout: _Layout, n_cols: int, columns: Optional[np.ndarray] = None) -> np.ndarray:
    """Attention [B, H, T, K] (mean over heads) of every target word over the document's columns
    (``columns`` [B, K]: the column of each key; default the source's): [words, columns]."""
    columns = layout.columns if columns is None else columns
    p = probs.mean(1).cpu().numpy()  # [B, T, K]
    out = np.zeros((len(layout.words), n_cols))
    for i, (r, t, _, _) in enumerate(layout.words):
        cols = columns[r, : p.shape[2]]
        real = cols >= 0
        np.add.at(out[i], cols[real], p[r, t, : len(cols)][real])
    return out


def _other_share(attention: np.ndarray, layout: _Layout, col_sentence: Optional[np.ndarray] = None) -> np.ndarray:
    """Per word, the share of its attention on other sentences than its own (a column of no
    sentence, -1 in ``col_sentence``, e.g. ``<bos>``, is none)."""
    col_sentence = layout.col_sentence if col_sentence is None else col_sentence
    other = (col_sentence[None, :] >= 0) & (col_sentence[None, :] != np.array([w[2] for w in layout.words])[:, None])
    return (attention * other).sum(1)


# ----------------------------------------------------------------------------- the reading


class _Reader:
    """One document's pass and what each kind of model shows of it."""

    def __init__(self, translator: Translator, tok_doc: list[tuple], examples: list[Example]) -> None:
        self.translator, self.model, self.codec = translator, translator.model, translator.codec
        self.rows, _ = sentence_rows(examples)
        self.batch = collate(examples).to(translator.device)
        self.layout = _layout(self.rows, tok_doc, self.model.unit, self.batch.src.size(1))
        self.n_cols = len(self.layout.col_sentence)
        self.tok_doc = tok_doc

    def run(self) -> tuple[analysis.Capture, object]:
        """The teacher-forced pass inside a capture; the cross-attention of plain decoder layers
        is named ``dec_cross`` (the G-Transformer's and HM-GDC's attentions have probes)."""
        names = {}
        for layer in getattr(self.model.decoder, "layers", []):
            attn = getattr(layer, "cross_attn", None)
            if isinstance(attn, MultiHeadAttention) and not hasattr(layer, "cross_mode"):
                names[attn] = "dec_cross"
        self.model.eval()
        with torch.no_grad(), analysis.capturing(names) as capture:
            out = self.model(self.batch)
        return capture, out

    # -- the pictures' shared pieces
    def attention_maps(self, attention: np.ndarray, what: str) -> list[Heatmap]:
        """Token and sentence pictures of an attention [words, columns]."""
        words, srcs = self.target_labels(), self.source_labels()
        sent = np.zeros((len(words), len(self.layout.src_tokens)))
        np.add.at(sent.T, self.layout.col_sentence, attention.T)
        n = len(self.layout.src_tokens)
        return [
            Heatmap(
                f"{what}_tokens",
                f"{what.replace('_', ' ')}: each target word over the source tokens",
                attention,
                words,
                srcs,
                self.row_starts(),
                self.col_starts(),
                "target words",
                "source tokens",
            ),
            Heatmap(
                f"{what}_sentences",
                f"{what.replace('_', ' ')}: each target word over the source sentences",
                sent,
                words,
                [f"src {i + 1}" for i in range(n)],
                self.row_starts(),
                list(range(n)),
                "target words",
                "source sentences",
            ),
        ]

    def target_attention_maps(self, attention: np.ndarray) -> list[Heatmap]:
        """Token and sentence pictures of a self-attention [words, <bos> + target columns]."""
        layout, itos = self.layout, self.codec.tgt_vocab.itos
        cols = ["<bos>"] + [text for toks in layout.tgt_tokens for text, _ in display_tokens([itos[i] for i in toks])]
        n = len(layout.tgt_tokens)
        sent = np.zeros((len(layout.words), n + 1))
        np.add.at(sent.T, layout.tgt_col_sentence + 1, attention.T)
        starts = [1 + int(x) for x in np.concatenate([[0], np.cumsum([len(t) for t in layout.tgt_tokens])[:-1]])]
        title = "global self-attention: each target word over the target tokens before it"
        return [
            Heatmap(
                "global_self_attention_tokens",
                title,
                attention,
                self.target_labels(),
                cols,
                self.row_starts(),
                starts,
                "target words",
                "target tokens (decoder input)",
            ),  # fmt: skip
            Heatmap(
                "global_self_attention_sentences",
                title.replace("tokens", "sentences"),
                sent,
                self.target_labels(),
                ["<bos>"] + [f"tgt {i + 1}" for i in range(n)],
                self.row_starts(),
                list(range(1, n + 1)),
                "target words",
                "target sentences",
            ),  # fmt: skip
        ]

    def target_labels(self) -> list[str]:
        """Row labels: each target word's subword, stripped of joiners."""
        itos = self.codec.tgt_vocab.itos
        return [text for text, _ in display_tokens([itos[w[3]] for w in self.layout.words])]

    def source_labels(self) -> list[str]:
        """Column labels: every source token of the document, markup included."""
        itos = self.codec.src_vocab.itos
        return [text for toks in self.layout.src_tokens for text, _ in display_tokens([itos[i] for i in toks])]

    def row_starts(self) -> list[int]:
        """First row of each target sentence."""
        sentences = [w[2] for w in self.layout.words]
        return [i for i, s in enumerate(sentences) if i == 0 or s != sentences[i - 1]]

    def col_starts(self) -> list[int]:
        """First column of each source sentence."""
        return [int(x) for x in np.concatenate([[0], np.cumsum([len(t) for t in self.layout.src_tokens])[:-1]])]


def _g_transformer(reader: _Reader, capture: analysis.Capture) -> tuple[dict, list[Heatmap], str]:
    """Gates and global attention of the layers that read beyond their sentence: cross-attention
    over the source, self-attention over the earlier target sentences."""
    layout, layers = reader.layout, reader.model.decoder.layers
    n_tgt = len(layout.tgt_col_sentence)
    cross = _global_layers(reader, capture, "cross", [layer.cross_mode for layer in layers], None, reader.n_cols)
    self_ = _global_layers(reader, capture, "self", [layer.self_mode for layer in layers], layout.tgt_columns, n_tgt)
    if not cross and not self_:
        zeros = np.zeros(len(layout.words))
        return {"reliance": zeros}, [], "group attention only (no global layer in the decoder): no layer reads context"
    everything = cross + self_
    measures = {"reliance": np.mean([weight * share for _, weight, share, _ in everything], 0)}
    heatmaps = []
    if cross:
        measures["global weight (cross)"] = np.mean([weight for _, weight, _, _ in cross], 0)
        heatmaps += reader.attention_maps(np.mean([spread for _, _, _, spread in cross], 0), "global_cross_attention")
    if self_:
        measures["global weight (self)"] = np.mean([weight for _, weight, _, _ in self_], 0)
        heatmaps += reader.target_attention_maps(np.mean([spread for _, _, _, spread in self_], 0))
    labels = [name for name, _, _, _ in everything]
    heatmaps.append(
        _columns_map(reader, "global_weight", "global weight 1 − g per layer", [w for _, w, _, _ in everything], labels)
    )
    return measures, heatmaps, RELIANCE["g_transformer"]


def _global_layers(
    reader: _Reader,
    capture: analysis.Capture,
    side: str,
    modes: Sequence[str],
    columns: Optional[np.ndarray],
    n_cols: int,
) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """Per decoder layer with global attention on ``side`` (cross or self): its label, each word's
    global weight (1 − g; 1 for a global-only layer), share on other sentences and attention spread."""
    layout = reader.layout
    attn, gates = iter(capture.get(f"dec_{side}_global")), iter(capture.get(f"gate/dec_{side}"))
    out = []
    for number, mode in enumerate(modes, 1):
        if mode == "group":
            continue
        spread = _spread(next(attn).value, layout, n_cols, columns)
        weight = np.ones(len(layout.words))
        if mode == "combined":
            g = next(gates).value.mean(-1).cpu().numpy()  # [B, T]: weight of the local attention
            weight = np.array([1.0 - g[r, t] for r, t, _, _ in layout.words])
        sentences = None if columns is None else layout.tgt_col_sentence
        out.append((f"{side} {number}", weight, _other_share(spread, layout, sentences), spread))
    return out


def _columns_map(reader: _Reader, key: str, title: str, columns: Sequence[np.ndarray], labels: list[str]) -> Heatmap:
    """Per-word values of several layers (or measures) as one picture: words × layers."""
    values = np.stack(columns, 1) if columns else np.zeros((len(reader.layout.words), 0))
    return Heatmap(
        key, title, values, reader.target_labels(), labels, reader.row_starts(), [], "target words", "layers"
    )


def _cross(reader: _Reader, capture: analysis.Capture) -> tuple[dict, list[Heatmap], str]:
    """A decoder with plain cross-attention: its share on other sentences (0 for a sentence model)."""
    entries = capture.get("dec_cross")
    if not entries:
        return {}, [], ""
    spread = np.mean([_spread(e.value, reader.layout, reader.n_cols) for e in entries], 0)
    return (
        {"reliance": _other_share(spread, reader.layout)},
        reader.attention_maps(spread, "cross_attention"),
        (RELIANCE["cross"]),
    )


def _hm_gdc(reader: _Reader, capture: analysis.Capture) -> tuple[dict, list[Heatmap], str]:
    """HM-GDC: the sentence-level attention of the document encoder, the encoder's context gate
    and the decoder's DocEnc–Decoder attention over the document's words."""
    heatmaps = [_sentence_attention(reader, capture)]
    gate = _encoder_gate(reader, capture)
    if gate is not None:
        heatmaps.append(gate)
    entries = capture.get("dec_doc_context")
    if not entries:
        return {"reliance": np.zeros(len(reader.layout.words))}, heatmaps, "the decoder reads only its own sentence"
    per_layer = len(entries) // len(reader.model.decoder.layers)
    spreads = [_doc_spread(reader, _batch_order(layer, reader.batch.size)) for layer in _per_layer(entries, per_layer)]
    spread = np.mean(spreads, 0)
    heatmaps = reader.attention_maps(spread, "document_attention") + heatmaps
    return {"reliance": _other_share(spread, reader.layout)}, heatmaps, RELIANCE["doc_context"]


def _doc_spread(reader: _Reader, probs: torch.Tensor) -> np.ndarray:
    """DocEnc–Decoder attention [B, T, H, N] over each window's packed words, on the document's columns."""
    batch, layout = reader.batch, reader.layout
    keep = batch.src.ne(PAD_ID)
    packing = plan_packing(batch.doc_index, int(batch.doc_index.max()) + 1, batch.src.size(1), keep)
    slot_col = np.full((packing.docs, packing.slots), -1, dtype=np.int64)
    flat = keep.reshape(-1).nonzero().squeeze(1).cpu().numpy()
    index = packing.index.cpu().numpy()
    slot_col.reshape(-1)[index] = layout.columns.reshape(-1)[flat]
    p = probs.mean(2).cpu().numpy()  # [B, T, N]
    out = np.zeros((len(layout.words), reader.n_cols))
    docs = batch.doc_index.cpu().numpy()
    for i, (r, t, _, _) in enumerate(layout.words):
        cols = slot_col[docs[r], : p.shape[2]]
        real = cols >= 0
        np.add.at(out[i], cols[real], p[r, t, : len(cols)][real])
    return out


def _sentence_attention(reader: _Reader, capture: analysis.Capture) -> Heatmap:
    """eq. 4's attention of every sentence over the sentences of its window (mean over layers, heads)."""
    n = len(reader.layout.src_tokens)
    values = np.zeros((n, n))
    entries = capture.get("doc_sentences")
    if entries:
        probs = torch.stack([e.value for e in entries]).mean((0, 2)).cpu().numpy()  # [G, N, N]
        for g in range(probs.shape[0]):
            members = [r.first for r, d in zip(reader.rows, reader.batch.doc_index.tolist()) if d == g]
            k = len(members)
            values[np.ix_(members, members)] = probs[g, :k, :k]
    labels = [f"src {i + 1}" for i in range(n)]
    return Heatmap(
        "sentence_attention",
        "document encoder: each source sentence over the sentences of its window",
        values,
        labels,
        labels,
        list(range(n)),
        list(range(n)),
        "source sentences",
        "source sentences",
    )


def _encoder_gate(reader: _Reader, capture: analysis.Capture) -> Optional[Heatmap]:
    """The encoder's context gate σ(q·k) of every source token, per head (``context: own_sentence``)."""
    entries = capture.get("gate/enc_context")
    if not entries:
        return None
    gate = _batch_order(entries, reader.batch.size).cpu().numpy()  # [B, S, H]
    cols = reader.layout.columns
    values = np.zeros((reader.n_cols, gate.shape[2]))
    real = cols >= 0
    values[cols[real]] = gate[:, : cols.shape[1]][real]
    labels = reader.source_labels()
    return Heatmap(
        "encoder_gate",
        "document-encoder gate: weight of the document context added to each source token, per head",
        values,
        labels,
        [f"head {h + 1}" for h in range(gate.shape[2])],
        reader.col_starts(),
        [],
        "source tokens",
        "heads",
    )


def _gates(reader: _Reader, out: object) -> tuple[dict, list[Heatmap], list[str]]:
    """The context gates' z (regularized context gates: the weight of the source context) and z*."""
    gates = getattr(out, "aux", {}).get("gates")
    if gates is None:
        return {}, [], []
    z = gates.float().mean(-1).cpu().numpy()  # [L, B, T]
    per_layer = [np.array([z[k, r, t] for r, t, _, _ in reader.layout.words]) for k in range(z.shape[0])]
    measures = {"gate z": np.mean(per_layer, 0)}
    columns, notes = list(per_layer), []
    star = _z_star(reader)
    if isinstance(star, str):
        notes.append(star)
    elif star is not None:
        measures["z*"] = star
        columns.append(star)
    title = "context gate z per layer (weight of the source context)" + (", then z*" if "z*" in measures else "")
    labels = [f"layer {k + 1}" for k in range(len(per_layer))] + (["z*"] if "z*" in measures else [])
    return measures, [_columns_map(reader, "context_gates", title, columns, labels)], notes


def _z_star(reader: _Reader) -> Optional[np.ndarray | str]:
    """z* (eq. 7) of every target word when the checkpoint was trained with PMI supervision and its
    table is at hand; a note saying why not when it is missing; None without supervision."""
    from onmt_doc.data.pmi import PMITable, z_star

    section = next((s for s in reader.translator.cfg.loss if s.type == "pmi_gate_hinge"), None)
    if section is None:
        return None
    if not section.table or not os.path.isfile(section.table):
        return f"z* not shown: the PMI table {section.table} of the training config is not here"
    table = PMITable.load(section.table, reader.codec, section.normaliser)
    src = [np.asarray(s, dtype=np.int64) for s, _ in reader.tok_doc]
    tgt = [np.asarray(t, dtype=np.int64) for _, t in reader.tok_doc]
    per_sentence = z_star(table, src, tgt)
    seen: dict[int, int] = {}
    values = []
    for _, _, sentence, _ in reader.layout.words:
        k = seen.get(sentence, 0)
        seen[sentence] = k + 1
        values.append(float(per_sentence[sentence][k]) if k < len(per_sentence[sentence]) else 0.0)
    return np.array(values)


def read_document(translator: Translator, sources: Sequence[str], targets: Sequence[str]) -> DocumentReading:
    """What ``translator``'s model reads from context while it forces ``targets`` (one per source
    sentence: a reference or its own translation) on the document ``sources``."""
    if len(sources) != len(targets) or not sources:
        raise UserError(
            f"a document to explain needs one target per source sentence ({len(sources)} and {len(targets)})"
        )
    tok_docs, examples = translator.instances([list(zip(sources, targets))])
    reader = _Reader(translator, tok_docs[0], examples)
    capture, out = reader.run()
    cfg = translator.cfg.model
    decoder = cfg.decoder.type
    if decoder == "g_transformer":
        measures, heatmaps, reliance = _g_transformer(reader, capture)
    elif decoder == "doc_context":
        measures, heatmaps, reliance = _hm_gdc(reader, capture)
    else:
        measures, heatmaps, reliance = _cross(reader, capture)
    if "reliance" not in measures:
        if reader.model.unit != "sentence":
            raise UserError(f"decoder {decoder} has no attention over the source to picture (-explain)")
        measures, reliance = {"reliance": np.zeros(len(reader.layout.words))}, RELIANCE["none"]
    gate_measures, gate_maps, notes = _gates(reader, out)
    measures.update(gate_measures)
    heatmaps += gate_maps
    name = f"{cfg.encoder.type} encoder + {decoder} decoder, unit {reader.model.unit}"
    return DocumentReading(name, reliance, _sentences(reader, measures, heatmaps), heatmaps, notes)


def _sentences(reader: _Reader, measures: dict, heatmaps: list[Heatmap]) -> list[SentenceReading]:
    """The document sentence by sentence: tokens, measures, and the mean spread over source sentences."""
    layout = reader.layout
    src_itos, tgt_itos = reader.codec.src_vocab.itos, reader.codec.tgt_vocab.itos
    spread = next((h.values for h in heatmaps if h.key.endswith("_sentences") and "self" not in h.key), None)
    own = next((h.values for h in heatmaps if h.key == "global_self_attention_sentences"), None)
    sentences = []
    for j, (src, _) in enumerate(reader.tok_doc):
        mine = [i for i, w in enumerate(layout.words) if w[2] == j]
        target = display_tokens([tgt_itos[layout.words[i][3]] for i in mine])
        values = {name: [float(v[i]) for i in mine] for name, v in measures.items()}
        context = spread[mine].mean(0).tolist() if spread is not None and mine else []
        target_context = own[mine].mean(0)[1:].tolist() if own is not None and mine else []  # without <bos>
        source = display_tokens([src_itos[int(i)] for i in src])
        sentences.append(SentenceReading(source, target, values, context, target_context))
    return sentences


def add_pcxmi(
    reading: DocumentReading, translator: Translator, sources: Sequence[str], references: Sequence[str]
) -> None:
    """Add each reference token's P-CXMI (``evaluation/cxmi.py``: log q(y | x, context) − log q(y | x))
    to a reading of the references, as the measure ``P-CXMI``."""
    from onmt_doc.data.vocab import EOS_ID
    from onmt_doc.evaluation.cxmi import score_documents

    for sentence, scored in zip(reading.sentences, score_documents(translator, [list(zip(sources, references))])):
        words = [v for t, v in zip(scored.tokens, scored.pointwise) if t not in (SOS_ID, EOS_SENT_ID, EOS_ID)]
        if len(words) != len(sentence.target):  # not the same tokens: say so rather than misalign
            reading.notes.append(f"P-CXMI not shown for sentence {scored.index + 1}: its tokens differ")
            continue
        sentence.measures["P-CXMI"] = [float(v) for v in words]
