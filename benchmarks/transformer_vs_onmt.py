#!/usr/bin/env python3
"""Sentence-level Transformer: onmt_doc vs OpenNMT-py 3.5.1 (and CTranslate2 as a ceiling) on Multi30k.

One run, one machine, never both toolkits on the CPU at the same time:

1. onmt_doc: write a config (d_model 256, 3+3 layers, 4 heads, ff 1024, shared BPE of ~8k entries,
   tied embeddings, noam, label smoothing 0.1), ``onmt_doc_build_vocab``.
2. Tokenize train/valid/test with the learned ``subword.model`` (pyonmttok, aggressive, joiners), so
   OpenNMT-py sees exactly the same subwords.
3. Pick onmt_doc's ``train.batch_tokens`` so that its batches carry the same number of real target
   subword tokens per step as OpenNMT-py's ``batch_size 2048 / batch_type tokens`` (the two count
   the budget differently: OpenNMT-py B*max(src, tgt+2), onmt_doc B*max(src+2, tgt+3) because of the
   <s> </s> sentence markup); both batchings are replayed exactly from the corpus lengths.
4. ``onmt_doc_train`` for --steps steps and ``/work/shared/peers/run_onmt_bench.sh`` (onmt_train,
   onmt_translate, CTranslate2 fp32/int8) with the same shape/steps/batch. The two trainings are
   time-sliced: each gets the CPU for --slice seconds while the other is SIGSTOPped, so both see the
   same machine (this VM's speed drifts by 20-30% within minutes; --sequential runs them one after
   the other instead). The running toolkit is also paused while other processes load the machine.
5. Translate test2016 with ``onmt_doc_translate`` and ``run_onmt_bench.sh`` (SKIP_TRAIN=1) in
   alternation, --translate-rounds times each.
6. Parse the logs, detokenize the OpenNMT-py/CT2 hypotheses with the same tokenizer and score them
   with sacrebleu exactly as onmt_doc does, print a markdown table and update docs/benchmarks.md.

Default run (25-35 min on 2 cores, depending on how fast the VM is at the time):
    python benchmarks/transformer_vs_onmt.py --steps 1000 --out runs/bench_transformer
Smoke test:
    python benchmarks/transformer_vs_onmt.py --steps 60 --train-lines 3000 --slice 10 --out runs/bench_smoke --no-docs
Re-read a finished run and print/update the report:
    python benchmarks/transformer_vs_onmt.py --steps 1000 --out runs/bench_transformer --report-only
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from typing import Optional

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "## Sentence Transformer vs OpenNMT-py 3.5.1 / CTranslate2 (multi30k)"
OURS_SEED = 1   # onmt_doc train.seed (OpenNMT-py gets --seed)
TARGETS = {"train": 1.25, "translate": 1.5, "bleu": -0.5}


# ----------------------------------------------------------------------------- helpers

def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class CpuMonitor(threading.Thread):
    """Samples machine-wide busy CPU time and the CPU time of this process tree twice a second, so
    that every timed phase can say how much CPU *other* processes took meanwhile (the machine is
    shared: a concurrent test run on 2 cores slows a 2-thread toolkit down 10-40x, because its
    OpenMP threads wait at every barrier for a descheduled sibling)."""

    def __init__(self, interval: float = 0.5):
        super().__init__(daemon=True)
        self.interval, self.hz = interval, os.sysconf("SC_CLK_TCK")
        self.samples: list[tuple[float, float, float]] = []   # (time, machine busy s, our tree s)
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


class Job:
    """A command in its own process group, its output logged with arrival times by a reader thread."""

    def __init__(self, name: str, cmd: list[str], log_path: str, env: Optional[dict] = None,
                 echo: Optional[str] = None, stopped: bool = False):
        log(f"$ {' '.join(shlex.quote(c) for c in cmd)}   (log: {os.path.relpath(log_path, REPO)})")
        self.name, self.cmd, self.log_path, self.echo = name, cmd, log_path, echo
        self.lines: list[tuple[float, str]] = []
        self.stops: list[list[float]] = []        # [start, end] periods this job was SIGSTOPped
        self.yield_s = 0.0                         # seconds stopped because other processes were busy
        self.start = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                     text=True, bufsize=1, start_new_session=True)
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
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stops[-1][1] = time.time()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def enforce(self) -> None:
        """Re-send SIGSTOP while this job should be stopped (something outside this script may have
        sent SIGCONT to its processes, which would make the two toolkits share the CPU unnoticed)."""
        import signal
        if self.paused and self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass

    def stopped_between(self, t0: float, t1: float) -> float:
        return sum(min(b if b is not None else t1, t1) - max(a, t0) for a, b in self.stops
                   if (b is None or b > t0) and a < t1)

    def finish(self) -> dict:
        rc = self.proc.wait()
        self.reader.join()
        self.end = self.exit_time
        self.wall = self.end - self.start
        if rc != 0:
            tail = open(self.log_path, encoding="utf-8").read().splitlines()[-25:]
            raise SystemExit(f"command failed (exit {rc}): {' '.join(self.cmd)}\n" + "\n".join(tail))
        return {"wall": self.wall, "start": self.start, "end": self.end, "lines": self.lines,
                "stops": self.stops, "stopped": self.stopped_between(self.start, self.end)}


def schedule(jobs: list[Job], opts: argparse.Namespace, slice_s: float = 0.0,
             exclusive: Optional[dict] = None) -> list[dict]:
    """Run ``jobs`` so that only one of them uses the CPU at any time (the others are SIGSTOPped):
    with several jobs the CPU passes from one to the next every ``slice_s`` seconds, so that both
    toolkits see the same machine over the same period (this VM's speed drifts by 20-30% within
    minutes: its vCPUs share physical cores with other tenants). While other processes on the machine
    take more than opts.busy_threshold cores, the running job is paused too (up to opts.max_pause s
    per job) instead of thrashing. ``exclusive`` maps a job name to a regex: once that job prints a
    matching line (e.g. its translation starts) it keeps the CPU until it ends. Report intervals and
    timings that include a stop are excluded or repeated by the callers."""
    for j in jobs[1:]:
        j.pause()
    current, yielding, slot = jobs[0], False, time.time()
    current.resume()
    holding: set = set()
    while any(j.alive() for j in jobs):
        time.sleep(0.5)
        now = time.time()
        for j in jobs:
            j.enforce()
            if exclusive and j.name in exclusive and any(re.search(exclusive[j.name], l) for _, l in j.lines[-5:]):
                holding.add(j.name)
        if not current.alive():
            nxt = next((j for j in jobs if j.alive()), None)
            if nxt is None:
                break
            current, slot, yielding = nxt, now, False
            current.resume()
            continue
        if opts.yield_to_others:
            if not yielding:
                load = MONITOR.foreign(now - 2.0, now)
                if load == load and load > opts.busy_threshold and current.yield_s < opts.max_pause:
                    current.pause()
                    yielding = True
                    log(f"  other processes use {load:.2f} cores: pausing {current.name}")
                    continue
            else:
                waited = now - current.stops[-1][0]
                if MONITOR.foreign(now - 3.0, now) < opts.quiet_threshold or current.yield_s + waited >= opts.max_pause:
                    current.yield_s += waited
                    current.resume()
                    yielding = False
                    log(f"  resumed {current.name} after {waited:.0f}s")
                continue
        others = [j for j in jobs if j is not current and j.alive()]
        if slice_s and others and now - slot >= slice_s and current.name not in holding:
            current.pause()
            current = others[0]
            current.resume()
            slot = now
    time.sleep(MONITOR.interval * 1.5)
    results = []
    for j in jobs:
        r = j.finish()
        r["name"] = j.name
        r["foreign"] = MONITOR.foreign(r["start"], r["end"])
        log(f"  {j.name}: {r['wall']:.1f}s wall, stopped {r['stopped']:.0f}s; other processes used "
            f"{r['foreign']:.2f} CPU cores meanwhile")
        results.append(r)
    return results


def run_logged(name: str, cmd: list[str], log_path: str, opts: argparse.Namespace, env: Optional[dict] = None,
               echo: Optional[str] = None) -> dict:
    """One command alone on the CPU (paused while other processes are busy)."""
    return schedule([Job(name, cmd, log_path, env, echo)], opts)[0]


MONITOR = CpuMonitor()


def tool(name: str) -> list[str]:
    """Console script of the active environment (falls back to python -m)."""
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(exe):
        return [exe]
    found = shutil.which(name)
    if found:
        return [found]
    module = {"onmt_doc_train": "train", "onmt_doc_translate": "translate",
              "onmt_doc_build_vocab": "build_vocab"}[name]
    return [sys.executable, "-m", f"onmt_doc.bin.{module}"]


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n").strip() for line in f]


def write_lines(path: str, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def report_every(steps: int) -> int:
    """run_onmt_bench.sh's report_every; onmt_doc's log.every is set to the same value."""
    return 25 if steps >= 250 else (steps // 10 if steps >= 20 else 1)


# ----------------------------------------------------------------------------- batching replays

def onmt_doc_batches(n_src: np.ndarray, n_tgt: np.ndarray, batch_tokens: int, seed: int,
                     steps: int) -> list[np.ndarray]:
    """The example indices of onmt_doc's first ``steps`` training batches (its own BatchSampler on
    stand-in examples with the same lengths and markup as sentence_instances builds)."""
    from onmt_doc.data.batching import BatchSampler
    from onmt_doc.data.instances import sentence_instances

    docs = [[(np.zeros(s, np.int64), np.zeros(t, np.int64)) for s, t in zip(n_src, n_tgt)]]
    examples, _ = sentence_instances(docs)
    sampler = BatchSampler(examples, batch_tokens, seed)
    out: list[np.ndarray] = []
    epoch = 0
    while len(out) < steps:
        out.extend(sampler.epoch_batches(epoch)[: steps - len(out)])
        epoch += 1
    return out


def onmt_doc_epoch_mean(n_src: np.ndarray, n_tgt: np.ndarray, batch_tokens: int, seed: int) -> float:
    """Mean real target tokens per batch over one onmt_doc epoch."""
    from onmt_doc.data.batching import BatchSampler
    from onmt_doc.data.instances import sentence_instances

    docs = [[(np.zeros(s, np.int64), np.zeros(t, np.int64)) for s, t in zip(n_src, n_tgt)]]
    examples, _ = sentence_instances(docs)
    batches = BatchSampler(examples, batch_tokens, seed).epoch_batches(0)
    return float(n_tgt.sum()) / len(batches)


def onmt_py_bucket_batches(src_text: list[str], n_src: np.ndarray, n_tgt: np.ndarray,
                           batch_tokens: int, bucket_size: int = 262144) -> list[list[int]]:
    """OpenNMT-py 3.5.1's first bucket cut into batches (DynamicDatasetIter.batch_iter): the
    WeightedMixer cycles the corpus to fill ``bucket_size`` examples, the bucket is stably sorted
    by (len(src_ids), len(tgt_ids)) with tgt_ids = <s> + tgt + </s>, and a batch closes when
    n_sents * max(max(len(src_ids), len(tgt_ids))) reaches batch_size (dropping the overflowing
    example into the next batch); a source already in the current batch is skipped (deduplication)."""
    n = len(n_src)
    idx = np.arange(bucket_size) % n
    tgt_ids = n_tgt + 2
    order = idx[np.lexsort((tgt_ids[idx], n_src[idx]))]  # stable: sort by src then tgt, keep input order
    # np.lexsort is stable, so ties keep bucket order like Python's sorted()
    batches, cur, maxlen, seen = [], [], 0, set()
    for i in order:
        s = src_text[i]
        if s in seen:
            continue
        seen.add(s)
        cur.append(int(i))
        maxlen = max(maxlen, int(max(n_src[i], tgt_ids[i])))
        size = len(cur) * maxlen
        if size >= batch_tokens:
            if size > batch_tokens:
                batches.append(cur[:-1])
                cur = cur[-1:]
                maxlen = int(max(n_src[cur[0]], tgt_ids[cur[0]]))
                seen = set()  # as in ONMT: reset to empty although cur[0] stays in the batch
            else:
                batches.append(cur)
                cur, maxlen, seen = [], 0, set()
    if cur:
        batches.append(cur)
    return batches


def calibrate_batch_tokens(target: float, n_src: np.ndarray, n_tgt: np.ndarray, seed: int,
                           lo: int = 1024, hi: int = 8192) -> int:
    """Smallest batch_tokens whose epoch mean of real target tokens per batch is closest to ``target``."""
    best, best_err = lo, float("inf")
    a, b = lo, hi
    while a <= b:  # the epoch mean grows with batch_tokens (up to tiny non-monotone wiggles)
        m = (a + b) // 2
        v = onmt_doc_epoch_mean(n_src, n_tgt, m, seed)
        if abs(v - target) < best_err:
            best, best_err = m, abs(v - target)
        if v < target:
            a = m + 1
        else:
            b = m - 1
    for m in range(max(lo, best - 12), min(hi, best + 12) + 1):  # polish around the bisection point
        v = onmt_doc_epoch_mean(n_src, n_tgt, m, seed)
        if abs(v - target) < best_err:
            best, best_err = m, abs(v - target)
    return best


# ----------------------------------------------------------------------------- log parsers

STEP_RE = re.compile(r"step (\d+)/\d+ \| loss ([\d.]+) \| ppl ([\d.]+) \| acc ([\d.]+)% \| lr (\S+) \| "
                     r"gnorm (\S+) \| (\d+) tgt tok/s")
ONMT_STEP_RE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+) INFO\] Step\s+(\d+)/\s*\d+;.*?ppl:\s*([\d.]+);"
                          r".*?bsz:\s*(\d+)/(\d+)/(\d+);\s*(\d+)/(\d+) tok/s;\s*(\d+) sec", re.M)


def onmt_doc_intervals(lines: list, batches: list[np.ndarray], n_tgt: np.ndarray) -> list[dict]:
    """Report intervals of onmt_doc's training log (lines with their arrival times). Its 'tgt tok/s'
    counts every non-padding target position: the subwords plus <s>, </s> and <eos> (n+3 per
    sentence) over the summed step times; the real-token counts replay the exact batches."""
    real_cum = np.concatenate([[0], np.cumsum([n_tgt[b].sum() for b in batches])])
    cnt_cum = np.concatenate([[0], np.cumsum([(n_tgt[b] + 3).sum() for b in batches])])
    sents_cum = np.concatenate([[0], np.cumsum([len(b) for b in batches])])
    out, prev = [], 0
    for t, line in lines:
        m = STEP_RE.search(line)
        if not m:
            continue
        step, rate = int(m.group(1)), int(m.group(7))
        counted = float(cnt_cum[step] - cnt_cum[prev])
        out.append({"step": step, "steps": step - prev, "end": t, "counted": counted,
                    "real": float(real_cum[step] - real_cum[prev]), "sents": float(sents_cum[step] - sents_cum[prev]),
                    "seconds": counted / max(rate, 1e-9), "rate": rate, "ppl": float(m.group(3))})
        prev = step
    if not out:
        raise SystemExit("no step lines in the onmt_doc training log")
    return out


def onmt_py_intervals(text: str) -> list[dict]:
    """Report intervals of onmt_train's log. Its tgt tok/s counts target subwords + </s> (n+1 per
    sentence) over the interval's wall time; bsz src/tgt/sents are per-batch means of the interval."""
    out, prev = [], 0
    for m in ONMT_STEP_RE.finditer(text):
        stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
        step, ppl, bs, bt, bn, rs, rt, sec = (float(x) for x in m.groups()[2:])
        k = step - prev
        out.append({"step": int(step), "steps": k, "end": stamp, "counted": bt * k, "real": (bt - bn) * k,
                    "sents": bn * k, "seconds": bt * k / max(rt, 1e-9), "rate": rt, "ppl": ppl, "sec": sec})
        prev = step
    if not out:
        raise SystemExit("no Step lines in the OpenNMT-py training log")
    return out


def overlap(stops: list, t0: float, t1: float) -> float:
    """Seconds of the [start, end] periods in ``stops`` that fall inside [t0, t1]."""
    return sum(min(b if b is not None else t1, t1) - max(a, t0) for a, b in stops
               if (b is None or b > t0) and a < t1)


def steady_rates(intervals: list[dict], start: float, stops: list, threshold: float) -> dict:
    """Rates over the report intervals after the first (start-up excluded), restricted to the
    intervals during which the job was never stopped and other processes used less than
    ``threshold`` CPU cores (all intervals after the first if too few are clean)."""
    prev = start
    for iv in intervals:
        iv["foreign"] = MONITOR.foreign(prev, iv["end"])
        iv["stopped"] = overlap(stops, prev, iv["end"])
        prev = iv["end"]
    steady = intervals[1:] or intervals
    clean = [iv for iv in steady if iv["foreign"] == iv["foreign"] and iv["foreign"] < threshold and not iv["stopped"]]
    use = clean if len(clean) >= max(2, len(steady) // 4) else steady

    def rate(ivs: list[dict], key: str) -> float:
        return sum(i[key] for i in ivs) / sum(i["seconds"] for i in ivs)

    n_steps = sum(i["steps"] for i in intervals)
    half = len(use) // 2
    return {
        "real_tok_s": rate(use, "real"), "reported_tok_s": rate(use, "counted"), "steps_per_s": rate(use, "steps"),
        "real_tok_s_first_half": rate(use[:half] or use, "real"), "real_tok_s_second_half": rate(use[half:], "real"),
        "intervals_used": len(use), "intervals_steady": len(steady), "intervals_clean": len(clean),
        "foreign_used": sum(i["foreign"] * i["seconds"] for i in use) / sum(i["seconds"] for i in use),
        "real_tgt_per_step": sum(i["real"] for i in intervals) / n_steps,
        "counted_tgt_per_step": sum(i["counted"] for i in intervals) / n_steps,
        "sents_per_step": sum(i["sents"] for i in intervals) / n_steps,
        "last_ppl": intervals[-1]["ppl"],
        "trace": [(round(i["end"], 1), i["step"], round(i["real"] / i["seconds"]), i["stopped"] > 0,
                   round(i["foreign"], 2)) for i in intervals],
    }


def detok_scores(hyp_path: str, ref_path: str, subword_model: str) -> dict:
    """Detokenize space-separated subword hypotheses and score them as onmt_doc scores its output."""
    import pyonmttok

    from onmt_doc.evaluation.bleu import chrf, s_bleu

    tok = pyonmttok.Tokenizer("aggressive", joiner_annotate=True, bpe_model_path=subword_model)
    hyps = [tok.detokenize(line.split()) for line in read_lines(hyp_path)]
    refs = read_lines(ref_path)
    if len(hyps) != len(refs):
        raise SystemExit(f"{hyp_path}: {len(hyps)} lines but {ref_path} has {len(refs)}")
    write_lines(hyp_path + ".detok", hyps)
    return {"bleu": s_bleu(hyps, refs), "chrf": chrf(hyps, refs)}


def window(lines: list, begin: str, end: Optional[str], default_end: float) -> Optional[tuple[float, float]]:
    """Times of the first output line matching ``begin`` and of the next one matching ``end``."""
    t0 = next((t for t, line in lines if re.search(begin, line)), None)
    if t0 is None:
        return None
    t1 = next((t for t, line in lines if t > t0 and end and re.search(end, line)), default_end)
    return t0, t1


def disturbance(res: dict, win: Optional[tuple[float, float]]) -> tuple[float, float]:
    """(other processes' CPU cores, seconds stopped) during a window of a job."""
    if win is None:
        return float("nan"), 0.0
    return MONITOR.foreign(*win), overlap(res["stops"], *win)


def onmt_attempt(res: dict, onmt_dir: str, k: int) -> dict:
    """Timings of one run_onmt_bench.sh run, read right after it (the next run overwrites the files)."""
    summary = open(os.path.join(onmt_dir, "summary.txt"), encoding="utf-8").read()
    shutil.copyfile(os.path.join(onmt_dir, "summary.txt"), os.path.join(onmt_dir, f"summary.{k}.txt"))
    m = re.search(r"translation time ([\d.]+) s \(process wall ([\d.]+) s", summary)
    res.update({"attempt": k, "summary": summary, "translate_s": float(m.group(1)),
                "translate_process_wall": float(m.group(2)), "ct2": {}})
    res["translate_foreign"], res["translate_stopped"] = disturbance(
        res, window(res["lines"], r"^== onmt_translate", r"^== CTranslate2", res["end"]))
    res["ct2_foreign"], res["ct2_stopped"] = disturbance(
        res, window(res["lines"], r"^== CTranslate2", r"^== OpenNMT-py training", res["end"]))
    res["train_window"] = window(res["lines"], r"^== train", r"^== onmt_translate", res["end"])
    for tag, logname in (("fp32", "ct2_translate.log"), ("int8", "ct2_translate_int8.log")):
        path = os.path.join(onmt_dir, logname)
        if os.path.exists(path):
            mm = re.search(r"median ([\d.]+)s", open(path, encoding="utf-8").read())
            res["ct2"][tag] = float(mm.group(1))
    return res


def save_phases(path: str, phases: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"phases": phases, "cpu_samples": MONITOR.samples}, f)


def load_phases(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    MONITOR.samples[:0] = [tuple(x) for x in saved["cpu_samples"]]
    MONITOR.samples.sort()
    return saved["phases"]


def clean_mean(runs: list[dict], key: str, foreign_key: str, stopped_key: str, thr: float) -> tuple[float, list]:
    """Mean of ``key`` over the undisturbed runs (all runs if none is undisturbed)."""
    ok = [r for r in runs if r[foreign_key] == r[foreign_key] and r[foreign_key] < thr and not r[stopped_key]]
    vals = [r[key] for r in (ok or runs)]
    return sum(vals) / len(vals), vals


# ----------------------------------------------------------------------------- main

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--out", default="runs/bench_transformer")
    p.add_argument("--data", default="/work/shared/data/multi30k-en-de")
    p.add_argument("--train-lines", type=int, default=0, help="use the first N training pairs (0 = all)")
    p.add_argument("--peers", default="/work/shared/peers", help="folder with run_onmt_bench.sh")
    p.add_argument("--venv", default=os.path.join(os.environ.get("PEERS_DIR", os.path.expanduser("~/.cache/onmt-peers")), "venv"))
    p.add_argument("--vocab-size", type=int, default=8000, help="BPE symbols (8000 -> ~7.98k entries on multi30k)")
    p.add_argument("--warmup", type=int, default=100, help="noam warmup (run_onmt_bench.sh default)")
    p.add_argument("--lr", type=float, default=0.5, help="noam factor (run_onmt_bench.sh default)")
    p.add_argument("--onmt-batch-tokens", type=int, default=2048)
    p.add_argument("--batch-tokens", type=int, default=0,
                   help="onmt_doc train.batch_tokens (0 = calibrate to OpenNMT-py's real target tokens per step)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--tbatch", type=int, default=32, help="sentences per translation batch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234, help="OpenNMT-py seed")
    p.add_argument("--sequential", action="store_true",
                   help="train onmt_doc, then OpenNMT-py (default: alternate them every --slice seconds)")
    p.add_argument("--slice", type=float, default=90.0,
                   help="seconds of CPU each training gets before the other one's turn (never both at once)")
    p.add_argument("--translate-rounds", type=int, default=2,
                   help="timed translations per toolkit, alternating onmt_doc / OpenNMT-py+CT2")
    p.add_argument("--no-bf16", dest="bf16", action="store_false",
                   help="skip the extra onmt_doc translation rounds with -dtype bfloat16")
    p.add_argument("--quiet-threshold", type=float, default=0.15,
                   help="an interval/translation is clean when other processes used fewer CPU cores")
    p.add_argument("--busy-threshold", type=float, default=0.5,
                   help="pause the running toolkit while other processes use more CPU cores than this")
    p.add_argument("--no-yield", action="store_true", help="never pause for other processes")
    p.add_argument("--max-pause", type=float, default=300, help="seconds a command may be paused for others")
    p.add_argument("--max-wait", type=float, default=120, help="seconds to wait for a quiet machine per phase")
    p.add_argument("--report-only", action="store_true", help="re-read a finished run in --out and report")
    p.add_argument("--docs", default=os.path.join(REPO, "docs", "benchmarks.md"))
    p.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    args = p.parse_args()
    args.yield_to_others = not args.no_yield

    MONITOR.sample()
    MONITOR.start()
    t_start = time.perf_counter()
    thr = args.quiet_threshold
    out = os.path.abspath(args.out)
    data_dir = os.path.join(out, "data")
    ours_dir = os.path.join(out, "onmt_doc")
    run_dir = os.path.join(ours_dir, "run")
    onmt_dir = os.path.join(out, "onmt_py")
    tok_dir = os.path.join(onmt_dir, "tok")
    for d in (data_dir, ours_dir, tok_dir):
        os.makedirs(d, exist_ok=True)
    every = report_every(args.steps)
    commands: list[str] = []

    # ---- data
    raw = {split: {lang: os.path.join(args.data, f"{split}.{lang}") for lang in ("en", "de")}
           for split in ("train", "valid", "test2016")}
    if args.train_lines:
        for lang in ("en", "de"):
            path = os.path.join(data_dir, f"train.{lang}")
            write_lines(path, read_lines(raw["train"][lang])[: args.train_lines])
            raw["train"][lang] = path
    n_train = len(read_lines(raw["train"]["en"]))
    n_test = len(read_lines(raw["test2016"]["en"]))
    log(f"data: {n_train} training pairs, {n_test} test sentences; {args.steps} steps, report every {every}")

    # ---- onmt_doc config + vocabulary
    config = {
        "data": {"train": {"src": raw["train"]["en"], "tgt": raw["train"]["de"]},
                 "valid": {"src": raw["valid"]["en"], "tgt": raw["valid"]["de"]},
                 "documents": False},
        "vocab": {"subword": "bpe", "size": args.vocab_size, "shared": True, "tokenizer": "aggressive"},
        "model": {"d_model": 256, "dropout": 0.1, "attention_dropout": 0.1,
                  "share_embeddings": True, "tie_output": True,
                  "encoder": {"type": "transformer", "layers": 3, "heads": 4, "ff": 1024},
                  "decoder": {"type": "transformer", "layers": 3, "heads": 4, "ff": 1024}},
        "loss": [{"type": "label_smoothed_ce", "smoothing": 0.1}],
        "optim": {"type": "adam", "lr": args.lr, "betas": [0.9, 0.998], "eps": 1.0e-8,
                  "schedule": {"type": "noam", "warmup": args.warmup}},
        "train": {"batch_tokens": args.batch_tokens or args.onmt_batch_tokens, "max_steps": args.steps,
                  "valid_every": args.steps, "valid_bleu": False, "save_every": args.steps, "keep_last": 1,
                  "max_grad_norm": 0.0, "seed": OURS_SEED, "threads": args.threads,
                  "amp": "fp32"},                    # float32 like OpenNMT-py here (bf16 is opt-in on CPUs)
        "translate": {"beam": args.beam, "dtype": "float32"},
        "log": {"dir": run_dir, "tensorboard": False, "every": every},
    }
    config_path = os.path.join(ours_dir, "config.yaml")

    def write_config() -> None:
        import yaml
        with open(config_path, "w", encoding="utf-8") as f:
            f.write("# written by benchmarks/transformer_vs_onmt.py\n")
            yaml.safe_dump(config, f, sort_keys=False)

    subword_model = os.path.join(run_dir, "subword.model")
    vocab_cmd = tool("onmt_doc_build_vocab") + ["-config", config_path]
    commands.append(" ".join(vocab_cmd))
    if not args.report_only:
        shutil.rmtree(run_dir, ignore_errors=True)
        write_config()
        run_logged("onmt_doc_build_vocab", vocab_cmd, os.path.join(ours_dir, "build_vocab.log"), args,
                   echo=r"written to")
    vocab_entries = len([1 for line in open(os.path.join(run_dir, "vocab.txt"), encoding="utf-8") if line.strip()])

    # ---- identical subwords for OpenNMT-py
    import pyonmttok
    tok = pyonmttok.Tokenizer("aggressive", joiner_annotate=True, bpe_model_path=subword_model)
    lengths: dict = {}
    texts: dict = {}
    for split, name in (("train", "train"), ("valid", "valid"), ("test2016", "test")):
        for lang in ("en", "de"):
            toks = tok.tokenize_batch(read_lines(raw[split][lang]))[0]
            if not args.report_only:
                write_lines(os.path.join(tok_dir, f"{name}.{lang}"), [" ".join(t) for t in toks])
            if split == "train":
                lengths[lang] = np.array([len(t) for t in toks], dtype=np.int64)
                texts[lang] = [" ".join(t) for t in toks]
    n_src, n_tgt = lengths["en"], lengths["de"]
    log(f"tokenized with {os.path.relpath(subword_model, REPO)}: {vocab_entries} vocabulary entries; train "
        f"mean {n_src.mean():.1f} src / {n_tgt.mean():.1f} tgt subwords per sentence")

    # ---- batch calibration (replays of both batchings on these lengths)
    onmt_sim = onmt_py_bucket_batches(texts["en"], n_src, n_tgt, args.onmt_batch_tokens)
    onmt_sim_real = float(np.mean([n_tgt[b].sum() for b in onmt_sim]))
    onmt_sim_sents = float(np.mean([len(b) for b in onmt_sim]))
    batch_tokens = args.batch_tokens or calibrate_batch_tokens(onmt_sim_real, n_src, n_tgt, OURS_SEED)
    ours_at_same = onmt_doc_epoch_mean(n_src, n_tgt, args.onmt_batch_tokens, OURS_SEED)
    ours_epoch_real = onmt_doc_epoch_mean(n_src, n_tgt, batch_tokens, OURS_SEED)
    log(f"batches: OpenNMT-py batch_size {args.onmt_batch_tokens} -> {onmt_sim_real:.0f} real tgt tokens/batch "
        f"({onmt_sim_sents:.1f} sents, replay of its bucket); onmt_doc batch_tokens {args.onmt_batch_tokens} -> "
        f"{ours_at_same:.0f}; calibrated batch_tokens {batch_tokens} -> {ours_epoch_real:.0f}")
    config["train"]["batch_tokens"] = batch_tokens

    # ---- commands
    ours_hyp = os.path.join(ours_dir, "test.hyp")
    ours_train_log = os.path.join(ours_dir, "train.log")
    ckpt = os.path.join(run_dir, "checkpoints", "last.pt")
    train_cmd = tool("onmt_doc_train") + ["-config", config_path]
    translate_cmd = tool("onmt_doc_translate") + [
        "-model", ckpt, "-src", raw["test2016"]["en"], "-tgt", raw["test2016"]["de"], "-beam", str(args.beam),
        "-batch_size", str(args.tbatch), "-threads", str(args.threads), "-output", ours_hyp]
    translate_bf16_cmd = [a if a != ours_hyp else ours_hyp + ".bf16" for a in translate_cmd] + ["-dtype", "bfloat16"]
    env = dict(os.environ, STEPS=str(args.steps), LAYERS="3", DMODEL="256", HEADS="4", FF="1024", DROPOUT="0.1",
               BATCH_TOKENS=str(args.onmt_batch_tokens), WARMUP=str(args.warmup), LR=str(args.lr),
               BEAM=str(args.beam), TBATCH=str(args.tbatch), THREADS=str(args.threads), VOCAB_SIZE="32768",
               SRC_EXT="en", TGT_EXT="de", SEED=str(args.seed), VENV=args.venv, CT2_INT8="1")
    onmt_cmd = ["bash", os.path.join(args.peers, "run_onmt_bench.sh"), os.path.join(tok_dir, "train"),
                os.path.join(tok_dir, "valid"), os.path.join(tok_dir, "test"), onmt_dir]
    env_str = " ".join(f"{k}={env[k]}" for k in ("STEPS", "LAYERS", "DMODEL", "HEADS", "FF", "DROPOUT", "BATCH_TOKENS",
                                                  "WARMUP", "LR", "BEAM", "TBATCH", "THREADS", "VOCAB_SIZE",
                                                  "SRC_EXT", "TGT_EXT", "SEED"))
    commands += [" ".join(train_cmd), env_str + " " + " ".join(onmt_cmd), " ".join(translate_cmd),
                 f"SKIP_TRAIN=1 {env_str} {' '.join(onmt_cmd)}   # further translation rounds"]
    phases_path = os.path.join(out, "phases.json")
    echo_ours = r"step \d+/|validation|parameters|error"
    echo_onmt = r"^==|BLEU|sent/s|sentences/s"

    # ---- run: the two trainings time-sliced (never both on the CPU), then alternating translations
    if not args.report_only:
        write_config()
        for sub in ("checkpoints", "tensorboard"):
            shutil.rmtree(os.path.join(run_dir, sub), ignore_errors=True)
        for f in os.listdir(onmt_dir):
            if f.startswith(("model_step_", "summary")):
                os.remove(os.path.join(onmt_dir, f))
        phases: dict = {"onmt": [], "translate_ours": []}
        MONITOR.wait_quiet(args.max_wait, threshold=thr)
        onmt_env = dict(env, SKIP_TRAIN="0")
        if args.sequential:
            phases["train_ours"] = run_logged("onmt_doc_train", train_cmd, ours_train_log, args, echo=echo_ours)
            MONITOR.wait_quiet(args.max_wait, threshold=thr)
            res = run_logged("run_onmt_bench", onmt_cmd, os.path.join(onmt_dir, "bench.0.log"), args, onmt_env, echo_onmt)
        else:
            log(f"training both toolkits time-sliced: {args.slice:.0f}s of CPU each in turn, never both at once")
            jobs = [Job("onmt_doc_train", train_cmd, ours_train_log, echo=echo_ours),
                    Job("run_onmt_bench", onmt_cmd, os.path.join(onmt_dir, "bench.0.log"), onmt_env, echo_onmt,
                        stopped=True)]
            phases["train_ours"], res = schedule(jobs, args, slice_s=args.slice,
                                                 exclusive={"run_onmt_bench": r"^== onmt_translate"})
        phases["onmt"].append(onmt_attempt(res, onmt_dir, 0))
        tries = 0
        while len(phases["translate_ours"]) < args.translate_rounds and tries < 3 * args.translate_rounds:
            tries += 1
            MONITOR.wait_quiet(args.max_wait, threshold=thr)
            r = run_logged("onmt_doc_translate", translate_cmd, os.path.join(ours_dir, f"translate.{tries}.log"),
                           args, echo=r"translated|BLEU|error")
            r["translate_s"] = float(re.search(r"translated .* in ([\d.]+)s", "\n".join(l for _, l in r["lines"])).group(1))
            r["translate_foreign"], r["translate_stopped"] = r["foreign"], r["stopped"]
            if r["foreign"] < thr and not r["stopped"]:
                phases["translate_ours"].append(r)
            else:
                log("  disturbed by other processes: this translation is timed again")
                phases.setdefault("translate_ours_disturbed", []).append(r)
                continue
            if args.bf16:
                MONITOR.wait_quiet(args.max_wait, threshold=thr)
                r = run_logged("onmt_doc_translate -dtype bfloat16", translate_bf16_cmd,
                               os.path.join(ours_dir, f"translate_bf16.{tries}.log"), args, echo=r"translated|BLEU|error")
                r["translate_s"] = float(re.search(r"translated .* in ([\d.]+)s", "\n".join(l for _, l in r["lines"])).group(1))
                r["translate_foreign"], r["translate_stopped"] = r["foreign"], r["stopped"]
                phases.setdefault("translate_ours_bf16", []).append(r)
            clean_onmt = [a for a in phases["onmt"] if a["translate_foreign"] < thr and not a["translate_stopped"]]
            if len(clean_onmt) < args.translate_rounds:
                MONITOR.wait_quiet(args.max_wait, threshold=thr)
                k = len(phases["onmt"])
                res = run_logged("run_onmt_bench (SKIP_TRAIN=1)", onmt_cmd, os.path.join(onmt_dir, f"bench.{k}.log"),
                                 args, dict(env, SKIP_TRAIN="1"), echo_onmt)
                phases["onmt"].append(onmt_attempt(res, onmt_dir, k))
        if not phases["translate_ours"]:
            phases["translate_ours"] = phases.pop("translate_ours_disturbed")
        save_phases(phases_path, phases)
    else:
        phases = load_phases(phases_path)

    # ---- onmt_doc results
    tr = phases["train_ours"]
    ours_batches = onmt_doc_batches(n_src, n_tgt, batch_tokens, OURS_SEED, args.steps)
    ours = steady_rates(onmt_doc_intervals(tr["lines"], ours_batches, n_tgt), tr["start"], tr["stops"], thr)
    ours["train_wall"] = tr["wall"] - tr["stopped"]
    ours["train_stopped"] = tr["stopped"]
    ours["translate_s"], ours["translate_runs"] = clean_mean(phases["translate_ours"], "translate_s",
                                                             "translate_foreign", "translate_stopped", thr)
    ours["sent_s"] = n_test / ours["translate_s"]
    if phases.get("translate_ours_bf16"):
        t16, runs16 = clean_mean(phases["translate_ours_bf16"], "translate_s", "translate_foreign", "translate_stopped", thr)
        text16 = "\n".join(line for _, line in phases["translate_ours_bf16"][-1]["lines"])
        ours["bf16"] = {"translate_s": t16, "runs": runs16, "sent_s": n_test / t16,
                        "bleu": float(re.search(r"BLEU ([\d.]+)", text16).group(1))}
    text = "\n".join(line for _, line in phases["translate_ours"][-1]["lines"])
    m = re.search(r"BLEU ([\d.]+) \| chrF ([\d.]+)", text)
    ours["bleu"], ours["chrf"] = float(m.group(1)), float(m.group(2))
    vm = re.findall(r"validation at step \d+: loss ([\d.]+) \| ppl ([\d.]+)", open(ours_train_log, encoding="utf-8").read())
    ours["valid_ppl"] = float(vm[-1][1]) if vm else None
    from onmt_doc.models.checkpoint import load_model
    model, _, _ = load_model(ckpt)
    ours["params"] = model.n_params()
    del model
    ours["hyp_subwords"] = sum(len(tok.tokenize(h)[0]) for h in read_lines(ours_hyp))

    # ---- OpenNMT-py / CTranslate2 results
    attempts = phases["onmt"]
    first = attempts[0]
    train_log_text = open(os.path.join(onmt_dir, "train.log"), encoding="utf-8").read()
    theirs = steady_rates(onmt_py_intervals(train_log_text), first["train_window"][0], first["stops"], thr)
    params = re.search(r"\* number of parameters: (\d+)", train_log_text)
    theirs["params"] = int(params.group(1)) if params else 0
    vppl = re.findall(r"Validation perplexity: ([\d.]+)", train_log_text)
    theirs["valid_ppl"] = float(vppl[-1]) if vppl else None
    m = re.search(r"train wall .*?: ([\d.]+) s", first["summary"])
    theirs["train_stopped"] = overlap(first["stops"], *first["train_window"])
    theirs["train_wall"] = (float(m.group(1)) if m else float("nan")) - theirs["train_stopped"]
    theirs["translate_s"], theirs["translate_runs"] = clean_mean(attempts, "translate_s", "translate_foreign",
                                                                 "translate_stopped", thr)
    theirs["sent_s"] = n_test / theirs["translate_s"]
    tok_bleu = dict(re.findall(r"^(onmt|ct2 fp32|ct2 int8): BLEU ([\d.]+)", first["summary"], re.M))
    theirs["bleu_tok"] = float(tok_bleu["onmt"]) if "onmt" in tok_bleu else float("nan")
    theirs.update(detok_scores(os.path.join(onmt_dir, "test.onmt.hyp"), raw["test2016"]["de"], subword_model))
    theirs["hyp_subwords"] = sum(len(line.split()) for line in read_lines(os.path.join(onmt_dir, "test.onmt.hyp")))
    ct2 = {}
    for tag, hyp in (("fp32", "test.ct2.hyp"), ("int8", "test.ct2int8.hyp")):
        runs = [dict(a, ct2_s=a["ct2"][tag]) for a in attempts if tag in a["ct2"]]
        if runs:
            t, vals = clean_mean(runs, "ct2_s", "ct2_foreign", "ct2_stopped", thr)
            ct2[tag] = {"translate_s": t, "runs": vals, "sent_s": n_test / t,
                        "bleu_tok": float(tok_bleu.get(f"ct2 {tag}", "nan")),
                        **detok_scores(os.path.join(onmt_dir, hyp), raw["test2016"]["de"], subword_model)}
    MONITOR.stop()

    # ---- table
    r_train = ours["real_tok_s"] / theirs["real_tok_s"]
    r_trans = ours["sent_s"] / theirs["sent_s"]
    d_bleu = ours["bleu"] - theirs["bleu"]

    def ok(flag: bool) -> str:
        return "yes" if flag else "**no**"

    def c(tag: str, key: str, fmt: str) -> str:
        return format(ct2[tag][key], fmt) if tag in ct2 else "n/a"

    rows = [
        "| | onmt_doc | OpenNMT-py 3.5.1 | onmt_doc / ONMT | target | met | CT2 fp32 | CT2 int8 |",
        "|---|---:|---:|---:|---:|:-:|---:|---:|",
        f"| parameters | {ours['params']:,} | {theirs['params']:,} | {ours['params'] / theirs['params']:.3f} | | | | |",
        f"| batch: real target subwords / step (all {args.steps} steps) | {ours['real_tgt_per_step']:.0f} | "
        f"{theirs['real_tgt_per_step']:.0f} | {ours['real_tgt_per_step'] / theirs['real_tgt_per_step']:.3f} | ≈ 1 | | | |",
        f"| batch: sentences / step | {ours['sents_per_step']:.1f} | {theirs['sents_per_step']:.1f} | "
        f"{ours['sents_per_step'] / theirs['sents_per_step']:.3f} | | | | |",
        f"| **training: real target subwords / s** (steady state) | {ours['real_tok_s']:.0f} | {theirs['real_tok_s']:.0f} | "
        f"**{r_train:.2f}×** | ≥ {TARGETS['train']}× | {ok(r_train >= TARGETS['train'])} | | |",
        f"| training: steps / s | {ours['steps_per_s']:.3f} | {theirs['steps_per_s']:.3f} | "
        f"{ours['steps_per_s'] / theirs['steps_per_s']:.2f}× | | | | |",
        f"| training: tgt tok/s as each logs it (onmt_doc counts n+3, ONMT n+1 tokens per sentence) | "
        f"{ours['reported_tok_s']:.0f} | {theirs['reported_tok_s']:.0f} | "
        f"{ours['reported_tok_s'] / theirs['reported_tok_s']:.2f}× | | | | |",
        f"| training: report intervals used / clean / after the first | "
        f"{ours['intervals_used']} / {ours['intervals_clean']} / {ours['intervals_steady']} | "
        f"{theirs['intervals_used']} / {theirs['intervals_clean']} / {theirs['intervals_steady']} | | | | | |",
        f"| training command wall, s (incl. start-up, validation, save; pauses excluded) | {ours['train_wall']:.0f} | "
        f"{theirs['train_wall']:.0f} | {theirs['train_wall'] / ours['train_wall']:.2f}× speed | | | | |",
        f"| **translation: sentences / s** (beam {args.beam}, {args.tbatch} sents/batch, load excluded) | "
        f"{ours['sent_s']:.1f} | {theirs['sent_s']:.1f} | **{r_trans:.2f}×** | ≥ {TARGETS['translate']}× | "
        f"{ok(r_trans >= TARGETS['translate'])} | {c('fp32', 'sent_s', '.1f')} | {c('int8', 'sent_s', '.1f')} |",
        *([f"| translation: sentences / s, onmt_doc `-dtype bfloat16` (BLEU {ours['bf16']['bleu']:.2f}) vs "
           f"OpenNMT-py float32 | {ours['bf16']['sent_s']:.1f} | {theirs['sent_s']:.1f} | "
           f"{ours['bf16']['sent_s'] / theirs['sent_s']:.2f}× | | | | |"] if "bf16" in ours else []),
        f"| translation time, s ({n_test} sentences) | {ours['translate_s']:.1f} | {theirs['translate_s']:.2f} | | | | "
        f"{c('fp32', 'translate_s', '.2f')} | {c('int8', 'translate_s', '.2f')} |",
        f"| output subwords (test2016) | {ours['hyp_subwords']} | {theirs['hyp_subwords']} | | | | | |",
        f"| **BLEU** (detokenized, sacrebleu 13a vs raw test2016.de) | {ours['bleu']:.2f} | {theirs['bleu']:.2f} | "
        f"**{d_bleu:+.2f}** | ≥ {TARGETS['bleu']} | {ok(d_bleu >= TARGETS['bleu'])} | {c('fp32', 'bleu', '.2f')} | "
        f"{c('int8', 'bleu', '.2f')} |",
        f"| chrF (detokenized) | {ours['chrf']:.2f} | {theirs['chrf']:.2f} | {ours['chrf'] - theirs['chrf']:+.2f} | | | "
        f"{c('fp32', 'chrf', '.2f')} | {c('int8', 'chrf', '.2f')} |",
        f"| BLEU on tokenized subword output (run_onmt_bench.sh's score) | | {theirs['bleu_tok']:.2f} | "
        f"| | | {c('fp32', 'bleu_tok', '.2f')} | {c('int8', 'bleu_tok', '.2f')} |",
        f"| training: real target subwords / s in the first / second half of the used intervals | "
        f"{ours['real_tok_s_first_half']:.0f} / {ours['real_tok_s_second_half']:.0f} | "
        f"{theirs['real_tok_s_first_half']:.0f} / {theirs['real_tok_s_second_half']:.0f} | | | | | |",
        f"| valid perplexity (onmt_doc's includes its <s> </s> <eos> markup) | {ours['valid_ppl']} | "
        f"{theirs['valid_ppl']} | | | | | |",
    ]
    table = "\n".join(rows)

    import torch
    machine = (f"{cpu_model()}, {os.cpu_count()} cores visible, {args.threads} threads for every tool; "
               f"torch {torch.__version__}, Python {platform.python_version()}")
    date = datetime.date.today().isoformat()
    notes = [
        f"Data: Multi30k en→de, {n_train} training pairs, test2016 ({n_test} sentences); one shared BPE "
        f"(`vocab.size {args.vocab_size}`, {vocab_entries} entries) learned by onmt_doc and applied to the "
        "OpenNMT-py files with pyonmttok, so both toolkits see identical subwords.",
        f"Same shape and schedule: d_model 256, 3+3 layers, 4 heads, ff 1024, dropout/attention dropout 0.1, "
        f"tied embeddings, Adam (0.9, 0.998, eps 1e-8), noam lr {args.lr} warmup {args.warmup}, label smoothing 0.1, "
        f"no clipping, {args.steps} steps.",
        f"Batches: OpenNMT-py `batch_size {args.onmt_batch_tokens}` tokens counts B·max(src, tgt+2); onmt_doc's "
        f"`train.batch_tokens` counts B·max(src+2, tgt+3) (sentence markup), so onmt_doc uses "
        f"`batch_tokens {batch_tokens}` to carry the same real target subwords per step "
        f"(at {args.onmt_batch_tokens} it would carry {ours_at_same:.0f} vs {onmt_sim_real:.0f}).",
        "Training rate: real target subwords (markup and </s> excluded) per second over the report intervals "
        "after the first (start-up excluded), using only intervals in which the toolkit was never stopped and other "
        f"processes on this shared machine took < {thr} CPU cores; the logged rates count different tokens. "
        + ("The two trainings ran one after the other." if args.sequential else
           f"The two trainings were time-sliced ({args.slice:.0f} s turns, the other one SIGSTOPped, never both on "
           "the CPU) so that both see the same machine: this VM's speed drifts by 20-30% within minutes."),
        "Translation: model load excluded for both (onmt_doc `translated … in Xs`, OpenNMT-py `Total translation "
        "time`; tokenization included), mean of the undisturbed runs, alternating between the toolkits: onmt_doc "
        f"{ours['translate_runs']} s, OpenNMT-py {theirs['translate_runs']} s; CT2 is the median of 3 runs after "
        f"loading per round ({ct2.get('fp32', {}).get('runs')} s fp32). Length penalty: onmt_doc GNMT α=1, "
        "OpenNMT-py `avg`, CT2 length_penalty 1. Output lengths differ (different models), so sentences/s also "
        "reflects how long the hypotheses are; onmt_doc also decodes its <s> and </s> markup (2 extra steps; its first two steps, <bos> and the "
        "forced <s>, run one row per sentence instead of one per beam)." + (
            f" The bfloat16 row translates the same float32 checkpoint in bfloat16 (`-dtype bfloat16`, this CPU has "
            f"AMX), runs {ours['bf16']['runs']} s." if "bf16" in ours else ""),
        "Parameters: OpenNMT-py 3.5 Transformers have no biases in the attention and FFN projections by default "
        "(`add_qkvbias`/`add_ffnbias` off); onmt_doc has them.",
    ]
    cmd_block = "\n".join(commands)
    section = "\n".join([
        SECTION, "",
        f"Date: {date}. Machine: {machine}.", "",
        "Commands (the whole comparison is `python benchmarks/transformer_vs_onmt.py "
        f"--steps {args.steps} --out {os.path.relpath(out, REPO)}`"
        f"{' --train-lines ' + str(args.train_lines) if args.train_lines else ''}; peers venv from "
        "`/work/shared/peers/setup_peers.sh` + `benchmarks/setup_peers_extra.sh`):", "",
        "```", cmd_block, "```", "",
        table, "",
        *[f"- {n}" for n in notes], "",
    ])
    print("\n" + table + "\n")
    for n in notes:
        print("- " + n)

    def strip(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in ("lines", "summary")}

    results = {"date": date, "machine": machine, "args": vars(args), "batch_tokens": batch_tokens,
               "onmt_replay_real_tgt_per_batch": onmt_sim_real, "onmt_replay_sents_per_batch": onmt_sim_sents,
               "ours_real_tgt_per_batch_at_onmt_budget": ours_at_same, "onmt_doc": ours, "onmt_py": theirs,
               "onmt_py_attempts": [strip(a) for a in attempts],
               "translate_ours": [strip(a) for a in phases["translate_ours"]], "ct2": ct2, "commands": commands,
               "ratios": {"train": r_train, "translate": r_trans, "bleu_diff": d_bleu}}
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, default=float)
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write(section)
    if not args.no_docs:
        update_docs(args.docs, section)
        log(f"updated {os.path.relpath(args.docs, REPO)}")
    log(f"done in {time.perf_counter() - t_start:.0f}s; results in {os.path.relpath(out, REPO)}/results.json")


def update_docs(path: str, section: str) -> None:
    """Replace (or append) this benchmark's section; keep everything else as it is."""
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.rstrip("\n") == SECTION), None)
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


if __name__ == "__main__":
    main()
