"""The one trainer for every model.

Gradient accumulation, clipping, mixed precision on GPUs, validation (loss, perplexity, accuracy,
BLEU), early stopping, keep-last/keep-best checkpoints and exact resume. Loss sums are divided by
the number of target tokens of the whole optimizer step (all accumulated batches on all ranks),
so N processes give the same update as one process with N times the accumulation.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import random
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from onmt_doc.config import Config, config_to_dict, save_config
from onmt_doc.contracts import Batch
from onmt_doc.data.batching import BatchSampler, CorpusMix, collate, ordered_batches
from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import read_parallel
from onmt_doc.data.example_fields import FieldContext
from onmt_doc.data.instances import Example
from onmt_doc.data.prepare import build_codec, data_cache_dir, load_codec, load_examples, train_corpora
from onmt_doc.errors import UserError
from onmt_doc.evaluation.corpus_metrics import report
from onmt_doc.losses import Loss, build_losses, loss_fields
from onmt_doc.models.builder import build_model
from onmt_doc.models.checkpoint import copy_checkpoint, load_checkpoint, save_checkpoint
from onmt_doc.modules import analysis
from onmt_doc.optim.optimizers import build_optimizer
from onmt_doc.optim.schedules import build_schedule
from onmt_doc.outputs import same_file
from onmt_doc.train import distributed
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.hardware import amp_dtype, autocast, set_threads
from onmt_doc.train.init_from import initial_param_groups
from onmt_doc.train.interrupt import Interrupted, StopRequest
from onmt_doc.train.reporting import Reporter, summarize
from onmt_doc.train.run_folder import PARTIAL, data_fingerprint, fingerprint_changes, lock_run_dir, remove_partial_files
from onmt_doc.translate.translator import Translator, translator_options

log = logging.getLogger("onmt_doc")

# the temporary files of the checkpoints training writes; another command's (an average written
# into checkpoints/ while the run trains) is not this sweep's to delete
TRAINING_FILES = re.compile(r"\.?(step_\d+|last|best)\.pt\.tmp\d+$")


@dataclass
class EarlyStopping:
    """Patience on one validation metric (lower loss / higher BLEU is better); its counters are
    part of the training state so a resumed run stops where the uninterrupted one would."""

    metric: str
    patience: int
    best: Optional[float] = None
    bad: int = 0

    def update(self, value: float) -> bool:
        """Record a validation value; True when it is the best so far."""
        better = self.best is None or (value > self.best if self.metric == "bleu" else value < self.best)
        if better:
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        return better

    @property
    def stop(self) -> bool:
        """Whether ``patience`` validations in a row brought no improvement (0 = never stop)."""
        return self.patience > 0 and self.bad >= self.patience


@dataclass
class ValidSet:
    """One validation set: its name (for logs and ``train.best_on``), instances and text documents."""

    name: str
    examples: list[Example]
    docs: list
    documents: bool


@dataclass
class StepStats:
    """Statistics summed since the last report."""

    values: dict = field(default_factory=dict)
    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, stats: dict) -> None:
        """Accumulate one step's loss statistics (sums, so the report divides once)."""
        for k, v in stats.items():
            self.values[k] = self.values.get(k, 0.0) + float(v)


def prepare_codec(cfg: Config, run_dir: str, ctx: DistContext) -> Codec:
    """The run folder's vocabularies; rank 0 learns them first when they are missing."""
    codec = load_codec(cfg, run_dir)
    if codec is None:
        if ctx.main:
            log.info(
                "no vocabulary in %s: learning %s (%d) and building the vocabularies",
                run_dir,
                cfg.vocab.subword,
                cfg.vocab.size,
            )
            build_codec(cfg, run_dir)
        distributed.barrier(ctx)
        codec = load_codec(cfg, run_dir)
    return codec


class Trainer:
    """One training run: model, optimizer, data order and run folder, with everything an exact
    resume needs saved in each checkpoint."""

    def __init__(self, cfg: Config, ctx: DistContext, config_path: Optional[str] = None):
        """``config_path``: the user's ``-config`` file, never written over (``config.yaml``)."""
        self.cfg, self.ctx, self.config_path = cfg, ctx, config_path
        self.run_dir = cfg.log.dir
        self.ckpt_dir = os.path.join(self.run_dir, "checkpoints")
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        self.codec = prepare_codec(cfg, self.run_dir, ctx)
        self.model = build_model(cfg.model, self.codec).to(ctx.device)
        groups = initial_param_groups(self.model, cfg.train, self.codec)  # train.init_from's weights
        if ctx.rank:  # same initial weights everywhere, a different dropout stream per rank
            torch.manual_seed(cfg.train.seed + ctx.rank)
        self.losses: list[Loss] = build_losses(cfg.loss, codec=self.codec)
        # the per-example fields the losses ask for (e.g. z*), cached next to the binarized data
        self.fields = loss_fields(self.losses, FieldContext(self.codec, data_cache_dir(cfg, self.run_dir)))
        self.optimizer = build_optimizer(cfg.optim, groups)
        self.schedule = build_schedule(cfg.optim.schedule, cfg.model.d_model, cfg.train.max_steps)
        self.amp_dtype = amp_dtype(cfg.train.amp, ctx.device)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.train_examples, self.mix, self.valid_sets = self._load_data()
        self.valid_examples = [e for v in self.valid_sets for e in v.examples]
        self.best_on = cfg.train.best_on or (self.valid_sets[0].name if self.valid_sets else None)
        self.sampler = BatchSampler(
            self.train_examples, cfg.train.batch_tokens, cfg.train.seed, rank=ctx.rank, world=ctx.world, mix=self.mix
        )
        self.fingerprint = data_fingerprint(self.train_examples, cfg, ctx.world, self.mix)
        self.step = 0
        self.saved_step: Optional[int] = None  # step of the checkpoint last written or resumed
        self.early = EarlyStopping(cfg.train.early_stopping_metric, cfg.train.early_stopping)
        self.pending = StepStats()
        self._maybe_resume()
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(self.model, device_ids=device_ids) if ctx.enabled else None
        log.info(
            "model: %s encoder + %s decoder, unit %s, %.2fM parameters, device %s, %d process(es), %d threads, %s",
            cfg.model.encoder.type,
            cfg.model.decoder.type,
            self.model.unit,
            self.model.n_params() / 1e6,
            ctx.device,
            ctx.world,
            torch.get_num_threads(),
            f"{str(self.amp_dtype).replace('torch.', '')} mixed precision" if self.amp_dtype else "float32",
        )

    # ------------------------------------------------------------------ setup
    def _load_data(self) -> tuple[list[Example], CorpusMix, list[ValidSet]]:
        """Every training corpus' instances in one list (corpus after corpus, described by the
        CorpusMix the sampler draws from) and the validation sets."""
        unit = self.model.unit
        train_fields, valid_fields = self.fields
        train: list[Example] = []
        sizes = []
        corpora = train_corpora(self.cfg)
        for c in corpora:
            examples, _ = load_examples(
                self.cfg, self.codec, c.src, c.tgt, unit, self.run_dir, fields=train_fields, documents=c.documents
            )
            if not examples:
                raise UserError(f"{c.src}: no training examples (all filtered by data.max_len?)")
            train += examples
            sizes.append(len(examples))
        mix = CorpusMix([c.name for c in corpora], sizes, [c.weight for c in corpora])
        if len(corpora) > 1:
            log.info(
                "%d training corpora, examples per epoch (rounds x weight): %s",
                len(corpora),
                ", ".join(
                    f"{n} {k} of {size} (weight {w})"
                    for n, k, size, w in zip(mix.names, mix.per_epoch, mix.sizes, mix.weights)
                ),
            )
        valid_sets = []
        for v in self.cfg.data.corpora("valid"):  # each with both files (checked when the config is read)
            examples, _ = load_examples(
                self.cfg,
                self.codec,
                v.src,
                v.tgt,
                unit,
                self.run_dir,
                filter_long=False,
                fields=valid_fields,
                documents=v.documents,
            )
            docs = read_parallel(v.src, v.tgt, v.documents, self.cfg.data.max_line_chars)
            valid_sets.append(ValidSet(v.name, examples, docs, v.documents))
        return train, mix, valid_sets

    # ------------------------------------------------------------------ checkpoints
    def _train_state(self) -> dict:
        return {
            "step": self.step,
            "optimizer_type": self.cfg.optim.type,  # a resume with another optimizer is refused
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "sampler": self.sampler.state_dict(),
            "data": self.fingerprint,  # what the sampler position means
            "early_stopping": {"best": self.early.best, "bad": self.early.bad},
            "pending": {"values": self.pending.values, "tokens": self.pending.tokens, "seconds": self.pending.seconds},
            "rng": distributed.gather_objects(self._rng_state(), self.ctx),  # one entry per rank
        }

    @staticmethod
    def _rng_state() -> dict:
        return {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def _payload(self, with_train_state: bool = True) -> dict:
        payload = {
            "config": config_to_dict(self.cfg),
            "codec": self.codec.to_dict(),
            "model": self.model.state_dict(),
            "step": self.step,
        }
        if with_train_state:
            payload["train_state"] = self._train_state()
        return payload

    def save(self) -> None:
        """Write ``step_N.pt`` (atomically) and make ``last.pt`` a durable copy of it."""
        payload = self._payload()  # every rank takes part: RNG states are gathered
        if not self.ctx.main:
            return
        path = os.path.join(self.ckpt_dir, f"step_{self.step}.pt")
        save_checkpoint(payload, path)
        copy_checkpoint(path, os.path.join(self.ckpt_dir, "last.pt"))
        self.saved_step = self.step
        self._prune()
        log.info("saved %s", path)

    def _prune(self) -> None:
        """Keep the newest ``train.keep_last`` ``step_N.pt`` up to this step and delete leftovers of
        killed saves. Also run after a resume: a process killed between its last save and this
        sweep (the final save, so no later save comes) leaves one ``step_N.pt`` too many. A
        ``step_N.pt`` past this step (a resume from an older checkpoint) is left for the save at its
        step to replace: deleting it could leave fewer intact checkpoints than keep_last."""
        steps = [p for p in step_checkpoints(self.ckpt_dir) if _step_of(p) <= self.step]
        for old in steps[: -self.cfg.train.keep_last]:
            os.remove(old)
        for entry in os.scandir(self.ckpt_dir):  # leftovers of saves killed in earlier processes
            if PARTIAL.search(entry.name) and TRAINING_FILES.match(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(entry.path)

    def save_best(self) -> None:
        """Write ``best.pt``: weights only (no training state), for translation and averaging."""
        if self.ctx.main:
            save_checkpoint(self._payload(with_train_state=False), os.path.join(self.ckpt_dir, "best.pt"))

    def _maybe_resume(self) -> None:
        """Continue from ``last.pt`` (or, when it is missing, the newest intact ``step_N.pt``)."""
        found = resume_source(self.ckpt_dir) if self.cfg.train.resume else None
        if found is None:
            return
        path, ckpt = found
        if ckpt["codec"] != self.codec.to_dict():
            raise UserError(f"{path}: the run folder's vocabularies changed since this checkpoint")
        st = ckpt["train_state"]
        next_epoch = self._check_data_position(path, st)
        self._check_optimizer_type(path, ckpt)
        changed = config_changes(ckpt.get("config", {}), config_to_dict(self.cfg))
        if changed:
            log.warning("resuming with a config that differs from the checkpoint's: %s", ", ".join(changed))
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(st["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise UserError(
                f"{path}: cannot resume: the model or optimizer in the config changed since "
                f"this checkpoint ({str(e).splitlines()[0][:160]}); use a new log.dir or "
                f"train.resume=false with train.init_from"
            ) from None
        if self.scaler and st["scaler"]:
            self.scaler.load_state_dict(st["scaler"])
        self.sampler.load_state_dict(st["sampler"])
        if next_epoch and self.sampler.position:
            self.sampler.epoch, self.sampler.position = self.sampler.epoch + 1, 0
        self.early.best, self.early.bad = st["early_stopping"]["best"], st["early_stopping"]["bad"]
        self.pending = StepStats(dict(st["pending"]["values"]), st["pending"]["tokens"], st["pending"]["seconds"])
        self.step = self.saved_step = int(st["step"])
        rngs = st["rng"]
        if len(rngs) != self.ctx.world:
            log.warning(
                "%s was saved by %d process(es), resuming with %d: dropout and shuffling "
                "noise will differ from an uninterrupted run",
                path,
                len(rngs),
                self.ctx.world,
            )
        rng = rngs[self.ctx.rank % len(rngs)]
        torch.set_rng_state(rng["torch"])
        random.setstate(_as_tuple(rng["python"]))
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        log.info(
            "resumed from %s at step %d (epoch %d, batch %d)",
            path,
            self.step,
            self.sampler.epoch,
            self.sampler.position,
        )

    def _save_resolved_config(self) -> None:
        """``config.yaml``: every key, defaults included; left alone when it is the user's own
        ``-config`` file (``onmt_doc_train -config runs/x/config.yaml`` to continue a run): the
        resolved config is in every checkpoint anyway."""
        path = os.path.join(self.run_dir, "config.yaml")
        if self.config_path and os.path.exists(path) and same_file(self.config_path, path):
            log.info("%s is the -config file: left as it is (every checkpoint stores the resolved config)", path)
            return
        save_config(self.cfg, path)

    def _check_optimizer_type(self, path: str, ckpt: dict) -> None:
        """Refuse another ``optim.type``: its state (e.g. Adam's moments) would be loaded into an
        optimizer that reads other keys, or reads the same keys with another meaning (adam ->
        adamw), and training would go on silently with a wrong update."""
        old = ckpt["train_state"].get("optimizer_type") or ckpt.get("config", {}).get("optim", {}).get("type")
        new = self.cfg.optim.type
        if old is not None and old != new:
            raise UserError(
                f"{path}: cannot resume with optim.type {new}: the checkpoint holds the state of a {old} "
                f"optimizer; set optim.type={old} to resume, or start a new log.dir with "
                f"train.init_from={path} (its weights, a fresh {new} optimizer)"
            )

    def _check_data_position(self, path: str, state: dict) -> bool:
        """Refuse (or, with train.resume_data=next_epoch, accept) a checkpoint whose data position
        indexes another batch list than this config makes; True when the position must move on to
        the start of the next epoch."""
        old = state.get("data")
        if old is None:  # written before fingerprints existed
            log.warning("%s has no data fingerprint: cannot check that the data and batching keys are unchanged", path)
            return False
        changes = fingerprint_changes(old, self.fingerprint)
        if not changes:
            return False
        what = "; ".join(changes)
        if self.cfg.train.resume_data == "next_epoch":
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

    # ------------------------------------------------------------------ training
    def _autocast(self):
        return autocast(self.ctx.device, self.amp_dtype)

    def _losses(self, batch: Batch, training: bool) -> tuple[torch.Tensor, dict]:
        out = (self.ddp or self.model)(batch) if training else self.model(batch)
        total, stats = None, {}
        for loss in self.losses:
            if loss.training_only and not training:
                continue
            value, s = loss(out, batch)
            total = loss.weight * value if total is None else total + loss.weight * value
            stats.update(s)
        stats["loss"] = float(total.detach())
        if not training:  # analysis sums a part reports (e.g. attention entropy, gate means)
            stats.update(out.aux.get("stats", {}))
        return total, stats

    def train_step(self, batches: list) -> dict:
        """One optimizer step over ``batches`` (this rank's share of the accumulation)."""
        self.model.train()
        n_tokens = distributed.all_reduce_sum([float(sum(b.n_tgt_tokens for b in batches))], self.ctx)[0]
        scale = self.ctx.world / max(n_tokens, 1.0)  # DDP averages gradients over ranks
        stats = StepStats()
        for i, batch in enumerate(batches):
            batch = batch.to(self.ctx.device)
            sync = self.ddp is None or i == len(batches) - 1
            with contextlib.nullcontext() if sync else self.ddp.no_sync(), self._autocast():
                total, s = self._losses(batch, training=True)
                loss = total * scale
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            stats.add(s)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.train.max_grad_norm or float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        factor = self.schedule.factor(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.optim.lr * group["lr_scale"] * factor
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        stats.values["grad_norm"] = grad_norm
        return stats.values

    def train(self, stop_request: Optional[StopRequest] = None) -> dict:
        """Train to train.max_steps (or max_epochs, or early stopping). With ``stop_request``, a
        signal ends training at the next step boundary with a checkpoint (raises Interrupted)."""
        cfg = self.cfg.train
        if self.ctx.main:
            os.makedirs(self.ckpt_dir, exist_ok=True)
            self._save_resolved_config()
        if self.ctx.main and self.saved_step is not None:  # resumed: the sweep a killed save did not finish
            self._prune()
        stop = end = self._at_end()
        if end or self.early.stop:
            self._say_finished()
            return {}
        reporter = Reporter(self.run_dir, self.cfg.log.tensorboard, cfg.max_steps, self.step, self.ctx.main)
        batches = iter(self.sampler)
        epochs_logged = self.sampler.completed_epochs()
        last_metrics: dict = {}
        try:
            while not (end or stop):
                if stop_request and distributed.any_flag(stop_request.requested, self.ctx):
                    self._stop_on_signal(stop_request.signum)
                t0 = time.time()
                step_batches = [next(batches) for _ in range(cfg.accum)]
                values = self.train_step(step_batches)
                grad_norm = values.pop("grad_norm")
                self.pending.add(values)
                self.pending.seconds += time.time() - t0
                while epochs_logged < self.sampler.completed_epochs():  # per-corpus examples of each epoch
                    reporter.epoch(self.step, epochs_logged, self.sampler.epoch_counts(epochs_logged))
                    epochs_logged += 1
                end = self._at_end()
                if self.step % self.cfg.log.every == 0 or end:
                    self._report(reporter, grad_norm)
                if self.valid_examples and (self.step % cfg.valid_every == 0 or end):
                    last_metrics = self.validate(reporter)
                    stop = distributed.broadcast_flag(self.early.stop, self.ctx)
                    if stop:
                        log.info(
                            "early stopping: no improvement of valid %s in %d validations",
                            self.early.metric,
                            self.early.patience,
                        )
                if self.step % cfg.save_every == 0 or end or stop:
                    self.save()
        finally:
            reporter.close()
        return last_metrics

    def _stop_on_signal(self, signum: Optional[int]) -> None:
        """Save once (unless this step is saved already) and raise Interrupted."""
        if self.saved_step != self.step:
            self.save()
            if self.ctx.main:
                log.warning(
                    "stopped at step %d: saved %s; run the same command to resume",
                    self.step,
                    os.path.join(self.ckpt_dir, "last.pt"),
                )
        elif self.ctx.main:
            log.warning(
                "stopped at step %d: nothing new to save since %s",
                self.step,
                "the start" if self.saved_step is None else f"step {self.saved_step}",
            )
        raise Interrupted(signum or signal.SIGTERM)  # another rank got the signal

    def _say_finished(self) -> None:
        if not self.ctx.main:
            return
        why = (
            f"early stopping: no improvement in {self.early.bad} validations (train.early_stopping="
            f"{self.early.patience})"
            if self.early.stop and self.step < self.cfg.train.max_steps
            else f"train.max_steps={self.cfg.train.max_steps}"
            if self.step >= self.cfg.train.max_steps
            else f"train.max_epochs={self.cfg.train.max_epochs}"
        )
        log.warning(
            "nothing to do: %s already finished at step %d (%s); raise that limit to train on, or use a new log.dir",
            self.run_dir,
            self.step,
            why,
        )

    def _at_end(self) -> bool:
        """True once train.max_steps steps are done or train.max_epochs epochs are consumed."""
        if self.step >= self.cfg.train.max_steps:
            return True
        epochs = self.cfg.train.max_epochs
        if epochs and self.sampler.completed_epochs() >= epochs:
            log.info("reached train.max_epochs=%d", epochs)
            return True
        return False

    def _report(self, reporter: Reporter, grad_norm: float) -> None:
        keys = sorted(self.pending.values)
        totals = distributed.all_reduce_sum([self.pending.values[k] for k in keys] + [self.pending.seconds], self.ctx)
        stats = dict(zip(keys, totals[:-1]))
        seconds = totals[-1] / self.ctx.world
        lr = self.optimizer.param_groups[0]["lr"]
        reporter.train(self.step, stats, lr, grad_norm, stats.get("tokens", 0.0) / max(seconds, 1e-9))
        self.pending = StepStats()

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self, reporter: Optional[Reporter] = None) -> dict:
        """Loss/perplexity/accuracy (and BLEU) on every validation set, each reported on its own; the
        ``train.best_on`` set decides ``best.pt`` and early stopping. Returns that set's metrics, plus
        ``<set>/<metric>`` for every set when there are several. Rank 0 computes, all wait."""
        metrics: dict = {}
        if self.ctx.main:
            self.model.eval()
            several = len(self.valid_sets) > 1
            for v in self.valid_sets:
                m = self._validate_set(v)
                if reporter:
                    reporter.valid(self.step, m, v.name if several else None)
                if several:
                    metrics.update({f"{v.name}/{k}": value for k, value in m.items()})
                if v.name == self.best_on:
                    metrics.update(m)
            best = self.early.update(metrics["bleu" if self.early.metric == "bleu" else "loss"])
            if best:
                self.save_best()
        distributed.barrier(self.ctx)  # other ranks follow rank 0's stop decision (broadcast by train)
        return metrics

    def _validate_set(self, v: ValidSet) -> dict:
        stats = StepStats()
        with analysis.collecting() as analysis_stats:  # attention entropy, gate means …
            for idx in ordered_batches(v.examples, self.cfg.train.batch_tokens):
                batch = collate([v.examples[i] for i in idx], idx).to(self.ctx.device)
                with self._autocast():
                    _, s = self._losses(batch, training=False)
                stats.add(s)
        stats.add(analysis_stats)
        metrics = summarize(stats.values)
        if self.cfg.train.valid_bleu and v.docs:
            metrics["bleu"] = self.valid_bleu(v)
        return metrics

    def valid_bleu(self, v: ValidSet) -> float:
        """Sentence-level BLEU of a validation set translated (in context, for a document set) by the current model."""
        opts = translator_options(self.cfg.translate, beam=self.cfg.train.valid_beam, n_best=1)
        translator = Translator(self.model, self.codec, self.cfg, opts, self.ctx.device)
        hyps = translator.translate_documents([[s for s, _ in d] for d in v.docs])
        refs = [[t for _, t in d] for d in v.docs]
        return report(hyps, refs, v.documents)["bleu"]


def step_checkpoints(ckpt_dir: str) -> list[str]:
    """The folder's ``step_N.pt`` files, oldest first."""
    paths = glob.glob(os.path.join(ckpt_dir, "step_*.pt"))
    return sorted((p for p in paths if re.search(r"step_\d+\.pt$", p)), key=_step_of)


def _step_of(path: str) -> int:
    """N of ``step_N.pt``."""
    return int(re.search(r"step_(\d+)\.pt$", path).group(1))


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


def train(cfg: Config, config_path: Optional[str] = None) -> dict:
    """Train from a resolved config (single process, or one torchrun rank): lock the run folder,
    clear leftovers of interrupted saves, train; SIGTERM/SIGINT stop with a checkpoint.
    ``config_path``: the file the config was read from, which training never writes over."""
    ctx = distributed.init_distributed(cfg.train.device)
    lock = None
    try:
        with StopRequest() as stop_request:
            lock = lock_run_dir(cfg.log.dir, ctx)
            if ctx.main:
                freed = remove_partial_files(
                    cfg.log.dir, None if cfg.data.cache_dir else os.path.join(cfg.log.dir, "cache")
                )
                if freed:
                    log.info("removed leftovers of interrupted saves in %s (%.1f MB)", cfg.log.dir, freed / 1e6)
            set_threads(cfg, ctx)
            result = Trainer(cfg, ctx, config_path).train(stop_request)
            # every rank waits for rank 0's last checkpoint before the process group is torn down: a
            # rank that tears down early can abort in Gloo's teardown ("terminate called without an
            # active exception", seen once in CI in the two-process resume test)
            distributed.barrier(ctx)
            return result
    finally:
        if lock:
            lock.release()
        distributed.shutdown(ctx)
