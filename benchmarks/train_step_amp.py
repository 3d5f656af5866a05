#!/usr/bin/env python
"""Training-step time (forward + backward + Adam) of the benchmark shape, fp32 vs bf16 autocast.

  python benchmarks/train_step_amp.py [--len 15] [--batch-tokens 2048] [--steps 10]

Random sentence pairs, so it measures speed only (d_model 256, 3+3 layers, 4 heads, ff 1024,
8k vocabulary: the shape of benchmarks/transformer_vs_onmt.py).
"""
from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
import torch

from onmt_doc.config import config_from_dict
from onmt_doc.data.batching import collate
from onmt_doc.data.codec import Codec
from onmt_doc.data.instances import Example, mark_sentence
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import SPECIALS, Vocab
from onmt_doc.losses import build_losses
from onmt_doc.models.builder import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--len", type=int, default=15)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(8000)])
    sw = Subword("none", "none")
    cfg = config_from_dict({"model": {"d_model": 256, "encoder": {"layers": 3, "heads": 4, "ff": 1024},
                                      "decoder": {"layers": 3, "heads": 4, "ff": 1024}}})
    rng = np.random.default_rng(0)
    first = len(SPECIALS)
    n = args.batch_tokens // (args.len + 2)
    batch = collate([Example(mark_sentence(rng.integers(first, first + 8000, args.len)),
                             mark_sentence(rng.integers(first, first + 8000, args.len)), 0, 0, 1) for _ in range(n)])
    for amp in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build_model(cfg.model, Codec(sw, sw, vocab, vocab))
        loss_fn = build_losses(cfg.loss)[0]
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step() -> None:
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else contextlib.nullcontext()
            with ctx:
                loss, _ = loss_fn(model(batch), batch)
            loss.backward()
            opt.step()
            opt.zero_grad()

        for _ in range(3):
            step()
        start = time.time()
        for _ in range(args.steps):
            step()
        dt = (time.time() - start) / args.steps
        print(f"{amp}: {dt * 1000:.0f} ms/step, {batch.n_tgt_tokens / dt:.0f} target tokens/s", flush=True)


if __name__ == "__main__":
    main()
