#!/usr/bin/env python
"""MHPLSTM decoder vs Transformer decoder on Multi30k en→de (the paper's table 2 and figure 5 at
CPU scale): same encoder, sizes, vocabulary, batches, schedule and steps.

1. one shared BPE vocabulary; both models trained with ``onmt_doc_train`` for ``--steps`` steps;
2. training speed: forward + backward + Adam on the same real training batches, the two models
   alternating step by step in one process (median), so machine drift hits both alike;
3. decoding speed (beam 4, 32 sentences per batch), models alternating per batch, by source
   length bucket (≤15, 15–30, 30–45, >45 subwords; test2016 first, newstest sentences to fill
   the long buckets), overall = all bucket sentences, and on long outputs (a 4-beam decode forced
   to run 128 steps, with the per-step beam reordering beam search does);
4. parameters and BLEU of test2016 (``onmt_doc_translate``).

    flock /tmp/onmt_bench.lock python benchmarks/mhplstm.py --out runs/bench_mhplstm --steps 300
    python benchmarks/mhplstm.py --out runs/bench_mhplstm_smoke --steps 10 --rounds 1   # smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from common import (
    base_config,
    bleu,
    last_validation,
    log,
    logged_tok_rate,
    machine,
    multi30k,
    prepare_run,
    recipe_arguments,
    timed,
    tool,
    write_results,
    write_yaml,
)
from synthetic import forced_long_decode

BUCKETS = [(0, 15), (15, 30), (30, 45), (45, 10**6)]


def model_configs(args: argparse.Namespace, out: str) -> dict[str, dict]:
    """The two models' configs: the same recipe, only the decoder type differs."""
    shape = {"layers": args.layers, "heads": 4, "ff": 4 * args.d_model}
    configs = {}
    for name, decoder in (("transformer", {"type": "transformer", **shape}), ("mhplstm", {"type": "mhplstm", **shape})):
        cfg = base_config(args, f"{out}/{name}/run")
        cfg["model"]["decoder"] = decoder
        cfg["train"]["batch_tokens"] = args.batch_tokens
        configs[name] = cfg
    return configs


def train_and_score(args: argparse.Namespace, out: str, name: str, cfg: dict) -> dict:
    """Train (unless a checkpoint exists) and translate test2016; parameters, BLEU, log rate."""
    path, ckpt = prepare_run(cfg, out, name)
    row: dict = {"config": path, "checkpoint": ckpt}
    if not os.path.exists(ckpt):
        row["train_seconds"], _, err = timed(
            [*tool("onmt_doc_train"), "-config", path], f"{out}/{name}_train.log", args.threads
        )
    else:
        with open(f"{out}/{name}_train.log", encoding="utf-8") as f:
            err = f.read()
    row["logged_tok_per_s"] = logged_tok_rate(err)
    row["valid"] = last_validation(err)
    m30k = multi30k(args.data)
    cmd = [
        *tool("onmt_doc_translate"),
        "-model",
        ckpt,
        "-src",
        f"{m30k}/test2016.en",
        "-tgt",
        f"{m30k}/test2016.de",
        "-beam",
        "4",
        "-threads",
        str(args.threads),
        "-output",
        f"{out}/{name}/test.hyp",
    ]
    translated = f"{out}/{name}_translate.log"
    if os.path.exists(f"{out}/{name}/test.hyp") and os.path.exists(translated):  # a finished run
        with open(translated, encoding="utf-8") as f:
            err = f.read()
    else:
        _, _, err = timed(cmd, translated, args.threads)
    row["bleu"] = bleu(err)
    return row


def load(ckpt: str):
    from onmt_doc.models.checkpoint import load_model

    model, cfg, codec = load_model(ckpt, "cpu")
    return model.eval(), cfg, codec


def sentence_batches(codec, lines: list[str], size: int = 32):
    """Length-sorted batches of ``size`` source sentences (as the translator makes them)."""
    from onmt_doc.data.batching import collate
    from onmt_doc.data.instances import Example, mark_sentence

    ids = sorted((codec.encode([line], "src")[0] for line in lines), key=len)
    examples = [Example(mark_sentence(s), mark_sentence([]), i, 0, 1) for i, s in enumerate(ids)]
    return [collate(examples[i : i + size]) for i in range(0, len(examples), size)]


def bucket_sentences(codec, per_bucket: int, data: str) -> dict[str, list[str]]:
    """Up to ``per_bucket`` sentences per source-subword bucket: test2016 first, newstest after."""
    out: dict[str, list[str]] = {f"{lo}-{hi}" if hi < 10**6 else f">{lo}": [] for lo, hi in BUCKETS}
    keys = list(out)
    for path in (f"{multi30k(data)}/test2016.en", f"{data}/news-sent-en-de/newstest2008-2013.en"):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                n = len(codec.encode([line], "src")[0])
                for key, (lo, hi) in zip(keys, BUCKETS):
                    if (lo < n <= hi or (lo == 0 and n <= hi)) and len(out[key]) < per_bucket:
                        out[key].append(line)
    return out


def time_decoding(models: dict, batches: list, rounds: int) -> dict[str, dict[str, float]]:
    """Per model: median seconds of beam-4 search over ``batches`` (models alternating per batch)
    and the output tokens of the best hypotheses (sentences/s depends on how long they are)."""
    from onmt_doc.translate.length_penalty import GNMTPenalty
    from onmt_doc.translate.search import BeamSearch

    search = BeamSearch(beam=4, penalty=GNMTPenalty(1.0), max_len_ratio=1.5, max_len_add=10)
    seconds: dict[str, list[float]] = {name: [] for name in models}
    tokens = dict.fromkeys(models, 0)
    for _ in range(rounds):
        total = dict.fromkeys(models, 0.0)
        for batch in batches:
            for name, model in models.items():
                start = time.perf_counter()
                hyps = search.search(model, batch)
                total[name] += time.perf_counter() - start
                tokens[name] = tokens[name] + sum(len(h[0].tokens) + 1 for h in hyps)
        for name in models:
            seconds[name].append(total[name])
    return {name: {"seconds": statistics.median(seconds[name]), "out_tokens": tokens[name] / rounds} for name in models}


def time_long_outputs(models: dict, batch, steps: int, rounds: int) -> dict[str, float]:
    """Sentences/s of a forced ``steps``-step 4-beam decode per model (alternating, median)."""
    seconds = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            forced_long_decode(model, batch, steps)
            seconds[name].append(time.perf_counter() - start)
    return {name: batch.size / statistics.median(s) for name, s in seconds.items()}


def time_training(configs: dict, out: str, steps: int) -> dict[str, float]:
    """Target tokens/s of forward + backward + Adam on the same real training batches (the
    trainer's seeded sampler), the models alternating batch by batch; median step time."""
    from onmt_doc.config import load_config
    from onmt_doc.data.batching import BatchSampler, collate
    from onmt_doc.data.prepare import load_codec, load_examples
    from onmt_doc.losses import build_losses
    from onmt_doc.models.builder import build_model

    cfgs = {name: load_config(f"{out}/{name}/config.yaml") for name in configs}
    first = next(iter(cfgs.values()))
    codec = load_codec(first, first.log.dir)
    examples, _ = load_examples(first, codec, first.data.train.src, first.data.train.tgt, "sentence", first.log.dir)
    order = BatchSampler(examples, first.train.batch_tokens, seed=first.train.seed).epoch_batches(0)[: steps + 2]
    batches = [collate([examples[i] for i in idx], idx) for idx in order]
    models, opts = {}, {}
    for name, cfg in cfgs.items():
        torch.manual_seed(0)
        models[name] = build_model(cfg.model, codec).train()
        opts[name] = torch.optim.Adam(models[name].parameters(), lr=1e-4)
    loss_fn = build_losses(first.loss)[0]
    seconds: dict[str, list[float]] = {name: [] for name in models}
    tokens = []
    for i, batch in enumerate(batches):
        for name, model in models.items():
            start = time.perf_counter()
            loss, _ = loss_fn(model(batch), batch)
            loss.backward()
            opts[name].step()
            opts[name].zero_grad()
            if i >= 2:  # first two: warm-up
                seconds[name].append(time.perf_counter() - start)
        if i >= 2:
            tokens.append(int(batch.tgt_out.ne(0).sum()))
    per_batch = statistics.mean(tokens)
    return {name: per_batch / statistics.median(s) for name, s in seconds.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    recipe_arguments(p, "runs/bench_mhplstm", 300)
    p.add_argument("--rounds", type=int, default=3, help="timing repeats (median)")
    p.add_argument("--per_bucket", type=int, default=64, help="sentences per source-length bucket")
    p.add_argument("--timing_steps", type=int, default=20, help="training steps timed per model")
    p.add_argument("--long_steps", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    results: dict = {"args": vars(args), "torch": torch.__version__, "machine": machine()}
    vocab_cfg = write_yaml(base_config(args, f"{out}/vocab"), f"{out}/vocab/config.yaml")
    if not os.path.exists(f"{out}/vocab/vocab.txt"):
        timed([*tool("onmt_doc_build_vocab"), "-config", vocab_cfg], f"{out}/build_vocab.log", args.threads)
    configs = model_configs(args, out)
    rows = {name: train_and_score(args, out, name, cfg) for name, cfg in configs.items()}
    log(f"trained and scored: {rows}")
    loaded = {name: load(row["checkpoint"]) for name, row in rows.items()}
    models = {name: m for name, (m, _, _) in loaded.items()}
    codec = next(iter(loaded.values()))[2]
    for name, model in models.items():
        rows[name]["params"] = model.n_params()
    rows_tok = time_training(configs, out, args.timing_steps)
    for name in rows:
        rows[name]["train_tok_per_s"] = rows_tok[name]
    log(f"training speed: {rows_tok}")
    buckets = bucket_sentences(codec, args.per_bucket, args.data)
    decoding = {}
    overall = {name: {"seconds": 0.0, "out_tokens": 0.0} for name in models}
    for key, lines in buckets.items():
        timing = time_decoding(models, sentence_batches(codec, lines), args.rounds)
        decoding[key] = {
            "sentences": len(lines),
            **{n: len(lines) / t["seconds"] for n, t in timing.items()},
            **{f"{n}_out_tokens": t["out_tokens"] / len(lines) for n, t in timing.items()},
        }
        for name, t in timing.items():
            overall[name]["seconds"] += t["seconds"]
            overall[name]["out_tokens"] += t["out_tokens"]
        log(f"decoding {key}: {decoding[key]}")
    n_all = sum(len(lines) for lines in buckets.values())
    decoding["overall (all buckets)"] = {
        "sentences": n_all,
        **{n: n_all / t["seconds"] for n, t in overall.items()},
        **{f"{n}_out_tokens": t["out_tokens"] / n_all for n, t in overall.items()},
    }
    long_batch = sentence_batches(codec, buckets[list(buckets)[1]][:32])[0]
    decoding[f"long outputs ({args.long_steps} steps)"] = {
        "sentences": long_batch.size,
        **time_long_outputs(models, long_batch, args.long_steps, args.rounds),
    }
    results.update(models=rows, decoding=decoding)
    write_results(out, results, render)


def render(results: dict) -> str:
    a, m, d = results["args"], results["models"], results["decoding"]
    t, h = m["transformer"], m["mhplstm"]
    lines = [
        f"Machine: {results['machine']}; torch {results['torch']}, {a['threads']} threads. Model: d_model "
        f"{a['d_model']}, {a['layers']}+{a['layers']} layers, 4 heads, ff {4 * a['d_model']}, {a['steps']} "
        f"steps of {a['batch_tokens']} tokens; beam 4, 32 sentences per batch.",
        "",
        "| | Transformer decoder | MHPLSTM decoder | MHPLSTM / Transformer | goal |",
        "|---|---:|---:|---:|---|",
        f"| parameters | {t['params']:,} | {h['params']:,} | {h['params'] / t['params']:.3f} | |",
        f"| training: target tokens/s (fwd+bwd+Adam, alternating, median) | {t['train_tok_per_s']:.0f} | "
        f"{h['train_tok_per_s']:.0f} | {h['train_tok_per_s'] / t['train_tok_per_s']:.2f}× | ≥ 1.1× |",
        "| training: tgt tok/s as onmt_doc_train logged it (runs not interleaved) | "
        f"{t['logged_tok_per_s']:.0f} | "
        f"{h['logged_tok_per_s']:.0f} | {h['logged_tok_per_s'] / t['logged_tok_per_s']:.2f}× | |",
    ]
    for key, row in d.items():
        goal = "≥ 1.7×" if key.startswith("overall") else ("more than overall" if key.startswith((">", "long")) else "")
        length = (
            f" (output tokens/sentence {row['transformer_out_tokens']:.1f} / {row['mhplstm_out_tokens']:.1f})"
            if "mhplstm_out_tokens" in row
            else ""
        )
        lines.append(
            f"| decoding sent/s: {key}, {row['sentences']} sentences{length} | {row['transformer']:.1f} | "
            f"{row['mhplstm']:.1f} | {row['mhplstm'] / row['transformer']:.2f}× | {goal} |"
        )
        if "mhplstm_out_tokens" in row:
            t_tok, h_tok = (row[n] * row[f"{n}_out_tokens"] for n in ("transformer", "mhplstm"))
            lines.append(f"| decoding output tokens/s: {key} | {t_tok:.0f} | {h_tok:.0f} | {h_tok / t_tok:.2f}× | |")
    lines.append(f"| BLEU test2016 | {t['bleu']:.2f} | {h['bleu']:.2f} | {h['bleu'] - t['bleu']:+.2f} | not lower |")
    lines.append(f"| validation | {t['valid']} | {h['valid']} | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
