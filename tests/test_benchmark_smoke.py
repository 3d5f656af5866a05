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
