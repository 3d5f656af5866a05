"""Data at WMT scale (issue 30): peak memory and time of preparing and starting to train on a large
synthetic corpus. Per corpus size: ``onmt_doc_build_vocab`` (counting on the last worker count),
binarization into the mapped cache with each number of workers (the caches compared byte for byte),
and a training process from start to its last step (``max_steps``) on the cached corpus, alone and
as 2 torchrun processes (Gloo). With ``model: context_gates`` the trained model is the
regularized context gates' (the gated decoder and the ``pmi_gate_hinge`` loss, whose z* is a
per-example field read from the cache with the ids) and a ``pmi_table`` phase builds its PMI table
first. Each phase runs in a fresh interpreter (:data:`PHASE`) that reports
its own peak resident memory (``ru_maxrss``: mapped file pages it touched included, which are shared
and reclaimable; ``rss_anon_mib`` at the end is its private memory), its worker processes' largest
peak, wall and CPU time (its workers' included)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import yaml

from benchmarks.suite.stage import StageContext, stage

# one phase in a fresh interpreter: only what the phase imports counts in its peak memory
PHASE = r"""
import json, os, resource, sys, time
a = json.loads(sys.argv[1])
t0, c0 = time.time(), os.times()
if a["phase"] == "build_vocab":
    from onmt_doc.bin.build_vocab import main
    code = main(["-config", a["config"]])
elif a["phase"] == "binarize":
    from onmt_doc.config import load_config
    from onmt_doc.data.cache import binarize, cache_key
    from onmt_doc.data.prepare import load_codec
    cfg = load_config(a["config"])
    codec = load_codec(cfg.vocab, cfg.log.dir)
    c = cfg.data.train
    folder = os.path.join(a["cache_dir"], cache_key(c.src, c.tgt, codec, cfg.data.documents))
    binarize(c.src, c.tgt, codec, cfg.data.documents, cfg.data.max_line_chars, folder, a["workers"])
    code = 0
elif a["phase"] == "pmi_table":
    from onmt_doc.bin.build_pmi_table import main
    code = main(["-config", a["config"], "-output", a["table"]])
else:
    from onmt_doc.bin.train import main
    code = main(["-config", a["config"]])
t1, c1 = time.time(), os.times()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print("PHASE " + json.dumps({
    "rank": int(os.environ.get("RANK", "0")), "exit": code or 0, "wall_s": round(t1 - t0, 2),
    "cpu_s": round(sum(c1[:4]) - sum(c0[:4]), 2),
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "workers_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    "rss_anon_mib": round(int(status.get("RssAnon", "0 kB").split()[0]) / 1024, 1),
}))
"""


@dataclass
class DataScaleParams:
    pairs: list[int] = field(default_factory=lambda: [1_000_000, 4_000_000, 10_000_000])
    workers: list[int] = field(default_factory=lambda: [1, 2])
    # train_ddp: the same training in 2 torchrun processes (Gloo), each process's own peak
    phases: list[str] = field(default_factory=lambda: ["build_vocab", "binarize", "train", "train_ddp"])
    # transformer: a sentence Transformer; context_gates: the gated decoder trained with pmi_gate_hinge
    # (its PMI table built in the pmi_table phase, z* computed and cached when training starts)
    model: str = "transformer"
    vocab_size: int = 8000
    sample_lines: int = 1_000_000  # vocab.sample_lines
    train_steps: int = 20
    batch_tokens: int = 4096
    d_model: int = 64  # a small model: the phase measures the data path, not the model
    seed: int = 1
    threads: int = 1
    corpus_from: str = ""  # a folder with train.en/train.de to use instead of making one (one size)
    vocab_from: str = ""  # a run folder whose subword.model and vocab.txt to use (phases without build_vocab)


def run_phase(ctx: StageContext, args: dict, log: str, processes: int = 1) -> dict:
    """One phase in its own interpreter (OMP_NUM_THREADS from the params), or in ``processes``
    torchrun processes; its report line (several processes: the largest peak, and each rank's)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.pop("threads"))}
    command = [sys.executable, "-c", PHASE, json.dumps(args)]
    if processes > 1:
        script = os.path.join(ctx.work_dir(), "phase.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(PHASE)
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
        command = [*launcher, script, json.dumps(args)]
    with open(log, "a", encoding="utf-8") as err:
        out = subprocess.run(
            command,
            cwd=ctx.repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=max(ctx.seconds_left(), 1),
        )
    rows = [json.loads(x[len("PHASE ") :]) for x in out.stdout.splitlines() if x.startswith("PHASE ")]
    if out.returncode or len(rows) < processes:
        return {"error": f"exit {out.returncode}; see {log}"}
    if processes == 1:
        return {k: v for k, v in rows[-1].items() if k != "rank"}
    rows.sort(key=lambda r: r["rank"])
    return {
        "processes": processes,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in rows),
        "rss_anon_mib": max(r["rss_anon_mib"] for r in rows),
        "wall_s": max(r["wall_s"] for r in rows),
        "cpu_s": round(sum(r["cpu_s"] for r in rows), 2),
        "per_rank_peak_rss_mib": [r["peak_rss_mib"] for r in rows],
    }


def write_config(path: str, raw: dict) -> str:
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(raw, f)
    return path


def corpus(ctx: StageContext, pairs: int, seed: int) -> str:
    """``<work>/corpus_<pairs>/train.{en,de}``, made once by tools/make_synthetic_corpus.py."""
    folder = ctx.work_dir(f"corpus_{pairs}")
    if not os.path.exists(os.path.join(folder, "train.de")):
        for name in ("train.en", "train.de"):  # a cut earlier run
            if os.path.exists(os.path.join(folder, name)):
                os.remove(os.path.join(folder, name))
        tool = os.path.join(ctx.repo, "tools", "make_synthetic_corpus.py")
        args = ["--pairs", str(pairs), "--out", folder, "--data", ctx.data, "--seed", str(seed)]
        subprocess.run([sys.executable, tool, *args], check=True, stderr=subprocess.DEVNULL)
    return folder


def run_config(ctx: StageContext, p: DataScaleParams, pairs: int, data: str, cache_dir: str) -> str:
    """A sentence Transformer config on the corpus (shared BPE, ``data.documents: false``)."""
    run_dir = ctx.work_dir(f"run_{pairs}")
    d = p.d_model
    raw = {
        "data": {
            "train": {"src": os.path.join(data, "train.en"), "tgt": os.path.join(data, "train.de")},
            "documents": False,
            "cache_dir": cache_dir,
            "workers": p.workers[-1],  # build_vocab's counting (binarization is given its number)
        },
        "vocab": {"subword": "bpe", "size": p.vocab_size, "shared": True, "sample_lines": p.sample_lines},
        "model": {
            "d_model": d,
            "encoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 2 * d},
            "decoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 2 * d},
        },
        "train": {
            "max_steps": p.train_steps,
            "batch_tokens": p.batch_tokens,
            "save_every": 10 * p.train_steps,
            "valid_bleu": False,
            "threads": p.threads,
            "seed": p.seed,
            "device": "cpu",
        },
        "log": {"dir": run_dir, "tensorboard": False},
    }
    if p.model == "context_gates":
        raw["model"]["decoder"]["type"] = "gated_transformer"
        table = os.path.join(run_dir, "pmi.npz")
        raw["loss"] = [{"type": "label_smoothed_ce", "smoothing": 0.1}, {"type": "pmi_gate_hinge", "table": table}]
    elif p.model != "transformer":
        raise ValueError(f"model: expected transformer or context_gates, got {p.model!r}")
    return write_config(os.path.join(ctx.work_dir(), f"config_{pairs}.yaml"), raw)


def same_files(a: str, b: str) -> bool:
    """Whether two cache folders hold the same files, byte for byte."""
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return False
    for name in names:
        with open(os.path.join(a, name), "rb") as f, open(os.path.join(b, name), "rb") as g:
            while True:
                x, y = f.read(1 << 24), g.read(1 << 24)
                if x != y:
                    return False
                if not x:
                    break
    return True


def cache_sizes(folder: str) -> dict:
    """Bytes of the cache's token ids and of its index (offsets) per sentence pair."""
    with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
        n = max(json.load(f)["lengths"]["src_offsets"] - 1, 1)
    size = {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)}
    index = sum(v for k, v in size.items() if k.endswith(".offsets"))
    ids = sum(v for k, v in size.items() if k.endswith(".ids"))
    return {"cache_mib": round((index + ids) / 2**20, 1), "index_bytes_per_pair": round(index / n, 2)}


@stage("data_scale", DataScaleParams)
def data_scale(p: DataScaleParams, ctx: StageContext) -> None:
    for pairs in p.pairs:
        if ctx.seconds_left() <= 0:
            ctx.record(pairs=pairs, skipped="budget spent")
            continue
        t = time.time()
        data = p.corpus_from or corpus(ctx, pairs, p.seed)
        ctx.log(f"{pairs:,} pairs ready in {time.time() - t:.0f} s")
        caches = {w: ctx.work_dir(f"cache_{pairs}_w{w}") for w in p.workers}
        last = caches[p.workers[-1]]
        config = run_config(ctx, p, pairs, data, last)
        log = os.path.join(ctx.work_dir(), f"phases_{pairs}.log")
        if p.vocab_from:
            for name in ("subword.model", "vocab.txt"):
                shutil.copyfile(os.path.join(p.vocab_from, name), os.path.join(ctx.work_dir(f"run_{pairs}"), name))
        base = {"config": config, "threads": p.threads}
        if "build_vocab" in p.phases:
            row = run_phase(ctx, {**base, "phase": "build_vocab"}, log)
            ctx.record(pairs=pairs, phase="build_vocab", workers=p.workers[-1], **row)
        if "binarize" in p.phases:
            for w in p.workers:
                row = run_phase(ctx, {**base, "phase": "binarize", "workers": w, "cache_dir": caches[w]}, log)
                folders = [os.path.join(caches[w], x) for x in os.listdir(caches[w])]
                if folders and "error" not in row:
                    row.update(cache_sizes(folders[0]))
                    first = os.path.join(caches[p.workers[0]], os.path.basename(folders[0]))
                    row["same_bytes_as_1st"] = same_files(first, folders[0])
                ctx.record(pairs=pairs, phase="binarize", workers=w, **row)
        if "pmi_table" in p.phases:
            table = os.path.join(ctx.work_dir(f"run_{pairs}"), "pmi.npz")
            row = run_phase(ctx, {**base, "phase": "pmi_table", "table": table}, log)
            ctx.record(pairs=pairs, phase="pmi_table", model=p.model, **row)
        if "train" in p.phases:
            row = run_phase(ctx, {**base, "phase": "train"}, log)
            ctx.record(pairs=pairs, phase=f"train to step {p.train_steps}", model=p.model, **row)
        if "train_ddp" in p.phases:
            row = run_phase(ctx, {**base, "phase": "train"}, log, processes=2)
            ctx.record(pairs=pairs, phase=f"train to step {p.train_steps}, 2 processes", model=p.model, **row)
