"""The boundary between host planning and compiled code: the functions that plan a batch's packing
or sentence offsets in numpy, on its host copies, run outside every compiled graph.

``@torch.compiler.disable`` does that, but it imports ``torch._dynamo`` when the decorated module is
imported: ~1 s of every command's start (translation on a CPU never compiles). :func:`host_planning`
defers it to the moment dynamo traces the function, when ``torch._dynamo`` is imported anyway."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import torch  # a module global, not a closure cell: dynamo resumes after the graph break below only then

Fn = TypeVar("Fn", bound=Callable)


def host_planning(fn: Fn) -> Fn:
    """``fn`` kept out of compiled graphs, as ``@torch.compiler.disable`` keeps it. In eager code
    ``fn`` runs as it is (one flag read). Under ``torch.compile`` (``train.compile``,
    ``translate.compile`` or a user's own) dynamo traces this wrapper, where ``is_compiling()`` is
    True, and meets ``fn`` disabled: a graph break, then ``fn`` runs eagerly with compilation off,
    and so does everything it calls (tests/test_devices.py, and the document models' graph counts)."""
    is_compiling = torch.compiler.is_compiling

    @functools.wraps(fn)
    def planned(*args: Any, **kwargs: Any) -> Any:
        if is_compiling():  # only while dynamo traces
            return torch.compiler.disable(fn)(*args, **kwargs)
        return fn(*args, **kwargs)

    return planned  # type: ignore[return-value]
