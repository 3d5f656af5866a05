"""Device choice (onmt_doc.devices): one rule for every command, and the attention backends a
CUDA device gets."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
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


class _Pair(NamedTuple):
    """A plan part as a named tuple (``Batch.to`` rebuilds it from its fields)."""

    offsets: torch.Tensor
    count: int


@pytest.mark.devices
def test_a_batch_moves_with_its_host_plans(device):
    """``Batch.to`` (and on a GPU ``pin_memory`` first, as the prefetch thread does) moves every tensor
    of the batch's plans, however nested (dataclasses in lists in dicts: HM-GDC's encoder plan), and
    keeps their host numbers and numpy arrays: a plan left on the host would make the step copy or fail."""
    import numpy as np

    from onmt_doc.data.batching import collate
    from onmt_doc.data.instances import Example
    from onmt_doc.modules.document_packing import plan_document_rows
    from onmt_doc.modules.varlen_attention import plan_self_segments

    batch = collate(
        [Example(np.array([5, 6, 7]), np.array([8, 9]), 0, 0, 1), Example(np.array([5]), np.array([6]), 0, 1, 1)]
    )
    rows = plan_document_rows([(2, 3)], [np.array([0, 0])], 1, "cpu")
    segments = plan_self_segments(batch.src_groups, batch.src.ne(0), causal=False)
    batch.plans = {"segments": segments, "nested": {"rows": [rows]}, "pair": _Pair(segments.cu_q, 7)}
    host = batch.pin_memory() if device.type == "cuda" else batch
    moved = host.to(device)
    assert moved.host is host and moved.src.device.type == device.type
    got, nested = moved.plans["segments"], moved.plans["nested"]["rows"][0]
    assert got.q_pos.device.type == device.type and got.max_q == segments.max_q and got.causal is False
    assert nested.packing.index.device.type == device.type and nested.packing.docs == 1
    assert isinstance(nested.docs[0], np.ndarray) and np.array_equal(nested.docs[0], rows.docs[0])
    assert torch.equal(got.cu_q.cpu(), segments.cu_q) and batch.plans["segments"] is segments  # a copy, not a move
    pair = moved.plans["pair"]
    assert isinstance(pair, _Pair) and pair.offsets.device.type == device.type and pair.count == 7


def test_host_planning_runs_eagerly_inside_a_compiled_function():
    """``host_planning`` keeps numpy planning out of compiled graphs as ``torch.compiler.disable``
    did: under ``torch.compile`` a call is a graph break and the body runs eagerly (it sees
    ``is_compiling()`` False), and so does the planning it calls, also from a comprehension (as
    HM-GDC's decoder plans per bucket); traced, its numpy would become graph ops or specialise on the
    batch's values. Outside compiled code it is the plain function."""
    from onmt_doc.modules.host_planning import host_planning

    seen: list[tuple[str, bool]] = []

    @host_planning
    def counts(n: int, device: torch.device) -> tuple[torch.Tensor, int]:
        seen.append(("counts", torch.compiler.is_compiling()))
        found = torch.from_numpy(np.bincount(np.arange(n) % 3, minlength=3))
        return found.to(device), int(found.max().item())

    @host_planning
    def plan(n: int, device: torch.device) -> tuple[torch.Tensor, int]:
        seen.append(("plan", torch.compiler.is_compiling()))
        return counts(n, device)

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, buckets: list[torch.Tensor]) -> torch.Tensor:
            plans = [plan(b.numel(), x.device) for b in buckets]
            return x.sum() + sum(p[0].sum() * p[1] for p in plans)

    x, buckets = torch.ones(3, 4), [torch.arange(5), torch.arange(7)]
    want = torch.tensor(12.0 + 5 * 2 + 7 * 3)
    assert torch.equal(torch.compile(Model(), backend="eager", dynamic=True)(x, buckets), want)
    assert seen == [("plan", False), ("counts", False)] * 2
    seen.clear()
    assert torch.equal(Model()(x, buckets), want) and seen == [("plan", False), ("counts", False)] * 2


def test_translating_never_imports_torch_dynamo(trained_run):
    """Importing the model code and translating on a CPU leave ``torch._dynamo`` unimported: its import
    is ~1 s of every command's start, and only compiling needs it (``torch.compiler.disable`` at import
    time imported it in every process)."""
    import subprocess
    import sys

    code = (
        "import sys; from onmt_doc import Translator; import onmt_doc.bin.translate, onmt_doc.bin.server;"
        f"t = Translator.load({str(trained_run / 'checkpoints' / 'last.pt')!r}, device='cpu', beam=2);"
        "t.translate([['a b c .', 'd e .']]); print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "False"
