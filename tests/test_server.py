"""Issue 15, part 2: ``onmt_doc_server`` as users run it; "Nothing lost by any command": one request
cannot take it down, and exposure is a decision.

The real server runs in a subprocess on a free localhost port (``-port 0``; it prints the port it
got) and is talked to over HTTP with the standard library's client (raw sockets where a client
must vanish). Its answers must equal the Python API's for the same checkpoint, also when 20
clients ask at once and their requests are translated together, and when a large request is cut
into slices that other requests' slices overtake. No assertion times anything: fairness and
cancellation are checked on the server's counters and on the order of answers.
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

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

SERVER = [sys.executable, "-m", "onmt_doc.bin.server"]
LIMITS = ["-max_request_bytes", "4096", "-max_sentences", "40", "-max_sentence_chars", "300"]
LIMITS += ["-max_request_chars", "2000"]


def clean_env() -> dict:
    """The environment of a server under test: one torch thread, and no API key from the caller's shell."""
    return {**{k: v for k, v in os.environ.items() if k != "ONMT_DOC_API_KEY"}, "OMP_NUM_THREADS": "1"}


class Server:
    """A server subprocess and where it listens."""

    def __init__(self, args: list[str], log: Path, timeout: float = 180.0, env: dict | None = None):
        self.log = log
        self.err = open(log, "w", encoding="utf-8")
        env = {**clean_env(), **(env or {})}
        self.proc = subprocess.Popen([*SERVER, *args], stdout=self.err, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(r"on http://(?:127\.0\.0\.1|localhost):(\d+) ", log.read_text(encoding="utf-8"))
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the server did not start:\n{log.read_text(encoding='utf-8')}")
            time.sleep(0.1)
        while request(self.port, "GET", "/health")[0] != 200:  # the loop thread starts after the line
            time.sleep(0.05)

    def signal(self) -> None:
        """SIGTERM, without waiting for the exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        self.signal()
        try:
            return self.proc.wait(60)
        finally:
            self.err.close()

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8")


def request(
    port: int, method: str, path: str, body: bytes | None = None, timeout: float = 120, headers: dict | None = None
) -> tuple[int, dict]:
    """One HTTP request on a fresh connection: status and the JSON body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        assert response.getheader("Content-Type", "").startswith("application/json"), raw[:200]
        return response.status, json.loads(raw)
    except ConnectionRefusedError:
        return 0, {}
    finally:
        conn.close()


def post(port: int, payload, headers: dict | None = None) -> tuple[int, dict]:
    return request(port, "POST", "/translate", json.dumps(payload).encode("utf-8"), headers=headers)


def health(port: int) -> dict:
    return request(port, "GET", "/health")[1]


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    """Poll ``condition()`` until true; the timeout is a guard against a hang, not a measurement."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


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


def test_health_and_models(server, api, ckpt):
    status, state = request(server.port, "GET", "/health")
    assert status == 200 and state["status"] == "ok" and state["models"] == ["default", "second"]
    status, info = request(server.port, "GET", "/models")
    assert status == 200 and info["default"] == "default"
    assert str(ckpt.parent) not in json.dumps(info), "GET /models shows where the server's files are"
    first = info["models"][0]
    assert first["checkpoint"] == "last.pt"
    assert (first["unit"], first["encoder"], first["decoder"]) == ("sentence", "transformer", "transformer")
    assert first["src_vocab_size"] == len(api.codec.src_vocab) and first["tgt_vocab_size"] == len(api.codec.tgt_vocab)
    assert first["translate"]["beam"] == api.opt.beam and first["translate"]["n_best"] == 2
    assert info["limits"] == {
        "max_request_bytes": 4096,
        "max_sentences": 40,
        "max_sentence_chars": 300,
        "max_request_chars": 2000,
        "max_context_sentences": 100,
    }


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
        # nesting beyond what the parser recurses into: a 400, not a 500 from a RecursionError
        (b'{"documents": ' + b"[" * 1900 + b"]" * 1900 + b"}", "nested too deeply"),
        (
            b'{"document": ["a"], "n_best": ' + b"[" * 70 + b'"' + b"x" * 400 + b'"' + b"]" * 70 + b"}",
            "'n_best' must be",
        ),
        (b'{"documents": ' + b"[" * 70 + b"]" * 70 + b"}", "documents[0][0]: expected a sentence"),
        (b'{"sentences' + b"s" * 3000 + b'": 1}', "unknown key 'sentencess"),  # quoted short, not 3 KB back
    ],
)
def test_malformed_requests_are_400(server, body, needle):
    status, reply = request(server.port, "POST", "/translate", body)
    assert status == 400 and needle in reply["error"], reply
    assert "\n" not in reply["error"] and len(reply["error"]) < 300, reply


def test_size_limits_are_413(server):
    status, reply = post(server.port, {"document": ["w " * 2500]})  # > 4096 bytes
    assert status == 413 and "4096 bytes" in reply["error"], reply
    status, reply = post(server.port, {"documents": [["a b"]] * 41})
    assert status == 413 and "41 sentences" in reply["error"], reply
    status, reply = post(server.port, {"documents": [["a b"], ["ok", "x" * 301]]})
    assert status == 413 and "documents[1][1]: 301 characters" in reply["error"], reply
    # every sentence and the sentence count within their limits, the work in all over -max_request_chars
    status, reply = post(server.port, {"documents": [["y " * 125] * 5, ["z " * 125] * 5]})
    assert status == 413 and "2500 characters" in reply["error"] and "-max_request_chars" in reply["error"], reply


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
    state = health(server.port)
    assert state["max_batch_requests"] > 1, state


def test_slices_cut_sentences_but_never_a_document_of_a_document_model():
    """A sentence model's request may be cut between any sentences; a document model translates a
    document in context, so its slices hold whole documents (one over the budget alone)."""
    from onmt_doc.serve.batcher import cut, sentence_cost

    docs = [["a b c d e"] * 3, ["f g"], [], ["h " * 20], ["i j k"] * 2]
    whole = cut(docs, 12, split_documents=False)
    assert [(p.doc, p.first, p.sentences) for parts, _ in whole for p in parts] == [
        (d, 0, doc) for d, doc in enumerate(docs) if doc
    ]
    assert all(cost <= 12 or len(parts) == 1 for parts, cost in whole) and len(whole) == 4
    rebuilt: list[list[str]] = [[] for _ in docs]
    for parts, cost in cut(docs, 12, split_documents=True):
        assert cost <= 12 or [len(p.sentences) for p in parts] == [1], parts
        for p in parts:
            assert p.first == len(rebuilt[p.doc])  # in order, nothing skipped
            rebuilt[p.doc] += p.sentences
    assert rebuilt == docs
    assert sentence_cost("x" * 80) == 10 and sentence_cost("a b c") == 3  # text without spaces is not one word


@pytest.fixture(scope="module")
def sliced(ckpt, tmp_path_factory):
    """A server whose worker batch is 12 words: a request of ~100 toy sentences is dozens of slices."""
    log = tmp_path_factory.mktemp("sliced") / "server.log"
    srv = Server(["-model", str(ckpt), "-port", "0", "-batch_tokens", "12", "-batch_wait_ms", "0"], log)
    yield srv
    srv.stop()


def in_background(fn) -> tuple[threading.Thread, dict]:
    """Run ``fn()`` on a thread; its result lands in the dict under "reply"."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(reply=fn()))
    thread.start()
    return thread, result


def test_a_small_request_overtakes_a_large_one(sliced, api, docs):
    """The worker translates a large request slice by slice, round-robin with the others: a small
    request sent while it runs is answered while the large one is still in flight."""
    port = sliced.port
    before = health(port)
    thread, result = in_background(lambda: post(port, {"documents": docs}))
    wait_for(lambda: health(port)["batches"] >= before["batches"] + 2, "the large request's first slices", 60)
    small = [docs[0][0]]
    status, body = post(port, {"document": small})
    during = health(port)
    assert status == 200 and body["translation"] == api.translate([small])[0], body
    assert during["in_flight"] == 1 and during["requests"] == before["requests"] + 1, (before, during)
    thread.join(300)
    assert result["reply"] == (200, {"model": "default", "translations": api.translate(docs)})  # slices reassembled
    after = health(port)
    assert after["batches"] - before["batches"] > 10 and after["requests"] == before["requests"] + 2, after


def send_and_vanish_later(port: int, payload) -> socket.socket:
    """A POST /translate on a raw socket the caller closes without reading the answer."""
    body = json.dumps(payload).encode("utf-8")
    head = (
        f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(head.encode("ascii") + body)
    return sock


def test_work_of_a_client_that_disconnects_is_dropped(sliced, api, docs):
    """A client that closes its connection mid-request: its remaining slices are never translated,
    the request is not counted as answered, and the server goes on serving."""
    port = sliced.port
    before = health(port)
    sock = send_and_vanish_later(port, {"documents": docs})
    wait_for(lambda: health(port)["in_flight"] == 1, "the request to reach the worker")
    sock.close()
    wait_for(lambda: health(port)["in_flight"] == 0, "the request to end")
    after = health(port)
    n_sentences = sum(len(d) for d in docs)
    assert after["requests"] == before["requests"], (before, after)  # never answered
    assert after.get("cancelled") == before.get("cancelled", 0) + 1, after
    assert after["batches"] - before["batches"] < n_sentences // 3, (before, after)  # not all its slices
    assert "request cancelled (the client disconnected)" in sliced.text()
    assert post(port, {"document": docs[1]}) == (200, {"model": "default", "translation": api.translate([docs[1]])[0]})


def test_sigterm_finishes_the_request_in_progress(ckpt, api, docs, tmp_path):
    """After SIGTERM the request in progress is answered, and new requests get a JSON 503 (not a
    reset connection) until the server has exited."""
    srv = Server(["-model", str(ckpt), "-port", "0", "-batch_wait_ms", "3000"], tmp_path / "server.log")
    thread, result = in_background(lambda: post(srv.port, {"documents": docs[:2]}))
    wait_for(lambda: health(srv.port)["in_flight"] == 1, "the request to wait in the batcher")
    srv.signal()
    wait_for(lambda: request(srv.port, "GET", "/health")[0] == 503, "the drain to begin", 60)
    status, reply = post(srv.port, {"document": ["a b"]})
    assert status == 503 and "the server is stopping" in reply["error"], reply
    assert srv.stop() == 0, srv.text()
    thread.join(60)
    assert result["reply"] == (200, {"model": "default", "translations": api.translate(docs[:2])})
    text = srv.text()
    assert "stopped (SIGTERM); 1 requests in 1 batches" in text and "Traceback" not in text, text


def test_shutdown_grace_cancels_what_is_left(ckpt, tmp_path):
    """A request still waiting when -shutdown_grace runs out is answered 503 and the server exits 0."""
    args = ["-model", str(ckpt), "-port", "0", "-batch_wait_ms", "60000", "-shutdown_grace", "0.5"]
    srv = Server(args, tmp_path / "server.log")
    thread, result = in_background(lambda: post(srv.port, {"document": ["a b c ."]}))
    wait_for(lambda: health(srv.port)["in_flight"] == 1, "the request to wait in the batcher")
    assert srv.stop() == 0, srv.text()
    thread.join(60)
    status, reply = result["reply"]
    assert status == 503 and "the server stopped before this request was translated" in reply["error"], reply
    text = srv.text()
    assert "0 requests in 0 batches, 1 cancelled" in text and "Traceback" not in text, text


@pytest.mark.parametrize("how", ["file", "env"])
def test_api_key_guards_every_endpoint_but_health(ckpt, api, tmp_path, how):
    key = "s3cret-Key_0123456789"
    args, env = ["-model", str(ckpt), "-port", "0", "-host", "localhost"], {}
    if how == "file":
        (tmp_path / "key").write_text(key + "\n", encoding="utf-8")
        args += ["-api_key_file", str(tmp_path / "key")]
    else:
        env["ONMT_DOC_API_KEY"] = key
    srv = Server(args, tmp_path / "server.log", env=env)
    try:
        port, good = srv.port, {"Authorization": f"Bearer {key}"}
        assert request(port, "GET", "/health")[0] == 200
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Basic {key}"},
            {"Authorization": key},
        ):
            for method, path in (("GET", "/models"), ("GET", "/nothing"), ("POST", "/translate")):
                status, reply = request(port, method, path, b"{}" if method == "POST" else None, headers=headers)
                assert status == 401 and "API key" in reply["error"], (headers, path, reply)
        assert request(port, "GET", "/models", headers=good)[0] == 200
        assert request(port, "GET", "/nothing", headers=good)[0] == 404
        assert post(port, {"document": ["a b c ."]}, headers=good) == (
            200,
            {"model": "default", "translation": api.translate([["a b c ."]])[0]},
        )
    finally:
        assert srv.stop() == 0
    assert "warning" not in srv.text()  # localhost is loopback


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
    one_line_error(start("-model", str(ckpt), "-max_request_bytes", "0"), "-max_request_bytes must be from 1 to")
    one_line_error(start("-model", str(ckpt), "-max_request_chars", "0"), "-max_request_chars must be from 1 to")
    one_line_error(start("-model", str(ckpt), "-shutdown_grace", "nan"), "-shutdown_grace must be a number")
    for host in ("nosuch.invalid", "999.1.1.1", "a" * 70, "a\tb"):  # unresolvable, invalid, label too long
        one_line_error(start("-model", str(ckpt), "-host", host, "-port", "0"), "-host", "not an address")
    one_line_error(start("-model", str(ckpt), "-host", "", "-port", "0"), "-host is empty")
    one_line_error(start("-model", str(ckpt), "-api_key_file", str(tmp_path / "nokey")), "-api_key_file", "nokey")
    (tmp_path / "blank").write_text("\n", encoding="utf-8")
    one_line_error(start("-model", str(ckpt), "-api_key_file", str(tmp_path / "blank")), "API key must be one word")
    proc = start("-model", str(ckpt), "-api_key", "s3cret")  # refused, and the key is not repeated back
    one_line_error(proc, "-api_key: a key on the command line is visible", "-api_key_file")
    assert "s3cret" not in proc.stderr


def test_every_number_and_key_file_has_a_bound(ckpt, tmp_path):
    """Issue 42: -api_key_file /dev/zero read without bound (22 GB resident in a minute); counts,
    waits and thread counts of 10^12 were accepted; a folder was "not found"."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*SERVER, "-model", str(ckpt), "-port", "0", *args], capture_output=True, text=True,
                              env=env, timeout=60)  # fmt: skip

    one_line_error(start("-api_key_file", "/dev/zero"), "-api_key_file /dev/zero: larger than 4 KiB; not a key file")
    one_line_error(start("-api_key_file", str(tmp_path)), "-api_key_file", "is a directory, not a file")
    for flag, value in (
        ("-http_threads", "100000"),
        ("-max_request_bytes", str(10**13)),
        ("-batch_tokens", str(10**9)),
        ("-max_sentences", str(10**12)),
    ):
        one_line_error(start(flag, value), f"{flag} must be from 1 to")
    for flag, value in (("-batch_wait_ms", "1e12"), ("-shutdown_grace", "inf"), ("-shutdown_grace", "1e9")):
        one_line_error(start(flag, value), f"{flag} must be a number from 0 to")
    one_line_error(start("-threads", str(10**6)), "-threads 1000000: more than 8 per CPU core")
    folder = subprocess.run([*SERVER, "-model", str(tmp_path), "-port", "0"], capture_output=True, text=True, env=env)
    one_line_error(folder, str(tmp_path), "is a directory, not a file")


def test_a_checkpoint_whose_name_holds_an_equals_sign_can_be_served(ckpt, tmp_path, monkeypatch):
    """``-model lr=0.1.pt`` read as the model "lr" of checkpoint "0.1.pt" ("not found"): a value
    that names a file while its NAME=CKPT reading does not is the checkpoint; ``./`` or a name
    (``m=lr=0.1.pt``) are the escapes when both exist."""
    from onmt_doc.bin.server import model_specs

    monkeypatch.chdir(tmp_path)
    Path("lr=0.1.pt").write_bytes(b"x")
    assert model_specs([["lr=0.1.pt"]]) == [("default", ["lr=0.1.pt"])]
    assert model_specs([["m=lr=0.1.pt"]]) == [("m", ["lr=0.1.pt"])]
    Path("0.1.pt").write_bytes(b"y")  # both readings name a file: NAME=CKPT wins, ./ escapes it
    assert model_specs([["lr=0.1.pt"]]) == [("lr", ["0.1.pt"])]
    assert model_specs([["./lr=0.1.pt"]]) == [("default", ["./lr=0.1.pt"])]
    assert model_specs([["a=x.pt", "lr=0.1.pt"]]) == [("a", ["x.pt", "lr=0.1.pt"])]


def test_a_host_other_than_loopback_is_a_warning(tmp_path):
    """Exposure is a decision: listening beyond loopback says so (and whether a key guards it). A
    missing checkpoint stops the start before any port is bound, so nothing is exposed here."""
    missing = str(tmp_path / "missing.pt")

    def start(*args: str, env: dict | None = None) -> list[str]:
        cmd = [*SERVER, "-model", missing, "-port", "0", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**clean_env(), **(env or {})}, timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == f"onmt_doc_server: error: {missing}: checkpoint not found"
        return proc.stderr.strip().splitlines()[:-1]

    (warning,) = start("-host", "0.0.0.0")
    assert warning.startswith("onmt_doc_server: warning: -host 0.0.0.0 is not loopback") and "no API key" in warning
    (warning,) = start("-host", "::", env={"ONMT_DOC_API_KEY": "k3y"})
    assert "-host :: is not loopback" in warning and "API key required" in warning
    assert start("-host", "localhost") == [] and start("-host", "127.0.0.1") == [] and start("-host", "::1") == []
