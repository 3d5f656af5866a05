#!/usr/bin/env python3
"""Transformer vs Reformer-base vs Reformer-fast (Li et al., 2020, table 3) on Multi30k en→de.

Same vocabulary, data, batches, schedule and steps for the three, sizes chosen for similar
parameter counts (eq. 8 units of d_model²: Transformer 3+3 layers = 84, Reformer-base 3 layers =
72, Reformer-fast 3 PreNet + 2 Reformer layers = 84):

1. one shared BPE vocabulary (``onmt_doc_build_vocab``), copied into every run folder;
2. per model ``onmt_doc_train`` (validation perplexity, parameters, training target tokens/s as the
   median of the report intervals after the first);
3. ``onmt_doc_translate`` of test2016 (BLEU), then ``--rounds`` timed translations of its first
   ``--speed-lines`` sentences, the models alternating within each round so machine drift cancels;
   decoding speed = median time, relative to the Transformer;
4. activation memory per target token (bytes the autograd graph saves for backward, counted with
   ``torch.autograd.graph.saved_tensors_hooks``) with and without ``checkpoint_layers``;
5. ``<out>/results.md`` (for docs/benchmarks.md) and ``<out>/results.json``.

The run holds ``/tmp/onmt_bench.lock`` (as ``flock`` does) after building the vocabulary, so
benchmarks never overlap.

    python benchmarks/reformer.py --out runs/bench_reformer --steps 100 --threads 1 --test-lines 200 \
        --speed-lines 100   # ~10 min
    python benchmarks/reformer.py --out runs/bench_reformer_smoke --steps 5 --rounds 1 --speed-lines 20 \
        --test-lines 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from common import (
    add_data_argument,
    bleu,
    head,
    hold_lock,
    log,
    logged_tok_rate,
    machine,
    multi30k,
    params_m,
    prepare_run,
    read_json,
    run_streamed,
    tool,
    translate_seconds,
    validation_metrics,
    write_results,
    write_yaml,
)

PAPER_SPEED = {"reformer_base": 0.47, "reformer_fast": 0.73}
GOAL_FAST = 0.75


def model_sections(d: int) -> dict[str, dict]:
    """The compared models' encoder/decoder sections at d_model ``d`` (similar parameter counts)."""
    ff, heads = 4 * d, 4
    layer = {"heads": heads, "ff": ff}
    return {
        "transformer": {
            "encoder": {"type": "transformer", "layers": 3, **layer},
            "decoder": {"type": "transformer", "layers": 3, **layer},
        },
        "reformer_base": {"encoder": {"type": "embedding"}, "decoder": {"type": "reformer", "layers": 3, **layer}},
        "reformer_fast": {
            "encoder": {"type": "transformer", "layers": 3, **layer},
            "decoder": {"type": "reformer", "layers": 2, **layer},
        },
        # the paper's computation-allocation argument pushed further: same 84 units, 5 + 1 layers
        "reformer_fast_5+1": {
            "encoder": {"type": "transformer", "layers": 5, **layer},
            "decoder": {"type": "reformer", "layers": 1, **layer},
        },
    }


def config(args: argparse.Namespace, run_dir: str, section: dict) -> dict:
    """One model's config; the recipe (data, vocabulary, schedule, batches) is the same for all."""
    m30k = multi30k(args.data)
    return {
        "data": {
            "train": {"src": f"{m30k}/train.en", "tgt": f"{m30k}/train.de"},
            "valid": {"src": f"{m30k}/valid.en", "tgt": f"{m30k}/valid.de"},
            "documents": False,
            "cache_dir": f"{args.out}/cache",
        },  # tokenized once for all models
        "vocab": {"subword": "bpe", "size": 8000, "shared": True},
        "model": {"d_model": args.d_model, "dropout": 0.1, "attention_dropout": 0.1, **section},
        "optim": {
            "type": "adam",
            "lr": args.lr,
            "betas": [0.9, 0.98],
            "schedule": {"type": "inverse_sqrt", "warmup": args.warmup},
        },
        "train": {
            "batch_tokens": args.batch_tokens,
            "max_steps": args.steps,
            "valid_every": args.steps,
            "save_every": args.steps,
            "keep_last": 1,
            "valid_bleu": False,
            "threads": args.threads,
            "seed": 1,
        },
        "translate": {"beam": args.beam, "batch_sentences": 32},
        "log": {"dir": run_dir, "tensorboard": False, "every": 10},
    }


def train_row(text: str) -> dict:
    """Validation metrics, parameters and steady-state training speed from a training log."""
    rate = logged_tok_rate(text)
    valid = validation_metrics(text)
    return {
        "train_tok_s": rate if rate is not None else float("nan"),
        "valid_loss": valid["loss"],
        "valid_ppl": valid["ppl"],
        "valid_acc": valid["acc"],
        "params_m": params_m(text),
    }


def translate(
    args: argparse.Namespace, ckpt: str, src: str, out: str, log_path: str, ref: str = ""
) -> tuple[float, float]:
    """(seconds of translation without model loading, BLEU or nan)."""
    cmd = [
        *tool("onmt_doc_translate"),
        "-model",
        ckpt,
        "-src",
        src,
        "-output",
        out,
        "-beam",
        str(args.beam),
        "-threads",
        str(args.threads),
    ]
    text = run_streamed(cmd + (["-tgt", ref] if ref else []), log_path, args.threads)
    score = bleu(text)
    return translate_seconds(text), score if score is not None else float("nan")


def memory_per_token(args: argparse.Namespace, sections: dict[str, dict]) -> dict:
    """Activation bytes saved for backward per target token on one training-sized batch of
    multi30k-like lengths, for each model, and for the Reformers with ``checkpoint_layers``."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--measure-memory",
        json.dumps({"d_model": args.d_model, "sections": sections}),
    ]
    text = run_streamed(cmd, os.path.join(args.out, "memory.log"), args.threads)
    return json.loads(text.strip().splitlines()[-1])


def measure_memory(spec: str) -> None:
    """Child process of ``memory_per_token``: prints one JSON line."""
    import torch
    from synthetic import placeholder_codec, random_model, sized_batch

    spec_d = json.loads(spec)
    batch = sized_batch([(14, 14)] * 32, words=40)  # ~multi30k: 16+ subwords with markup
    codec = placeholder_codec(40)
    result = {}
    variants = [(n, s) for n, s in spec_d["sections"].items()]
    variants += [
        (f"{n}+checkpoint_layers", {**s, "decoder": {**s["decoder"], "checkpoint_layers": True}})
        for n, s in spec_d["sections"].items()
        if s["decoder"]["type"] == "reformer"
    ]
    for name, section in variants:
        model, _ = random_model({"d_model": spec_d["d_model"], **section}, codec)
        model.train()
        params = {q.untyped_storage().data_ptr() for q in model.parameters()}
        storages: dict[int, int] = {}  # each activation storage once (views and re-saves share it)

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                storages[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(batch)
            loss = torch.nn.functional.cross_entropy(out.logits, out.target)
        loss.backward()
        tokens = int(out.target.numel())
        kept = sum(storages.values())
        if section["decoder"].get("checkpoint_layers"):
            # torch's checkpoint keeps each layer's input itself (not through saved-tensor hooks)
            b, s, t = batch.src.size(0), batch.src.size(1), batch.tgt_in.size(1)
            kept += section["decoder"]["layers"] * b * t * s * spec_d["d_model"] * 4
        result[name] = {
            "bytes_per_target_token": kept / tokens,
            "src_len": batch.src.size(1),
            "tgt_len": batch.tgt_in.size(1),
        }
    print(json.dumps(result))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench_reformer")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--d_model", type=int, default=128)
    p.add_argument("--batch_tokens", type=int, default=1024)
    p.add_argument("--lr", type=float, default=2.0e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="timed translation rounds (models alternate)")
    p.add_argument("--speed-lines", type=int, default=200, help="test2016 sentences of each timed translation")
    p.add_argument("--test-lines", type=int, default=1000, help="test2016 sentences translated for BLEU")
    p.add_argument("--models", default="transformer,reformer_base,reformer_fast")
    p.add_argument("--measure-memory", help=argparse.SUPPRESS)
    add_data_argument(p)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.measure_memory:
        measure_memory(args.measure_memory)
        return
    args.out = os.path.abspath(args.out)  # before config(): the shared data cache lives there
    out = args.out
    os.makedirs(out, exist_ok=True)
    results: dict = {
        "args": {k: v for k, v in vars(args).items() if k != "measure_memory"},
        "machine": machine(),
        "models": {},
    }
    vocab_cfg = write_yaml(config(args, f"{out}/vocab", {}), f"{out}/vocab/config.yaml")
    if not os.path.exists(f"{out}/vocab/vocab.txt"):
        run_streamed([*tool("onmt_doc_build_vocab"), "-config", vocab_cfg], f"{out}/build_vocab.log", args.threads)
    _lock = hold_lock()  # held until exit: no other benchmark runs meanwhile
    sections = {k: v for k, v in model_sections(args.d_model).items() if k in args.models.split(",")}
    ckpts = {name: train_and_score(args, out, name, section, results) for name, section in sections.items()}
    times = time_decoding(args, out, ckpts)
    for name in sections:
        row = results["models"][name]
        row["decode_s"], row["decode_runs"] = statistics.median(times[name]), times[name]
        if "transformer" in times:  # relative to the Transformer timed in the same rounds
            row["decode_vs_transformer"] = statistics.median(times["transformer"]) / row["decode_s"]
    results["memory"] = memory_per_token(args, sections)
    merge_earlier(results, f"{out}/results.json")
    write_results(out, results, render)


def train_and_score(args: argparse.Namespace, out: str, name: str, section: dict, results: dict) -> str:
    """Train one model (unless its run has a checkpoint) and translate the test lines (BLEU); its
    row goes to ``results["models"]``; returns the checkpoint."""
    m30k = multi30k(args.data)
    test_src, test_ref = (head(f"{m30k}/test2016.{lang}", args.test_lines, out) for lang in ("en", "de"))
    path, ckpt = prepare_run(config(args, f"{out}/{name}/run", section), out, name)
    log_path = f"{out}/{name}_train.log"
    if os.path.exists(ckpt):
        with open(log_path, encoding="utf-8") as f:
            text = f.read()
    else:
        text = run_streamed([*tool("onmt_doc_train"), "-config", path], log_path, args.threads)
    row = train_row(text)
    _, row["bleu"] = translate(args, ckpt, test_src, f"{out}/{name}/test.hyp", f"{out}/{name}_translate.log", test_ref)
    results["models"][name] = row
    log(f"{name}: {row}")
    return ckpt


def time_decoding(args: argparse.Namespace, out: str, ckpts: dict[str, str]) -> dict[str, list[float]]:
    """Seconds of each round's translation of the speed lines per model, the models alternating
    (and reversing their order every other round) so that machine drift hits all alike."""
    speed_src = head(f"{multi30k(args.data)}/test2016.en", args.speed_lines, out, "speed")
    times: dict[str, list[float]] = {n: [] for n in ckpts}
    for r in range(args.rounds):
        order = list(ckpts) if r % 2 == 0 else list(ckpts)[::-1]
        for name in order:
            seconds, _ = translate(
                args, ckpts[name], speed_src, f"{out}/{name}/speed.hyp", f"{out}/{name}_speed{r}.log"
            )
            times[name].append(seconds)
            log(f"round {r} {name}: {seconds:.1f}s")
    return times


def merge_earlier(results: dict, path: str) -> None:
    """Keep the rows of models that an earlier run into the same folder measured and this one did
    not (``--models`` subsets); each row keeps its own speed ratio."""
    earlier = read_json(path, {})
    for key in ("models", "memory"):
        results[key] = {**{k: v for k, v in earlier.get(key, {}).items() if k not in results[key]}, **results[key]}


def render(results: dict) -> str:
    a, models = results["args"], results["models"]
    base = models.get("transformer", {})
    lines = [
        f"Machine: {results['machine']}; {a['threads']} threads. d_model {a['d_model']}, 4 heads, ff "
        f"{4 * a['d_model']}; {a['steps']} steps of {a['batch_tokens']} tokens (lr {a['lr']}, inverse_sqrt "
        f"warmup {a['warmup']}); beam {a['beam']}; decoding speed: median of {a['rounds']} alternating "
        f"translations of the first {a['speed_lines']} test2016 sentences (32 per batch); BLEU on the first "
        f"{a['test_lines']} test2016 sentences.",
        "",
        "| system | params | valid ppl | valid acc % | test2016 BLEU | train tgt tok/s | decode s "
        "| decoding speed vs Transformer | paper |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in models.items():
        rel = r.get("decode_vs_transformer", base["decode_s"] / r["decode_s"] if base else float("nan"))
        paper = f"{PAPER_SPEED[name]:.2f}×" if name in PAPER_SPEED else ("1×" if name == "transformer" else "–")
        lines.append(
            f"| {name} | {r['params_m']:.2f}M | {r['valid_ppl']:.2f} | {r['valid_acc']:.1f} | "
            f"{r['bleu']:.2f} | {r['train_tok_s']:.0f} | {r['decode_s']:.1f} | {rel:.2f}× | {paper} |"
        )
    if base and "reformer_fast" in models:
        fast = models["reformer_fast"]
        rel = fast.get("decode_vs_transformer", base["decode_s"] / fast["decode_s"])
        lines += [
            "",
            f"Goal: Reformer-fast decoding ≥ {GOAL_FAST}× the Transformer — measured {rel:.2f}× "
            f"({'met' if rel >= GOAL_FAST else 'not met'}).",
        ]
    mem = results.get("memory", {})
    if mem:
        first = next(iter(mem.values()))
        lines += [
            "",
            f"Activation memory saved for backward, per target token (batch of 32 pairs, S = "
            f"{first['src_len']}, T = {first['tgt_len']} with markup, float32):",
            "",
            "| model | KiB / target token |",
            "|---|---:|",
        ]
        lines += [f"| {n} | {m['bytes_per_target_token'] / 1024:.0f} |" for n, m in mem.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
