"""Checkpoint format: atomic writes, weights_only loading, averaging, init_from."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import REPO, run_cli, tiny_config

from onmt_doc.config import config_from_dict
from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import load_checkpoint, load_model, save_checkpoint


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
    assert synced == tmp and tmp.startswith(path + ".tmp") and dst == path and folder == str(tmp_path)
    load_checkpoint(path)
