"""The numbers behind the context pictures (evaluation/context_reading.py), on small random models:
attention rows sum to one, the pictures have the document's shape, a sentence model's context
reliance is exactly zero, capturing changes nothing the model computes, and tensors a part runs
in length buckets come back to their own rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_helpers import random_model

from onmt_doc.config import config_from_dict
from onmt_doc.evaluation.context_reading import display_tokens, read_document
from onmt_doc.modules import analysis
from onmt_doc.modules.attention import MultiHeadAttention, attention_probs
from onmt_doc.modules.document_packing import attend_documents_rows, document_memory
from onmt_doc.translate.translator import Translator

LAYERS = {"layers": 2, "heads": 4, "ff": 64}
MODELS = {
    "transformer": ({"encoder": {"type": "transformer", **LAYERS}, "decoder": {"type": "transformer", **LAYERS}}, {}),
    "k_to_1": (
        {"unit": "k_to_1", "encoder": {"type": "transformer", **LAYERS}, "decoder": {"type": "transformer", **LAYERS}},
        {"context_sentences": 1},
    ),
    "k_to_k": (
        {"unit": "k_to_k", "encoder": {"type": "transformer", **LAYERS}, "decoder": {"type": "transformer", **LAYERS}},
        {"context_sentences": 2},
    ),
    "g_transformer": (
        {
            "encoder": {"type": "g_transformer", **LAYERS, "global_layers": 1},
            "decoder": {"type": "g_transformer", **LAYERS, "global_layers": 1, "global_cross_layers": 1},
        },
        {},
    ),
    "hm_gdc": (
        {"encoder": {"type": "hierarchical", **LAYERS, "doc_layers": 1}, "decoder": {"type": "doc_context", **LAYERS}},
        {},
    ),
    "gated": (
        {"encoder": {"type": "transformer", **LAYERS}, "decoder": {"type": "gated_transformer", **LAYERS}},
        {},
    ),
}
# three sentences of different lengths, in an order that is not sorted by length (length buckets reorder them)
SOURCES = ["w1 w2 w3 w4", "w5", "w6 w7 w8"]
TARGETS = ["w10 w11", "w12 w13 w14 w15", "w16"]


def translator(name: str) -> Translator:
    section, data = MODELS[name]
    model, codec = random_model(section, seed=1)
    cfg = config_from_dict(
        {"model": {"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, **section}, "data": data}
    )
    return Translator(model, codec, cfg)


@pytest.mark.parametrize("name", list(MODELS))
def test_attention_rows_sum_to_one_and_pictures_have_the_documents_shape(name):
    reading = read_document(translator(name), SOURCES, TARGETS)
    words = sum(len(t.split()) for t in TARGETS)  # the toy codec: one token a word
    columns = sum(len(s.split()) + 2 for s in SOURCES)  # every source token with its <s> … </s>
    word_starts = [0, 2, 6]
    maps = {h.key: h for h in reading.heatmaps}
    attention = [h for h in reading.heatmaps if h.key.endswith("_tokens")]
    assert attention, sorted(maps)
    for h in attention:
        if "self" in h.key:  # the G-Transformer's global self-attention: <bos>, then the target tokens
            assert h.values.shape == (words, 1 + sum(len(t.split()) + 2 for t in TARGETS))
            assert h.col_starts == [1, 5, 11] and h.cols[:2] == ["<bos>", "<s>"]
            # causal: a word sees the decoder inputs up to its own (w12: <bos> <s> w10 w11 </s> <s>)
            assert h.values[0, 2:].sum() == 0 and h.values[2, 6:].sum() == 0 and h.values[2, 5] > 0
        else:
            assert h.values.shape == (words, columns) and h.col_starts == [0, 6, 9]
        np.testing.assert_allclose(h.values.sum(1), 1.0, atol=1e-5)
        assert h.row_starts == word_starts and len(h.rows) == words and len(h.cols) == h.values.shape[1]
    for h in reading.heatmaps:
        if h.key.endswith("_sentences"):
            assert h.values.shape == (words, len(SOURCES) + ("self" in h.key))
            np.testing.assert_allclose(h.values.sum(1), 1.0, atol=1e-5)
    if name == "hm_gdc":
        assert maps["sentence_attention"].values.shape == (3, 3)
        np.testing.assert_allclose(maps["sentence_attention"].values.sum(1), 1.0, atol=1e-5)
        assert maps["encoder_gate"].values.shape == (columns, 4)
    assert [len(s.target) for s in reading.sentences] == [2, 4, 1]
    assert all(len(v) == len(s.target) for s in reading.sentences for v in s.measures.values())


@pytest.mark.parametrize("name", ["transformer", "gated"])
def test_a_sentence_models_context_reliance_is_exactly_zero(name):
    reading = read_document(translator(name), SOURCES, TARGETS)
    reliance = reading.measure("reliance")
    assert len(reliance) == 7 and np.all(reliance == 0.0)
    for s, j in zip(reading.sentences, range(3)):  # all its attention is on its own sentence
        assert s.context == pytest.approx([1.0 if k == j else 0.0 for k in range(3)], abs=1e-6)
    if name == "gated":
        assert np.all((reading.measure("gate z") > 0) & (reading.measure("gate z") < 1))


@pytest.mark.parametrize("name", ["k_to_1", "k_to_k", "g_transformer", "hm_gdc"])
def test_a_document_models_later_sentences_read_context(name):
    reading = read_document(translator(name), SOURCES, TARGETS)
    per_sentence = [np.array(s.measures["reliance"]) for s in reading.sentences]
    assert np.all(per_sentence[1] > 0.01) and np.all(per_sentence[2] > 0.01)
    assert np.all(np.concatenate(per_sentence) <= 1.0)
    if name.startswith("k_to"):  # the first sentence has no context in its instance
        assert np.all(per_sentence[0] == 0.0)


@pytest.mark.parametrize("name", list(MODELS))
def test_capturing_changes_nothing_the_model_computes(name):
    from onmt_doc.data.batching import collate

    t = translator(name)
    _, examples = t.instances([list(zip(SOURCES, TARGETS))])
    batch = collate(examples)
    names = {layer.cross_attn: "dec_cross" for layer in t.model.decoder.layers if hasattr(layer, "cross_attn")}
    with torch.no_grad():
        plain = t.model(batch).logits
        with analysis.capturing(names) as capture:
            captured = t.model(batch).logits
    assert capture.tensors  # it did capture
    torch.testing.assert_close(captured, plain, rtol=1e-5, atol=1e-5)


def test_captured_document_attention_comes_back_to_its_rows():
    """Rows of two buckets attend to their documents' packed memory; the capture, put back with
    its rows, equals each row's attention computed on its own."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, 0.0, self_attention=False).eval()
    memory = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    doc = document_memory(attn, memory, pad)
    hs = [torch.randn(2, 3, 16), torch.randn(1, 4, 16)]
    row_docs = [torch.tensor([1, 0]), torch.tensor([1])]
    keeps = [torch.tensor([[True, True, False], [True, True, True]]), torch.ones(1, 4, dtype=torch.bool)]
    rows = [torch.tensor([2, 0]), torch.tensor([1])]
    with analysis.capturing() as capture:
        attend_documents_rows(attn, hs, row_docs, doc, keeps, "probe", rows=rows)
    got = capture.get("probe")
    assert [c.rows.tolist() for c in got] == [[2, 0], [1]]
    for c, h, d, keep in zip(got, hs, row_docs, keeps):
        for r in range(h.size(0)):
            q = attn.project_q(h[r : r + 1])  # [1, H, T, d]
            want = attention_probs(q, doc.kv[0][d[r] : d[r] + 1], doc.mask[d[r] : d[r] + 1])[0].transpose(0, 1)
            want = want * keep[r][:, None, None]
            torch.testing.assert_close(c.value[r], want, rtol=1e-5, atol=1e-6)


def test_a_sentences_encoder_gate_does_not_depend_on_its_row():
    """HM-GDC's encoder gate of a word reads only the word (own_sentence, eqs. 5-6), so a sentence
    gets the same gate in two documents where its row and length bucket differ."""
    t = translator("hm_gdc")
    first = {h.key: h for h in read_document(t, SOURCES, TARGETS).heatmaps}["encoder_gate"]
    moved = {h.key: h for h in read_document(t, [SOURCES[2], "w9 w9 w9 w9 w9", SOURCES[0]], TARGETS).heatmaps}
    gate = moved["encoder_gate"]
    # SOURCES[0] is the first sentence (columns 0-5) of the first document and the last of the second
    np.testing.assert_allclose(gate.values[gate.row_starts[2] :], first.values[:6], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gate.values[: gate.row_starts[1]], first.values[9:], rtol=1e-5, atol=1e-6)


def test_display_tokens_put_spaces_where_the_words_are():
    assert display_tokens(["der", "hund", "l￭", "ief", "￭."]) == [
        ("der", False),
        ("hund", True),
        ("l", True),
        ("ief", False),
        (".", False),
    ]
    assert display_tokens(["▁der", "▁hu", "nd"]) == [("der", False), ("hu", True), ("nd", False)]


def test_context_gates_show_z_star_when_the_pmi_table_is_at_hand(tmp_path):
    from onmt_doc.data.pmi import count_table, vocab_digest, z_star

    section, data = MODELS["gated"]
    model, codec = random_model(section, seed=1)
    docs = [list(zip(codec.encode(SOURCES, "src"), codec.encode(TARGETS, "tgt")))]
    pairs = [(s.astype("int64"), t.astype("int64")) for s, t in docs[0]] * 3
    table = count_table(iter(pairs), len(codec.src_vocab), len(codec.tgt_vocab), vocab_digest(codec))
    table.save(str(tmp_path / "pmi"))
    loss = [{"type": "label_smoothed_ce"}, {"type": "pmi_gate_hinge", "table": str(tmp_path / "pmi")}]
    model_cfg = {"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, **section}
    t = Translator(model, codec, config_from_dict({"model": model_cfg, "loss": loss}))
    reading = read_document(t, SOURCES, TARGETS)
    want = np.concatenate(z_star(table, [s for s, _ in pairs[:3]], [t for _, t in pairs[:3]]))
    np.testing.assert_array_equal(reading.measure("z*"), want)
    assert {h.key: h for h in reading.heatmaps}["context_gates"].cols == ["layer 1", "layer 2", "z*"]
    (tmp_path / "pmi").unlink()
    missing = read_document(t, SOURCES, TARGETS)
    assert "z*" not in missing.sentences[0].measures and "PMI table" in missing.notes[0]
