"""``decode_vs_ctranslate2``: beam search of the sentence Transformer through onmt_doc's own search and
through its CTranslate2 export, on the same device, through the same API (``Translator.load`` with
``engine: torch`` or ``engine: ctranslate2``), the same sources, batches, beam and length caps
(issue 40: onmt_doc ≥ 0.5× CTranslate2 fp16 on a GPU).

The model has random weights at Transformer-base shape over placeholder words (speed only), its
``</s>`` and ``<eos>`` output biases lowered so that every hypothesis runs to its length cap on both
engines: both decode the same number of steps, which each row reports (``out_tokens_per_sent``). Each
translator runs in a process of its own (a fresh CUDA context, and the library path CTranslate2 needs):
CTranslate2's wheels link cuBLAS 12, and a CUDA 13 machine has cuBLAS 13 only; where loading fails on
it, the worker runs again with ``libcublas.so.13`` linked under the 12 name (the 2026-11-27 probe: it
then translates), and the row says so (``cuda_libs``)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

from benchmarks.stages.speed import ModelSpeedParams, build, placeholder_codec, shift_ends
from benchmarks.suite.stage import StageContext, stage
from benchmarks.suite.system import REPO
from benchmarks.suite.text_files import read_lines, write_lines

WORKER = "benchmarks.peers.gpu_decoding"


@dataclass
class DecodeVsCt2Params:
    d_model: int = 512
    layers: int = 6
    heads: int = 8
    ff: int = 2048
    vocab: int = 16000  # placeholder words, shared by source and target
    sentences: int = 512
    words: int = 25  # every source sentence this long: one length cap, the same steps on both engines
    batch: int = 64  # sentences per translation batch
    beam: int = 4
    torch_dtypes: list = field(default_factory=lambda: ["float16", "bfloat16"])  # onmt_doc's Translator dtype
    ct2_dtypes: list = field(default_factory=lambda: ["float16", "bfloat16"])  # CTranslate2's, by the same option
    # extra onmt_doc runs at the first torch dtype with these translate.read_every values (the rows above
    # use the default: 8 steps between the search's device reads on a GPU); 1 = read every step
    read_every: list = field(default_factory=lambda: [1])
    compiled: bool = True  # and one at the first torch dtype with translate.compile: on (torch.compile's step)
    rounds: int = 3  # timed passes per translator (the best is kept), after one warm-up pass
    seed: int = 1


@stage("decode_vs_ctranslate2", DecodeVsCt2Params)
def decode_vs_ctranslate2(p: DecodeVsCt2Params, ctx: StageContext) -> None:
    """One ``translate`` row per (engine, dtype), then each onmt_doc dtype's ratio to CTranslate2 fp16."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        ctx.record(skipped="ctranslate2 is not installed: pip install -e '.[export]' (the GPU run carries its wheel)")
        return
    ckpt, export_dir = write_model(p, ctx)
    sources = os.path.join(ctx.work_dir(), "sources.txt")
    write_sources(p, sources)
    rates: dict[str, float] = {}
    outputs: dict[str, str] = {}
    # the engines of one dtype one after the other, the first dtypes first: a stage cut short by its
    # budget still has a pair to compare
    runs = [(e, d, {}) for d in dict.fromkeys(p.torch_dtypes + p.ct2_dtypes) for e, ds in
            (("torch", p.torch_dtypes), ("ctranslate2", p.ct2_dtypes)) if d in ds]  # fmt: skip
    if p.torch_dtypes:  # onmt_doc's search options against its defaults, at the first dtype
        runs += [("torch", p.torch_dtypes[0], {"read_every": k}) for k in p.read_every]
        runs += [("torch", p.torch_dtypes[0], {"compile": "on"})] if p.compiled else []
    for i, (engine, dtype, options) in enumerate(runs):
        extra = "".join(f" {k} {v}" for k, v in options.items())
        name = f"{'onmt_doc' if engine == 'torch' else 'CTranslate2'} {dtype}{extra}"
        hyp = os.path.join(ctx.work_dir(), f"{name.replace(' ', '_')}.hyp")
        share = ctx.seconds_left() / (len(runs) - i)  # of the time left, so a slow one cannot take it all
        model = ckpt if engine == "torch" else export_dir
        row = run_worker(p, ctx, engine, model, dtype, sources, hyp, share, options)
        if "sent_per_s" in row:
            rates[name], outputs[name] = row["sent_per_s"], hyp
            twin = outputs.get(f"onmt_doc {dtype}")
            if engine == "ctranslate2" and twin:
                row["identical_to_onmt_doc"] = identical(hyp, twin)
        ctx.record(what="translate", translator=name, device=ctx.device, **row)
    anchors = [k for k in ("CTranslate2 float16", *rates) if k in rates and k.startswith("CTranslate2")]
    for name, rate in rates.items():
        if anchors and name.startswith("onmt_doc"):
            ctx.record(what="ratio", translator=name, anchor=anchors[0], vs_ctranslate2=rate / rates[anchors[0]])


def write_model(p: DecodeVsCt2Params, ctx: StageContext) -> tuple[str, str]:
    """The random Transformer as an onmt_doc checkpoint (ends lowered: outputs run to the cap) and its
    CTranslate2 export (float32 weights; each translator converts to its dtype when loading)."""

    from benchmarks.peers.export import export
    from onmt_doc.config.loading import config_to_dict
    from onmt_doc.models.checkpoint import save_checkpoint

    shape = ModelSpeedParams(models=["transformer"], d_model=p.d_model, layers=p.layers, heads=p.heads, ff=p.ff,
                             vocab=p.vocab, seed=p.seed)  # fmt: skip
    codec = placeholder_codec(p.vocab)
    model, cfg = build("transformer", shape, codec)
    shift_ends(model)
    ckpt = os.path.join(ctx.work_dir(), "model.pt")
    save_checkpoint(
        {"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict(), "step": 0}, ckpt
    )
    export_dir, info = export(ckpt, os.path.join(ctx.work_dir(), "ct2"), None)
    ctx.log(f"exported to CTranslate2 in {info['export_s']:.1f} s")
    return ckpt, export_dir


def write_sources(p: DecodeVsCt2Params, path: str) -> None:
    """``sentences`` lines of ``words`` random placeholder words (the codec's words ``w0`` … ``wN``)."""
    import random

    rng = random.Random(p.seed)
    write_lines(path, [" ".join(f"w{rng.randrange(p.vocab)}" for _ in range(p.words)) for _ in range(p.sentences)])


def identical(a: str, b: str) -> int:
    """Lines the two files share, position by position."""
    return sum(x == y for x, y in zip(read_lines(a), read_lines(b)))


def run_worker(
    p: DecodeVsCt2Params,
    ctx: StageContext,
    engine: str,
    model: str,
    dtype: str,
    src: str,
    hyp: str,
    seconds: float,
    options: Optional[dict] = None,
) -> dict:
    """One translator in its own process (:func:`main`) within ``seconds``; for CTranslate2 on CUDA a
    second try with cuBLAS 13 linked under the names its wheel asks for, where the first fails on them.
    ``options``: more ``translate`` options for onmt_doc's translator (``read_every``, ``compile``)."""
    t0 = time.time()
    args = {"engine": engine, "model": model, "dtype": dtype, "device": ctx.device, "src": src, "hyp": hyp,
            "beam": p.beam, "batch": p.batch, "rounds": p.rounds, "options": options or {}}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    row = _worker(args, env, seconds)
    if engine == "ctranslate2" and "libcublas" in row.get("error", ""):
        links = cublas_links(tempfile.mkdtemp(prefix="cublas12_", dir=ctx.work_dir()))
        if links:
            env["LD_LIBRARY_PATH"] = links + os.pathsep + env.get("LD_LIBRARY_PATH", "")
            first = row["error"]
            row = _worker(args, env, seconds - (time.time() - t0))
            row["cuda_libs"] = f"cuBLAS 13 linked as 12 (plain load: {first})"
    return row


def _worker(args: dict, env: dict, seconds: float) -> dict:
    seconds = max(seconds - 2, 10)
    try:
        done = subprocess.run([sys.executable, "-m", WORKER, json.dumps(args)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=seconds)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within its {seconds:.0f} s (its share of the stage's time)"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:300]}
    return json.loads(lines[-1])


def cublas_links(folder: str, roots: Optional[list[str]] = None) -> Optional[str]:
    """``folder`` holding ``libcublas.so.12`` and ``libcublasLt.so.12`` linked to the newest cuBLAS found
    under ``roots`` (glob patterns; default CUDA's folders and the nvidia wheels beside torch), or None
    where there is none."""
    if roots is None:
        import torch

        site = os.path.dirname(os.path.dirname(torch.__file__))
        roots = ["/usr/local/cuda*/lib64", "/usr/local/cuda*/targets/*/lib", "/usr/lib/x86_64-linux-gnu",
                 os.path.join(site, "nvidia", "*", "lib"), os.path.join(site, "nvidia", "*", "*", "lib")]  # fmt: skip
    made = False
    for name in ("libcublas", "libcublasLt"):
        found = sorted(f for root in roots for f in glob.glob(os.path.join(root, f"{name}.so.1[3-9]*")))
        if found:
            os.symlink(found[-1], os.path.join(folder, f"{name}.so.12"))
            made = True
    return folder if made else None


def main(args: dict) -> dict:
    """The worker: load the translator, one warm-up pass, ``rounds`` timed passes over the sources."""
    import torch

    from onmt_doc import Translator

    device = torch.device(args["device"])
    with open(args["src"], encoding="utf-8") as f:
        docs = [[line.rstrip("\n")] for line in f]
    options = {"dtype": args["dtype"], "beam": args["beam"], "batch_sentences": args["batch"], "batch_tokens": 10**6,
               **args["options"]}  # fmt: skip
    tr = Translator.load(args["model"], device, engine=args["engine"], max_len_ratio=1.0, max_len_add=0, **options)
    out = tr.translate(docs[: args["batch"]])  # warm-up: CUDA context, kernels, allocator
    best = float("inf")
    for _ in range(args["rounds"]):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = tr.translate(docs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    with open(args["hyp"], "w", encoding="utf-8") as f:
        f.writelines(doc[0] + "\n" for doc in out)
    words = sum(len(doc[0].split()) for doc in out)
    return {"sentences": len(docs), "seconds": best, "sent_per_s": len(docs) / best,
            "out_tokens_per_sent": words / len(docs)}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
