"""Context passed with a request (``Translator.nbest(..., context=...)``), the streaming translator
(``translate_stream``, ``onmt_doc_translate -stream``) and the server's ``"context"``.

Random-weight models of every unit (no training: the claims hold for any weights), biased to end
their sentences early so that outputs end by themselves, not at the length cap."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
import torch
from conftest import module_cmd
from model_helpers import random_model

from onmt_doc.config import config_from_dict
from onmt_doc.config.loading import config_to_dict
from onmt_doc.data.vocab import EOS_ID, EOS_SENT_ID
from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import save_checkpoint
from onmt_doc.translate.translator import Translator

LAYER = {"layers": 1, "heads": 4, "ff": 64}
TRANSFORMER = {"encoder": {"type": "transformer", **LAYER}, "decoder": {"type": "transformer", **LAYER}}
MODELS = {
    "sentence": TRANSFORMER,
    "k_to_1": {"unit": "k_to_1", **TRANSFORMER},
    "k_to_k": {"unit": "k_to_k", **TRANSFORMER},
    "g_transformer": {
        "encoder": {"type": "g_transformer", **LAYER, "layers": 2, "global_layers": 1},
        "decoder": {"type": "g_transformer", **LAYER, "layers": 2, "global_layers": 1},
    },
    "hm_gdc": {
        "encoder": {"type": "hierarchical", **LAYER, "doc_layers": 1},
        "decoder": {"type": "doc_context", **LAYER},
    },
}
SIDES = {
    "sentence": (),
    "k_to_1": ("src",),
    "k_to_k": ("src", "tgt"),
    "g_transformer": ("src", "tgt"),
    "hm_gdc": ("src",),
}
DOC = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9", "w10 w11", "w12 w13 w14", "w15 w16"]


def make(name: str, **translate) -> Translator:
    """A random model of unit ``name`` (k = 2 context sentences, 64-token document windows):
    greedy, no length penalty (a score is then a log-probability)."""
    section = MODELS[name]
    model, codec = random_model(section, seed=1)
    with torch.no_grad():
        model.generator.bias[[EOS_SENT_ID, EOS_ID]] += 6.0  # sentences end by themselves
    cfg = config_from_dict(
        {
            "data": {"documents": True, "context_sentences": 2, "max_tokens": 64},
            "model": {"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, **section},
            "translate": {"beam": 1, "max_length": 40, "length_penalty_type": "none", **translate},
        }
    )
    return Translator(model, codec, cfg)


def streamed(t: Translator, doc: list[str]) -> list[str]:
    """``doc`` translated a sentence at a time, each with the earlier sentences and the model's
    own translations of them as context."""
    out: list[str] = []
    for i, sentence in enumerate(doc):
        out += t.translate([[sentence]], context=[list(zip(doc[:i], out))])[0]
    return out


@pytest.mark.parametrize("name", ["sentence", "k_to_1", "k_to_k"])
def test_sentence_by_sentence_with_own_outputs_is_the_whole_document_translation(name):
    """Where a sentence's translation reads only the sentences before it (k_to_k forcing its own
    earlier translations, ``force_context_prefix``, as context targets are), translating a
    document line by line with its own outputs as context gives the whole-document translation."""
    t = make(name, force_context_prefix=True)
    whole = t.translate([DOC])[0]
    assert streamed(t, DOC) == whole
    assert list(t.translate_stream(DOC)) == whole  # the streaming translator is the same thing
    assert t.context_sides() == SIDES[name]


@pytest.mark.parametrize("name", list(MODELS))
def test_new_sentence_score_is_the_forced_score_of_the_document_with_the_given_context(name):
    """With a person's edited targets as context, the new sentence's hypothesis score (the tokens
    generated after the forced prefix only) equals forced decoding (``score``, teacher forcing: an
    independent path) of that sentence in the document of context + new sentence, and ``score``
    with the same context gives the same number."""
    t = make(name)
    edited = ["w30 w31", "w32", "w33 w34 w35"]  # not what the model would write
    context = [list(zip(DOC[:3], edited))]
    (text, score), *_ = t.nbest([[DOC[3]]], context=context)[0][0]
    whole = t.score([DOC[:4]], [edited + [text]])[0]
    assert score == pytest.approx(whole[3], abs=1e-4)
    assert t.score([[DOC[3]]], [[text]], context=context)[0] == pytest.approx([whole[3]], abs=1e-4)


@pytest.mark.parametrize("name", ["g_transformer", "k_to_k"])
def test_given_context_targets_are_forced_and_change_what_follows(name):
    """A unit reading context targets decodes after them: forcing different targets gives the
    scores of different documents (each equal to forced decoding of its own document)."""
    t = make(name)
    one, two = ["w30 w31", "w32"], ["w5 w6 w7", "w8"]
    scores = []
    for edited in (one, two):
        (text, score), *_ = t.nbest([[DOC[2]]], context=[list(zip(DOC[:2], edited))])[0][0]
        assert score == pytest.approx(t.score([DOC[:3]], [edited + [text]])[0][2], abs=1e-4)
        scores.append(score)
    assert scores[0] != scores[1]


@pytest.mark.parametrize("name", list(MODELS))
def test_context_beyond_the_models_window_changes_nothing(name):
    """The model's own window of the context is used: k_to_1/k_to_k their k = 2 last sentences,
    the G-Transformer what fits its 64-token instance with the new sentence, HM-GDC its window;
    a longer context gives the same translation as that tail."""
    t = make(name)
    long = [f"w{i % 40} w{(i * 7) % 40} w{(i * 3) % 40}" for i in range(30)]
    context = list(zip(long, long[::-1]))
    full = t.nbest([[DOC[0]]], context=[context])[0]
    kept = {"sentence": 0, "k_to_1": 2, "k_to_k": 2, "g_transformer": 11, "hm_gdc": 11}[name]
    tail = t.nbest([[DOC[0]]], context=[context[len(context) - kept :]])[0] if kept else t.nbest([[DOC[0]]])[0]
    assert full == tail


def test_a_sentence_model_ignores_the_context():
    t = make("sentence")
    assert t.nbest([DOC[:2]], context=[list(zip(DOC[2:4], DOC[4:6]))]) == t.nbest([DOC[:2]])


def test_source_only_context_skips_the_context_sentences_own_translation():
    """k_to_1 with context: only the new sentences are searched (one row each), not the context's."""
    t = make("k_to_1")
    rows = []
    search = t.search.search
    t.search.search = lambda model, batch, **kw: rows.append(batch.size) or search(model, batch, **kw)
    t.translate([DOC[3:5]], context=[DOC[:3]])
    assert sum(rows) == 2


@pytest.mark.parametrize(
    "context,needle",
    [
        ([], r"context: 0 lists for 1 documents"),
        ("w1", r"context: expected one list"),
        ([["w1", ""]], r"context\[0\]\[1\]: empty sentence"),
        ([[["w1", "w2", "w3"]]], r"context\[0\]\[0\]: expected a source sentence or a \[source, target\] pair"),
        ([[["w1", "a\nb"]]], r"context\[0\]\[0\]\[1\]: holds a line break"),
        ([[[None, "w2"]]], r"context\[0\]\[0\]\[0\]: expected a sentence"),
    ],
)
def test_bad_context_is_a_one_line_error_naming_the_entry(context, needle):
    with pytest.raises(UserError, match=needle):
        make("k_to_1").translate([["w1"]], context=context)


def test_scoring_with_context_targets_needs_them():
    with pytest.raises(UserError, match=r"context\[0\]\[1\]: no target; scoring with a k_to_k model"):
        make("k_to_k").score([["w1"]], [["w2"]], context=[[("w3", "w4"), "w5"]])
    # a model reading only the context's sources scores without its targets
    assert len(make("k_to_1").score([["w1"]], [["w2"]], context=[["w3", "w5"]])[0]) == 1


# ------------------------------------------------------------------------------ -stream


@pytest.fixture(scope="module")
def k_to_k_checkpoint(tmp_path_factory):
    t = make("k_to_k")
    path = tmp_path_factory.mktemp("stream") / "k_to_k.pt"
    payload = {"config": config_to_dict(t.cfg), "codec": t.codec.to_dict(), "model": t.model.state_dict()}
    save_checkpoint(payload, str(path))
    return path


def test_stream_writes_each_line_before_the_next_is_read(k_to_k_checkpoint):
    """Lines are sent through a pipe one at a time; each translation is read back before the next
    line is written (a translator reading ahead, or writing only at a document's end, would block
    here until the timeout). A blank line starts a new document: the context is reset."""
    proc = subprocess.Popen(
        [*module_cmd("onmt_doc.bin.translate"), "-model", str(k_to_k_checkpoint), "-src", "-", "-stream"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = DOC[:3] + [""] + DOC[:2]
    got = []
    try:
        for line in lines:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            got.append(_readline(proc, timeout=60))
        proc.stdin.close()
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        proc.kill()
    t = make("k_to_k")
    first = streamed(t, DOC[:3])
    assert got == first + [""] + first[:2]  # after the blank line, the same as a fresh document
    assert "latency per line" in proc.stderr.read()


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """One line of the process's output, failing (not hanging) after ``timeout`` seconds."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            return proc.stdout.readline().rstrip("\n")
        if proc.poll() is not None:
            break
    raise AssertionError(f"no output line within {timeout}s: {proc.stderr.read() if proc.poll() is not None else ''}")


@pytest.mark.parametrize("flags", [["-tgt", "x"], ["-score", "-tgt", "x"], ["-output", "out.txt"]])
def test_stream_refuses_what_it_cannot_do(k_to_k_checkpoint, tmp_path, monkeypatch, capsys, flags):
    from onmt_doc.bin.translate import main

    monkeypatch.chdir(tmp_path)
    assert main(["-model", str(k_to_k_checkpoint), "-src", "-", "-stream", *flags]) == 1
    err = capsys.readouterr().err
    assert "-stream writes its translations to standard output" in err
    assert "Traceback" not in err and not (tmp_path / "out.txt").exists()


# ------------------------------------------------------------------------------ the server


def _app(name: str):
    pytest.importorskip("flask", reason="the server extra (pip install -e .[server])")
    from onmt_doc.serve.app import Limits, ServedModel, ServerState, create_app
    from onmt_doc.serve.batcher import Batcher

    t = make(name)
    batcher = Batcher(t, batch_tokens=2048, batch_wait_ms=0.0, name=name)
    state = ServerState({name: ServedModel(name, ["m.pt"], t, batcher)}, name, Limits(max_context_sentences=4))
    return create_app(state).test_client(), t, batcher


@pytest.mark.parametrize("name", ["g_transformer", "sentence"])
def test_server_with_context_equals_the_api(name):
    client, t, batcher = _app(name)
    try:
        context = [["w30 w31", "w32"], "w5 w6"]
        body = {"document": DOC[2:4], "context": context, "scores": True}
        r = client.post("/translate", json=body)
        assert r.status_code == 200, r.get_json()
        reply = r.get_json()
        expected = t.nbest([DOC[2:4]], context=[[tuple(context[0]), context[1]]])[0]
        assert reply["translation"] == [fields[0][0] for fields in expected]
        assert reply["scores"] == pytest.approx([fields[0][1] for fields in expected], abs=1e-5)
        assert reply["context_used"] == {"g_transformer": "source+target", "sentence": "none"}[name]
        # several documents, one context each; a request without context says nothing of it
        r = client.post("/translate", json={"documents": [DOC[:1], DOC[1:2]], "context": [[], ["w7"]]})
        assert r.get_json()["translations"] == t.translate([DOC[:1], DOC[1:2]], context=[[], ["w7"]])
        assert "context_used" not in client.post("/translate", json={"document": DOC[:1]}).get_json()
    finally:
        batcher.stop()


@pytest.mark.parametrize(
    "body,status,needle",
    [
        ({"document": ["w1"], "context": ["w2"] * 5}, 413, r"context: 5 sentences; the limit is 4 .*-max_context_"),
        ({"documents": [["w1"]], "context": [["w2", ""]]}, 400, r"context\[0\]\[1\]: empty sentence"),
        ({"documents": [["w1"]], "context": []}, 400, r"context: 0 lists for 1 documents"),
        ({"document": ["w1"], "context": [["w2", "w" * 3000]]}, 413, r"context\[0\]: 3000 characters"),
    ],
)
def test_server_context_mistakes(body, status, needle):
    client, _, batcher = _app("k_to_1")
    try:
        r = client.post("/translate", json=body)
        assert r.status_code == status and re.search(needle, r.get_json()["error"]), r.get_json()
    finally:
        batcher.stop()
