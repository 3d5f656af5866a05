"""Running a spec: each stage in its own process (a stage that hangs or crashes is stopped at its
budget and the next one runs), in order, every measurement written as it is taken.

``OUT/run.json`` says what ran where (command, machine, GPU, torch, date); ``OUT/results.jsonl``
holds one JSON line per measurement (``ctx.record``) and one status line per stage
(``{"stage": ..., "status": ok|failed|timeout|skipped|interrupted, "seconds": ...}``; interrupted: the runner was
stopped by SIGINT or SIGTERM, and stopped the stage). ``OUT`` is a folder the
suite made (``.benchmark-run``) or a new or empty one, never one of the repository's own
(:func:`claim_run_folder`)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from typing import Optional

from benchmarks.suite.spec import Spec, StageSpec, stage_params
from benchmarks.suite.stage import STAGE_MARK, StageContext
from benchmarks.suite.system import REPO
from onmt_doc.errors import UserError
from onmt_doc.outputs import write_text

GRACE_SECONDS = 20.0  # past its budget a stage is stopped; it should watch ctx.seconds_left() itself
RUN_MARK = ".benchmark-run"  # in every run folder the suite made: the only non-empty folders it writes into
RUNS = os.path.join(REPO, "runs")  # the one place inside the repository where run folders go (git-ignored)


def claim_run_folder(out: str) -> None:
    """Make ``out`` a run folder of the suite, or refuse it (one line) before anything is written:
    it must be new, empty or marked as one the suite made (:data:`RUN_MARK`), so a user's folder
    (``--out .``, ``--out ~``, a folder holding their own run.json) is never written into; and,
    inside the repository, under ``runs/``: docs/, benchmarks/specs/ and the committed records of
    benchmarks/results/ change only through ``report`` (README: copy run.json and results.jsonl)."""
    real, repo = os.path.realpath(out), os.path.realpath(REPO)
    inside = real == repo or real.startswith(repo + os.sep)
    if inside and not real.startswith(os.path.realpath(RUNS) + os.sep):
        raise UserError(
            f"--out {out}: a folder of the repository ({os.path.relpath(real, repo)}); run folders go under runs/ "
            f"(the default runs/bench/<spec>) or outside the repository; results are committed by copying run.json "
            f"and results.jsonl into benchmarks/results/<spec>/ and running report"
        )
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out} exists and is not a folder: choose another --out")
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, RUN_MARK)):
        held = ", ".join(sorted(os.listdir(out))[:3])
        raise UserError(
            f"--out {out} holds files ({held}…) and was not made by the benchmark suite: choose a new or empty "
            f"folder (the suite writes only into folders it made)"
        )
    try:
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, RUN_MARK), "a").close()
    except OSError as e:
        raise UserError(f"--out {out}: cannot create the run folder ({e.strerror or e})") from None


def resolve_device(device: str) -> str:
    """``auto``: cuda when a GPU is present, else cpu; ``cuda`` without one is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: the spec asks for device cuda and torch sees no GPU (--device cpu runs it here)")
    return device


def cpu_model() -> str:
    """The CPU's model name and the cores this process may use."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


def describe_machine(device: str) -> dict:
    """Where the numbers come from (kept in run.json and printed by ``report``)."""
    import torch

    info = {"cpu": cpu_model(), "python": platform.python_version(), "torch": torch.__version__}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            sms=props.multi_processor_count,
        )
    return info


def run_spec(
    spec: Spec, out: str, smoke: bool, data: str, device: str, argv: list[str], in_process: bool = False
) -> int:
    """Run every stage of ``spec`` in order; 0 when all ended ``ok``. ``in_process``: the stages run
    in this process one after the other (no budget is enforced: CI's smoke runs, which pay a
    start-up of torch per stage otherwise)."""
    for st in spec.stages:  # refuse before anything is written, not when the stage's turn comes
        folder = os.path.join(out, st.name)
        if os.path.exists(folder) and not os.path.exists(os.path.join(folder, STAGE_MARK)):
            raise UserError(f"{folder} exists and was not made by the benchmark suite: choose another --out")
    claim_run_folder(out)
    device = resolve_device(device if device != "spec" else spec.device)
    run = {
        "spec": os.path.relpath(spec.path, REPO),
        "title": spec.title,
        "command": "python -m benchmarks " + shlex.join(argv),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "device": device,
        "smoke": smoke,
        "machine": describe_machine(device),
    }
    write_text(os.path.join(out, "run.json"), json.dumps(run, indent=1), flag="--out")
    results = os.path.join(out, "results.jsonl")
    _forget(results, {st.name for st in spec.stages})
    print(f"[suite] {spec.name}: {len(spec.stages)} stages on {device} -> {results}", file=sys.stderr, flush=True)
    end_of_run = time.time() + (
        spec.smoke_budget_seconds if smoke and spec.smoke_budget_seconds else spec.budget_seconds
    )
    failures = 0
    for st in spec.stages:
        left = end_of_run - time.time()
        if left < 5:
            _status(results, st.name, "skipped", 0.0, "the spec's budget_seconds is spent")
            failures += 1
            continue
        own = st.smoke_budget_seconds if smoke and st.smoke_budget_seconds else st.budget_seconds
        budget = min(own, left)
        if in_process:
            t0 = time.time()
            rc = run_stage(spec, st.name, out, smoke, data, device, time.time() + budget)
            status, seconds = ("ok" if rc == 0 else "failed"), time.time() - t0
        else:
            t0 = time.time()
            try:
                status, seconds = _run_child(spec, st, out, smoke, data, device, budget)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM (a `timeout`): the stage is stopped, say so
                _status(results, st.name, "interrupted", time.time() - t0, "the run was stopped")
                raise
        _status(results, st.name, status, seconds)
        failures += status != "ok"
    print(f"[suite] done: {len(spec.stages) - failures}/{len(spec.stages)} stages ok; {results}", file=sys.stderr)
    return 1 if failures else 0


def _forget(results: str, stages: set[str]) -> None:
    """Drop the earlier records of the stages about to run: re-running a stage replaces its results,
    the other stages' stay (``--stages`` re-runs part of a spec into the same folder)."""
    if not os.path.exists(results):
        return
    with open(results, encoding="utf-8") as f:
        keep = [line for line in f if line.strip() and _stage_of(line) not in stages]
    with open(results + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(keep)
    os.replace(results + ".tmp", results)


def _stage_of(line: str) -> Optional[str]:
    try:
        return json.loads(line).get("stage")
    except json.JSONDecodeError:
        return None


def clear_stage_folder(folder: str) -> None:
    """A re-run starts afresh (never resumes a half-done stage), but only a folder the suite made
    (it holds STAGE_MARK) is removed: ``--out ~`` must not cost a user a folder named like a stage."""
    if not os.path.exists(folder):
        return
    if not os.path.exists(os.path.join(folder, STAGE_MARK)):
        raise UserError(f"{folder} exists and was not made by the benchmark suite: choose another --out")
    shutil.rmtree(folder)


def select_stages(spec: Spec, names: list[str]) -> list[StageSpec]:
    """The stages named (``--stages``), in the spec's order; an unknown name is an error."""
    known = [s.name for s in spec.stages]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"{spec.path}: no stage '{unknown[0]}'; it has {', '.join(known)}")
    return [s for s in spec.stages if s.name in names]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run_child(spec: Spec, st: StageSpec, out: str, smoke: bool, data: str, device: str, budget: float):
    """One stage in a child process, stopped (its whole process group) past budget + grace, and when
    this process is interrupted or terminated: the stage runs in a session of its own, so a signal to
    the runner alone (`timeout`, a closed terminal) would leave it running on a machine whose call
    has ended. SIGINT is handled even where the runner inherited it ignored (a background job)."""
    deadline = time.time() + budget
    cmd = [sys.executable, "-m", "benchmarks", "run", os.path.abspath(spec.path), "--only", st.name, "--out", out]
    cmd += ["--data", data, "--device", device, "--deadline", f"{deadline:.1f}"] + (["--smoke"] if smoke else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    print(f"[suite] stage {st.name} ({st.type}), budget {budget:.0f} s", file=sys.stderr, flush=True)
    t0 = time.time()
    before = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=budget + GRACE_SECONDS)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "timeout"
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return status, time.time() - t0


def _status(results: str, name: str, status: str, seconds: float, why: str = "") -> None:
    row = {"stage": name, "status": status, "seconds": round(seconds, 1), **({"why": why} if why else {})}
    with open(results, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(f"[suite] stage {name}: {status} in {seconds:.0f} s", file=sys.stderr, flush=True)


def run_stage(spec: Spec, name: str, out: str, smoke: bool, data: str, device: str, deadline: Optional[float]) -> int:
    """The child's side: run one stage in this process (``--only``)."""
    from benchmarks.stage_types import STAGES

    st = next((s for s in spec.stages if s.name == name), None)
    if st is None:
        raise SystemExit(f"error: {spec.path} has no stage '{name}'; it has {[s.name for s in spec.stages]}")
    device = resolve_device(device if device != "spec" else spec.device)
    if device == "cuda":  # what every command of the library does on CUDA (stages build models directly)
        import torch

        from onmt_doc.devices import configure

        configure(torch.device(device))
    claim_run_folder(out)
    clear_stage_folder(os.path.join(out, st.name))
    ctx = StageContext(
        name=st.name,
        out=out,
        device=device,
        smoke=smoke,
        data=data,
        repo=REPO,
        deadline=deadline or time.time() + st.budget_seconds,
        systems=spec.systems,
        results=os.path.join(out, "results.jsonl"),
    )
    fn = STAGES.get(st.type).cls
    try:
        fn(stage_params(spec, st, smoke), ctx)
    except Exception as e:  # the stage failed: say why in the results, then the traceback on stderr
        ctx.record(error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        traceback.print_exc()
        return 1
    return 0
