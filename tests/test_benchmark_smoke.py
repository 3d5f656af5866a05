"""Every spec of benchmarks/specs end to end at toy size (``--smoke``), as CI's guard that the suite
still runs: a stage whose library call changed fails here, not on the day a GPU is lent."""

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


@pytest.mark.parametrize("spec", [os.path.basename(p) for p in all_specs()])
def test_every_spec_runs_end_to_end_at_smoke_size(spec, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "benchmarks", "run", spec, "--smoke", "--device", "cpu", "--in-process"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd + ["--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    status = {r["stage"]: r["status"] for r in rows if "status" in r}
    assert done.returncode == 0 and set(status.values()) == {"ok"}, (status, done.stderr[-3000:])
    assert len(rows) > len(status)  # every stage recorded something besides its status
