"""Guards of a run folder (``log.dir``): one training at a time, no leftovers of interrupted saves,
and the fingerprint that says what a checkpoint's data position means.

* The lock is ``fcntl.flock`` on ``<log.dir>/.lock``: the kernel drops it when its process ends,
  however it ends (SIGKILL included), so a crashed training never blocks the next one. The file
  stays (it is reused); its text names the holder for the error a second training gets.
* An interrupted save leaves a temporary file beside its target: ``.<name>.tmp<pid>`` from
  ``onmt_doc.outputs.output_file`` (checkpoints, the data cache), ``<name>.tmp<pid>`` from
  ``save_config`` and older versions; with the lock held nothing else can be writing them, so
  every such file in the run folder is an orphan.
* ``config.yaml`` is the resolved config (every key), except when it is the very file the user
  gave as ``-config``: training never writes over its own input.
* A checkpoint's data position ("epoch e, batch b") is an index into a batch list that is a pure
  function of the training examples, ``train.batch_tokens``, ``train.seed`` and the number of
  processes. The fingerprint stores those, so a resume with any of them changed is refused
  instead of continuing at "batch b" of another list.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import sys
from typing import Optional, Sequence

import numpy as np

from onmt_doc.config import Config, save_config
from onmt_doc.data.batching import CorpusMix
from onmt_doc.data.instances import Example
from onmt_doc.data.mapped import IndexedExamples
from onmt_doc.errors import UserError
from onmt_doc.outputs import same_file
from onmt_doc.train import distributed
from onmt_doc.train.distributed import DistContext

log = logging.getLogger("onmt_doc")

LOCK_NAME = ".lock"
# the temporary files of writes before their rename, with or without the leading dot (see above)
PARTIAL = re.compile(r"\.tmp\d+(\.npz)?$")


def make_run_dir(run_dir: str) -> None:
    """Create ``log.dir`` (and ``checkpoints/``) or say in one line why it cannot be."""
    try:
        os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    except OSError as e:
        raise UserError(f"log.dir: {run_dir}: cannot create the run folder ({e.strerror or e})") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise UserError(f"log.dir: {run_dir}: the run folder is not writable")


class RunLock:
    """An exclusive lock on a run folder, held for the life of the training process."""

    def __init__(self, run_dir: str) -> None:
        """Nothing is locked until :meth:`acquire`."""
        self.path = os.path.join(run_dir, LOCK_NAME)
        self.fd: Optional[int] = None

    def acquire(self) -> None:
        """Take the lock, or raise a one-line UserError naming the training that holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"log.dir: {self.path}: cannot create the lock file ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip()
            os.close(fd)
            raise UserError(
                f"log.dir: {os.path.dirname(self.path)} is in use by another training "
                f"({_describe(holder)}); wait for it to end, stop it, or use another log.dir"
            ) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])[:200],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent); the lock file stays for the next holder."""
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays for the next holder
            self.fd = None


def _describe(holder: str) -> str:
    try:
        info = json.loads(holder)
        return f"pid {info['pid']} on {info['host']} since {info['since']}: {info['command']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown: it has just started"


def lock_run_dir(run_dir: str, ctx: DistContext) -> Optional[RunLock]:
    """Rank 0 creates and locks the run folder; every rank learns whether that worked, so under
    torchrun all processes stop with the error instead of waiting for rank 0."""
    lock, error = None, None
    if ctx.main:
        try:
            make_run_dir(run_dir)
            lock = RunLock(run_dir)
            lock.acquire()
        except UserError as e:
            lock, error = None, e
    if not distributed.broadcast_flag(error is None, ctx):
        raise error or UserError(f"log.dir: {run_dir}: rank 0 could not lock the run folder (see its error)")
    return lock


def remove_partial_files(run_dir: str, cache_dir: Optional[str] = None) -> int:
    """Delete the ``*.tmp<pid>`` leftovers of interrupted saves; return the bytes freed.
    Call only with the run folder locked."""
    freed = 0
    for folder in (run_dir, os.path.join(run_dir, "checkpoints"), cache_dir):
        if not folder or not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            if entry.is_file(follow_symlinks=False) and PARTIAL.search(entry.name):
                try:
                    size = entry.stat().st_size
                    os.remove(entry.path)
                    freed += size
                except FileNotFoundError:
                    pass
    return freed


def remove_leftovers(run_dir: str, own_cache: bool) -> None:
    """Rank 0 at start, with the run folder locked: delete what interrupted saves left in the run
    folder, its checkpoints and, when the cache is the run's own (``<log.dir>/cache``, not a
    ``data.cache_dir`` other runs may be writing), the cache; say how much that freed."""
    freed = remove_partial_files(run_dir, os.path.join(run_dir, "cache") if own_cache else None)
    if freed:
        log.info("removed leftovers of interrupted saves in %s (%.1f MB)", run_dir, freed / 1e6)


def save_resolved_config(cfg: Config, run_dir: str, config_path: Optional[str] = None) -> None:
    """``<run_dir>/config.yaml``: every key, defaults included; left alone when it is the user's own
    ``-config`` file (``config_path``: ``onmt_doc_train -config runs/x/config.yaml`` to continue a
    run), never written over: the resolved config is in every checkpoint anyway."""
    path = os.path.join(run_dir, "config.yaml")
    if config_path and os.path.exists(path) and same_file(config_path, path):
        log.info("%s is the -config file: left as it is (every checkpoint stores the resolved config)", path)
        return
    save_config(cfg, path)


# ----------------------------------------------------------------------------- data fingerprint

# keys whose change alters the examples (their effect is in the examples digest; named in errors)
DATA_KEYS = (
    "data.train.src",
    "data.train.tgt",
    "data.documents",
    "data.max_tokens",
    "data.max_sentences",
    "data.max_len",
)
# keys the batch list depends on besides the examples
ORDER_KEYS = ("train.batch_tokens", "train.seed", "processes")
# how ``context`` (HM-GDC) batches count the budget (data/batching.py); runs whose fingerprint lacks it
# were batched by rows x the longest row, so their data position means other batches
CONTEXT_BUDGET = "sum of real row lengths"


def examples_digest(examples: Sequence[Example]) -> str:
    """sha256 of the token ids and boundaries of every training example, in order (mapped
    instances compute the same digest chunk by chunk: ``IndexedExamples.digest``)."""
    if isinstance(examples, IndexedExamples):
        return examples.digest()
    h = hashlib.sha256()
    shape = [(len(e.src), -1 if e.tgt is None else len(e.tgt), e.rows) for e in examples]
    h.update(np.asarray(shape, dtype=np.int64).tobytes())
    for side in ("src", "tgt"):
        arrays = [getattr(e, side) for e in examples if getattr(e, side) is not None]
        if arrays:
            h.update(np.concatenate(arrays).astype(np.int64, copy=False).tobytes())
    sent_lens = [e.sent_lens for e in examples if e.sent_lens is not None]
    if sent_lens:
        h.update(np.concatenate(sent_lens).astype(np.int64, copy=False).tobytes())
    return h.hexdigest()


def _get(cfg: Config, key: str) -> object:
    node = cfg
    for name in key.split("."):
        node = getattr(node, name)
    return os.path.abspath(node) if key.startswith("data.train.") and node else node


def _data_keys(cfg: Config) -> dict:
    """DATA_KEYS' values; with several training corpora, each corpus' files and flag by name
    (``data.train.<name>.src`` …) instead of ``data.train.src``/``tgt``."""
    if not isinstance(cfg.data.train, dict):
        return {key: _get(cfg, key) for key in DATA_KEYS}
    keys = {key: _get(cfg, key) for key in DATA_KEYS if not key.startswith("data.train.")}
    for c in cfg.data.corpora("train"):
        where = f"data.train.{c.name}"
        keys.update({f"{where}.src": os.path.abspath(c.src), f"{where}.tgt": os.path.abspath(c.tgt)})
        keys[f"{where}.documents"] = c.documents
    return keys


def data_fingerprint(examples: Sequence[Example], cfg: Config, world: int, mix: Optional[CorpusMix] = None) -> dict:
    """What the data position of a checkpoint depends on (plain data, stored in train_state). With
    several corpora, their names, sizes and weights too (the weights change the batch order, not
    the examples); a single corpus' fingerprint is the same as before corpora existed."""
    values = {key: _get(cfg, key) for key in ORDER_KEYS if key != "processes"}
    out = {
        "examples": examples_digest(examples),
        "n_examples": len(examples),
        **values,
        "processes": world,
        "keys": _data_keys(cfg),
    }
    if mix is not None and len(mix.sizes) > 1:
        out["corpora"] = [[n, size, w] for n, size, w in zip(mix.names, mix.sizes, mix.weights)]
    if examples.has_rows if isinstance(examples, IndexedExamples) else any(e.sent_lens is not None for e in examples):
        out["batch_budget"] = CONTEXT_BUDGET
    return out


def fingerprint_changes(old: dict, new: dict) -> list[str]:
    """Human-readable differences that invalidate ``old``'s data position (empty: none)."""
    changes = [f"{k} {old.get(k)} -> {new[k]}" for k in ORDER_KEYS if old.get(k) != new[k]]
    if old.get("batch_budget") != new.get("batch_budget"):
        before = old.get("batch_budget", "rows x the longest row")
        changes.append(f"the batch budget of context windows ({before} -> {new.get('batch_budget')}; a newer onmt_doc)")
    if old.get("corpora") != new.get("corpora"):
        changes.append(f"the training corpora [name, examples, weight] {old.get('corpora')} -> {new.get('corpora')}")
    if old.get("examples") != new["examples"]:
        old_keys, new_keys = old.get("keys", {}), new["keys"]
        keys = [
            f"{k} {old_keys.get(k)} -> {new_keys.get(k)}"
            for k in list(new_keys) + [k for k in old_keys if k not in new_keys]
            if old_keys.get(k) != new_keys.get(k)
        ]
        changes += keys or [
            f"the training examples ({old.get('n_examples')} -> {new['n_examples']}; "
            f"contents of data.train.src/tgt or their tokenization)"
        ]
    return changes
