"""The training sections: ``optim:`` (the optimizer part and its schedule), ``train:`` (the loop,
validation, checkpoints, resume) and ``log:`` (the run folder and progress reporting).

``optim`` is itself a part section (``type`` picks a registered optimizer, all of which share these
keys) holding another (``schedule``); ``TrainConfig.validate`` checks ``best_on`` against the
validation sets ``data`` declares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from onmt_doc.config.options import MAX_BEAM, PartConfig, RootConfig, option, part
from onmt_doc.errors import ConfigError
from onmt_doc.registry import closest


@dataclass
class OptimConfig(PartConfig):
    """Optimizer section; ``type`` is adam, adamw, sgd or a torch-optimizer name (radam, lamb…)."""

    type: str = option("adam", "optimizer name, see [Optimizers](#optimizers)")
    lr: float = option(
        5.0e-4, "base learning rate; the lr of a step is `lr × lr_scale × schedule factor`; at least 0", minimum=0
    )
    betas: list[float] = option(
        [0.9, 0.98], "passed when the optimizer accepts `betas`; each in [0, 1)", minimum=0, below=1
    )
    eps: float = option(1.0e-9, "passed when the optimizer accepts `eps`; at least 0", minimum=0)
    weight_decay: float = option(0.0, "passed when the optimizer accepts `weight_decay`; at least 0", minimum=0)
    params: dict = option(
        {}, "any other constructor argument by name, e.g. `{momentum: 0.9, nesterov: true}` for `sgd`"
    )
    schedule: PartConfig = part("schedule", "inverse_sqrt", "learning-rate schedule, see [Schedules](#schedules)")


@dataclass
class TrainConfig:
    """``train:`` batching, optimisation, validation and checkpoints."""

    batch_tokens: int = option(
        4096,
        "padded tokens per batch: B × max(source length, target length + 1), "
        "markup included; `context` (HM-GDC) windows count the sum of their rows' own lengths, since "
        "their rows run in length buckets (see [data.md](data.md#token-budget)); also the validation "
        "batch size",
        minimum=1,
    )
    accum: int = option(1, "batches per optimizer step, per process", minimum=1)
    max_steps: int = option(
        100000, "optimizer steps; training stops there, validating and saving at that step", minimum=0
    )
    max_epochs: int = option(
        0,
        "stop once this many epochs are done (0 = no limit). Checked before each step, "
        "so the step that starts the next epoch still runs; there is no extra save or "
        "validation when this limit ends the run",
        minimum=0,
    )
    max_minutes: Optional[float] = option(
        None,
        "stop after this many minutes of training in this process, validating and saving as at `max_steps` "
        "(a time budget, as fairseq's --stop-time-hours; a resumed run gets the budget afresh; under torchrun "
        "rank 0's clock decides for every process)",
        above=0,
    )
    valid_every: int = option(1000, "validate every this many steps (and at `max_steps`)", minimum=1)
    valid_bleu: bool = option(True, "translate the validation set at each validation and report BLEU")
    valid_beam: int = option(
        1, f"beam for validation BLEU (1 = greedy, fast); at most {MAX_BEAM}", minimum=1, maximum=MAX_BEAM
    )
    valid_cxmi: int = option(
        0,
        "at each validation, score the first this many sentences of each document validation set with and "
        "without their preceding sentences and report CXMI (`valid/cxmi`, nats per target token: how much the "
        "model reads its context; 0 for a sentence model; docs/evaluation.md): whether a document model has "
        "started to use context or is still a sentence model; 0 = off. The cost is two forced decodings of "
        "those sentences",
        minimum=0,
    )
    save_every: int = option(
        1000,
        "write `step_N.pt` and `last.pt` every this many steps (and at `max_steps` and when early stopping)",
        minimum=1,
    )
    keep_last: int = option(
        5,
        "how many `step_N.pt` files to keep (at least 1; older ones are deleted, and so "
        "are leftovers `*.tmp<pid>` of interrupted saves)",
        minimum=1,
    )
    early_stopping: int = option(
        0, "stop after this many validations in a row without improvement (0 = off)", minimum=0
    )
    early_stopping_metric: Literal["loss", "bleu"] = option(
        "loss",
        "validation metric for early stopping and `best.pt` (lower loss / higher BLEU is better); `bleu` "
        "needs `valid_bleu: true`",
    )
    best_on: Optional[str] = option(
        None,
        "with several validation sets: the name of the one whose metric chooses `best.pt` and drives early "
        "stopping (`null` = the first); every set is still reported",
    )
    max_grad_norm: float = option(
        1.0, "clip the gradient norm to this (0 = no clipping; the norm is still logged)", minimum=0
    )
    amp: Literal["auto", "bf16", "fp16", "fp32"] = option(
        "auto",
        "mixed precision. `auto`: bf16 autocast on GPUs (fp16 with gradient scaling where bf16 is "
        "missing), float32 on CPUs. `bf16` on a CPU with AMX (Sapphire Rapids and later) is about 1.6× faster "
        "for d_model 256 models but slower for tiny ones, so it is opt-in there ([benchmarks](benchmarks.md)); "
        "`fp16` on a CPU logs a warning and trains in float32; `fp32` turns mixed precision off",
    )
    seed: int = option(1, "seeds torch, Python's `random` and the data order")
    init_from: Optional[str] = option(
        None,
        "checkpoint whose parameters initialise the model: every parameter "
        "with the same name is copied (a shape mismatch is an error naming it), "
        "the others start fresh. Its vocabularies must equal the run folder's "
        "(copy its vocabulary and subword files into `log.dir`)",
    )
    init_lr_scale: float = option(
        0.2,
        "learning-rate scale of the parameters copied by `init_from` (the new "
        "ones train at the full rate; G-Transformer fine-tuning: 1e-4 vs 5e-4)",
        minimum=0,
    )
    resume: bool = option(
        True,
        "continue from `<log.dir>/checkpoints/last.pt` when it exists (see "
        "[getting_started.md](getting_started.md#resume)); a `last.pt` without training state "
        "(`best.pt`, an averaged checkpoint) is refused: use `init_from`",
    )
    resume_data: Literal["exact", "next_epoch"] = option(
        "exact",
        "a resume after the training data, `batch_tokens`, `seed` or the number of processes changed: "
        "`exact` refuses it (the checkpoint's data position would index another batch order); `next_epoch` "
        "accepts it and continues with the new batch order from the start of the next epoch",
    )
    compile: Literal["off", "on", "auto", "graphs"] = option(
        "off",
        "compile the model's forward and backward with `torch.compile` (dynamic shapes: one compilation serves "
        "every batch shape; the first step takes a minute or more): fused elementwise kernels and fewer "
        "launches, which is what a GPU step waits on. `auto` = on CUDA only; on a CPU it rarely pays. "
        "`graphs` = compiled, and on CUDA each batch shape's kernels recorded once as a CUDA graph and "
        'replayed (`mode="reduce-overhead"`): the host launches one graph a step instead of ~1,000 '
        "kernels; needs `static_shapes: true`, so that shapes repeat. "
        "Measured in [benchmarks.md](benchmarks.md#gpu)",
    )
    static_shapes: bool = option(
        False,
        "pad every training batch to one of a few shapes (lengths 8, 16, …, 64 then eight per doubling, rows "
        "four per doubling, the output layer's rows to a quarter of the batch; extra rows and `<pad>` targets "
        "count nothing), so compiled code and CUDA graphs are reused across steps; costs up to ~1/8 more "
        "columns and ~1/4 more rows of computation. For sentence-level models (the `sentence` unit and the "
        "concatenation baselines), whose rows are independent",
    )
    device: str = option(
        "auto",
        "`auto`, `cpu`, `cuda` or `cuda:N`; `auto` and `cuda` put process *i* of a node on `cuda:i`; on CUDA, "
        "cuDNN attention is turned off (it plans per shape; docs/benchmarks.md, GPU run 2)",
    )
    threads: int = option(
        0,
        "CPU threads per process (at least 0, at most 8 per core); 0 = automatic: `OMP_NUM_THREADS` when set "
        "and training runs in one process, else cores / processes on this node; no effect on "
        "GPUs",
        minimum=0,
    )

    def validate(self, path: str, root: RootConfig) -> None:
        """Early stopping on BLEU needs the BLEU that only valid_bleu computes; CUDA graphs need
        static shapes, which need rows that are independent sentences."""
        if self.early_stopping_metric == "bleu" and not self.valid_bleu:
            raise ConfigError(f"{path}.early_stopping_metric: bleu needs {path}.valid_bleu: true")
        if self.compile == "graphs" and not self.static_shapes:
            raise ConfigError(f"{path}.compile: graphs needs {path}.static_shapes: true (a graph replays one shape)")
        if self.static_shapes and root.model.part_units() != {"sentence"}:
            raise ConfigError(
                f"{path}.static_shapes: for sentence-level models only, not the {root.model.resolved_unit()} unit "
                "(its batch rows belong to documents: added rows would change them)"
            )
        valid = root.data.corpora("valid")
        if self.valid_cxmi and not any(c.documents for c in valid):
            raise ConfigError(
                f"{path}.valid_cxmi: needs a validation set of documents (data.documents: true, or a valid "
                "corpus' own documents: true): CXMI compares sentences with and without their document's context"
            )
        names = [c.name for c in valid]
        if self.best_on is not None and self.best_on not in names:
            raise ConfigError(
                f"{path}.best_on: no validation set '{self.best_on}'{closest(self.best_on, names)} "
                f"(data.valid has: {', '.join(names) or 'none'})"
            )


@dataclass
class LogConfig:
    """``log:`` the run folder and progress reporting."""

    dir: str = option(
        "runs/default",
        "the run folder: config, vocabularies, cache, checkpoints, TensorBoard (see "
        "[getting_started.md](getting_started.md#the-run-folder)); one training at a time holds its "
        "`.lock` ([one training per run folder](getting_started.md#one-training-per-run-folder))",
    )
    tensorboard: bool = option(True, "write TensorBoard scalars to `<dir>/tensorboard`")
    every: int = option(50, "progress line and `train/*` scalars every this many steps", minimum=1)
    metrics_file: Optional[str] = option(
        None,
        "also write every progress line and validation as one JSON object per line (step, tokens, words: the "
        "target text of those tokens without markup, seconds, loss, ppl, acc, lr, grad_norm, tok_per_s, peak GPU "
        "memory; validation metrics): for scripts and benchmarks, which need not parse the log. A relative path "
        "is inside `log.dir`; a resumed run appends",
    )
    pictures: int = option(
        0,
        "every this many validations (the first included), TensorBoard images `pictures/*` of what the model "
        "reads from context on a few fixed validation documents (attention over the source sentences, gates; "
        "[seeing_context.md](seeing_context.md)); 0 = none. Needs `tensorboard: true` and matplotlib "
        "(`pip install -e .[viz]`)",
        minimum=0,
    )
    picture_documents: int = option(
        2,
        "how many validation documents `pictures` draws: the first ones of the first validation set with 2 to 6 "
        "sentences",
        minimum=1,
    )

    def validate(self, path: str, root: RootConfig) -> None:
        """Pictures go to TensorBoard, so they need it."""
        if self.pictures and not self.tensorboard:
            raise ConfigError(f"{path}.pictures: the pictures are TensorBoard images; set {path}.tensorboard: true")
