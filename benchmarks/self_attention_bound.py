#!/usr/bin/env python
"""How much faster can a Transformer get by replacing its decoder self-attention? An upper bound.

  python benchmarks/self_attention_bound.py [--rounds 5] [--steps 18,128]

The MHPLSTM paper's goals (decoding ≥ 1.7×, training ≥ 1.1× the Transformer decoder) are claims
about one sublayer: MHPLSTM replaces the decoder self-attention and keeps everything else
(encoder, cross-attention, FFN, generator, beam search). However cheap the replacement, the
speed-up is capped by the share of time the self-attention takes (Amdahl). This script measures
that cap directly: the benchmark Transformer (d_model 256, 3+3 layers, 4 heads, ff 1024, 8k
vocabulary) against the same model with the decoder self-attention sublayer *removed* (a free
replacement), and the MHPLSTM decoder of the same shape, alternated round by round:

- training: forward + backward + Adam on one random batch of Multi30k-like lengths (~2260 tokens);
- decoding: a 4-beam decode of 32 sentences (14 source subwords) forced to run N steps (the
  generator, top-k and beam reordering of every step, as in beam search); N = 18 is the mean
  Multi30k output length in onmt_doc tokens, 128 a long output.

Random weights: only speed is measured (forced decoding runs the same steps whatever the model
predicts).
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import torch
from synthetic import BENCHMARK_SHAPE, benchmark_codec, forced_long_decode, random_batch

from onmt_doc.config import config_from_dict
from onmt_doc.losses import build_losses
from onmt_doc.models.builder import build_model
from onmt_doc.optim.optimizers import build_optimizer


def without_self_attention(model):
    """The decoder layers skip their self-attention sublayer (its residual adds nothing)."""
    for layer in model.decoder.layers:

        def forward(self, x, memory_kv, memory_mask, context=None):
            x = self.cross_res(x, lambda h: self.source_attention(h, memory_kv, memory_mask, context))
            return self.ff_res(x, self.ff)

        def step(self, x, cache, memory_kv, memory_mask, context=None):
            return forward(self, x, memory_kv, memory_mask, context), cache

        layer.forward = types.MethodType(forward, layer)
        layer.step = types.MethodType(step, layer)
    return model


def build(decoder: dict, codec):
    """The benchmark shape with ``decoder``, seeded weights, and its config (for the optimizer)."""
    torch.manual_seed(0)
    cfg = config_from_dict(
        {"model": {**BENCHMARK_SHAPE, "decoder": decoder}, "optim": {"betas": [0.9, 0.998], "eps": 1e-8}}
    )
    return build_model(cfg.model, codec), cfg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--train-steps", type=int, default=3, help="training steps per variant and round")
    p.add_argument("--steps", default="18,128", help="forced decoding lengths")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    codec = benchmark_codec()
    shape = BENCHMARK_SHAPE["decoder"]
    variants = {}
    for name, decoder, strip in (
        ("transformer", shape, False),
        ("no self-attention", shape, True),
        ("mhplstm", {**shape, "type": "mhplstm"}, False),
    ):
        model, cfg = build(decoder, codec)
        variants[name] = (without_self_attention(model) if strip else model, cfg)
    batch = random_batch(2262)
    src = random_batch(2262, lengths=(14, 15), seed=1)
    src.src, src.src_groups = src.src[:32], src.src_groups[:32]
    decode_batch = type(src)(src=src.src, src_groups=src.src_groups)

    train_s = {name: [] for name in variants}
    decode_s = {(name, n): [] for name in variants for n in map(int, args.steps.split(","))}
    loss_fn = build_losses(next(iter(variants.values()))[1].loss)[0]
    opts = {name: build_optimizer(cfg.optim, [{"params": m.parameters()}]) for name, (m, cfg) in variants.items()}
    for r in range(args.rounds + 1):  # round 0: warm-up
        for name, (model, _) in variants.items():
            model.train()
            start = time.perf_counter()
            for _ in range(args.train_steps):
                loss, _ = loss_fn(model(batch), batch)
                loss.backward()
                opts[name].step()
                opts[name].zero_grad()
            if r:
                train_s[name].append((time.perf_counter() - start) / args.train_steps)
            model.eval()
            for vname, n in decode_s:
                if vname == name:
                    start = time.perf_counter()
                    forced_long_decode(model, decode_batch, n)
                    if r:
                        decode_s[(name, n)].append(time.perf_counter() - start)

    def ratio(times: list[float], base: list[float]) -> float:
        return statistics.median(b / t for b, t in zip(base, times))

    print(
        f"training: {batch.size} pairs, {batch.n_tgt_tokens} target tokens per step; decoding: 32 sentences × "
        f"beam 4; {args.rounds} rounds; speed relative to the Transformer (median of per-round ratios)"
    )
    base = train_s["transformer"]
    for name, ts in train_s.items():
        print(f"  training   {name:18s} {statistics.median(ts) * 1000:7.1f} ms/step   {ratio(ts, base):.2f}×")
    for (name, n), ts in decode_s.items():
        base = decode_s[("transformer", n)]
        print(f"  decode {n:3d}  {name:18s} {statistics.median(ts) * 1000 / n:7.2f} ms/step   {ratio(ts, base):.2f}×")


if __name__ == "__main__":
    main()
