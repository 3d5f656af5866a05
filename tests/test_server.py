"""Issue 15, part 2: ``onmt_doc_server`` as users run it.

The real server runs in a subprocess on a free localhost port (``-port 0``; it prints the port it
got) and is talked to over HTTP with the standard library's client. Its answers must equal the
Python API's for the same checkpoint, also when 20 clients ask at once and their requests are
translated together.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("flask", reason="the server extra is not installed (pip install -e .[server])")
pytest.importorskip("waitress", reason="the server extra is not installed (pip install -e .[server])")

from test_api import read_documents  # noqa: E402

from onmt_doc import Translator  # noqa: E402

SERVER = [sys.executable, "-m", "onmt_doc.bin.server"]
LIMITS = ["-max_request_bytes", "4096", "-max_sentences", "40", "-max_sentence_chars", "300"]


class Server:
    """A server subprocess and where it listens."""

    def __init__(self, args: list[str], log: Path, timeout: float = 180.0):
        self.log = log
        self.err = open(log, "w", encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([*SERVER, *args], stdout=self.err, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(r"on http://127\.0\.0\.1:(\d+) ", log.read_text(encoding="utf-8"))
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the server did not start:\n{log.read_text(encoding='utf-8')}")
            time.sleep(0.1)
        while request(self.port, "GET", "/health")[0] != 200:  # the loop thread starts after the line
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            self.err.close()

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8")


def request(port: int, method: str, path: str, body: bytes | None = None, timeout: float = 120) -> tuple[int, dict]:
    """One HTTP request on a fresh connection: status and the JSON body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        assert response.getheader("Content-Type", "").startswith("application/json"), raw[:200]
        return response.status, json.loads(raw)
    except ConnectionRefusedError:
        return 0, {}
    finally:
        conn.close()


def post(port: int, payload) -> tuple[int, dict]:
    return request(port, "POST", "/translate", json.dumps(payload).encode("utf-8"))


@pytest.fixture(scope="module")
def ckpt(trained_run) -> Path:
    return trained_run / "checkpoints" / "last.pt"


@pytest.fixture(scope="module")
def api(ckpt) -> Translator:
    return Translator.load(ckpt, device="cpu", n_best=2)


@pytest.fixture(scope="module")
def docs(toy_dir) -> list[list[str]]:
    return read_documents(toy_dir / "test.src", 30)


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    srv = Server(
        ["-model", str(ckpt), "-model", f"second={ckpt}", "-port", "0", "-n_best", "2", "-batch_wait_ms", "300"]
        + LIMITS,
        log,
    )
    yield srv
    srv.stop()


def test_health_and_models(server, api):
    status, health = request(server.port, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["models"] == ["default", "second"]
    status, info = request(server.port, "GET", "/models")
    assert status == 200 and info["default"] == "default"
    first = info["models"][0]
    assert (first["unit"], first["encoder"], first["decoder"]) == ("sentence", "transformer", "transformer")
    assert first["src_vocab_size"] == len(api.codec.src_vocab) and first["tgt_vocab_size"] == len(api.codec.tgt_vocab)
    assert first["translate"]["beam"] == api.opt.beam and first["translate"]["n_best"] == 2
    assert info["limits"] == {"max_request_bytes": 4096, "max_sentences": 40, "max_sentence_chars": 300}


def test_translations_equal_the_api(server, api, docs):
    some = docs[:3]
    status, body = post(server.port, {"documents": some, "scores": True, "n_best": 2})
    assert status == 200, body
    nbest = api.nbest(some)
    assert body["model"] == "default"
    assert body["translations"] == api.translate(some)
    assert [len(d) for d in body["scores"]] == [len(d) for d in some]
    assert sum(body["scores"], []) == pytest.approx([f[0][1] for d in nbest for f in d], abs=1e-5)
    assert [[[h["text"] for h in s] for s in d] for d in body["n_best"]] == [
        [[t for t, _ in f] for f in d] for d in nbest
    ]
    status, one = post(server.port, {"model": "second", "document": some[1]})
    assert status == 200 and one == {"model": "second", "translation": api.translate([some[1]])[0]}
    assert post(server.port, {"documents": []}) == (200, {"model": "default", "translations": []})


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"documents": [["a b c"]', "malformed JSON"),
        (b"\xff\xfe not utf-8", "malformed JSON"),
        (b'[["a b c"]]', "expected a JSON object"),
        (b'{"sentences": [["a"]]}', "unknown key 'sentences'"),
        (b'{"documents": ["a b c"]}', "documents[0]: expected a document"),
        (b'{"document": ["a b c", 7]}', "document[1]: expected a sentence"),
        (b'{"document": ["a b c", " "]}', "document[1]: empty sentence"),
        (b'{"document": ["a"], "documents": [["b"]]}', "either 'documents'"),
        (b'{"document": ["a"], "n_best": 3}', "'n_best' must be an integer from 1 to 2"),
        (b'{"document": ["a"], "model": 3}', "'model' must be a string"),
    ],
)
def test_malformed_requests_are_400(server, body, needle):
    status, reply = request(server.port, "POST", "/translate", body)
    assert status == 400 and needle in reply["error"], reply
    assert "\n" not in reply["error"]


def test_size_limits_are_413(server):
    status, reply = post(server.port, {"document": ["w " * 2500]})  # > 4096 bytes
    assert status == 413 and "4096 bytes" in reply["error"], reply
    status, reply = post(server.port, {"documents": [["a b"]] * 41})
    assert status == 413 and "41 sentences" in reply["error"], reply
    status, reply = post(server.port, {"documents": [["a b"], ["ok", "x" * 301]]})
    assert status == 413 and "documents[1][1]: 301 characters" in reply["error"], reply


def test_unknown_model_and_path_are_404(server):
    status, reply = post(server.port, {"model": "secnod", "document": ["a b"]})
    assert status == 404 and "unknown model 'secnod'" in reply["error"] and "second" in reply["error"]
    assert request(server.port, "GET", "/nothing")[0] == 404
    assert request(server.port, "GET", "/translate")[0] == 405


def test_parallel_clients_get_their_own_answers(server, api, docs):
    """20 clients at once, each with its own documents: every answer is its request's, and the
    worker did translate several requests in one call."""
    clients = 20
    mine = [[docs[i], docs[(i + 7) % len(docs)][:2]] for i in range(clients)]
    expected = [api.translate(d) for d in mine]
    barrier = threading.Barrier(clients)

    def client(i: int):
        barrier.wait()
        return post(server.port, {"documents": mine[i]})

    with ThreadPoolExecutor(clients) as pool:
        replies = list(pool.map(client, range(clients)))
    assert [status for status, _ in replies] == [200] * clients, [r for s, r in replies if s != 200]
    assert [body["translations"] for _, body in replies] == expected
    _, health = request(server.port, "GET", "/health")
    assert health["max_batch_requests"] > 1, health


def test_sigterm_finishes_the_request_in_progress(ckpt, api, docs, tmp_path):
    srv = Server(["-model", str(ckpt), "-port", "0", "-batch_wait_ms", "1500"], tmp_path / "server.log")
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(reply=post(srv.port, {"documents": docs[:2]})))
    worker.start()
    deadline = time.monotonic() + 60
    while request(srv.port, "GET", "/health")[1].get("in_flight") != 1:  # the request waits in the batcher
        assert time.monotonic() < deadline, srv.text()
        time.sleep(0.02)
    assert srv.stop() == 0, srv.text()
    worker.join(60)
    assert result["reply"] == (200, {"model": "default", "translations": api.translate(docs[:2])})
    text = srv.text()
    assert "stopped (SIGTERM); 1 requests in 1 batches" in text and "Traceback" not in text, text


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onmt_doc_server: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], proc.stderr


def test_startup_errors_are_one_line(ckpt, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*SERVER, *args], capture_output=True, text=True, env=env, timeout=120)

    one_line_error(start("-model", str(tmp_path / "missing.pt"), "-port", "0"), "missing.pt", "not found")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line_error(start("-model", str(ckpt), "-port", str(port)), f"cannot listen on 127.0.0.1:{port}")
    one_line_error(start("-model", f"a={ckpt}", "-model", f"a={ckpt}", "-port", "0"), "'a' is given twice")
    one_line_error(start("-model", str(ckpt), "-beam", "0", "-port", "0"), "-beam")
    one_line_error(start("-model", str(ckpt), "-max_request_bytes", "0"), "-max_request_bytes must be at least 1")
