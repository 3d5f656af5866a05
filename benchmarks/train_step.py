#!/usr/bin/env python
"""Training-step time (forward + backward + optimizer) of the benchmark shape, variants alternated.

  python benchmarks/train_step.py [--variants fp32,bf16,unfused] [--rounds 6] [--steps 3]

Variants:
  fp32     the defaults: float32, fused label-smoothed CE, torch's fused Adam (where torch has it)
  bf16     the same under bfloat16 autocast (``train.amp: bf16``)
  unfused  float32 with the textbook loss (log_softmax, gather, sum through autograd) and Adam's
           per-parameter loop: what the defaults replaced

Random sentence pairs of 8–19 subwords, about 2260 batch tokens, so it measures speed only
(d_model 256, 3+3 layers, 4 heads, ff 1024, 8k vocabulary: the shape of
benchmarks/transformer_vs_onmt.py). Each round times ``--steps`` steps of every variant in turn,
so a drifting machine affects all of them alike; the report gives medians and the median of the
per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Callable

import torch
from synthetic import BENCHMARK_SHAPE, benchmark_codec, random_batch

from onmt_doc.config import config_from_dict
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.losses import build_losses
from onmt_doc.models.builder import build_model
from onmt_doc.optim.optimizers import build_optimizer


def textbook_loss(out, batch, eps: float = 0.1):
    """Label-smoothed CE through the generic autograd graph (the pre-fusion implementation)."""
    lprobs = torch.log_softmax(out.logits.float(), dim=-1)
    target_lp = lprobs.gather(1, out.target[:, None]).squeeze(1)
    smooth = -(lprobs.sum(-1) - lprobs[:, PAD_ID]) / (lprobs.size(1) - 1)
    loss = ((1 - eps) * -target_lp + eps * smooth).sum()
    correct = (target_lp >= lprobs.amax(-1)).sum()
    return loss, {"nll": float(-target_lp.detach().sum()), "correct": correct.item()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="fp32,bf16,unfused")
    p.add_argument("--batch-tokens", type=int, default=2262)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=3, help="steps per variant and round")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    codec = benchmark_codec()
    cfg = config_from_dict({"model": BENCHMARK_SHAPE, "optim": {"betas": [0.9, 0.998], "eps": 1e-8}})
    batch = random_batch(args.batch_tokens)

    steps: dict[str, Callable[[], None]] = {}
    for name in args.variants.split(","):
        torch.manual_seed(0)
        model = build_model(cfg.model, codec)
        model.train()
        if name == "unfused":
            loss_fn = textbook_loss
            opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.998), eps=1e-8)
        elif name in ("fp32", "bf16"):
            loss_fn = build_losses(cfg.loss)[0]
            opt = build_optimizer(cfg.optim, [{"params": model.parameters()}])
        else:
            raise SystemExit(f"unknown variant {name!r} (fp32, bf16, unfused)")
        amp = name == "bf16"

        def step(model=model, loss_fn=loss_fn, opt=opt, amp=amp) -> None:
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
            with ctx:
                loss, _ = loss_fn(model(batch), batch)
            loss.backward()
            opt.step()
            opt.zero_grad()

        steps[name] = step
        for _ in range(2):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append((time.perf_counter() - start) / args.steps)
    print(
        f"{batch.size} sentence pairs, {batch.n_tgt_tokens} target tokens per step; "
        f"{args.rounds} rounds of {args.steps} steps per variant"
    )
    base = next(iter(times))
    for name, ts in times.items():
        ratio = statistics.median(a / b for a, b in zip(times[base], ts))
        print(
            f"{name:8s} {statistics.median(ts) * 1000:6.0f} ms/step (rounds: "
            f"{', '.join(f'{t * 1000:.0f}' for t in ts)}), {batch.n_tgt_tokens / statistics.median(ts):6.0f} "
            f"target tokens/s, speed vs {base}: {ratio:.2f}×",
            flush=True,
        )


if __name__ == "__main__":
    main()
