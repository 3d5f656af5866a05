#!/usr/bin/env python
"""onmt_doc_evaluate benchmarks: contrastive accuracy of trained toy models and scoring speed.

  # accuracy + translation metrics of runs trained by benchmarks/toy_context.py
  python benchmarks/contrastive_suite.py report --runs runs/bench_eval --threads 1
  # speed: a ContraPro-size suite (12,000 items, 3 candidates, 1-3 context sentences), streamed
  python benchmarks/contrastive_suite.py speed --model runs/bench_eval/g_transformer/checkpoints/last.pt \
      --items 12000 --threads 1

``report`` writes the toy suite for ``RUNS/data`` (seed 1, 145 test documents, as toy_context.py
writes them) and, for every system folder with a checkpoint, runs ``onmt_doc_evaluate`` with the
context, without it and shuffled, plus the metrics on its ``test.hyp``. ``speed`` repeats the toy
suite's items (streamed from a JSON Lines file, never all in memory) and reports items/s and the
peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from common import thread_env


def report(args) -> int:
    from onmt_doc.toy.contrastive_suite import write_toy_suite

    data = os.path.join(args.runs, "data")
    write_toy_suite(data, seed=1, test_docs=145)
    env = thread_env(args.threads)
    rows = {}
    for name in sorted(os.listdir(args.runs)):
        ckpt = os.path.join(args.runs, name, "checkpoints", "last.pt")
        if not os.path.exists(ckpt):
            continue
        out = os.path.join(args.runs, name, "evaluate.json")
        cmd = [
            sys.executable,
            "-m",
            "onmt_doc.bin.evaluate",
            "-model",
            ckpt,
            "-suite",
            os.path.join(data, "test.contrastive.json"),
            "-ablation",
            "none",
            "remove",
            "shuffle",
            "-json",
            out,
            "-threads",
            str(args.threads),
        ]
        hyp = os.path.join(args.runs, name, "test.hyp")
        if os.path.exists(hyp):
            cmd += ["-hyp", hyp, "-ref", os.path.join(data, "test.tgt"), "-src", os.path.join(data, "test.src")]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        rows[name] = json.load(open(out, encoding="utf-8"))
    print("| system | contrastive: context | removed | shuffled | pronouns (APT-style) | consistency | BLEU / d-BLEU |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        c, t = r["contrastive"], r.get("translation")
        extra = (
            f"{t['pronouns']['accuracy']:.1f}% of {t['pronouns']['total']} | "
            f"{t['consistency']['consistency']:.1f}% of {t['consistency']['repeated_terms']} "
            f"(ref. {t['consistency_reference']['consistency']:.1f}%) | {t['bleu']:.2f} / {t['d_bleu']:.2f}"
            if t
            else "- | - | -"
        )
        print(
            f"| {name} | {c['none']['accuracy']:.1f}% of {c['none']['total']} | {c['remove']['accuracy']:.1f}% | "
            f"{c['shuffle']['accuracy']:.1f}% | {extra} |"
        )
    return 0


def speed(args) -> int:
    import torch

    from onmt_doc.evaluation.contrastive import evaluate_suite, read_suite
    from onmt_doc.models.checkpoint import load_model
    from onmt_doc.toy.contrastive_suite import toy_items
    from onmt_doc.toy.corpus import generate_documents
    from onmt_doc.translate.translator import Translator

    torch.set_num_threads(args.threads)
    base = [i for i in toy_items(generate_documents(400, seed=7, split="test")) if len(i["context_src"]) <= 3]
    path = os.path.join(args.out, "suite.jsonl")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for n in range(args.items):
            f.write(json.dumps(base[n % len(base)]) + "\n")
    model, cfg, codec = load_model(args.model)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.time()
    res = evaluate_suite(Translator(model, codec, cfg), read_suite(path))
    seconds = time.time() - start
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "items": res["total"],
                "candidates": 3 * res["total"],
                "seconds": round(seconds, 1),
                "items_per_s": round(res["total"] / seconds, 1),
                "accuracy": round(res["accuracy"], 2),
                "peak_rss_mib": round(rss1 / 1024),
                "rss_added_mib": round((rss1 - rss0) / 1024),
                "unit": model.unit,
                "threads": args.threads,
            }
        )
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("report")
    r.add_argument("--runs", default="runs/bench_eval")
    r.add_argument("--threads", type=int, default=1)
    s = sub.add_parser("speed")
    s.add_argument("--model", required=True)
    s.add_argument("--items", type=int, default=12000)
    s.add_argument("--out", default="runs/bench_contrastive_speed")
    s.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    return report(args) if args.what == "report" else speed(args)


if __name__ == "__main__":
    sys.exit(main())
