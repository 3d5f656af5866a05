"""onmt_doc_server -model CKPT [-model NAME=CKPT ...] [-host 127.0.0.1] [-port 5000] …

Serves translation as JSON over HTTP (Flask app, waitress server; docs/deploy.md): ``GET /health``,
``GET /models``, ``POST /translate`` with ``{"model": NAME, "documents": [[sentence, ...], ...]}``.
The first -model is the default; ``NAME=CKPT`` names a model (an unnamed one is ``default``).
Concurrent requests for one model are translated together by its worker thread, up to
-batch_tokens source words, waiting at most -batch_wait_ms for more. SIGTERM or SIGINT stops
accepting connections, finishes the requests in progress and exits with status 0.
Needs the ``server`` extra: ``pip install -e .[server]``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.errors import UserError

PROG = "onmt_doc_server"
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# flag -> translate option it overrides (None: keep the checkpoint's)
OPTION_FLAGS = {
    "beam": "beam",
    "n_best": "n_best",
    "dtype": "dtype",
    "max_length": "max_length",
    "max_input_tokens": "max_input_tokens",
}


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument(
        "-model", "--model", required=True, action="append", metavar="[NAME=]CKPT", help="checkpoint; repeat for more"
    )
    p.add_argument("-host", "--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("-port", "--port", type=int, default=5000, help="port (0: any free port, printed at start)")
    p.add_argument("-device", "--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("-max_request_bytes", "--max_request_bytes", type=int, default=1_000_000, help="413 above")
    p.add_argument("-max_sentences", "--max_sentences", type=int, default=1000, help="per request; 413 above")
    p.add_argument("-max_sentence_chars", "--max_sentence_chars", type=int, default=2000, help="413 above")
    p.add_argument(
        "-batch_tokens", "--batch_tokens", type=int, default=2048, help="source words per worker batch of requests"
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
    return p


def model_specs(values: list[str]) -> list[tuple[str, str]]:
    """(name, checkpoint) of each -model: ``NAME=CKPT`` or ``CKPT`` (named ``default``)."""
    specs = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not NAME.match(name):
            name, path = "default", value
        if not path:
            raise UserError(f"-model {value}: no checkpoint after '='")
        if name in (n for n, _ in specs):
            raise UserError(f"-model: the name '{name}' is given twice; name models with -model NAME=CKPT")
        specs.append((name, path))
    return specs


def _check_numbers(args: argparse.Namespace) -> None:
    for flag in ("max_request_bytes", "max_sentences", "max_sentence_chars", "batch_tokens", "http_threads"):
        if getattr(args, flag) < 1:
            raise UserError(f"-{flag} must be at least 1 (got {getattr(args, flag)})")
    if args.batch_wait_ms < 0:
        raise UserError(f"-batch_wait_ms must be 0 or more (got {args.batch_wait_ms})")
    if not 0 <= args.port <= 65535:
        raise UserError(f"-port must be from 0 to 65535 (got {args.port})")


def _socket_map(server: Any) -> dict:
    return getattr(server, "map", None) or getattr(server, "_map", {})


def _drain(server: Any, state: Any, timeout: float = 30.0) -> None:
    """Stop accepting, let requests in progress finish and their answers leave."""
    from waitress.server import BaseWSGIServer

    state.draining = True
    for listener in list(_socket_map(server).values()):
        if isinstance(listener, BaseWSGIServer):
            listener.accepting = False
    deadline = time.monotonic() + timeout
    while state.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)  # from the handler's return to the response in the channel's buffer
    while time.monotonic() < deadline and any(
        getattr(ch, "total_outbufs_len", 0) for ch in list(_socket_map(server).values())
    ):
        time.sleep(0.05)


def _main(argv: Optional[list[str]]) -> int:
    args = _parser().parse_args(argv)
    _check_numbers(args)
    specs = model_specs(args.model)
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
    limits = Limits(args.max_request_bytes, args.max_sentences, args.max_sentence_chars)
    state = ServerState({}, specs[0][0], limits)
    app = create_app(state)
    server = _listen(app, args)  # before the (slow) loading: a taken port fails at once
    try:
        names = {option: f"-{flag}" for flag, option in OPTION_FLAGS.items()}
        options = {o: getattr(args, f) for f, o in OPTION_FLAGS.items() if getattr(args, f) is not None}
        for name, path in specs:
            translator = Translator.load(path, args.device, option_names={**names, "device": "-device"}, **options)
            batcher = Batcher(translator, args.batch_tokens, args.batch_wait_ms, name)
            state.models[name] = ServedModel(name, path, translator, batcher)
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
    print(
        f"{PROG}: serving {', '.join(f'{n} ({p})' for n, p in specs)} on http://{host}:{port} (pid {os.getpid()})",
        file=sys.stderr,
        flush=True,
    )
    while not stop.wait(0.5):
        if not loop.is_alive():
            raise UserError("the HTTP server stopped unexpectedly")
    _drain(server, state)
    for model in state.models.values():
        model.batcher.stop(timeout=30)
    server.task_dispatcher.shutdown(timeout=2)
    served = sum(m.batcher.stats.requests for m in state.models.values())
    batches = sum(m.batcher.stats.batches for m in state.models.values())
    print(f"{PROG}: stopped ({received[0]}); {served} requests in {batches} batches", file=sys.stderr, flush=True)
    return 0


def _listen(app: Any, args: argparse.Namespace) -> Any:
    """Bind the waitress server (not yet serving); a taken port or a bad host is a one-line error.
    Waitress refuses bodies far over the limit itself (it would buffer them otherwise); those
    just over it reach Flask, which answers 413 in JSON."""
    from waitress import create_server

    body_cap = max(2 * args.max_request_bytes, args.max_request_bytes + 65536)
    try:
        return create_server(
            app,
            host=args.host,
            port=args.port,
            threads=args.http_threads,
            max_request_body_size=body_cap,
            ident=PROG,
        )
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None


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
