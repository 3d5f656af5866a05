"""Issue 14, translator side: nothing lost, nothing stalled when translating.

Random-weight d=32 models (tests/model_helpers.py) stand in for trained ones: what is tested is the
bookkeeping around decoding (files, lines, documents, limits), not translation quality.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import module_cmd, run_cli
from model_helpers import random_model

from onmt_doc.config import config_from_dict, config_to_dict
from onmt_doc.contracts import LengthLimit
from onmt_doc.data.corpus import iter_lines, iter_parallel
from onmt_doc.data.line_splitting import piece_spans
from onmt_doc.data.mapped import build_instances
from onmt_doc.data.vocab import EOS_ID, EOS_SENT_ID, SOS_ID
from onmt_doc.errors import ConfigError, DataError
from onmt_doc.models.checkpoint import save_checkpoint
from onmt_doc.translate.search import Hypothesis
from onmt_doc.translate.translator import EMPTY_FILL, Translator

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

TRANSLATE = module_cmd("onmt_doc.bin.translate")
LAYERS = {"layers": 1, "heads": 4, "ff": 64}
TRANSFORMER = {"encoder": {"type": "transformer", **LAYERS}, "decoder": {"type": "transformer", **LAYERS}}
HM_GDC = {"encoder": {"type": "hierarchical", **LAYERS, "doc_layers": 1}, "decoder": {"type": "doc_context", **LAYERS}}
G_TRANSFORMER = {
    "encoder": {"type": "g_transformer", "layers": 2, "heads": 4, "ff": 64, "global_layers": 1},
    "decoder": {"type": "g_transformer", "layers": 2, "heads": 4, "ff": 64, "global_layers": 1},
}
DECODERS = {
    "transformer": TRANSFORMER,
    "hm_gdc": HM_GDC,
    "g_transformer": G_TRANSFORMER,
    "gated": {
        "encoder": TRANSFORMER["encoder"],
        "decoder": {"type": "gated_transformer", "layers": 2, "heads": 4, "ff": 64},
    },
    "mhplstm": {"encoder": TRANSFORMER["encoder"], "decoder": {"type": "mhplstm", "layers": 2, "heads": 4, "ff": 64}},
    "reformer": {"encoder": {"type": "embedding"}, "decoder": {"type": "reformer", "layers": 2, "heads": 4, "ff": 64}},
}
DOC_MODELS = ("transformer", "hm_gdc", "g_transformer")


def translator(model_section: dict, end_bias: float = 0.0, **sections) -> Translator:
    """A random model; ``end_bias`` > 0 makes it eager to end sentences and outputs at once."""
    model, codec = random_model(model_section)
    with torch.no_grad():
        model.generator.bias[[EOS_SENT_ID, EOS_ID]] += end_bias
    return Translator(model, codec, config_from_dict(sections))


def save_random(path: Path, model_section: dict, **sections) -> Path:
    """A checkpoint of a random model, as onmt_doc_translate reads it."""
    model, codec = random_model(model_section)
    cfg = config_from_dict(
        {"model": {"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, **model_section}, **sections}
    )
    save_checkpoint({"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict()}, str(path))
    return path


def sentences(n: int, seed: int = 0, words: tuple[int, int] = (3, 8)) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(40)}" for _ in range(rng.randint(*words))) for _ in range(n)]


def one_line_error(proc, *needles: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return save_random(tmp_path_factory.mktemp("ckpt") / "model.pt", TRANSFORMER, translate={"beam": 2})


# ---------------------------------------------------------------- output files


def test_output_that_is_an_input_is_refused(ckpt, tmp_path):
    src, ref = tmp_path / "in.src", tmp_path / "in.ref"
    src.write_text("w1 w2\nw3\n")
    ref.write_text("w4 w5\nw6\n")
    link = tmp_path / "link.txt"
    link.symlink_to(src)
    model_bytes = ckpt.read_bytes()
    for flags, output, named in (
        (["-src", str(src)], src, "-src"),
        (["-src", str(src), "-tgt", str(ref)], ref, "-tgt"),
        (["-src", str(src)], ckpt, "-model"),
        (["-src", str(src)], link, "-src"),
    ):
        proc = run_cli(*TRANSLATE, "-model", str(ckpt), *flags, "-output", str(output))
        one_line_error(proc, str(output), named)
    assert src.read_text() == "w1 w2\nw3\n" and ref.read_text() == "w4 w5\nw6\n"
    assert ckpt.read_bytes() == model_bytes


# standard input and output are files too (issue 42): every spelling of "the input is the output"
STDIO_SAME = [
    ("src-stdin-output-file", ["-src", "-", "-output", "{src}"], "<", "-output"),
    ("src-dev-fd-0-output-file", ["-src", "/dev/fd/0", "-output", "{src}"], "<", "standard input"),
    ("output-stdout-appended-to-src", ["-src", "{src}"], ">>", "standard output"),
    ("dev-stdout-appended-to-src", ["-src", "{src}", "-output", "/dev/stdout"], ">>", "standard output"),
    ("stream-appended-to-src", ["-src", "{src}", "-stream"], ">>", "standard output"),
    ("stream-stdin-appended-to-itself", ["-src", "-", "-stream"], "<>>", "standard input"),
]


@pytest.mark.parametrize("flags,redirect,named", [c[1:] for c in STDIO_SAME], ids=[c[0] for c in STDIO_SAME])
def test_standard_input_or_output_that_is_the_input_file_is_refused(ckpt, tmp_path, flags, redirect, named):
    """``-src - -output in.src < in.src`` replaced in.src with its own translation (exit 0), and
    ``-stream -src in.src >> in.src`` read its own translations back for ever: the descriptors are
    compared with the paths by device and inode, as the paths are with each other."""
    src = tmp_path / "in.src"
    src.write_text("w1 w2\nw3\n\nw4\n")
    argv = [*TRANSLATE, "-model", str(ckpt), *(a.replace("{src}", str(src)) for a in flags)]
    with open(src, "rb") as stdin, open(src, "ab") as stdout:
        proc = subprocess.run(
            argv,
            stdin=stdin if "<" in redirect else subprocess.DEVNULL,
            stdout=stdout if ">>" in redirect else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    one_line_error(proc, "writing it would destroy the input", named)
    assert src.read_text() == "w1 w2\nw3\n\nw4\n"


def test_standard_input_from_another_file_is_translated(ckpt, tmp_path):
    """The rule compares files, not spellings: ``-src - < a -output b`` (and a terminal or pipe on
    both sides) still works."""
    src, out = tmp_path / "in.src", tmp_path / "out.txt"
    src.write_text("w1 w2\nw3\n")
    with open(src, "rb") as stdin:
        proc = subprocess.run([*TRANSLATE, "-model", str(ckpt), "-src", "-", "-output", str(out)], stdin=stdin,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 2


def test_failed_run_leaves_existing_output_untouched(ckpt, tmp_path):
    src = tmp_path / "in.src"
    src.write_bytes(b"w1 w2\nw3\n\xff\xfe broken\n")
    out = tmp_path / "out.txt"
    out.write_text("an earlier translation\n")
    one_line_error(run_cli(*TRANSLATE, "-model", str(ckpt), "-src", str(src), "-output", str(out)), "in.src:3", "UTF-8")
    assert out.read_text() == "an earlier translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.src", "out.txt"]  # no temporary left


# ---------------------------------------------------------------- lines and documents


def test_line_ends_other_than_lf_and_crlf_are_refused(ckpt, tmp_path):
    cr = tmp_path / "cr.src"
    cr.write_bytes(b"w1 w2\rw3\rw4 w5\rw6\rw7\rw8\r")  # six sentences, old Mac line ends
    out = tmp_path / "out.txt"
    one_line_error(run_cli(*TRANSLATE, "-model", str(ckpt), "-src", str(cr), "-output", str(out)), "cr.src:1", "CR")
    assert not out.exists()
    for char in ("\u2028", "\u2029", "\x85", "\x0b", "\x0c"):  # the same rule for training data
        path = tmp_path / "other.src"
        path.write_text(f"w1 w2\nw3{char}w4\n", encoding="utf-8")
        with pytest.raises(DataError, match="other.src:2: column 3"):
            list(iter_lines(str(path)))
    crlf = tmp_path / "crlf.src"
    crlf.write_bytes(b"w1 w2\r\nw3\r\n\r\nw4\r\n")
    assert list(iter_lines(str(crlf))) == ["w1 w2", "w3", "", "w4"]


def test_whitespace_only_line_is_a_document_break_and_is_reported(ckpt, tmp_path):
    src = tmp_path / "ws.src"
    src.write_text("w1 w2\nw3\n\u00a0\nw4 w5\n\u3000 \nw6\n", encoding="utf-8")
    assert [None if d is None else len(d) for d in iter_parallel(str(src), None)] == [2, None, 1, None, 1]
    out = tmp_path / "out.txt"
    proc = run_cli(*TRANSLATE, "-model", str(ckpt), "-src", str(src), "-output", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert [line == "" for line in lines] == [False, False, True, False, True, False]
    assert "ws.src: 2 line(s) hold only whitespace (first: line 3)" in proc.stderr


# ---------------------------------------------------------------- what an output line can be


@pytest.mark.parametrize("name", list(DECODERS))
def test_non_empty_source_never_gives_an_empty_line(name):
    """A model that would rather end at once (</s>, <eos> strongly favoured) still writes a word."""
    t = translator(DECODERS[name], end_bias=30.0, translate={"beam": 3})
    docs = [sentences(5, seed=1), sentences(3, seed=2)]
    out = t.translate_documents(docs)
    assert [len(d) for d in out] == [5, 3]
    assert all(line.strip() and line != EMPTY_FILL for d in out for line in d), out
    assert t.stats.empty_filled == 0


@pytest.mark.parametrize("name", DOC_MODELS)
def test_n_best_has_one_format_for_every_model(name):
    """One line per input line with exactly n_best tab-separated, non-empty hypotheses."""
    t = translator(DECODERS[name], translate={"beam": 3, "n_best": 3})
    out = t.translate_documents([sentences(4, seed=3), sentences(1, seed=4)])
    assert [len(d) for d in out] == [4, 1]
    for line in (line for d in out for line in d):
        fields = line.split("\t")
        assert len(fields) == 3 and all(f.strip() for f in fields), line


def test_repaired_sentence_counts_are_counted_and_never_empty():
    """A document hypothesis with too few or too many sentences is padded/merged, and counted."""
    t = translator(G_TRANSFORMER)
    w = [10, 11, 12]
    one_sentence = Hypothesis([SOS_ID, w[0], EOS_SENT_ID], 0.0, 0.0)
    lines = t._hypothesis_lines([one_sentence], 3)
    assert t.stats.docs_repaired == 1 and t.stats.empty_filled == 2
    assert [line[0][0] for line in lines][1:] == [EMPTY_FILL, EMPTY_FILL]  # (text, score) fields
    four = Hypothesis([s for i in w + w[:1] for s in (SOS_ID, i, EOS_SENT_ID)], 0.0, 0.0)
    assert len(t._hypothesis_lines([four], 3)) == 3 and t.stats.docs_repaired == 2


# ---------------------------------------------------------------- bounded work


def test_absolute_output_cap():
    assert LengthLimit(1.5, 10, 250)(torch.tensor([4, 10_000])).tolist() == [16, 250]
    assert LengthLimit(0.01, 0, 250)(torch.tensor([3])).tolist() == [1]  # never below one word


def test_long_line_is_split_at_word_boundaries_and_bounded():
    joiner = "\uffed"
    tokens = ["a", "b" + joiner, "c", "d" + joiner, "e", "f"]
    assert piece_spans(tokens, 4, sentencepiece=False) == [(0, 3), (3, 6)]  # not inside "d￭e"
    assert piece_spans(["\u2581a", "b", "c", "\u2581d", "e"], 4, sentencepiece=True) == [(0, 3), (3, 5)]
    t = translator(TRANSFORMER, translate={"beam": 2, "max_input_tokens": 50, "max_length": 8})
    line = " ".join(sentences(1, words=(1000, 1000))[0].split())
    out = t.translate_documents([[line, "w1 w2"]])[0]
    assert len(out) == 2 and all(out) and t.stats.lines_split == 1
    assert 20 <= len(out[0].split()) <= 20 * 7  # 20 pieces of at most max_length - 1 words


def test_long_documents_are_translated_in_windows():
    """HM-GDC with data.max_sentences 0 (trained on whole documents) still translates a long
    document in windows of data.max_tokens; translate.window_sentences overrides; one line per
    input line comes back in order."""
    doc = sentences(120, seed=5)
    t = translator(HM_GDC, data={"max_tokens": 64}, translate={"beam": 2})
    tok_docs, _ = t._encode([[(s, None) for s in doc]], with_target=False)
    windows = t._instances(tok_docs)
    assert len(windows) > 10 and max(len(w.src) for w in windows) <= 64
    assert [w.first for w in windows] == sorted(w.first for w in windows)
    assert sum(w.n_sents for w in windows) == 120
    assert [w.n_sents for w in translator(HM_GDC, translate={"window_sentences": 7})._instances(tok_docs)][:2] == [7, 7]
    training, _ = build_instances("context", tok_docs, 64)  # training: unchanged
    assert len(training) == 1 and training[0].n_sents == 120
    out = t.translate_documents([doc])[0]
    assert len(out) == 120 and all(out)


def test_bad_limits_are_refused(ckpt, tmp_path):
    src = tmp_path / "in.src"
    src.write_text("w1 " * 40 + "\n")
    for flag, value in (
        ("-batch_size", "-3"),
        ("-length_penalty", "-50"),
        ("-max_length", "0"),
        ("-max_input_tokens", "0"),
    ):
        one_line_error(run_cli(*TRANSLATE, "-model", str(ckpt), "-src", str(src), flag, value), flag)
    one_line_error(
        run_cli(*TRANSLATE, "-model", str(ckpt), "-src", str(src), "-max_line_chars", "10"),
        "in.src:1",
        "max_line_chars=10",
    )
    for key, value in (("length_penalty", -50), ("batch_sentences", -3), ("max_length", 0)):
        with pytest.raises(ConfigError, match=f"translate.{key}"):
            config_from_dict({"translate": {key: value}})
