#!/usr/bin/env python
"""Candidates for the MHPLSTM cell recurrence c_t = c_{t-1} ⊙ f_t + h_r,t (eq. 16): forward +
backward time on CPU at T = 32…256, and their exactness against a step-by-step loop.

  flock /tmp/onmt_bench.lock python benchmarks/hplstm_scan.py [--threads 2] [--repeats 15]

Shapes are those of the benchmark decoder layer: 4 heads of 64, a batch of ~2048 target tokens
(B = 2048 / T rows), i.e. [H, T, B·d] per tensor. Candidates are timed in rotation in one
process (median of the repeats) so that machine drift hits all of them alike. The module uses
the winner (``onmt_doc.modules.hplstm.linear_scan``); the others live here only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from onmt_doc.modules.hplstm import LinearScan, linear_scan, scan_backward_loop, scan_forward_loop

Scan = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def python_loop(f: torch.Tensor, hr: torch.Tensor) -> torch.Tensor:
    """Baseline: one autograd step per position."""
    c = torch.zeros_like(hr[:, 0])
    out = []
    for t in range(f.size(1)):
        c = c * f[:, t] + hr[:, t]
        out.append(c)
    return torch.stack(out, 1)


def doubling(f: torch.Tensor, hr: torch.Tensor) -> torch.Tensor:
    """Hillis–Steele parallel scan of the pairs (f, hr): log2(T) full-tensor rounds, O(T log T)."""
    a, b, d = f, hr, 1
    while d < f.size(1):
        b = torch.cat([b[:, :d], torch.addcmul(b[:, d:], a[:, d:], b[:, :-d])], 1)
        a = torch.cat([a[:, :d], a[:, d:] * a[:, :-d]], 1)
        d *= 2
    return b


def chunked(f: torch.Tensor, hr: torch.Tensor, size: int = 16) -> torch.Tensor:
    """Chunks of ``size``: a loop of ``size`` steps run in all chunks at once (local cells and
    running products of f), then a loop over chunks carrying the last cell, then one
    multiply-add; size + T/size Python steps instead of T."""
    g, t = f.shape[:2]
    pad = (-t) % size
    if pad:
        f = torch.cat([f, f.new_ones(g, pad, *f.shape[2:])], 1)
        hr = torch.cat([hr, hr.new_zeros(g, pad, *hr.shape[2:])], 1)
    k = f.size(1) // size
    fc = f.view(g, k, size, *f.shape[2:])
    hc = hr.view(g, k, size, *hr.shape[2:])
    c, p = torch.zeros_like(hc[:, :, 0]), torch.ones_like(fc[:, :, 0])
    local, prods = [], []
    for j in range(size):
        c = torch.addcmul(hc[:, :, j], c, fc[:, :, j])
        p = p * fc[:, :, j]
        local.append(c)
        prods.append(p)
    local_c, prod = torch.stack(local, 2), torch.stack(prods, 2)  # [G, K, size, ...]
    carry, ends = torch.zeros_like(local_c[:, 0, 0]), []
    for j in range(k):
        ends.append(carry)
        carry = torch.addcmul(local_c[:, j, -1], prod[:, j, -1], carry)
    carry_in = torch.stack(ends, 1).unsqueeze(2)  # cell before each chunk
    return torch.addcmul(local_c, prod, carry_in).view(g, k * size, *hr.shape[2:])[:, :t]


class PythonLoopScan(LinearScan):
    """The kept scan's hand-written backward, with its loops left to the Python interpreter."""

    kernels = (scan_forward_loop, scan_backward_loop)


CANDIDATES: dict[str, Scan] = {
    "python loop (autograd)": python_loop,
    "doubling (Hillis-Steele)": doubling,
    "chunked (16)": chunked,
    "python loop + hand backward": lambda f, hr: PythonLoopScan.apply(f, hr, torch.zeros_like(hr[:, 0])),
    "TorchScript loop + hand backward (kept)": lambda f, hr: linear_scan(f, hr),
}


def inputs(
    t: int, tokens: int, heads: int = 4, d_head: int = 64, gate_bias: float = 0.0, dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(t)
    n = max(tokens // t, 1) * d_head
    f = torch.sigmoid(torch.randn(heads, t, n, generator=g, dtype=dtype) + gate_bias)
    hr = torch.randn(heads, t, n, generator=g, dtype=dtype)
    return f.requires_grad_(), hr.requires_grad_()


def fwd_bwd(scan: Scan, f: torch.Tensor, hr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    f.grad = hr.grad = None
    c = scan(f, hr)
    (c * torch.linspace(-1, 1, c.size(1)).view(1, -1, 1)).sum().backward()
    return c.detach(), f.grad.clone(), hr.grad.clone()


def max_error(scan: Scan, t: int, gate_bias: float) -> float:
    """Largest difference to the float64 step-by-step loop, relative to the largest reference
    value (c, dL/df and dL/dh_r each; with f ≈ 1 the cells grow like a random walk)."""
    f, hr = inputs(t, 512, gate_bias=gate_bias)
    got = fwd_bwd(scan, f, hr)
    f64, hr64 = (x.detach().double().requires_grad_() for x in (f, hr))
    ref = fwd_bwd(python_loop, f64, hr64)
    return max(float((a.double() - b).abs().max() / b.abs().max()) for a, b in zip(got, ref))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--lengths", default="32,64,128,256")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"torch {torch.__version__}, {args.threads} threads, ~{args.tokens} tokens per batch, 4 heads × 64")
    print(
        "\nexactness: max |difference| / max |value| against a float64 step-by-step loop (c, dL/df, dL/dh_r), T = 256"
    )
    for name, scan in CANDIDATES.items():
        errs = [max_error(scan, 256, bias) for bias in (0.0, -8.0, 8.0)]
        print(f"  {name:40s} f≈0.5: {errs[0]:.1e}   f≈3e-4: {errs[1]:.1e}   f≈0.9997: {errs[2]:.1e}")
    print("\nforward + backward, ms (median of %d, candidates in rotation)" % args.repeats)
    print("| candidate | " + " | ".join(f"T={t}" for t in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    times = {name: {t: [] for t in lengths} for name in CANDIDATES}
    for t in lengths:
        f, hr = inputs(t, args.tokens)
        for scan in CANDIDATES.values():
            fwd_bwd(scan, f, hr)  # warm-up (TorchScript)
        for _ in range(args.repeats):
            for name, scan in CANDIDATES.items():
                start = time.perf_counter()
                fwd_bwd(scan, f, hr)
                times[name][t].append(time.perf_counter() - start)
    for name in CANDIDATES:
        print(f"| {name} | " + " | ".join(f"{1000 * statistics.median(times[name][t]):.2f}" for t in lengths) + " |")


if __name__ == "__main__":
    main()
