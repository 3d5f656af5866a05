"""Counting what a training step dispatches, and which of it would make a GPU's host wait.

On a GPU the host queues kernels ahead of the device; an operator whose result the host must read
(``.item()``, a boolean mask's size, ``nonzero``, ``unique``…) stops the queue until the device has
caught up, so a step costs the device time plus the host time instead of the larger of the two.
Those operators are the same on every device, so a CPU run can count them: :class:`OpCounter`
records every ATen operator a block dispatches (autograd's backward included) and which of them are
host synchronisations on CUDA. Tests assert that a training step has none (``tests/test_training_step.py``);
the ``step_ops`` benchmark reports operators and syncs per step for every model
(``benchmarks/specs/step_ops.yaml``), the CPU proxy of a GPU step's launch count.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from onmt_doc.modules import hplstm

_ALWAYS = {  # operators that read the device, or whose output size depends on the data
    "aten._local_scalar_dense",  # .item(), int(t), float(t), bool(t)
    "aten.is_nonzero",
    "aten.equal",
    "aten.nonzero",
    "aten.masked_select",
    "aten._unique",
    "aten._unique2",
    "aten.unique_dim",
    "aten.unique_consecutive",
    "aten.bincount",
    "aten.histc",
}


def _is_bool_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.bool


def is_host_sync(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether an ATen call would make the host wait for a CUDA device."""
    name = str(func.overloadpacket)
    if name in _ALWAYS:
        return True
    if name in ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(_is_bool_tensor(i) for i in indices or ())  # a boolean mask: nonzero inside
    if name == "aten.repeat_interleave":  # with tensor repeats, the output size is the repeats' sum
        return isinstance(args[0] if args else None, torch.Tensor) and kwargs.get("output_size") is None
    return False


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as ops: step()``: ``ops.total`` operators dispatched, ``ops.syncs`` of them
    host synchronisations on CUDA, ``ops.sync_ops`` which (name: count), ``ops.names`` every
    operator's count and ``ops.host_data`` the tensors made from Python data."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.sync_ops: Counter = Counter()
        self.names: Counter = Counter()

    @property
    def syncs(self) -> int:
        """Host synchronisations counted."""
        return sum(self.sync_ops.values())

    @property
    def host_data(self) -> int:
        """Tensors made from Python data (``torch.tensor([...])``, ``aten.lift_fresh``): made on a GPU,
        each is a blocking copy from host memory, which waits for the device's queue like a read
        (not counted in :attr:`syncs`: made on the host, for the host, it costs nothing)."""
        return self.names["aten.lift_fresh"]

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        """Count ``func`` (and whether it syncs), then run it."""
        kwargs = kwargs or {}
        self.total += 1
        self.names[str(func.overloadpacket)] += 1
        if is_host_sync(func, args, kwargs):
            self.sync_ops[str(func.overloadpacket)] += 1
        return func(*args, **kwargs)


def count_inside(op: Any, body: Callable[..., Any]) -> None:
    """Make :class:`OpCounter` count the operators that ``body``, the Python body of our custom
    operator ``op``, dispatches, instead of ``op`` itself: a device launches those, and a mode sees
    nothing inside an operator it lets run."""

    def run_counted(mode: OpCounter, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        with mode:
            return body(*args, **kwargs)

    op.register_torch_dispatch(OpCounter, run_counted)


count_inside(hplstm.scan_op, hplstm.scan_cells)  # MHPLSTM's cell scan: a loop or recursive doubling
count_inside(hplstm.scan_backward_op, hplstm.scan_totals)
