"""The boundary between host planning and compiled code: the functions that plan a batch's packing
or sentence offsets in numpy, on its host copies, run outside every compiled graph.

``@torch.compiler.disable`` does that, but it imports ``torch._dynamo`` when the decorated module is
imported: ~1 s of every command's start (translation on a CPU never compiles). :func:`host_planning`
defers it to the first call in a process that has imported ``torch._dynamo`` anyway."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

import torch

Fn = TypeVar("Fn", bound=Callable)


def host_planning(fn: Fn) -> Fn:
    """``fn`` kept out of compiled graphs, as ``@torch.compiler.disable`` keeps it.

    - While dynamo traces a call (``train.compile``, ``translate.compile`` or a user's own
      ``torch.compile``; ``is_compiling()`` is a constant True there), the call is to ``fn`` disabled:
      a graph break, then ``fn`` runs eagerly with compilation off, and so does all it calls.
    - Run eagerly in a process that has imported ``torch._dynamo``, the call is to ``fn`` disabled as
      well: this wrapper may be running in a frame dynamo gave up on, with its frame hook still set,
      which would otherwise compile ``fn``'s own frame (numpy under tracing). Under 1 µs a call.
    - Otherwise (nothing in the process compiles) ``fn`` runs as it is.

    tests/test_devices.py checks the bodies never run traced; the document models' tests, that the
    compiled forward breaks only at these calls."""
    is_compiling = torch.compiler.is_compiling
    disabled: list[Callable] = []  # fn under torch.compiler.disable, made at the first eager call that needs it

    @functools.wraps(fn)
    def planned(*args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            return torch.compiler.disable(fn)(*args, **kwargs)
        if "torch._dynamo" in sys.modules:
            if not disabled:
                disabled.append(torch.compiler.disable(fn))
            return disabled[0](*args, **kwargs)
        return fn(*args, **kwargs)

    return planned  # type: ignore[return-value]
