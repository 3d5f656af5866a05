"""The batching worker: one thread per model owns its Translator (which is not thread-safe).

HTTP handler threads put requests on the worker's queue and wait on a future. The worker takes
the first queued request, then keeps taking requests while their source words fit in
``batch_tokens`` and at most ``batch_wait_ms`` have passed since the first one, translates all
their documents in one ``Translator.nbest`` call (the translator sorts and batches them itself)
and hands every request back its own slice of the result. Under load, requests that arrive
together are translated together; a lone request waits ``batch_wait_ms`` at most.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Optional

from onmt_doc.translate.translator import Documents, Translator

log = logging.getLogger("onmt_doc")

NBest = list[list[list[tuple[str, float]]]]  # [document][sentence][n_best field] = (text, score)


def source_words(documents: Documents) -> int:
    """A request's size for the batch budget: whitespace-separated source words (cheap to count in
    the HTTP thread; the translator's own batches count subwords)."""
    return sum(len(sentence.split()) for doc in documents for sentence in doc)


@dataclass
class _Request:
    documents: Documents
    words: int
    future: Future = field(default_factory=Future)


@dataclass
class BatcherStats:
    """What the worker did: requests served, translator calls, the most requests in one call."""

    requests: int = 0
    batches: int = 0
    max_batch_requests: int = 0


class Batcher:
    """Serialises all use of one Translator on a worker thread and batches concurrent requests."""

    def __init__(self, translator: Translator, batch_tokens: int = 2048, batch_wait_ms: float = 10.0, name: str = ""):
        self.translator = translator
        self.batch_tokens, self.batch_wait = batch_tokens, batch_wait_ms / 1000.0
        self.stats = BatcherStats()
        self._queue: queue.Queue[Optional[_Request]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"onmt_doc-batcher-{name}", daemon=True)
        self._stopping = False
        self._pending: Optional[_Request] = None  # taken from the queue but over the last batch's budget
        self._thread.start()

    @property
    def stopping(self) -> bool:
        """True once stop() was called: new requests are refused (503), queued ones still answered."""
        return self._stopping

    def submit(self, documents: Documents) -> Future:
        """Queue documents (already checked by the caller); the future's result is their n-best."""
        if self._stopping:
            raise RuntimeError("the batcher is stopping")
        request = _Request(documents, source_words(documents))
        self._queue.put(request)
        return request.future

    def translate(self, documents: Documents, timeout: Optional[float] = None) -> NBest:
        """Submit and wait: what a handler thread calls."""
        return self.submit(documents).result(timeout)

    def stop(self, timeout: Optional[float] = None) -> None:
        """Finish what is queued, then end the worker."""
        self._stopping = True
        self._queue.put(None)
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the worker
    def _take(self, first: _Request) -> tuple[list[_Request], bool]:
        """``first`` and the requests that follow it within the word budget and the wait; whether
        the stop sentinel was met."""
        batch, words = [first], first.words
        deadline = time.monotonic() + self.batch_wait
        while words < self.batch_tokens:
            left = deadline - time.monotonic()
            try:
                nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                return batch, True
            if words + nxt.words > self.batch_tokens:
                self._pending = nxt  # starts the next batch
                break
            batch.append(nxt)
            words += nxt.words
        return batch, False

    def _run(self) -> None:
        stop = False
        while True:
            if self._pending is not None:
                first, self._pending = self._pending, None
            elif stop:
                try:  # after the sentinel: drain what is still queued, without waiting
                    first = self._queue.get_nowait()
                except queue.Empty:
                    return
                if first is None:
                    continue
            else:
                first = self._queue.get()
                if first is None:
                    stop = True
                    continue
            batch, met_stop = self._take(first)
            stop = stop or met_stop
            self._serve(batch)

    def _serve(self, batch: list[_Request]) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        self.stats.requests += len(live)
        self.stats.batches += 1
        self.stats.max_batch_requests = max(self.stats.max_batch_requests, len(live))
        try:
            out = self.translator.nbest([doc for r in live for doc in r.documents])
        except Exception as e:  # noqa: BLE001 - handed to the waiting requests
            if len(live) == 1:
                live[0].future.set_exception(e)
                return
            log.warning(f"a batch of {len(live)} requests failed ({e}); translating them one by one")
            for r in live:
                try:
                    r.future.set_result(self.translator.nbest(r.documents))
                except Exception as e1:  # noqa: BLE001
                    r.future.set_exception(e1)
            return
        i = 0
        for r in live:  # each request gets its own documents back, in its order
            r.future.set_result(out[i : i + len(r.documents)])
            i += len(r.documents)
