"""Process-group setup for ``torchrun`` (Gloo on CPU, NCCL on GPU) and metric reduction.

Without torchrun's environment variables everything degrades to one process, no process group.
DDP reduces gradients over the device group; every value the loop itself exchanges (token counts,
stop flags, the statistics of a progress line, RNG states) is a host value and goes over a Gloo group
of its own (:data:`_HOST_GROUP`): through NCCL it would be copied to the GPU and read back, a host
synchronisation every step, which a GPU step must not make (issue 40).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from onmt_doc.devices import pick_device


@dataclass
class DistContext:
    """Where this process stands in a ``torchrun`` job (rank 0 of a world of 1 without one) and
    the device it trains on."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        """Rank 0: the process that logs, writes checkpoints and reports."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """Whether there is a process group (more than one process) to reduce over."""
        return self.world > 1


# the Gloo group of every rank, for host values (module docstring); made by init_distributed
_HOST_GROUP: list[Optional[dist.ProcessGroup]] = [None]


def init_distributed(device_spec: str) -> DistContext:
    """Read torchrun's environment, pick the device and, with more than one process, join the
    process group (NCCL on GPU, Gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device = pick_device(device_spec, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timedelta(minutes=60))
    if world > 1 and _HOST_GROUP[0] is None:  # every rank creates it, in the same order
        _HOST_GROUP[0] = dist.new_group(backend="gloo", timeout=timedelta(minutes=60))
    return DistContext(rank, world, local_rank, local_world, device)


def all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    """``values`` summed over ranks (float64, so token counts stay exact); unchanged on one process.
    Host to host: no device is read."""
    if not ctx.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=_HOST_GROUP[0])
    return t.tolist()


def broadcast_flag(flag: bool, ctx: DistContext) -> bool:
    """Rank 0's ``flag`` on every rank, so all ranks take the same branch."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([int(flag)])
    dist.broadcast(t, 0, group=_HOST_GROUP[0])
    return bool(t.item())


def any_flag(flag: bool, ctx: DistContext) -> bool:
    """True on every rank when ``flag`` is true on at least one (e.g. a signal reached one rank)."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, group=_HOST_GROUP[0])
    return bool(t.item())


def gather_objects(obj: object, ctx: DistContext) -> list:
    """Every rank's ``obj``, in rank order (a one-element list without a process group)."""
    if not ctx.enabled:
        return [obj]
    out: list = [None] * ctx.world
    dist.all_gather_object(out, obj, group=_HOST_GROUP[0])
    return out


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op on one process)."""
    if ctx.enabled:
        dist.barrier(group=_HOST_GROUP[0])


def shutdown(ctx: DistContext) -> None:
    """Leave the process group, if one was joined."""
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
        _HOST_GROUP[0] = None
