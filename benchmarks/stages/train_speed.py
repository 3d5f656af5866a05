"""``train_speed``: training throughput of every model on real data, against OpenNMT-py 3.5.1 on the
same GPU (issue 40).

Every run trains through the library (``train_system``) for a fixed time on the documents stage's
data (``documents.prepare``: ~60k pre-training sentence pairs, the docmt-en-de training documents)
and reads its ``log.metrics_file``: the rate is **real target subwords per second** (the trainer's
``words``: target text without markup) over the report intervals after ``warmup_seconds`` (so
``train.compile``'s first steps and cuDNN/cuBLAS planning stay out). The peer reads the same subwords
(our BPE, applied by pyonmttok) from pre-tokenized files, with its batches calibrated to carry about as
many real target subwords per step; its rate comes from its own log after its data loader has
filled (``warmup_seconds`` of its own). MFU counts 6 × parameters × real target subwords against the
bf16 matmul peak measured in the same process (the issue's convention; it ignores the encoder's source
tokens and attention, so it under-counts the work of every model alike).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from benchmarks.stages.documents import DocumentsParams, prepare
from benchmarks.stages.environment import EnvironmentParams, matmul_peak
from benchmarks.stages.training import Profile, checkpoint, free_memory, share_vocab, system_config, train_system
from benchmarks.suite.stage import StageContext, gpu_name, stage
from benchmarks.suite.text_files import read_lines, tokenizer, write_lines

# OpenNMT-py's progress line: step, bsz (src/tgt/sents), tok/s (src/tgt), elapsed seconds
ONMT_STEP = re.compile(r"Step\s+(\d+)/\s*\d+;.*?bsz:\s*(\d+)/\s*(\d+)/\s*(\d+);\s*(\d+)/\s*(\d+) tok/s;\s*(\d+) sec")
BIG = 10**9


@dataclass
class TrainSpeedParams:
    # in order: {name, system, data: pretrain|doc, seconds, warmup?, overrides?} or {name, peer: true, seconds}
    runs: list
    warmup_seconds: float = 20.0  # report intervals ending before this are not counted (compile, planning)
    log_every: int = 20  # steps per report interval
    peer_batch_tokens: int = 16384  # OpenNMT-py batch_size (tokens): ~10.9k real target subwords, as ours
    peer_workers: int = 4  # its DataLoader workers (the issue: 2 are data-bound on an H200)
    peer_warmup_seconds: float = 60.0  # at least this; and from its first interval at 80% of its best rate
    peer_dtype: str = "fp16"  # OpenNMT-py 3.5.1 has fp32 and fp16 only
    peer_bucket_size: int = 262144  # its default: examples read (cycling a small corpus) before the first batch
    pretrain_lines: int = 0  # smoke: the last N pre-training pairs
    train_docs: int = 0  # smoke: the first N training documents per domain
    held_out_docs: int = 4
    matmul_n: int = 8192
    matmul_repeats: int = 10
    domains: list = field(default_factory=lambda: ["ted", "news", "europarl"])


@stage("train_speed", TrainSpeedParams)
def train_speed(p: TrainSpeedParams, ctx: StageContext) -> None:
    """The bf16 peak, then every run in order (each recorded as soon as it ends; a run that no longer
    fits the stage's budget is recorded as skipped)."""
    import torch

    data = prepare(ctx, DocumentsParams("", [], held_out_docs=p.held_out_docs, pretrain_lines=p.pretrain_lines,
                                        train_docs=p.train_docs, ablation_sentences=1, test_sentences=1,
                                        domains=p.domains))  # fmt: skip
    peak = None
    if ctx.device == "cuda":
        peak = matmul_peak(ctx.device, "bfloat16", EnvironmentParams(matmul_size=p.matmul_n, repeats=p.matmul_repeats))
    ctx.record(what="setup", gpu=gpu_name(ctx.device), torch=torch.__version__, bf16_peak_tflops=peak)
    vocab_run: Optional[str] = None  # the first run learns the BPE; the others (and the peer) share it
    for run in p.runs:
        name, seconds = run["name"], float(run["seconds"])
        if ctx.seconds_left() < seconds + 15:
            ctx.record(what="train", run=name, skipped=f"out of time ({ctx.seconds_left():.0f} s left)")
            continue
        try:
            if run.get("peer"):
                row = peer_run(p, ctx, data, vocab_run, seconds)
            else:
                row = our_run(p, ctx, run, data, vocab_run, seconds)
                vocab_run = vocab_run or ctx.work_dir(name)
            if peak and row.get("real_tok_per_s") and row.get("params"):
                row["mfu"] = 6 * row["params"] * row["real_tok_per_s"] / (peak * 1e12)
            ctx.record(what="train", run=name, **row)
        except Exception as e:  # one run's failure must not cost the others their numbers
            ctx.record(what="train", run=name, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
            free_memory()
    _ratios(ctx)


def our_run(p: TrainSpeedParams, ctx: StageContext, run: dict, data: dict, vocab_run: Optional[str], seconds: float):
    """Train one system of the spec for ``seconds``; its steady-state rates."""
    from onmt_doc.models.checkpoint import load_model

    run_dir = ctx.work_dir(run["name"])
    if vocab_run:
        share_vocab(vocab_run, run_dir)
    which = run.get("data", "pretrain")
    layer = {
        "data": {"train": {"src": data[f"{which}.en"], "tgt": data[f"{which}.de"]},
                 "valid": {"src": data["valid.en"], "tgt": data["valid.de"]}},
        "train": {"max_steps": BIG, "max_minutes": seconds / 60, "valid_every": BIG, "save_every": BIG,
                  "keep_last": 1, "valid_bleu": False, "init_from": None, "early_stopping": 0},
        "log": {"dir": run_dir, "every": p.log_every},
    }  # fmt: skip
    raw = system_config(ctx, ctx.systems[run["system"]], layer, run.get("overrides", {}))
    # profile_steps: where a step's time goes (torch.profiler, device kernels on CUDA), steps profile_skip + 1
    # onwards: inside the warm-up, whose report intervals the rates leave out (the profiler slows them)
    steps = int(run.get("profile_steps", 0))
    profile = Profile(ctx, run["name"], int(run.get("profile_skip", 5)), steps) if steps else None
    summary = train_system(ctx, raw, profile)
    rates = steady_rates(os.path.join(run_dir, "metrics.jsonl"), float(run.get("warmup", p.warmup_seconds)))
    params = load_model(checkpoint(run_dir))[0].n_params()
    cfg = raw["train"]
    return {"toolkit": "onmt_doc", "system": run["system"], "data": which, "amp": cfg.get("amp", "auto"),
            "compile": cfg.get("compile", "off"), "static": bool(cfg.get("static_shapes", False)), "params": params,
            "peak_mib": summary.get("peak_mib"), "steps": summary.get("steps"), **rates}  # fmt: skip


def steady_rates(metrics: str, warmup: float) -> dict:
    """Steps/s, real target subwords/s and per step over the report intervals that end after
    ``warmup`` seconds of training (all but the first when none does)."""
    with open(metrics, encoding="utf-8") as f:
        rows = [r for r in map(json.loads, f) if r["event"] == "train"]
    if not rows:
        raise RuntimeError(f"{metrics}: no training report")
    steps = [r["step"] - q for r, q in zip(rows, [0] + [r["step"] for r in rows])]
    done, keep = 0.0, []
    for r, k in zip(rows, steps):
        done += r["seconds"]
        if done > warmup:
            keep.append((r, k))
    keep = keep or list(zip(rows, steps))[1:] or list(zip(rows, steps))
    secs = sum(r["seconds"] for r, _ in keep)
    words = sum(r.get("words", 0.0) for r, _ in keep)
    n = sum(k for _, k in keep)
    return {"steady_steps": n, "steady_s": secs, "steps_per_s": n / secs, "real_tok_per_s": words / secs,
            "real_tgt_per_step": words / n, "tokens_per_step": sum(r["tokens"] for r, _ in keep) / n}  # fmt: skip


# ----------------------------------------------------------------------------- the peer


def peer_run(p: TrainSpeedParams, ctx: StageContext, data: dict, vocab_run: Optional[str], seconds: float) -> dict:
    """OpenNMT-py 3.5.1 (importable here: a GPU run carries it as wheels) on our subwords, Transformer
    base, ``seconds`` of training; its steady-state rates from its log."""
    env = _peer_env(ctx)
    if env is None:
        return {"toolkit": "OpenNMT-py 3.5.1", "skipped": "OpenNMT-py is not importable here"}
    if vocab_run is None:
        return {"toolkit": "OpenNMT-py 3.5.1", "skipped": "no run of ours learned the subwords first"}
    out = ctx.work_dir("opennmt_py")
    tok = tokenizer(os.path.join(vocab_run, "subword.model"))
    paths = {}
    for split, key in (("train", "pretrain"), ("valid", "valid")):
        for lang in ("en", "de"):
            lines = [" ".join(t) for t in tok.tokenize_batch(read_lines(data[f"{key}.{lang}"]))[0]]
            paths[split, lang] = write_lines(os.path.join(out, f"{split}.{lang}"), [x for x in lines if x])
    config, cfg = write_peer_config(p, out, paths, ctx.smoke)
    python = [sys.executable, "-m"]
    vocab = subprocess.run(python + ["onmt.bin.build_vocab", "-config", config, "-n_sample", "-1"], env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    if vocab.returncode:
        raise RuntimeError(f"onmt build_vocab failed: {vocab.stderr.strip().splitlines()[-1:]}")
    log_path = os.path.join(out, "train.log")
    t0 = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        # its own process group: its data-loader workers must stop with it, not go on loading the CPUs
        proc = subprocess.Popen(python + ["onmt.bin.train", "-config", config], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        finally:
            _kill_group(proc.pid)
    text = open(log_path, encoding="utf-8", errors="replace").read()
    row = {"toolkit": "OpenNMT-py 3.5.1", "wall_s": time.time() - t0, **peer_rates(text, p.peer_warmup_seconds)}
    row.update(amp=cfg["model_dtype"], batch_tokens=cfg["batch_size"], workers=cfg["num_workers"])
    params = re.search(r"\* number of parameters: (\d+)", text) or re.search(r"params: (\d+)", text)
    row["params"] = int(params.group(1)) if params else None
    return row


def _kill_group(pgid: int) -> None:
    """SIGKILL whatever of a process group is left (data-loader workers outliving their parent)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _peer_env(ctx: StageContext) -> Optional[dict]:
    """The environment OpenNMT-py runs in, or None when ``onmt`` cannot be imported: ``import onmt``
    imports spacy and fasttext for transforms we never use, so empty stand-ins come first on the path."""
    stubs = ctx.work_dir("peer_stubs")
    for name in ("spacy", "fasttext"):
        os.makedirs(os.path.join(stubs, name), exist_ok=True)
        open(os.path.join(stubs, name, "__init__.py"), "a").close()
    path = os.pathsep.join(x for x in (stubs, os.environ.get("PYTHONPATH", "")) if x)
    env = dict(os.environ, PYTHONPATH=path, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", PYTHONWARNINGS="ignore")
    check = subprocess.run([sys.executable, "-c", "import onmt.bin.train"], env=env, capture_output=True)
    return env if check.returncode == 0 else None


def write_peer_config(p: TrainSpeedParams, out: str, paths: dict, smoke: bool) -> tuple[str, dict]:
    """OpenNMT-py's YAML: Transformer base with shared vocabulary and tied embeddings (ours), Adam,
    label smoothing 0.1, ``peer_dtype`` and ``peer_workers`` data workers, on the GPU when present."""
    import torch

    size = {"layers": 1, "hidden_size": 16, "word_vec_size": 16, "transformer_ff": 32, "heads": 2} if smoke else {
        "layers": 6, "hidden_size": 512, "word_vec_size": 512, "transformer_ff": 2048, "heads": 8}  # fmt: skip
    cfg = {
        "save_data": os.path.join(out, "data"),
        "src_vocab": os.path.join(out, "vocab.shared"),
        "share_vocab": True,
        "src_vocab_size": 40000,
        "tgt_vocab_size": 40000,
        "overwrite": True,
        "data": {
            "corpus_1": {"path_src": paths["train", "en"], "path_tgt": paths["train", "de"]},
            "valid": {"path_src": paths["valid", "en"], "path_tgt": paths["valid", "de"]},
        },
        "save_model": os.path.join(out, "model"),
        "encoder_type": "transformer",
        "decoder_type": "transformer",
        "position_encoding": True,
        "share_embeddings": True,
        "share_decoder_embeddings": True,
        "dropout": [0.1],
        "attention_dropout": [0.1],
        "batch_type": "tokens",
        "batch_size": p.peer_batch_tokens if not smoke else 512,
        "valid_batch_size": 2048,
        "accum_count": [1],
        "optim": "adam",
        "adam_beta2": 0.998,
        "decay_method": "noam",
        "warmup_steps": 4000,
        "learning_rate": 2.0,
        "label_smoothing": 0.1,
        "max_grad_norm": 0.0,
        "param_init": 0.0,
        "param_init_glorot": True,
        "train_steps": BIG,
        "valid_steps": BIG,
        "save_checkpoint_steps": BIG,
        "report_every": p.log_every,
        "seed": 1234,
        "num_workers": p.peer_workers,
        "bucket_size": p.peer_bucket_size,
        "model_dtype": p.peer_dtype if torch.cuda.is_available() else "fp32",
        **size,
    }
    if torch.cuda.is_available():
        cfg.update(gpu_ranks=[0], world_size=1)
    path = os.path.join(out, "config.yaml")
    import yaml

    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f)
    return path, cfg


def peer_rates(log_text: str, warmup: float) -> dict:
    """Steady-state rates from OpenNMT-py's progress lines: the intervals ending after ``warmup`` s
    and from the first one whose rate reaches 80% of its best (its loader fills a 262k-example bucket,
    cycling a small corpus, before it runs at its rate: 119 s on an H200 with 60k pairs, 2026-11-27);
    its target tok/s counts subwords plus </s>, so real subwords = (bsz tgt - sentences) per step."""
    rows = [tuple(float(x) for x in m.groups()) for m in ONMT_STEP.finditer(log_text)]
    if not rows:
        raise RuntimeError("no progress line in OpenNMT-py's log: " + " | ".join(log_text.strip().splitlines()[-3:]))
    prev = [(0.0, 0.0)] + [(r[0], r[6]) for r in rows]
    intervals = [(r[0] - s0, r[6] - e0, r) for r, (s0, e0) in zip(rows, prev)]  # (steps, seconds, row)
    best = max(r[5] for r in rows)
    fast = next(i for i, r in enumerate(rows) if r[5] >= 0.8 * best)
    keep = [iv for i, iv in enumerate(intervals) if i >= fast and iv[2][6] > warmup] or intervals[1:] or intervals
    secs = sum(n * r[2] / r[5] for n, _, r in keep if r[5])  # steps × tgt tokens per step / tgt tok/s
    words = sum(n * (r[2] - r[3]) for n, _, r in keep)
    n = sum(k for k, _, _ in keep)
    return {"steady_steps": n, "steady_s": secs, "steps_per_s": n / secs if secs else None,
            "real_tok_per_s": words / secs if secs else None, "real_tgt_per_step": words / n if n else None,
            "last_step": int(rows[-1][0]), "log_seconds": rows[-1][6]}  # fmt: skip


def _ratios(ctx: StageContext) -> None:
    """Each run's rate over the first run's and over the peer's, from the records just written."""
    with open(ctx.results, encoding="utf-8") as f:
        rows = [r for r in map(json.loads, f) if r.get("stage") == ctx.name and r.get("what") == "train"]
    rated = [r for r in rows if r.get("real_tok_per_s")]
    if not rated:
        return
    first = rated[0]
    peer = next((r for r in rated if r.get("toolkit", "").startswith("OpenNMT")), None)
    for r in rated:
        row = {"what": "ratio", "run": r["run"], "vs_first": r["real_tok_per_s"] / first["real_tok_per_s"]}
        if peer:
            row["vs_opennmt_py"] = r["real_tok_per_s"] / peer["real_tok_per_s"]
        ctx.record(**row)
