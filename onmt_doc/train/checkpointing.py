"""Checkpoints of a training run: what they hold, where they go, and what a resume puts back.

Kept out of the loop (``trainer.py``) as OpenNMT-py keeps ``model_saver.py`` apart: the code here
takes a checkpoint folder and the live objects of a run (:class:`Resumable`), so saving, pruning and
resuming can be tested without training, and the loop only says *when* to save.

* :func:`payload` / :func:`train_state`: the checkpoint dict (docs/architecture.md, "Checkpoints"
  and "What resume restores"), RNG states gathered from every rank;
* :class:`Checkpointer`: ``step_N.pt`` + its ``last.pt`` copy, ``best.pt``, the keep-last sweep;
* :func:`resume_source` / :func:`load_resumable`: which checkpoint a resume continues from, or a
  one-line error that says what to do;
* :func:`restore`: the checks (vocabularies, data position, optimizer type), then weights,
  optimizer, scaler, data position, the loop's counters and every rank's RNG streams.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import random
import re
from dataclasses import dataclass
from typing import Optional

import torch

from onmt_doc.data.batching import BatchSampler
from onmt_doc.data.codec import Codec
from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import copy_checkpoint, load_checkpoint, save_checkpoint
from onmt_doc.train import distributed
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.progress import Progress, StepStats
from onmt_doc.train.run_folder import PARTIAL, fingerprint_changes

log = logging.getLogger("onmt_doc")

# the temporary files of the checkpoints training writes; another command's (an average written
# into checkpoints/ while the run trains) is not this sweep's to delete
TRAINING_FILES = re.compile(r"\.?(step_\d+|last|best)\.pt\.tmp\d+$")


@dataclass
class Resumable:
    """The live objects a checkpoint saves and a resume restores or checks: the vocabularies, the
    weights, the optimizer and its ``optim.type``, the fp16 scaler, the data position (``sampler``)
    and what it means (``fingerprint``, :func:`onmt_doc.train.run_folder.data_fingerprint`), and
    the loop's counters."""

    codec: Codec
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    optimizer_type: str
    scaler: Optional[torch.amp.GradScaler]
    sampler: BatchSampler
    fingerprint: dict
    progress: Progress


# ----------------------------------------------------------------------------- writing


def rng_state() -> dict:
    """This process's generator states: what dropout and shuffling draw next."""
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def train_state(run: Resumable, ctx: DistContext) -> dict:
    """Everything an exact resume needs beyond the weights. Every rank must call it (the RNG
    states are gathered, one entry per rank)."""
    p = run.progress
    return {
        "step": p.step,
        "optimizer_type": run.optimizer_type,  # a resume with another optimizer is refused
        "optimizer": run.optimizer.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler else None,
        "sampler": run.sampler.state_dict(),
        "data": run.fingerprint,  # what the sampler position means
        "early_stopping": {"best": p.early.best, "bad": p.early.bad},
        "pending": {"values": p.pending.floats(), "tokens": p.pending.tokens, "seconds": p.pending.seconds},
        "rng": distributed.gather_objects(rng_state(), ctx),  # one entry per rank
    }


def payload(config: dict, run: Resumable, ctx: DistContext, with_train_state: bool = True) -> dict:
    """The checkpoint dict: the resolved ``config`` (plain data), codec, weights, step and, unless
    ``with_train_state`` is false (``best.pt``), the training state."""
    out = {
        "config": config,
        "codec": run.codec.to_dict(),
        "model": run.model.state_dict(),
        "step": run.progress.step,
    }
    if with_train_state:
        out["train_state"] = train_state(run, ctx)
    return out


class Checkpointer:
    """The files of one ``checkpoints/`` folder: ``step_N.pt`` with its ``last.pt`` copy, ``best.pt``
    and the keep-last sweep. Only the process that writes (rank 0) uses it."""

    def __init__(self, ckpt_dir: str, keep_last: int) -> None:
        """``keep_last``: ``step_N.pt`` files kept by :meth:`prune` (``train.keep_last``)."""
        self.ckpt_dir, self.keep_last = ckpt_dir, keep_last

    @property
    def last(self) -> str:
        """The path of ``last.pt``, the checkpoint a resume continues from."""
        return os.path.join(self.ckpt_dir, "last.pt")

    def save(self, payload: dict, step: int) -> str:
        """Write ``step_N.pt`` (atomically), make ``last.pt`` a durable copy of it, prune; its path."""
        path = os.path.join(self.ckpt_dir, f"step_{step}.pt")
        save_checkpoint(payload, path)
        copy_checkpoint(path, self.last)
        self.prune(step)
        log.info("saved %s", path)
        return path

    def save_best(self, payload: dict) -> None:
        """Write ``best.pt``: weights only (no training state), for translation and averaging."""
        save_checkpoint(payload, os.path.join(self.ckpt_dir, "best.pt"))

    def prune(self, step: int) -> None:
        """Keep the newest ``keep_last`` ``step_N.pt`` up to ``step`` and delete leftovers of killed
        saves. Also run after a resume: a process killed between its last save and this sweep (the
        final save, so no later save comes) leaves one ``step_N.pt`` too many. A ``step_N.pt`` past
        ``step`` (a resume from an older checkpoint) is left for the save at its step to replace:
        deleting it could leave fewer intact checkpoints than keep_last."""
        steps = [p for p in step_checkpoints(self.ckpt_dir) if _step_of(p) <= step]
        for old in steps[: -self.keep_last]:
            os.remove(old)
        for entry in os.scandir(self.ckpt_dir):  # leftovers of saves killed in earlier processes
            if PARTIAL.search(entry.name) and TRAINING_FILES.match(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(entry.path)


def step_checkpoints(ckpt_dir: str) -> list[str]:
    """The folder's ``step_N.pt`` files, oldest first."""
    paths = glob.glob(os.path.join(ckpt_dir, "step_*.pt"))
    return sorted((p for p in paths if re.search(r"step_\d+\.pt$", p)), key=_step_of)


def _step_of(path: str) -> int:
    """N of ``step_N.pt``."""
    return int(re.search(r"step_(\d+)\.pt$", path).group(1))


# ----------------------------------------------------------------------------- finding the checkpoint


def resume_source(ckpt_dir: str) -> Optional[tuple[str, dict]]:
    """The checkpoint a resume continues from, and its path: ``last.pt``; when it is missing, the
    newest ``step_N.pt`` that loads, verifies and holds a training state (said in a warning);
    None for a new run (no ``step_N.pt``, no ``best.pt``). Checkpoints none of which can be resumed
    are a one-line error, since training from step 0 would overwrite them."""
    last = os.path.join(ckpt_dir, "last.pt")
    if os.path.exists(last):
        return last, load_resumable(last, ckpt_dir)
    steps = step_checkpoints(ckpt_dir)
    best = os.path.join(ckpt_dir, "best.pt")
    if not steps and not os.path.exists(best):
        return None
    unusable = []
    for path in reversed(steps):
        try:
            ckpt = load_checkpoint(path)
        except UserError as e:
            unusable.append(f"{os.path.basename(path)} {_why(e, path)}")
            continue
        if "train_state" not in ckpt:
            unusable.append(f"{os.path.basename(path)} has no training state")
            continue
        log.warning(
            "%s is missing: resuming from %s, the newest intact step_N.pt%s",
            last,
            path,
            f" (skipped: {'; '.join(unusable)})" if unusable else "",
        )
        return path, ckpt
    found = unusable + (["best.pt (weights only, no training state)"] if os.path.exists(best) else [])
    raise UserError(
        f"{last} is missing and no checkpoint beside it can be resumed ({'; '.join(found)}); training "
        f"from step 0 would overwrite them: move them out of {ckpt_dir} or use a new log.dir "
        f"(train.init_from=<one of them> starts from its weights)"
    )


def _why(e: UserError, path: str) -> str:
    """A load error without the path it starts with and the advice it ends with: ``damaged (…)``."""
    text = str(e)
    text = text[len(path) + 2 :] if text.startswith(f"{path}: ") else text
    return text.split("; ")[0]


def load_resumable(path: str, ckpt_dir: str) -> dict:
    """``last.pt`` with its training state, or a one-line error that says what to do instead."""
    try:
        ckpt = load_checkpoint(path)
    except UserError as e:
        raise UserError(f"{e}; {_intact_hint(path, ckpt_dir)}") from None
    if "train_state" not in ckpt:
        raise UserError(
            f"{path}: has no training state (a best.pt or an averaged checkpoint?), so it "
            f"cannot be resumed; to start from its weights use a new log.dir with "
            f"train.init_from={path}"
        )
    return ckpt


def _intact_hint(path: str, ckpt_dir: str) -> str:
    for candidate in reversed(step_checkpoints(ckpt_dir)):
        try:
            if "train_state" in load_checkpoint(candidate):
                return (
                    f"the newest intact checkpoint beside it is {candidate}: copy it to {path} to "
                    f"resume from there, or start afresh with train.resume=false or a new log.dir"
                )
        except UserError:
            continue
    return "no intact step_N.pt beside it: start afresh with train.resume=false or a new log.dir"


# ----------------------------------------------------------------------------- restoring


def resume_from(ckpt_dir: str, run: Resumable, config: dict, resume_data: str, ctx: DistContext) -> bool:
    """Continue ``run`` from ``last.pt`` (or, when it is missing, the newest intact ``step_N.pt``)
    of ``ckpt_dir``; False for a new run. ``config``: the resolved config as a dict (its changes
    since the checkpoint are named in a warning); ``resume_data``: ``train.resume_data``."""
    found = resume_source(ckpt_dir)
    if found is None:
        return False
    restore(*found, run, config, resume_data, ctx)
    return True


def restore(path: str, ckpt: dict, run: Resumable, config: dict, resume_data: str, ctx: DistContext) -> None:
    """Put checkpoint ``ckpt`` (read from ``path``) back into ``run`` after refusing what cannot be
    resumed exactly: other vocabularies, another data position (unless ``resume_data`` is
    ``next_epoch``), another optimizer type, a model or optimizer that does not fit."""
    if ckpt["codec"] != run.codec.to_dict():
        raise UserError(f"{path}: the run folder's vocabularies changed since this checkpoint")
    st = ckpt["train_state"]
    next_epoch = check_data_position(path, st, run.fingerprint, resume_data)
    check_optimizer_type(path, ckpt, run.optimizer_type)
    changed = config_changes(ckpt.get("config", {}), config)
    if changed:
        log.warning("resuming with a config that differs from the checkpoint's: %s", ", ".join(changed))
    _load_weights(path, ckpt, run)
    if run.scaler and st["scaler"]:
        run.scaler.load_state_dict(st["scaler"])
    run.sampler.load_state_dict(st["sampler"])
    if next_epoch and run.sampler.position:
        run.sampler.epoch, run.sampler.position = run.sampler.epoch + 1, 0
    p = run.progress
    p.early.best, p.early.bad = st["early_stopping"]["best"], st["early_stopping"]["bad"]
    p.pending = StepStats(dict(st["pending"]["values"]), st["pending"]["tokens"], st["pending"]["seconds"])
    p.step = p.saved_step = int(st["step"])
    restore_rng(st["rng"], path, ctx)
    log.info("resumed from %s at step %d (epoch %d, batch %d)", path, p.step, run.sampler.epoch, run.sampler.position)


def _load_weights(path: str, ckpt: dict, run: Resumable) -> None:
    """The weights and the optimizer state, or a one-line error when the config's model or
    optimizer no longer fits them."""
    try:
        run.model.load_state_dict(ckpt["model"])
        run.optimizer.load_state_dict(ckpt["train_state"]["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise UserError(
            f"{path}: cannot resume: the model or optimizer in the config changed since "
            f"this checkpoint ({str(e).splitlines()[0][:160]}); use a new log.dir or "
            f"train.resume=false with train.init_from"
        ) from None


def restore_rng(rngs: list, path: str, ctx: DistContext) -> None:
    """This rank's generator states from a checkpoint's per-rank list (another number of processes:
    a warning, since dropout and shuffling then differ from an uninterrupted run)."""
    if len(rngs) != ctx.world:
        log.warning(
            "%s was saved by %d process(es), resuming with %d: dropout and shuffling "
            "noise will differ from an uninterrupted run",
            path,
            len(rngs),
            ctx.world,
        )
    rng = rngs[ctx.rank % len(rngs)]
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_tuple(rng["python"]))
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def check_optimizer_type(path: str, ckpt: dict, new: str) -> None:
    """Refuse another ``optim.type``: its state (e.g. Adam's moments) would be loaded into an
    optimizer that reads other keys, or reads the same keys with another meaning (adam ->
    adamw), and training would go on silently with a wrong update."""
    old = ckpt["train_state"].get("optimizer_type") or ckpt.get("config", {}).get("optim", {}).get("type")
    if old is not None and old != new:
        raise UserError(
            f"{path}: cannot resume with optim.type {new}: the checkpoint holds the state of a {old} "
            f"optimizer; set optim.type={old} to resume, or start a new log.dir with "
            f"train.init_from={path} (its weights, a fresh {new} optimizer)"
        )


def check_data_position(path: str, state: dict, fingerprint: dict, resume_data: str) -> bool:
    """Refuse (or, with ``resume_data`` = next_epoch, accept) a checkpoint whose data position
    indexes another batch list than ``fingerprint`` describes; True when the position must move on
    to the start of the next epoch."""
    old = state.get("data")
    if old is None:  # written before fingerprints existed
        log.warning("%s has no data fingerprint: cannot check that the data and batching keys are unchanged", path)
        return False
    changes = fingerprint_changes(old, fingerprint)
    if not changes:
        return False
    what = "; ".join(changes)
    if resume_data == "next_epoch":
        log.warning(
            "%s: the training batches changed (%s): train.resume_data=next_epoch, so "
            "training continues with the new batch order from the next epoch",
            path,
            what,
        )
        return True
    raise UserError(
        f"{path}: cannot resume exactly: the training batches changed since this checkpoint "
        f"({what}), so its data position would point into another batch order; "
        f"restore the old values, or set train.resume_data=next_epoch to continue with the new "
        f"order from the next epoch, or start a new log.dir with train.init_from={path}"
    )


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``key old -> new`` for every leaf of two config dicts that differs."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b, name = old.get(key), new.get(key), f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, name + ".")
        elif a != b:
            out.append(f"{name} {a} -> {b}")
    return out


def _as_tuple(value: object) -> object:
    """random.setstate needs tuples; a checkpoint may hand back lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
