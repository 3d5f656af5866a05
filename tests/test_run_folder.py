"""Run folders: one training per log.dir, refused inexact resumes, finished runs, SIGTERM/SIGINT
saves, leftovers of interrupted saves, checkpoints that cannot be resumed, a missing last.pt, a
full disk, one-line errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import module_cmd, run_cli, tiny_config, write_config
from test_checkpoint import flip_tensor_byte
from test_cli import assert_one_line_error

from onmt_doc.config import config_from_dict
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.models.checkpoint import average_checkpoints, load_checkpoint, save_checkpoint
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.trainer import Trainer, train

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

TRAIN = module_cmd("onmt_doc.bin.train")


@pytest.fixture(scope="module")
def data(toy_dir, tmp_path_factory) -> Path:
    """The first 400 lines of the toy corpus: vocabularies learn in a blink, epochs are short."""
    out = tmp_path_factory.mktemp("rf_data")
    for ext in ("src", "tgt"):
        lines = (toy_dir / f"train.{ext}").read_text(encoding="utf-8").split("\n")[:400]
        (out / f"train.{ext}").write_text("\n".join(lines).strip("\n") + "\n", encoding="utf-8")
    return out


def config(toy_dir: Path, data: Path, run: Path, **train_keys) -> dict:
    c = tiny_config(
        toy_dir,
        run,
        train={
            "max_steps": 4,
            "save_every": 2,
            "valid_every": 2,
            "keep_last": 2,
            "batch_tokens": 400,
            "threads": 1,
            **train_keys,
        },
    )
    c["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
    return c


@pytest.fixture(scope="module")
def base_run(toy_dir, data, tmp_path_factory) -> Path:
    """A run folder finished at step 4 (checkpoints at steps 2 and 4, best.pt)."""
    run = tmp_path_factory.mktemp("rf_base") / "run"
    train(config_from_dict(config(toy_dir, data, run)))
    return run


@pytest.fixture()
def run(base_run, tmp_path) -> Path:
    """A private copy of the finished base run."""
    return Path(shutil.copytree(base_run, tmp_path / "run"))


def last_step(run: Path) -> int:
    return load_checkpoint(str(run / "checkpoints" / "last.pt"))["step"]


class Lines:
    """A process's stderr, read by a thread (so the pipe never fills), waitable line by line."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        self.thread.start()

    def wait_for(self, needle: str, timeout: float = 120.0) -> None:
        end = time.time() + timeout
        while not any(needle in line for line in self.lines):
            assert time.time() < end, f"no '{needle}' in {self.lines}"
            time.sleep(0.05)


def start_training(cfg: dict, tmp_path: Path) -> tuple[subprocess.Popen, Lines]:
    path = write_config(cfg, tmp_path / "holder.yaml")
    proc = subprocess.Popen(
        [*TRAIN, "-config", str(path)], stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    return proc, Lines(proc)


# ----------------------------------------------------------------------------- lock


def test_second_training_in_a_busy_run_folder_fails_naming_the_holder(toy_dir, data, run, tmp_path):
    """Two trainings in one log.dir used to mix silently; the lock also dies with its holder."""
    holder, lines = start_training(
        config(toy_dir, data, run, max_steps=100000, save_every=1, valid_every=100000), tmp_path
    )
    try:
        lines.wait_for("resumed from")  # the holder is past its start-up and training
        with pytest.raises(UserError, match=rf"in use by another training \(pid {holder.pid} on "):
            train(config_from_dict(config(toy_dir, data, run, max_steps=100)))
    finally:
        holder.kill()  # SIGKILL: no clean-up, the kernel drops the lock
        holder.wait()
    step = last_step(run)
    train(config_from_dict(config(toy_dir, data, run, max_steps=step + 1, save_every=1)))
    assert last_step(run) == step + 1


# ----------------------------------------------------------------------------- data position


def test_resume_refuses_changed_batching_or_data_and_names_the_way_out(toy_dir, data, run, tmp_path):
    with pytest.raises(
        UserError,
        match=r"train\.batch_tokens 400 -> 300.*train\.resume_data=next_epoch"
        r".*train\.init_from=",
    ):
        train(config_from_dict(config(toy_dir, data, run, max_steps=6, batch_tokens=300)))
    with pytest.raises(UserError, match=r"train\.seed 1 -> 2"):
        train(config_from_dict(config(toy_dir, data, run, max_steps=6, seed=2)))
    other = tmp_path / "other"
    other.mkdir()
    for ext in ("src", "tgt"):  # one sentence pair fewer (the last line of a document)
        lines = (data / f"train.{ext}").read_text(encoding="utf-8").split("\n")
        (other / f"train.{ext}").write_text("\n".join(lines[1:]), encoding="utf-8")
    cfg = config(toy_dir, data, run, max_steps=6)
    cfg["data"]["train"] = {"src": str(other / "train.src"), "tgt": str(other / "train.tgt")}
    with pytest.raises(UserError, match=r"data\.train\.src .*other/train\.src"):
        train(config_from_dict(cfg))
    assert last_step(run) == 4  # nothing was trained by the refused runs


def test_resume_data_next_epoch_accepts_a_new_batch_size(toy_dir, data, run):
    before = load_checkpoint(str(run / "checkpoints" / "last.pt"))["train_state"]["sampler"]
    assert before["position"] > 0
    train(config_from_dict(config(toy_dir, data, run, max_steps=5, batch_tokens=300, resume_data="next_epoch")))
    after = load_checkpoint(str(run / "checkpoints" / "last.pt"))
    assert after["step"] == 5
    assert after["train_state"]["sampler"] == {"epoch": before["epoch"] + 1, "position": 1, "seed": 1}
    assert after["train_state"]["data"]["train.batch_tokens"] == 300  # the new order is the reference now


def test_resume_with_changed_lr_continues_and_reports_it(toy_dir, data, run, warnings_of_onmt_doc):
    cfg = config(toy_dir, data, run, max_steps=5)
    cfg["optim"]["lr"] = 1.0e-3
    train(config_from_dict(cfg))
    assert last_step(run) == 5
    said = [r.getMessage() for r in warnings_of_onmt_doc.records if "differs from the checkpoint's" in r.getMessage()]
    assert len(said) == 1 and "optim.lr 0.002 -> 0.001" in said[0], said


# ----------------------------------------------------------------------------- finished run


def test_rerunning_a_finished_run_says_so(toy_dir, data, run, warnings_of_onmt_doc):
    mtime = (run / "checkpoints" / "last.pt").stat().st_mtime_ns
    train(config_from_dict(config(toy_dir, data, run)))
    said = [r.getMessage() for r in warnings_of_onmt_doc.records if "nothing to do" in r.getMessage()]
    assert len(said) == 1 and "already finished at step 4 (train.max_steps=4)" in said[0], said
    assert (run / "checkpoints" / "last.pt").stat().st_mtime_ns == mtime


# ----------------------------------------------------------------------------- signals


def test_sigterm_saves_once_at_the_next_step_boundary(toy_dir, data, run, tmp_path):
    cfg = config(toy_dir, data, run, max_steps=100000, save_every=100000, valid_every=100000)
    cfg["log"]["every"] = 1
    proc, lines = start_training(cfg, tmp_path)
    lines.wait_for("step 6/100000")  # training, two steps past the resumed step 4
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    lines.thread.join(10)
    err = "".join(lines.lines)
    assert "Traceback" not in err, err
    assert err.count("INFO] saved ") == 1 and "SIGTERM received" in err, err
    stopped = [line for line in lines.lines if "stopped at step" in line]
    assert len(stopped) == 1, err
    step = int(stopped[0].split("stopped at step ")[1].split(":")[0])
    assert step > 4 and last_step(run) == step
    assert (run / "checkpoints" / f"step_{step}.pt").exists()


def test_a_second_signal_stops_at_once_and_handlers_are_restored():
    from onmt_doc.train.interrupt import Interrupted, StopRequest

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as info:
        with StopRequest() as request:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs: a flag, no exception
            assert request.signum == signal.SIGINT
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # interrupted at once by the second signal
    assert info.value.exit_status == 130
    assert signal.getsignal(signal.SIGINT) is before


# ----------------------------------------------------------------------------- partial files


def test_leftovers_of_interrupted_saves_are_removed_at_start(toy_dir, data, run):
    leftovers = [
        run / "checkpoints" / "step_6.pt.tmp4242",
        run / "checkpoints" / ".last.pt.tmp4242",
        run / "config.yaml.tmp4242",
    ]
    for path in leftovers:
        path.write_bytes(b"\0" * 100_000)
    train(config_from_dict(config(toy_dir, data, run, max_steps=5, save_every=100)))
    assert not [p for p in leftovers if p.exists()]


def test_a_surplus_step_checkpoint_of_a_killed_final_save_is_removed_on_the_next_start(toy_dir, data, run):
    """A kill between the final save's last.pt copy and its keep_last sweep left one step_N.pt too
    many for good: every later start said "nothing to do" and never saved (fault_injection.py)."""
    ckpts = run / "checkpoints"
    step_2 = (ckpts / "step_2.pt").read_bytes()
    train(config_from_dict(config(toy_dir, data, run, max_steps=6)))
    (ckpts / "step_2.pt").write_bytes(step_2)  # what the killed sweep would have deleted
    train(config_from_dict(config(toy_dir, data, run, max_steps=6)))  # nothing to do
    assert sorted(p.name for p in ckpts.iterdir()) == ["best.pt", "last.pt", "step_4.pt", "step_6.pt"]


def test_leftovers_are_removed_by_the_keep_last_sweep(toy_dir, data, run):
    """A Trainer used without train() (no start-up clean-up) still sweeps at each save."""
    leftover = run / "checkpoints" / "step_6.pt.tmp4242"
    leftover.write_bytes(b"\0" * 100_000)
    Trainer(config_from_dict(config(toy_dir, data, run, max_steps=5, save_every=1)), DistContext()).train()
    assert not leftover.exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt", "step_4.pt", "step_5.pt"]


def test_the_sweep_leaves_another_commands_file_in_progress(toy_dir, data, run):
    """An average being written into checkpoints/ while the run trains (.avg.pt.tmp<pid>) is not a
    leftover of a killed save: the keep-last sweep used to delete it under the writer's feet."""
    other = run / "checkpoints" / ".avg.pt.tmp4242"
    other.write_bytes(b"\0" * 1000)
    Trainer(config_from_dict(config(toy_dir, data, run, max_steps=5, save_every=1)), DistContext()).train()
    assert other.exists()


# ----------------------------------------------------------------------------- unusable checkpoints


@pytest.mark.parametrize("kind", ["best", "averaged"])
def test_resume_from_a_checkpoint_without_training_state_is_one_line(toy_dir, data, run, kind):
    ckpts = run / "checkpoints"
    if kind == "best":
        shutil.copy(ckpts / "best.pt", ckpts / "last.pt")
    else:
        save_checkpoint(
            average_checkpoints([str(ckpts / "step_2.pt"), str(ckpts / "step_4.pt")]), str(ckpts / "last.pt")
        )
    with pytest.raises(UserError, match=r"last\.pt: has no training state .*train\.init_from="):
        train(config_from_dict(config(toy_dir, data, run, max_steps=6)))


def test_corrupt_last_names_the_intact_step_checkpoint(toy_dir, data, run):
    ckpts = run / "checkpoints"
    (ckpts / "step_4.pt").write_bytes((ckpts / "step_4.pt").read_bytes()[:1000])  # damaged too
    last = ckpts / "last.pt"
    last.write_bytes(last.read_bytes()[:5000])
    with pytest.raises(
        UserError,
        match=r"last\.pt: damaged checkpoint \(truncated.*newest intact checkpoint beside it is "
        r".*step_2\.pt: copy it to",
    ):
        train(config_from_dict(config(toy_dir, data, run, max_steps=6)))
    shutil.copy(ckpts / "step_2.pt", last)  # the advice works
    train(config_from_dict(config(toy_dir, data, run, max_steps=3)))
    assert last_step(run) == 3


# ----------------------------------------------------------------------------- last.pt missing


def test_missing_last_resumes_from_the_newest_step_checkpoint_and_says_so(
    toy_dir, data, base_run, run, tmp_path, warnings_of_onmt_doc
):
    """It used to start again at step 0, overwriting step_N.pt and best.pt. The resume from
    step_4.pt ends where the run resumed from its last.pt does."""
    straight = Path(shutil.copytree(base_run, tmp_path / "straight"))
    train(config_from_dict(config(toy_dir, data, straight, max_steps=6)))
    (run / "checkpoints" / "last.pt").unlink()
    train(config_from_dict(config(toy_dir, data, run, max_steps=6)))
    said = [r.getMessage() for r in warnings_of_onmt_doc.records if "is missing" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(
        "last.pt is missing: resuming from " + str(run / "checkpoints" / "step_4.pt") + ", the newest intact step_N.pt"
    ), said
    a, b = (
        load_checkpoint(str(run / "checkpoints" / "last.pt")),
        load_checkpoint(str(straight / "checkpoints" / "last.pt")),
    )
    assert a["step"] == b["step"] == 6
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_missing_last_skips_a_damaged_step_checkpoint_naming_it(toy_dir, data, run, warnings_of_onmt_doc):
    ckpts = run / "checkpoints"
    (ckpts / "last.pt").unlink()
    flip_tensor_byte(ckpts / "step_4.pt")
    train(config_from_dict(config(toy_dir, data, run, max_steps=3, save_every=1)))
    said = [r.getMessage() for r in warnings_of_onmt_doc.records if "is missing" in r.getMessage()]
    assert len(said) == 1 and "resuming from " + str(ckpts / "step_2.pt") in said[0], said
    assert "skipped: step_4.pt damaged checkpoint (record data/" in said[0], said
    assert last_step(run) == 3
    # keep_last (2) counts the intact step_2/step_3, not the damaged step_4 the save at step 4 replaces
    assert sorted(p.name for p in ckpts.iterdir()) == ["best.pt", "last.pt", "step_2.pt", "step_3.pt", "step_4.pt"]


@pytest.mark.parametrize("left", ["best", "damaged steps"])
def test_missing_last_with_nothing_resumable_is_refused_and_nothing_is_overwritten(toy_dir, data, run, left):
    ckpts = run / "checkpoints"
    (ckpts / "last.pt").unlink()
    if left == "best":
        for path in ckpts.glob("step_*.pt"):
            path.unlink()
        match = r"last\.pt is missing and no checkpoint beside it can be resumed \(best\.pt \(weights only"
    else:
        for path in ckpts.glob("step_*.pt"):
            flip_tensor_byte(path)
        match = r"\(step_4\.pt damaged checkpoint \(record data/\d+: CRC mismatch\); step_2\.pt damaged"
    before = {p.name: p.read_bytes() for p in ckpts.iterdir()}
    with pytest.raises(UserError, match=match + r".*training from step 0 would overwrite them"):
        train(config_from_dict(config(toy_dir, data, run, max_steps=6)))
    assert {p.name: p.read_bytes() for p in ckpts.iterdir()} == before


def test_a_new_run_folder_still_starts_at_step_0(toy_dir, data, tmp_path):
    run = tmp_path / "fresh"
    train(config_from_dict(config(toy_dir, data, run, max_steps=2)))
    assert last_step(run) == 2


# ----------------------------------------------------------------------------- optimizer type


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_resume_with_another_optimizer_type_is_refused(toy_dir, data, run, optim):
    """docs/getting_started.md: the optimizer type cannot change on resume. adam -> adamw loaded
    Adam's state silently, adam -> sgd failed with a traceback at the first step."""
    cfg = config(toy_dir, data, run, max_steps=6)
    cfg["optim"]["type"] = optim
    with pytest.raises(
        UserError,
        match=rf"last\.pt: cannot resume with optim\.type {optim}: the checkpoint holds the state of a adam "
        rf"optimizer; set optim\.type=adam to resume, or start a new log\.dir with train\.init_from=",
    ):
        train(config_from_dict(cfg))
    assert last_step(run) == 4
    assert load_checkpoint(str(run / "checkpoints" / "last.pt"))["train_state"]["optimizer_type"] == "adam"


# ----------------------------------------------------------------------------- full disk


def _tmpfs_works() -> bool:
    """Whether this machine lets an unprivileged mount namespace mount a tmpfs (a real full disk)."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _tmpfs_works(), reason="cannot mount a small tmpfs here (unshare -rm)")
def test_a_full_disk_while_saving_is_one_line_and_leaves_nothing_behind(toy_dir, data, tmp_path):
    """checkpoints/ on a 64 KB tmpfs: the first save (a ~1 MB step_2.pt) fills it. torch.save used to
    turn ENOSPC into "RuntimeError: unexpected pos" (a traceback) and leave the partial file."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    path = write_config(config(toy_dir, data, run, max_steps=4, valid_every=100), tmp_path / "x.yaml")
    train_cmd = " ".join([sys.executable, "-m", "onmt_doc.bin.train", "-config", str(path)])
    script = (
        f"mount -t tmpfs -o size=64k none {run / 'checkpoints'} && {{ {train_cmd}; rc=$?; "
        f"echo LEFT: $(ls -A {run / 'checkpoints'}) >&2; exit $rc; }}"
    )
    proc = run_cli("unshare", "-rm", "sh", "-c", script)
    left = [line for line in proc.stderr.splitlines() if line.startswith("LEFT:")]
    assert left == ["LEFT:"], proc.stderr  # no partial file, no step_2.pt
    proc.stderr = proc.stderr.replace(left[0] + "\n", "")
    assert_one_line_error(proc, "step_2.pt: write failed (no space left on the device); nothing was written")


# ----------------------------------------------------------------------------- one-line errors


def test_log_dir_under_a_file_is_one_line(toy_dir, data, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"log\.dir: .*file/run: cannot create the run folder"):
        train(config_from_dict(config(toy_dir, data, tmp_path / "file" / "run")))


def test_log_dir_not_writable_is_one_line(toy_dir, data, tmp_path):
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        run = folder / "run"
    elif os.path.isdir("/sys/kernel"):  # root may write anywhere but in sysfs
        run = Path("/sys/kernel/onmt_doc_run")
    else:
        pytest.skip("running as root without sysfs: no folder is unwritable")
    with pytest.raises(UserError, match=r"log\.dir: .*run: cannot create the run folder"):
        train(config_from_dict(config(toy_dir, data, run)))


def test_negative_thread_counts_are_one_line(toy_dir, data, tmp_path):
    with pytest.raises(ConfigError, match=r"train\.threads: must be at least 0, got -2"):
        config_from_dict(config(toy_dir, data, tmp_path / "run", threads=-2))
    proc = run_cli(*module_cmd("onmt_doc.bin.translate"), "-model", "none.pt", "-src", "none.txt", "-threads", "-1")
    assert_one_line_error(proc, "-threads must be 0 or more (got -1)")


def test_context_runs_record_their_batch_budget_and_older_ones_are_refused_on_resume():
    """HM-GDC windows are batched by the sum of their rows' real lengths: the fingerprint says so,
    and a checkpoint written before (no such entry: rows x the longest row) would mean other
    batches, so resuming it exactly is refused; other units' fingerprints have no entry."""
    import numpy as np

    from onmt_doc.data.mapped import build_instances
    from onmt_doc.train.run_folder import data_fingerprint, fingerprint_changes

    docs = [[(np.arange(4, 4 + n), np.arange(5, 5 + n)) for n in (3, 7, 2)]]
    cfg = config_from_dict({})
    context, _ = build_instances("context", docs, 512, max_sentences=2)
    sentence, _ = build_instances("sentence", docs, 512)
    new = data_fingerprint(context, cfg, 1)
    assert new["batch_budget"] == "sum of real row lengths"
    assert "batch_budget" not in data_fingerprint(sentence, cfg, 1)
    old = {k: v for k, v in new.items() if k != "batch_budget"}
    changes = fingerprint_changes(old, new)
    assert len(changes) == 1 and "batch budget of context windows (rows x the longest row ->" in changes[0]
    assert fingerprint_changes(new, new) == []
