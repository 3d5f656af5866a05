"""The one checkpoint format: tensors and plain data, written atomically, read with weights_only
after checking every byte against the CRC-32s of its zip archive.

Keys: ``format_version``, ``config`` (resolved, as a dict), ``codec`` (subword models and
vocabularies), ``model`` (state dict) and, in training checkpoints, ``train_state`` (optimizer,
scaler, RNG, data position, early stopping, step).

Verification: ``torch.save`` writes a zip archive that stores a CRC-32 of every record (the
pickle, each tensor's storage), but ``torch.load`` never checks them, so a flipped byte inside a
tensor loads as a slightly different model. :func:`load_checkpoint`, the one reader every command
goes through, reads each record with :mod:`zipfile` first, which checks its CRC-32: one more pass
over the file at 1-2 GB/s (+0.08 s on a 105 MB model, +0.18 s on a 226 MB training checkpoint),
which leaves the file in the page cache for the load. These CRC-32s, not a checksum of our own:
they are in every torch.save file already (older checkpoints and OpenNMT-py files included).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import zipfile
from typing import IO, Any, Iterable, Iterator, Optional

import torch

from onmt_doc.config import FORMAT_VERSION, Config, config_from_dict
from onmt_doc.data.codec import Codec
from onmt_doc.errors import UserError
from onmt_doc.models.builder import build_model
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.outputs import Input, input_problem, output_file

log = logging.getLogger("onmt_doc")

ZIP_MAGIC = b"PK\x03\x04"  # every torch.save archive starts with a local file header
CHUNK = 1 << 22  # bytes read at a time while checking a record's CRC-32
DAMAGED_HINT = "use another checkpoint (an intact step_N.pt of its run, or a copy)"


class _KeepWriteError:
    """The file object ``torch.save`` writes to, keeping the ``OSError`` of a failed write: torch
    replaces it by an opaque ``RuntimeError`` ("unexpected pos"), and the cause (a full disk) is
    what the user needs to read."""

    def __init__(self, f: IO[bytes]) -> None:
        """Wrap the open binary file ``f``."""
        self.f = f
        self.error: Optional[OSError] = None

    def write(self, data: bytes) -> int:
        """Write ``data``, remembering an ``OSError`` before passing it on."""
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        """Flush the wrapped file."""
        self.f.flush()


@contextlib.contextmanager
def _crc32_on() -> Iterator[None]:
    """torch >= 2.5 can be told not to compute CRC-32s (``set_crc32_options(False)``); checkpoints
    are always written with them, since loading checks them."""
    get = getattr(torch.serialization, "get_crc32_options", None)
    if get is None or get():
        yield
        return
    torch.serialization.set_crc32_options(True)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(False)


def save_checkpoint(payload: dict, path: str, inputs: Iterable[Input] = (), flag: str = "") -> None:
    """Write ``payload`` (plus ``format_version``) through :func:`onmt_doc.outputs.output_file`:
    a temporary file beside ``path`` (``.<name>.tmp<pid>``, cleared by a crashed run's next start),
    fsynced, renamed over ``path``, folder fsynced; never a half-written checkpoint, and a full
    disk is a one-line ``UserError`` with the temporary file removed. ``inputs``/``flag``: the
    command's inputs the output must not be, and its flag for errors (``-output``)."""
    with output_file(path, inputs, flag, binary=True, durable=True, make_folder=True) as f:
        sink = _KeepWriteError(f)
        try:
            with _crc32_on():
                torch.save({"format_version": FORMAT_VERSION, **payload}, sink)
        except RuntimeError:
            if sink.error is not None:
                raise sink.error from None  # output_file turns it into a one-line UserError
            raise


def copy_checkpoint(src: str, dst: str) -> None:
    """Atomic, durable copy (``last.pt`` from ``step_N.pt``): its own bytes, not a link, so one
    damaged file leaves the other intact."""
    with output_file(dst, [("the source", src)], flag="", binary=True, durable=True) as out:
        with open(src, "rb") as f:
            shutil.copyfileobj(f, out, CHUNK)


# ----------------------------------------------------------------------------- verification


def archive_problem(path: str) -> Optional[str]:
    """Why the zip archive ``path`` is damaged (``record data/12: CRC mismatch``), or None when
    every record's bytes match the CRC-32 stored for it. Reads the whole file once."""
    try:
        archive = zipfile.ZipFile(path)
    except Exception as e:  # zipfile parses damaged directories with many kinds of error
        if "not a zip file" in str(e):
            return "truncated: the zip directory at its end is missing"
        return f"zip directory unreadable: {_reason(e)}"
    with archive:
        records = archive.infolist()
        if records and all(r.CRC == 0 for r in records if r.file_size):
            log.warning(
                "%s: written without CRC-32s (torch.serialization.set_crc32_options(False)): not verified", path
            )
            return None
        for record in records:
            try:
                with archive.open(record) as data:
                    while data.read(CHUNK):
                        pass
            except Exception as e:  # a bad CRC, a damaged header, a size past the end …
                text = str(e)
                return f"record {_record_name(record.filename)}: " + (
                    "CRC mismatch" if text.startswith("Bad CRC-32") else _reason(e)
                )
    return None


def _record_name(name: str) -> str:
    """``data/12`` for ``archive/data/12``: the first part is the name the archive was saved under."""
    return name.split("/", 1)[-1]


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:200]


def is_zip(path: str) -> bool:
    """Whether ``path`` starts like a zip archive (every ``torch.save`` file since torch 1.6)."""
    with open(path, "rb") as f:
        return f.read(4) == ZIP_MAGIC


# what torch.load(weights_only=True) says when a pickle asks for more than tensors and plain data
_REFUSED_GLOBAL = re.compile(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL) ([\w.]+)")
_REFUSED_OPERAND = re.compile(r"Unsupported operand (\d+)")


def unpickling_refusal(e: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` would not read a file, as one complete clause: torch's
    own message is a paragraph whose first sentence suggests ``weights_only=False`` (running the
    file's code), and cut to one line it ended mid-sentence."""
    text = str(e)
    m = _REFUSED_GLOBAL.search(text)
    if m:
        return f"its pickle asks for the Python object {m.group(1)}, and loading runs no code (tensors and plain data)"
    m = _REFUSED_OPERAND.search(text)
    if m:
        return f"its pickle uses operation {m.group(1)}, which a file of tensors and plain data never needs"
    if text.startswith("Weights only load failed"):
        return "its pickle holds more than tensors and plain data, and loading runs no code"
    return _reason(e)


def read_torch_file(path: str, what: str, hint: str, safe_globals: Iterable[type] = ()) -> Any:
    """A ``torch.save`` file's content, its records first checked against their CRC-32s, then
    loaded with ``weights_only=True`` (plus ``safe_globals``); every failure one ``UserError``
    naming ``path`` and ``what`` it should be. A file older than torch's zip format has nothing to check."""
    problem = input_problem(path)
    if problem:
        raise UserError(f"{path}: {what} not found" if problem == "file not found" else f"{path}: {problem}")
    if not os.path.isfile(path):
        raise UserError(f"{path}: not a regular file (a device or a pipe); give the {what} file")
    if os.path.getsize(path) == 0:
        raise UserError(f"{path}: empty file; not a {what}")
    try:
        problem = archive_problem(path) if is_zip(path) else None
        if problem:
            raise UserError(f"{path}: damaged {what} ({problem}); {hint}")
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except UserError:
        raise
    except OSError as e:
        raise UserError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    except Exception as e:  # intact bytes that are still no such file fail anywhere inside the unpickler
        raise UserError(f"{path}: not a readable {what}: {unpickling_refusal(e)}") from None


def load_checkpoint(path: str) -> dict:
    """The checkpoint dict, verified (its CRC-32s) then loaded with ``weights_only``; a missing,
    damaged or too-new file is a one-line ``UserError``."""
    if input_problem(path) is None and os.path.isfile(path) and not is_zip(path):
        raise UserError(
            f"{path}: not an onmt_doc checkpoint (not a torch.save zip archive: another kind of file, "
            f"or its first bytes are damaged)"
        )
    ckpt = read_torch_file(path, "checkpoint", DAMAGED_HINT)
    if not isinstance(ckpt, dict) or "format_version" not in ckpt or "model" not in ckpt:
        raise UserError(f"{path}: not an onmt_doc checkpoint (no format_version/model entries)")
    if isinstance(ckpt["format_version"], bool) or not isinstance(ckpt["format_version"], int):
        raise UserError(f"{path}: not an onmt_doc checkpoint (format_version {ckpt['format_version']!r:.40})")
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
    try:
        missing, unexpected = model.load_state_dict(ckpt["model"], strict=False)
    except RuntimeError as e:  # torch lists every tensor whose shape differs
        first = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line), _reason(e))
        raise UserError(f"{path}: weights do not match the stored config ({first[:200]})") from None
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
    model_from_checkpoint(first, paths[0])  # its weights fit its config (an average cannot repair them)
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
