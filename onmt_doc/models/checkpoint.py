"""The one checkpoint format: tensors and plain data, written atomically, read with weights_only.

Keys: ``format_version``, ``config`` (resolved, as a dict), ``codec`` (subword models and
vocabularies), ``model`` (state dict) and, in training checkpoints, ``train_state`` (optimizer,
scaler, RNG, data position, early stopping, step).
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

import torch

from onmt_doc.config import FORMAT_VERSION, Config, config_from_dict
from onmt_doc.data.codec import Codec
from onmt_doc.errors import UserError
from onmt_doc.models.builder import build_model
from onmt_doc.models.model import EncoderDecoder


def save_checkpoint(payload: dict, path: str) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written checkpoint."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save({"format_version": FORMAT_VERSION, **payload}, f)
    _durable_replace(tmp, path)


def copy_checkpoint(src: str, dst: str) -> None:
    """Atomic, durable copy (``last.pt`` from ``step_N.pt``): its own bytes, not a link, so one
    damaged file leaves the other intact."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(dst)), f".{os.path.basename(dst)}.tmp{os.getpid()}")
    shutil.copyfile(src, tmp)
    _durable_replace(tmp, dst)


def _durable_replace(tmp: str, path: str) -> None:
    """fsync the file, rename it over ``path``, fsync the folder: after a crash or power loss the
    name points to the old or the new complete file, never to a file whose blocks were not written."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def load_checkpoint(path: str) -> dict:
    """The checkpoint dict via ``weights_only`` loading; a missing, damaged or too-new file is a ``UserError``."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged file can fail anywhere inside the unpickler
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: not a readable onmt_doc checkpoint ({reason[:200]})") from None
    if not isinstance(ckpt, dict) or "format_version" not in ckpt or "model" not in ckpt:
        raise UserError(f"{path}: not an onmt_doc checkpoint (no format_version/model entries)")
    if ckpt["format_version"] > FORMAT_VERSION:
        raise UserError(
            f"{path}: checkpoint format {ckpt['format_version']} is newer than this "
            f"onmt_doc understands ({FORMAT_VERSION}); upgrade onmt_doc"
        )
    return ckpt


def model_from_checkpoint(
    ckpt: dict, path: str = "checkpoint", device: Optional[torch.device] = None
) -> tuple[EncoderDecoder, Config, Codec]:
    """Rebuild the model from the stored config and codec alone; weights that do not fit are a ``UserError``."""
    cfg = config_from_dict(ckpt["config"], f"{path} (stored config)")
    codec = Codec.from_dict(ckpt["codec"])
    model = build_model(cfg.model, codec)
    missing, unexpected = model.load_state_dict(ckpt["model"], strict=False)
    if missing or unexpected:
        raise UserError(
            f"{path}: weights do not match the stored config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    if device is not None:
        model.to(device)
    return model, cfg, codec


def load_model(path: str, device: Optional[torch.device] = None) -> tuple[EncoderDecoder, Config, Codec]:
    """Model (in eval mode), resolved config and codec from a checkpoint: all translation needs."""
    model, cfg, codec = model_from_checkpoint(load_checkpoint(path), path, device)
    return model.eval(), cfg, codec


def average_checkpoints(paths: list[str]) -> dict:
    """A checkpoint whose weights are the mean of ``paths`` (same config and vocabularies)."""
    if not paths:
        raise UserError("no checkpoints to average")
    first = load_checkpoint(paths[0])
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        if ckpt["codec"] != first["codec"]:
            raise UserError(f"{path}: other vocabularies than {paths[0]}; only checkpoints of one run can be averaged")
        if ckpt["model"].keys() != first["model"].keys():
            raise UserError(f"{path}: other parameters than {paths[0]}")
        for k, v in ckpt["model"].items():
            if v.shape != total[k].shape:
                raise UserError(f"{path}: parameter {k} has shape {tuple(v.shape)}, not {tuple(total[k].shape)}")
            if v.is_floating_point():
                total[k] += v.double()
    model = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v for k, v in total.items()}
    return {
        "config": first["config"],
        "codec": first["codec"],
        "model": model,
        "step": first.get("step", 0),
        "averaged_from": list(paths),
    }
