"""Device choice (onmt_doc.devices): one rule for every command, and the attention backends a
CUDA device gets."""

from __future__ import annotations

import pytest
import torch

from onmt_doc.devices import pick_device
from onmt_doc.errors import ConfigError


@pytest.fixture
def cudnn_attention_flag():
    """The process-wide cuDNN attention switch, restored after the test."""
    saved = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(saved)


@pytest.mark.devices
def test_a_cuda_device_turns_cudnn_attention_off(device, cudnn_attention_flag):
    """cuDNN attention plans per shape: ~10 ms of CPU per call with our changing batch shapes
    (H100, docs/benchmarks.md "GPU"), so a command on CUDA must not use it; the CPU leaves it be."""
    picked = pick_device(str(device), key="-device")
    # "cuda" names the local rank's GPU, so it comes back as "cuda:0" (comparing it with the fixture's
    # index-less torch.device("cuda") failed on the first GPU that ran this test)
    assert picked.type == device.type and picked.index == (0 if device.type == "cuda" else None)
    assert torch.backends.cuda.cudnn_sdp_enabled() == (device.type != "cuda")


def test_unknown_devices_are_one_line_errors():
    with pytest.raises(ConfigError, match="train.device: 'tpu' is not a device"):
        pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="-device: cuda:1 requested but CUDA is not available"):
            pick_device("cuda:1", key="-device")


def test_a_cuda_device_handed_to_the_api_turns_cudnn_attention_off_too(cudnn_attention_flag, tmp_path):
    """``Translator.load`` takes a ``torch.device`` as well as a name; a CUDA one gets the same
    process-wide settings as a named one (it kept cuDNN attention on, the slow path, before). The
    device is configured before the checkpoint is read, so a missing file shows it on a CPU machine."""
    from onmt_doc import Translator
    from onmt_doc.errors import UserError

    with pytest.raises(UserError):
        Translator.load(str(tmp_path / "missing.pt"), torch.device("cuda", 0))
    assert not torch.backends.cuda.cudnn_sdp_enabled()
