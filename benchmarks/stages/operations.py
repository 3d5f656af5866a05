"""Operations: what a run folder and the server promise under stress. ``fault_injection`` (issue 14)
SIGKILLs a training at random moments, resuming after each kill and checking every checkpoint against
an uninterrupted run, then SIGTERMs it; ``server_load`` (issue 15) loads ``onmt_doc_server``. The
killed trainings run in forked children (:class:`Forked`), read through ``log.metrics_file``."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import yaml

from benchmarks.stages.training import checkpoint, system_config, train_system
from benchmarks.suite.stage import StageContext, stage

STEP_FILE = re.compile(r"step_(\d+)\.pt")
# fault_injection's table: check | result | goal, templates over the trials' counters
CHECKS = """\
SIGKILLs (resumed after each) | {kills} in {trials} trials: {where} | ≥ {goal}
attempts in which the training finished before the kill | {early} | –
unreadable `last.pt` after a kill | {unreadable_last} | 0
`last.pt` after a kill differing from the reference's `step_N.pt` | {differ_after_kill} of {checked} | 0
`step_N.pt`/`best.pt` failing the CRC check / `step_N.pt` differing | {corrupt} / {step_differ} of {verified} | 0 / 0
starts without `last.pt`: resumed from `step_N.pt` / restarted at step 0 | {resumed} / {restarted} | – / 0
final state differing from the uninterrupted run | {final_differ} of {trials} | 0
resumes that failed | {final_fail} | 0
largest orphaned bytes right after a kill (removed by the next start) | {orphan_max} | –
orphaned bytes in all run folders at the end | {orphan_end} | 0
{sigterms} SIGTERM runs: exit 143 / finished first / steps lost / differing | {term} | – / – / 0 / 0"""


@dataclass
class FaultParams:
    system: str  # a tiny Transformer on the toy corpus (save_every, keep_last, valid_every from its config)
    kills: int = 60  # SIGKILLs in all (at least)
    per_trial: int = 5  # kills per trial before it may finish
    sigterms: int = 10
    seed: int = 1
    train_docs: int = 150


def run_config(ctx: StageContext, p: FaultParams, name: str, **train: int) -> tuple[str, str, dict]:
    """(config file, run folder, config) of one run of the system, metrics logged every step."""
    data, run_dir = os.path.join(ctx.out, ctx.name, "data"), os.path.join(ctx.out, ctx.name, name)
    files = {split: {"src": f"{data}/{split}.src", "tgt": f"{data}/{split}.tgt"} for split in ("train", "valid")}
    log = {"dir": run_dir, "metrics_file": "metrics.jsonl", "tensorboard": False, "every": 1}
    cfg = system_config(ctx, ctx.systems[p.system], {"data": files, "log": log, "train": {"device": "cpu", **train}})
    path = os.path.join(ctx.work_dir(), f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f)
    return path, run_dir, cfg


class Forked:
    """A command's ``main(argv)`` in a child forked from this process (torch already imported: kills land
    in the command's own start-up, training and saves, not the interpreter's); as Popen."""

    def __init__(self, main: Callable[[list[str]], int], argv: list[str], log: str) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: Optional[int] = None
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            code = 1
            try:
                os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND), 2)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            finally:
                os._exit(code or 0)

    def poll(self, block: bool = False) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        return self.poll(block=True)

    def send_signal(self, sig: int = signal.SIGKILL) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


def start(config: str, log: str) -> Forked:
    from onmt_doc.bin.train import main

    return Forked(main, ["-config", config], log)


def metrics_size(run_dir: str) -> int:
    path = os.path.join(run_dir, "metrics.jsonl")
    return os.path.getsize(path) if os.path.exists(path) else 0


def logged_steps(run_dir: str, offset: int) -> list[int]:
    """The training steps this start logged (the metrics file past ``offset`` bytes)."""
    with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
        f.seek(offset)
        rows = [json.loads(line) for line in f.read().decode("utf-8", "replace").splitlines() if line.endswith("}")]
    return [r["step"] for r in rows if r.get("event") == "train"]


def wait_for_training(proc: Forked, run_dir: str, offset: int) -> float:
    """Until the start logged its first step (start-up over); the time it did."""
    while proc.poll() is None and metrics_size(run_dir) <= offset:
        time.sleep(0.005)
    return time.time()


def partial_files(run_dir: str) -> list[str]:
    from onmt_doc.train.run_folder import PARTIAL

    return [os.path.join(r, f) for r, _, files in os.walk(run_dir) for f in files if PARTIAL.search(f)]


def step_files(ckpts: str) -> list[str]:
    names = os.listdir(ckpts) if os.path.isdir(ckpts) else []
    return sorted((n for n in names if STEP_FILE.fullmatch(n)), key=lambda n: int(STEP_FILE.fullmatch(n)[1]))


def orphan_bytes(run_dir: str, keep_last: int) -> int:
    """Bytes a finished run folder should not hold: partial saves and step_N.pt beyond keep_last."""
    ckpts = os.path.join(run_dir, "checkpoints")
    extra = [os.path.join(ckpts, n) for n in step_files(ckpts)[:-keep_last]] + partial_files(run_dir)
    return sum(os.path.getsize(f) for f in extra if os.path.exists(f))


def saved(run_dir: str, name: str = "last.pt") -> dict:
    from onmt_doc.models.checkpoint import load_checkpoint

    return load_checkpoint(os.path.join(run_dir, "checkpoints", name))


def same_state(a: dict, b: dict) -> bool:
    """Weights, optimizer state, step, data position, RNG and early stopping equal, bit for bit."""
    import torch

    def eq(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(eq, x, y))
        return x == y

    sa, sb = a["train_state"], b["train_state"]
    keys = ("optimizer", "sampler", "rng", "early_stopping")
    return a["step"] == b["step"] and eq(a["model"], b["model"]) and all(eq(sa[k], sb[k]) for k in keys)


class Trials:
    """The reference run and the counters every kill adds to."""

    def __init__(self, ctx: StageContext, p: FaultParams) -> None:
        from onmt_doc.toy.corpus import write_corpus

        self.ctx, self.p, self.rng = ctx, p, random.Random(p.seed)
        write_corpus(ctx.work_dir("data"), seed=1, train_docs=p.train_docs, valid_docs=10, test_docs=1)
        config, self.ref, cfg = run_config(ctx, p, "reference", keep_last=1000)
        self.keep_last = system_config(ctx, ctx.systems[p.system])["train"]["keep_last"]
        t0, proc = time.time(), start(config, os.path.join(ctx.work_dir(), "reference.log"))
        t1 = wait_for_training(proc, self.ref, 0)
        if proc.wait() != 0:
            raise RuntimeError(f"the reference run failed; see {ctx.work_dir()}/reference.log")
        self.life_s, self.train_s = time.time() - t0, time.time() - t1
        self.n, self.where = Counter(), Counter()  # what the checks count; where the kills landed
        ctx.record(what="reference", steps=cfg["train"]["max_steps"], life_s=self.life_s, training_s=self.train_s)

    def fresh(self, name: str) -> tuple[str, str]:
        """A run folder with the reference's vocabulary and data cache, and its config."""
        config, run_dir, _ = run_config(self.ctx, self.p, name)
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        for name in ("subword.model", "vocab.txt"):
            shutil.copy(os.path.join(self.ref, name), run_dir)
        shutil.copytree(os.path.join(self.ref, "cache"), os.path.join(run_dir, "cache"))
        return config, run_dir

    def launch(self, config: str, run_dir: str) -> tuple[Forked, int, Callable[[], int]]:
        """Start (or resume): the process, the metrics file's size before it, and ``done()``: wait, then
        count a start without last.pt that resumed from its step_N.pt (or, wrongly, from step 0)."""
        ckpts = os.path.join(run_dir, "checkpoints")
        steps = [] if os.path.exists(os.path.join(ckpts, "last.pt")) else step_files(ckpts)
        offset, proc = metrics_size(run_dir), start(config, os.path.join(run_dir, "process.log"))

        def done() -> int:
            rc = proc.wait()
            if steps and (got := logged_steps(run_dir, offset)):
                self.n["resumed"] += got[0] == int(STEP_FILE.fullmatch(steps[-1])[1]) + 1
                self.n["restarted"] += got[0] == 1
            return rc

        return proc, offset, done

    def kill_once(self, config: str, run_dir: str) -> bool:
        """One start killed by SIGKILL (False: it finished first), then every checkpoint checked."""
        ckpts, draw = os.path.join(run_dir, "checkpoints"), self.rng.random()
        proc, offset, done = self.launch(config, run_dir)
        if draw < 0.5:  # the instant the target-th partial checkpoint file shows up (not: it ended first)
            target, deadline, seen = self.rng.randint(1, 4), time.time() + 3 * self.life_s, set()
            while len(seen) < target and proc.poll() is None and time.time() < deadline:
                time.sleep(0.0002)
                seen.update(partial_files(ckpts))
            killed = len(seen) >= target
        else:  # during training, or at any moment of the process's life
            if draw < 0.9:
                wait_for_training(proc, run_dir, offset)
            time.sleep(self.rng.uniform(0.0, self.train_s if draw < 0.9 else self.life_s))
            killed = proc.poll() is None
        if killed:
            proc.send_signal()
        running = "training" if metrics_size(run_dir) > offset else "start-up"
        place = "checkpoint write" if partial_files(ckpts) else running
        done()
        if not killed:
            self.n["early"] += 1
            return False
        self.n["kills"] += 1
        self.where[place] += 1
        self.n["orphan_max"] = max(self.n["orphan_max"], orphan_bytes(run_dir, self.keep_last))
        self.check_checkpoints(run_dir)
        return True

    def check_checkpoints(self, run_dir: str) -> None:
        """Every step_N.pt, best.pt and last.pt must load (CRC-32s checked); step_N.pt and last.pt
        must equal the reference's step_N.pt of their step."""
        from onmt_doc.errors import UserError

        names = os.listdir(os.path.join(run_dir, "checkpoints"))
        for name in [n for n in names if STEP_FILE.fullmatch(n) or n in ("best.pt", "last.pt")]:
            try:
                ckpt = saved(run_dir, name)
            except UserError:
                self.n["unreadable_last" if name == "last.pt" else "corrupt"] += 1
                continue
            if name == "best.pt":
                self.n["verified"] += 1
                continue
            differs = not same_state(ckpt, saved(self.ref, f"step_{ckpt['step']}.pt"))
            seen, differ = ("checked", "differ_after_kill") if name == "last.pt" else ("verified", "step_differ")
            self.n.update({seen: 1, differ: int(differs)})

    def trial(self, index: int) -> None:
        """Up to ``per_trial`` kills with a resume after each, then the resume to the end."""
        config, run_dir = self.fresh(f"trial_{index:02d}")
        kills = 0
        while kills < self.p.per_trial and self.kill_once(config, run_dir):
            kills += 1
        if self.launch(config, run_dir)[2]() != 0:  # the resume to the end
            self.n["final_fail"] += 1
            return
        self.n["trials"] += 1
        self.n["final_differ"] += not same_state(saved(run_dir), saved(self.ref))
        self.n["orphan_end"] += orphan_bytes(run_dir, self.keep_last)
        self.ctx.record(what="trial", trial=index, kills=kills, total_kills=self.n["kills"])

    def sigterm(self, index: int) -> dict:
        """SIGTERM during training: exit 143, last.pt at the step reached, the resume equal to the reference."""
        config, run_dir = self.fresh(f"sigterm_{index:02d}")
        proc = start(config, os.path.join(run_dir, "process.log"))
        wait_for_training(proc, run_dir, 0)
        time.sleep(self.rng.uniform(0.0, 0.5))
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait()
        stopped = saved(run_dir)["step"]
        lost = max(0, max(logged_steps(run_dir, 0) or [0]) - stopped)
        resumed = start(config, os.path.join(run_dir, "process.log")).wait() == 0
        same = resumed and same_state(saved(run_dir), saved(self.ref))
        return self.ctx.record(what="sigterm", run=index, exit=rc, stopped_at=stopped, steps_lost=lost, equal=same)


@stage("fault_injection", FaultParams)
def fault_injection(p: FaultParams, ctx: StageContext) -> None:
    """Kill trials until ``kills`` SIGKILLs (or the budget), then the SIGTERM runs, then the checks."""
    import torch

    import onmt_doc.bin.train  # noqa: F401  (what every child needs, imported once before the forks)
    import onmt_doc.train.trainer  # noqa: F401

    torch.set_num_threads(1)
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])  # its first use imports torch._dynamo (seconds)
    t = Trials(ctx, p)
    index, start_s = 0, 2 * t.life_s  # a start's worst case: its whole life twice
    while t.n["kills"] < p.kills and (not index or ctx.seconds_left() > (p.per_trial + 1 + 2 * p.sigterms) * start_s):
        t.trial(index)
        index += 1
    terms = [t.sigterm(i) for i in range(p.sigterms)]
    term = [sum(r["exit"] == 143 for r in terms), sum(r["exit"] == 0 for r in terms)]
    term += [sum(r["steps_lost"] for r in terms), sum(not r["equal"] for r in terms)]
    values = defaultdict(int, t.n, goal=p.kills, sigterms=len(terms), term=" / ".join(map(str, term)))
    values["where"] = ", ".join(f"{k} {v}" for k, v in sorted(t.where.items()))
    for line in CHECKS.splitlines():  # counts stay numbers
        check, result, goal = (int(x) if x.isdigit() else x for x in line.format_map(values).split(" | "))
        ctx.record(what="check", check=check, result=result, goal=goal)


# ----------------------------------------------------------------------------- server load


@dataclass
class ServerParams:
    system: str  # the served model: a toy Transformer trained here
    train_docs: int = 2500
    clients: list = field(default_factory=lambda: [1, 4, 16])
    requests: int = 300  # at most this many requests per level
    seconds: float = 30.0  # at most this long per level
    threads: int = 1  # the server's torch threads
    batch_tokens: int = 2048
    batch_wait_ms: list = field(default_factory=lambda: [10.0])  # one batched server run per value
    unbatched: bool = True  # also a server that translates every request alone (-batch_tokens 1)
    large: int = 100_000  # characters of the stall test's large request (0: skip)


def call(port: int, method: str, path: str, body: object = None) -> tuple[int, dict]:
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=300)) as conn:
        data = None if body is None else json.dumps(body).encode("utf-8")
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())


def start_server(ctx: StageContext, p: ServerParams, run_dir: str, batch_tokens: int, wait_ms: float, n: int):
    """``onmt_doc_server`` on a free loopback port; (process, port) once ``/health`` answers."""
    log, ckpt = f"{ctx.work_dir()}/server_{n}.log", checkpoint(run_dir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from onmt_doc.bin.server import main

    argv = ["-model", ckpt, "-host", "127.0.0.1", "-port", str(port), "-device", "cpu", "-threads", str(p.threads)]
    proc = Forked(main, argv + ["-batch_tokens", str(batch_tokens), "-batch_wait_ms", f"{wait_ms:g}"], log)
    while proc.poll() is None and ctx.seconds_left() > 0:
        try:
            if call(port, "GET", "/health")[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    raise RuntimeError(f"the server did not start; see {log}")


def load(port: int, docs: list, clients: int, requests: int, seconds: float) -> dict:
    """``clients`` threads sending one-document requests back to back until ``requests`` answers or
    ``seconds``; the ``/health`` counters give the requests per worker batch."""
    lock, latencies, errors, sentences, issued, stop_at = threading.Lock(), [], [], [0], [0], time.monotonic() + seconds

    def client(c: int) -> None:
        while True:
            with lock:
                if issued[0] >= requests or time.monotonic() >= stop_at:
                    return
                issued[0] += 1
                doc = docs[(issued[0] * 7 + c) % len(docs)]
            t0 = time.monotonic()
            try:
                status, body = call(port, "POST", "/translate", {"document": doc})
            except OSError as e:
                status, body = 0, {"error": str(e)}
            with lock:
                if status == 200 and len(body.get("translation", [])) == len(doc):
                    latencies.append(time.monotonic() - t0)
                    sentences[0] += len(doc)
                else:
                    errors.append(f"{status}: {body}")

    before, t0 = call(port, "GET", "/health")[1], time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    elapsed, after = time.monotonic() - t0, call(port, "GET", "/health")[1]
    lat, batches = sorted(latencies), after["batches"] - before["batches"]
    row = {"clients": clients, "requests": len(lat), "seconds": elapsed, "req_per_s": len(lat) / elapsed}
    row.update(sent_per_s=sentences[0] / elapsed, p50_ms=1000 * statistics.median(lat) if lat else None)
    row["p95_ms"] = 1000 * statistics.quantiles(lat, n=20)[18] if len(lat) >= 2 else None
    row["requests_per_batch"] = (after["requests"] - before["requests"]) / batches if batches else None
    return {**row, "errors": len(errors), **({"first_error": errors[0][:200]} if errors else {})}


def stall(port: int, docs: list, chars: int, length: int = 1500) -> dict:
    """One request of long lines (toy sentences joined to ~``length`` characters, ``chars`` in all,
    documents of 6 lines) and, meanwhile, one client sending one-document requests back to back."""
    sentences, flat, i = [s for d in docs for s in d], [], 0
    while sum(map(len, flat)) < chars - length:
        line = ""
        while len(line) < length:
            line, i = line + sentences[i % len(sentences)] + " ", i + 1
        flat.append(line.strip())
    large, latencies, ends = [flat[k : k + 6] for k in range(0, len(flat), 6)], [], []
    with ThreadPoolExecutor(1) as pool:
        t_large = time.monotonic()
        future = pool.submit(call, port, "POST", "/translate", {"documents": large})
        future.add_done_callback(lambda _: ends.append(time.monotonic()))
        while not future.done():
            doc, t0 = docs[len(latencies) % len(docs)], time.monotonic()
            status, body = call(port, "POST", "/translate", {"document": doc})
            if status == 200 and len(body.get("translation", [])) == len(doc):
                latencies.append(time.monotonic() - t0)
    status, body = future.result()
    ok = status == 200 and len(body.get("translations", [])) == len(large)
    row = {"large_sentences": len(flat), "large_chars": sum(map(len, flat)), "large_seconds": ends[0] - t_large}
    row.update(large_status=status, small_requests=len(latencies), errors=0 if ok else 1)
    row["small_p50_ms"] = 1000 * statistics.median(latencies) if latencies else None
    return {**row, "small_max_ms": 1000 * max(latencies) if latencies else None}


@stage("server_load", ServerParams)
def server_load(p: ServerParams, ctx: StageContext) -> None:
    """Train the toy model, then per server setting: warm-up, each client level, the stall test."""
    import onmt_doc.bin.server  # noqa: F401  (imported once, before the servers are forked)
    from benchmarks.suite.text_files import read_docs
    from onmt_doc.toy.corpus import write_corpus

    data, run_dir = ctx.work_dir("toy"), ctx.work_dir("model")
    write_corpus(data, seed=3, train_docs=p.train_docs, valid_docs=60, test_docs=145)
    files = {split: {"src": f"{data}/{split}.src", "tgt": f"{data}/{split}.tgt"} for split in ("train", "valid")}
    row = train_system(ctx, system_config(ctx, ctx.systems[p.system], {"data": files, "log": {"dir": run_dir}}))
    docs = [d[:6] for d in read_docs(f"{data}/test.src")]
    ctx.record(what="model", steps=row["steps"], train_s=row["train_s"], avg_sentences=statistics.mean(map(len, docs)))
    settings = [(f"on, wait {w:g} ms", p.batch_tokens, w) for w in p.batch_wait_ms] + [("off", 1, 0.0)] * p.unbatched
    runs = []
    for n, (batching, batch_tokens, wait_ms) in enumerate(settings):
        proc, port = start_server(ctx, p, run_dir, batch_tokens, wait_ms, n)
        try:
            load(port, docs, 1, 5, 30.0)  # warm-up
            for clients in p.clients:
                row = load(port, docs, clients, p.requests, p.seconds)
                runs.append(ctx.record(what="load", batching=batching, **row))
            if p.large:
                ctx.record(what="stall", batching=batching, **stall(port, docs, p.large))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
    most = [r for r in runs if r["clients"] == max(p.clients)]
    off, on = [r for r in most if r["batching"] == "off"], [r for r in most if r["batching"] != "off"]
    if off and on and off[0]["req_per_s"]:
        best = max(on, key=lambda r: r["req_per_s"])
        ratios = {"req_per_s_ratio": best["req_per_s"] / off[0]["req_per_s"]}
        ratios["p50_ratio"] = off[0]["p50_ms"] / best["p50_ms"] if best["p50_ms"] else None
        ctx.record(what="headline", clients=max(p.clients), batching=best["batching"], **ratios)
