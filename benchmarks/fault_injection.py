#!/usr/bin/env python
"""Fault injection: SIGKILL a training at random moments (many inside checkpoint writes), resume
each time, and check what the run folder promises (docs/getting_started.md#run-folders-and-resume).

  OMP_NUM_THREADS=1 python benchmarks/fault_injection.py [--kills 60] [--per-trial 5] [--sigterms 10]
                                                         [--out runs/fault_injection] [--seed 1]

A tiny Transformer (d_model 32, 1+1 layers, dropout on) trains 40 steps on a small toy corpus,
saving every 3 steps (keep_last 2) and validating every 10 (best.pt). First one uninterrupted
reference run keeps every step_N.pt. Then each trial starts the same training in its own run
folder and kills it ``--per-trial`` times, resuming after each kill, then lets it finish. A kill
is at the instant a ``*.tmp<pid>`` file (a checkpoint being written) appears in ``checkpoints/``
(half of them), at a uniformly random moment of the training phase (four in ten), or of the
process's whole life, start-up included (one in ten). After every kill:

* ``last.pt`` must load (``load_checkpoint``: its CRC-32s checked, then ``torch.load(weights_only=True)``):
  counted as unreadable otherwise;
* every ``step_N.pt`` and ``best.pt`` must load the same way, and every ``step_N.pt`` equal the
  reference's of the same step;
* a start that finds no ``last.pt`` (a kill between the first ``step_N.pt`` and its copy) must resume
  from the ``step_N.pt`` (counted), not start again at step 0;
* ``last.pt`` must equal the reference's ``step_N.pt`` of the same step (weights, optimizer
  state, data position, RNG): a resume that deviated shows up at the next kill;
* orphans (``*.tmp*`` files, and ``step_N.pt`` beyond keep_last) are measured before the next
  start, which must remove them.

At the end every trial's final ``last.pt`` is compared with the reference's, and orphaned bytes are
counted again (goal 0). ``--sigterms`` more runs get SIGTERM at a random moment: the process must
exit 143 with ``last.pt`` at the step it reached (no step lost), and its resume must end equal to
the reference. Results: a Markdown table on stdout
and ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import torch
from common import REPO, thread_env, write_json

from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import load_checkpoint
from onmt_doc.toy.corpus import write_corpus
from onmt_doc.train.run_folder import PARTIAL

MAX_STEPS, SAVE_EVERY, KEEP_LAST = 40, 3, 2


def write_config(path: str, data: str, run_dir: str, keep_last: int = KEEP_LAST) -> str:
    import yaml

    cfg = {
        "data": {
            "train": {"src": f"{data}/train.src", "tgt": f"{data}/train.tgt"},
            "valid": {"src": f"{data}/valid.src", "tgt": f"{data}/valid.tgt"},
        },
        "vocab": {"subword": "bpe", "size": 200},
        "model": {
            "d_model": 32,
            "dropout": 0.1,
            "attention_dropout": 0.1,
            "encoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 64},
            "decoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 64},
        },
        "optim": {"type": "adam", "lr": 2.0e-3, "schedule": {"type": "inverse_sqrt", "warmup": 10}},
        "train": {
            "batch_tokens": 300,
            "max_steps": MAX_STEPS,
            "save_every": SAVE_EVERY,
            "keep_last": keep_last,
            "valid_every": 10,
            "valid_bleu": False,
            "threads": 1,
            "seed": 1,
        },
        "log": {"dir": run_dir, "tensorboard": False, "every": 1},
    }
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f)
    return path


def start(config: str, log_path: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "onmt_doc.bin.train", "-config", config],
        stdout=subprocess.DEVNULL,
        stderr=open(log_path, "w"),
        env=thread_env(1),
        cwd=REPO,
    )


def partial_files(run_dir: str) -> list[str]:
    out = []
    for root, _, files in os.walk(run_dir):
        out += [os.path.join(root, f) for f in files if PARTIAL.search(f)]
    return out


def orphan_bytes(run_dir: str) -> int:
    """Bytes of files a finished run folder should not hold: partial saves and surplus step_N.pt."""
    ckpts = os.path.join(run_dir, "checkpoints")
    steps = (
        sorted((f for f in os.listdir(ckpts) if re.fullmatch(r"step_\d+\.pt", f)), key=lambda f: int(f[5:-3]))
        if os.path.isdir(ckpts)
        else []
    )
    extra = [os.path.join(ckpts, f) for f in steps[:-KEEP_LAST]] + partial_files(run_dir)
    return sum(os.path.getsize(p) for p in extra if os.path.exists(p))


def same_state(a: dict, b: dict) -> bool:
    """Weights, optimizer state, step, data position and RNG states equal (bit for bit)."""

    def eq(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(eq(u, v) for u, v in zip(x, y))
        return x == y

    sa, sb = a["train_state"], b["train_state"]
    return (
        a["step"] == b["step"]
        and eq(a["model"], b["model"])
        and eq(sa["optimizer"], sb["optimizer"])
        and sa["sampler"] == sb["sampler"]
        and eq(sa["rng"], sb["rng"])
        and sa["early_stopping"] == sb["early_stopping"]
    )


def kill_at_save(proc: subprocess.Popen, ckpts: str, rng: random.Random, deadline: float) -> bool:
    """SIGKILL the instant the n-th partial file shows up in ``ckpts`` (n random in 1..4);
    False when the process ended or the deadline passed first."""
    target, seen_names = rng.randint(1, 4), set()
    while proc.poll() is None and time.time() < deadline:
        try:
            names = [e.name for e in os.scandir(ckpts) if PARTIAL.search(e.name)]
        except FileNotFoundError:
            names = []
        if names:
            seen_names.update(names)
            if len(seen_names) >= target:
                proc.send_signal(signal.SIGKILL)
                return True
        time.sleep(0.0002)
    return False


def where(log_path: str, run_dir: str) -> str:
    text = open(log_path, encoding="utf-8", errors="replace").read()
    if partial_files(os.path.join(run_dir, "checkpoints")):
        return "checkpoint write"
    return "training" if "model:" in text else "start-up"


def wait_for_training(proc: subprocess.Popen, log_path: str) -> None:
    """Until the process has finished its start-up (imports, data, model, resume)."""
    while proc.poll() is None and "model:" not in open(log_path, errors="replace").read():
        time.sleep(0.005)


def check_step_checkpoints(ckpts: str, ref_dir: str, what: str, results: dict) -> None:
    """Every ``step_N.pt`` and ``best.pt`` left after a kill must pass ``load_checkpoint`` (its
    CRC-32 check included) and every ``step_N.pt`` equal the reference's of the same step."""
    names = [n for n in os.listdir(ckpts) if re.fullmatch(r"step_\d+\.pt|best\.pt", n)] if os.path.isdir(ckpts) else []
    for name in names:
        try:
            ckpt = load_checkpoint(os.path.join(ckpts, name))
        except UserError as e:
            results["corrupt_checkpoints"].append(f"{what}: {e}")
            continue
        results["checkpoints_verified"] += 1
        if name != "best.pt" and not same_state(ckpt, load_checkpoint(os.path.join(ref_dir, "checkpoints", name))):
            results["differing_step_checkpoints"].append(f"{what}: {name}")


def resumed_without_last(log_path: str) -> bool:
    """Whether this start found no ``last.pt`` and resumed from a ``step_N.pt`` (a kill between
    the first ``step_N.pt`` and its ``last.pt`` copy): it used to start again at step 0."""
    return "last.pt is missing: resuming from" in open(log_path, encoding="utf-8", errors="replace").read()


def trial(
    index: int,
    args,
    data: str,
    ref_dir: str,
    ref_seconds: float,
    train_seconds: float,
    rng: random.Random,
    results: dict,
) -> None:
    run_dir = os.path.join(args.out, f"trial_{index:02d}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    for name in ("subword.model", "vocab.txt"):  # the trials start from the reference vocabulary
        shutil.copy(os.path.join(ref_dir, name), run_dir)
    shutil.copytree(os.path.join(ref_dir, "cache"), os.path.join(run_dir, "cache"))
    config = write_config(os.path.join(args.out, f"trial_{index:02d}.yaml"), data, run_dir)
    ckpts = os.path.join(run_dir, "checkpoints")
    for k in range(args.per_trial):
        log_path = os.path.join(run_dir, f"process_{k}.log")
        proc = start(config, log_path)
        draw = rng.random()
        if draw < 0.5:  # the instant a checkpoint file is being written
            killed = kill_at_save(proc, ckpts, rng, time.time() + 3 * ref_seconds)
        else:  # a random moment of the training phase, or (1 in 5) of the whole life
            if draw < 0.9:
                wait_for_training(proc, log_path)
            time.sleep(rng.uniform(0.0, train_seconds if draw < 0.9 else ref_seconds))
            killed = proc.poll() is None
            if killed:
                proc.send_signal(signal.SIGKILL)
        place = where(log_path, run_dir) if killed else "not killed (finished first)"
        proc.wait()
        results["resumed_without_last"] += resumed_without_last(log_path)
        if not killed:
            results["finished_before_kill"] += 1
            break
        results["kills"] += 1
        results["where"][place] = results["where"].get(place, 0) + 1
        results["orphan_bytes_after_kill_max"] = max(results["orphan_bytes_after_kill_max"], orphan_bytes(run_dir))
        check_step_checkpoints(ckpts, ref_dir, f"trial {index} kill {k} ({place})", results)
        last = os.path.join(ckpts, "last.pt")
        if not os.path.exists(last):
            continue
        try:
            ckpt = load_checkpoint(last)
        except UserError:
            results["unreadable_last"] += 1
            continue
        ref = load_checkpoint(os.path.join(ref_dir, "checkpoints", f"step_{ckpt['step']}.pt"))
        results["checked_after_kill"] += 1
        if not same_state(ckpt, ref):
            results["differed_after_kill"].append(f"trial {index} kill {k} ({place}) step {ckpt['step']}")
    final_log = os.path.join(run_dir, "process_final.log")
    rc = start(config, final_log).wait()
    results["resumed_without_last"] += resumed_without_last(final_log)
    if rc != 0:
        results["final_failures"].append(f"trial {index}: exit {rc}: {open(final_log).read()[-300:]}")
        return
    final = load_checkpoint(os.path.join(ckpts, "last.pt"))
    ref = load_checkpoint(os.path.join(ref_dir, "checkpoints", "last.pt"))
    results["trials"] += 1
    if not same_state(final, ref):
        results["final_differed"].append(f"trial {index}")
    results["orphan_bytes_at_end"] += orphan_bytes(run_dir)


def sigterm_run(
    index: int, args, data: str, ref_dir: str, ref_seconds: float, rng: random.Random, results: dict
) -> None:
    run_dir = os.path.join(args.out, f"sigterm_{index:02d}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    for name in ("subword.model", "vocab.txt"):
        shutil.copy(os.path.join(ref_dir, name), run_dir)
    shutil.copytree(os.path.join(ref_dir, "cache"), os.path.join(run_dir, "cache"))
    config = write_config(os.path.join(args.out, f"sigterm_{index:02d}.yaml"), data, run_dir)
    log_path = os.path.join(run_dir, "process.log")
    proc = start(config, log_path)
    # after start-up (the first step line) so the signal lands in training
    while proc.poll() is None and " step " not in open(log_path, errors="replace").read():
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.5))
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait()
    text = open(log_path, errors="replace").read()
    steps = [int(m) for m in re.findall(r" step (\d+)/", text)]
    last = load_checkpoint(os.path.join(run_dir, "checkpoints", "last.pt"))
    results["sigterm_runs"] += 1
    if rc == 0:
        results["sigterm_finished_first"] += 1
    elif rc != 128 + signal.SIGTERM:
        results["sigterm_bad_exit"].append(f"run {index}: exit {rc}")
    lost = max(steps or [0]) - last["step"]
    results["sigterm_steps_lost"] += max(0, lost)
    if start(config, os.path.join(run_dir, "process_final.log")).wait() != 0:  # resume to the end
        results["sigterm_differed"].append(f"run {index}: the resume failed")
        return
    final = load_checkpoint(os.path.join(run_dir, "checkpoints", "last.pt"))
    if not same_state(final, load_checkpoint(os.path.join(ref_dir, "checkpoints", "last.pt"))):
        results["sigterm_differed"].append(f"run {index} stopped at step {last['step']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=60, help="SIGKILLs in all (at least)")
    p.add_argument("--per-trial", type=int, default=5, help="kills per trial before it may finish")
    p.add_argument("--sigterms", type=int, default=10)
    p.add_argument("--out", default=os.path.join(REPO, "runs", "fault_injection"))
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    data = os.path.join(args.out, "data")
    write_corpus(data, seed=1, train_docs=150, valid_docs=10, test_docs=1)
    ref_dir = os.path.join(args.out, "reference")
    shutil.rmtree(ref_dir, ignore_errors=True)
    config = write_config(os.path.join(args.out, "reference.yaml"), data, ref_dir, keep_last=1000)
    assert start(config, os.path.join(args.out, "reference.log")).wait() == 0, "reference run failed"
    shutil.rmtree(os.path.join(ref_dir, "checkpoints"))  # again, timed, with vocabulary and cache
    t0 = time.time()
    proc = start(config, os.path.join(args.out, "reference.log"))
    wait_for_training(proc, os.path.join(args.out, "reference.log"))
    t1 = time.time()
    assert proc.wait() == 0, "reference run failed"
    ref_seconds, train_seconds = time.time() - t0, time.time() - t1
    results = {
        "kills": 0,
        "where": {},
        "unreadable_last": 0,
        "checked_after_kill": 0,
        "checkpoints_verified": 0,
        "corrupt_checkpoints": [],
        "differing_step_checkpoints": [],
        "resumed_without_last": 0,
        "differed_after_kill": [],
        "finished_before_kill": 0,
        "trials": 0,
        "final_differed": [],
        "final_failures": [],
        "orphan_bytes_after_kill_max": 0,
        "orphan_bytes_at_end": 0,
        "reference_seconds": round(ref_seconds, 2),
        "reference_training_seconds": round(train_seconds, 2),
        "sigterm_runs": 0,
        "sigterm_finished_first": 0,
        "sigterm_bad_exit": [],
        "sigterm_steps_lost": 0,
        "sigterm_differed": [],
    }
    start_time, index = time.time(), 0
    while results["kills"] < args.kills:
        trial(index, args, data, ref_dir, ref_seconds, train_seconds, rng, results)
        index += 1
        print(f"trial {index}: {results['kills']} kills so far, {time.time() - start_time:.0f}s", file=sys.stderr)
    for i in range(args.sigterms):
        sigterm_run(i, args, data, ref_dir, ref_seconds, rng, results)
    results["seconds"] = round(time.time() - start_time, 1)
    write_json(os.path.join(args.out, "results.json"), results)
    r = results
    print(
        f"| SIGKILLs (resumed after each) | {r['kills']} in {r['trials']} trials; where: "
        + ", ".join(f"{k} {v}" for k, v in sorted(r["where"].items()))
        + " |"
    )
    print(f"| unreadable `last.pt` after a kill | {r['unreadable_last']} |")
    print(
        f"| `last.pt` after a kill differing from the reference's `step_N.pt` | {len(r['differed_after_kill'])} "
        f"of {r['checked_after_kill']} |"
    )
    print(
        f"| `step_N.pt`/`best.pt` after a kill failing the CRC check / `step_N.pt` differing from the reference | "
        f"{len(r['corrupt_checkpoints'])} / {len(r['differing_step_checkpoints'])} of {r['checkpoints_verified']} |"
    )
    print(f"| starts that found no `last.pt` and resumed from a `step_N.pt` | {r['resumed_without_last']} |")
    print(f"| final state differing from the uninterrupted run | {len(r['final_differed'])} of {r['trials']} |")
    print(f"| resumes that failed | {len(r['final_failures'])} |")
    print(
        "| largest orphaned bytes right after a kill (removed by the next start) | "
        f"{r['orphan_bytes_after_kill_max']} |"
    )
    print(f"| orphaned bytes in all run folders at the end | {r['orphan_bytes_at_end']} |")
    print(
        f"| SIGTERMs: exit 143, steps lost, differing | {r['sigterm_runs'] - r['sigterm_finished_first']} stopped "
        f"({r['sigterm_finished_first']} finished first), {len(r['sigterm_bad_exit'])} bad exits, "
        f"{r['sigterm_steps_lost']} steps lost, {len(r['sigterm_differed'])} differing |"
    )
    print(
        f"| wall time | {r['seconds']} s (reference run {r['reference_seconds']} s, of which training "
        f"{r['reference_training_seconds']} s) |"
    )


if __name__ == "__main__":
    main()
