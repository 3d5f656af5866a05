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
4. ``onmt_doc_train`` for --steps steps and ``run_onmt_bench.sh`` of the peers folder (``--peers``, by default
   ../shared/peers beside the repository) (onmt_train,
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
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
from common import (
    DATA,
    PEERS,
    REPO,
    CpuMonitor,
    Job,
    Scheduler,
    bleu,
    cpu_model,
    log,
    multi30k,
    overlap,
    read_lines,
    tool,
    translate_seconds,
    update_docs_section,
    validation_metrics,
    write_json,
    write_lines,
    write_yaml,
)

SECTION = "## Sentence Transformer vs OpenNMT-py 3.5.1 / CTranslate2 (multi30k)"
OURS_SEED = 1  # onmt_doc train.seed (OpenNMT-py gets --seed)
TARGETS = {"train": 1.25, "translate": 1.5}  # speed only: the quality of the two runs is not comparable (notes)
MONITOR = CpuMonitor()  # one per process: every phase asks it how busy the rest of the machine was


def report_every(steps: int) -> int:
    """run_onmt_bench.sh's report_every; onmt_doc's log.every is set to the same value."""
    return 25 if steps >= 250 else (steps // 10 if steps >= 20 else 1)


# ----------------------------------------------------------------------------- batching replays


def onmt_doc_batches(
    n_src: np.ndarray, n_tgt: np.ndarray, batch_tokens: int, seed: int, steps: int
) -> list[np.ndarray]:
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


def onmt_py_bucket_batches(
    src_text: list[str], n_src: np.ndarray, n_tgt: np.ndarray, batch_tokens: int, bucket_size: int = 262144
) -> list[list[int]]:
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


def calibrate_batch_tokens(
    target: float, n_src: np.ndarray, n_tgt: np.ndarray, seed: int, lo: int = 1024, hi: int = 8192
) -> int:
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

STEP_RE = re.compile(
    r"step (\d+)/\d+ \| loss ([\d.]+) \| ppl ([\d.]+) \| acc ([\d.]+)% \| lr (\S+) \| "
    r"gnorm (\S+) \| (\d+) tgt tok/s"
)
ONMT_STEP_RE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+) INFO\] Step\s+(\d+)/\s*\d+;.*?ppl:\s*([\d.]+);"
    r".*?bsz:\s*(\d+)/(\d+)/(\d+);\s*(\d+)/(\d+) tok/s;\s*(\d+) sec",
    re.M,
)


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
        out.append(
            {
                "step": step,
                "steps": step - prev,
                "end": t,
                "counted": counted,
                "real": float(real_cum[step] - real_cum[prev]),
                "sents": float(sents_cum[step] - sents_cum[prev]),
                "seconds": counted / max(rate, 1e-9),
                "rate": rate,
                "ppl": float(m.group(3)),
            }
        )
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
        out.append(
            {
                "step": int(step),
                "steps": k,
                "end": stamp,
                "counted": bt * k,
                "real": (bt - bn) * k,
                "sents": bn * k,
                "seconds": bt * k / max(rt, 1e-9),
                "rate": rt,
                "ppl": ppl,
                "sec": sec,
            }
        )
        prev = step
    if not out:
        raise SystemExit("no Step lines in the OpenNMT-py training log")
    return out


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
        "real_tok_s": rate(use, "real"),
        "reported_tok_s": rate(use, "counted"),
        "steps_per_s": rate(use, "steps"),
        "real_tok_s_first_half": rate(use[:half] or use, "real"),
        "real_tok_s_second_half": rate(use[half:], "real"),
        "intervals_used": len(use),
        "intervals_steady": len(steady),
        "intervals_clean": len(clean),
        "foreign_used": sum(i["foreign"] * i["seconds"] for i in use) / sum(i["seconds"] for i in use),
        "real_tgt_per_step": sum(i["real"] for i in intervals) / n_steps,
        "counted_tgt_per_step": sum(i["counted"] for i in intervals) / n_steps,
        "sents_per_step": sum(i["sents"] for i in intervals) / n_steps,
        "last_ppl": intervals[-1]["ppl"],
        "trace": [
            (round(i["end"], 1), i["step"], round(i["real"] / i["seconds"]), i["stopped"] > 0, round(i["foreign"], 2))
            for i in intervals
        ],
    }


def detok_scores(hyp_path: str, ref_path: str, subword_model: str) -> dict:
    """Detokenize space-separated subword hypotheses and score them as onmt_doc scores its output."""
    import pyonmttok

    from onmt_doc.evaluation.corpus_metrics import chrf, s_bleu

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
    res.update(
        {
            "attempt": k,
            "summary": summary,
            "translate_s": float(m.group(1)),
            "translate_process_wall": float(m.group(2)),
            "ct2": {},
        }
    )
    res["translate_foreign"], res["translate_stopped"] = disturbance(
        res, window(res["lines"], r"^== onmt_translate", r"^== CTranslate2", res["end"])
    )
    res["ct2_foreign"], res["ct2_stopped"] = disturbance(
        res, window(res["lines"], r"^== CTranslate2", r"^== OpenNMT-py training", res["end"])
    )
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


# ----------------------------------------------------------------------------- setup


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--out", default="runs/bench_transformer")
    p.add_argument(
        "--data",
        default=multi30k(DATA),
        help="Multi30k en-de folder (default: ../shared/data/multi30k-en-de beside the repository)",
    )
    p.add_argument("--train-lines", type=int, default=0, help="use the first N training pairs (0 = all)")
    p.add_argument(
        "--peers", default=PEERS, help="folder with run_onmt_bench.sh (default: ../shared/peers beside the repository)"
    )
    peers_home = os.environ.get("PEERS_DIR", os.path.expanduser("~/.cache/onmt-peers"))
    p.add_argument("--venv", default=os.path.join(peers_home, "venv"))
    p.add_argument("--vocab-size", type=int, default=8000, help="BPE symbols (8000 -> ~7.98k entries on multi30k)")
    p.add_argument("--warmup", type=int, default=100, help="noam warmup (run_onmt_bench.sh default)")
    p.add_argument("--lr", type=float, default=0.5, help="noam factor (run_onmt_bench.sh default)")
    p.add_argument("--onmt-batch-tokens", type=int, default=2048)
    p.add_argument(
        "--batch-tokens",
        type=int,
        default=0,
        help="onmt_doc train.batch_tokens (0 = calibrate to OpenNMT-py's real target tokens per step)",
    )
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--tbatch", type=int, default=32, help="sentences per translation batch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234, help="OpenNMT-py seed")
    p.add_argument(
        "--sequential",
        action="store_true",
        help="train onmt_doc, then OpenNMT-py (default: alternate them every --slice seconds)",
    )
    p.add_argument(
        "--slice",
        type=float,
        default=90.0,
        help="seconds of CPU each training gets before the other one's turn (never both at once)",
    )
    p.add_argument(
        "--translate-rounds",
        type=int,
        default=2,
        help="timed translations per toolkit, alternating onmt_doc / OpenNMT-py+CT2",
    )
    p.add_argument(
        "--no-bf16",
        dest="bf16",
        action="store_false",
        help="skip the extra onmt_doc translation rounds with -dtype bfloat16",
    )
    p.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.15,
        help="an interval/translation is clean when other processes used fewer CPU cores",
    )
    p.add_argument(
        "--busy-threshold",
        type=float,
        default=0.5,
        help="pause the running toolkit while other processes use more CPU cores than this",
    )
    p.add_argument("--no-yield", action="store_true", help="never pause for other processes")
    p.add_argument("--max-pause", type=float, default=300, help="seconds a command may be paused for others")
    p.add_argument("--max-wait", type=float, default=120, help="seconds to wait for a quiet machine per phase")
    p.add_argument("--report-only", action="store_true", help="re-read a finished run in --out and report")
    p.add_argument("--docs", default=os.path.join(REPO, "docs", "benchmarks.md"))
    p.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    args = p.parse_args()
    args.yield_to_others = not args.no_yield
    return args


class Bench:
    """One comparison's folders, data and the numbers the later phases need."""

    def __init__(self, args: argparse.Namespace, out: str):
        self.args, self.out = args, out
        self.ours_dir = os.path.join(out, "onmt_doc")
        self.run_dir = os.path.join(self.ours_dir, "run")
        self.onmt_dir = os.path.join(out, "onmt_py")
        self.tok_dir = os.path.join(self.onmt_dir, "tok")
        self.config_path = os.path.join(self.ours_dir, "config.yaml")
        self.subword_model = os.path.join(self.run_dir, "subword.model")
        self.ckpt = os.path.join(self.run_dir, "checkpoints", "last.pt")
        self.ours_hyp = os.path.join(self.ours_dir, "test.hyp")
        self.ours_train_log = os.path.join(self.ours_dir, "train.log")
        self.raw: dict = {}  # split -> lang -> raw text file
        self.commands: list[str] = []  # for the report
        self.n_train = self.n_test = 0


def prepare_data(b: Bench) -> None:
    """The raw Multi30k files (the first --train-lines training pairs if asked) and their sizes."""
    args = b.args
    data_dir = os.path.join(b.out, "data")
    os.makedirs(data_dir, exist_ok=True)
    b.raw = {
        split: {lang: os.path.join(args.data, f"{split}.{lang}") for lang in ("en", "de")}
        for split in ("train", "valid", "test2016")
    }
    if args.train_lines:
        for lang in ("en", "de"):
            path = os.path.join(data_dir, f"train.{lang}")
            write_lines(path, read_lines(b.raw["train"][lang])[: args.train_lines])
            b.raw["train"][lang] = path
    b.n_train = len(read_lines(b.raw["train"]["en"]))
    b.n_test = len(read_lines(b.raw["test2016"]["en"]))
    log(
        f"data: {b.n_train} training pairs, {b.n_test} test sentences; {args.steps} steps, "
        f"report every {report_every(args.steps)}"
    )


def onmt_doc_config(b: Bench) -> dict:
    """onmt_doc's side: the same shape, schedule and float32 as OpenNMT-py's run_onmt_bench.sh."""
    args, raw = b.args, b.raw
    return {
        "data": {
            "train": {"src": raw["train"]["en"], "tgt": raw["train"]["de"]},
            "valid": {"src": raw["valid"]["en"], "tgt": raw["valid"]["de"]},
            "documents": False,
        },
        "vocab": {"subword": "bpe", "size": args.vocab_size, "shared": True, "tokenizer": "aggressive"},
        "model": {
            "d_model": 256,
            "dropout": 0.1,
            "attention_dropout": 0.1,
            "share_embeddings": True,
            "tie_output": True,
            "encoder": {"type": "transformer", "layers": 3, "heads": 4, "ff": 1024},
            "decoder": {"type": "transformer", "layers": 3, "heads": 4, "ff": 1024},
        },
        "loss": [{"type": "label_smoothed_ce", "smoothing": 0.1}],
        "optim": {
            "type": "adam",
            "lr": args.lr,
            "betas": [0.9, 0.998],
            "eps": 1.0e-9,  # OpenNMT-py 3.5.1 hard-codes Adam eps=1e-9 (onmt/utils/optimizers.py)
            "schedule": {"type": "noam", "warmup": args.warmup},
        },
        "train": {
            "batch_tokens": args.batch_tokens or args.onmt_batch_tokens,
            "max_steps": args.steps,
            "valid_every": args.steps,
            "valid_bleu": False,
            "save_every": args.steps,
            "keep_last": 1,
            "max_grad_norm": 0.0,
            "seed": OURS_SEED,
            "threads": args.threads,
            "amp": "fp32",
        },  # float32 like OpenNMT-py here (bf16 is opt-in on CPUs)
        "translate": {"beam": args.beam, "dtype": "float32"},
        "log": {"dir": b.run_dir, "tensorboard": False, "every": report_every(args.steps)},
    }


def write_config(b: Bench, config: dict) -> None:
    write_yaml(config, b.config_path, comment="written by benchmarks/transformer_vs_onmt.py")


def tokenize_for_onmt(b: Bench):
    """Apply onmt_doc's learned BPE to every split for OpenNMT-py (identical subwords); returns
    the tokenizer and the training set's subword lengths and tokenized source lines."""
    import pyonmttok

    tok = pyonmttok.Tokenizer("aggressive", joiner_annotate=True, bpe_model_path=b.subword_model)
    os.makedirs(b.tok_dir, exist_ok=True)
    lengths: dict = {}
    src_text: list[str] = []
    for split, name in (("train", "train"), ("valid", "valid"), ("test2016", "test")):
        for lang in ("en", "de"):
            toks = tok.tokenize_batch(read_lines(b.raw[split][lang]))[0]
            if not b.args.report_only:
                write_lines(os.path.join(b.tok_dir, f"{name}.{lang}"), [" ".join(t) for t in toks])
            if split == "train":
                lengths[lang] = np.array([len(t) for t in toks], dtype=np.int64)
                if lang == "en":
                    src_text = [" ".join(t) for t in toks]
    vocab_entries = len([1 for line in read_lines(os.path.join(b.run_dir, "vocab.txt")) if line])
    log(
        f"tokenized with {os.path.relpath(b.subword_model, REPO)}: {vocab_entries} vocabulary entries; train "
        f"mean {lengths['en'].mean():.1f} src / {lengths['de'].mean():.1f} tgt subwords per sentence"
    )
    return tok, lengths["en"], lengths["de"], src_text, vocab_entries


def calibrate(args: argparse.Namespace, n_src: np.ndarray, n_tgt: np.ndarray, src_text: list[str]) -> dict:
    """onmt_doc's batch_tokens that carries OpenNMT-py's real target tokens per step (replays of
    both batchings on these lengths), with the numbers the report quotes."""
    onmt_sim = onmt_py_bucket_batches(src_text, n_src, n_tgt, args.onmt_batch_tokens)
    cal = {
        "onmt_sim_real": float(np.mean([n_tgt[b].sum() for b in onmt_sim])),
        "onmt_sim_sents": float(np.mean([len(b) for b in onmt_sim])),
    }
    cal["batch_tokens"] = args.batch_tokens or calibrate_batch_tokens(cal["onmt_sim_real"], n_src, n_tgt, OURS_SEED)
    cal["ours_at_same"] = onmt_doc_epoch_mean(n_src, n_tgt, args.onmt_batch_tokens, OURS_SEED)
    ours_epoch_real = onmt_doc_epoch_mean(n_src, n_tgt, cal["batch_tokens"], OURS_SEED)
    log(
        f"batches: OpenNMT-py batch_size {args.onmt_batch_tokens} -> {cal['onmt_sim_real']:.0f} real tgt tokens/batch "
        f"({cal['onmt_sim_sents']:.1f} sents, replay of its bucket); onmt_doc batch_tokens {args.onmt_batch_tokens} "
        f"-> {cal['ours_at_same']:.0f}; calibrated batch_tokens {cal['batch_tokens']} -> {ours_epoch_real:.0f}"
    )
    return cal


@dataclass
class Commands:
    """The timed commands of both toolkits and run_onmt_bench.sh's environment."""

    train: list[str]
    translate: list[str]
    translate_bf16: list[str]
    onmt: list[str]
    env: dict


PEER_ENV_KEYS = (
    "STEPS",
    "LAYERS",
    "DMODEL",
    "HEADS",
    "FF",
    "DROPOUT",
    "BATCH_TOKENS",
    "WARMUP",
    "LR",
    "BEAM",
    "TBATCH",
    "THREADS",
    "VOCAB_SIZE",
    "SRC_EXT",
    "TGT_EXT",
    "SEED",
)


def build_commands(b: Bench) -> Commands:
    """The commands (also listed in ``b.commands`` for the report, as shell lines)."""
    args = b.args
    translate = tool("onmt_doc_translate") + [
        "-model",
        b.ckpt,
        "-src",
        b.raw["test2016"]["en"],
        "-tgt",
        b.raw["test2016"]["de"],
        "-beam",
        str(args.beam),
        "-batch_size",
        str(args.tbatch),
        "-threads",
        str(args.threads),
        "-output",
        b.ours_hyp,
    ]
    env = dict(
        os.environ,
        STEPS=str(args.steps),
        LAYERS="3",
        DMODEL="256",
        HEADS="4",
        FF="1024",
        DROPOUT="0.1",
        BATCH_TOKENS=str(args.onmt_batch_tokens),
        WARMUP=str(args.warmup),
        LR=str(args.lr),
        BEAM=str(args.beam),
        TBATCH=str(args.tbatch),
        THREADS=str(args.threads),
        VOCAB_SIZE="32768",
        SRC_EXT="en",
        TGT_EXT="de",
        SEED=str(args.seed),
        VENV=args.venv,
        CT2_INT8="1",
    )
    cmds = Commands(
        train=tool("onmt_doc_train") + ["-config", b.config_path],
        translate=translate,
        translate_bf16=[a if a != b.ours_hyp else b.ours_hyp + ".bf16" for a in translate] + ["-dtype", "bfloat16"],
        onmt=[
            "bash",
            os.path.join(args.peers, "run_onmt_bench.sh"),
            os.path.join(b.tok_dir, "train"),
            os.path.join(b.tok_dir, "valid"),
            os.path.join(b.tok_dir, "test"),
            b.onmt_dir,
        ],
        env=env,
    )
    env_str = " ".join(f"{k}={env[k]}" for k in PEER_ENV_KEYS)
    b.commands += [
        " ".join(cmds.train),
        env_str + " " + " ".join(cmds.onmt),
        " ".join(cmds.translate),
        f"SKIP_TRAIN=1 {env_str} {' '.join(cmds.onmt)}   # further translation rounds",
    ]
    return cmds


# ----------------------------------------------------------------------------- the timed phases

ECHO_OURS = r"step \d+/|validation|parameters|error"
ECHO_ONMT = r"^==|BLEU|sent/s|sentences/s"
ECHO_TRANSLATE = r"translated|BLEU|error"


def clear_outputs(b: Bench) -> None:
    """Remove the checkpoints and peer outputs of an earlier run in the same folder."""
    for sub in ("checkpoints", "tensorboard"):
        shutil.rmtree(os.path.join(b.run_dir, sub), ignore_errors=True)
    for f in os.listdir(b.onmt_dir):
        if f.startswith(("model_step_", "summary")):
            os.remove(os.path.join(b.onmt_dir, f))


def train_both(b: Bench, cmds: Commands, sched: Scheduler) -> tuple[dict, dict]:
    """Both trainings, time-sliced (never both on the CPU) or one after the other; the results of
    onmt_doc_train and of run_onmt_bench.sh's first run (training, translation, CT2)."""
    args, thr = b.args, b.args.quiet_threshold
    onmt_env = dict(cmds.env, SKIP_TRAIN="0")
    onmt_log = os.path.join(b.onmt_dir, "bench.0.log")
    if args.sequential:
        ours = sched.run_alone("onmt_doc_train", cmds.train, b.ours_train_log, echo=ECHO_OURS)
        MONITOR.wait_quiet(args.max_wait, threshold=thr)
        return ours, sched.run_alone("run_onmt_bench", cmds.onmt, onmt_log, onmt_env, ECHO_ONMT)
    log(f"training both toolkits time-sliced: {args.slice:.0f}s of CPU each in turn, never both at once")
    jobs = [
        Job("onmt_doc_train", cmds.train, b.ours_train_log, echo=ECHO_OURS),
        Job("run_onmt_bench", cmds.onmt, onmt_log, onmt_env, ECHO_ONMT, stopped=True),
    ]
    ours, theirs = sched.run(jobs, slice_s=args.slice, exclusive={"run_onmt_bench": r"^== onmt_translate"})
    return ours, theirs


def translate_ours(b: Bench, sched: Scheduler, name: str, cmd: list[str], log_path: str) -> dict:
    """One timed onmt_doc_translate run (alone on the CPU)."""
    MONITOR.wait_quiet(b.args.max_wait, threshold=b.args.quiet_threshold)
    r = sched.run_alone(name, cmd, log_path, echo=ECHO_TRANSLATE)
    r["translate_s"] = translate_seconds("\n".join(line for _, line in r["lines"]))
    r["translate_foreign"], r["translate_stopped"] = r["foreign"], r["stopped"]
    return r


def translation_rounds(b: Bench, cmds: Commands, sched: Scheduler, phases: dict) -> None:
    """Alternate onmt_doc (float32, then bfloat16) and OpenNMT-py+CT2 translations until each has
    --translate-rounds undisturbed runs (at most three tries per round)."""
    args, thr = b.args, b.args.quiet_threshold
    tries = 0
    while len(phases["translate_ours"]) < args.translate_rounds and tries < 3 * args.translate_rounds:
        tries += 1
        r = translate_ours(
            b, sched, "onmt_doc_translate", cmds.translate, os.path.join(b.ours_dir, f"translate.{tries}.log")
        )
        if r["foreign"] < thr and not r["stopped"]:
            phases["translate_ours"].append(r)
        else:
            log("  disturbed by other processes: this translation is timed again")
            phases.setdefault("translate_ours_disturbed", []).append(r)
            continue
        if args.bf16:
            phases.setdefault("translate_ours_bf16", []).append(
                translate_ours(
                    b,
                    sched,
                    "onmt_doc_translate -dtype bfloat16",
                    cmds.translate_bf16,
                    os.path.join(b.ours_dir, f"translate_bf16.{tries}.log"),
                )
            )
        clean_onmt = [a for a in phases["onmt"] if a["translate_foreign"] < thr and not a["translate_stopped"]]
        if len(clean_onmt) < args.translate_rounds:
            MONITOR.wait_quiet(args.max_wait, threshold=thr)
            k = len(phases["onmt"])
            res = sched.run_alone(
                "run_onmt_bench (SKIP_TRAIN=1)",
                cmds.onmt,
                os.path.join(b.onmt_dir, f"bench.{k}.log"),
                dict(cmds.env, SKIP_TRAIN="1"),
                ECHO_ONMT,
            )
            phases["onmt"].append(onmt_attempt(res, b.onmt_dir, k))
    if not phases["translate_ours"]:
        phases["translate_ours"] = phases.pop("translate_ours_disturbed")


def run_phases(b: Bench, cmds: Commands, config: dict) -> dict:
    """Train both toolkits, then the alternating translations; the phases' timings and output."""
    sched = Scheduler(MONITOR, b.args)
    write_config(b, config)
    clear_outputs(b)
    phases: dict = {"onmt": [], "translate_ours": []}
    MONITOR.wait_quiet(b.args.max_wait, threshold=b.args.quiet_threshold)
    phases["train_ours"], res = train_both(b, cmds, sched)
    phases["onmt"].append(onmt_attempt(res, b.onmt_dir, 0))
    translation_rounds(b, cmds, sched, phases)
    return phases


# ----------------------------------------------------------------------------- results


def ours_results(b: Bench, phases: dict, cal: dict, n_src: np.ndarray, n_tgt: np.ndarray, tok) -> dict:
    """onmt_doc's training rates, translation speed, scores and size."""
    thr = b.args.quiet_threshold
    tr = phases["train_ours"]
    batches = onmt_doc_batches(n_src, n_tgt, cal["batch_tokens"], OURS_SEED, b.args.steps)
    ours = steady_rates(onmt_doc_intervals(tr["lines"], batches, n_tgt), tr["start"], tr["stops"], thr)
    ours["train_wall"] = tr["wall"] - tr["stopped"]
    ours["train_stopped"] = tr["stopped"]
    ours["translate_s"], ours["translate_runs"] = clean_mean(
        phases["translate_ours"], "translate_s", "translate_foreign", "translate_stopped", thr
    )
    ours["sent_s"] = b.n_test / ours["translate_s"]
    if phases.get("translate_ours_bf16"):
        t16, runs16 = clean_mean(
            phases["translate_ours_bf16"], "translate_s", "translate_foreign", "translate_stopped", thr
        )
        text16 = "\n".join(line for _, line in phases["translate_ours_bf16"][-1]["lines"])
        ours["bf16"] = {"translate_s": t16, "runs": runs16, "sent_s": b.n_test / t16, "bleu": bleu(text16)}
    text = "\n".join(line for _, line in phases["translate_ours"][-1]["lines"])
    m = re.search(r"BLEU ([\d.]+) \| chrF ([\d.]+)", text)
    ours["bleu"], ours["chrf"] = float(m.group(1)), float(m.group(2))
    with open(b.ours_train_log, encoding="utf-8") as f:
        ours["valid_ppl"] = validation_metrics(f.read()).get("ppl")
    from onmt_doc.models.checkpoint import load_model

    model, _, _ = load_model(b.ckpt)
    ours["params"] = model.n_params()
    del model
    ours["hyp_subwords"] = sum(len(tok.tokenize(h)[0]) for h in read_lines(b.ours_hyp))
    return ours


def theirs_results(b: Bench, phases: dict) -> tuple[dict, dict]:
    """OpenNMT-py's training rates, translation speed, scores (detokenized like onmt_doc's) and
    size, and CTranslate2's speed and scores."""
    thr = b.args.quiet_threshold
    attempts = phases["onmt"]
    first = attempts[0]
    with open(os.path.join(b.onmt_dir, "train.log"), encoding="utf-8") as f:
        train_log_text = f.read()
    theirs = steady_rates(onmt_py_intervals(train_log_text), first["train_window"][0], first["stops"], thr)
    params = re.search(r"\* number of parameters: (\d+)", train_log_text)
    theirs["params"] = int(params.group(1)) if params else 0
    vppl = re.findall(r"Validation perplexity: ([\d.]+)", train_log_text)
    theirs["valid_ppl"] = float(vppl[-1]) if vppl else None
    m = re.search(r"train wall .*?: ([\d.]+) s", first["summary"])
    theirs["train_stopped"] = overlap(first["stops"], *first["train_window"])
    theirs["train_wall"] = (float(m.group(1)) if m else float("nan")) - theirs["train_stopped"]
    theirs["translate_s"], theirs["translate_runs"] = clean_mean(
        attempts, "translate_s", "translate_foreign", "translate_stopped", thr
    )
    theirs["sent_s"] = b.n_test / theirs["translate_s"]
    tok_bleu = dict(re.findall(r"^(onmt|ct2 fp32|ct2 int8): BLEU ([\d.]+)", first["summary"], re.M))
    theirs["bleu_tok"] = float(tok_bleu["onmt"]) if "onmt" in tok_bleu else float("nan")
    ref = b.raw["test2016"]["de"]
    theirs.update(detok_scores(os.path.join(b.onmt_dir, "test.onmt.hyp"), ref, b.subword_model))
    theirs["hyp_subwords"] = sum(len(line.split()) for line in read_lines(os.path.join(b.onmt_dir, "test.onmt.hyp")))
    ct2 = {}
    for tag, hyp in (("fp32", "test.ct2.hyp"), ("int8", "test.ct2int8.hyp")):
        runs = [dict(a, ct2_s=a["ct2"][tag]) for a in attempts if tag in a["ct2"]]
        if runs:
            t, vals = clean_mean(runs, "ct2_s", "ct2_foreign", "ct2_stopped", thr)
            ct2[tag] = {
                "translate_s": t,
                "runs": vals,
                "sent_s": b.n_test / t,
                "bleu_tok": float(tok_bleu.get(f"ct2 {tag}", "nan")),
                **detok_scores(os.path.join(b.onmt_dir, hyp), ref, b.subword_model),
            }
    return theirs, ct2


# ----------------------------------------------------------------------------- report


def ratios(ours: dict, theirs: dict) -> dict:
    """The three headline comparisons (training speed, translation speed, BLEU difference)."""
    return {
        "train": ours["real_tok_s"] / theirs["real_tok_s"],
        "translate": ours["sent_s"] / theirs["sent_s"],
        "bleu_diff": ours["bleu"] - theirs["bleu"],
    }


def table(b: Bench, ours: dict, theirs: dict, ct2: dict) -> str:
    """The Markdown comparison table."""
    args, n_test = b.args, b.n_test
    r = ratios(ours, theirs)
    r_train, r_trans, d_bleu = r["train"], r["translate"], r["bleu_diff"]

    def ok(flag: bool) -> str:
        return "yes" if flag else "**no**"

    def c(tag: str, key: str, fmt: str) -> str:
        return format(ct2[tag][key], fmt) if tag in ct2 else "n/a"

    def ratio(key: str, fmt: str = ".3f") -> str:
        return format(ours[key] / theirs[key], fmt)

    rows = [
        "| | onmt_doc | OpenNMT-py 3.5.1 | onmt_doc / ONMT | target | met | CT2 fp32 | CT2 int8 |",
        "|---|---:|---:|---:|---:|:-:|---:|---:|",
        f"| parameters | {ours['params']:,} | {theirs['params']:,} | {ratio('params')} | | | | |",
        f"| batch: real target subwords / step (all {args.steps} steps) | {ours['real_tgt_per_step']:.0f} | "
        f"{theirs['real_tgt_per_step']:.0f} | {ratio('real_tgt_per_step')} | ≈ 1 | | | |",
        f"| batch: sentences / step | {ours['sents_per_step']:.1f} | {theirs['sents_per_step']:.1f} | "
        f"{ratio('sents_per_step')} | | | | |",
        f"| **training: real target subwords / s** (steady state) | {ours['real_tok_s']:.0f} | "
        f"{theirs['real_tok_s']:.0f} | **{r_train:.2f}×** | ≥ {TARGETS['train']}× | "
        f"{ok(r_train >= TARGETS['train'])} | | |",
        f"| training: steps / s | {ours['steps_per_s']:.3f} | {theirs['steps_per_s']:.3f} | "
        f"{ratio('steps_per_s', '.2f')}× | | | | |",
        f"| training: tgt tok/s as each logs it (onmt_doc counts n+3, ONMT n+1 tokens per sentence) | "
        f"{ours['reported_tok_s']:.0f} | {theirs['reported_tok_s']:.0f} | "
        f"{ratio('reported_tok_s', '.2f')}× | | | | |",
        f"| training: report intervals used / clean / after the first | "
        f"{ours['intervals_used']} / {ours['intervals_clean']} / {ours['intervals_steady']} | "
        f"{theirs['intervals_used']} / {theirs['intervals_clean']} / {theirs['intervals_steady']} | | | | | |",
        f"| training command wall, s (incl. start-up, validation, save; pauses excluded) | {ours['train_wall']:.0f} | "
        f"{theirs['train_wall']:.0f} | {theirs['train_wall'] / ours['train_wall']:.2f}× speed | | | | |",
        f"| **translation: sentences / s** (beam {args.beam}, {args.tbatch} sents/batch, load excluded) | "
        f"{ours['sent_s']:.1f} | {theirs['sent_s']:.1f} | **{r_trans:.2f}×** | ≥ {TARGETS['translate']}× | "
        f"{ok(r_trans >= TARGETS['translate'])} | {c('fp32', 'sent_s', '.1f')} | {c('int8', 'sent_s', '.1f')} |",
        *(
            [
                f"| translation: sentences / s, onmt_doc `-dtype bfloat16` (BLEU {ours['bf16']['bleu']:.2f}) vs "
                f"OpenNMT-py float32 | {ours['bf16']['sent_s']:.1f} | {theirs['sent_s']:.1f} | "
                f"{ours['bf16']['sent_s'] / theirs['sent_s']:.2f}× | | | | |"
            ]
            if "bf16" in ours
            else []
        ),
        f"| translation time, s ({n_test} sentences) | {ours['translate_s']:.1f} | {theirs['translate_s']:.2f} | | | | "
        f"{c('fp32', 'translate_s', '.2f')} | {c('int8', 'translate_s', '.2f')} |",
        f"| output subwords (test2016) | {ours['hyp_subwords']} | {theirs['hyp_subwords']} | | | | | |",
        f"| BLEU (detokenized, sacrebleu 13a vs raw test2016.de; not a quality comparison, see notes) | "
        f"{ours['bleu']:.2f} | {theirs['bleu']:.2f} | {d_bleu:+.2f} | | | {c('fp32', 'bleu', '.2f')} | "
        f"{c('int8', 'bleu', '.2f')} |",
        f"| chrF (detokenized) | {ours['chrf']:.2f} | {theirs['chrf']:.2f} | {ours['chrf'] - theirs['chrf']:+.2f} "
        f"| | | {c('fp32', 'chrf', '.2f')} | {c('int8', 'chrf', '.2f')} |",
        f"| BLEU on tokenized subword output (run_onmt_bench.sh's score) | | {theirs['bleu_tok']:.2f} | "
        f"| | | {c('fp32', 'bleu_tok', '.2f')} | {c('int8', 'bleu_tok', '.2f')} |",
        f"| training: real target subwords / s in the first / second half of the used intervals | "
        f"{ours['real_tok_s_first_half']:.0f} / {ours['real_tok_s_second_half']:.0f} | "
        f"{theirs['real_tok_s_first_half']:.0f} / {theirs['real_tok_s_second_half']:.0f} | | | | | |",
        f"| valid perplexity (not comparable: onmt_doc exp(NLL) incl. its <s> </s> <eos> markup; OpenNMT-py "
        f"exp of its label-smoothed loss) | {ours['valid_ppl']} | "
        f"{theirs['valid_ppl']} | | | | | |",
    ]
    return "\n".join(rows)


def notes(b: Bench, cal: dict, vocab_entries: int, ours: dict, theirs: dict, ct2: dict) -> list[str]:
    """What the table's numbers mean and how they were made fair."""
    args, thr = b.args, b.args.quiet_threshold
    return [
        f"Data: Multi30k en→de, {b.n_train} training pairs, test2016 ({b.n_test} sentences); one shared BPE "
        f"(`vocab.size {args.vocab_size}`, {vocab_entries} entries) learned by onmt_doc and applied to the "
        "OpenNMT-py files with pyonmttok, so both toolkits see identical subwords.",
        f"Same shape and schedule: d_model 256, 3+3 layers, 4 heads, ff 1024, dropout/attention dropout 0.1, "
        f"tied embeddings, Adam (0.9, 0.998, eps 1e-9), noam lr {args.lr} warmup {args.warmup}, label smoothing 0.1, "
        f"no clipping, {args.steps} steps.",
        f"Batches: OpenNMT-py `batch_size {args.onmt_batch_tokens}` tokens counts B·max(src, tgt+2); onmt_doc's "
        f"`train.batch_tokens` counts B·max(src+2, tgt+3) (sentence markup), so onmt_doc uses "
        f"`batch_tokens {cal['batch_tokens']}` to carry the same real target subwords per step "
        f"(at {args.onmt_batch_tokens} it would carry {cal['ours_at_same']:.0f} vs {cal['onmt_sim_real']:.0f}).",
        "Training rate: real target subwords (markup and </s> excluded) per second over the report intervals "
        "after the first (start-up excluded), using only intervals in which the toolkit was never stopped and other "
        f"processes on this shared machine took < {thr} CPU cores; the logged rates count different tokens. "
        + (
            "The two trainings ran one after the other."
            if args.sequential
            else f"The two trainings were time-sliced ({args.slice:.0f} s turns, the other one SIGSTOPped, "
            "never both on the CPU) so that both see the same machine: this VM's speed drifts by 20-30% within minutes."
        ),
        "Translation: model load excluded for both (onmt_doc `translated … in Xs`, OpenNMT-py `Total translation "
        "time`; tokenization included), mean of the undisturbed runs, alternating between the toolkits: onmt_doc "
        f"{ours['translate_runs']} s, OpenNMT-py {theirs['translate_runs']} s; CT2 is the median of 3 runs after "
        f"loading per round ({ct2.get('fp32', {}).get('runs')} s fp32). Length penalty: onmt_doc GNMT α=1, "
        "OpenNMT-py `avg`, CT2 length_penalty 1. Output lengths differ (different models), so sentences/s also "
        "reflects how long the hypotheses are; onmt_doc also decodes its <s> and </s> markup (2 extra steps; its "
        "first two steps, <bos> and the forced <s>, run one row per sentence instead of one per beam)."
        + (
            f" The bfloat16 row translates the same float32 checkpoint in bfloat16 (`-dtype bfloat16`, this CPU has "
            f"AMX), runs {ours['bf16']['runs']} s."
            if "bf16" in ours
            else ""
        ),
        "Parameters: OpenNMT-py 3.5 Transformers have no biases in the attention and FFN projections by default "
        "(`add_qkvbias`/`add_ffnbias` off); onmt_doc has them.",
        "Quality is not compared. OpenNMT-py 3.5.1 initialises with `param_init_glorot` (xavier_uniform on every "
        "weight matrix, the shared embedding/output matrix included: std √(2/(V+d)) ≈ 0.016, 0.25 after the √d "
        "scaling) where onmt_doc draws embeddings from N(0, d^-0.5) (1.0 after scaling); no OpenNMT-py option "
        "gives the same start (`param_init` > 0 is uniform on every parameter, layer norms included), and at "
        f"{args.steps} steps its model is under-trained. Its validation perplexity is exp of the label-smoothed "
        "loss (its validation criterion keeps `label_smoothing`), onmt_doc's exp of the plain NLL over n+3 tokens "
        "per sentence: the two perplexities measure different things.",
    ]


def section(b: Bench, machine: str, date: str, table_md: str, notes_md: list[str]) -> str:
    """This benchmark's section of docs/benchmarks.md (commands relative to the repository)."""
    args = b.args
    return "\n".join(
        [
            SECTION,
            "",
            f"Date: {date}. Machine: {machine}.",
            "",
            "Commands (the whole comparison is `python benchmarks/transformer_vs_onmt.py "
            f"--steps {args.steps} --out {os.path.relpath(b.out, REPO)}"
            f"{' --train-lines ' + str(args.train_lines) if args.train_lines else ''}`; peers venv from "
            "`../shared/peers/setup_peers.sh` + `benchmarks/setup_peers_extra.sh`):",
            "",
            "```",
            *(relative_to_repo(c) for c in b.commands),
            "```",
            "",
            table_md,
            "",
            *[f"- {n}" for n in notes_md],
            "",
        ]
    )


def relative_to_repo(command: str) -> str:
    """A command line with the repository's and its siblings' absolute paths made relative (the
    report must not name one machine's folders) and the interpreter's scripts by their names."""
    bindir = os.path.dirname(sys.executable) + os.sep
    parent = os.path.dirname(REPO) + os.sep
    return command.replace(bindir, "").replace(REPO + os.sep, "").replace(parent, "../")


def main() -> None:
    args = parse_args()
    MONITOR.sample()
    MONITOR.start()
    t_start = time.perf_counter()
    b = Bench(args, os.path.abspath(args.out))
    for d in (b.ours_dir, b.tok_dir):
        os.makedirs(d, exist_ok=True)
    prepare_data(b)
    config = onmt_doc_config(b)
    vocab_cmd = tool("onmt_doc_build_vocab") + ["-config", b.config_path]
    b.commands.append(" ".join(vocab_cmd))
    if not args.report_only:
        shutil.rmtree(b.run_dir, ignore_errors=True)
        write_config(b, config)
        Scheduler(MONITOR, args).run_alone(
            "onmt_doc_build_vocab", vocab_cmd, os.path.join(b.ours_dir, "build_vocab.log"), echo=r"written to"
        )
    tok, n_src, n_tgt, src_text, vocab_entries = tokenize_for_onmt(b)
    cal = calibrate(args, n_src, n_tgt, src_text)
    config["train"]["batch_tokens"] = cal["batch_tokens"]
    cmds = build_commands(b)
    phases_path = os.path.join(b.out, "phases.json")
    if args.report_only:
        phases = load_phases(phases_path)
    else:
        phases = run_phases(b, cmds, config)
        save_phases(phases_path, phases)
    ours = ours_results(b, phases, cal, n_src, n_tgt, tok)
    theirs, ct2 = theirs_results(b, phases)
    MONITOR.stop()
    report(b, cal, vocab_entries, phases, ours, theirs, ct2)
    log(f"done in {time.perf_counter() - t_start:.0f}s; results in {os.path.relpath(b.out, REPO)}/results.json")


def report(b: Bench, cal: dict, vocab_entries: int, phases: dict, ours: dict, theirs: dict, ct2: dict) -> None:
    """Print the table and notes; write results.json, table.md and (unless --no-docs) the docs section."""
    import torch

    args = b.args
    machine = (
        f"{cpu_model()}, {os.cpu_count()} cores visible, {args.threads} threads for every tool; "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )
    date = datetime.date.today().isoformat()
    table_md = table(b, ours, theirs, ct2)
    notes_md = notes(b, cal, vocab_entries, ours, theirs, ct2)
    print("\n" + table_md + "\n")
    for n in notes_md:
        print("- " + n)

    def strip(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in ("lines", "summary")}

    results = {
        "date": date,
        "machine": machine,
        "args": vars(args),
        "batch_tokens": cal["batch_tokens"],
        "onmt_replay_real_tgt_per_batch": cal["onmt_sim_real"],
        "onmt_replay_sents_per_batch": cal["onmt_sim_sents"],
        "ours_real_tgt_per_batch_at_onmt_budget": cal["ours_at_same"],
        "onmt_doc": ours,
        "onmt_py": theirs,
        "onmt_py_attempts": [strip(a) for a in phases["onmt"]],
        "translate_ours": [strip(a) for a in phases["translate_ours"]],
        "ct2": ct2,
        "commands": b.commands,
        "ratios": ratios(ours, theirs),
    }
    write_json(os.path.join(b.out, "results.json"), results, default=float)
    text = section(b, machine, date, table_md, notes_md)
    with open(os.path.join(b.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    if not args.no_docs:
        update_docs_section(args.docs, SECTION, text)
        log(f"updated {os.path.relpath(args.docs, REPO)}")


if __name__ == "__main__":
    main()
