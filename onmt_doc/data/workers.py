"""Chunks of a corpus worked on by worker processes, the results in the chunks' order: the one
mechanism behind binarization (:mod:`onmt_doc.data.cache`) and vocabulary counting
(:mod:`onmt_doc.data.prepare`), both a tokenizer over millions of lines (``data.workers``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import deque
from itertools import chain
from typing import Any, Callable, Iterable, Iterator, TypeVar

from onmt_doc.devices import check_count

R = TypeVar("R")

_STATE: Any = None  # what a worker's ``make(payload)`` built: its tokenizer or codec


def default_workers() -> int:
    """``data.workers: 0``: min(4, CPU cores): preparation is a one-off pass and training may share
    the machine; more cores help little once reading the files is the bottleneck."""
    return min(4, os.cpu_count() or 1)


def check_workers(workers: int) -> int:
    """``data.workers`` as given, refused above a multiple of the cores (:func:`check_count`)."""
    return check_count(workers, "data.workers")


def _init(make: Callable[[Any], Any], payload: Any) -> None:
    """A worker's start: its state, and the default signal handling. A forked worker inherits the
    trainer's SIGTERM/SIGINT handlers (which only ask for a checkpoint at the next step), so without
    this it would log "SIGTERM received" and outlive the pool that terminates it; Ctrl-C is the
    parent's to handle (it ends the pool)."""
    global _STATE
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STATE = make(payload)


def _call(fn: Callable[..., R], task: tuple) -> R:
    return fn(_STATE, *task)


def ordered_map(
    fn: Callable[..., R], state: Any, make: Callable[[Any], Any], payload: Any, tasks: Iterable[tuple], workers: int
) -> Iterator[R]:
    """``fn(state, *task)`` for each task, yielded in the tasks' order: in this process (``state``),
    or by ``workers`` processes, each with its own ``make(payload)`` (``fn`` and ``make`` are
    module-level, so they pickle), with at most two tasks each in flight so that memory holds a
    few chunks whatever the corpus. A corpus of one task starts no process."""
    check_workers(workers)  # before any process starts, whatever the corpus' size
    it = iter(tasks)
    first = next(it, None)
    if first is None:
        return
    second = next(it, None)
    if workers <= 1 or second is None:
        for task in chain((first,), () if second is None else (second,), it):
            yield fn(state, *task)
        return
    pending: deque = deque()
    with multiprocessing.get_context().Pool(workers, _init, (make, payload)) as pool:
        for task in chain((first, second), it):
            pending.append(pool.apply_async(_call, (fn, task)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        pool.close()  # every task is done: let the workers end rather than be terminated
        pool.join()
