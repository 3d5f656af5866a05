"""``pytest``: run a selection of the test suite on the machine of the run (on a GPU machine the
device-parametrized tests, ``-m devices``, run on CUDA) and record counts and failures from
pytest's JUnit XML, not from its console output."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from benchmarks.suite.stage import StageContext, stage


@dataclass
class PytestParams:
    args: list = field(default_factory=lambda: ["-m", "devices"])  # pytest arguments (selection)
    max_failures_listed: int = 20


@stage("pytest", PytestParams)
def pytest_run(p: PytestParams, ctx: StageContext) -> None:
    """One pytest run; a record with the counts, one per failing test; the stage fails with the tests."""
    xml = os.path.join(ctx.work_dir(), "junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *p.args]
    ctx.log(" ".join(cmd))
    timeout = max(ctx.seconds_left() - 5, 10)
    try:
        rc = subprocess.run(cmd, cwd=ctx.repo, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if not os.path.exists(xml):
        raise RuntimeError(f"pytest wrote no report (exit {rc})")
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    ctx.record(device=ctx.device, selection=" ".join(p.args), exit=rc, seconds=float(suite.get("time", 0)), **counts)
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
    for case in failed[: p.max_failures_listed]:
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        message = (problem.get("message") or "").splitlines()[0][:200] if problem is not None else ""
        ctx.record(failed=f"{case.get('classname')}::{case.get('name')}", message=message)
    if rc != 0:
        raise RuntimeError(f"pytest exit {rc}: {counts['failures']} failures, {counts['errors']} errors")
