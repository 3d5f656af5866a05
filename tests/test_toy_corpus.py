"""Tests for the synthetic document-level toy corpus (onmt_doc.toy.corpus).

The context rule is re-derived here from the reference text only (the gender
is read off the first word of the previous target sentence), so a bug in the
generator cannot hide behind the same bug in the test.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from onmt_doc.errors import DataError
from onmt_doc.toy.corpus import write_corpus
from onmt_doc.toy.pronoun_scoring import score_context

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOL = REPO_ROOT / "tools" / "make_toy_corpus.py"
SPLITS = ("train", "valid", "test")

# Independent copy of the target-side rule: determiner -> gender -> pronoun.
DET_GENDER = {"der": "m", "ein": "m", "die": "f", "eine": "f", "das": "n", "eins": "n"}
SUBJ_PRONOUN = {"m": "er", "f": "sie", "n": "es"}
OBJ_PRONOUN = {"m": "ihn", "f": "sie", "n": "es"}
PRONOUNS = {"er", "sie", "es", "ihn"}


def read(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1] if text else []


def read_ctx(path: Path) -> list[tuple[int, int, str]]:
    out = []
    for line in read(path):
        a, b, c = line.split("\t")
        out.append((int(a), int(b), c))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("toy")
    write_corpus(out)
    return out


def test_files_and_sizes(corpus: Path) -> None:
    for split in SPLITS:
        for ext in ("src", "tgt", "ctx"):
            assert (corpus / f"{split}.{ext}").is_file()
    sizes = {s: sum(1 for line in read(corpus / f"{s}.src") if line) for s in SPLITS}
    assert 15000 <= sizes["train"] <= 20000
    assert 400 <= sizes["valid"] <= 600
    assert 400 <= sizes["test"] <= 600


def test_deterministic(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_corpus(a, seed=3, train_docs=300, valid_docs=20, test_docs=20)
    write_corpus(b, seed=3, train_docs=300, valid_docs=20, test_docs=20)
    write_corpus(c, seed=4, train_docs=300, valid_docs=20, test_docs=20)
    for split in SPLITS:
        for ext in ("src", "tgt", "ctx"):
            name = f"{split}.{ext}"
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "train.src").read_bytes() != (c / "train.src").read_bytes()


def test_splits_are_independent_of_other_split_sizes(tmp_path: Path) -> None:
    write_corpus(tmp_path / "a", train_docs=100, valid_docs=10, test_docs=10)
    write_corpus(tmp_path / "b", train_docs=50, valid_docs=10, test_docs=10)
    for ext in ("src", "tgt", "ctx"):
        name = f"test.{ext}"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_alignment_and_document_layout(corpus: Path) -> None:
    for split in SPLITS:
        src, tgt = read(corpus / f"{split}.src"), read(corpus / f"{split}.tgt")
        assert len(src) == len(tgt)
        assert src[0] and src[-1] and tgt[0] and tgt[-1]
        for s, t in zip(src, tgt):
            assert (s == "") == (t == "")
            if s:
                assert s == s.strip().lower() and "  " not in s
                assert 3 <= len(s.split()) <= 12
                assert len(s.split()) == len(t.split())
                assert s.endswith(" .") and t.endswith(" .")
        # exactly one blank line between documents; documents of 1-6 sentences
        doc_lens = [len(d.split("\n")) for d in "\n".join(src).split("\n\n")]
        assert "" not in "\n".join(src).split("\n\n")
        assert min(doc_lens) >= 1 and max(doc_lens) <= 6


def test_vocabulary_size(corpus: Path) -> None:
    vocab = {w for line in read(corpus / "train.src") for w in line.split()}
    assert 60 <= len(vocab) <= 150


def test_ctx_entries_point_at_pronouns(corpus: Path) -> None:
    for split in SPLITS:
        src, tgt = read(corpus / f"{split}.src"), read(corpus / f"{split}.tgt")
        ctx = read_ctx(corpus / f"{split}.ctx")
        positions = set()
        for line_no, idx, word in ctx:
            assert tgt[line_no - 1].split()[idx] == word
            assert src[line_no - 1].split()[idx] == "it"
            assert word in PRONOUNS
            positions.add((line_no, idx))
        # ...and every pronoun in src/tgt is listed (no untracked occurrences)
        for n, (s, t) in enumerate(zip(src, tgt), start=1):
            for i, w in enumerate(s.split()):
                assert (w == "it") == ((n, i) in positions)
            for i, w in enumerate(t.split()):
                assert (w in PRONOUNS) == ((n, i) in positions)


def test_context_rule_from_previous_subject(corpus: Path) -> None:
    for split in SPLITS:
        tgt = read(corpus / f"{split}.tgt")
        for line_no, idx, word in read_ctx(corpus / f"{split}.ctx"):
            assert line_no >= 2, "pronoun in first line"
            prev = tgt[line_no - 2]
            assert prev, "pronoun in the first sentence of a document"
            gender = DET_GENDER[prev.split()[0]]  # previous subject is a noun
            expected = (SUBJ_PRONOUN if idx == 0 else OBJ_PRONOUN)[gender]
            assert word == expected


def test_pronoun_rate_and_balance(corpus: Path) -> None:
    tgt = read(corpus / "train.tgt")
    ctx = read_ctx(corpus / "train.ctx")
    non_first = sum(1 for i, line in enumerate(tgt) if line and i > 0 and tgt[i - 1])
    with_pronoun = len({line_no for line_no, _, _ in ctx})
    assert 0.25 <= with_pronoun / non_first <= 0.40
    # antecedent genders roughly balanced
    subj = Counter(w for _, i, w in ctx if i == 0)
    for form in ("er", "sie", "es"):
        assert 0.25 <= subj[form] / sum(subj.values()) <= 0.42


def test_pronoun_not_predictable_from_sentence(corpus: Path) -> None:
    src = read(corpus / "train.src")
    by_sentence: dict[str, Counter[str]] = defaultdict(Counter)
    for line_no, idx, word in read_ctx(corpus / "train.ctx"):
        by_sentence[src[line_no - 1]][word] += 1
    frequent = {s: c for s, c in by_sentence.items() if sum(c.values()) >= 10}
    assert len(frequent) >= 5
    # the same source sentence gets different pronouns in different documents
    assert all(len(c) >= 2 for c in frequent.values())
    assert any(len(c) == 3 for c in frequent.values())
    # best possible sentence-level guess (majority per sentence) stays near 1/3
    majority = sum(c.most_common(1)[0][1] for c in frequent.values())
    total = sum(sum(c.values()) for c in frequent.values())
    assert majority / total < 0.55


def test_score_reference_and_constant_hypothesis(corpus: Path, tmp_path: Path) -> None:
    for split in ("train", "test"):
        ctx = corpus / f"{split}.ctx"
        ref = corpus / f"{split}.tgt"
        assert score_context(ref, ctx)["accuracy"] == 1.0
        const = tmp_path / f"{split}.const"
        const.write_text(
            re.sub(r"\b(er|sie|ihn)\b", "es", ref.read_text(encoding="utf-8")),
            encoding="utf-8",
        )
        res = score_context(const, ctx)
        assert res["total"] == len(read(ctx))
        low, high = (0.30, 0.37) if split == "train" else (0.18, 0.50)
        assert low <= res["accuracy"] <= high


def test_score_length_mismatch_rule(corpus: Path, tmp_path: Path) -> None:
    ctx = corpus / "test.ctx"
    ref = read(corpus / "test.tgt")
    entries = read_ctx(ctx)
    (l1, _, _), (l2, _, w2) = entries[0], entries[1]
    hyp = list(ref)
    hyp[l1 - 1] = "extra " + ref[l1 - 1]  # shifted but unambiguous: correct
    other = "ihn" if w2 != "ihn" else "er"
    hyp[l2 - 1] = ref[l2 - 1] + f" {other}"  # expected form in place, but a competitor
    path = tmp_path / "hyp"
    path.write_text("\n".join(hyp) + "\n", encoding="utf-8")
    res = score_context(path, ctx)
    assert (res["total"], res["correct"]) == (len(entries), len(entries) - 1)


def test_score_rejects_wrong_line_count(corpus: Path, tmp_path: Path) -> None:
    hyp = tmp_path / "short"
    hyp.write_text("\n".join(read(corpus / "test.tgt")[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="short"):
        score_context(hyp, corpus / "test.ctx")


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_generate_and_score(tmp_path: Path) -> None:
    out = tmp_path / "c"
    proc = run_tool("--out", str(out), "--train-docs", "50", "--valid-docs", "5", "--test-docs", "30")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1 and "train" in proc.stdout
    proc = run_tool("score", "--hyp", str(out / "test.tgt"), "--ctx", str(out / "test.ctx"))
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"context accuracy: 100\.0% \((\d+)/\1\)\n", proc.stdout)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    for args in (
        ("score", "--hyp", str(tmp_path / "missing"), "--ctx", str(tmp_path / "x.ctx")),
        ("--out", str(tmp_path), "--train-docs", "-1"),
        ("score",),
    ):
        proc = run_tool(*args)
        assert proc.returncode == 1
        assert proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1
        assert "Traceback" not in proc.stderr


def test_console_script_and_tools_wrapper_are_one_command(tmp_path: Path) -> None:
    """`onmt_doc_make_toy_corpus` (installed) and `python tools/make_toy_corpus.py` write the same files."""
    import shutil

    script = shutil.which("onmt_doc_make_toy_corpus")
    assert script is not None, "console script not installed: pip install -e ."
    sizes = ("--train-docs", "20", "--valid-docs", "3", "--test-docs", "5")
    via_script = subprocess.run(
        [script, "--out", str(tmp_path / "a"), *sizes], capture_output=True, text=True, timeout=60
    )
    assert via_script.returncode == 0, via_script.stderr
    assert run_tool("--out", str(tmp_path / "b"), *sizes).returncode == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir()) and "train.src" in names
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
