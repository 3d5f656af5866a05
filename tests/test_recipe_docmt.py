"""recipes/docmt-en-de/run.py's command line: one-line refusals before any work. The whole recipe runs
at toy size in CI through the GPU spec's smoke (benchmarks/specs/gpu.yaml, stage ``documents``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "recipes" / "docmt-en-de" / "run.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_a_data_folder_without_the_sets_is_one_line(tmp_path):
    r = run("--data", str(tmp_path), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: --data {tmp_path}: docmt-en-de/ted.dev.en not found (see ../shared/data/README.md)"
    ]
    assert not (tmp_path / "out").exists()


def test_an_output_folder_holding_other_files_is_refused(tmp_path):
    data = tmp_path / "data"
    for rel in ("docmt-en-de/ted.dev.en", "multi30k-en-de/train.en", "news-sent-en-de/newstest2008-2013.en"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text("x\n", encoding="utf-8")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n", encoding="utf-8")
    r = run("--data", str(data), "--out", str(out))
    assert r.returncode == 2 and "holds files this recipe did not write" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_budget_or_size_out_of_range_is_one_line(tmp_path):
    for flag, value, says in (
        ("--minutes", "0", "must be in (0, 10080]"),
        ("--minutes", "-5", "must be in (0, 10080]"),
        ("--minutes", "nan", "must be in (0, 10080]"),
        ("--minutes", "1e9", "must be in (0, 10080]"),
        ("--test_sentences", "-1", "must be 0 (all) or more"),
    ):
        r = run("--data", str(tmp_path), "--out", str(tmp_path / "out"), flag, value)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        shown = float(value) if flag == "--minutes" else value
        assert r.stderr.strip().splitlines() == [f"error: {flag} {shown}: {says}"]
        assert not (tmp_path / "out").exists()
