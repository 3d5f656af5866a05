"""Checkpoint format: atomic writes, weights_only loading, averaging, init_from, and the CRC-32
check every reader makes (a flipped byte inside a tensor is refused, not loaded)."""

from __future__ import annotations

import importlib.util
import shutil
import struct
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import REPO, module_cmd, run_cli, tiny_config
from test_cli import assert_one_line_error

from onmt_doc.config import config_from_dict
from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import average_checkpoints, load_checkpoint, load_model, save_checkpoint
from onmt_doc.train.run_folder import PARTIAL

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)


def test_checkpoint_holds_plain_data_and_loads_with_weights_only(trained_run):
    path = trained_run / "checkpoints" / "last.pt"
    ckpt = torch.load(path, map_location="cpu", weights_only=True)  # raises on any pickled object
    assert ckpt["format_version"] == 1
    assert {"config", "codec", "model", "train_state"} <= set(ckpt)
    assert isinstance(ckpt["codec"]["src_subword"]["model"], bytes)
    model, cfg, codec = load_model(str(path))
    assert cfg.model.d_model == 64 and len(codec.src_vocab) == model.generator.out_features


def test_no_temporary_files_left(trained_run):
    assert not [p for p in (trained_run / "checkpoints").iterdir() if ".tmp" in p.name]


def test_newer_format_is_refused(tmp_path):
    save_checkpoint({"model": {}}, str(tmp_path / "x.pt"))
    ckpt = torch.load(tmp_path / "x.pt", weights_only=True)
    ckpt["format_version"] = 99
    torch.save(ckpt, tmp_path / "y.pt")
    with pytest.raises(UserError, match="newer"):
        load_checkpoint(str(tmp_path / "y.pt"))


def test_average_checkpoints_tool(trained_run, tmp_path):
    a = load_checkpoint(str(trained_run / "checkpoints" / "last.pt"))
    b = dict(a)
    b["model"] = {k: v + 1.0 if v.is_floating_point() else v for k, v in a["model"].items()}
    save_checkpoint(b, str(tmp_path / "b.pt"))
    proc = run_cli(
        sys.executable,
        str(REPO / "tools" / "average_checkpoints.py"),
        "-models",
        str(trained_run / "checkpoints" / "last.pt"),
        str(tmp_path / "b.pt"),
        "-output",
        str(tmp_path / "avg.pt"),
    )
    assert proc.returncode == 0, proc.stderr
    avg = load_checkpoint(str(tmp_path / "avg.pt"))
    for k, v in a["model"].items():
        if v.is_floating_point():
            assert torch.allclose(avg["model"][k], v + 0.5, atol=1e-6), k
    load_model(str(tmp_path / "avg.pt"))  # usable for translation


def test_init_from_copies_shared_parameters_and_scales_their_lr(trained_run, toy_dir, tmp_path):
    """A deeper model initialised from the trained one: layers 0-1 copied, layer 2 new."""
    import shutil

    from onmt_doc.train.distributed import DistContext
    from onmt_doc.train.trainer import Trainer

    run = tmp_path / "ft"
    run.mkdir()
    for f in ("vocab.txt", "subword.model"):
        shutil.copy(trained_run / f, run / f)
    cfg = tiny_config(
        toy_dir,
        run,
        train={"init_from": str(trained_run / "checkpoints" / "last.pt"), "init_lr_scale": 0.2, "max_steps": 0},
    )
    cfg["model"]["encoder"]["layers"] = 3
    trainer = Trainer(config_from_dict(cfg), DistContext())
    src = load_checkpoint(str(trained_run / "checkpoints" / "last.pt"))["model"]
    own = trainer.model.state_dict()
    for name, tensor in src.items():
        assert torch.equal(own[name], tensor), name
    new = [n for n in own if n not in src]
    assert new and all(n.startswith("encoder.layers.2.") for n in new)
    groups = {g["name"]: g for g in trainer.optimizer.param_groups}
    assert groups["initialised"]["lr_scale"] == 0.2 and groups["new"]["lr_scale"] == 1.0
    n_new = sum(p.numel() for p in groups["new"]["params"])
    assert n_new == sum(own[n].numel() for n in new)
    # a shape mismatch names the parameter
    cfg["model"]["encoder"]["ff"] = 96
    with pytest.raises(UserError, match=r"encoder\.layers\.0\.ff\.w1\.weight"):
        Trainer(config_from_dict(cfg), DistContext())


def test_save_fsyncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    """Atomic is not enough after a power loss: the data must be on disk before the name moves."""
    import os

    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1]
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))), real_replace(a, b))[1])
    path = str(tmp_path / "last.pt")
    save_checkpoint({"model": {}}, path)
    (_, synced), (_, tmp, dst), (_, folder) = events
    assert synced == tmp and dst == path and folder == str(tmp_path)
    assert os.path.basename(tmp).startswith(".last.pt.tmp")  # PARTIAL, cleared by the next start
    assert PARTIAL.search(os.path.basename(tmp))
    load_checkpoint(path)


# ----------------------------------------------------------------------------- damaged checkpoints


def record_bytes(path: Path, record: zipfile.ZipInfo) -> tuple[int, int]:
    """(offset, size) of a record's data in the file (after its local header and padding)."""
    with open(path, "rb") as f:
        f.seek(record.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
    return record.header_offset + 30 + name_len + extra_len, record.file_size


def tensor_record(path: Path) -> tuple[int, int]:
    """(offset, size) of the bytes of the largest tensor record (``data/N``) of a torch.save archive."""
    with zipfile.ZipFile(path) as archive:
        record = max((r for r in archive.infolist() if "/data/" in r.filename), key=lambda r: r.file_size)
    return record_bytes(path, record)


def flip_tensor_byte(path: Path) -> None:
    """Flip one bit in the middle of the largest tensor's data, in place: the archive stays
    well-formed and ``torch.load`` reads it, with one weight changed."""
    offset, size = tensor_record(path)
    raw = bytearray(path.read_bytes())
    raw[offset + size // 2] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def damaged(trained_run, tmp_path_factory) -> Path:
    """A copy of the trained run's last.pt with one flipped bit inside a tensor's data."""
    path = tmp_path_factory.mktemp("damaged") / "bad.pt"
    shutil.copy(trained_run / "checkpoints" / "last.pt", path)
    flip_tensor_byte(path)
    return path


def test_a_flipped_byte_loads_silently_with_torch_alone(trained_run, damaged):
    """Why the check is needed: torch.load ignores the CRC-32s and returns other weights."""
    good = torch.load(trained_run / "checkpoints" / "last.pt", weights_only=True)["model"]
    bad = torch.load(damaged, weights_only=True)["model"]
    assert [k for k in good if not torch.equal(good[k], bad[k])]


CRC_ERROR = r"bad\.pt: damaged checkpoint \(record data/\d+: CRC mismatch\); use another checkpoint"


def _resume(trained_run: Path, damaged: Path, toy_dir: Path, tmp_path: Path) -> None:
    from onmt_doc.train.trainer import train

    run = Path(shutil.copytree(trained_run, tmp_path / "run"))
    shutil.copy(damaged, run / "checkpoints" / "bad.pt")
    (run / "checkpoints" / "bad.pt").replace(run / "checkpoints" / "last.pt")
    cfg = tiny_config(toy_dir, run, train={"max_steps": 61, "save_every": 60, "valid_every": 60})
    with pytest.raises(UserError, match=r"last\.pt: damaged checkpoint \(record data/\d+: CRC mismatch\).*step_60\.pt"):
        train(config_from_dict(cfg))


def _init_from(trained_run: Path, damaged: Path, toy_dir: Path, tmp_path: Path) -> None:
    from onmt_doc.train.distributed import DistContext
    from onmt_doc.train.trainer import Trainer

    run = tmp_path / "ft"
    run.mkdir()
    for f in ("vocab.txt", "subword.model"):
        shutil.copy(trained_run / f, run / f)
    cfg = tiny_config(toy_dir, run, train={"init_from": str(damaged), "max_steps": 0})
    with pytest.raises(UserError, match="train.init_from: .*" + CRC_ERROR):
        Trainer(config_from_dict(cfg), DistContext())


def _translator(trained_run: Path, damaged: Path, toy_dir: Path, tmp_path: Path) -> None:
    from onmt_doc.translate.translator import Translator

    with pytest.raises(UserError, match=CRC_ERROR):
        Translator.load(str(damaged), device="cpu")


def _average(trained_run: Path, damaged: Path, toy_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=CRC_ERROR):
        average_checkpoints([str(trained_run / "checkpoints" / "last.pt"), str(damaged)])


def _cli(*args: str, needs: str = "", timeout: int = 300):
    """A command given the damaged checkpoint: one line naming it, non-zero exit."""

    def check(trained_run: Path, damaged: Path, toy_dir: Path, tmp_path: Path) -> None:
        if needs and importlib.util.find_spec(needs) is None:
            pytest.skip(f"{needs} is not installed")
        values = {"MODEL": str(damaged), "SRC": str(toy_dir / "test.src"), "OUT": str(tmp_path / "out")}
        if "SUITE" in args:
            from onmt_doc.toy.contrastive_suite import write_toy_suite

            write_toy_suite(tmp_path, seed=3, test_docs=3)
            values["SUITE"] = str(tmp_path / "test.contrastive.json")
        proc = run_cli(*(values.get(a, a) for a in args), timeout=timeout)
        assert_one_line_error(proc, "bad.pt: damaged checkpoint (record data/", "CRC mismatch")
        assert not (tmp_path / "out").exists()

    return check


READERS = {
    "Translator.load": _translator,
    "translate": _cli(*module_cmd("onmt_doc.bin.translate"), "-model", "MODEL", "-src", "SRC", "-output", "OUT"),
    "resume": _resume,
    "average_checkpoints": _average,
    "export": _cli(*module_cmd("onmt_doc.bin.release"), "-model", "MODEL", "-output", "OUT", needs="ctranslate2"),
    "evaluate": _cli(*module_cmd("onmt_doc.bin.evaluate"), "-model", "MODEL", "-suite", "SUITE", "-json", "OUT"),
    "server": _cli(*module_cmd("onmt_doc.bin.server"), "-model", "MODEL", "-port", "0", needs="flask", timeout=120),
    "init_from": _init_from,
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_flipped_byte_in_one_line(reader, trained_run, damaged, toy_dir, tmp_path):
    READERS[reader](trained_run, damaged, toy_dir, tmp_path)


@pytest.mark.parametrize("where", ["pickle", "header", "truncated"])
def test_other_damage_is_refused_naming_the_file(trained_run, tmp_path, where):
    """A flipped byte in the pickled structure or a record's header, or a cut file: one line each."""
    path = tmp_path / "bad.pt"
    raw = bytearray((trained_run / "checkpoints" / "last.pt").read_bytes())
    with zipfile.ZipFile(trained_run / "checkpoints" / "last.pt") as archive:
        pickle = next(r for r in archive.infolist() if r.filename.endswith("data.pkl"))
        record = max(archive.infolist(), key=lambda r: r.file_size)
    if where == "pickle":
        offset, size = record_bytes(trained_run / "checkpoints" / "last.pt", pickle)
        raw[offset + size // 2] ^= 0x01
    elif where == "header":
        raw[record.header_offset + 31] ^= 0x01  # a letter of the record's name
    else:
        raw = raw[: len(raw) // 2]
    path.write_bytes(bytes(raw))
    with pytest.raises(UserError, match=r"bad\.pt: damaged checkpoint \(.+\); use another checkpoint"):
        load_checkpoint(str(path))


@pytest.mark.skipif(not hasattr(torch.serialization, "set_crc32_options"), reason="torch < 2.5 always writes CRCs")
def test_checkpoints_are_written_with_crcs_even_when_torch_is_told_not_to(tmp_path, warnings_of_onmt_doc):
    torch.serialization.set_crc32_options(False)
    try:
        save_checkpoint({"model": {"w": torch.arange(1000.0)}}, str(tmp_path / "x.pt"))
        torch.save({"format_version": 1, "model": {"w": torch.arange(1000.0)}}, tmp_path / "plain.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    with zipfile.ZipFile(tmp_path / "x.pt") as archive:
        assert all(r.CRC for r in archive.infolist() if r.file_size)
    flip_tensor_byte(tmp_path / "x.pt")
    with pytest.raises(UserError, match="CRC mismatch"):
        load_checkpoint(str(tmp_path / "x.pt"))
    # someone else's file written without CRCs cannot be checked: it loads, with a warning saying so
    assert torch.equal(load_checkpoint(str(tmp_path / "plain.pt"))["model"]["w"], torch.arange(1000.0))
    assert any("not verified" in r.getMessage() for r in warnings_of_onmt_doc.records)


def test_not_a_checkpoint_is_one_line(tmp_path):
    (tmp_path / "x.pt").write_text("hello", encoding="utf-8")
    with pytest.raises(UserError, match=r"x\.pt: not an onmt_doc checkpoint \(not a torch\.save zip archive"):
        load_checkpoint(str(tmp_path / "x.pt"))
