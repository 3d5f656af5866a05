"""Issue 15, part 1: the Python API (``from onmt_doc import Translator``) called directly.

A tiny trained Transformer (conftest's ``trained_run``) and a random-weight G-Transformer (a
document model) are translated through the API and through ``onmt_doc_translate``: the API must
give what the command writes, in the shape it was given.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import module_cmd, run_cli
from model_helpers import random_model

from onmt_doc import Translator
from onmt_doc.config import config_from_dict, config_to_dict
from onmt_doc.data.corpus import iter_lines
from onmt_doc.data.vocab import EOS_ID, EOS_SENT_ID
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.models.checkpoint import save_checkpoint

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

TRANSLATE = module_cmd("onmt_doc.bin.translate")
G_TRANSFORMER = {
    "encoder": {"type": "g_transformer", "layers": 2, "heads": 4, "ff": 64, "global_layers": 1},
    "decoder": {"type": "g_transformer", "layers": 2, "heads": 4, "ff": 64, "global_layers": 1},
}


def read_documents(path: Path, limit: int) -> list[list[str]]:
    """The first ``limit`` documents of a document file (blank lines separate them)."""
    docs: list[list[str]] = [[]]
    for line in iter_lines(str(path)):
        if line.strip():
            docs[-1].append(line.strip())
        elif docs[-1]:
            if len(docs) == limit:
                break
            docs.append([])
    return [d for d in docs if d][:limit]


def write_documents(docs: list[list[str]], path: Path) -> Path:
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    return path


def output_documents(path: Path, n_docs: int) -> list[list[str]]:
    """A translated document file split back into documents (blank lines kept by the command)."""
    docs = [block.split("\n") for block in path.read_text(encoding="utf-8").rstrip("\n").split("\n\n")]
    assert len(docs) == n_docs
    return docs


@pytest.fixture(scope="module")
def ckpt(trained_run) -> Path:
    return trained_run / "checkpoints" / "last.pt"


@pytest.fixture(scope="module")
def docs(toy_dir) -> list[list[str]]:
    return read_documents(toy_dir / "test.src", 4)


@pytest.fixture(scope="module")
def g_ckpt(tmp_path_factory) -> Path:
    """A random-weight G-Transformer checkpoint eager to end its sentences (short outputs)."""
    model, codec = random_model(G_TRANSFORMER)
    with torch.no_grad():
        model.generator.bias[[EOS_SENT_ID, EOS_ID]] += 4.0
    cfg = config_from_dict(
        {
            "model": {"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, **G_TRANSFORMER},
            "translate": {"beam": 2, "max_length": 12},
        }
    )
    path = tmp_path_factory.mktemp("g") / "g.pt"
    save_checkpoint({"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict()}, str(path))
    return path


G_DOCS = [["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"], ["w10 w11"], ["w12 w13 w14", "w15 w16 w17"]]


def test_public_import_is_lazy_and_the_class():
    from onmt_doc.translate.translator import Translator as Direct

    assert Translator is Direct
    code = "import sys, onmt_doc; print(onmt_doc.__version__); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False"  # ``import onmt_doc`` stays cheap


def test_translate_equals_the_command(ckpt, docs, tmp_path):
    src = write_documents(docs, tmp_path / "in.txt")
    proc = run_cli(*TRANSLATE, "-model", str(ckpt), "-src", str(src), "-output", str(tmp_path / "out.txt"))
    assert proc.returncode == 0, proc.stderr
    got = Translator.load(ckpt, device="cpu").translate(docs)
    assert got == output_documents(tmp_path / "out.txt", len(docs))
    assert [len(d) for d in got] == [len(d) for d in docs]
    assert all(isinstance(s, str) and s for d in got for s in d)


def test_the_metrics_file_holds_the_counts_and_the_scores_the_log_prints(ckpt, docs, tmp_path):
    import json

    from onmt_doc.evaluation.corpus_metrics import report

    src = write_documents(docs, tmp_path / "in.txt")
    ref = write_documents([[s.upper() for s in d] for d in docs], tmp_path / "ref.txt")
    out, metrics = tmp_path / "out.txt", tmp_path / "metrics.json"
    args = ("-model", str(ckpt), "-src", str(src), "-tgt", str(ref), "-output", str(out), "-metrics_file")
    proc = run_cli(*TRANSLATE, *args, str(metrics))
    assert proc.returncode == 0, proc.stderr
    m = json.loads(metrics.read_text())
    hyps = output_documents(out, len(docs))
    assert m["sentences"] == sum(map(len, docs)) and m["documents"] >= len(docs)
    expected = report(hyps, [[s.upper() for s in d] for d in docs], "d_bleu" in m)
    assert {k: round(m[k], 6) for k in expected} == {k: round(v, 6) for k, v in expected.items()}
    assert m["seconds"] > 0 and m["sent_per_s"] > 0 and m["empty_filled"] == 0
    same = run_cli(*TRANSLATE, *args, str(src))
    assert same.returncode == 1 and "-metrics_file" in same.stderr and "Traceback" not in same.stderr


def test_document_model_translate_equals_the_command(g_ckpt, tmp_path):
    src = write_documents(G_DOCS, tmp_path / "in.txt")
    proc = run_cli(*TRANSLATE, "-model", str(g_ckpt), "-src", str(src), "-output", str(tmp_path / "out.txt"))
    assert proc.returncode == 0, proc.stderr
    translator = Translator.load(str(g_ckpt), device="cpu")
    assert translator.model.unit == "document"
    assert translator.translate(G_DOCS) == output_documents(tmp_path / "out.txt", len(G_DOCS))


def test_shape_is_kept(ckpt, docs):
    translator = Translator.load(ckpt, device="cpu", beam=2)
    shaped = [docs[0][:1], [], docs[1], docs[2][:2]]
    out = translator.translate(shaped)
    assert [len(d) for d in out] == [1, 0, len(docs[1]), 2]
    assert translator.translate([]) == []
    # each document on its own gives the same sentences: no output moves between documents
    assert [translator.translate([d])[0] if d else [] for d in shaped] == out


def test_nbest_count_order_and_command(ckpt, docs, tmp_path):
    translator = Translator.load(ckpt, device="cpu", beam=4, n_best=3)
    nbest = translator.nbest(docs)
    assert [len(d) for d in nbest] == [len(d) for d in docs]
    for doc in nbest:
        for fields in doc:
            assert len(fields) == 3
            scores = [score for _, score in fields]
            assert all(math.isfinite(s) and s <= 0 for s in scores)
            assert scores == sorted(scores, reverse=True)  # best first
    # the best of the n-best is the 1-best of the same beam
    assert [[f[0][0] for f in d] for d in nbest] == Translator.load(ckpt, device="cpu", beam=4).translate(docs)
    src = write_documents(docs, tmp_path / "in.txt")
    out = tmp_path / "out.txt"
    proc = run_cli(*TRANSLATE, "-model", str(ckpt), "-src", str(src), "-output", str(out), "-beam", "4", "-n_best", "3")
    assert proc.returncode == 0, proc.stderr
    lines = [line.split("\t") for d in output_documents(out, len(docs)) for line in d]
    assert lines == [[text for text, _ in fields] for d in nbest for fields in d]


def test_score_equals_the_command(ckpt, docs, toy_dir, tmp_path):
    refs = read_documents(toy_dir / "test.tgt", 4)
    assert [len(d) for d in refs] == [len(d) for d in docs]
    scores = Translator.load(ckpt, device="cpu").score(docs, refs)
    assert [len(d) for d in scores] == [len(d) for d in docs]
    src, tgt = write_documents(docs, tmp_path / "in.src"), write_documents(refs, tmp_path / "in.tgt")
    out = tmp_path / "scores.txt"
    proc = run_cli(*TRANSLATE, "-model", str(ckpt), "-src", str(src), "-tgt", str(tgt), "-score", "-output", str(out))
    assert proc.returncode == 0, proc.stderr
    printed = [[float(x) for x in d] for d in output_documents(out, len(docs))]
    assert [[round(x, 4) for x in d] for d in scores] == printed
    assert all(x < 0 for d in scores for x in d)


def test_nbest_score_is_the_forced_decoding_score(ckpt, docs):
    """Without a length penalty a hypothesis' score is its log-probability: forced decoding of the
    same text (an independent path: teacher forcing, not the beam) gives the same number."""
    translator = Translator.load(ckpt, device="cpu", beam=3, length_penalty_type="none")
    nbest = translator.nbest(docs[:2])
    hyps = [[fields[0][0] for fields in d] for d in nbest]
    forced = translator.score(docs[:2], hyps)
    for doc, scores in zip(nbest, forced):
        for fields, score in zip(doc, scores):
            assert fields[0][1] == pytest.approx(score, abs=1e-3)


def test_unknown_option_names_the_closest(ckpt):
    with pytest.raises(ConfigError, match=r"unknown translate option 'bean'.*'beam'"):
        Translator.load(ckpt, device="cpu", bean=4)


@pytest.mark.parametrize(
    ("options", "needle"),
    [({"beam": 0}, "beam"), ({"beam": 2, "n_best": 3}, "n_best"), ({"dtype": "float8"}, "dtype")],
)
def test_bad_option_values_are_one_line_errors(ckpt, options, needle):
    with pytest.raises(ConfigError) as info:
        Translator.load(ckpt, device="cpu", **options)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_missing_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="nope.pt"):
        Translator.load(tmp_path / "nope.pt", device="cpu")


@pytest.mark.parametrize(
    ("documents", "needle"),
    [
        ("one string", "expected a list of documents"),
        (["a sentence", "another"], "documents[0]: expected a document"),
        ([["ok"], [3]], "documents[1][0]: expected a sentence (str), got int"),
        ([["ok", "  "]], "documents[0][1]: empty sentence"),
        ([["two\nlines"]], "documents[0][0]: holds a line break"),
        (None, "expected a list of documents"),
    ],
)
def test_bad_document_shapes(ckpt, documents, needle):
    translator = Translator.load(ckpt, device="cpu")
    for call in (translator.translate, translator.nbest):
        with pytest.raises(UserError) as info:
            call(documents)
        assert needle in str(info.value)


def test_score_needs_aligned_references(ckpt, docs):
    translator = Translator.load(ckpt, device="cpu")
    with pytest.raises(UserError, match="one reference sentence per source sentence"):
        translator.score(docs[:1], [docs[0][:-1]])
    with pytest.raises(UserError, match="references"):
        translator.score(docs[:1], "not documents")
