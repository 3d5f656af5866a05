"""The server cases: one request on a shared server judged against docs/deploy.md's statuses (a
line of cases.yaml each), and the scenarios that need code (a slow client, a disconnect, a signal
mid-request, the API key), registered by name in :data:`SCENARIOS` and named by cases.yaml."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from hostile import steps
from hostile.fixtures import console, env
from hostile.steps import COLUMNS, Case

HTTP_TIMEOUT = 60.0
BIG_SENTENCES = 160
Verdict = tuple[dict, list[str], list[str]]  # flags, problems, damage


def body(obj: Any) -> bytes:
    """A JSON request body as a client writes it (``json.dumps`` defaults)."""
    return json.dumps(obj).encode()


def big_request(sentences: int = BIG_SENTENCES, words: int = 100) -> bytes:
    """A large but legal request (about 85,000 characters, under -max_request_chars 100000): some
    15 s of work for the toy model on one thread."""
    vocab = "the cat dog bird sees follows a small big red house boat tree".split()
    rnd = random.Random(1)
    return body({"documents": [[" ".join(rnd.choice(vocab) for _ in range(words))] for _ in range(sentences)]})


SMALL = body({"documents": [["the cat sees the dog .", "it sees the bird ."], ["a bird follows the boat ."]]})


def padded(size: int, obj: Any) -> bytes:
    """``obj`` as JSON with spaces before its last brace up to ``size`` bytes (a body just over a limit)."""
    b = body(obj)
    return b[:-1] + b" " * (size - len(b)) + b"}"


BODIES: dict[str, Callable[..., bytes]] = {  # body: [name, args...] in cases.yaml
    "small": lambda: SMALL,
    "big_request": big_request,
    "padded": padded,
    "documents": lambda n, *sentences: body({"documents": [list(sentences) for _ in range(n)]}),
}


def request(raw: dict) -> dict:
    """A request case's fields of cases.yaml as the session sends and judges it: the body from
    ``json`` (a value), ``raw`` (a text, one byte a character) or ``body`` ([a BODIES name, args...])."""
    if "json" in raw:
        data: Optional[bytes] = body(raw["json"])
    elif "raw" in raw:
        data = steps.data(raw["raw"])
    else:
        data = BODIES[raw["body"][0]](*raw["body"][1:]) if "body" in raw else None
    req = {"method": raw["method"], "path": raw["path"], "body": data, "statuses": raw["statuses"]}
    req.update({k: raw[k] for k in ("plain_ok", "no_abs_path") if k in raw})
    if "shape" in raw:
        req["check"] = shape(raw["shape"], raw.get("shape_key", "translations"))
    return req


def display(case: Case) -> str:
    """A server case as a user would try it: the curl line of a request, else its scenario's note."""
    e = case.extra
    if "method" not in e:
        return f"(server) {case.note or e.get('scenario')}"
    b = e.get("body")
    shown = "" if b is None else f" -d {b[:80]!r}" + (f"... ({len(b)} bytes)" if len(b) > 80 else "")
    return f"curl -X {e['method']} localhost:PORT{e['path']}{shown}"


def shape(lens: list[int], key: str = "translations") -> Callable[[Any], Optional[str]]:
    """A check of a 200 answer: its documents have ``lens`` sentences (fewer is data lost)."""

    def check(answer: Any) -> Optional[str]:
        got = [len(d) for d in answer.get(key, [])] if key == "translations" else [len(answer.get(key, []))]
        return None if got == lens else f"answer has {got} sentences for {lens} (data lost)"

    return check


def http_call(
    port: int,
    method: str,
    path: str,
    data: Optional[bytes] = None,
    headers: Optional[dict] = None,
    timeout=HTTP_TIMEOUT,
) -> dict:
    """One HTTP request; the status, body and seconds, or the error (``timeout``, a reset ...)."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        got = resp.read()
        return {"status": resp.status, "body": got, "type": resp.getheader("Content-Type", ""),
                "seconds": time.monotonic() - start}  # fmt: skip
    except (socket.timeout, TimeoutError):
        return {"error": "timeout", "seconds": time.monotonic() - start}
    except (OSError, http.client.HTTPException) as e:
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - start}
    finally:
        conn.close()


def judge_http(
    r: dict, statuses: list[int], check: Optional[Callable[[Any], Optional[str]]] = None, plain_ok: bool = False
) -> Verdict:
    """(flags, problems, damage) of one HTTP answer against the documented statuses."""
    flags = dict.fromkeys(COLUMNS, False)
    problems: list[str] = []
    damage: list[str] = []
    if r.get("error") == "timeout" or r["seconds"] > HTTP_TIMEOUT:
        flags["stall"] = True
        return flags, [f"no answer within {HTTP_TIMEOUT:.0f} s"], damage
    if "error" in r:
        flags["other"] = True
        return flags, [f"connection failed: {r['error']}"], damage
    status = r["status"]
    if status >= 500:
        flags["traceback"] = True
        return flags, [f"HTTP {status}: {r['body'][:200]!r}"], damage
    if status == 200 and statuses[0] != 200:
        flags["accepted_invalid"] = True
        return flags, [f"HTTP 200 where {statuses} is documented"], damage
    if status not in statuses:
        problems.append(f"HTTP {status} where {statuses} is documented: {r['body'][:150]!r}")
    try:
        answer = json.loads(r["body"])
    except ValueError:
        answer = None
        if not (plain_ok and status == 413):
            problems.append(f"the answer is not JSON: {r['body'][:100]!r}")
    if status != 200 and isinstance(answer, dict):
        error = str(answer.get("error", ""))
        if not error or len(error.splitlines()) != 1:
            problems.append(f"the error is not one line: {error[:150]!r}")
    if status == 200 and check and isinstance(answer, dict):
        lost = check(answer)
        if lost:
            damage.append(lost)
    flags["other"] = bool(problems)
    flags["damaged"] = bool(damage)
    return flags, problems, damage


def _merge(a: Verdict, b: Verdict) -> Verdict:
    return {k: a[0][k] or b[0][k] for k in COLUMNS}, a[1] + b[1], a[2] + b[2]


class ServerSession:
    """The shared server of the request cases (started with an absolute -model path) and the
    dedicated servers of the shutdown and API-key scenarios."""

    def __init__(self, work: Path, base: Path):
        self.work, self.base = work, base
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.log_path = work / "server_shared.log"
        self.big_s: Optional[float] = None

    def start(self, folder: Path, extra: list[str], log_path: Path) -> tuple[Optional[subprocess.Popen], int, str]:
        """A server in ``folder`` on a free port: (process, port, why not) once it says it serves."""
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.base / "model.pt", folder / "model.pt")
        argv = [console("onmt_doc_server"), "-model", str((folder / "model.pt").resolve())]
        argv += ["-port", "0", "-threads", "1", "-beam", "2", "-n_best", "2", *extra]
        with open(log_path, "wb") as log_f:
            proc = subprocess.Popen(argv, cwd=folder, stdout=log_f, stderr=log_f, env=env(), start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            m = re.search(r": serving .* on http://[^:]+:(\d+)", text)
            if m:
                return proc, int(m.group(1)), ""
            if proc.poll() is not None:
                return None, 0, text.strip()[-500:]
            time.sleep(0.2)
        self.stop(proc)
        return None, 0, "no start line within 120 s"

    @staticmethod
    def stop(proc: Optional[subprocess.Popen], sig: int = signal.SIGTERM, wait: float = 40) -> Optional[int]:
        """Stop a server (TERM, then KILL); its exit status."""
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def ensure(self) -> str:
        """The shared server running (restarted after a death): '' or why it cannot start."""
        if self.proc is not None and self.proc.poll() is None:
            return ""
        self.proc, self.port, why = self.start(self.work / "server_shared", [], self.log_path)
        return why

    def run(self, case: Case) -> tuple[dict, list[str], list[str], str]:
        """One server case: (flags, problems, damage, the traceback the server logged or why it did not start)."""
        why = self.ensure()
        if why:
            flags = dict.fromkeys(COLUMNS, False)
            flags["traceback" if "Traceback" in why else "other"] = True
            return flags, [f"the server did not start: {why}"], [], why
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        e = case.extra
        flags, problems, damage = SCENARIOS[e["scenario"]](self, case) if "scenario" in e else self.request(case)
        time.sleep(0.3)
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            logged = f.read().decode(errors="replace")
        if "Traceback (most recent call last)" in logged:
            flags["traceback"] = True
        if self.proc is not None and self.proc.poll() is not None:
            flags["traceback"] = True
            problems.append(f"the server died (exit {self.proc.returncode})")
        return flags, problems, damage, logged if "Traceback" in logged else ""

    def request(self, case: Case) -> Verdict:
        """A single request against the documented statuses."""
        e = case.extra
        r = http_call(self.port, e["method"], e["path"], e["body"])
        flags, problems, damage = judge_http(r, e["statuses"], e.get("check"), e.get("plain_ok", False))
        if e.get("no_abs_path") and r.get("status") == 200 and str(self.work.resolve()).encode() in r["body"]:
            problems.append("GET /models reveals the absolute checkpoint path")
            flags["other"] = True
        return flags, problems, damage

    def small_within(self, label: str, bound: float) -> Verdict:
        """The small request, answered whole within ``bound`` seconds."""
        r = http_call(self.port, "POST", "/translate", SMALL)
        flags, problems, damage = judge_http(r, [200], shape([2, 1]))
        if not flags["stall"] and r["seconds"] > bound:
            flags["stall"] = True
            problems.append(f"a small request took {r['seconds']:.1f} s ({label}); bound {bound:.1f} s")
        return flags, problems, damage

    def bound(self) -> float:
        """How long a small request may take beside a large one: 30% of the large one alone."""
        return max(5.0, 0.3 * (self.big_s or 20.0))

    def close(self) -> None:
        """Stop the shared server."""
        self.stop(self.proc)


def slow_client_beside_fast(s: ServerSession, case: Case) -> Verdict:
    """A client that sends half a request and waits must not hold the others up."""
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"documents'
    )
    try:
        return s.small_within("beside a slow client", 10)
    finally:
        sock.close()


def idle_connections(s: ServerSession, case: Case) -> Verdict:
    """More idle connections than -http_threads must not starve a real request."""
    socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(60)]
    try:
        return s.small_within("beside 60 idle connections", 10)
    finally:
        for sock in socks:
            sock.close()


def large_request_alone(s: ServerSession, case: Case) -> Verdict:
    """The large request of the next cases, alone: it must end within 60 s; its time is the yardstick."""
    r = http_call(s.port, "POST", "/translate", big_request())
    s.big_s = r["seconds"]
    return judge_http(r, [200], shape([1] * BIG_SENTENCES))


def _in_background(port: int, data: bytes) -> tuple[threading.Thread, dict]:
    answer: dict = {}
    t = threading.Thread(target=lambda: answer.update(http_call(port, "POST", "/translate", data)))
    t.start()
    return t, answer


def large_and_small(s: ServerSession, case: Case) -> Verdict:
    """A small request sent while a large one runs must not wait for the large one."""
    t, big = _in_background(s.port, big_request())
    time.sleep(1.0)
    small = s.small_within(f"while a large request ran ({s.big_s or 0:.1f} s alone)", s.bound())
    t.join()
    return _merge(small, judge_http(big, [200], shape([1] * BIG_SENTENCES)))


def disconnected_client(s: ServerSession, case: Case) -> Verdict:
    """A client that sends a large request and goes away: its work must be cancelled."""
    data = big_request()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    sock.sendall(f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    time.sleep(1.0)
    sock.close()
    return s.small_within(f"after a client disconnected from a large request ({s.big_s or 0:.1f} s alone)", s.bound())


def shutdown_503(s: ServerSession, case: Case) -> Verdict:
    """SIGTERM while a large request runs: new requests 503, the running one answered, exit 0."""
    proc, port, why = s.start(s.work / "server_shutdown", [], s.work / "server_shutdown.log")
    flags, problems = dict.fromkeys(COLUMNS, False), []
    if proc is None:
        flags["other"] = True
        return flags, [f"the server did not start: {why}"], []
    keep = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    keep.request("GET", "/health")
    keep.getresponse().read()
    t, big = _in_background(port, big_request())
    time.sleep(1.5)
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.8)
    try:
        keep.request("POST", "/translate", body=SMALL, headers={"Content-Type": "application/json"})
        resp = keep.getresponse()
        late = {"status": resp.status, "body": resp.read(), "seconds": 0.0}
    except (OSError, http.client.HTTPException) as e:
        late = {"error": f"{type(e).__name__}: {e}", "seconds": 0.0}
    fresh = http_call(port, "POST", "/translate", SMALL, timeout=20)
    t.join()
    rc = s.stop(proc, signal.SIGTERM, 45)
    for label, answer in (("on an open connection", late), ("on a new connection", fresh)):
        if answer.get("status") != 503:
            flags["other"] = True
            problems.append(
                f"a request during shutdown {label} got {answer.get('status') or answer.get('error')}, not 503"
            )
    if rc != 0:
        flags["other"] = True
        problems.append(f"the server exited {rc}, not 0, after SIGTERM")
    if "Traceback" in (s.work / "server_shutdown.log").read_text(errors="replace"):
        flags["traceback"] = True
    bflags, bproblems, bdamage = judge_http(big, [200], shape([1] * BIG_SENTENCES))
    return {k: flags[k] or bflags[k] for k in COLUMNS}, problems + bproblems, bdamage


def api_key(s: ServerSession, case: Case) -> Verdict:
    """-api_key_file (docs/deploy.md): without the key 401 (also for unknown paths), with
    ``Authorization: Bearer KEY`` 200, /health open."""
    folder = s.work / "server_key"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "api.key").write_text("s3cretKEY\n")
    proc, port, why = s.start(folder, ["-api_key_file", str(folder / "api.key")], s.work / "server_key.log")
    flags, problems = dict.fromkeys(COLUMNS, False), []
    if proc is None:
        flags["other"] = True
        return flags, [f"the server with -api_key_file did not start: {why.splitlines()[-1][:150] if why else ''}"], []
    bearer = {"Authorization": "Bearer s3cretKEY"}
    try:
        answers = {
            "no key": (http_call(port, "POST", "/translate", SMALL), 401),
            "a wrong key": (http_call(port, "POST", "/translate", SMALL, {"Authorization": "Bearer nope"}), 401),
            "no key, unknown path": (http_call(port, "GET", "/nope"), 401),
            "no key, /models": (http_call(port, "GET", "/models"), 401),
            "no key, /health": (http_call(port, "GET", "/health"), 200),
            "the key": (http_call(port, "POST", "/translate", SMALL, bearer), 200),
        }
    finally:
        s.stop(proc)
    for label, (answer, want) in answers.items():
        got = answer.get("status") or answer.get("error")
        if got == want:
            continue
        if want == 401 and got == 200:
            flags["accepted_invalid"] = True
        elif isinstance(got, int) and got >= 500:
            flags["traceback"] = True
        else:
            flags["other"] = True
        problems.append(f"{label}: {got}, documented {want}")
    return flags, problems, []


SCENARIOS: dict[str, Callable[[ServerSession, Case], Verdict]] = {
    name.replace("_", "-"): f
    for name, f in (("slow_client_beside_fast", slow_client_beside_fast), ("idle_connections", idle_connections))
    + (("large_request_alone", large_request_alone), ("large_and_small", large_and_small))
    + (("disconnected_client", disconnected_client), ("shutdown_503", shutdown_503), ("api_key", api_key))
}
