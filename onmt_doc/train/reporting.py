"""Console progress lines and TensorBoard scalars (rank 0 only).

TensorBoard tags: train/{loss,ppl,acc,lr,tok_per_s,grad_norm}, valid/{loss,ppl,acc,bleu} (with
several validation sets valid/<name>/{...}), epoch/examples/<corpus> (examples per epoch), plus
whatever a loss or model adds under its own prefix (valid/entropy/*, valid/gate/* from
:mod:`onmt_doc.modules.analysis`); with ``log.pictures``, images pictures/doc<k>/<picture> of
what the model reads from context. A resumed run purges events after the
checkpoint's step, so the curves continue as one run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from typing import Optional

import torch

from onmt_doc.config.train import LogConfig
from onmt_doc.modules.analysis import COUNT_SUFFIX

log = logging.getLogger("onmt_doc")


def setup_logging(rank: int = 0, level: int = logging.INFO) -> None:
    """Log ``onmt_doc`` messages to stderr: timestamped on rank 0, warnings only (tagged with the
    rank) on the others, so a multi-process run prints one progress stream."""
    handler = logging.StreamHandler(sys.stderr)
    fmt = "[%(asctime)s %(levelname)s] %(message)s" if rank == 0 else f"[rank {rank} %(levelname)s] %(message)s"
    handler.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
    root = logging.getLogger("onmt_doc")
    root.handlers[:] = [handler]
    root.setLevel(level if rank == 0 else logging.WARNING)
    root.propagate = False


def _hms(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def summarize(stats: dict) -> dict:
    """Per-token loss, perplexity and accuracy from summed statistics."""
    tokens = max(stats.get("tokens", 0.0), 1.0)
    out = {"loss": stats.get("loss", 0.0) / tokens}
    if "nll" in stats:
        out["ppl"] = math.exp(min(stats["nll"] / tokens, 50.0))
    if "correct" in stats:
        out["acc"] = 100.0 * stats["correct"] / tokens
    for key, value in stats.items():
        # namespaced statistics (e.g. "gate/hinge"): per target token, or per their own count
        if "/" in key and not key.endswith(COUNT_SUFFIX):
            out[key] = value / max(stats.get(key + COUNT_SUFFIX, tokens), 1e-9)
    return out


class Reporter:
    """Progress lines and TensorBoard scalars for one training run; a no-op on ranks other than 0."""

    def __init__(self, run_dir: str, log_cfg: LogConfig, max_steps: int, start_step: int, main: bool) -> None:
        """``start_step`` > 0 (a resume) purges TensorBoard events after it and bases the ETA on
        the steps done since."""
        self.main, self.max_steps = main, max_steps
        self.start_step, self.start_time = start_step, time.time()
        self.writer = None
        self.metrics = None
        if main and log_cfg.metrics_file:
            path = os.path.join(run_dir, log_cfg.metrics_file)  # an absolute path stays as it is
            self.metrics = open(path, "a", encoding="utf-8", buffering=1)  # line-buffered: readable mid-run
        if main and log_cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(
                os.path.join(run_dir, "tensorboard"), purge_step=start_step + 1 if start_step else None
            )

    def scalars(self, prefix: str, step: int, values: dict) -> None:
        """Write ``values`` as TensorBoard scalars ``<prefix>/<key>`` (no-op without TensorBoard)."""
        if self.writer:
            for key, value in values.items():
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def images(self, step: int, images: dict) -> None:
        """TensorBoard images ``pictures/<tag>`` ([H, W, 3] uint8 arrays; no-op without TensorBoard)."""
        if self.writer:
            for tag, image in images.items():
                self.writer.add_image(f"pictures/{tag}", image, step, dataformats="HWC")

    def record(self, event: str, step: int, values: dict) -> None:
        """One JSON line of ``log.metrics_file`` (no-op without one)."""
        if self.metrics:
            row = {"event": event, "step": step, "elapsed": round(time.time() - self.start_time, 3), **values}
            self.metrics.write(json.dumps(row, default=float) + "\n")

    def train(
        self, step: int, stats: dict, lr: float, grad_norm: float, tok_per_s: float, seconds: float = 0.0
    ) -> None:
        """One progress line and its TensorBoard scalars, from summed ``stats`` (:func:`summarize`);
        ``seconds``: the training time those statistics took."""
        if not self.main:
            return
        m = summarize(stats)
        self.scalars("train", step, {**m, "lr": lr, "grad_norm": grad_norm, "tok_per_s": tok_per_s})
        memory = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
        self.record(
            "train",
            step,
            {
                **m,
                "tokens": stats.get("tokens", 0.0),
                "words": stats.get("words", 0.0),  # of the tokens, the target text (no markup)
                "seconds": seconds,
                "lr": lr,
                "grad_norm": grad_norm,
                "tok_per_s": tok_per_s,
                "max_memory_mib": memory,
            },
        )
        elapsed = time.time() - self.start_time
        done = step - self.start_step
        eta = elapsed / done * (self.max_steps - step) if done else 0.0
        parts = [f"step {step}/{self.max_steps}", f"loss {m['loss']:.3f}"]
        if "ppl" in m:
            parts.append(f"ppl {m['ppl']:.2f}")
        if "acc" in m:
            parts.append(f"acc {m['acc']:.1f}%")
        parts += [
            f"lr {lr:.2e}",
            f"gnorm {grad_norm:.2f}",
            f"{tok_per_s:.0f} tgt tok/s",
            f"elapsed {_hms(elapsed)}",
            f"eta {_hms(eta)}",
        ]
        log.info(" | ".join(parts))

    def valid(self, step: int, metrics: dict, name: Optional[str] = None) -> None:
        """One validation set's metrics: ``valid/*``, or ``valid/<name>/*`` when there are several sets."""
        if not self.main:
            return
        self.scalars(f"valid/{name}" if name else "valid", step, metrics)
        self.record("valid", step, {"set": name, **metrics})
        log.info(
            "validation at step %d%s: %s",
            step,
            f" on {name}" if name else "",
            " | ".join(f"{k} {_shown(v)}" for k, v in metrics.items()),
        )

    def epoch(self, step: int, epoch: int, counts: dict) -> None:
        """Examples each training corpus gave to a finished epoch (``epoch/examples/<corpus>``)."""
        if not self.main:
            return
        self.scalars("epoch/examples", step, {k: float(v) for k, v in counts.items()})
        log.info(
            "epoch %d done at step %d: %s examples",
            epoch + 1,
            step,
            ", ".join(f"{name} {n}" for name, n in counts.items()),
        )

    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self.writer:
            self.writer.flush()
            self.writer.close()
        if self.metrics:
            self.metrics.close()


def _shown(value: object) -> str:
    """A metric for the console: two decimals, four below 0.1 (CXMI is a few hundredths of a nat)."""
    if not isinstance(value, float):
        return str(value)
    return f"{value:.4f}" if 0 < abs(value) < 0.1 else f"{value:.2f}"
