#!/usr/bin/env python
"""onmt_doc_server under load: requests/s and p50/p95 latency at 1, 4 and 16 concurrent clients,
and how long small requests wait behind one large request.

Starts the real server (``onmt_doc_server -port 0`` on 127.0.0.1 only) on a given checkpoint or on
a tiny Transformer trained here on the toy corpus, then, for each concurrency, clients send
``POST /translate`` requests of one toy document (1-6 sentences) each, back to back, until
``--requests`` answers or ``--seconds`` have passed (whichever first; both bounded). The server's
``/health`` counters give the mean number of requests its worker translated together. Every
answer must be a 200 with one translation per sentence.

``--large CHARS`` (default 100000, the server's default ``-max_request_chars``, i.e. the largest
request it accepts; 0: skip) then measures the stall: one request of long sentences (toy sentences
joined to about 1500 characters) of CHARS characters in all and, while it runs, one client sending
one-document requests back to back. The server cuts the large request into slices of
``-batch_tokens`` words and interleaves the small requests' slices with them, so each small request
waits for about one slice, not for the whole large request.

    OMP_NUM_THREADS=1 python benchmarks/server_load.py --out runs/bench_server --requests 600 --seconds 30 \
        --batch_wait_ms 10 0 --unbatched
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from common import (
    REPO,
    CpuMonitor,
    cpu_model,
    log,
    read_json,
    run_streamed,
    thread_env,
    tool,
    update_docs_section,
    write_results,
    write_yaml,
)

HEADING = "## Translation server under load (`onmt_doc_server`)"
DOCS = os.path.join(REPO, "docs", "benchmarks.md")
CHANGELOG = "## Changelog of results"
COLUMNS = [
    "batching",
    "concurrent clients",
    "requests",
    "seconds",
    "requests/s",
    "sentences/s",
    "p50 latency (ms)",
    "p95 latency (ms)",
    "requests per worker batch",
    "errors",
    "other processes (cores)",
]


def toy_model(out: str, steps: int, threads: int) -> tuple[str, str]:
    """A tiny Transformer (d_model 64, 2+2 layers) trained on the toy corpus; (checkpoint, test.src)."""
    from onmt_doc.toy.corpus import write_corpus

    data, run = os.path.join(out, "toy"), os.path.join(out, "model")
    ckpt = os.path.join(run, "checkpoints", "last.pt")
    if not os.path.exists(ckpt):
        write_corpus(data, seed=3, train_docs=2500, valid_docs=60, test_docs=145)
        layers = {"layers": 2, "heads": 4, "ff": 128}
        cfg = {
            "data": {
                "train": {"src": f"{data}/train.src", "tgt": f"{data}/train.tgt"},
                "valid": {"src": f"{data}/valid.src", "tgt": f"{data}/valid.tgt"},
            },
            "vocab": {"subword": "bpe", "size": 300, "shared": True},
            "model": {
                "d_model": 64,
                "dropout": 0.1,
                "encoder": {"type": "transformer", **layers},
                "decoder": {"type": "transformer", **layers},
            },
            "optim": {"type": "adam", "lr": 2.0e-3, "schedule": {"type": "inverse_sqrt", "warmup": 100}},
            "train": {
                "batch_tokens": 1024,
                "max_steps": steps,
                "valid_every": steps,
                "save_every": steps,
                "valid_bleu": False,
                "threads": threads,
                "seed": 1,
            },
            "translate": {"beam": 4},
            "log": {"dir": run, "tensorboard": False, "every": 50},
        }
        config = write_yaml(cfg, os.path.join(out, "model.yaml"), "server_load.py: toy Transformer")
        run_streamed([*tool("onmt_doc_train"), "-config", config], os.path.join(out, "train.log"), threads)
    return ckpt, os.path.join(data, "test.src")


def read_documents(path: str) -> list[list[str]]:
    docs: list[list[str]] = [[]]
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                docs[-1].append(line.strip())
            elif docs[-1]:
                docs.append([])
    return [d for d in docs if d]


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def start_server(args, ckpt: str, log_path: str, batch_tokens: int, wait_ms: float) -> tuple[subprocess.Popen, int]:
    cmd = [
        *tool("onmt_doc_server"),
        "-model",
        ckpt,
        "-host",
        "127.0.0.1",
        "-port",
        "0",
        "-device",
        "cpu",
        "-threads",
        str(args.threads),
        "-batch_tokens",
        str(batch_tokens),
        "-batch_wait_ms",
        f"{wait_ms:g}",
    ]
    log("$ " + " ".join(cmd))
    f = open(log_path, "w", encoding="utf-8")
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=thread_env(args.threads), cwd=REPO)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        m = re.search(r"on http://127\.0\.0\.1:(\d+) ", open(log_path, encoding="utf-8").read())
        if m:
            port = int(m.group(1))
            while True:
                try:
                    if call(port, "GET", "/health")[0] == 200:
                        return proc, port
                except ConnectionRefusedError:
                    time.sleep(0.05)
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"the server did not start; see {log_path}")


def load(port: int, docs: list[list[str]], clients: int, requests: int, seconds: float) -> dict:
    """``clients`` threads sending back to back until ``requests`` answers or ``seconds``."""
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []
    sentences = [0]
    issued = [0]
    stop_at = time.monotonic() + seconds

    def client(c: int) -> None:
        while True:
            with lock:
                if issued[0] >= requests or time.monotonic() >= stop_at:
                    return
                k = issued[0]
                issued[0] += 1
            doc = docs[(k * 7 + c) % len(docs)]
            t0 = time.monotonic()
            try:
                status, body = call(port, "POST", "/translate", json.dumps({"document": doc}).encode("utf-8"))
            except OSError as e:
                status, body = 0, {"error": str(e)}
            dt = time.monotonic() - t0
            with lock:
                if status == 200 and len(body.get("translation", [])) == len(doc):
                    latencies.append(dt)
                    sentences[0] += len(doc)
                else:
                    errors.append(f"{status}: {body}")

    _, before = call(port, "GET", "/health")
    t0 = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    elapsed = time.monotonic() - t0
    _, after = call(port, "GET", "/health")
    lat = sorted(latencies)
    q = statistics.quantiles(lat, n=20) if len(lat) >= 2 else [lat[0] if lat else float("nan")] * 19
    batches = after["batches"] - before["batches"]
    return {
        "clients": clients,
        "requests": len(lat),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "seconds": elapsed,
        "req_per_s": len(lat) / elapsed,
        "sent_per_s": sentences[0] / elapsed,
        "p50_ms": 1000 * statistics.median(lat) if lat else float("nan"),
        "p95_ms": 1000 * q[18],
        "requests_per_batch": (after["requests"] - before["requests"]) / batches if batches else float("nan"),
    }


def long_sentences(docs: list[list[str]], chars: int, length: int = 1500) -> list[str]:
    """Toy sentences joined into lines of about ``length`` characters, ``chars`` characters in all."""
    sentences = [s for d in docs for s in d]
    lines: list[str] = []
    i = 0
    while sum(len(line) for line in lines) < chars - length:
        line = ""
        while len(line) < length:
            line += sentences[i % len(sentences)] + " "
            i += 1
        lines.append(line.strip())
    return lines


def stall(port: int, docs: list[list[str]], chars: int) -> dict:
    """One request of long sentences, ``chars`` characters in all (documents of 6 sentences), and,
    while it runs, one client sending one-document requests back to back: their latencies are the
    wait behind the large request."""
    flat = long_sentences(docs, chars)
    large = [flat[i : i + 6] for i in range(0, len(flat), 6)]
    done = threading.Event()
    outcome: dict = {}

    def send_large() -> None:
        t0 = time.monotonic()
        status, body = call(port, "POST", "/translate", json.dumps({"documents": large}).encode("utf-8"))
        outcome.update(ok=status == 200 and len(body.get("translations", [])) == len(large))
        outcome.update(status=status, seconds=time.monotonic() - t0)
        done.set()

    thread = threading.Thread(target=send_large)
    thread.start()
    latencies: list[float] = []
    k = 0
    while not done.is_set():
        doc = docs[k % len(docs)]
        k += 1
        t0 = time.monotonic()
        status, body = call(port, "POST", "/translate", json.dumps({"document": doc}).encode("utf-8"))
        if status == 200 and len(body.get("translation", [])) == len(doc):
            latencies.append(time.monotonic() - t0)
    thread.join()
    return {
        "large_sentences": len(flat),
        "large_chars": sum(len(line) for line in flat),
        "large_status": outcome["status"],
        "large_seconds": outcome["seconds"],
        "errors": 0 if outcome["ok"] else 1,
        "small_requests": len(latencies),
        "small_p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "small_max_ms": 1000 * max(latencies) if latencies else float("nan"),
    }


def render_stalls(results: dict) -> str:
    """A sentence per server run: the small requests answered while the large one ran, and their waits."""
    lines = [
        f"Batching {s['batching']}: while one request of {s['large_sentences']} sentences "
        f"({s['large_chars']} characters) took "
        f"{s['large_seconds']:.1f} s, a client sending one-document requests back to back got "
        f"{s['small_requests']} answers (median {s['small_p50_ms']:.0f} ms, longest {s['small_max_ms']:.0f} ms)."
        for s in results.get("stalls", [])
    ]
    if not lines:
        return ""
    intro = (
        "A large request no longer holds the worker (`--large`): the server cuts it into slices of `-batch_tokens` "
        "words and interleaves the slices of other requests with them, round-robin, so a small request waits for "
        "about one slice. "
    )
    return "\n\n" + textwrap.fill(intro + " ".join(lines), 100, break_on_hyphens=False)


def headline(results: dict) -> str:
    """The batched server at the most clients against the unbatched one (when both were run)."""
    runs = results["runs"]
    most = max(r["clients"] for r in runs)
    off = next((r for r in runs if r["batching"] == "off" and r["clients"] == most), None)
    on = [r for r in runs if r["batching"] != "off" and r["clients"] == most]
    if not off or not on:
        return ""
    best = max(on, key=lambda r: r["req_per_s"])
    return (
        f"At {most} clients, batching ({best['batching']}) serves **{best['req_per_s'] / off['req_per_s']:.1f}×** "
        f"the requests/s of the server that translates each request alone, at "
        f"{off['p50_ms'] / best['p50_ms']:.1f}× lower median latency; at 1 client the wait for company costs "
        f"latency instead (see the rows). "
    )


def render(results: dict) -> str:
    rows = "\n".join(
        f"| {r['batching']} | {r['clients']} | {r['requests']} | {r['seconds']:.1f} | **{r['req_per_s']:.1f}** | "
        f"{r['sent_per_s']:.1f} | "
        f"{r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['requests_per_batch']:.2f} | {r['errors']} | "
        f"{r['other_cores']:.2f} |"
        for r in results["runs"]
    )
    shared = max(r["other_cores"] for r in results["runs"])
    note = (
        f" Other jobs shared the machine during this run (up to {shared:.2f} of its cores, last column): the "
        "absolute numbers are low by that share; compare the rows with each other."
        if shared > 0.2
        else ""
    )
    intro = (
        "Issue 15: `benchmarks/server_load.py` starts `onmt_doc_server` on 127.0.0.1 (waitress, one batching worker "
        "per model) and sends `POST /translate` requests of one toy document each (1–6 sentences, "
        f"{results['avg_sentences']:.1f} on average), back to back from {', '.join(map(str, results['clients']))} "
        f"client threads, each level bounded by {results['max_requests']} requests or {results['max_seconds']:.0f} s. "
        f"Model: {results['model']}; server options `-threads {results['threads']}` `-batch_tokens "
        f'{results["batch_tokens"]}` and the `-batch_wait_ms` of each row; batching "off" is the same server with '
        "`-batch_tokens 1` (every request translated alone, one after the other), for comparison."
    )
    after = (
        f'{headline(results)}"Requests per worker batch" is the mean number of requests the worker translated in '
        "one `Translator` call (`/health` counters): requests that arrive while the worker is busy, or within the "
        "wait, are translated together, so throughput grows with the clients while each request also waits for the "
        "batch it joined. Without a wait (0 ms) the worker starts on whatever is queued at once, so batches stay "
        "smaller; the default `-batch_wait_ms 10` costs a lone client about that much latency. Localhost only: the "
        f"client threads run on the same machine as the server, and their CPU is part of the measurement.{note}"
    )
    machine = (
        f"Command ({results['machine']}, torch {results['torch']}, Python {results['python']}; {results['date']}):"
    )
    return f"""{HEADING}

{textwrap.fill(intro, 100, break_on_hyphens=False)}

{textwrap.fill(machine, 100, break_on_hyphens=False)}

```bash
{results["command"]}
```

| {" | ".join(COLUMNS)} |
|---|{"---:|" * (len(COLUMNS) - 1)}
{rows}

{textwrap.fill(after, 100, break_on_hyphens=False)}{render_stalls(results)}
"""


def insert_section(path: str, heading: str) -> None:
    """Give ``heading`` a place just above the changelog (once); update_docs_section fills it."""
    text = open(path, encoding="utf-8").read()
    if any(line == heading for line in text.splitlines()):
        return
    marker = "\n" + CHANGELOG + "\n"
    if marker in text:
        text = text.replace(marker, f"\n{heading}\n\n{CHANGELOG}\n", 1)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench_server")
    p.add_argument("--model", help="checkpoint to serve (default: a toy Transformer trained here)")
    p.add_argument("--src", help="document file of the requests (default: the toy test set)")
    p.add_argument("--steps", type=int, default=300, help="training steps of the toy model")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=300, help="at most this many requests per level")
    p.add_argument("--seconds", type=float, default=30.0, help="at most this long per level")
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--batch_tokens", type=int, default=2048)
    p.add_argument("--batch_wait_ms", type=float, nargs="+", default=[10.0], help="one server run per value")
    p.add_argument("--unbatched", action="store_true", help="also measure a server that translates every request alone")
    p.add_argument(
        "--large", type=int, default=100_000, help="characters of the large request of the stall test (0: skip)"
    )
    p.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    p.add_argument("--render", action="store_true", help="only re-render <out>/results.json (no measurement)")
    args = p.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if args.render:
        results = read_json(os.path.join(out, "results.json"))
        if results is None:
            sys.exit(f"no {out}/results.json to render")
        return publish(args, out, results)
    if args.model:
        ckpt, src = args.model, args.src
        if not src:
            sys.exit("--model needs --src (the documents to send)")
        model = f"`{os.path.relpath(ckpt, REPO)}`"
    else:
        ckpt, src = toy_model(out, args.steps, args.threads)
        src = args.src or src
        model = f"toy Transformer trained here ({args.steps} steps, d_model 64, 2+2 layers, beam 4)"
    docs = [d[:6] for d in read_documents(src)]
    configs = [(f"on, wait {w:g} ms", args.batch_tokens, w) for w in args.batch_wait_ms]
    configs += [("off", 1, 0.0)] if args.unbatched else []
    monitor = CpuMonitor()
    monitor.start()
    runs, stalls = [], []
    try:
        for n, (batching, batch_tokens, wait_ms) in enumerate(configs):  # -batch_tokens 1: each request alone
            log_path = os.path.join(out, f"server_{n}.log")
            proc, port = start_server(args, ckpt, log_path, batch_tokens, wait_ms)
            try:
                load(port, docs, 1, 5, 30.0)  # warm-up
                for clients in args.clients:
                    t0 = time.time()
                    r = load(port, docs, clients, args.requests, args.seconds)
                    r["other_cores"] = monitor.foreign(t0, time.time())
                    r["batching"] = batching
                    log(
                        f"batching {batching}, {clients} clients: {r['req_per_s']:.1f} req/s, "
                        f"p50 {r['p50_ms']:.0f} ms, "
                        f"p95 {r['p95_ms']:.0f} ms, {r['requests_per_batch']:.2f} requests/batch, {r['errors']} errors "
                        f"{r['first_error']}"
                    )
                    runs.append(r)
                if args.large:
                    s = stall(port, docs, args.large)
                    s["batching"] = batching
                    log(
                        f"batching {batching}: a request of {s['large_chars']} characters took "
                        f"{s['large_seconds']:.1f} s "
                        f"(status {s['large_status']}); meanwhile {s['small_requests']} small requests, "
                        f"p50 {s['small_p50_ms']:.0f} ms, longest {s['small_max_ms']:.0f} ms"
                    )
                    stalls.append(s)
            finally:
                proc.terminate()
                proc.wait(60)
    finally:
        monitor.stop()
    import platform

    import torch

    results = {
        "runs": runs,
        "stalls": stalls,
        "model": model,
        "avg_sentences": statistics.mean(len(d) for d in docs),
        "max_requests": args.requests,
        "clients": args.clients,
        "max_seconds": args.seconds,
        "threads": args.threads,
        "batch_tokens": args.batch_tokens,
        "batch_wait_ms": args.batch_wait_ms,
        "machine": f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores visible",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "OMP_NUM_THREADS=1 python benchmarks/server_load.py " + " ".join(sys.argv[1:]),
    }
    publish(args, out, results)


def publish(args, out: str, results: dict) -> None:
    """results.json/.md under ``out`` and, unless --no-docs, the docs/benchmarks.md section."""
    write_results(out, results, render)
    if any(r["errors"] for r in results["runs"] + results.get("stalls", [])):
        sys.exit("some requests failed; docs not updated")
    if not args.no_docs:
        insert_section(DOCS, HEADING)
        update_docs_section(DOCS, HEADING, render(results))


if __name__ == "__main__":
    main()
