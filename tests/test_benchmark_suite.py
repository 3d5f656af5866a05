"""The benchmark suite's own machinery (benchmarks/suite): spec checking, the runner's stage
processes and result files, the report. The stages themselves run end to end in CI through
``python -m benchmarks run SPEC --smoke``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.suite import report
from benchmarks.suite.spec import Table, all_specs, load_spec
from onmt_doc.errors import ConfigError

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

REPO = Path(__file__).resolve().parents[1]


def write_spec(path: Path, stages: str, systems: str = "") -> Path:
    path.write_text(
        "title: t\nsection: Test section\ndevice: cpu\nbudget_seconds: 120\n" + systems + "stages:\n" + stages,
        encoding="utf-8",
    )
    return path


ENV_OK = """  - name: first
    type: environment
    budget_seconds: 60
    params: {packages: [json], matmul_size: 16, matmul_dtypes: [float32], repeats: 1}
"""
ENV_MISSING = """  - name: broken
    type: environment
    budget_seconds: 60
    params: {packages: [no_such_package_xyz], matmul_dtypes: []}
"""


def test_every_spec_of_the_repository_loads():
    names = [Path(p).name for p in all_specs()]
    assert "gpu.yaml" in names
    for path in all_specs():
        spec = load_spec(path)
        assert spec.stages, path


@pytest.mark.parametrize(
    "stages, systems, message",
    [
        ("  - {type: environment, budget: 3}\n", "", "stages[0]: unknown key 'budget'"),
        ("  - {type: enviroment}\n", "", "unknown benchmark stage type 'enviroment' (did you mean 'environment'?)"),
        ("  - {type: environment, params: {packages: json}}\n", "", "stages[0].params.packages: expected list"),
        ("  - {type: environment, smoke: {repeats: x}}\n", "", "stages[0].smoke.repeats: expected int"),
        ("  - {type: amp, params: {system: nope}}\n", "", "params.system: unknown system 'nope'"),
        ("  - {type: environment}\n  - {type: environment}\n", "", "stage name 'environment' is used twice"),
        ("  - {type: environment}\n", "systems:\n  s: {config: config_examples/none.yaml}\n", "no such file"),
    ],
)
def test_spec_mistakes_are_one_line_errors_naming_the_file_and_key(tmp_path, stages, systems, message):
    path = write_spec(tmp_path / "bad.yaml", stages, systems)
    with pytest.raises(ConfigError) as e:
        load_spec(str(path))
    assert str(path) in str(e.value) and message in str(e.value)


def run_suite(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
    )


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_stage_run(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """One run of a spec whose first stage fails and whose second works (shared: each run costs
    interpreters; the tests below only add records of their own)."""
    tmp = tmp_path_factory.mktemp("suite")
    spec = write_spec(tmp / "s.yaml", ENV_MISSING + ENV_OK)
    return spec, tmp / "out", run_suite("run", str(spec), "--out", str(tmp / "out"))


def test_a_failing_stage_is_recorded_and_the_next_one_still_runs(two_stage_run):
    spec, out, done = two_stage_run
    assert done.returncode == 1, done.stderr
    rows = records(out)
    status = {r["stage"]: r["status"] for r in rows if "status" in r}
    assert status == {"broken": "failed", "first": "ok"}
    assert any("no_such_package_xyz" in r.get("error", "") for r in rows if r["stage"] == "broken")
    assert any(r.get("check") == "matmul_peak" and r["tflops"] > 0 for r in rows if r["stage"] == "first")
    run = json.loads((out / "run.json").read_text())
    assert run["device"] == "cpu" and run["command"].startswith("python -m benchmarks run")


def test_running_some_stages_again_replaces_only_their_records(two_stage_run):
    spec, out, _ = two_stage_run
    before = [r for r in records(out) if r["stage"] == "broken"]
    done = run_suite("run", str(spec), "--out", str(out), "--stages", "first")
    assert done.returncode == 0, done.stderr
    after = records(out)
    assert [r for r in after if r["stage"] == "broken"] == before
    assert sum(1 for r in after if r["stage"] == "first" and "status" in r) == 1
    bad = run_suite("run", str(spec), "--out", str(out), "--stages", "frist")
    assert bad.returncode == 2 and "no stage 'frist'" in bad.stderr and "Traceback" not in bad.stderr


def test_tables_keep_the_records_they_are_declared_for():
    rows = [
        {"stage": "s", "system": "a", "steps": 10, "loss": 1.23456},
        {"stage": "s", "system": "a", "domain": "ted", "s_bleu": 30.0},
        {"stage": "s", "system": "b", "error": "OOM"},
    ]
    text = report.table(rows, Table(columns=["system", "steps", "loss"], needs=["steps"], title="Training"))
    assert text.splitlines() == ["**Training**", "", "| system | steps | loss |", "|---|---|---|", "| a | 10 | 1.23 |"]
    assert "ted" in report.table(rows, Table(columns=["system", "domain", "s_bleu"], where={"system": "a"}))
    assert report.table(rows, Table(columns=["system", "error"], needs=["error"])).splitlines()[2:] == ["| b | OOM |"]
    assert report.table(rows, Table(needs=["nothing"])) == ""


def test_report_rewrites_only_its_own_section(two_stage_run, tmp_path):
    spec, out, _ = two_stage_run
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# B\n\n## Before\n\nkeep 1\n\n## Test section\n\nold numbers\n\n## After\n\nkeep 2\n")
    done = run_suite("report", str(spec), "--out", str(out), "--docs", str(docs))
    assert done.returncode == 0, done.stderr
    text = docs.read_text()
    assert "old numbers" not in text and "keep 1" in text and "keep 2" in text
    assert text.index("## Before") < text.index("## Test section") < text.index("## After")
    assert "Stage `environment`: ok" in text and "Command: `python -m benchmarks run" in text


def test_a_folder_named_like_a_stage_that_the_suite_did_not_make_is_never_removed(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", ENV_OK)
    out = tmp_path / "home"
    (out / "first").mkdir(parents=True)
    (out / "first" / "thesis.tex").write_text("years of work")
    done = run_suite("run", str(spec), "--out", str(out))
    assert done.returncode == 2 and "was not made by the benchmark suite" in done.stderr, done.stderr
    assert (out / "first" / "thesis.tex").read_text() == "years of work"
    assert not (out / "run.json").exists()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_runner_writes_only_into_folders_it_made(tmp_path):
    """Issue 42: ``--out`` wrote run.json and results.jsonl into any folder: ``.``, docs,
    benchmarks/specs, the committed H100 records (``--out benchmarks/results/gpu``), a folder holding
    a user's own run.json. It now takes a new or empty folder or one it made (``.benchmark-run``),
    inside the repository only under runs/, and refuses the rest before anything runs."""
    spec = write_spec(tmp_path / "s.yaml", ENV_OK)
    user = tmp_path / "mine"
    user.mkdir()
    (user / "run.json").write_text('{"my": "own run"}')
    (tmp_path / "afile").write_text("x")
    for out, message in (
        (REPO / "docs", "a folder of the repository (docs)"),
        (REPO / "benchmarks" / "specs", "a folder of the repository (benchmarks/specs)"),
        (REPO / "benchmarks" / "results" / "gpu", "a folder of the repository (benchmarks/results/gpu)"),
        (REPO, "a folder of the repository (.)"),
        (REPO / "runs", "a folder of the repository (runs)"),
        (user, "holds files (run.json…) and was not made by the benchmark suite"),
        (tmp_path / "afile", "exists and is not a folder"),
    ):
        before = _tree(out) if out.is_dir() and out not in (REPO, REPO / "runs") else None  # runs/: maybe large
        done = run_suite("run", str(spec), "--out", str(out))
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert before is None or _tree(out) == before
    assert not (REPO / "run.json").exists() and not (REPO / "results.jsonl").exists()
    several = run_suite("run", str(spec), str(spec), "--out", str(user))  # several specs: the parent too
    assert several.returncode == 2 and "was not made by the benchmark suite" in several.stderr, several.stderr
    assert _tree(user) == {"run.json": b'{"my": "own run"}'}


def test_a_relative_out_is_the_callers_folder_and_a_rerun_reuses_it(tmp_path):
    """``--out rel`` from outside the repository: the stages' processes (run from the repository)
    used to write under the repository's rel/ while run.json went to the caller's; a re-run into a
    folder the suite made is accepted."""
    spec = write_spec(tmp_path / "s.yaml", ENV_OK)
    cmd = [sys.executable, "-m", "benchmarks", "run", "s.yaml", "--out", "rel"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for _ in range(2):
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "rel" / ".benchmark-run").exists() and not (REPO / "rel").exists()
    status = [r for r in records(tmp_path / "rel") if "status" in r]
    assert [r["status"] for r in status] == ["ok"], status  # the re-run replaced the first run's record
    assert spec.exists()


@pytest.mark.parametrize(
    "text,message",
    [("[" * 100_000, "nested too deeply to be a spec"), (b"title: \xff\n", "not valid UTF-8"), (None, "larger than")],
    ids=["nested", "invalid-utf8", "dev-zero"],
)
def test_a_spec_is_read_as_strictly_as_a_config(tmp_path, text, message):
    path = tmp_path / "s.yaml"
    if text is None:
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=message):
        load_spec(str(path))


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie no reaper collected counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_stopped_runner_stops_its_running_stage_and_says_so(tmp_path, signum):
    """`timeout` (SIGTERM) or Ctrl-C (SIGINT) on `python -m benchmarks run`: the running stage, in a
    session of its own, is stopped with everything it started, and results.jsonl marks it
    interrupted; before, the stage ran on (on a lent GPU machine, after its call had ended)."""
    import signal
    import time

    started = tmp_path / "stage.pid"
    (tmp_path / "test_sleeping.py").write_text(
        f"import os, time\n\ndef test_sleeps():\n    open({str(started)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(120)\n",
        encoding="utf-8",
    )
    spec = write_spec(
        tmp_path / "spec.yaml",
        f"  - name: long\n    type: pytest\n    budget_seconds: 100\n"
        f"    params: {{args: [-p, no:cacheprovider, {tmp_path / 'test_sleeping.py'}]}}\n",
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "benchmarks", "run", str(spec), "--out", str(out)]
    runner = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if started.exists() and started.read_text():
                break
            time.sleep(0.1)
        stage_pid = int(started.read_text())
        runner.send_signal(getattr(signal, signum))
        _, err = runner.communicate(timeout=30)
    finally:
        runner.kill()
    assert runner.returncode == 130 and "Traceback" not in err, err
    assert "interrupted" in err.strip().splitlines()[-1]
    for _ in range(50):
        if not _alive(stage_pid):
            break
        time.sleep(0.1)
    assert not _alive(stage_pid)
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {"stage": "long", "status": "interrupted"}.items() <= records[-1].items()


def test_cublas_13_is_linked_under_the_names_ctranslate2s_wheel_loads(tmp_path):
    """CTranslate2's CUDA wheels load libcublas.so.12 and libcublasLt.so.12; on a CUDA 13 machine the
    decoding stage links the newest cuBLAS it finds under those names (and finds none on a machine
    without one)."""
    from benchmarks.peers.gpu_decoding import cublas_links

    lib = tmp_path / "cuda-13" / "lib64"
    lib.mkdir(parents=True)
    for name in ("libcublas.so.13", "libcublas.so.13.1.0.3", "libcublasLt.so.13.1.0.3", "libcublas.so"):
        (lib / name).write_bytes(b"")
    links = tmp_path / "links"
    links.mkdir()
    assert cublas_links(str(links), [str(tmp_path / "cuda-*" / "lib64")]) == str(links)
    assert sorted(p.name for p in links.iterdir()) == ["libcublas.so.12", "libcublasLt.so.12"]
    assert os.readlink(links / "libcublas.so.12") == str(lib / "libcublas.so.13.1.0.3")
    assert os.readlink(links / "libcublasLt.so.12") == str(lib / "libcublasLt.so.13.1.0.3")
    empty = tmp_path / "none"
    empty.mkdir()
    assert cublas_links(str(empty), [str(tmp_path / "nowhere")]) is None
