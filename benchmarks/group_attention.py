#!/usr/bin/env python
"""Packed group attention vs dense N×N masking: time and peak memory of one G-Transformer training
step of the encoder + decoder (forward and backward through both stacks; the output layer and the
optimizer, whose cost does not depend on attention, are left out) at instance lengths 128…2048
tokens, sentences of 20–25 words plus markup.

  python benchmarks/group_attention.py [--lengths 128 256 512 1024 2048] [--global-layers 0]
                                       [--threads 2] [--repeats 3] [--out runs/bench_group]

The dense variant swaps the packed block plan for the masked N×N formulation (the reference of
tests/test_g_transformer.py) inside the same model; everything else is identical. Each
(variant, length) runs in a fresh process, so its peak resident memory is its own; "step memory"
is that peak minus the resident memory before the first step (activations, gradients, attention
scores and masks; the model is allocated before). "attention tensors" is the size
of the scores a step keeps per attention layer (dense: B·H·N·N floats plus an N·N mask; packed:
G·H·L·L plus its mask), computed from the shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from common import add_shape_arguments, thread_env, write_json


def _rss_kib() -> int:
    """Current resident memory (the peak counter cannot go down between measurements)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def dense_patch(explicit: bool = False):
    """Replace the packed plan by full N×N masks in the G-Transformer encoder and decoder
    (``explicit``: scores and probabilities materialised, as a plain masked implementation does;
    otherwise SDPA's fused kernel with the mask)."""
    import torch
    import torch.nn.functional as F

    from onmt_doc.decoders import g_transformer as dec
    from onmt_doc.encoders import g_transformer as enc

    def allowed(q_tags, q_keep, k_tags, k_keep, causal):
        m = ((q_tags[:, :, None] == k_tags[:, None, :]) | (q_tags[:, :, None] == 0)) & k_keep[:, None, :]
        if causal:
            m = m & torch.ones(q_tags.size(1), k_tags.size(1), dtype=torch.bool, device=m.device).tril()
        has = m.any(-1, keepdim=True)
        return (m | ~has)[:, None], has[:, None]

    def plan_self(tags, keep, causal):
        return allowed(tags, keep, tags, keep, causal)

    def plan_cross(q_tags, q_keep, k_tags, k_keep):
        return allowed(q_tags, q_keep, k_tags, k_keep, False)

    def group_attend(plan, q, k, v, dropout=0.0, probe=None):
        mask, has = plan
        if explicit:
            scores = (q @ k.transpose(-1, -2)) / q.size(-1) ** 0.5
            return F.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1), dropout) @ v * has
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout) * has

    enc.plan_self = dec.plan_self = plan_self
    dec.plan_cross = plan_cross
    enc.group_attend = dec.group_attend = group_attend
    return plan_self, group_attend


def make_batch(n_tokens: int, batch: int, seed: int):
    import numpy as np

    from onmt_doc.data.batching import collate
    from onmt_doc.data.instances import Example, mark_sentence

    rng = np.random.default_rng(seed)
    examples = []
    for i in range(batch):
        src, tgt, total = [], [], 1
        while total + 27 <= n_tokens:
            length = int(rng.integers(20, 26))
            src.append(mark_sentence(rng.integers(10, 8000, length)))
            tgt.append(mark_sentence(rng.integers(10, 8000, length)))
            total += length + 2
        examples.append(Example(np.concatenate(src), np.concatenate(tgt), i, 0, len(src)))
    return collate(examples)


def _timed(fn, repeats: int) -> dict:
    """Median wall and CPU seconds of ``fn``. With one thread, CPU time is the cost of the step
    even on a host shared with other work (wall time then also counts waiting for a core)."""
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {"step_s": statistics.median(wall), "step_cpu_s": statistics.median(cpu)}


def attention_only(args) -> dict:
    """One group self-attention (forward + backward) over the batch, heads of d_model / heads."""
    import torch

    from onmt_doc.modules import group_attention

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    plan_self, attend = (
        (group_attention.plan_self, group_attention.group_attend)
        if args.variant == "packed"
        else dense_patch(args.variant == "dense_explicit")
    )
    batch = make_batch(args.length, args.batch, seed=1)
    tags, keep = batch.src_groups, batch.src.ne(0)
    shape = (batch.size, args.heads, tags.size(1), args.d_model // args.heads)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    weight = torch.randn(shape)

    def step():
        (attend(plan_self(tags, keep, False), q, k, v) * weight).sum().backward()

    before = _rss_kib()
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "what": "attention",
        "variant": args.variant,
        "length": args.length,
        **_timed(step, args.repeats * 3),
        "step_mem_mib": (peak - before) / 1024,
    }


def one(args) -> dict:
    """Runs in the child process: build, measure, print JSON."""
    import torch
    from synthetic import benchmark_codec

    from onmt_doc.config import config_from_dict
    from onmt_doc.models.builder import build_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.what == "attention":
        return attention_only(args)
    if args.variant != "packed":
        dense_patch(args.variant == "dense_explicit")
    part = {
        "type": "g_transformer",
        "layers": args.layers,
        "heads": args.heads,
        "ff": args.ff,
        "global_layers": args.global_layers,
    }
    cfg = config_from_dict(
        {
            "model": {
                "d_model": args.d_model,
                "dropout": 0.1,
                "attention_dropout": 0.0,
                "encoder": part,
                "decoder": {**part, "global_cross_layers": args.global_layers},
            }
        }
    )
    model = build_model(cfg.model, benchmark_codec()).train()
    batch = make_batch(args.length, args.batch, seed=1)
    weight = torch.randn(batch.tgt_in.size(1), args.d_model)

    def step():  # encoder + decoder forward and backward (no output layer: its cost does not depend on attention)
        hidden = model.decoder(batch.tgt_in, model.encoder(batch), batch).hidden
        (hidden * weight).sum().backward()

    before = _rss_kib()
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def zero_and_step():
        model.zero_grad(set_to_none=True)
        step()

    timing = _timed(zero_and_step, args.repeats)
    lengths = batch.src_groups.max(1).values
    longest = int(torch.bincount(batch.src_groups[0]).max())
    n_attn = 3 * args.layers  # encoder self, decoder self and cross per layer
    heads, n = args.heads, batch.src.size(1)
    if args.variant != "packed":
        attn_bytes = n_attn * (batch.size * heads * n * n * 4 + batch.size * n * n)
    else:
        g = int(lengths.sum())
        attn_bytes = n_attn * (g * heads * longest * longest * 4 + g * longest * longest)
    return {
        "what": "model",
        "variant": args.variant,
        "length": args.length,
        "tokens": int(batch.n_src_tokens),
        "sentences": int(lengths.sum()),
        **timing,
        "step_mem_mib": (peak - before) / 1024,
        "attn_mib": attn_bytes / 2**20,
    }


VARIANTS = ["packed", "dense", "dense_explicit"]


def _child(args, what: str, variant: str, length: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--what", what, "--variant", variant, "--length", str(length)]
    for key in ("batch", "d_model", "layers", "heads", "ff", "global_layers", "threads", "repeats"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    out = subprocess.run(cmd, capture_output=True, text=True, env=thread_env(args.threads))
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(rows: list, lengths: list) -> None:
    def get(what, variant, length):
        return next(r for r in rows if r["what"] == what and r["variant"] == variant and r["length"] == length)

    print(
        "| tokens/instance | attention fwd+bwd CPU s: packed / dense SDPA / dense explicit | attention peak MiB: "
        "packed / dense SDPA / dense explicit | enc+dec step CPU s: packed / dense SDPA (speed-up) | enc+dec "
        "step wall s: packed / dense SDPA | enc+dec step MiB: packed / dense SDPA | scores+mask MiB per "
        "step: packed / dense |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in lengths:
        a = [get("attention", v, n) for v in VARIANTS]
        m = [get("model", v, n) for v in VARIANTS[:2]]
        times = " / ".join(f"{r['step_cpu_s']:.4f}" for r in a)
        mems = " / ".join(f"{r['step_mem_mib']:.0f}" for r in a)
        print(
            f"| {n} | {times} | {mems} "
            f"| {m[0]['step_cpu_s']:.3f} / {m[1]['step_cpu_s']:.3f} ({m[1]['step_cpu_s'] / m[0]['step_cpu_s']:.2f}×) "
            f"| {m[0]['step_s']:.3f} / {m[1]['step_s']:.3f} "
            f"| {m[0]['step_mem_mib']:.0f} / {m[1]['step_mem_mib']:.0f} "
            f"| {m[0]['attn_mib']:.1f} / {m[1]['attn_mib']:.1f} |"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    p.add_argument("--batch", type=int, default=2, help="instances per batch")
    add_shape_arguments(p, 0, "combined layers per stack (0 = group attention only: isolates its cost)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="runs/bench_group")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--what", choices=["attention", "model"], help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        print(json.dumps(one(args)))
        return 0
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for length in args.lengths:
        for what, variants in (("attention", VARIANTS), ("model", VARIANTS[:2])):
            for variant in variants:  # interleaved, so host noise hits all alike
                rows.append(_child(args, what, variant, length))
                print(json.dumps(rows[-1]), file=sys.stderr)
    write_json(os.path.join(args.out, "results.json"), {"args": vars(args), "rows": rows})
    _table(rows, args.lengths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
