"""``step_ops``: what one training step of every model dispatches, the CPU proxy of a GPU step's cost
(issue 40). On a GPU a step of these models is bound by how many kernels the host launches and how
often it waits for the device; both follow from the operators a step dispatches, which any CPU can
count. Per model and kernel path (``packed``: the CPU's; ``fused``: the GPU's, run here on the CPU):
ATen operators per step (forward, loss, backward, Adam) and the host synchronisations among them
(``onmt_doc.train.host_syncs``). On CUDA the same step is also profiled: kernel launches and the
synchronisations torch's sync debug mode reports. On the fused path also the graphs ``torch.compile``
cuts the forward into (``train.compile``). Random weights at one shape, as ``model_speed``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from benchmarks.stages.speed import ModelSpeedParams, SpeedData, _step_fn, build
from benchmarks.suite.stage import StageContext, stage


@dataclass
class StepOpsParams:
    models: list = field(default_factory=lambda: ["transformer", "g_transformer", "hm_gdc", "mhplstm"])
    paths: list = field(default_factory=lambda: ["packed", "fused"])
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    ff: int = 128
    vocab: int = 1000
    batch_tokens: int = 2048
    amp: str = "fp32"  # bf16 on CUDA (the flash kernel's types)
    decode_sentences: int = 16  # beam search over this many random sentences (whole documents); 0: none
    beam: int = 4


@stage("step_ops", StepOpsParams)
def step_ops(p: StepOpsParams, ctx: StageContext) -> None:
    """One record per (model, path): operators and host syncs per step; on CUDA, launches and syncs."""
    import torch

    from onmt_doc import devices

    forced_path = getattr(devices, "forced_path", None)  # None: a library from before the fused path
    from onmt_doc.train.host_syncs import OpCounter

    shape = ModelSpeedParams(models=p.models, d_model=p.d_model, layers=p.layers, heads=p.heads, ff=p.ff,
                             vocab=p.vocab, batch_tokens=p.batch_tokens, warmup_steps=1, train_steps=1,
                             decode_sentences=p.decode_sentences)  # fmt: skip
    data = SpeedData(shape, ctx)
    for name in p.models:
        model, cfg = build(name, shape, data.codec)
        model = model.to(ctx.device).train()
        batches = data.batches(model.unit)
        step = _step_fn(model, cfg, ctx.device, p.amp)
        for path in p.paths if forced_path else ["packed"]:
            forced = forced_path(path) if forced_path else _nothing()
            with forced:
                step(batches[0])  # lazy state (optimizer) outside the count
                with OpCounter() as ops:
                    step(batches[1])
                row = {"model": name, "path": path, "ops_per_step": ops.total, "host_syncs": ops.syncs,
                       "sync_ops": dict(ops.sync_ops), "target_tokens": batches[1].n_tgt_tokens}  # fmt: skip
                if path == "fused":  # the batch as the trainer hands it over: its host plans made
                    prepare = getattr(model, "prepare", None)  # None: a library from before them
                    batch = prepare(batches[1], torch.device(ctx.device)) if prepare else batches[1]
                    row["compiled_graphs"] = _compiled_graphs(model, batch)
                if p.decode_sentences:
                    row.update(_decode_counts(model, data, p, OpCounter))
                    model.train()
                if ctx.device == "cuda":
                    row.update(_cuda_counts(step, batches[1]))
            ctx.record(**row)
        del model, step
        if ctx.device == "cuda":
            torch.cuda.empty_cache()


def _decode_counts(model, data, p: StepOpsParams, counter) -> dict:
    """Operators and host syncs per decoding step of a beam search (issue 40's item 3: a step of the
    search should wait for the GPU as little as a training step does), outputs forced to the source
    length as ``model_speed`` forces them; steps are the model's ``step`` calls."""

    from benchmarks.stages.speed import END_PENALTY, shift_ends
    from onmt_doc.translate.search import BeamSearch

    docs, kept = [], 0
    for doc in data.decode_docs:  # whole documents, up to decode_sentences sentences
        if kept >= p.decode_sentences:
            break
        docs.append(doc)
        kept += len(doc)
    batch = data.instance_batch(model.unit, docs).to(next(model.parameters()).device)
    model.eval()
    lowered = shift_ends(model)
    steps, step = [0], model.step

    def counted(*args, **kwargs):
        steps[0] += 1
        return step(*args, **kwargs)

    model.step = counted  # an instance attribute over the method, removed below
    search = BeamSearch(beam=p.beam, max_len_ratio=1.0, max_len_add=0)
    try:
        search.search(model, batch)  # lazy state outside the count
        steps[0] = search.device_reads = 0
        with counter() as ops:
            search.search(model, batch)
        n = max(steps[0], 1)
        reads = search.device_reads
        cuda = {}
        if batch.src.device.type == "cuda":  # what the CPU count cannot see: .tolist() of a device tensor
            cuda["decode_cuda_syncs_per_step"] = round(_cuda_syncs(lambda: search.search(model, batch)) / n, 2)
    finally:
        del model.step
        if lowered:
            shift_ends(model, END_PENALTY)
    counts = {"decode_ops_per_step": round(ops.total / n, 1), "decode_syncs_per_step": round(ops.syncs / n, 2),
              "decode_reads_per_step": round(reads / n, 2)}  # fmt: skip
    return {"decode_steps": steps[0], **counts, "decode_sync_ops": dict(ops.sync_ops), **cuda}


def _compiled_graphs(model, batch) -> int:
    """The graphs ``torch.compile`` cuts the forward into (1: no break; each break is a return to
    Python between graphs, and a CUDA graph of each piece); traced only, not compiled."""
    import torch

    torch._dynamo.reset()
    return torch._dynamo.explain(model)(batch).graph_count


def _cuda_counts(step, batch) -> dict:
    """Kernel launches (profiler) and host synchronisations (torch's sync debug mode) of one step."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(batch)
        torch.cuda.synchronize()
    launches = sum(e.count for e in prof.key_averages() if "LaunchKernel" in e.key)
    return {"cuda_launches": launches, "cuda_syncs": _cuda_syncs(lambda: step(batch))}


def _cuda_syncs(fn) -> int:
    """The host synchronisations torch's sync debug mode reports while ``fn()`` runs."""
    import torch

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None
