"""The batching worker: one thread per model owns its Translator (which is not thread-safe).

HTTP handler threads submit requests and wait on a future. A request is cut into **slices** of
at most ``batch_tokens`` source words: runs of sentences for a sentence-level model (each
sentence is translated alone, so cutting a document changes nothing), runs of whole documents
for a document-level one (a document is translated in context, so it is never cut). The worker
forms each translation call from the slices of the requests waiting, **round-robin**: the call
starts with the next request in turn and adds the next slice of each request while the words
fit. A request of 400 long sentences is then many calls, and a small request that arrives
meanwhile waits for about one of them, not for the whole large request. When no request has a
slice left over, the worker waits at most ``batch_wait_ms`` for more requests to join the call,
so requests that arrive together are still translated together.

Before each call the worker drops the requests whose client has gone (``is_gone``, e.g.
waitress's ``client_disconnected``) and, after :meth:`Batcher.cancel_all`, every request: their
remaining slices are never translated and their futures fail with :class:`Cancelled`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from onmt_doc.translate.translator import Documents, Translator

log = logging.getLogger("onmt_doc")

NBest = list[list[list[tuple[str, float]]]]  # [document][sentence][n_best field] = (text, score)
WORD_CHARS = 8  # a sentence costs at least one word per this many characters (text without spaces)
_STOP, _WAKE = "stop", "wake"  # queue markers: finish and end; look at cancellations now


class Cancelled(Exception):
    """A request dropped before it was translated: its client disconnected, or the server stopped."""


def sentence_cost(sentence: str) -> int:
    """A sentence's size for the batch budget: its whitespace-separated words, or one word per
    ``WORD_CHARS`` characters if that is more, so text without spaces (or one endless "word")
    cannot pass as one word. Cheap enough for the HTTP thread; the translator counts subwords."""
    return max(len(sentence.split()), len(sentence) // WORD_CHARS, 1)


@dataclass
class Part:
    """Consecutive sentences of one document: ``sentences`` start at sentence ``first`` of document ``doc``."""

    doc: int
    first: int
    sentences: list[str]


@dataclass(eq=False)
class _Slice:
    """What one request adds to one translation call (compared by identity)."""

    request: "_Request"
    parts: list[Part]
    cost: int


@dataclass(eq=False)
class _Request:
    """A submitted request: its slices still to translate and its answer, filled in slice by slice."""

    documents: Documents
    context: Optional[list]  # per document, its preceding sentences (translator.nbest's context), or None
    out: NBest
    is_gone: Callable[[], bool]
    slices: deque = field(default_factory=deque)  # of _Slice, not yet translated
    total: int = 0  # slices
    left: int = 0  # slices not yet translated
    future: Future = field(default_factory=Future)


@dataclass(eq=False)
class _Call:
    """Work for the worker besides translation (:meth:`Batcher.call`)."""

    fn: Callable[[Translator], object]
    future: Future = field(default_factory=Future)

    def run(self, translator: Translator) -> None:
        """Call ``fn``; its result or exception goes to the future."""
        if self.future.set_running_or_notify_cancel():
            try:
                self.future.set_result(self.fn(translator))
            except Exception as e:  # noqa: BLE001 - handed to the waiting request
                self.future.set_exception(e)


def cut(documents: Documents, budget: int, split_documents: bool) -> list[tuple[list[Part], int]]:
    """``documents`` as slices of at most ``budget`` cost each (one unit over it is a slice of its
    own): (parts, cost) in order. ``split_documents``: cut between sentences (a sentence-level
    model); else only between documents, which a document-level model translates in context."""
    slices: list[tuple[list[Part], int]] = []
    parts: list[Part] = []
    cost = 0
    for d, doc in enumerate(documents):
        units = [(i, [s]) for i, s in enumerate(doc)] if split_documents else [(0, list(doc))] if doc else []
        for first, sentences in units:
            c = sum(sentence_cost(s) for s in sentences)
            if parts and cost + c > budget:
                slices.append((parts, cost))
                parts, cost = [], 0
            if parts and parts[-1].doc == d:  # the next sentences of the same document
                parts[-1].sentences += sentences
            else:
                parts.append(Part(d, first, sentences))
            cost += c
    if parts:
        slices.append((parts, cost))
    return slices


@dataclass
class BatcherStats:
    """What the worker did: requests answered, translator calls, the most requests in one call,
    requests cancelled (client gone or server stopped) before they were translated in full."""

    requests: int = 0
    batches: int = 0
    max_batch_requests: int = 0
    cancelled: int = 0


class Batcher:
    """Serialises all use of one Translator on a worker thread; cuts requests into slices and
    translates them round-robin, batching slices of concurrent requests together."""

    def __init__(self, translator: Translator, batch_tokens: int = 2048, batch_wait_ms: float = 10.0, name: str = ""):
        self.translator = translator
        self.batch_tokens, self.batch_wait = batch_tokens, batch_wait_ms / 1000.0
        self.split_documents = translator.model.unit == "sentence"
        self.stats = BatcherStats()
        self._queue: queue.Queue[Union[_Request, _Call, str]] = queue.Queue()
        self._lock = threading.Lock()  # orders submit() against stop(): nothing is queued after the sentinel
        self._stopping = False
        self._closing = False  # the worker met the sentinel: serve what is left, then end
        self._abort: Optional[str] = None  # cancel_all()'s reason, read by the worker
        self._active: deque[_Request] = deque()  # the worker's requests with slices left, in turn order
        self._thread = threading.Thread(target=self._run, name=f"onmt_doc-batcher-{name}", daemon=True)
        self._thread.start()

    @property
    def stopping(self) -> bool:
        """True once stop() was called: new requests are refused (503), queued ones still answered."""
        return self._stopping

    def submit(
        self, documents: Documents, is_gone: Optional[Callable[[], bool]] = None, context: Optional[list] = None
    ) -> Future:
        """Queue documents (already checked by the caller); the future's result is their n-best.
        ``is_gone()`` true (the client disconnected) drops what is left of the request. ``context``:
        per document, its preceding sentences (checked), for a model that reads them (a sentence
        model's documents are cut into sentences, which read none)."""
        slices = cut(documents, self.batch_tokens, self.split_documents)
        out: NBest = [[[] for _ in doc] for doc in documents]  # the answer's shape, filled slice by slice
        context = None if self.split_documents else context
        request = _Request(documents, context, out, is_gone or (lambda: False), total=len(slices), left=len(slices))
        request.slices.extend(_Slice(request, parts, cost) for parts, cost in slices)
        with self._lock:
            if self._stopping:
                raise RuntimeError("the batcher is stopping")
            self._queue.put(request)
        return request.future

    def translate(
        self,
        documents: Documents,
        is_gone: Optional[Callable[[], bool]] = None,
        timeout: Optional[float] = None,
        context: Optional[list] = None,
    ) -> NBest:
        """Submit and wait: what a handler thread calls. Raises :class:`Cancelled` if dropped."""
        return self.submit(documents, is_gone, context).result(timeout)

    def call(self, fn: Callable[[Translator], object]) -> Future:
        """Run ``fn(translator)`` on the worker, between two translation calls (the translator is
        the worker's alone): the forced pass of a request's ``"explain"``. Its future holds the result."""
        job = _Call(fn)
        with self._lock:
            if self._stopping:
                raise RuntimeError("the batcher is stopping")
            self._queue.put(job)
        return job.future

    def cancel_all(self, reason: str) -> None:
        """Drop every request, queued or in progress, at the worker's next call (the one running
        finishes); their futures fail with ``Cancelled(reason)``. For a shutdown past its grace."""
        self._abort = reason
        self._queue.put(_WAKE)  # the worker may be waiting for company

    def stop(self, timeout: Optional[float] = None) -> None:
        """Refuse new requests, finish what is queued (unless cancelled), then end the worker."""
        with self._lock:
            self._stopping = True
            self._queue.put(_STOP)
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the worker
    def _run(self) -> None:
        while True:
            self._admit(block=not self._active and not self._closing)
            self._drop_cancelled()
            if not self._active:
                if self._closing and self._queue.empty():
                    return
                continue
            batch = self._take()
            self._drop_cancelled()  # gone while the worker waited for company
            self._serve([s for s in batch if not s.request.future.done()])

    def _admit(self, block: bool) -> None:
        """Move queued requests to the active ones (waiting for one if ``block``)."""
        if block:
            self._receive(self._queue.get())
        while True:
            try:
                self._receive(self._queue.get_nowait())
            except queue.Empty:
                return

    def _receive(self, item: Union[_Request, "_Call", str]) -> None:
        if item == _STOP:
            self._closing = True
        elif isinstance(item, str):  # _WAKE
            return
        elif isinstance(item, _Call):
            item.run(self.translator)
        elif item.left == 0:  # nothing to translate (no sentences): answered at once
            item.future.set_result(item.out)
            self.stats.requests += 1
        else:
            self._active.append(item)

    def _drop_cancelled(self) -> None:
        """Fail the requests whose client has gone, or all of them after cancel_all()."""
        for r in list(self._active):
            reason = self._abort or ("the client disconnected" if self._gone(r) else None)
            if reason is None:
                continue
            log.info(f"request cancelled ({reason}): {r.total - r.left} of its {r.total} slices translated")
            self.stats.cancelled += 1
            self._fail(r, Cancelled(reason))

    @staticmethod
    def _gone(r: _Request) -> bool:
        try:
            return bool(r.is_gone())
        except Exception:  # noqa: BLE001 - a broken check must not stop the worker
            return False

    def _take(self) -> list[_Slice]:
        """The slices of the next call: round-robin from the next request in turn while they fit;
        when every request's slices are taken, wait up to ``batch_wait`` for company."""
        self._active.rotate(-1)  # whoever started the last call goes last
        batch: list[_Slice] = []
        cost = self._fill(batch, 0)
        deadline = time.monotonic() + self.batch_wait
        while (
            cost < self.batch_tokens and not (self._closing or self._abort) and not any(r.slices for r in self._active)
        ):
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            self._receive(item)
            cost = self._fill(batch, cost)
        return batch

    def _fill(self, batch: list[_Slice], cost: int) -> int:
        """Add to ``batch`` one slice per request per round, in turn order, while they fit."""
        taken = True
        while taken:
            taken = False
            for r in self._active:
                if r.slices and (not batch or cost + r.slices[0].cost <= self.batch_tokens):
                    s = r.slices.popleft()
                    batch.append(s)
                    cost += s.cost
                    taken = True
        return cost

    def _serve(self, batch: list[_Slice]) -> None:
        if not batch:
            return
        owners = list(dict.fromkeys(s.request for s in batch))
        self.stats.batches += 1
        self.stats.max_batch_requests = max(self.stats.max_batch_requests, len(owners))
        try:
            self._place(batch, self.translator.nbest(*_documents(batch)))
            return
        except Exception as e:  # noqa: BLE001 - handed to the waiting requests
            if len(owners) == 1:
                self._fail(owners[0], e)
                return
            log.warning(f"a batch of {len(owners)} requests failed ({e}); translating them one by one")
        for r in owners:
            mine = [s for s in batch if s.request is r]
            try:
                self._place(mine, self.translator.nbest(*_documents(mine)))
            except Exception as e1:  # noqa: BLE001
                self._fail(r, e1)

    def _place(self, slices: list[_Slice], out: NBest) -> None:
        """Put each part's translations where its sentences are in its request; answer the
        requests whose last slice this was."""
        k = 0
        for s in slices:
            r = s.request
            for part in s.parts:
                r.out[part.doc][part.first : part.first + len(part.sentences)] = out[k]
                k += 1
            r.left -= 1
            if r.left == 0 and not r.future.done():
                r.future.set_result(r.out)
                self.stats.requests += 1
                self._active.remove(r)

    def _fail(self, r: _Request, e: BaseException) -> None:
        r.slices.clear()
        if not r.future.done():
            r.future.set_exception(e)
        if r in self._active:
            self._active.remove(r)


def _documents(slices: list[_Slice]) -> tuple[list[list[str]], Optional[list]]:
    """What the translator is given for ``slices``: each part as a document of its own, and each
    part's context (None when no request of the call has any; a part of a document-level model's
    request is a whole document)."""
    docs = [part.sentences for s in slices for part in s.parts]
    if all(s.request.context is None for s in slices):
        return docs, None
    return docs, [s.request.context[part.doc] if s.request.context else [] for s in slices for part in s.parts]
