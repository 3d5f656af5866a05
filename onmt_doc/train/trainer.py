"""The one training loop for every model: gradient accumulation, clipping, mixed precision on GPUs,
validation, early stopping and when to save. Loss sums are divided by the number of target tokens
of the whole optimizer step (all accumulated batches on all ranks), so N processes give the same
update as one process with N times the accumulation.

The loop is handed its parts (``run_builder.RunParts``; ``Trainer(cfg, ctx)`` builds them with
``build_run``), leaves checkpoint files and resume to ``checkpointing.py``, and gets validation
metrics beyond the losses (BLEU) as callables, so it imports neither translation nor evaluation.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from typing import Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from onmt_doc import devices
from onmt_doc.config import Config, config_to_dict
from onmt_doc.contracts import Batch
from onmt_doc.data.batching import collate, ordered_batches
from onmt_doc.modules import analysis
from onmt_doc.train import checkpointing, distributed
from onmt_doc.train.checkpointing import Checkpointer
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.hardware import autocast, set_threads
from onmt_doc.train.interrupt import Interrupted, StopRequest
from onmt_doc.train.prefetch import Prefetcher
from onmt_doc.train.progress import EarlyStopping, Progress, StepStats
from onmt_doc.train.reporting import Reporter, summarize
from onmt_doc.train.run_builder import RunParts, ValidSet, build_run, run_summary
from onmt_doc.train.run_folder import lock_run_dir, remove_leftovers, save_resolved_config

log = logging.getLogger("onmt_doc")


class Trainer:
    """One training run: the loop over its parts, validation and when to save; everything an exact
    resume needs goes into each checkpoint (``checkpointing.Resumable``)."""

    def __init__(
        self, cfg: Config, ctx: DistContext, config_path: Optional[str] = None, parts: Optional[RunParts] = None
    ) -> None:
        """``config_path``: the user's ``-config`` file, never written over (``config.yaml``);
        ``parts``: already-built parts (default: :func:`build_run` of ``cfg``). Resumes from the
        run folder's checkpoints when ``train.resume``."""
        self.cfg, self.ctx, self.config_path = cfg, ctx, config_path
        self.run_dir = cfg.log.dir
        self.ckpt_dir = os.path.join(self.run_dir, "checkpoints")
        self.parts = parts = parts if parts is not None else build_run(cfg, ctx)
        self.codec, self.model, self.losses, self.optimizer = parts.codec, parts.model, parts.losses, parts.optimizer
        self.schedule, self.amp_dtype, self.scaler = parts.schedule, parts.amp_dtype, parts.scaler
        self.train_examples, self.mix, self.sampler = parts.train_examples, parts.mix, parts.sampler
        self.valid_sets, self.metrics = parts.valid_sets, parts.metrics
        self.valid_examples = [e for v in self.valid_sets for e in v.examples]
        self.best_on = cfg.train.best_on or (self.valid_sets[0].name if self.valid_sets else None)
        self.progress = Progress(EarlyStopping(cfg.train.early_stopping_metric, cfg.train.early_stopping))
        self.early = self.progress.early  # restored in place by a resume
        self.state = parts.resumable(cfg.optim.type, self.progress)  # what checkpoints save and resume restores
        self.checkpoints = Checkpointer(self.ckpt_dir, cfg.train.keep_last)
        if cfg.train.resume:
            checkpointing.resume_from(self.ckpt_dir, self.state, config_to_dict(cfg), cfg.train.resume_data, ctx)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(self.model, device_ids=device_ids) if ctx.enabled else None
        self.forward_module = devices.compiled(self.ddp or self.model, cfg.train.compile, ctx.device, "train.compile")
        log.info(run_summary(cfg, parts, ctx))

    @property
    def step(self) -> int:
        """Optimizer steps done."""
        return self.progress.step

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        """``step_N.pt`` and its ``last.pt`` copy: every rank takes part (RNG states), rank 0 writes."""
        payload = checkpointing.payload(config_to_dict(self.cfg), self.state, self.ctx)
        if self.ctx.main:
            self.checkpoints.save(payload, self.step)
            self.progress.saved_step = self.step

    def save_best(self) -> None:
        """``best.pt`` (rank 0): weights only, for translation and averaging."""
        if self.ctx.main:
            payload = checkpointing.payload(config_to_dict(self.cfg), self.state, self.ctx, with_train_state=False)
            self.checkpoints.save_best(payload)

    # ------------------------------------------------------------------ one step
    def _losses(self, batch: Batch, training: bool) -> tuple[torch.Tensor, dict]:
        """The weighted sum of the losses (training-only ones skipped in validation) and their summed
        statistics, plus in validation the analysis sums a part reports (attention entropy, gate means)."""
        out = self.forward_module(batch) if training else self.model(batch)
        total, stats = None, {}
        for loss in self.losses:
            if loss.training_only and not training:
                continue
            value, s = loss(out, batch)
            total = loss.weight * value if total is None else total + loss.weight * value
            stats.update(s)
        stats["loss"] = total.detach()  # read at log time (StepStats), not here
        if not training:
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
            if self.cfg.train.compile == "graphs":  # the last step's graph outputs are no longer read
                torch.compiler.cudagraph_mark_step_begin()
            sync = self.ddp is None or i == len(batches) - 1
            with contextlib.nullcontext() if sync else self.ddp.no_sync(), autocast(self.ctx.device, self.amp_dtype):
                total, s = self._losses(batch, training=True)
                loss = total * scale
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            stats.add(s)
        stats.add({"words": float(sum(b.n_tgt_words for b in batches))})  # target text without markup
        stats.values["grad_norm"] = self._update()
        return stats.values

    def _update(self) -> torch.Tensor:
        """Clip, set every group's lr (optim.lr x lr_scale x schedule), step; the norm before clipping
        (a tensor: read when a progress line is written)."""
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.train.max_grad_norm or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm).detach()
        factor = self.schedule.factor(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.optim.lr * group["lr_scale"] * factor
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.step += 1
        return grad_norm

    # ------------------------------------------------------------------ the loop
    def train(self, stop_request: Optional[StopRequest] = None) -> dict:
        """Train to train.max_steps (or max_epochs, or early stopping). With ``stop_request``, a
        signal ends training at the next step boundary with a checkpoint (raises Interrupted)."""
        cfg, p, early = self.cfg.train, self.progress, self.early
        if self.ctx.main:
            os.makedirs(self.ckpt_dir, exist_ok=True)
            save_resolved_config(self.cfg, self.run_dir, self.config_path)
            if p.saved_step is not None:  # resumed: the sweep a killed save did not finish
                self.checkpoints.prune(p.step)
        self.started = time.time()  # train.max_minutes counts from here
        stop = end = self._at_end()
        if end or early.stop:
            self._say_finished()
            return {}
        reporter = Reporter(self.run_dir, self.cfg.log, cfg.max_steps, p.step, self.ctx.main)
        # on a GPU the next batches are collated, planned and pinned in a thread while the device computes
        prepare = functools.partial(self.model.prepare, device=self.ctx.device)
        on_gpu = self.ctx.device.type == "cuda"
        batches = Prefetcher(self.sampler, prepare=prepare) if on_gpu else map(prepare, iter(self.sampler))
        epochs_logged = self.sampler.completed_epochs()
        last_metrics: dict = {}
        try:
            while not (end or stop):
                if stop_request and distributed.any_flag(stop_request.requested, self.ctx):
                    self._stop_on_signal(stop_request.signum)
                t0 = time.time()
                values = self.train_step([next(batches) for _ in range(cfg.accum)])
                grad_norm = values.pop("grad_norm")
                p.pending.add(values)
                p.pending.seconds += time.time() - t0
                while epochs_logged < self.sampler.completed_epochs():  # per-corpus examples of each epoch
                    reporter.epoch(p.step, epochs_logged, self.sampler.epoch_counts(epochs_logged))
                    epochs_logged += 1
                end = self._at_end()
                if p.step % self.cfg.log.every == 0 or end:
                    self._report(reporter, grad_norm)
                if self.valid_examples and (p.step % cfg.valid_every == 0 or end):
                    last_metrics = self.validate(reporter)
                    stop = distributed.broadcast_flag(early.stop, self.ctx)
                    if stop:
                        log.info(
                            "early stopping: no improvement of valid %s in %d validations", early.metric, early.patience
                        )
                if p.step % cfg.save_every == 0 or end or stop:
                    self.save()
        finally:
            if isinstance(batches, Prefetcher):
                batches.close()
            reporter.close()
        return last_metrics

    def _stop_on_signal(self, signum: Optional[int]) -> None:
        """Save once (unless this step is saved already) and raise Interrupted."""
        saved = self.progress.saved_step
        if saved != self.step:
            self.save()
            if self.ctx.main:
                log.warning(
                    "stopped at step %d: saved %s; run the same command to resume", self.step, self.checkpoints.last
                )
        elif self.ctx.main:
            since = "the start" if saved is None else f"step {saved}"
            log.warning("stopped at step %d: nothing new to save since %s", self.step, since)
        raise Interrupted(signum or signal.SIGTERM)  # another rank got the signal

    def _say_finished(self) -> None:
        """Why a run that is already at its end trains nothing (rank 0)."""
        if not self.ctx.main:
            return
        why = self.progress.finished_reason(self.cfg.train.max_steps, self.cfg.train.max_epochs)
        log.warning(
            "nothing to do: %s already finished at step %d (%s); raise that limit to train on, or use a new log.dir",
            self.run_dir,
            self.step,
            why,
        )

    def _at_end(self) -> bool:
        """True at train.max_steps, after train.max_epochs epochs or train.max_minutes."""
        if self.step >= self.cfg.train.max_steps:
            return True
        minutes = self.cfg.train.max_minutes
        # rank 0's clock decides for every rank: clocks started apart would end the ranks at different
        # steps, and a rank stepping on alone waits in DDP's gradient reduction for ever
        if minutes and distributed.broadcast_flag(time.time() - self.started >= 60 * minutes, self.ctx):
            log.info("reached train.max_minutes=%g at step %d", minutes, self.step)
            return True
        epochs = self.cfg.train.max_epochs
        if epochs and self.sampler.completed_epochs() >= epochs:
            log.info("reached train.max_epochs=%d", epochs)
            return True
        return False

    def _report(self, reporter: Reporter, grad_norm: torch.Tensor) -> None:
        """The statistics summed since the last line, over every rank: one progress line (the one
        place where the loop waits for the device's statistics)."""
        pending = self.progress.pending
        waited = time.time()
        values, norm = pending.floats(), float(grad_norm)  # waits for the device to finish the steps
        pending.seconds += time.time() - waited  # so the steps' time is the device's, not the launches'
        keys = sorted(values)
        totals = distributed.all_reduce_sum([values[k] for k in keys] + [pending.seconds], self.ctx)
        stats = dict(zip(keys, totals[:-1]))
        seconds = totals[-1] / self.ctx.world
        lr = self.optimizer.param_groups[0]["lr"]
        tok_per_s = stats.get("tokens", 0.0) / max(seconds, 1e-9)
        reporter.train(self.step, stats, lr, norm, tok_per_s, seconds)
        self.progress.pending = StepStats()

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self, reporter: Optional[Reporter] = None) -> dict:
        """The losses' metrics (loss, perplexity, accuracy) and the metrics handed in (BLEU) on every
        validation set, each reported on its own; the ``train.best_on`` set decides ``best.pt`` and
        early stopping. Returns that set's metrics, plus ``<set>/<metric>`` for every set when there
        are several. Rank 0 computes, all wait."""
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
            if reporter and self.parts.pictures and self.valid_sets:  # log.pictures: what the model reads
                reporter.images(self.step, self.parts.pictures(self.model, self.valid_sets[0]))
            if self.early.update(metrics["bleu" if self.early.metric == "bleu" else "loss"]):
                self.save_best()
        distributed.barrier(self.ctx)  # other ranks follow rank 0's stop decision (broadcast by train)
        return metrics

    def _validate_set(self, v: ValidSet) -> dict:
        """One set's summed loss statistics (and analysis sums) per token, then each metric's values."""
        stats = StepStats()
        with analysis.collecting() as analysis_stats:  # attention entropy, gate means …
            for idx in ordered_batches(v.examples, self.cfg.train.batch_tokens):
                batch = collate([v.examples[i] for i in idx], idx).to(self.ctx.device)
                with autocast(self.ctx.device, self.amp_dtype):
                    _, s = self._losses(batch, training=False)
                stats.add(s)
        stats.add(analysis_stats)
        metrics = summarize(stats.floats())
        for metric in self.metrics:
            metrics.update(metric(self.model, v))
        return metrics


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
                remove_leftovers(cfg.log.dir, own_cache=not cfg.data.cache_dir)
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
