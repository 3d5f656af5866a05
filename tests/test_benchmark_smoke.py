"""Every spec of benchmarks/specs end to end at toy size (``--smoke``, on the toy stand-ins of the
data sets), as CI's guard that the suite still runs: a stage whose library call changed fails here,
not on the day a GPU is lent. One interpreter runs every spec (``--in-process``), each test then
reads one spec's results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.suite.spec import all_specs

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

REPO = Path(__file__).resolve().parents[1]
SPECS = [os.path.basename(p) for p in all_specs()]


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("smoke")
    cmd = [sys.executable, "-m", "benchmarks", "run", *SPECS, "--smoke", "--device", "cpu", "--in-process"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd + ["--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    return out, done


@pytest.mark.parametrize("spec", SPECS)
def test_every_spec_runs_end_to_end_at_smoke_size(smoke_runs, spec):
    out, done = smoke_runs
    results = out / spec.removesuffix(".yaml") / "results.jsonl"
    assert results.exists(), done.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    status = {r["stage"]: r["status"] for r in rows if "status" in r}
    errors = [r["error"] for r in rows if "error" in r]
    assert status and set(status.values()) == {"ok"} and not errors, (status, errors, done.stderr[-3000:])
    assert len(rows) > len(status)  # every stage recorded something besides its status


def test_the_recipe_scores_every_system_before_any_ablation(smoke_runs):
    """recipes/docmt-en-de evaluates in phases (the GPU spec's ``documents`` stage runs it): every
    system's test BLEU comes before any system's context ablation, so a run its budget cuts off still
    has the main table whole (system by system, the G-Transformer's ablation outlasted the budget of
    the systems after it)."""
    out, done = smoke_runs
    rows = [json.loads(line) for line in (out / "gpu" / "results.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("stage") == "documents"]
    scored = [i for i, r in enumerate(rows) if "s_bleu_ci" in r and "domain" in r]
    ablated = [i for i, r in enumerate(rows) if "nll_per_word" in r]
    systems = {r["system"] for r in rows if "s_bleu_ci" in r and "domain" in r}
    assert systems == {"sentence", "sentence_ft", "g_transformer", "hm_gdc", "k_to_1", "k_to_k"}, done.stderr[-2000:]
    assert ablated and max(scored) < min(ablated)
