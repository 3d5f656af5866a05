"""What the benchmark scripts share: data locations, running and timing commands, run folders,
results files, log parsing, the Multi30k recipe and the time-slicing scheduler.

The scripts run as ``python benchmarks/<name>.py``, so Python puts this folder first on
``sys.path`` and ``from common import ...`` needs no path manipulation; no benchmark imports
another one. Nothing here imports torch, so the scripts that only drive processes start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the documented location of the shared data sets and peer toolkits: beside the repository
DATA = os.path.normpath(os.path.join(REPO, "..", "shared", "data"))
PEERS = os.path.normpath(os.path.join(REPO, "..", "shared", "peers"))
TIME = "/usr/bin/time"
LOCK = "/tmp/onmt_bench.lock"


# ----------------------------------------------------------------------------- environment


def log(msg: str) -> None:
    """Timestamped progress line (flushed: benchmark output is usually followed in a log file)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def add_data_argument(p: argparse.ArgumentParser) -> None:
    """``--data``: the shared data sets' root, so no script hard-codes a machine's path."""
    p.add_argument(
        "--data", default=DATA, help="folder with the shared data sets (default: ../shared/data beside the repository)"
    )


def add_shape_arguments(p: argparse.ArgumentParser, global_layers: int, global_help: str) -> None:
    """``--d-model --layers --heads --ff --global-layers``: the model shape of the document-level
    benchmarks (defaults: d_model 256, 3+3 layers, 4 heads, ff 1024, the paper shapes scaled to CPU)."""
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=1024)
    p.add_argument("--global-layers", type=int, default=global_layers, help=global_help)


def multi30k(data: str) -> str:
    """The Multi30k en-de folder of a data root."""
    return os.path.join(data, "multi30k-en-de")


def thread_env(threads: int) -> dict:
    """The environment for a child process limited to ``threads`` OpenMP threads."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads)}


def tool(name: str) -> list[str]:
    """Console script of the running interpreter's environment (PATH next, then ``python -m``), so
    a benchmark times the onmt_doc it was started with."""
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(exe):
        return [exe]
    found = shutil.which(name)
    if found:
        return [found]
    module = name[len("onmt_doc_") :] if name.startswith("onmt_doc_") else name
    return [sys.executable, "-m", f"onmt_doc.bin.{module}"]


def machine() -> str:
    """Short machine description for results files."""
    return f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores visible"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for report headers."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# ----------------------------------------------------------------------------- running commands


def timed(cmd: list[str], log_path: str, threads: int) -> tuple[float, float, str]:
    """Run ``cmd`` (exit on failure); wall seconds, peak resident memory (MiB, through
    ``/usr/bin/time`` where it exists, else nan) and its stderr. The log gets the command line,
    stdout and stderr."""
    wrapped = [TIME, "-f", "__time__ %e %M", *cmd] if os.path.exists(TIME) else cmd
    start = time.time()
    proc = subprocess.run(wrapped, cwd=REPO, env=thread_env(threads), capture_output=True, text=True)
    with open(log_path, "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}; see {log_path}")
    m = re.search(r"__time__ ([\d.]+) (\d+)", proc.stderr)
    wall, rss = (float(m.group(1)), int(m.group(2)) / 1024) if m else (time.time() - start, float("nan"))
    return wall, rss, proc.stderr


def run_streamed(cmd: list[str], log_path: str, threads: int, header: bool = True) -> str:
    """Run ``cmd`` (exit on failure) with its output streamed to ``log_path``, so a long run can be
    followed; returns that output. ``header`` writes the command line first."""
    log("$ " + " ".join(cmd))
    with open(log_path, "w", encoding="utf-8") as f:
        if header:
            f.write(" ".join(cmd) + "\n")
            f.flush()
        proc = subprocess.run(cmd, cwd=REPO, env=thread_env(threads), stdout=f, stderr=subprocess.STDOUT, text=True)
    with open(log_path, encoding="utf-8") as f:
        text = f.read()
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}; see {log_path}")
    return text


def hold_lock(path: str = LOCK):
    """Take the benchmarks' exclusive lock (as ``flock`` does) and keep it until the process exits,
    so no other benchmark shares the CPU; returns the open lock file."""
    import fcntl

    lock = open(path, "a")
    log(f"waiting for {path} (other benchmarks)")
    fcntl.flock(lock, fcntl.LOCK_EX)
    log("lock acquired")
    return lock


# ----------------------------------------------------------------------------- run folders, results


def read_lines(path: str) -> list[str]:
    """Lines of a text file, stripped."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n").strip() for line in f]


def write_lines(path: str, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def head(path: str, lines: int, out: str, tag: str = "test") -> str:
    """The first ``lines`` lines of ``path`` as a file under ``out`` (smaller test sets)."""
    dest = os.path.join(out, f"{tag}.{lines}.{path.rsplit('.', 1)[-1]}")
    with open(path, encoding="utf-8") as f, open(dest, "w", encoding="utf-8") as g:
        g.writelines(f.readlines()[:lines])
    return dest


def write_yaml(cfg: dict, path: str, comment: str = "") -> str:
    """Write a config (creating its folder); ``comment`` becomes a first ``#`` line."""
    import yaml

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        if comment:
            f.write(f"# {comment}\n")
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def copy_vocab(vocab_dir: str, run_dir: str) -> None:
    """Give a run folder the shared vocabulary, so runs compare models, not vocabularies."""
    os.makedirs(run_dir, exist_ok=True)
    for f in ("subword.model", "vocab.txt"):
        shutil.copyfile(os.path.join(vocab_dir, f), os.path.join(run_dir, f))


def prepare_run(cfg: dict, out: str, name: str) -> tuple[str, str]:
    """Give a model's run folder the shared vocabulary (``<out>/vocab``) and write its config;
    returns (config path, last checkpoint path)."""
    run_dir = cfg["log"]["dir"]
    copy_vocab(f"{out}/vocab", run_dir)
    return write_yaml(cfg, f"{out}/{name}/config.yaml"), f"{run_dir}/checkpoints/last.pt"


def read_json(path: str, default=None):
    """A JSON file's content, or ``default`` when it does not exist."""
    if not os.path.exists(path):
        return default
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str, obj, **kwargs) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, **kwargs)


def write_results(out: str, results: dict, render: Callable[[dict], str]) -> None:
    """``<out>/results.json`` and the rendered ``<out>/results.md``, and print the report."""
    write_json(f"{out}/results.json", results)
    report = render(results)
    with open(f"{out}/results.md", "w", encoding="utf-8") as f:
        f.write(report)
    print(report)


def update_docs_section(path: str, heading: str, section: str) -> None:
    """Replace the section that starts with the line ``heading`` in a Markdown file (or append
    it); everything else stays as it is. Written atomically."""
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new.rstrip("\n") + "\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- log parsing


def last_validation(text: str) -> str:
    """The last ``validation at step N: ...`` report of a training log ('' if none)."""
    valid = re.findall(r"validation at step \d+: (.*)", text)
    return valid[-1] if valid else ""


def validation_metrics(text: str) -> dict[str, float]:
    """The last validation report's metrics (``loss``, ``ppl``, ``acc``, ...) by name."""
    return {k: float(v) for k, v in re.findall(r"([\w/]+) (-?[\d.]+(?:e[-+]?\d+)?)\b", last_validation(text))}


def params_m(text: str) -> Optional[float]:
    """Millions of parameters as a training log states them."""
    m = re.search(r"([\d.]+)M parameters", text)
    return float(m.group(1)) if m else None


def logged_tok_rate(text: str) -> Optional[float]:
    """Median ``tgt tok/s`` of a training log's report lines after the first (start-up excluded)."""
    rates = [float(r) for r in re.findall(r"(\d+) tgt tok/s", text)]
    return statistics.median(rates[1:] or rates) if rates else None


def bleu(text: str) -> Optional[float]:
    """The BLEU that ``onmt_doc_translate -tgt`` printed."""
    m = re.search(r"BLEU ([\d.]+)", text)
    return float(m.group(1)) if m else None


def translate_seconds(text: str) -> float:
    """Translation time without model loading (``translated ... in Xs``)."""
    return float(re.search(r"translated .* in ([\d.]+)s", text).group(1))


def score_line(text: str) -> str:
    """The last line starting with ``BLEU`` (``BLEU x | chrF y | D-BLEU z``)."""
    return next(line for line in reversed(text.strip().splitlines()) if line.startswith("BLEU"))


def scores(text: str) -> dict[str, float]:
    """The metrics of the score line as a dict keyed by their names."""
    return {k: float(v) for k, v in (part.strip().split(" ", 1) for part in score_line(text).split("|"))}


# ----------------------------------------------------------------------------- Multi30k recipe


def recipe_arguments(p: argparse.ArgumentParser, out: str, steps: int) -> None:
    """The options ``base_config`` reads (shared by the Multi30k benchmarks built on it)."""
    p.add_argument("--out", default=out)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch_tokens", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    add_data_argument(p)


def base_config(args: argparse.Namespace, run_dir: str) -> dict:
    """A Transformer-encoder config on Multi30k en→de (the decoder and loss are each benchmark's)."""
    m30k = multi30k(args.data)
    return {
        "data": {
            "train": {"src": f"{m30k}/train.en", "tgt": f"{m30k}/train.de"},
            "valid": {"src": f"{m30k}/valid.en", "tgt": f"{m30k}/valid.de"},
            "documents": False,
        },
        "vocab": {"subword": "bpe", "size": 8000, "shared": True},
        "model": {
            "d_model": args.d_model,
            "dropout": 0.1,
            "attention_dropout": 0.1,
            "encoder": {"type": "transformer", "layers": args.layers, "heads": 4, "ff": 4 * args.d_model},
        },
        "optim": {
            "type": "adam",
            "lr": 0.5,
            "betas": [0.9, 0.998],
            "eps": 1.0e-8,
            "schedule": {"type": "noam", "warmup": args.warmup},
        },
        "train": {
            "batch_tokens": args.batch_tokens,
            "max_steps": args.steps,
            "valid_every": args.steps,
            "save_every": args.steps,
            "keep_last": 1,
            "valid_bleu": False,
            "max_grad_norm": 0.0,
            "threads": args.threads,
            "seed": 1,
        },
        "translate": {"beam": 4},
        "log": {"dir": run_dir, "tensorboard": True, "every": 50},
    }


# ----------------------------------------------------------------------------- time-slicing


class CpuMonitor(threading.Thread):
    """Samples machine-wide busy CPU time and the CPU time of this process tree twice a second, so
    that every timed phase can say how much CPU *other* processes took meanwhile (the machine is
    shared: a concurrent test run on 2 cores slows a 2-thread toolkit down 10-40x, because its
    OpenMP threads wait at every barrier for a descheduled sibling)."""

    def __init__(self, interval: float = 0.5):
        super().__init__(daemon=True)
        self.interval, self.hz = interval, os.sysconf("SC_CLK_TCK")
        self.samples: list[tuple[float, float, float]] = []  # (time, machine busy s, our tree s)
        self._stop_event = threading.Event()

    @staticmethod
    def _machine_busy() -> float:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        return float(sum(v) - v[3] - v[4])

    def _tree(self) -> float:
        procs = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            procs[int(pid)] = (int(rest[1]), sum(int(x) for x in rest[11:15]))  # ppid, u+s+cu+cs
        children: dict = {}
        for pid, (ppid, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        total, todo = 0, [os.getpid()]
        while todo:
            pid = todo.pop()
            total += procs.get(pid, (0, 0))[1]
            todo.extend(children.get(pid, []))
        return float(total)

    def sample(self) -> None:
        self.samples.append((time.time(), self._machine_busy() / self.hz, self._tree() / self.hz))

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()

    def foreign(self, t0: float, t1: float) -> float:
        """Average CPU cores used by other processes between t0 and t1 (nearest samples)."""
        s = list(self.samples)
        inside = [x for x in s if t0 - self.interval <= x[0] <= t1 + self.interval]
        if len(inside) < 2:
            return float("nan")
        a, b = inside[0], inside[-1]
        return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / max(b[0] - a[0], 1e-9))

    def wait_quiet(self, limit: float, window: float = 5.0, threshold: float = 0.1) -> float:
        """Wait (up to ``limit`` s) until other processes used < ``threshold`` cores for ``window`` s."""
        t0 = time.time()
        time.sleep(max(0.0, window - (t0 - self.samples[0][0])) if self.samples else window)
        while True:
            now = time.time()
            load = self.foreign(now - window, now)
            if (load == load and load < threshold) or now - t0 >= limit:
                if now - t0 > window + 1:
                    log(f"waited {now - t0:.0f}s for a quiet machine (other processes: {load:.2f} cores)")
                return load
            time.sleep(1.0)


def overlap(stops: list, t0: float, t1: float) -> float:
    """Seconds of the [start, end] periods in ``stops`` (end None: still going) inside [t0, t1]."""
    return sum(min(b if b is not None else t1, t1) - max(a, t0) for a, b in stops if (b is None or b > t0) and a < t1)


class Job:
    """A command in its own process group, its output logged with arrival times by a reader thread."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        log_path: str,
        env: Optional[dict] = None,
        echo: Optional[str] = None,
        stopped: bool = False,
    ):
        log(f"$ {' '.join(shlex.quote(c) for c in cmd)}   (log: {os.path.relpath(log_path, REPO)})")
        self.name, self.cmd, self.log_path, self.echo = name, cmd, log_path, echo
        self.lines: list[tuple[float, str]] = []
        self.stops: list[list] = []  # [start, end] periods this job was SIGSTOPped
        self.yield_s = 0.0  # seconds stopped because other processes were busy
        self.start = time.time()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        if stopped:
            self.pause()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with open(self.log_path, "w", encoding="utf-8") as f:
            for line in self.proc.stdout:
                f.write(line)
                f.flush()
                self.lines.append((time.time(), line.rstrip("\n")))
                if self.echo and re.search(self.echo, line):
                    print(f"    {line.rstrip()}", flush=True)
        self.proc.wait()
        self.exit_time = time.time()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    @property
    def paused(self) -> bool:
        return bool(self.stops) and self.stops[-1][1] is None

    def pause(self) -> None:
        import signal

        if not self.paused and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGSTOP)
                self.stops.append([time.time(), None])
            except ProcessLookupError:
                pass

    def resume(self) -> None:
        import signal

        if self.paused:
            self._signal(signal.SIGCONT)
            self.stops[-1][1] = time.time()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def enforce(self) -> None:
        """Re-send SIGSTOP while this job should be stopped (something outside this script may have
        sent SIGCONT to its processes, which would make the two toolkits share the CPU unnoticed)."""
        import signal

        if self.paused and self.alive():
            self._signal(signal.SIGSTOP)

    def text(self) -> str:
        """All output lines so far."""
        return "\n".join(line for _, line in self.lines)

    def finish(self) -> dict:
        """Wait for the end (exit with the log's tail on failure); timings, lines and stops."""
        rc = self.proc.wait()
        self.reader.join()
        self.end = self.exit_time
        self.wall = self.end - self.start
        if rc != 0:
            tail = open(self.log_path, encoding="utf-8").read().splitlines()[-25:]
            raise SystemExit(f"command failed (exit {rc}): {' '.join(self.cmd)}\n" + "\n".join(tail))
        return {
            "wall": self.wall,
            "start": self.start,
            "end": self.end,
            "lines": self.lines,
            "stops": self.stops,
            "stopped": overlap(self.stops, self.start, self.end),
        }


class Scheduler:
    """Runs jobs so that only one of them uses the CPU at any time (the others are SIGSTOPped).

    With several jobs the CPU passes from one to the next every ``slice_s`` seconds, so that both
    toolkits see the same machine over the same period (a VM's speed drifts by 20-30% within
    minutes when its vCPUs share physical cores with other tenants). While other processes on the
    machine take more than ``opts.busy_threshold`` cores, the running job is paused too (up to
    ``opts.max_pause`` s per job) instead of thrashing, unless ``opts.yield_to_others`` is false.
    Report intervals and timings that include a stop are excluded or repeated by the callers."""

    def __init__(self, monitor: CpuMonitor, opts: argparse.Namespace):
        self.monitor, self.opts = monitor, opts

    def run(self, jobs: list[Job], slice_s: float = 0.0, exclusive: Optional[dict] = None) -> list[dict]:
        """``exclusive`` maps a job name to a regex: once that job prints a matching line (e.g. its
        translation starts) it keeps the CPU until it ends."""
        for j in jobs[1:]:
            j.pause()
        current, slot = jobs[0], time.time()
        current.resume()
        self._yielding, holding = False, set()
        while any(j.alive() for j in jobs):
            time.sleep(0.5)
            now = time.time()
            for j in jobs:
                j.enforce()
                if (
                    exclusive
                    and j.name in exclusive
                    and any(re.search(exclusive[j.name], line) for _, line in j.lines[-5:])
                ):
                    holding.add(j.name)
            if not current.alive():
                nxt = next((j for j in jobs if j.alive()), None)
                if nxt is None:
                    break
                current, slot, self._yielding = nxt, now, False
                current.resume()
                continue
            if self.opts.yield_to_others and self._yield(current, now):
                continue
            others = [j for j in jobs if j is not current and j.alive()]
            if slice_s and others and now - slot >= slice_s and current.name not in holding:
                current.pause()
                current = others[0]
                current.resume()
                slot = now
        time.sleep(self.monitor.interval * 1.5)
        return [self._finish(j) for j in jobs]

    def _yield(self, current: Job, now: float) -> bool:
        """Pause ``current`` while other processes are busy, resume it when they are quiet (or it
        has waited long enough); True while it is paused for them."""
        opts = self.opts
        if not self._yielding:
            load = self.monitor.foreign(now - 2.0, now)
            if load == load and load > opts.busy_threshold and current.yield_s < opts.max_pause:
                current.pause()
                self._yielding = True
                log(f"  other processes use {load:.2f} cores: pausing {current.name}")
                return True
            return False
        waited = now - current.stops[-1][0]
        if self.monitor.foreign(now - 3.0, now) < opts.quiet_threshold or current.yield_s + waited >= opts.max_pause:
            current.yield_s += waited
            current.resume()
            self._yielding = False
            log(f"  resumed {current.name} after {waited:.0f}s")
        return True

    def _finish(self, job: Job) -> dict:
        r = job.finish()
        r["name"] = job.name
        r["foreign"] = self.monitor.foreign(r["start"], r["end"])
        log(
            f"  {job.name}: {r['wall']:.1f}s wall, stopped {r['stopped']:.0f}s; other processes used "
            f"{r['foreign']:.2f} CPU cores meanwhile"
        )
        return r

    def run_alone(
        self, name: str, cmd: list[str], log_path: str, env: Optional[dict] = None, echo: Optional[str] = None
    ) -> dict:
        """One command alone on the CPU (paused while other processes are busy)."""
        return self.run([Job(name, cmd, log_path, env, echo)])[0]
