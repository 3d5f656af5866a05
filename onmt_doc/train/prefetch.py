"""The next training batches, prepared while the GPU computes the current step.

Collating a batch (padding, tags, target positions), planning its attention (the document models'
sentence offsets and packings, ``EncoderDecoder.prepare``) and copying it to the GPU are host work;
done in the loop they sit between two steps, while the GPU idles. :class:`Prefetcher` collates and
plans ahead in one thread, in page-locked memory (``Batch.pin_memory``), so the loop's copy to the device returns
at once (``Batch.to`` is non-blocking) and the host goes on queuing the step. The sampler's position
is the one of the batches the loop consumed, so checkpoints and exact resume are unchanged; the
batches and their order are the sampler's own. Used on CUDA only: on a CPU the thread would take
a core from the step.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, Optional

from onmt_doc.contracts import Batch
from onmt_doc.data.batching import BatchSampler


class Prefetcher:
    """``next()`` gives the sampler's next batch, prepared ``depth`` batches ahead in a thread."""

    def __init__(
        self,
        sampler: BatchSampler,
        depth: int = 2,
        pin: bool = True,
        prepare: Optional[Callable[[Batch], Batch]] = None,
    ) -> None:
        """Starts reading from the sampler's current position; ``prepare`` runs on each batch in the
        thread (the model's host plans, ``EncoderDecoder.prepare``); ``pin`` puts batches in
        page-locked memory."""
        self.sampler, self.pin, self.prepare = sampler, pin, prepare
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._fill, args=(sampler.epoch, sampler.position), name="onmt_doc-prefetch", daemon=True
        )
        self._thread.start()

    def _fill(self, epoch: int, position: int) -> None:
        try:
            for batch, e, p in self.sampler.batches_from(epoch, position):
                if self.prepare is not None:
                    batch = self.prepare(batch)
                if not self._put((batch.pin_memory() if self.pin else batch, e, p)):
                    return
        except BaseException as e:  # handed to the loop, which raises it where it would have happened
            self._put(e)

    def _put(self, item: object) -> bool:
        """Queue ``item``, waiting for room; False once :meth:`close` was called."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        """The next batch; the sampler's position moves past it (what a checkpoint saves)."""
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        batch, self.sampler.epoch, self.sampler.position = item
        return batch

    def close(self, timeout: Optional[float] = 5.0) -> None:
        """Stop the thread (batches prepared but not consumed are dropped; the sampler stays where
        the loop left it)."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)
