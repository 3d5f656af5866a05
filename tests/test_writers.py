"""Issue 27, part 1: no command destroys a file. Every writer of every command is run against the
same hazards: an output that is one of its inputs (by path, symbolic link, hard link or ``..``), a
folder, a FIFO (streamed, never replaced), a failure half-way (the old output stays), and the
folder writers' ``-force`` (nothing removed before the new result is complete).

The commands run in-process through their ``main`` (the one-line error contract of ``bin/common.run``),
so a refusal is exit status 1 with one line on stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml
from conftest import tiny_config, write_config

from onmt_doc.bin import (
    average_checkpoints,
    build_pmi_table,
    build_vocab,
    evaluate,
    gate_analysis,
    make_toy_corpus,
    scale_model,
    translate,
)

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)


@dataclass
class Workspace:
    """Copies of a trained run's files that the writers read (each test gets its own copy)."""

    root: Path
    src: Path
    tgt: Path
    hyp: Path
    ckpt: Path
    ckpt2: Path
    config: Path
    suite: Path
    table: Path


@pytest.fixture(scope="module")
def base(trained_run, toy_dir, tmp_path_factory) -> Path:
    """A folder with short test files, two checkpoints, a config and a PMI table of the run."""
    root = tmp_path_factory.mktemp("writers")
    lines = (toy_dir / "test.src").read_text(encoding="utf-8").split("\n\n")[:2]
    refs = (toy_dir / "test.tgt").read_text(encoding="utf-8").split("\n\n")[:2]
    (root / "test.src").write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    (root / "test.tgt").write_text("\n\n".join(refs) + "\n", encoding="utf-8")
    (root / "test.hyp").write_text("\n\n".join(refs) + "\n", encoding="utf-8")
    shutil.copy(trained_run / "checkpoints" / "last.pt", root / "a.pt")
    shutil.copy(trained_run / "checkpoints" / "last.pt", root / "b.pt")
    run = root / "run"
    run.mkdir()
    for name in ("subword.model", "vocab.txt"):
        shutil.copy(trained_run / name, run / name)
    cfg = tiny_config(toy_dir, run)
    cfg["data"]["train"] = {"src": str(root / "test.src"), "tgt": str(root / "test.tgt")}
    write_config(cfg, root / "config.yaml")
    first = lines[0].split("\n")[0]
    suite = [{"src segment": first, "ref segment": "a b", "errors": [{"contrastive": "b a"}]}]
    (root / "suite.json").write_text(json.dumps(suite), encoding="utf-8")
    assert build_pmi_table.main(["-config", str(root / "config.yaml"), "-output", str(root / "table.npz")]) == 0
    return root


@pytest.fixture()
def ws(base, tmp_path) -> Workspace:
    root = tmp_path / "ws"
    shutil.copytree(base, root)
    cfg = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8"))
    cfg["data"]["train"] = {"src": str(root / "test.src"), "tgt": str(root / "test.tgt")}
    cfg["log"]["dir"] = str(root / "run")
    write_config(cfg, root / "config.yaml")
    return Workspace(
        root, root / "test.src", root / "test.tgt", root / "test.hyp", root / "a.pt", root / "b.pt",
        root / "config.yaml", root / "suite.json", root / "table.npz",
    )  # fmt: skip


# name -> (command, arguments given the output path, the input the hazards alias)
Writer = tuple[Callable, Callable[[Workspace, str], list[str]], Callable[[Workspace], Path]]
WRITERS: dict[str, Writer] = {
    "translate -output": (
        translate.main,
        lambda w, out: ["-model", str(w.ckpt), "-src", str(w.src), "-beam", "1", "-output", out],
        lambda w: w.src,
    ),
    "evaluate -json": (
        evaluate.main,
        lambda w, out: ["-hyp", str(w.hyp), "-ref", str(w.tgt), "-json", out],
        lambda w: w.hyp,
    ),
    "evaluate -item_scores": (
        evaluate.main,
        lambda w, out: ["-model", str(w.ckpt), "-suite", str(w.suite), "-item_scores", out],
        lambda w: w.suite,
    ),
    "build_pmi_table -output": (
        build_pmi_table.main,
        lambda w, out: ["-config", str(w.config), "-output", out],
        lambda w: w.src,
    ),
    "average_checkpoints -output": (
        average_checkpoints.main,
        lambda w, out: ["-models", str(w.ckpt), str(w.ckpt2), "-output", out],
        lambda w: w.ckpt2,
    ),
    "gate_analysis -output": (
        gate_analysis.main,
        lambda w, out: [
            "-model",
            str(w.ckpt),
            "-src",
            str(w.src),
            "-tgt",
            str(w.tgt),
            "-table",
            str(w.table),
            "-output",
            out,
        ],
        lambda w: w.table,
    ),
    "scale_model -output": (
        scale_model.main,
        lambda w, out: ["-config", str(w.config), "-losses", "3.2,3.1,3.15", "-output", out],
        lambda w: w.config,
    ),
}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_refusal(capsys, status: int, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if not line.startswith("[")]  # INFO/WARNING log lines
    assert status == 1 and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def aliases(target: Path, folder: Path) -> dict[str, str]:
    """Four other names of ``target``: itself, a symbolic link, a hard link and a ``..`` detour."""
    (folder / "sub").mkdir(exist_ok=True)
    link, hard = folder / "link", folder / "hard"
    link.symlink_to(target)
    os.link(target, hard)
    return {
        "same path": str(target),
        "symbolic link": str(link),
        "hard link": str(hard),
        "dotdot": str(folder / "sub" / ".." / os.path.relpath(target, folder)),
    }


@pytest.mark.parametrize("writer", list(WRITERS))
def test_output_that_is_an_input_is_refused_under_every_name(writer, ws, capsys):
    command, args, victim_of = WRITERS[writer]
    victim = victim_of(ws)
    before = digest(victim)
    for how, out in aliases(victim, ws.root).items():
        status = command(args(ws, out))
        one_line_refusal(capsys, status, "would destroy the input")
        assert digest(victim) == before, f"{writer}: the input was changed through its {how}"
    assert not [p for p in ws.root.rglob("*.tmp*")], "temporary files left behind"


@pytest.mark.parametrize("writer", list(WRITERS))
def test_output_that_is_a_folder_is_refused_and_kept(writer, ws, capsys):
    command, args, _ = WRITERS[writer]
    folder = ws.root / "out_dir"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine", encoding="utf-8")
    status = command(args(ws, str(folder)))
    one_line_refusal(capsys, status, "is a directory")
    assert (folder / "keep.txt").read_text(encoding="utf-8") == "mine"


# writers whose output folder is created when missing (runs/x/pmi.npz before runs/x exists), as always
MAKE_FOLDER = ("build_pmi_table -output", "average_checkpoints -output")


@pytest.mark.parametrize("writer", [w for w in WRITERS if w not in MAKE_FOLDER])
def test_output_into_a_missing_folder_is_refused_before_any_work(writer, ws, capsys):
    command, args, _ = WRITERS[writer]
    status = command(args(ws, str(ws.root / "no" / "such" / "out")))
    one_line_refusal(capsys, status, "does not exist")


@pytest.mark.parametrize("writer", MAKE_FOLDER)
def test_output_folder_is_created_but_never_over_a_file(writer, ws, capsys):
    command, args, _ = WRITERS[writer]
    assert command(args(ws, str(ws.root / "new" / "folder" / "out"))) == 0
    assert (ws.root / "new" / "folder" / "out").is_file()
    capsys.readouterr()
    (ws.root / "plain").write_text("a file", encoding="utf-8")
    one_line_refusal(capsys, command(args(ws, str(ws.root / "plain" / "out"))), "is a file, not a folder")
    assert (ws.root / "plain").read_text(encoding="utf-8") == "a file"


class FifoReader:
    """The read end of a FIFO, drained by a thread, opened before the writer runs (non-blocking),
    so a writer that streams into it never blocks and one that replaces it cannot hang the test."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path, self.data = path, bytearray()
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                self.data.extend(chunk)

    def close(self) -> bytes:
        """Everything written, the bytes still in the pipe included (the writer may have finished
        between the thread's last look and the stop)."""
        self.stop.set()
        self.thread.join(5)
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:  # a writer still holds the pipe open and wrote nothing more
                break
            if not chunk:  # end of file: every writer closed it
                break
            self.data.extend(chunk)
        os.close(self.fd)
        return bytes(self.data)


@pytest.mark.parametrize("writer", list(WRITERS))
def test_fifo_output_is_streamed_not_replaced(writer, ws, capsys):
    command, args, _ = WRITERS[writer]
    fifo = ws.root / "out.fifo"
    reader = FifoReader(fifo)
    try:
        status = command(args(ws, str(fifo)))
    finally:
        data = reader.close()
    assert status == 0, capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), f"{writer} replaced the FIFO by a regular file"
    assert data, f"{writer} wrote nothing into the FIFO"
    assert not [p for p in ws.root.rglob("*.tmp*")], "temporary files left behind"


def test_dev_full_output_is_a_one_line_error_and_the_device_stays(ws, capsys):
    """A character device is written to, not renamed over: /dev/full answers ENOSPC."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    before = os.stat("/dev/full")
    status = evaluate.main(["-hyp", str(ws.hyp), "-ref", str(ws.tgt), "-json", "/dev/full"])
    one_line_refusal(capsys, status, "-json /dev/full", "no space left")
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_failure_half_way_keeps_the_old_output(ws, capsys):
    """-item_scores is written while scoring; a suite that turns out bad at its second item must
    leave yesterday's scores as they were (the file was truncated first before)."""
    items = json.loads(ws.suite.read_text(encoding="utf-8"))
    ws.suite.write_text(json.dumps(items + [{"src segment": "x"}]), encoding="utf-8")
    old = ws.root / "scores.jsonl"
    old.write_text("yesterday's scores\n", encoding="utf-8")
    status = evaluate.main(["-model", str(ws.ckpt), "-suite", str(ws.suite), "-item_scores", str(old)])
    one_line_refusal(capsys, status)
    assert old.read_text(encoding="utf-8") == "yesterday's scores\n"
    assert not [p for p in ws.root.rglob("*.tmp*")]


def test_translation_failing_mid_file_keeps_the_old_output(ws, capsys):
    with open(ws.src, "ab") as f:
        f.write(b"\nbad \xff byte\n")
    out = ws.root / "out.txt"
    out.write_text("old translation\n", encoding="utf-8")
    status = translate.main(["-model", str(ws.ckpt), "-src", str(ws.src), "-beam", "1", "-output", str(out)])
    one_line_refusal(capsys, status, "invalid UTF-8")
    assert out.read_text(encoding="utf-8") == "old translation\n"


def test_outputs_of_one_command_must_differ(ws, capsys):
    out = str(ws.root / "same.json")
    status = evaluate.main(["-model", str(ws.ckpt), "-suite", str(ws.suite), "-json", out, "-item_scores", out])
    one_line_refusal(capsys, status, "-json", "-item_scores")


def test_replaced_output_keeps_its_permissions(ws, capsys):
    out = ws.root / "report.json"
    out.write_text("{}", encoding="utf-8")
    out.chmod(0o640)
    assert evaluate.main(["-hyp", str(ws.hyp), "-ref", str(ws.tgt), "-json", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and "bleu" in out.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- folders and run folders


def test_release_force_keeps_the_old_export_when_the_new_one_fails(ws, capsys):
    pytest.importorskip("ctranslate2")
    from onmt_doc.bin import release

    out = ws.root / "ct2"
    assert release.main(["-model", str(ws.ckpt), "-output", str(out)]) == 0
    capsys.readouterr()
    before = {p.name: digest(p) for p in out.iterdir()}
    ws.ckpt2.write_bytes(b"not a checkpoint")
    status = release.main(["-model", str(ws.ckpt2), "-output", str(out), "-force"])
    one_line_refusal(capsys, status, str(ws.ckpt2))
    assert {p.name: digest(p) for p in out.iterdir()} == before, "-force removed the old export before the new one"
    assert sorted(p.name for p in ws.root.iterdir() if p.name.startswith(".ct2")) == []


def test_release_refuses_a_folder_holding_its_input(ws, capsys):
    pytest.importorskip("ctranslate2")
    from onmt_doc.bin import release

    status = release.main(["-model", str(ws.ckpt), "-output", str(ws.root), "-force"])
    one_line_refusal(capsys, status, "holds the -model file")
    assert ws.ckpt.exists() and ws.src.exists()


def test_toy_corpus_does_not_overwrite_a_data_folder(ws, capsys):
    (ws.root / "train.src").write_text("my own corpus\n", encoding="utf-8")
    status = make_toy_corpus.main(["--out", str(ws.root), "--train-docs", "3", "--valid-docs", "1", "--test-docs", "1"])
    one_line_refusal(capsys, status, "--force")
    assert (ws.root / "train.src").read_text(encoding="utf-8") == "my own corpus\n"
    args = ["--out", str(ws.root), "--train-docs", "3", "--valid-docs", "1", "--test-docs", "1", "--force"]
    assert make_toy_corpus.main(args) == 0
    assert (ws.root / "train.src").read_text(encoding="utf-8") != "my own corpus\n"


def test_build_vocab_keeps_the_vocabulary_of_a_run_with_checkpoints(ws, capsys):
    run = ws.root / "run"
    (run / "checkpoints").mkdir()
    shutil.copy(ws.ckpt, run / "checkpoints" / "step_60.pt")
    before = {name: digest(run / name) for name in ("subword.model", "vocab.txt")}
    args = ["-config", str(ws.config), "vocab.size=200"]
    one_line_refusal(capsys, build_vocab.main(args), "1 checkpoint(s)", "-force")
    assert {name: digest(run / name) for name in before} == before
    assert build_vocab.main(args + ["-force"]) == 0
    backups = sorted(p.name for p in run.iterdir() if ".backup-" in p.name)
    assert len(backups) == 2, backups
    for name, old in before.items():
        backup = next(run / b for b in backups if b.startswith(name))
        assert digest(backup) == old and digest(run / name) != old


def test_build_vocab_waits_for_no_one_while_a_training_holds_the_run(ws, capsys):
    from onmt_doc.train.run_folder import RunLock

    lock = RunLock(str(ws.root / "run"))
    lock.acquire()
    try:
        one_line_refusal(capsys, build_vocab.main(["-config", str(ws.config)]), "in use")
    finally:
        lock.release()


def test_a_corpus_file_is_never_a_vocabulary_output(ws, capsys):
    cfg = yaml.safe_load(ws.config.read_text(encoding="utf-8"))
    shutil.copy(ws.src, ws.root / "run" / "vocab.txt")  # the user keeps a corpus where the vocabulary goes
    cfg["data"]["train"]["src"] = str(ws.root / "run" / "vocab.txt")
    cfg["data"]["valid"] = {"src": None, "tgt": None}
    write_config(cfg, ws.config)
    before = digest(ws.root / "run" / "vocab.txt")
    one_line_refusal(capsys, build_vocab.main(["-config", str(ws.config)]), "would destroy the input")
    assert digest(ws.root / "run" / "vocab.txt") == before


def test_training_never_writes_over_its_own_config_file(toy_dir, tmp_path, capsys):
    """`onmt_doc_train -config runs/x/config.yaml` (continuing a run from its folder) keeps the
    user's file, comments and all, instead of replacing it with the resolved config."""
    from onmt_doc.bin import train

    run = tmp_path / "run"
    run.mkdir()
    config = run / "config.yaml"
    text = "# my notes on this run\n" + yaml.safe_dump(tiny_config(toy_dir, run, train={"max_steps": 2}))
    config.write_text(text, encoding="utf-8")
    assert train.main(["-config", str(config), "train.save_every=2"]) == 0
    assert config.read_text(encoding="utf-8") == text
    assert (run / "checkpoints" / "last.pt").exists()
