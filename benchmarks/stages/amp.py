"""``amp``: mixed precision on the device: the same small model trained on the same batches in
float32, bf16 autocast and fp16 autocast with the gradient scaler (``train.amp``); no step may
produce a non-finite loss and the mixed-precision loss curves must track float32's. Data: the
toy corpus the project generates (real data is the ``documents`` stage's business)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from benchmarks.stages.training import losses, share_vocab, system_config, train_system
from benchmarks.suite.stage import StageContext, stage


@dataclass
class AmpParams:
    system: str  # a system of the spec (its config example and overrides)
    steps: int = 300
    precisions: list = field(default_factory=lambda: ["fp32", "bf16", "fp16"])
    train_docs: int = 2000  # toy corpus documents
    every: int = 10  # a loss point every this many steps
    skip_steps: int = 50  # the first steps are compared in the report but not in max_rel_diff
    tolerance: float = 0.05  # max relative difference of the loss to float32's after skip_steps


@stage("amp", AmpParams)
def amp(p: AmpParams, ctx: StageContext) -> None:
    """One training per precision; a record each with its final loss, speed and distance to float32."""
    from onmt_doc.toy.corpus import write_corpus

    corpus = ctx.work_dir("toy")
    write_corpus(corpus, seed=1, train_docs=p.train_docs, valid_docs=20, test_docs=1)
    data = {
        "data": {
            "train": {"src": os.path.join(corpus, "train.src"), "tgt": os.path.join(corpus, "train.tgt")},
            "valid": {"src": os.path.join(corpus, "valid.src"), "tgt": os.path.join(corpus, "valid.tgt")},
        },
        "train": {"max_steps": p.steps, "valid_every": p.steps, "save_every": p.steps, "valid_bleu": False},
        "log": {"every": p.every},
    }
    reference, first_dir, bad = None, None, []
    for precision in p.precisions:
        run_dir = ctx.work_dir(precision)
        if first_dir:
            share_vocab(first_dir, run_dir)
        first_dir = first_dir or run_dir
        raw = system_config(ctx, ctx.systems[p.system], data, {"train": {"amp": precision}, "log": {"dir": run_dir}})
        row = train_system(ctx, raw)
        curve = losses(os.path.join(run_dir, "metrics.jsonl"))
        finite = all(math.isfinite(v) for _, v in curve)
        reference = reference or dict(curve)
        diffs = [abs(v - reference[s]) / reference[s] for s, v in curve if s > p.skip_steps and s in reference]
        worst = max(diffs, default=0.0)
        ctx.record(precision=precision, finite=finite, max_rel_diff=worst, curve=[round(v, 3) for _, v in curve], **row)
        if not finite or worst > p.tolerance:
            bad.append(precision)
    if bad:
        raise RuntimeError(f"non-finite loss or loss off float32's by more than {p.tolerance:.0%}: {', '.join(bad)}")
