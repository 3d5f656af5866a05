"""``micro``: small timings that need no model-level machinery, chosen by ``what``; candidates run in
rotation in one process (:func:`benchmarks.stages.speed.rotate`), so drift hits all alike.

- ``hplstm_scan``: the candidates for the MHPLSTM cell recurrence ``c_t = c_{t-1} ⊙ f_t + h_r,t``
  (eq. 16), forward + backward, and their exactness against a float64 loop with forget gates ≈ 0.5,
  ≈ 3e-4 and ≈ 0.9997 (relative to the largest value: with f ≈ 1 the cells grow like a random walk).
  The library keeps two, one per kernel path (a TorchScript loop on CPUs, recursive doubling on GPUs),
  both with the hand-written backward; the others live here only. On any device.
- ``translate_dtype``: float32 vs bfloat16 weights through the library's ``Translator``; without a
  ``checkpoint`` a random-weight Transformer (speed only) with outputs forced to the source length.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from benchmarks.stages.speed import ModelSpeedParams, build, placeholder_codec, rotate, shift_ends
from benchmarks.suite.stage import StageContext, stage


@dataclass
class MicroParams:
    what: str  # hplstm_scan | translate_dtype
    repeats: int = 9  # hplstm_scan: timed passes per candidate and length (median)
    lengths: list = field(default_factory=lambda: [32, 64, 128, 256])  # hplstm_scan: T
    tokens: int = 2048  # hplstm_scan: tokens per batch (rows = tokens / T)
    heads: int = 4
    d_head: int = 64
    exact_length: int = 256  # hplstm_scan: T of the exactness check (0: none)
    checkpoint: str = ""  # translate_dtype: relative to the repository; empty: random weights
    src: str = "multi30k-en-de/test2016.en"  # translate_dtype: under the data folder
    ref: str = "multi30k-en-de/test2016.de"
    sentences: int = 0  # translate_dtype: the first N lines (0: all)
    beam: int = 4
    batch_sentences: int = 32
    rounds: int = 2
    shape: dict = field(default_factory=dict)  # translate_dtype without a checkpoint: ModelSpeedParams keys


@stage("micro", MicroParams)
def micro(p: MicroParams, ctx: StageContext) -> None:
    """Dispatch on ``what``; see the module docstring."""
    kinds: dict[str, Callable] = {"hplstm_scan": hplstm_scan, "translate_dtype": translate_dtype}
    if p.what not in kinds:
        raise ValueError(f"unknown what {p.what!r}; known: {', '.join(kinds)}")
    import torch

    ctx.record(what="setup", micro=p.what, device=ctx.device, threads=torch.get_num_threads(), torch=torch.__version__)
    kinds[p.what](p, ctx)


# ----------------------------------------------------------------------------- hplstm_scan


def python_loop(f, hr):
    """Baseline: one autograd step per position."""
    import torch

    c, out = torch.zeros_like(hr[:, 0]), []
    for t in range(f.size(1)):
        c = c * f[:, t] + hr[:, t]
        out.append(c)
    return torch.stack(out, 1)


def doubling(f, hr):
    """Hillis–Steele parallel scan of the pairs (f, hr): log2(T) full-tensor rounds, O(T log T)."""
    import torch

    a, b, d = f, hr, 1
    while d < f.size(1):
        b = torch.cat([b[:, :d], torch.addcmul(b[:, d:], a[:, d:], b[:, :-d])], 1)
        a = torch.cat([a[:, :d], a[:, d:] * a[:, :-d]], 1)
        d *= 2
    return b


def chunked(f, hr, size: int = 16):
    """A ``size``-step loop run in all chunks at once (local cells, running products of f), a carry
    loop over chunks, one multiply-add: size + T/size Python steps instead of T."""
    import torch

    g, t = f.shape[:2]
    pad = (-t) % size
    f = torch.cat([f, f.new_ones(g, pad, *f.shape[2:])], 1)
    hr = torch.cat([hr, hr.new_zeros(g, pad, *hr.shape[2:])], 1)
    k = f.size(1) // size
    fc, hc = f.view(g, k, size, *f.shape[2:]), hr.view(g, k, size, *hr.shape[2:])
    c, prod, local, prods = torch.zeros_like(hc[:, :, 0]), torch.ones_like(fc[:, :, 0]), [], []
    for j in range(size):
        c = torch.addcmul(hc[:, :, j], c, fc[:, :, j])
        prod = prod * fc[:, :, j]
        local.append(c)
        prods.append(prod)
    local_c, prod_c = torch.stack(local, 2), torch.stack(prods, 2)
    carry, ends = torch.zeros_like(local_c[:, 0, 0]), []
    for j in range(k):
        ends.append(carry)
        carry = torch.addcmul(local_c[:, j, -1], prod_c[:, j, -1], carry)
    out = torch.addcmul(local_c, prod_c, torch.stack(ends, 1).unsqueeze(2))
    return out.view(g, k * size, *hr.shape[2:])[:, :t]


def scan_candidates() -> dict[str, Callable]:
    """Every candidate; the last two are the library's (the CPU's kernel path last)."""
    import torch

    from onmt_doc import devices
    from onmt_doc.modules.hplstm import cell_gradients, linear_scan, scan_backward_loop, scan_forward_loop

    class PythonLoopScan(torch.autograd.Function):  # the kept hand-written backward, loops left to the interpreter
        @staticmethod
        def forward(ctx, f, hr, c0):
            c = scan_forward_loop(f, hr, c0)
            ctx.save_for_backward(f, c, c0)
            return c

        @staticmethod
        def backward(ctx, grad):
            f, c, c0 = ctx.saved_tensors
            return cell_gradients(f, c, c0, scan_backward_loop(f, grad.contiguous()))

    def on_path(path: str) -> Callable:
        def scan(f, hr):
            with devices.forced_path(path):
                return linear_scan(f, hr)

        return scan

    return {
        "python loop (autograd)": python_loop,
        "doubling (Hillis-Steele)": doubling,
        "chunked (16)": chunked,
        "python loop + hand backward": lambda f, hr: PythonLoopScan.apply(f, hr, torch.zeros_like(hr[:, 0])),
        "doubling + hand backward (kept: the fused path, GPUs)": on_path("fused"),
        "TorchScript loop + hand backward (kept: the packed path, CPUs)": on_path("packed"),
    }


def scan_inputs(t: int, p: MicroParams, gate_bias: float = 0.0, tokens: int = 0, device: str = "cpu"):
    """(f, h_r) [heads, T, rows · d_head], drawn on the CPU (the same values on every device)."""
    import torch

    g = torch.Generator().manual_seed(t)
    n = max((tokens or p.tokens) // t, 1) * p.d_head
    f = torch.sigmoid(torch.randn(p.heads, t, n, generator=g) + gate_bias)
    hr = torch.randn(p.heads, t, n, generator=g)
    return f.to(device).requires_grad_(), hr.to(device).requires_grad_()


def scan_fwd_bwd(scan: Callable, f, hr) -> tuple:
    import torch

    f.grad = hr.grad = None
    c = scan(f, hr)
    (c * torch.linspace(-1, 1, c.size(1), dtype=c.dtype, device=c.device).view(1, -1, 1)).sum().backward()
    return c.detach(), f.grad.clone(), hr.grad.clone()


def scan_error(scan: Callable, p: MicroParams, gate_bias: float, device: str) -> float:
    """Largest difference to the float64 loop on the CPU relative to the largest reference value (with
    f ≈ 1 the cells grow like a random walk, so absolute errors would mislead)."""
    f, hr = scan_inputs(p.exact_length, p, gate_bias, tokens=512, device=device)
    got = scan_fwd_bwd(scan, f, hr)
    ref = scan_fwd_bwd(python_loop, *(x.detach().cpu().double().requires_grad_() for x in (f, hr)))
    return max(float((a.cpu().double() - b).abs().max() / b.abs().max()) for a, b in zip(got, ref))


def hplstm_scan(p: MicroParams, ctx: StageContext) -> None:
    """Exactness records (``what: exactness``), then one ``what: scan`` record per candidate with
    ``ms_T<T>`` for each length, after a ``what: scan_length`` record per length as it is timed."""
    candidates = scan_candidates()
    if p.exact_length:
        for name, scan in candidates.items():
            errs = [scan_error(scan, p, bias, ctx.device) for bias in (0.0, -8.0, 8.0)]
            ctx.record(
                what="exactness", candidate=name, T=p.exact_length, f_half=errs[0], f_3e_4=errs[1], f_near_1=errs[2]
            )
    ms: dict[str, dict[str, float]] = {name: {} for name in candidates}
    for t in p.lengths:
        f, hr = scan_inputs(t, p, device=ctx.device)
        fns = {name: (lambda s=scan: scan_fwd_bwd(s, f, hr)) for name, scan in candidates.items()}
        for fn in fns.values():
            fn()  # warm-up (TorchScript compiles on first call)
        times = rotate(fns, p.repeats, ctx.device)
        for name, ts in times.items():
            ms[name][f"ms_T{t}"] = 1e3 * statistics.median(wall for wall, _ in ts)
        ctx.record(what="scan_length", T=t, rows=f.size(2) // p.d_head, **{n: ms[n][f"ms_T{t}"] for n in ms})
    for name, row in ms.items():
        ctx.record(what="scan", candidate=name, **row)


# ----------------------------------------------------------------------------- translate_dtype


def translate_dtype(p: MicroParams, ctx: StageContext) -> None:
    """Per round and dtype a ``what: translate_round`` record; then per dtype a ``what:
    translate_dtype`` record (median sentences/s, speed vs float32, BLEU)."""
    import torch

    from onmt_doc.evaluation.corpus_metrics import s_bleu
    from onmt_doc.translate.translator import Translator, translator_options

    src = read_lines(os.path.join(ctx.data, p.src), p.sentences)
    model, cfg, codec, src, forced = translation_model(p, ctx, src)
    ref = read_lines(os.path.join(ctx.data, p.ref), p.sentences) if not forced else None
    extra = {"max_len_ratio": 1.0, "max_len_add": 0} if forced else {}
    models = {"float32": model, "bfloat16": copy.deepcopy(model).to(torch.bfloat16)}
    docs = [[s] for s in src]
    out: dict[str, list] = {}
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for r in range(p.rounds):
        for name, m in models.items():
            opts = translator_options(
                cfg.translate, beam=p.beam, batch_sentences=p.batch_sentences, dtype=name, **extra
            )
            translator = Translator(m, codec, cfg, opts)
            t0 = time.perf_counter()
            out[name] = translator.translate_documents(docs)
            seconds[name].append(time.perf_counter() - t0)
            ctx.record(what="translate_round", round=r + 1, dtype=name, sent_per_s=len(docs) / seconds[name][-1])
    base = len(docs) / statistics.median(seconds["float32"])
    for name, ts in seconds.items():
        speed = len(docs) / statistics.median(ts)
        bleu = s_bleu([d[0] for d in out[name]], ref) if ref else None
        weights = "random" if forced else p.checkpoint
        ctx.record(what="translate_dtype", dtype=name, sentences=len(docs), beam=p.beam, sent_per_s=speed,
                   speedup=speed / base, rounds=[len(docs) / s for s in ts], bleu=bleu, weights=weights)  # fmt: skip


def read_lines(path: str, limit: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return lines[:limit] if limit else lines


def translation_model(p: MicroParams, ctx: StageContext, src: list[str]) -> tuple[Any, Any, Any, list[str], bool]:
    """(model, config, codec, source lines, forced): the checkpoint's, or a random-weight Transformer
    whose sources are placeholder words with the real lines' lengths and whose ``</s>``/``<eos>``
    biases are lowered so every output runs to its cap (random weights would stop anywhere)."""
    import numpy as np
    import torch

    if p.checkpoint:
        from onmt_doc.models.checkpoint import load_model

        model, cfg, codec = load_model(os.path.join(ctx.repo, p.checkpoint), torch.device(ctx.device))
        return model, cfg, codec, src, False
    shape = ModelSpeedParams(**p.shape)
    codec = placeholder_codec(shape.vocab)
    model, cfg = build("transformer", shape, codec)
    model = model.to(ctx.device).eval()
    shift_ends(model)
    rng = np.random.default_rng(shape.seed)
    src = [" ".join(f"w{i}" for i in rng.integers(0, shape.vocab, max(len(s.split()), 1))) for s in src]
    return model, cfg, codec, src, True
