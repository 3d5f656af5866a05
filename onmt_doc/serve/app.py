"""The HTTP interface of ``onmt_doc_server``: a Flask app over one batching worker per model.

Endpoints (JSON in, JSON out; docs/deploy.md has curl examples):

- ``GET /health``: ``{"status": "ok", "models": [...], "in_flight": n, "requests": N, "batches": M,
  "max_batch_requests": K, "cancelled": C}`` (requests being translated; served so far; translator
  calls; the most requests one call translated together; requests dropped because their client
  disconnected or the server stopped). Never needs the API key; 503 with ``"status": "stopping"``
  once shutdown has begun, so a load balancer stops sending.
- ``GET /models``: per model its name, checkpoint file names (never their directories; several for
  an ensemble), unit, encoder/decoder types, vocabulary sizes, translate options; the default model
  and the request limits.
- ``POST /translate``: ``{"model": NAME (optional), "documents": [[sentence, ...], ...]}`` →
  ``{"model": NAME, "translations": [[...], ...]}``; ``{"document": [...]}`` (one document) →
  ``{"translation": [...]}``. ``"scores": true`` adds each best hypothesis' score;
  ``"n_best": k`` (at most the server's ``-n_best``) adds ``k`` ``{"text", "score"}`` per sentence.
  ``"context"``: per document (for ``"document"``: of that document) the sentences before it, each
  ``"source"`` or ``["source", "target"]`` (target null where unknown); the reply says what the
  model read of it: ``"context_used": "source+target" | "source" | "none"`` (a sentence model).
  ``"explain": true`` adds ``"explanation"``: per document (for ``"document"``: of that document)
  what the model read from context while it produced its translation, token by token
  (``evaluation/context_reading.py``: ``reliance`` and the model's other measures, and each
  sentence's attention on the document's source sentences); one forced pass per document on the
  model's worker, so every request limit bounds it. Not with ``"context"`` nor for an ensemble (400).
- ``GET /``: the translation page (``serve/page.py``), which calls ``/models`` and ``/translate``.

With an API key (``ServerState.api_key``), every endpoint but ``/health`` and the page ``/`` needs
``Authorization: Bearer KEY`` (compared in constant time); 401 otherwise. The page holds no data
(a browser cannot send the header when it opens it); it asks for the key and sends it with its calls.

Errors are ``{"error": "one line"}``: 400 malformed JSON (nested too deeply included) or shape, or a
bad option value; 401 a missing or wrong API key; 404 unknown model or path; 405 wrong method; 413
for every size limit (body over ``max_request_bytes``, more than ``max_sentences`` sentences, a
sentence over ``max_sentence_chars`` characters, more than ``max_request_chars`` characters in all,
context included, a document with more than ``max_context_sentences`` context sentences);
503 once the server is stopping; 500 for a bug (logged with its traceback).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import reprlib
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from onmt_doc.errors import UserError
from onmt_doc.registry import closest
from onmt_doc.serve.batcher import Batcher, Cancelled, NBest
from onmt_doc.translate.request_context import check_contexts
from onmt_doc.translate.translator import Translator, check_documents

log = logging.getLogger("onmt_doc")

REQUEST_KEYS = ("model", "documents", "document", "n_best", "scores", "context", "explain")
# what a model reads of a request's context (Translator.context_sides), as the reply says it
CONTEXT_USED = {("src", "tgt"): "source+target", ("src",): "source", (): "none"}
STOPPING = "the server is stopping; retry on another instance or after it restarts"
_SHOWN = reprlib.Repr()  # a client's value in an error message: short, one line, whatever it sent
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 2, 4, 4


@dataclass
class Limits:
    """Per-request limits; each over-limit request is refused with 413 before any translation."""

    max_request_bytes: int = 1_000_000
    max_sentences: int = 1000
    max_sentence_chars: int = 2000
    max_request_chars: int = 100_000  # the work one request may ask for: source characters in all
    max_context_sentences: int = 100  # context sentences given per document


@dataclass
class ServedModel:
    """A loaded model (one checkpoint, or several: an ensemble), the worker that alone uses its
    translator, and where it came from."""

    name: str
    checkpoints: list[str]
    translator: Translator
    batcher: Batcher

    def info(self) -> dict:
        """What GET /models tells a client about this model: enough to pick one and to know its limits;
        the checkpoints by their file names only (an absolute path tells an attacker about the
        machine). ``checkpoint`` is the one file name of a single model, null for an ensemble, whose
        ``checkpoints`` are its members in order (the encoder, decoder and sizes are the first's)."""
        t = self.translator
        model = t.cfg.model
        files = [os.path.basename(os.fspath(path)) for path in self.checkpoints]
        return {
            "name": self.name,
            "checkpoint": files[0] if len(files) == 1 else None,
            "checkpoints": files,
            "ensemble": len(files) > 1,
            "unit": t.model.unit,
            "encoder": model.encoder.type,
            "decoder": model.decoder.type,
            "d_model": model.d_model,
            "src_vocab_size": len(t.codec.src_vocab),
            "tgt_vocab_size": len(t.codec.tgt_vocab),
            "device": str(t.device),
            "translate": asdict(t.opt),
        }


class ApiError(Exception):
    """A refused request: HTTP status, a one-line message and any headers the status calls for."""

    def __init__(self, status: int, message: str, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


def _json(body: dict, status: int = 200) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status=status, mimetype="application/json")


def _shown(value: Any) -> str:
    """A client's value quoted in an error: repr (so one line), cut short (so a 1 MB key or a list
    nested 60 deep does not come back whole)."""
    return _SHOWN.repr(value)


def _number(x: float) -> Optional[float]:
    """JSON has no infinities: a hypothesis the search could not finish has no score (null)."""
    return x if math.isfinite(x) else None


class ServerState:
    """What the handlers share: the models, the limits, the API key (None: no key needed) and
    whether the server is stopping."""

    def __init__(
        self, models: dict[str, ServedModel], default: str, limits: Limits, api_key: Optional[str] = None
    ) -> None:
        self.models, self.default, self.limits, self.api_key = models, default, limits, api_key
        self.draining = False
        self.in_flight = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        """Count a request in (refused once draining), so shutdown can wait for it."""
        with self._lock:
            if self.draining:
                raise ApiError(503, STOPPING)
            self.in_flight += 1

    def leave(self) -> None:
        """Count a request out; the drain waits for the count to reach zero."""
        with self._lock:
            self.in_flight -= 1


@dataclass
class TranslateRequest:
    """A checked /translate body."""

    model: ServedModel
    documents: list[list[str]]
    single: bool  # one "document" given (the reply is "translation")
    n_best: int  # n-best fields asked (0 = none)
    scores: bool
    context: Optional[list[list[tuple[str, Optional[str]]]]]  # per document, or None (none given)
    explain: bool = False  # add what the model read from context ("explanation")


def parse_request(body: bytes, state: ServerState) -> TranslateRequest:
    """A /translate body checked against shape and limits."""
    data = _load_json(body)
    if not isinstance(data, dict):
        raise ApiError(400, f"expected a JSON object with 'documents' or 'document', got {type(data).__name__}")
    for key in data:
        if key not in REQUEST_KEYS:
            raise ApiError(400, f"unknown key {_shown(key)}{_closest(key, REQUEST_KEYS)}")
    name = data.get("model", state.default)
    if not isinstance(name, str):
        raise ApiError(400, f"'model' must be a string, got {type(name).__name__}")
    if name not in state.models:
        raise ApiError(404, f"unknown model {_shown(name)}{_closest(name, state.models)}; see GET /models")
    model = state.models[name]
    if ("documents" in data) == ("document" in data):
        raise ApiError(400, "give either 'documents' (a list of documents) or 'document' (a list of sentences)")
    single = "document" in data
    documents = [data["document"]] if single else data["documents"]
    try:
        check_documents(documents, "document" if single else "documents")
    except UserError as e:
        raise ApiError(400, str(e).replace("document[0]", "document")) from None
    context = _context(data["context"], documents, single) if "context" in data else None
    _check_limits(documents, single, state.limits, context)
    n_best = data.get("n_best", 0)
    most = model.translator.opt.n_best
    if isinstance(n_best, bool) or not isinstance(n_best, int) or not 0 <= n_best <= most:
        raise ApiError(
            400, f"'n_best' must be an integer from 1 to {most} (the server's -n_best), got {_shown(n_best)}"
        )
    scores = data.get("scores", False)
    if not isinstance(scores, bool):
        raise ApiError(400, f"'scores' must be true or false, got {_shown(scores)}")
    return TranslateRequest(model, documents, single, n_best, scores, context, _explain(data, model, context))


def _explain(data: dict, model: ServedModel, context: Optional[list]) -> bool:
    """The request's ``"explain"``, checked: a boolean, for one model, without ``"context"``."""
    explain = data.get("explain", False)
    if not isinstance(explain, bool):
        raise ApiError(400, f"'explain' must be true or false, got {_shown(explain)}")
    if explain and context is not None:
        raise ApiError(400, "'explain' reads a document on its own: send it without 'context'")
    if explain and len(model.checkpoints) > 1:
        raise ApiError(400, f"'explain' needs a single model; {model.name} is an ensemble")
    return explain


def explanations(translator: Translator, documents: list[list[str]], out: NBest) -> list[Optional[dict]]:
    """What the model read from context while producing each document's best translation (None for
    an empty document); runs on the model's worker (``Batcher.call``)."""
    from onmt_doc.evaluation.context_reading import read_document

    return [
        read_document(translator, doc, [fields[0][0] for fields in hyp]).to_json() if doc else None
        for doc, hyp in zip(documents, out)
    ]


def _context(value: Any, documents: list[list[str]], single: bool) -> list[list[tuple[str, Optional[str]]]]:
    """The request's ``"context"`` checked (as ``Translator.nbest`` checks it), one list per document."""
    try:
        return check_contexts([value] if single else value, len(documents))
    except UserError as e:
        raise ApiError(400, str(e).replace("context[0]", "context") if single else str(e)) from None


def _load_json(body: bytes) -> Any:
    """The body as JSON; anything else (nesting too deep for the parser included) is a 400."""
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ApiError(400, f"malformed JSON: {e}") from None
    except RecursionError:
        raise ApiError(
            400, "JSON nested too deeply: a request is an object whose 'documents' is a list of lists of strings"
        ) from None


def _closest(name: str, candidates: Any) -> str:
    """closest()'s suggestion, skipped for names far longer than any candidate (a cheap bound)."""
    return closest(name, list(candidates)) if len(name) <= 100 else ""


def _check_limits(documents: list[list[str]], single: bool, limits: Limits, context: Optional[list] = None) -> None:
    """413 for a request over a size limit, naming the limit and its flag, before any translation."""
    for d, ctx in enumerate(context or []):
        if len(ctx) > limits.max_context_sentences:
            where = "context" if single else f"context[{d}]"
            raise ApiError(
                413,
                f"{where}: {len(ctx)} sentences; the limit is {limits.max_context_sentences} per document "
                f"(-max_context_sentences); the model reads only its own window of them",
            )
        for i, pair in enumerate(ctx):
            for text in pair:
                if text is not None and len(text) > limits.max_sentence_chars:
                    where = f"context[{i}]" if single else f"context[{d}][{i}]"
                    raise ApiError(
                        413, f"{where}: {len(text)} characters; the limit is {limits.max_sentence_chars} per sentence"
                    )
    n_sentences = sum(len(d) for d in documents)
    if n_sentences > limits.max_sentences:
        raise ApiError(
            413, f"{n_sentences} sentences in one request; the limit is {limits.max_sentences} (-max_sentences)"
        )
    for d, doc in enumerate(documents):
        for i, sentence in enumerate(doc):
            if len(sentence) > limits.max_sentence_chars:
                where = f"document[{i}]" if single else f"documents[{d}][{i}]"
                raise ApiError(
                    413, f"{where}: {len(sentence)} characters; the limit is {limits.max_sentence_chars} per sentence"
                )
    n_chars = sum(len(sentence) for doc in documents for sentence in doc)
    n_chars += sum(len(text) for ctx in context or [] for pair in ctx for text in pair if text is not None)
    if n_chars > limits.max_request_chars:
        raise ApiError(
            413,
            f"{n_chars} characters of text (sentences and context) in one request; the limit is "
            f"{limits.max_request_chars} "
            f"(-max_request_chars): split it into several requests",
        )


def check_api_key(header: Optional[str], key: str) -> None:
    """401 unless ``header`` is ``Bearer <key>``; the comparison takes the same time wherever the
    given key differs (hmac.compare_digest), so timing reveals nothing of the key."""
    challenge = {"WWW-Authenticate": 'Bearer realm="onmt_doc"'}
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(401, "this server needs an API key: send the header 'Authorization: Bearer <key>'", challenge)
    if not hmac.compare_digest(given.strip().encode("utf-8"), key.encode("utf-8")):
        raise ApiError(401, "wrong API key", challenge)


def client_gone(environ: dict) -> Callable[[], bool]:
    """Whether the request's client has disconnected: waitress tells it (``waitress.client_disconnected``,
    with ``channel_request_lookahead`` > 0, as onmt_doc_server sets); other servers: never."""
    return environ.get("waitress.client_disconnected") or (lambda: False)


def response_body(
    name: str,
    out: NBest,
    single: bool,
    n_best: int,
    scores: bool,
    context_used: Optional[str] = None,
    explanation: Optional[list] = None,
) -> dict:
    """The reply: translations in the request's shape, plus the n-best and scores when asked, what
    the model read of a given context, and the explanation when asked."""
    translations = [[fields[0][0] for fields in doc] for doc in out]
    body: dict[str, Any] = {"model": name, "translations": translations}
    if scores:
        body["scores"] = [[_number(fields[0][1]) for fields in doc] for doc in out]
    if n_best:
        body["n_best"] = [
            [[{"text": text, "score": _number(score)} for text, score in fields[:n_best]] for fields in doc]
            for doc in out
        ]
    if explanation is not None:
        body["explanation"] = explanation
    if single:  # {"document": [...]} -> {"translation": [...]}, scores and n_best of that document
        body = {("translation" if k == "translations" else k): v if k == "model" else v[0] for k, v in body.items()}
    if context_used is not None:
        body["context_used"] = context_used
    return body


def create_app(state: ServerState) -> Flask:
    """The Flask app over ``state`` (its models may be filled in after the app is made)."""
    app = Flask("onmt_doc.serve")
    app.config["MAX_CONTENT_LENGTH"] = state.limits.max_request_bytes

    @app.errorhandler(ApiError)
    def api_error(e: ApiError) -> Response:
        response = _json({"error": str(e)}, e.status)
        response.headers.update(e.headers)
        return response

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        message = e.description or e.name
        if e.code == 413:
            message = f"request body over the limit of {state.limits.max_request_bytes} bytes (-max_request_bytes)"
        return _json({"error": message}, e.code or 500)

    @app.errorhandler(Exception)
    def bug(e: Exception) -> Response:
        log.exception("request failed")
        return _json({"error": f"internal error: {type(e).__name__}: {e}"}, 500)

    @app.before_request
    def gate() -> Optional[Response]:
        """Every path but /health (unknown ones too, so they reveal nothing) needs the key; once the
        server is stopping, new requests get 503 at once instead of a reset connection later."""
        if request.path == "/health":
            return None
        if state.api_key is not None and request.path != "/":  # the page holds no data; its calls send the key
            check_api_key(request.headers.get("Authorization"), state.api_key)
        if state.draining:
            raise ApiError(503, STOPPING)
        return None

    @app.get("/health")
    def health() -> Response:
        stats = [m.batcher.stats for m in state.models.values()]
        return _json(
            {
                "status": "stopping" if state.draining else "ok",
                "models": list(state.models),
                "in_flight": state.in_flight,
                "requests": sum(s.requests for s in stats),
                "batches": sum(s.batches for s in stats),
                "max_batch_requests": max((s.max_batch_requests for s in stats), default=0),
                "cancelled": sum(s.cancelled for s in stats),
            },
            503 if state.draining else 200,
        )

    @app.get("/")
    def page() -> Response:
        from onmt_doc.serve.page import PAGE

        response = Response(PAGE, mimetype="text/html")
        # everything the page needs is in it: forbid loading anything from elsewhere
        response.headers["Content-Security-Policy"] = (
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
            "img-src 'self' data:; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.get("/models")
    def models() -> Response:
        return _json(
            {
                "default": state.default,
                "models": [m.info() for m in state.models.values()],
                "limits": asdict(state.limits),
            }
        )

    @app.post("/translate")
    def translate() -> Response:
        body = request.get_data(cache=False)  # over MAX_CONTENT_LENGTH: 413 before reading
        req = parse_request(body, state)
        model = req.model
        state.enter()
        try:
            out = model.batcher.translate(req.documents, client_gone(request.environ), context=req.context)
            explained = None
            if req.explain:
                explained = model.batcher.call(lambda t: explanations(t, req.documents, out)).result()
        except Cancelled as e:
            raise ApiError(503, f"cancelled: {e}") from None
        except UserError as e:
            raise ApiError(400, str(e)) from None
        except RuntimeError as e:
            if model.batcher.stopping:
                raise ApiError(503, STOPPING) from None
            raise e
        finally:
            state.leave()
        used = None if req.context is None else CONTEXT_USED[model.translator.context_sides()]
        return _json(response_body(model.name, out, req.single, req.n_best, req.scores, used, explained))

    return app
