"""onmt_doc_server -model CKPT [-model NAME=CKPT ...] [-model NAME=A.pt B.pt ...] [-host 127.0.0.1] [-port 5000] …

Serves translation as JSON over HTTP (Flask app, waitress server; docs/deploy.md): ``GET /health``,
``GET /models``, ``POST /translate`` with ``{"model": NAME, "documents": [[sentence, ...], ...]}``
and, for document models, ``"context"``: per document its preceding sentences (and translations).
Each -model is one served model; the first is the default; ``NAME=CKPT`` names a model (an unnamed
one is ``default``). Several checkpoints after one -model (``-model NAME=A.pt B.pt``) are one model,
an ensemble, as ``onmt_doc_translate -model A.pt B.pt`` translates them (-ensemble_average).
Each model's worker thread cuts requests into slices of at most -batch_tokens source words and
translates the slices of concurrent requests together, round-robin, so a large request cannot
hold the worker; it waits at most -batch_wait_ms for more requests. A request over
-max_request_chars characters is refused (413); one whose client disconnects is dropped.
With an API key (-api_key_file, or the environment variable ONMT_DOC_API_KEY) every endpoint but
/health needs ``Authorization: Bearer KEY``; a -host other than loopback prints a warning.
SIGTERM or SIGINT answers new requests 503, lets the requests in progress finish (those still
running after -shutdown_grace seconds get 503) and exits with status 0.
Needs the ``server`` extra: ``pip install -e .[server]``.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.errors import UserError
from onmt_doc.outputs import input_problem, read_input_bytes

PROG = "onmt_doc_server"
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
API_KEY_ENV = "ONMT_DOC_API_KEY"
API_KEY = re.compile(r"^[!-~]+$")  # printable ASCII, no spaces: what an HTTP header carries as is
KEY_BYTES = 4096  # the most read of -api_key_file (a key is a line of tens of characters)
# flag -> translate option it overrides (None: keep the checkpoint's)
OPTION_FLAGS = {
    "beam": "beam",
    "n_best": "n_best",
    "dtype": "dtype",
    "max_length": "max_length",
    "max_input_tokens": "max_input_tokens",
    "ensemble_average": "ensemble_average",
}


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument(
        "-model",
        "--model",
        required=True,
        action="append",
        nargs="+",
        metavar="[NAME=]CKPT",
        help="a model to serve: a checkpoint, or several (an ensemble); repeat -model for more models",
    )
    p.add_argument("-host", "--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("-port", "--port", type=int, default=5000, help="port (0: any free port, printed at start)")
    p.add_argument("-device", "--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("-max_request_bytes", "--max_request_bytes", type=int, default=1_000_000, help="413 above")
    p.add_argument("-max_sentences", "--max_sentences", type=int, default=1000, help="per request; 413 above")
    p.add_argument("-max_sentence_chars", "--max_sentence_chars", type=int, default=2000, help="413 above")
    p.add_argument(
        "-max_request_chars",
        "--max_request_chars",
        type=int,
        default=100_000,
        help="characters of text per request, context included (the work one request may ask for); 413 above",
    )
    p.add_argument(
        "-max_context_sentences",
        "--max_context_sentences",
        type=int,
        default=100,
        help="context sentences given per document; 413 above (a model reads only its own window of them)",
    )
    p.add_argument(
        "-api_key_file",
        "--api_key_file",
        help=f"file holding the API key every endpoint but /health then needs (else ${API_KEY_ENV}, if set)",
    )
    # refused with a reason (and so no prefix of -api_key_file, which would read the key as a path)
    p.add_argument("-api_key", "--api_key", help=argparse.SUPPRESS)
    p.add_argument(
        "-shutdown_grace",
        "--shutdown_grace",
        type=float,
        default=30.0,
        help="seconds the requests in progress get to finish after SIGTERM/SIGINT (then 503)",
    )
    p.add_argument(
        "-batch_tokens",
        "--batch_tokens",
        type=int,
        default=2048,
        help="source words per worker batch; requests are cut into slices of this size",
    )
    p.add_argument(
        "-batch_wait_ms", "--batch_wait_ms", type=float, default=10.0, help="longest wait for more requests to batch"
    )
    p.add_argument("-http_threads", "--http_threads", type=int, default=32, help="requests handled at once")
    p.add_argument("-threads", "--threads", type=int, default=0, help="CPU threads for torch (0 = all cores)")
    p.add_argument("-beam", "--beam", type=int)
    p.add_argument("-n_best", "--n_best", type=int, help="most hypotheses a request may ask for ('n_best': k)")
    p.add_argument("-dtype", "--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("-max_length", "--max_length", type=int, help="output cap per sentence (tokens)")
    p.add_argument("-max_input_tokens", "--max_input_tokens", type=int, help="longer lines translate in pieces")
    p.add_argument(
        "-ensemble_average",
        "--ensemble_average",
        choices=["log_prob", "prob"],
        help="ensembles: average log-probabilities (default) or probabilities",
    )
    return p


def model_specs(values: list[list[str]]) -> list[tuple[str, list[str]]]:
    """(name, checkpoints) of each -model: ``NAME=CKPT [CKPT ...]`` or ``CKPT [CKPT ...]`` (named
    ``default``); several checkpoints are one ensemble. A checkpoint whose file name holds ``=`` is
    a checkpoint when ``NAME=CKPT`` names no file; otherwise write it as a path (``./lr=0.1.pt``) or
    name it (``-model m=lr=0.1.pt``: the name ends at the first ``=``)."""
    specs: list[tuple[str, list[str]]] = []
    for value in values:
        first, more = (value[0], value[1:]) if isinstance(value, list) else (value, [])
        name, sep, path = first.partition("=")
        if not sep or not NAME.match(name) or (os.path.lexists(first) and not os.path.lexists(path)):
            name, path = "default", first  # a checkpoint whose file name holds '=' (lr=0.1.pt): no name
        if not path:
            raise UserError(f"-model {first}: no checkpoint after '='")
        for other in more:
            if NAME.match(other.partition("=")[0]) and "=" in other and not os.path.exists(other):
                raise UserError(
                    f"-model {' '.join(value)}: a name only goes before the first checkpoint; "
                    f"serve another model with another -model ({other})"
                )
        if name in (n for n, _ in specs):
            raise UserError(f"-model: the name '{name}' is given twice; name models with -model NAME=CKPT")
        specs.append((name, [path, *more]))
    return specs


# every number of the command line has a bound: the counts (1 to the maximum), the waits (seconds or
# milliseconds, 0 to the maximum): a typo of 10**12 must not become a 1 TB request or a week's wait
COUNT_LIMITS = {
    "max_request_bytes": 1 << 30,
    "max_sentences": 1_000_000,
    "max_sentence_chars": 1_000_000,
    "max_request_chars": 1 << 30,
    "max_context_sentences": 1_000_000,
    "batch_tokens": 1_000_000,
    "http_threads": 1024,
}
WAIT_LIMITS = {"batch_wait_ms": 60_000.0, "shutdown_grace": 3600.0}


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, most in COUNT_LIMITS.items():
        if not 1 <= getattr(args, flag) <= most:
            raise UserError(f"-{flag} must be from 1 to {most:,} (got {getattr(args, flag)})")
    for flag, most in WAIT_LIMITS.items():
        if not 0 <= getattr(args, flag) <= most:  # NaN and inf too
            raise UserError(f"-{flag} must be a number from 0 to {most:,.0f} (got {getattr(args, flag)})")
    if not 0 <= args.port <= 65535:
        raise UserError(f"-port must be from 0 to 65535 (got {args.port})")


def check_host(host: str) -> bool:
    """Resolve -host before anything slow, so a bad one is a one-line error rather than waitress's
    traceback; True when every address it names is loopback (only this machine can connect)."""
    if not host.strip():
        raise UserError("-host is empty; give an address to listen on, e.g. 127.0.0.1 or 0.0.0.0")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, ValueError) as e:  # unresolvable; a label over 63 characters; a NUL
        reason = getattr(e, "strerror", None) or str(e)
        raise UserError(f"-host {host!r}: not an address to listen on ({reason})") from None
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def read_api_key(path: Optional[str], on_command_line: Optional[str] = None) -> Optional[str]:
    """The API key: what -api_key_file holds (one line), else $ONMT_DOC_API_KEY, else None (no key).
    A key that is set but unusable (empty, spaces, not ASCII) is a mistake, never "no key". A key
    given on the command line (-api_key) is refused, without repeating it: every user of the
    machine can read a command line (ps, /proc)."""
    if on_command_line is not None:
        raise UserError(
            f"-api_key: a key on the command line is visible to every user of this machine (ps); "
            f"put it in a file (-api_key_file F) or in the environment variable {API_KEY_ENV}"
        )
    if path is not None:
        where = f"-api_key_file {path}"
        data = read_input_bytes(path, "-api_key_file", limit=KEY_BYTES, what="key file")  # /dev/zero: bounded
        try:
            key = data.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise UserError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    elif API_KEY_ENV in os.environ:
        where, key = f"${API_KEY_ENV}", os.environ[API_KEY_ENV].strip()
    else:
        return None
    if not API_KEY.match(key):
        raise UserError(
            f"{where}: the API key must be one word of printable ASCII characters (got {len(key)} characters)"
        )
    return key


def exposure_warning(host: str, loopback: bool, api_key: Optional[str]) -> Optional[str]:
    """The line printed when other machines can reach the server: it is then a decision, not a default."""
    if loopback:
        return None
    key = "API key required" if api_key else f"no API key: set -api_key_file or ${API_KEY_ENV}"
    return (
        f"{PROG}: warning: -host {host} is not loopback: other machines can reach this server ({key}); "
        "put a TLS reverse proxy in front (docs/deploy.md)"
    )


def _socket_map(server: Any) -> dict:
    return getattr(server, "map", None) or getattr(server, "_map", {})


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition()`` until true or ``timeout`` seconds; whether it came true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _shutdown(server: Any, state: Any, grace: float) -> None:
    """Stop in order: new requests get 503 (the server still accepts, so they are answered, not
    reset); the requests in progress get ``grace`` seconds; what is left is cancelled at the
    worker's next call (answered 503); then stop accepting and let the answers leave."""
    from waitress.server import BaseWSGIServer

    state.draining = True
    if not _wait(lambda: not state.in_flight, grace):
        for model in state.models.values():
            model.batcher.cancel_all(
                f"the server stopped before this request was translated (-shutdown_grace {grace:g})"
            )
        _wait(lambda: not state.in_flight, 60.0)  # the call running when the grace ended finishes first
    for listener in list(_socket_map(server).values()):
        if isinstance(listener, BaseWSGIServer):
            listener.accepting = False
    time.sleep(0.1)  # from the handler's return to the response in the channel's buffer
    _wait(lambda: not any(getattr(ch, "total_outbufs_len", 0) for ch in list(_socket_map(server).values())), 10.0)


def _main(argv: Optional[list[str]]) -> int:
    args = _parser().parse_args(argv)
    _check_numbers(args)
    specs = model_specs(args.model)
    api_key = read_api_key(args.api_key_file, args.api_key)
    warning = exposure_warning(args.host, check_host(args.host), api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    for _, paths in specs:  # before the port is taken and torch imported: a typo fails at once
        for path in paths:
            problem = input_problem(path)
            if problem:
                raise UserError(f"{path}: {'checkpoint not found' if problem == 'file not found' else problem}")
    try:
        import waitress  # noqa: F401
        from flask import Flask  # noqa: F401
    except ImportError as e:
        raise UserError(f"the server needs flask and waitress ({e}); install them with: pip install -e .[server]")
    import torch

    from onmt_doc.serve.app import Limits, ServedModel, ServerState, create_app
    from onmt_doc.serve.batcher import Batcher
    from onmt_doc.train.reporting import setup_logging
    from onmt_doc.translate.translator import Translator

    setup_logging()
    if args.threads:
        torch.set_num_threads(args.threads)
    limits = Limits(
        args.max_request_bytes,
        args.max_sentences,
        args.max_sentence_chars,
        args.max_request_chars,
        args.max_context_sentences,
    )
    state = ServerState({}, specs[0][0], limits, api_key)
    app = create_app(state)
    server = _listen(app, args)  # before the (slow) loading: a taken port fails at once
    try:
        names = {option: f"-{flag}" for flag, option in OPTION_FLAGS.items()}
        options = {o: getattr(args, f) for f, o in OPTION_FLAGS.items() if getattr(args, f) is not None}
        for name, paths in specs:
            translator = Translator.load(paths, args.device, option_names={**names, "device": "-device"}, **options)
            batcher = Batcher(translator, args.batch_tokens, args.batch_wait_ms, name)
            state.models[name] = ServedModel(name, paths, translator, batcher)
    except BaseException:
        server.close()
        raise
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, _frame: Optional[FrameType]) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    loop = threading.Thread(target=server.run, name="onmt_doc-http", daemon=True)
    loop.start()
    host, port = _address(server, args)
    served = ", ".join(f"{n} ({' + '.join(p)})" for n, p in specs)
    print(
        f"{PROG}: serving {served} on http://{host}:{port} (pid {os.getpid()})",
        file=sys.stderr,
        flush=True,
    )
    while not stop.wait(0.5):
        if not loop.is_alive():
            raise UserError("the HTTP server stopped unexpectedly")
    print(f"{PROG}: stopping ({received[0]}): new requests get 503", file=sys.stderr, flush=True)
    _shutdown(server, state, args.shutdown_grace)
    for model in state.models.values():
        model.batcher.stop(timeout=30)
    server.task_dispatcher.shutdown(timeout=2)
    stats = [m.batcher.stats for m in state.models.values()]
    served, batches = sum(s.requests for s in stats), sum(s.batches for s in stats)
    cancelled = sum(s.cancelled for s in stats)
    print(
        f"{PROG}: stopped ({received[0]}); {served} requests in {batches} batches, {cancelled} cancelled",
        file=sys.stderr,
        flush=True,
    )
    return 0


def _listen(app: Any, args: argparse.Namespace) -> Any:
    """Bind the waitress server (not yet serving); a taken port or a bad host is a one-line error.
    Waitress refuses bodies far over the limit itself (it would buffer them otherwise); those
    just over it reach Flask, which answers 413 in JSON. ``channel_request_lookahead`` keeps
    waitress reading a connection while its request runs, which is how it notices (and tells the
    app, ``waitress.client_disconnected``) that the client has gone."""
    from waitress import create_server

    body_cap = max(2 * args.max_request_bytes, args.max_request_bytes + 65536)
    try:
        return create_server(
            app,
            host=args.host,
            port=args.port,
            threads=args.http_threads,
            max_request_body_size=body_cap,
            channel_request_lookahead=1,
            ident=PROG,
        )
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    except ValueError as e:  # waitress: "Invalid host/port specified." (check_host catches it first)
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e}") from None


def _address(server: Any, args: argparse.Namespace) -> tuple[str, int]:
    port = getattr(server, "effective_port", None)
    if port is None:  # several sockets (a host name with IPv4 and IPv6 addresses)
        port = next(iter(getattr(server, "effective_listen", [(args.host, args.port)])))[1]
    return args.host, port


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    sys.argv[0] = PROG  # `python -m onmt_doc.bin.server`: errors still say onmt_doc_server
    raise SystemExit(main())
