#!/usr/bin/env python
"""Hostile review: run several hundred hostile cases against every command, the server and the Python
API, and count per case class what went wrong (issue "Nothing lost by any command").

  python tools/hostile_review.py [--work DIR] [--out runs/hostile_review] [--jobs 2]
                                      [--classes output-path,server] [--limit N] [--keep] [--list]

Run it as root on Linux (it makes device nodes with ``mknod``, mounts small tmpfs folders for full
disks, drops capabilities with ``setpriv`` for permission cases). ``--work`` is prepared once
(a toy corpus of 300 documents, a tiny Transformer and a tiny context-gates model trained 10 steps
each, a PMI table, a hypothesis file, a fake OpenNMT-py checkpoint and damaged checkpoints) and
reused by the next run with the same ``--work``; each case works on a fresh copy of the files it
may touch in its own folder (copies, never hard links, so the hard-link cases mean something).
``--classes`` picks classes (comma-separated), ``--limit N`` runs at most N cases per class
(spread over the class), ``--list`` prints the cases without running them, ``--keep`` keeps the
folders of cases that behaved (those of the others are always kept under ``<work>/cases``).
The full run (561 cases) took 30 minutes on a shared 2-core machine with ``--jobs 1`` (481 cases
before issue 42's classes: 19 minutes with ``--jobs 2``); ``--limit 3`` about 2 minutes. The table
can be pasted into docs/reliability.md as it is.

Results are written as they come: ``<out>/cases.jsonl`` (one JSON object per case: the command as
run in its folder, what was expected, exit status, the stderr tail, the last line of a traceback,
damaged files, the problems found), then ``<out>/table.md`` (the table below, for
docs/reliability.md), ``<out>/failures.md`` (up to three failing cases per class with their
commands) and ``<out>/summary.json``.

What a case is judged on. Every case expects a refusal (invalid input), a success (valid input)
or either (the input is odd but legal, e.g. an empty file); then each case is counted in each
column it earns:

* **damaged**: a file of the case folder that the case may not change (its inputs, a user's other
  files, a run's checkpoints, a device node or FIFO) changed bytes, type, mode or link target, or
  was deleted; a declared output that existed changed although the command failed; or data was
  lost silently (a translation with fewer lines than its source; a stdout file overwritten instead
  of appended to; a malicious pickle or YAML tag ran code). Before and after each case the harness
  records sha256, size, type and mode of every file in the case folder.
* **tracebacks**: ``Traceback (most recent call last)`` on stderr, a death by signal, an API call
  raising anything but ``onmt_doc.errors.UserError``, or a server answering 500 (or any 5xx but a
  503 while stopping) or logging a traceback.
* **stalls**: no end within the case's timeout (60-150 s), a server request over 60 s, or a small
  server request that waited for a large one (or for a disconnected client's work).
* **accepted-invalid**: exit status 0 (HTTP 200, an API call that returned) where a refusal is
  expected.
* **other**: the rest of the contract: a refusal that is not exactly one stderr line (progress lines
  ``[HH:MM:SS LEVEL] ...`` excepted), a valid input refused, a wrong HTTP status or a non-JSON error
  body, a message that does not say what the rule asks (a folder reported as "not found", a
  duplicate YAML key without both line numbers, an allocation failure instead of a config error),
  a temporary file left behind (``*.tmp<pid>``), over 1.5 GB of memory on an endless input, a
  promised option that does not exist (the server's API key).
* **behaved**: none of the above: a one-line error and a non-zero exit for invalid input, success
  for valid input, nothing damaged.

The classes (the "command pattern" column of the table says the same in short):

* ``output-path``: every command that writes a file (translate, evaluate -json / -item_scores,
  average_checkpoints, build_pmi_table, gate_analysis -output, import_opennmt, scale_model) with an
  output that is one of its inputs (same name, symbolic link, hard link, ``dir/../input``, a
  symlinked folder, an absolute path), a folder, a missing folder, a read-only folder, a character
  device (a private ``/dev/full`` and ``/dev/null`` node, and the real ones for translate), a FIFO
  with a reader, ``/dev/stdout`` on a pipe or on a file opened for appending, a symbolic link to
  another file (followed, the link kept), and an existing output when the command fails mid-way.
* ``output-folder``: the folder writers (release, make_toy_corpus --out): a folder holding the
  input, with and without -force, a failing export over an existing folder, a file, a link, a
  device, a read-only parent, absurd sizes.
* ``stdio``: stdout that fails (/dev/full, closed ``>&-``, a pipe whose reader is gone) for every
  command that prints; stdin closed, empty, endless (/dev/zero, an endless pipe) for ``-src -``.
* ``input-files``: every reader of a text, JSON, YAML or table file with: missing, a directory,
  empty, invalid UTF-8, lone surrogate bytes (ED A0 80), CR-only line ends, binary garbage, NUL
  bytes, a BOM, a 2 MB line, /dev/zero (under a 4 GB address-space limit), no read permission
  (capabilities dropped: the interpreter lives under /root, which user nobody cannot read), a
  dangling link, a file misaligned with its partner.
* ``checkpoints``: every checkpoint reader (translate, an ensemble, resume, train.init_from,
  average, release, evaluate, gate_analysis, server, import_opennmt) with bytes flipped inside
  tensor data and inside the pickle, a truncated file, a text file, impossible tensor shapes with
  valid checksums, a stored config that does not fit the weights, a d_model of 10^8 in the stored
  config, missing, a folder, empty, zeros, no permission.
* ``run-folder``: last.pt missing while step_N.pt exist, resume with another optimizer,
  architecture or data, build_vocab on a run with checkpoints (with and without -force), a run
  folder locked by another process, -config being the run's own config.yaml, log.dir under a file,
  on a device or read-only, averaged outputs among a run's own checkpoints.
* ``config``: duplicate YAML keys at several depths, each dropout-like key at 1.0/-0.1/nan/inf,
  NaN/inf in other numbers (file, overrides and flags), n_best 0, beam 100000, absurd sizes
  (d_model 10^8, 10^6 layers), malformed overrides, a billion-laughs YAML, deep nesting.
* ``unsafe-input``: malicious pickles (in a zip checkpoint, a raw pickle, an OpenNMT-py
  checkpoint, an object array in a PMI table) and YAML python tags (file, override, every
  config reader); a marker file appears if code ran.
* ``disk-full``: each writer writing into a nearly full tmpfs (mounted per case) over an existing
  output, and a training whose run folder fills up.
* ``api``: ``Translator.load`` / ``translate`` / ``nbest`` / ``score`` with None, [], wrong types,
  lone surrogates, line breaks, bad options, damaged checkpoints, mismatched references (batched:
  several cases per Python process, each with its own alarm).
* ``server``: bad start-ups (damaged checkpoints, a bad -host, a taken port, bad numbers) and, on
  one running server, malformed, oversized, deeply nested or lone-surrogate JSON, wrong methods and
  shapes, slow and idle clients, a large request beside a small one, a client that disconnects, a
  request during shutdown (503 on an open and on a new connection, exit 0), the API key
  (``-api_key_file``, ``Authorization: Bearer``, 401, /health open; ``-api_key KEY`` refused),
  /models not revealing the absolute checkpoint path. Server cases follow docs/deploy.md; any 5xx
  but 503-on-shutdown, a reset connection or a request over 60 s is a failure.

Issue 42's classes, the surfaces added since (the input that must survive is checked byte for
byte even where it is the case's standard output):

* ``stdio-files``: standard input or output that is a file of the command: ``-src -`` (and
  ``/dev/stdin``, ``/dev/fd/0``, ``/proc/self/fd/0``) redirected from the ``-output``; ``-output -``,
  ``/dev/stdout`` and ``-stream`` appended onto ``-src``, ``-tgt`` or the model; ``evaluate -json -``
  appended onto its ``-hyp``; and the legal neighbours (standard input from another file, standard
  output appended to a log).
* ``readers-verify``: files that pass for intact: the mapped cache overwritten with the same size,
  a flipped byte, ids outside the vocabulary or offsets out of order with their CRC-32 resealed,
  ``meta.json`` nested deep, ``/dev/zero`` or a folder (rebuilt, saying which file); a run's
  vocabulary or subword model changed; a PMI table's keys unsorted or out of range, negative
  counts (valid zip CRCs); a Marian model intact, under a matching download record, flipped under
  one, with a NaN weight, its ``pytorch_model.bin`` flipped; an OpenNMT-py checkpoint with a NaN.
* ``bounds``: ``-threads``, ``data.workers``, ``train.threads`` of 10^6; the server's counts and
  waits of 10^9 and more, ``-api_key_file /dev/zero``; Marian ``config.json`` values of the wrong
  type (``"false"``, 1, 16.0, a list), ``max_position_embeddings`` 0, JSON nested 100,000 deep,
  ``/dev/zero``; ``translate_stream`` given a str, None, a line break or a lone surrogate.
* ``bench-out``: ``python -m benchmarks run s.yaml --out X``, X docs/, benchmarks/specs/,
  benchmarks/results/gpu/ or the repository (the real folders, compared before and after), a
  folder holding a user's run.json, ``.``, a file, a home-like folder, several specs into a user's
  folder; a new and an empty folder (legal); a spec nested deep or ``/dev/zero``.
* ``messages``: a folder where a file is expected (the server's checkpoint and key file, a Marian
  ``config.json``, a run's vocabulary), a Marian "folder" that is a file, a checkpoint named
  ``lr=0.1.pt`` (served), a pickle refusal (one sentence, nothing run), a plugin that calls
  ``exit()``, Bawden et al.'s ``lexical-choice.json`` without ``-format`` (read).

What it cannot do, and why:

* Permission cases run as root with CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped
  (``setpriv --bounding-set``), not as user nobody: the interpreter and its packages live under
  /root (mode 700), which nobody cannot read, so nobody cannot even import torch. For a file of
  mode 000 owned by root, root without those capabilities gets the same EACCES.
* The output-device cases use private device nodes (``mknod`` in the case folder) except for two
  translate cases on the real /dev/full and /dev/null: a command that replaced its output device
  would otherwise replace the machine's (the harness puts a replaced node back and says so).
* A stall is a case still running at its timeout; whether it would have ended later is not known.
* Memory is judged by the peak RSS (``wait4``) under a 4 GB address-space limit (``prlimit --as``),
  so an input that would eat all memory shows as an out-of-memory error near 4 GB, not as a crash
  of the machine.
* The server is exercised on loopback with one model on one thread; TLS, several models and GPUs
  are not covered.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import http.client
import json
import os
import pickle
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

REPO = Path(__file__).resolve().parent.parent
REFUSE, SUCCEED, EITHER = "refuse", "succeed", "either"
AS_LIMIT = 4 << 30  # address space of every case: an endless input fails there, not in the machine
RSS_LIMIT_MB = 1500  # more than this on an endless or huge input counts as "ate memory"
LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d( [A-Z]+)?\]")
NOISE = (re.compile(r"^no pair has frequency >= \d+\. Stopping"),)  # the BPE learner's documented line
LEFTOVER = re.compile(r"\.tmp\d+(\.npz)?(/|$)|\.old\d+(/|$)")
VOLATILE = ("**/.lock", ".lock")  # the run lock's text names its last holder: rewritten by design
SPECIAL_KINDS = ("char", "fifo", "link", "socket", "block")
COLUMNS = ("damaged", "traceback", "stall", "accepted_invalid", "other")
DROP_CAPS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
PWNED = "PWNED"  # the marker file a malicious pickle or YAML tag creates when it runs
PRECIOUS = b"precious old output: must survive a failed run\n"
# what an allocation failure says (torch's allocator, MemoryError, bin/common.run's out-of-memory line),
# as opposed to a config check that estimates the size ("the model would need ~33 GB of parameters")
ALLOCATION_FAILURE = r"out of memory|allocat|MemoryError"


# ----------------------------------------------------------------------------- judging (pure helpers)


def sh(command: str) -> list[str]:
    """An argument list written as a shell line (the cases read like the commands a user types)."""
    return shlex.split(command)


def error_lines(stderr: str) -> list[str]:
    """The stderr lines a refusal is judged on: everything but progress/log lines and known noise,
    since the contract allows progress lines before the one error line."""
    keep = []
    for line in stderr.splitlines():
        if not line.strip() or LOG_LINE.match(line) or any(n.match(line) for n in NOISE):
            continue
        keep.append(line)
    return keep


def has_traceback(stderr: str, rc: Optional[int], timed_out: bool) -> bool:
    """A bug, not a refusal: a Python traceback, a fatal interpreter error or a death by signal
    (our own kill after a timeout excepted)."""
    if "Traceback (most recent call last)" in stderr or "Fatal Python error" in stderr:
        return True
    return rc is not None and rc < 0 and not timed_out


def traceback_tail(stderr: str) -> str:
    """The last line of the last traceback (the exception), what a report names."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    idx = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), default=-1)
    for line in lines[idx + 1 :]:
        if not line.startswith((" ", "\t")) and not line.startswith("During handling"):
            return line.strip()[:300]
    return (lines[-1] if lines else "").strip()[:300]


def count_lines(data: bytes) -> int:
    """Lines as the toolkit counts them: ``\\n``-terminated, a last line without one counted too."""
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def matches(rel: str, globs: Iterable[str]) -> bool:
    """Whether a case-relative path falls under one of the globs (``**`` crosses folders)."""
    for g in globs:
        if fnmatch.fnmatchcase(rel, g) or (g.endswith("/**") and (rel == g[:-3] or rel.startswith(g[:-2]))):
            return True
    return False


def compare(
    before: dict, after: dict, may_change: Iterable[str], replaced: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """(damage, leftovers) between two snapshots: every entry outside ``may_change`` must be as it
    was (bytes, type, mode, link target); entries inside it may change content but a device, FIFO
    or link must stay one; entries inside ``replaced`` (the toolkit's own files it rebuilds whole,
    a cache) may be anything afterwards. Leftovers are new temporary files (``*.tmp<pid>``)."""
    may_change = list(may_change) + list(VOLATILE)
    damage = []
    for rel, old in sorted(before.items()):
        new = after.get(rel, {"kind": "missing"})
        if matches(rel, replaced):
            continue
        if old["kind"] == "dir":
            if new["kind"] != "dir":
                damage.append(f"{rel}: the folder is now {new['kind']}")
            elif new.get("mode") != old.get("mode"):
                damage.append(f"{rel}: folder mode {old.get('mode'):o} -> {new.get('mode', 0):o}")
            continue
        if matches(rel, may_change):
            if old["kind"] in SPECIAL_KINDS and new["kind"] != old["kind"]:
                damage.append(f"{rel}: was a {old['kind']}, now {new['kind']}")
            continue
        if new["kind"] != old["kind"]:
            damage.append(f"{rel}: was a {old['kind']}, now {new['kind']}")
        elif old["kind"] == "file" and old.get("sha256") != new.get("sha256"):
            damage.append(f"{rel}: content changed ({old.get('size')} -> {new.get('size')} bytes)")
        elif old.get("mode") != new.get("mode"):
            damage.append(f"{rel}: mode {old.get('mode', 0):o} -> {new.get('mode', 0):o}")
        elif old.get("target") != new.get("target") or old.get("rdev") != new.get("rdev"):
            damage.append(f"{rel}: link target or device changed")
    leftovers = sorted(rel for rel in after if rel not in before and LEFTOVER.search(rel))
    return damage, leftovers


def judge(expect: str, rc: Optional[int], stderr: str, timed_out: bool) -> tuple[dict, list[str]]:
    """Flags and problems of a finished command from its exit status and stderr alone."""
    flags = dict.fromkeys(COLUMNS, False)
    problems: list[str] = []
    flags["stall"] = timed_out
    flags["traceback"] = has_traceback(stderr, rc, timed_out)
    if timed_out or flags["traceback"]:
        return flags, problems
    if rc == 0:
        flags["accepted_invalid"] = expect == REFUSE
        return flags, problems
    if expect == SUCCEED:
        problems.append(f"valid input refused (exit {rc}): {(error_lines(stderr) or [''])[-1][:200]}")
        flags["other"] = True
        return flags, problems
    errors = error_lines(stderr)
    if len(errors) != 1:
        problems.append(f"refusal is {len(errors)} stderr lines, not one")
        flags["other"] = True
    return flags, problems


def markdown_table(rows: list[dict]) -> str:
    """The reliability table: one row per class and a total row."""
    head = "| class | cases | damaged | tracebacks | stalls | accepted-invalid | other | behaved | command pattern |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    total = {k: 0 for k in ("cases", *COLUMNS, "behaved")}
    for r in rows:
        cells = [r["cases"], *(r[c] for c in COLUMNS), r["behaved"]]
        pattern = r["pattern"].replace("|", "\\|")  # a bare | ends a table cell, even inside backticks
        lines.append(f"| {r['class']} | " + " | ".join(str(c) for c in cells) + f" | {pattern} |")
        for k in total:
            total[k] += r[k]
    cells = [total["cases"], *(total[c] for c in COLUMNS), total["behaved"]]
    lines.append("| **all** | " + " | ".join(f"**{c}**" for c in cells) + " | |")
    return "\n".join(lines) + "\n"


def spread(items: list, limit: Optional[int]) -> list:
    """At most ``limit`` items, evenly spaced, so a quick run still touches every kind of hazard."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit <= 0:
        return []
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


# ----------------------------------------------------------------------------- hostile bytes (pure helpers)


def record_span(data: bytes, name_suffix: str) -> tuple[int, int]:
    """(start, end) of the stored bytes of the largest zip record whose name ends with
    ``name_suffix`` (``data/N`` records hold tensor storages; ``data.pkl`` the pickle)."""
    with zipfile.ZipFile(_BytesReader(data)) as z:
        infos = [i for i in z.infolist() if re.search(name_suffix, i.filename)]
    if not infos:
        raise ValueError(f"no zip record matches {name_suffix!r}")
    info = max(infos, key=lambda i: i.file_size)
    off = info.header_offset
    n_name, n_extra = struct.unpack("<HH", data[off + 26 : off + 30])
    start = off + 30 + n_name + n_extra
    return start, start + info.compress_size


class _BytesReader:
    """``io.BytesIO`` without importing io's buffered classes into the case code: a file over bytes."""

    def __init__(self, data: bytes):
        import io

        self._f = io.BytesIO(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def flip_middle(data: bytes, record: str = r"/data/\d+$", width: int = 16) -> bytes:
    """``data`` with ``width`` bytes inverted in the middle of a zip record (by default the largest
    tensor storage): the zip stays well-formed, only that record's bytes change."""
    start, end = record_span(data, record)
    mid = (start + end) // 2
    mid = max(start, min(mid, end - width))
    out = bytearray(data)
    for i in range(mid, min(mid + width, end)):
        out[i] ^= 0xFF
    return bytes(out)


class _Evil:
    """Pickles as a call to os.system: what a malicious checkpoint would run when unpickled."""

    def __reduce__(self):
        return (os.system, (f"touch {PWNED}",))


def evil_pickle() -> bytes:
    """A pickle that creates the PWNED marker in the current folder when loaded without restrictions."""
    return pickle.dumps({"model": _Evil(), "format_version": 1}, protocol=2)


def evil_zip(data: bytes) -> bytes:
    """A torch.save archive whose ``data.pkl`` is replaced by :func:`evil_pickle`, checksums intact:
    only a restricted unpickler stops it."""
    import io

    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            payload = evil_pickle() if info.filename.endswith("data.pkl") else src.read(info)
            dst.writestr(info.filename, payload)
    return out.getvalue()


def insert_in_line(data: bytes, junk: bytes, line: int = 2) -> bytes:
    """``data`` with ``junk`` inserted at the start of line ``line`` (0-based), or appended."""
    lines = data.split(b"\n")
    if len(lines) > line:
        lines[line] = junk + lines[line]
        return b"\n".join(lines)
    return data + junk


def drop_line(data: bytes, line: int = 4) -> bytes:
    """``data`` without its line ``line``: a file misaligned with its partner from there on."""
    lines = data.split(b"\n")
    return b"\n".join(lines[:line] + lines[line + 1 :])


# ----------------------------------------------------------------------------- snapshots


def describe_path(path: str) -> dict:
    """Type, mode and content digest of one path, never following a link or reading a device."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"kind": "missing"}
    except OSError as e:
        return {"kind": "error", "error": e.strerror}
    mode = st.st_mode
    kind = (
        "file"
        if stat.S_ISREG(mode)
        else "dir"
        if stat.S_ISDIR(mode)
        else "link"
        if stat.S_ISLNK(mode)
        else "char"
        if stat.S_ISCHR(mode)
        else "fifo"
        if stat.S_ISFIFO(mode)
        else "socket"
        if stat.S_ISSOCK(mode)
        else "block"
    )
    d: dict[str, Any] = {"kind": kind, "mode": stat.S_IMODE(mode)}
    if kind == "file":
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        d.update(size=st.st_size, sha256=h.hexdigest())
    elif kind == "link":
        d["target"] = os.readlink(path)
    elif kind in ("char", "block"):
        d["rdev"] = st.st_rdev
    return d


def snapshot(root: Path, specials: Iterable[str] = ()) -> dict:
    """Every entry under ``root`` (relative names) plus the given absolute special paths."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            out[os.path.relpath(p, root)] = describe_path(p)
    for s in specials:
        out[s] = describe_path(s)
    return out


# ----------------------------------------------------------------------------- cases


@dataclass
class Check:
    """An extra rule of one case: ``fn(ctx) -> problem or None``; ``kind`` is the column it fills."""

    kind: str  # "damaged" or "other"
    fn: Callable[["Ctx"], Optional[str]]


@dataclass
class Case:
    """One hostile case: a command run in a fresh folder (or an API call, or an HTTP request)."""

    cls: str
    name: str
    argv: list[str] = field(default_factory=list)  # a console script and its arguments; {CASE} = the folder
    expect: str = REFUSE
    needs: tuple[str, ...] = ()  # workspace entries copied into the case folder
    outputs: tuple[str, ...] = ()  # globs that may change when the command succeeds
    setup: Optional[Callable[["Ctx"], None]] = None
    teardown: Optional[Callable[["Ctx"], None]] = None
    stdin: str = "devnull"  # devnull | closed | zero | endless | file:REL
    stdout: str = "file"  # file | devfull | closed | broken_pipe | pipe | append:REL
    drop_caps: bool = False
    timeout: float = 90.0
    checks: tuple[Check, ...] = ()
    note: str = ""
    fifo: Optional[str] = None  # a FIFO in the folder the harness reads while the command runs
    specials: tuple[str, ...] = ()  # absolute device paths whose type must not change
    replaced: tuple[str, ...] = ()  # globs of the toolkit's own files it may rebuild whole on success (a cache)
    runner: str = "cmd"  # cmd | api | server
    extra: dict = field(default_factory=dict)

    @property
    def ident(self) -> str:
        """``class/name``: unique, used in file names and reports."""
        return f"{self.cls}/{self.name}"


@dataclass
class Ctx:
    """A running case: its folder and what the runner observed (for checks)."""

    case: Case
    dir: Path
    work: Path
    capture: Path
    rc: Optional[int] = None
    stderr: str = ""
    fifo_data: bytes = b""
    maxrss_mb: float = 0.0
    state: dict = field(default_factory=dict)

    def stdout_bytes(self) -> bytes:
        """What the command wrote to its captured stdout (empty when not captured)."""
        return self.capture.read_bytes() if self.capture.exists() else b""


# --- checks ------------------------------------------------------------------------------------


def _read(ctx: Ctx, rel: str) -> bytes:
    if rel == "<stdout>":
        return ctx.stdout_bytes()
    if rel == "<fifo>":
        return ctx.fifo_data
    p = ctx.dir / rel
    return p.read_bytes() if p.is_file() else b""


def same_lines(src: str, out: str, cr_ok: bool = False) -> Check:
    """On success the output has one line per source line: anything else is silent data loss."""

    def fn(ctx: Ctx) -> Optional[str]:
        if ctx.rc != 0:
            return None
        data = _read(ctx, src)
        want = {count_lines(data)}
        if cr_ok:
            want.add(count_lines(data.replace(b"\r", b"\n")))
        got = count_lines(_read(ctx, out))
        return None if got in want else f"{out}: {got} lines for {sorted(want)} source lines (data lost)"

    return Check("damaged", fn)


def message_has(pattern: str, why: str) -> Check:
    """On a refusal the error line must say ``pattern`` (case-insensitive), e.g. "directory"."""

    def fn(ctx: Ctx) -> Optional[str]:
        if ctx.rc in (0, None) or has_traceback(ctx.stderr, ctx.rc, False):
            return None
        text = "\n".join(error_lines(ctx.stderr))
        return None if re.search(pattern, text, re.I) else f"{why}: {text[-200:]!r}"

    return Check("other", fn)


def message_lacks(pattern: str, why: str) -> Check:
    """On a refusal the error line must not say ``pattern`` (an allocation failure instead of a check)."""

    def fn(ctx: Ctx) -> Optional[str]:
        if ctx.rc in (0, None) or has_traceback(ctx.stderr, ctx.rc, False):
            return None
        text = "\n".join(error_lines(ctx.stderr))
        return f"{why}: {text[-200:]!r}" if re.search(pattern, text, re.I) else None

    return Check("other", fn)


def no_marker() -> Check:
    """A malicious pickle or YAML tag creates PWNED when it runs: code execution is damage."""

    def fn(ctx: Ctx) -> Optional[str]:
        return "the malicious payload ran (PWNED created)" if (ctx.dir / PWNED).exists() else None

    return Check("damaged", fn)


def rss_below(mb: float = RSS_LIMIT_MB) -> Check:
    """An endless or huge input must not eat memory: peak RSS of the command under ``mb``."""

    def fn(ctx: Ctx) -> Optional[str]:
        if ctx.maxrss_mb > mb:
            return f"peak memory {ctx.maxrss_mb:.0f} MB on an endless/huge input"
        if re.search(r"out of memory|MemoryError|cannot allocate", ctx.stderr, re.I):
            return "ran out of memory (the 4 GB address-space limit) instead of refusing the input"
        return None

    return Check("other", fn)


def starts_with(rel: str, prefix: bytes) -> Check:
    """A file opened for appending (``>>``) keeps what it held: replacing it loses data."""

    def fn(ctx: Ctx) -> Optional[str]:
        data = _read(ctx, rel)
        return None if data.startswith(prefix) else f"{rel}: its earlier content is gone (the file was replaced)"

    return Check("damaged", fn)


def exists(pattern: str, why: str) -> Check:
    """On success a file matching ``pattern`` must exist (e.g. the backup -force promises)."""

    def fn(ctx: Ctx) -> Optional[str]:
        if ctx.rc != 0:
            return None
        return None if list(ctx.dir.glob(pattern)) else why

    return Check("other", fn)


# ----------------------------------------------------------------------------- workspace


def console(name: str) -> str:
    """The console script of this interpreter (not a pyenv shim: the shim costs a shell per case)."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def tiny_config(log_dir: str, decoder: str = "transformer", max_steps: int = 10) -> str:
    """The tiny Transformer every case trains or translates with: seconds, not minutes."""
    return (
        "data:\n"
        "  train: {src: toy/train.src, tgt: toy/train.tgt}\n"
        "  valid: {src: toy/valid.src, tgt: toy/valid.tgt}\n"
        "vocab: {subword: bpe, size: 300, shared: true}\n"
        "model:\n"
        "  d_model: 32\n"
        "  encoder: {type: transformer, layers: 1, heads: 2, ff: 64}\n"
        f"  decoder: {{type: {decoder}, layers: 1, heads: 2, ff: 64}}\n"
        "loss:\n"
        "  - {type: label_smoothed_ce, smoothing: 0.1}\n"
        "optim: {type: adam, lr: 1.0e-3}\n"
        f"train: {{batch_tokens: 1024, max_steps: {max_steps}, valid_every: {max_steps}, save_every: 5, "
        "keep_last: 5, seed: 1}\n"
        "translate: {beam: 2}\n"
        f"log: {{dir: {log_dir}, tensorboard: false, every: 5}}\n"
    )


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONWARNINGS", None)
    return env


def _prep_run(cmd: list[str], cwd: Path) -> None:
    r = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"workspace preparation failed: {shlex.join(cmd)}\n{r.stderr[-3000:]}")


def prepare_workspace(work: Path) -> Path:
    """The files cases copy from, made once per --work: corpus, runs, checkpoints, damaged variants."""
    base = work / "base"
    if (base / ".complete").exists() and (base / ".complete").read_text() == PREP_VERSION:
        return base
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    log(f"preparing the workspace in {base}")
    _prep_run(
        [console("onmt_doc_make_toy_corpus"), "--out", "toy", "--train-docs", "300", "--valid-docs", "10"]
        + ["--test-docs", "10"],
        base,
    )
    (base / "tiny.yaml").write_text(tiny_config("run"), encoding="utf-8")
    (base / "gates.yaml").write_text(tiny_config("gates_run", "gated_transformer"), encoding="utf-8")
    _prep_run([console("onmt_doc_train"), "-config", "tiny.yaml"], base)
    ck = base / "run" / "checkpoints"
    for name, src in (("model.pt", "best.pt"), ("last.pt", "last.pt"), ("step_5.pt", "step_5.pt")):
        shutil.copy(ck / src, base / name)
    shutil.copy(ck / "step_10.pt", base / "step_10.pt")
    _prep_run([console("onmt_doc_train"), "-config", "gates.yaml"], base)
    shutil.copy(base / "gates_run" / "checkpoints" / "best.pt", base / "gates.pt")
    _prep_run([console("onmt_doc_build_pmi_table"), "-config", "gates.yaml", "-output", "pmi.npz"], base)
    _prep_run(
        [console("onmt_doc_translate"), "-model", "model.pt", "-src", "toy/test.src", "-beam", "1"]
        + ["-output", "hyp.txt"],
        base,
    )
    (base / "lexicon.tsv").write_text("the\tdie\ncat\tkatze\ndog\thund\n", encoding="utf-8")
    _prep_tensors(base)
    _prep_marian(base)
    (base / ".complete").write_text(PREP_VERSION)
    log("workspace ready")
    return base


def _prep_tensors(base: Path) -> None:
    """Checkpoints only torch can make: a fake OpenNMT-py 3.x checkpoint (and one with a tensor of
    the wrong shape), onmt_doc checkpoints with valid checksums whose tensors or stored config do
    not fit, and a PMI table whose object array is a malicious pickle."""
    code = f"""
import argparse, math, os, sys, numpy as np, torch
sys.path.insert(0, {str(REPO / "tools")!r})
from hostile_review import _Evil, onmt_state
from onmt_doc.models.checkpoint import save_checkpoint
os.chdir({str(base)!r})
sd, gen, opt, vocab = onmt_state()
optim = {{"optimizer": {{"state": {{}}, "param_groups": [{{"lr": 1.0, "params": [0]}}]}}, "training_step": 3}}
torch.save({{"model": sd, "generator": gen, "vocab": vocab, "opt": opt, "optim": optim}}, "onmt.pt")
bad = dict(sd); key = "encoder.transformer.0.feed_forward.w_1.weight"; bad[key] = torch.zeros(7, 5)
torch.save({{"model": bad, "generator": gen, "vocab": vocab, "opt": opt, "optim": optim}}, "onmt_shapes.pt")
nan = dict(sd); nan[key] = sd[key].clone(); nan[key][0, 0] = math.nan
torch.save({{"model": nan, "generator": gen, "vocab": vocab, "opt": opt, "optim": optim}}, "onmt_nan.pt")
ck = torch.load("model.pt", weights_only=True)
name = max((k for k, v in ck["model"].items() if v.dim() == 2), key=lambda k: ck["model"][k].numel())
shapes = dict(ck, model=dict(ck["model"], **{{name: torch.zeros(3, 5)}}))
save_checkpoint(shapes, "shapes.pt")
cfg = dict(ck["config"], model=dict(ck["config"]["model"], d_model=64))
save_checkpoint(dict(ck, config=cfg), "cfgmismatch.pt")
cfg = dict(ck["config"], model=dict(ck["config"]["model"], d_model=10**8))
save_checkpoint(dict(ck, config=cfg), "huge.pt")
table = dict(np.load("pmi.npz"))
arr = np.empty(1, dtype=object); arr[0] = _Evil()
np.savez("evil_pmi.npz", **dict(table, **{{list(table)[0]: arr}}))
"""
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"workspace preparation (tensors) failed:\n{r.stderr[-3000:]}")


PREP_VERSION = "2: vocab digests, a Marian folder, a NaN OpenNMT-py checkpoint\n"  # older workspaces are made again


def _prep_marian(base: Path) -> None:
    """A tiny random Marian model in the Hugging Face layout (``marian/``: safetensors, two
    SentencePiece models learned on the toy corpus, vocab.json, config.json) and its older
    ``pytorch_model.bin`` twin (``marian_bin/``), what onmt_doc_import_marian reads; skipped (the
    cases that need it say so) without the sentencepiece and safetensors packages."""
    code = f"""
import io, json, os, shutil, torch, sentencepiece as spm
from safetensors.torch import save_file
os.chdir({str(base)!r})
def model(path):
    buf = io.BytesIO()
    lines = [x for x in open(path, encoding="utf-8").read().splitlines() if x.strip()]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=60,
                                   model_type="unigram", character_coverage=1.0, minloglevel=2)
    p = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    return buf.getvalue(), [p.id_to_piece(i) for i in range(p.get_piece_size())]
(src, sp), (tgt, tp) = model("toy/train.src"), model("toy/train.tgt")
pieces = ["</s>", "<unk>", *sorted((set(sp) | set(tp)) - {{"<unk>", "<s>", "</s>"}}), "<pad>"]
n, d, ff = len(pieces), 16, 32
g = torch.Generator().manual_seed(0)
t = {{"model.shared.weight": torch.randn(n, d, generator=g), "final_logits_bias": torch.zeros(1, n)}}
def lin(name, o, i):
    t[name + ".weight"], t[name + ".bias"] = torch.randn(o, i, generator=g) * 0.3, torch.zeros(o)
def norm(name):
    t[name + ".weight"], t[name + ".bias"] = torch.ones(d), torch.zeros(d)
for side in ("encoder", "decoder"):
    p = f"model.{{side}}.layers.0."
    for attn in ("self_attn",) + (("encoder_attn",) if side == "decoder" else ()):
        for x in "qkv":
            lin(p + attn + "." + x + "_proj", d, d)
        lin(p + attn + ".out_proj", d, d)
        norm(p + attn + "_layer_norm")
    lin(p + "fc1", ff, d); lin(p + "fc2", d, ff); norm(p + "final_layer_norm")
config = dict(model_type="marian", vocab_size=n, d_model=d, encoder_layers=1, decoder_layers=1,
              encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=ff, decoder_ffn_dim=ff,
              max_position_embeddings=64, activation_function="swish", scale_embedding=True,
              pad_token_id=n - 1, eos_token_id=0, decoder_start_token_id=n - 1, dropout=0.1, attention_dropout=0.0)
os.makedirs("marian")
save_file(t, "marian/model.safetensors", metadata={{"format": "pt"}})
for name, data in (("source.spm", src), ("target.spm", tgt)):
    open("marian/" + name, "wb").write(data)
json.dump(config, open("marian/config.json", "w"))
json.dump({{p: i for i, p in enumerate(pieces)}}, open("marian/vocab.json", "w"))
shutil.copytree("marian", "marian_bin")
os.remove("marian_bin/model.safetensors")
torch.save(t, "marian_bin/pytorch_model.bin")
"""
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    if r.returncode != 0:
        log(f"no Marian folder for the import cases (needs sentencepiece and safetensors): {r.stderr[-300:]}")


def onmt_state() -> tuple:
    """OpenNMT-py 3.5 parameter names and shapes of a tiny pre-norm Transformer (as in
    tests/test_import_opennmt.py), random values: what onmt_doc_import_opennmt reads."""
    import math

    import torch

    d, heads, ff, layers = 16, 2, 24, 1
    words = [f"w{i}" for i in range(13)]
    vocab_list = ["<unk>", "<blank>", "<s>", "</s>", *words, "averyunlikelytoken0"]
    g = torch.Generator().manual_seed(0)
    sd: dict = {}

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    def linear(name, n_out, n_in, bias):
        sd[f"{name}.weight"] = r(n_out, n_in)
        if bias:
            sd[f"{name}.bias"] = r(n_out)

    def norm(name):
        sd[f"{name}.weight"] = 1 + r(d) * 0.1
        sd[f"{name}.bias"] = r(d) * 0.1

    def attn(prefix):
        for n in ("linear_keys", "linear_values", "linear_query", "final_linear"):
            linear(f"{prefix}.{n}", d, d, False)

    def ffn(prefix):
        linear(f"{prefix}.w_1", ff, d, True)
        linear(f"{prefix}.w_2", d, ff, True)
        norm(f"{prefix}.layer_norm")

    pe = torch.zeros(5000, d)  # OpenNMT-py's interleaved sinusoids, saved as a (len, 1, dim) buffer
    pos = torch.arange(5000.0)[:, None]
    div = torch.exp(torch.arange(0, d, 2).float() * -(math.log(10000.0) / d))
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    pe = pe[:, None, :]
    emb = r(len(vocab_list), d)
    emb[1] = 0  # <blank> is the padding index
    for side in ("encoder", "decoder"):
        sd[f"{side}.embeddings.make_embedding.emb_luts.0.weight"] = emb
        sd[f"{side}.embeddings.make_embedding.pe.pe"] = pe.clone()
    for i in range(layers):
        attn(f"encoder.transformer.{i}.self_attn")
        norm(f"encoder.transformer.{i}.layer_norm")
        ffn(f"encoder.transformer.{i}.feed_forward")
    norm("encoder.layer_norm")
    for i in range(layers):
        p = f"decoder.transformer_layers.{i}"
        attn(f"{p}.self_attn")
        norm(f"{p}.layer_norm_1")
        attn(f"{p}.context_attn")
        norm(f"{p}.layer_norm_2")
        ffn(f"{p}.feed_forward")
    norm("decoder.layer_norm")
    gen = {"weight": emb, "bias": r(len(vocab_list))}
    opt = argparse.Namespace(
        model_task="seq2seq",
        encoder_type="transformer",
        decoder_type="transformer",
        enc_layers=layers,
        dec_layers=layers,
        enc_hid_size=d,
        dec_hid_size=d,
        src_word_vec_size=d,
        tgt_word_vec_size=d,
        heads=heads,
        transformer_ff=ff,
        dropout=[0.1],
        attention_dropout=[0.1],
        position_encoding=True,
        position_encoding_type="SinusoidalInterleaved",
        max_relative_positions=0,
        layer_norm="standard",
        norm_eps=1e-6,
        pos_ffn_activation_fn="relu",
        parallel_residual=False,
        num_kv=0,
        num_experts=0,
        self_attn_type="scaled-dot",
        copy_attn=False,
        add_qkvbias=False,
        add_ffnbias=True,
        share_embeddings=True,
        share_decoder_embeddings=True,
    )
    vocab = {"src": vocab_list, "tgt": vocab_list, "data_task": "seq2seq", "decoder_start_token": "<s>"}
    return sd, gen, opt, vocab


def log(msg: str) -> None:
    """Progress on stderr (the results go to files)."""
    print(f"[hostile {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- setup steps

Setup = Callable[[Ctx], None]


def steps(*setups: Optional[Setup]) -> Setup:
    """Several setup steps in order."""

    def fn(ctx: Ctx) -> None:
        for s in setups:
            if s is not None:
                s(ctx)

    return fn


def put(rel: str, data: bytes, mode: Optional[int] = None) -> Setup:
    """Write ``data`` to ``rel`` in the case folder (parents made)."""

    def fn(ctx: Ctx) -> None:
        p = ctx.dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        if mode is not None:
            os.chmod(p, mode)

    return fn


def derive(rel: str, src: str, how: Callable[[bytes], bytes], mode: Optional[int] = None) -> Setup:
    """Write ``how(bytes of src)`` to ``rel``: a hostile variant of a good file."""

    def fn(ctx: Ctx) -> None:
        data = how((ctx.dir / src).read_bytes() if (ctx.dir / src).exists() else (ctx.work / "base" / src).read_bytes())
        put(rel, data, mode)(ctx)

    return fn


def symlink(rel: str, target: str) -> Setup:
    """A symbolic link ``rel`` -> ``target`` (target as written, relative to the link's folder)."""

    def fn(ctx: Ctx) -> None:
        p = ctx.dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)

    return fn


def hardlink(rel: str, target: str) -> Setup:
    """A hard link ``rel`` to the case file ``target``: same inode, another name."""

    def fn(ctx: Ctx) -> None:
        os.link(ctx.dir / target, ctx.dir / rel)

    return fn


def mkdir(rel: str, mode: Optional[int] = None, files: tuple[str, ...] = ()) -> Setup:
    """A folder (with some user files in it, which must survive)."""

    def fn(ctx: Ctx) -> None:
        p = ctx.dir / rel
        p.mkdir(parents=True, exist_ok=True)
        for f in files:
            (p / f).write_bytes(PRECIOUS)
        if mode is not None:
            os.chmod(p, mode)

    return fn


def node(rel: str, minor: int) -> Setup:
    """A private character device (1, minor): 7 is /dev/full, 3 is /dev/null; private so that a
    command replacing its output device replaces a node in the case folder, not the machine's."""

    def fn(ctx: Ctx) -> None:
        os.mknod(ctx.dir / rel, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        os.chmod(ctx.dir / rel, 0o666)

    return fn


def mkfifo(rel: str) -> Setup:
    """A named pipe; the runner reads it while the command runs (``Case.fifo``)."""

    def fn(ctx: Ctx) -> None:
        os.mkfifo(ctx.dir / rel)

    return fn


def chmod(rel: str, mode: int) -> Setup:
    """Change a copied file's mode (permission cases)."""

    def fn(ctx: Ctx) -> None:
        os.chmod(ctx.dir / rel, mode)

    return fn


def copy(rel: str, src: str) -> Setup:
    """A copy of a case file under another name (never a link)."""

    def fn(ctx: Ctx) -> None:
        p = ctx.dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        s = ctx.dir / src if (ctx.dir / src).exists() else ctx.work / "base" / src
        shutil.copyfile(s, p)

    return fn


def tmpfs(rel: str, size_kb: int, free_kb: int, before: Optional[Setup] = None) -> Setup:
    """Mount a ``size_kb`` tmpfs at ``rel``, run ``before`` (existing outputs), then fill it to
    ``free_kb`` free: a disk that fills up while the command writes."""

    def fn(ctx: Ctx) -> None:
        p = ctx.dir / rel
        p.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(p)], capture_output=True)
        if r.returncode != 0:
            raise Unsupported(f"cannot mount a tmpfs: {r.stderr.decode(errors='replace').strip()}")
        ctx.state.setdefault("mounts", []).append(p)
        if before:
            before(ctx)
        fd = os.open(p / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:  # to ENOSPC (free_kb 0), or until free_kb are left
                st = os.statvfs(p)
                left = st.f_bavail * st.f_frsize - free_kb * 1024
                if free_kb and left <= 0:
                    break
                os.write(fd, b"\0" * max(min(left, 65536), 4096))
        except OSError:
            pass
        finally:
            os.close(fd)

    return fn


def unmount(ctx: Ctx) -> None:
    """Teardown of :func:`tmpfs` (lazy, so a straggling process cannot keep it)."""
    for p in ctx.state.get("mounts", []):
        subprocess.run(["umount", "-l", str(p)], capture_output=True)


class Unsupported(Exception):
    """This machine cannot set up the case (no tmpfs, no mknod): the case is skipped and said so."""


# ----------------------------------------------------------------------------- class: output-path


@dataclass
class Writer:
    """A command that writes one file: its arguments with ``{OUT}``, what it reads, and a variant of
    it that fails after starting (for "an existing output survives a failure")."""

    name: str
    argv: list[str]
    needs: tuple[str, ...]
    inputs: tuple[str, ...]  # the first is the one every alias hazard points at
    text: bool
    lines_from: Optional[str] = None
    fail_argv: list[str] = field(default_factory=list)
    fail_setup: Optional[Setup] = None
    same_inputs: int = 1  # how many inputs get their own "output is the input" case


def fill(argv: list[str], **values: str) -> list[str]:
    """``argv`` with ``{OUT}``/``{IN}``/``{CK}`` replaced."""
    out = []
    for a in argv:
        for k, v in values.items():
            a = a.replace("{" + k + "}", v)
        out.append(a)
    return out


TRANSLATE = sh("onmt_doc_translate -model model.pt -src toy/test.src -tgt toy/test.tgt -beam 1")


def writers() -> list[Writer]:
    """Every command that writes one output file."""
    ev = sh("onmt_doc_evaluate -hyp hyp.txt -ref toy/test.tgt -src toy/test.src")
    gate = sh("onmt_doc_gate_analysis -model gates.pt -src toy/test.src -tgt toy/test.tgt")
    return [
        Writer(
            "translate",
            TRANSLATE + ["-output", "{OUT}"],
            ("toy", "model.pt"),
            ("toy/test.src", "toy/test.tgt", "model.pt"),
            True,
            "toy/test.src",
            fill(TRANSLATE, **{})[:4] + sh("bad_mid.src -beam 1 -output {OUT}"),
            derive("bad_mid.src", "toy/test.src", lambda d: insert_in_line(d, b"\xff\xfe", 30)),
            3,
        ),
        Writer(
            "evaluate-json",
            ev + ["-json", "{OUT}"],
            ("toy", "hyp.txt"),
            ("hyp.txt", "toy/test.tgt", "toy/test.src"),
            True,
            None,
            ev[:3] + sh("-ref mis.tgt -json {OUT}"),
            derive("mis.tgt", "toy/test.tgt", drop_line),
            2,
        ),
        Writer(
            "average",
            sh("onmt_doc_average_checkpoints -models step_5.pt step_10.pt -output {OUT}"),
            ("step_5.pt", "step_10.pt", "gates.pt"),
            ("step_10.pt", "step_5.pt"),
            False,
            None,
            sh("onmt_doc_average_checkpoints -models step_5.pt gates.pt -output {OUT}"),
        ),
        Writer(
            "build_pmi_table",
            sh("onmt_doc_build_pmi_table -config tiny.yaml -output {OUT}"),
            ("toy", "tiny.yaml", "run"),
            ("toy/train.src", "tiny.yaml", "run/vocab.txt", "run/subword.model", "toy/train.tgt"),
            False,
            None,
            sh("onmt_doc_build_pmi_table -config tiny.yaml -src toy/train.src -tgt mis.tgt") + ["-output", "{OUT}"],
            derive("mis.tgt", "toy/train.tgt", lambda d: drop_line(d, 900)),
            3,
        ),
        Writer(
            "gate_analysis",
            gate + sh("-table pmi.npz -output {OUT}"),
            ("toy", "gates.pt", "pmi.npz"),
            ("pmi.npz", "toy/test.src", "toy/test.tgt", "gates.pt"),
            True,
            None,
            gate[:5] + sh("-tgt mis.tgt -table pmi.npz -output {OUT}"),
            derive("mis.tgt", "toy/test.tgt", drop_line),
            2,
        ),
        Writer(
            "import_opennmt",
            sh("onmt_doc_import_opennmt -model onmt.pt -subword_type none -force") + ["-output", "{OUT}"],
            ("onmt.pt", "onmt_shapes.pt"),
            ("onmt.pt",),
            False,
            None,
            sh("onmt_doc_import_opennmt -model onmt_shapes.pt -subword_type none -force -output {OUT}"),
        ),
        Writer(
            "scale_model",
            sh("onmt_doc_scale_model -config tiny.yaml -losses 3.0,2.9,2.95 -output {OUT}"),
            ("toy", "tiny.yaml"),
            ("tiny.yaml",),
            True,
            None,
            sh("onmt_doc_scale_model -config tiny.yaml -losses 3.0,2.9,nan -output {OUT}"),
        ),
    ]


# writers whose output folder is created when missing, as they always did (runs/x/pmi.npz before runs/x exists)
MAKES_FOLDER = ("average", "build_pmi_table", "import_opennmt")


def writer_cases(w: Writer) -> list[Case]:
    """The output hazards of one writer."""
    cls, P = "output-path", w.inputs[0]
    pdir, pname = os.path.split(P)

    def case(hazard: str, out: str, expect: str, setup: Optional[Setup] = None, **kw: Any) -> Case:
        return Case(cls, f"{w.name}/{hazard}", fill(w.argv, OUT=out), expect, w.needs, setup=setup, **kw)

    lines = (same_lines(w.lines_from, "out.dat"),) if w.lines_from else ()
    out = [
        case("valid", "out.dat", SUCCEED, outputs=("out.dat",), checks=lines, note="a new output file"),
        *(
            case(f"same-as-{inp.replace('/', '_')}", inp, REFUSE, note=f"-output is the input {inp}")
            for inp in w.inputs[: w.same_inputs]
        ),
        case("symlink-to-input", "out.dat", REFUSE, symlink("out.dat", P), note="a symbolic link to the input"),
        case("hardlink-to-input", "out.dat", REFUSE, hardlink("out.dat", P), note="a hard link to the input"),
        case(
            "is-directory",
            "outdir",
            REFUSE,
            mkdir("outdir", files=("keep.txt",)),
            checks=(message_has("director", "a folder output not reported as a directory"),),
        ),
        (
            case("missing-folder", "nowhere/out.dat", SUCCEED, outputs=("nowhere/out.dat",), note="folder created")
            if w.name in MAKES_FOLDER
            else case("missing-folder", "nowhere/out.dat", REFUSE, note="the output's folder does not exist")
        ),
        case(
            "char-device-full",
            "full",
            REFUSE,
            node("full", 7),
            outputs=("full",),
            checks=(message_has(r"space|ENOSPC", "not an ENOSPC error"),),
            note="a private /dev/full node",
        ),
        Case(
            cls,
            f"{w.name}/existing-output-kept-on-failure",
            fill(w.fail_argv, OUT="out.dat"),
            REFUSE,
            w.needs,
            outputs=("out.dat",),
            setup=steps(put("out.dat", PRECIOUS), w.fail_setup),
            note="an existing output and a run that fails after starting",
        ),
    ]
    if w.name in ("translate", "average", "build_pmi_table"):
        out.append(case("dotdot-to-input", f"sub/../{P}", REFUSE, mkdir("sub"), note="sub/../input"))
    if w.text:
        out.append(
            case("char-device-null", "null", SUCCEED, node("null", 3), outputs=("null",), note="a private /dev/null")
        )
    if w.name in ("translate", "build_pmi_table", "import_opennmt"):  # one text, one table, one checkpoint
        out.append(
            case(
                "folder-link-to-input",
                f"alias/{pname}",
                REFUSE,
                symlink("alias", pdir or "."),
                note="a symbolic link to the input's folder, then the input's name",
            )
        )
    if w.text or w.name == "average":
        out.append(
            case(
                "link-to-other-file",
                "out.dat",
                SUCCEED,
                steps(put("other/target.dat", PRECIOUS), symlink("out.dat", "other/target.dat")),
                outputs=("out.dat", "other/target.dat"),
                note="a link to a non-input file: followed, the link kept",
            )
        )
    if w.text:
        fifo_lines = (same_lines(w.lines_from, "<fifo>"),) if w.lines_from else ()
        out.append(
            case(
                "fifo-with-reader",
                "out.fifo",
                SUCCEED,
                mkfifo("out.fifo"),
                outputs=("out.fifo",),
                fifo="out.fifo",
                checks=fifo_lines,
                note="a named pipe read by another process",
            )
        )
    return out


def output_path_extras() -> list[Case]:
    """Hazards worth one or two writers only: the real devices, /dev/stdout, read-only folders."""
    cls = "output-path"
    tr = TRANSLATE + ["-output"]
    ev = sh("onmt_doc_evaluate -hyp hyp.txt -ref toy/test.tgt -json")
    gate = sh("onmt_doc_gate_analysis -model gates.pt -src toy/test.src -tgt toy/test.tgt")
    gate += sh("-table pmi.npz -output")
    avg = sh("onmt_doc_average_checkpoints -models step_5.pt step_10.pt -output")
    t_needs, e_needs, g_needs = ("toy", "model.pt"), ("toy", "hyp.txt"), ("toy", "gates.pt", "pmi.npz")
    cases = [
        Case(cls, "translate/abs-path-to-input", tr + ["{CASE}/toy/test.src"], REFUSE, t_needs, note="absolute path"),
        Case(
            cls,
            "translate/real-dev-full",
            tr + ["/dev/full"],
            REFUSE,
            t_needs,
            specials=("/dev/full",),
            checks=(message_has(r"space|ENOSPC", "not an ENOSPC error"),),
        ),
        Case(cls, "translate/real-dev-null", tr + ["/dev/null"], SUCCEED, t_needs, specials=("/dev/null",)),
    ]
    for name, argv, needs, lines in (
        ("translate", tr, t_needs, "toy/test.src"),
        ("evaluate-json", ev, e_needs, None),
        ("gate_analysis", gate, g_needs, None),
    ):
        pipe_checks = (same_lines(lines, "<stdout>"),) if lines else ()
        cases += [
            Case(
                cls,
                f"{name}/dev-stdout-on-pipe",
                argv + ["/dev/stdout"],
                SUCCEED,
                needs,
                stdout="pipe",
                checks=pipe_checks,
                note="-output /dev/stdout with stdout a pipe",
            ),
            Case(
                cls,
                f"{name}/dev-stdout-appending",
                argv + ["/dev/stdout"],
                SUCCEED,
                needs,
                stdout="append:log.txt",
                setup=put("log.txt", PRECIOUS),
                outputs=("log.txt",),
                checks=(starts_with("log.txt", PRECIOUS),),
                note="-output /dev/stdout with stdout appended to an existing file (>>)",
            ),
        ]
    for name, argv, needs in (
        ("translate", tr, t_needs),
        ("evaluate-json", ev, e_needs),
        ("average", avg, ("step_5.pt", "step_10.pt")),
    ):
        cases.append(
            Case(
                cls,
                f"{name}/read-only-folder",
                argv + ["ro/out.dat"],
                REFUSE,
                needs,
                setup=mkdir("ro", 0o555),
                drop_caps=True,
                note="the output's folder is not writable (capabilities dropped)",
            )
        )
    items = sh("onmt_doc_evaluate -model model.pt -suite toy/test.contrastive.tsv -item_scores")
    cases += [
        Case(cls, "evaluate-items/same-as-suite", items + ["toy/test.contrastive.tsv"], REFUSE, t_needs),
        Case(
            cls,
            "evaluate-items/existing-output-kept-on-failure",
            items[:4] + sh("bad.tsv -item_scores out.dat"),
            REFUSE,
            t_needs,
            outputs=("out.dat",),
            setup=steps(put("out.dat", PRECIOUS), derive("bad.tsv", "toy/test.contrastive.tsv", lambda d: d + b"x\n")),
            note="an existing -item_scores file and a suite whose last line is malformed",
        ),
    ]
    cases.append(
        Case(
            cls,
            "import_opennmt/existing-without-force",
            sh("onmt_doc_import_opennmt -model onmt.pt -subword_type none -output out.pt"),
            REFUSE,
            ("onmt.pt",),
            setup=put("out.pt", PRECIOUS),
            outputs=("out.pt",),
            note="an existing output, no -force",
        )
    )
    return cases


def cases_output_path() -> list[Case]:
    """Class output-path: every file writer x output hazards."""
    out = []
    for w in writers():
        out += writer_cases(w)
    return out + output_path_extras()


# ----------------------------------------------------------------------------- class: output-folder


def cases_output_folder() -> list[Case]:
    """Class output-folder: release and make_toy_corpus --out with hostile folders."""
    cls = "output-folder"
    rel = sh("onmt_doc_release -model model.pt -output")
    toy = sh("onmt_doc_make_toy_corpus --train-docs 20 --valid-docs 2 --test-docs 2 --out")
    user = mkdir("ct2", files=("user_notes.txt",))
    ro = mkdir("ro", 0o555)
    corpus_out = tuple(f"toy/{s}.{e}" for s in ("train", "valid", "test") for e in ("src", "tgt", "ctx"))
    corpus_out += ("toy/test.contrastive.json", "toy/test.contrastive.tsv")
    return [
        Case(cls, "release/valid", rel + ["ct2"], SUCCEED, ("model.pt",), outputs=("ct2/**", "ct2")),
        Case(
            cls, "release/folder-holding-input", rel + [".", "-force"], REFUSE, ("model.pt",), note="-output . -force"
        ),
        Case(
            cls,
            "release/subfolder-holding-input",
            sh("onmt_doc_release -model d/model.pt -output d -force"),
            REFUSE,
            (),
            setup=copy("d/model.pt", "model.pt"),
            note="-output d -force where d/model.pt is -model",
        ),
        Case(cls, "release/existing-no-force", rel + ["ct2"], REFUSE, ("model.pt",), setup=user),
        Case(
            cls,
            "release/existing-force",
            rel + ["ct2", "-force"],
            SUCCEED,
            ("model.pt",),
            setup=user,
            outputs=("ct2/**",),
        ),
        Case(
            cls,
            "release/force-failing-export",
            sh("onmt_doc_release -model gates.pt -output ct2 -force"),
            REFUSE,
            ("gates.pt",),
            setup=user,
            note="-force over a folder, the export refused (context gates)",
        ),
        Case(cls, "release/output-is-file", rel + ["ct2"], REFUSE, ("model.pt",), setup=put("ct2", PRECIOUS)),
        Case(
            cls,
            "release/output-is-link",
            rel + ["ct2", "-force"],
            REFUSE,
            ("model.pt",),
            setup=steps(mkdir("real", files=("user_notes.txt",)), symlink("ct2", "real")),
        ),
        Case(cls, "release/output-is-device", rel + ["null"], REFUSE, ("model.pt",), setup=node("null", 3)),
        Case(cls, "release/output-is-model", rel + ["model.pt", "-force"], REFUSE, ("model.pt",)),
        Case(cls, "release/read-only-parent", rel + ["ro/ct2"], REFUSE, ("model.pt",), setup=ro, drop_caps=True),
        Case(
            cls,
            "release/max-positions-1e9",
            rel + sh("ct2 -max_positions 1000000000"),
            REFUSE,
            ("model.pt",),
            checks=(message_lacks(ALLOCATION_FAILURE, "an allocation failure, not a check"),),
        ),
        Case(cls, "release/bad-quantization", rel + sh("ct2 -quantization int3"), REFUSE, ("model.pt",)),
        Case(cls, "make_toy_corpus/existing-corpus", toy + ["toy"], REFUSE, ("toy",)),
        Case(
            cls,
            "make_toy_corpus/force-keeps-user-files",
            toy + ["toy", "--force"],
            SUCCEED,
            ("toy",),
            setup=put("toy/user_notes.txt", PRECIOUS),
            outputs=corpus_out,
        ),
        Case(cls, "make_toy_corpus/out-is-file", toy + ["hyp.txt"], REFUSE, ("hyp.txt",)),
        Case(cls, "make_toy_corpus/out-is-device", toy + ["null"], REFUSE, (), setup=node("null", 3)),
        Case(cls, "make_toy_corpus/out-under-file", toy + ["hyp.txt/x"], REFUSE, ("hyp.txt",)),
        Case(cls, "make_toy_corpus/read-only-parent", toy + ["ro/toy"], REFUSE, (), setup=ro, drop_caps=True),
        Case(
            cls,
            "make_toy_corpus/train-docs-1e12",
            sh("onmt_doc_make_toy_corpus --train-docs 1000000000000 --out big"),
            EITHER,
            (),
            timeout=60,
            outputs=("big/**",),
            checks=(rss_below(),),
            note="an absurd size: refused or bounded",
        ),
    ]


# ----------------------------------------------------------------------------- class: stdio


def cases_stdio() -> list[Case]:
    """Class stdio: standard output that fails, standard input that is closed, empty or endless."""
    cls = "stdio"
    printers = [
        ("translate", TRANSLATE[:5] + ["-beam", "1"], ("toy", "model.pt")),
        ("evaluate", sh("onmt_doc_evaluate -hyp hyp.txt -ref toy/test.tgt"), ("toy", "hyp.txt")),
        ("evaluate-json", sh("onmt_doc_evaluate -hyp hyp.txt -ref toy/test.tgt -json -"), ("toy", "hyp.txt")),
        (
            "gate_analysis",
            sh("onmt_doc_gate_analysis -model gates.pt -src toy/test.src -tgt toy/test.tgt -table pmi.npz"),
            ("toy", "gates.pt", "pmi.npz"),
        ),
        (
            "make_toy_corpus-score",
            sh("onmt_doc_make_toy_corpus score --hyp hyp.txt --ctx toy/test.ctx"),
            ("toy", "hyp.txt"),
        ),
        ("make_toy_corpus", sh("onmt_doc_make_toy_corpus --train-docs 5 --valid-docs 1 --test-docs 1 --out new"), ()),
    ]
    cases = []
    for name, argv, needs in printers:
        outs = ("new/**",) if name == "make_toy_corpus" else ()
        for how, note in (
            ("devfull", "stdout is /dev/full (>/dev/full)"),
            ("closed", "stdout closed (>&-)"),
            ("broken_pipe", "stdout a pipe whose reader has gone"),
        ):
            cases.append(Case(cls, f"{name}/stdout-{how}", argv, REFUSE, needs, stdout=how, outputs=outs, note=note))
    src = sh("onmt_doc_translate -model model.pt -beam 1 -src")
    needs = ("toy", "model.pt")
    cases += [
        Case(
            cls,
            "translate/stdin-closed",
            src + ["-"],
            REFUSE,
            needs,
            stdin="closed",
            note="-src - with stdin closed (<&-)",
        ),
        Case(cls, "translate/dev-stdin-closed", src + ["/dev/stdin"], REFUSE, needs, stdin="closed"),
        Case(
            cls,
            "translate/stdin-empty",
            src + ["-"],
            EITHER,
            needs,
            stdin="devnull",
            checks=(same_lines("toy/empty", "<stdout>"),),
            setup=put("toy/empty", b""),
        ),
        Case(
            cls,
            "translate/stdin-file",
            src + ["-"],
            SUCCEED,
            needs,
            stdin="file:toy/test.src",
            checks=(same_lines("toy/test.src", "<stdout>"),),
        ),
        Case(
            cls,
            "translate/stdin-dev-zero",
            src + ["-"],
            REFUSE,
            needs,
            stdin="zero",
            checks=(rss_below(),),
            timeout=120,
        ),
        Case(
            cls,
            "translate/stdin-endless-pipe",
            src + ["-"],
            REFUSE,
            needs,
            stdin="endless",
            checks=(rss_below(),),
            timeout=120,
            note="an endless line without a line break on a pipe",
        ),
    ]
    return cases


# ----------------------------------------------------------------------------- class: input-files

INPUT_HAZARDS: dict[str, tuple[str, str]] = {
    # name: (expectation, what it is)
    "missing": (REFUSE, "the file does not exist"),
    "directory": (REFUSE, "a folder"),
    "empty": (EITHER, "an empty file"),
    "invalid-utf8": (REFUSE, "bytes FF FE in line 3"),
    "lone-surrogate": (REFUSE, "bytes ED A0 80 (a UTF-16 surrogate) in line 3"),
    "cr-only": (EITHER, "CR-only line ends"),
    "binary": (REFUSE, "4 KB of random bytes"),
    "nul": (EITHER, "a NUL byte in line 3"),
    "bom": (EITHER, "a UTF-8 byte order mark"),
    "long-line": (EITHER, "one 2 MB line"),
    "dev-zero": (REFUSE, "/dev/zero: an endless line"),
    "permission": (REFUSE, "mode 000 (capabilities dropped)"),
    "broken-link": (REFUSE, "a dangling symbolic link"),
    "misaligned": (REFUSE, "one line fewer than its partner"),
    "truncated": (REFUSE, "the first half of the file"),
    "text": (REFUSE, "a text file where a table is expected"),
}


def hazard_file(hazard: str, valid: str, name: str) -> tuple[str, Optional[Setup]]:
    """(path to pass, setup) of one input hazard built from the good file ``valid``."""
    rnd = random.Random(hazard + valid)
    how: dict[str, Callable[[bytes], bytes]] = {
        "empty": lambda d: b"",
        "invalid-utf8": lambda d: insert_in_line(d, b"\xff\xfe"),
        "lone-surrogate": lambda d: insert_in_line(d, b"\xed\xa0\x80"),
        "cr-only": lambda d: d.replace(b"\n", b"\r"),
        "binary": lambda d: bytes(rnd.randrange(256) for _ in range(4096)),
        "nul": lambda d: insert_in_line(d, b"\x00"),
        "bom": lambda d: b"\xef\xbb\xbf" + d,
        "long-line": lambda d: d + b"a" * 2_000_000 + b"\n",
        "misaligned": drop_line,
        "truncated": lambda d: d[: len(d) // 2],
        "text": lambda d: b"the cat sees the dog .\n" * 20,
    }
    if hazard == "missing":
        return name, None
    if hazard == "directory":
        return name, mkdir(name, files=("keep.txt",))
    if hazard == "dev-zero":
        return "/dev/zero", None
    if hazard == "permission":
        return name, derive(name, valid, lambda d: d, 0o000)
    if hazard == "broken-link":
        return name, symlink(name, "nowhere.txt")
    return name, derive(name, valid, how[hazard])


@dataclass
class Reader:
    """A command reading one user file, given as ``{IN}``; ``valid`` is a good file to start from."""

    name: str
    argv: list[str]
    needs: tuple[str, ...]
    valid: str
    hazards: tuple[str, ...]
    outputs: tuple[str, ...] = ()
    lines_to: Optional[str] = None  # on success: the output with one line per {IN} line
    expect: dict = field(default_factory=dict)  # hazard -> expectation, overriding INPUT_HAZARDS
    timeout: float = 90.0


def readers() -> list[Reader]:
    """Every command that reads a user's text, JSON, YAML or table file, with the hazards that
    matter for it (all of them for the main reader, translate -src)."""
    tr = "onmt_doc_translate -model model.pt -beam 1"
    ev = "onmt_doc_evaluate"
    pmi = "onmt_doc_build_pmi_table -config tiny.yaml"
    gate = "onmt_doc_gate_analysis -model gates.pt"
    not_table = {h: REFUSE for h in ("empty", "cr-only", "nul", "bom", "long-line")}
    every = "missing directory empty invalid-utf8 lone-surrogate cr-only binary nul bom long-line dev-zero permission"
    t_needs = ("toy", "model.pt")
    return [
        Reader(
            "translate-src",
            sh(f"{tr} -src {{IN}} -output out.txt"),
            t_needs,
            "toy/test.src",
            (*every.split(), "broken-link"),
            ("out.txt",),
            "out.txt",
        ),
        Reader(
            "translate-tgt",
            sh(f"{tr} -src toy/test.src -tgt {{IN}} -output out.txt"),
            t_needs,
            "toy/test.tgt",
            tuple("missing directory invalid-utf8 misaligned dev-zero".split()),
            ("out.txt",),
            expect={"empty": REFUSE},
        ),
        Reader(
            "translate-score",
            sh(f"{tr} -src toy/test.src -tgt {{IN}} -score -output out.txt"),
            t_needs,
            "toy/test.tgt",
            ("misaligned", "long-line"),
            ("out.txt",),
        ),
        Reader(
            "evaluate-hyp",
            sh(f"{ev} -hyp {{IN}} -ref toy/test.tgt"),
            ("toy", "hyp.txt"),
            "hyp.txt",
            tuple("missing directory invalid-utf8 lone-surrogate misaligned dev-zero permission".split()),
        ),
        Reader(
            "evaluate-suite",
            sh(f"{ev} -model model.pt -suite {{IN}}"),
            t_needs,
            "toy/test.contrastive.json",
            tuple("missing directory empty invalid-utf8 binary dev-zero permission truncated".split()),
            expect={"empty": EITHER},
        ),
        Reader(
            "evaluate-lexicon",
            sh(f"{ev} -hyp hyp.txt -ref toy/test.tgt -src toy/test.src -lexicon {{IN}}"),
            ("toy", "hyp.txt", "lexicon.tsv"),
            "lexicon.tsv",
            ("directory", "invalid-utf8"),
        ),
        Reader(
            "build_vocab-train-src",
            sh("onmt_doc_build_vocab -config tiny.yaml log.dir=newrun data.train.src={IN}"),
            ("toy", "tiny.yaml"),
            "toy/train.src",
            tuple("missing directory empty invalid-utf8 misaligned dev-zero long-line".split()),
            ("newrun/**",),
            expect={"empty": REFUSE},
        ),
        Reader(
            "train-valid-src",
            sh("onmt_doc_train -config tiny.yaml train.max_steps=2 data.valid.src={IN}"),
            ("toy", "tiny.yaml"),
            "toy/valid.src",
            tuple("missing directory invalid-utf8 misaligned dev-zero".split()),
            ("run/**",),
            timeout=150,
        ),
        Reader(
            "build_pmi_table-src",
            sh(f"{pmi} -src {{IN}} -tgt toy/train.tgt -output t.npz"),
            ("toy", "tiny.yaml", "run"),
            "toy/train.src",
            tuple("missing directory invalid-utf8 misaligned dev-zero permission".split()),
            ("t.npz",),
        ),
        Reader(
            "gate_analysis-src",
            sh(f"{gate} -src {{IN}} -tgt toy/test.tgt -table pmi.npz"),
            ("toy", "gates.pt", "pmi.npz"),
            "toy/test.src",
            tuple("missing directory invalid-utf8 misaligned dev-zero permission".split()),
        ),
        Reader(
            "gate_analysis-table",
            sh(f"{gate} -src toy/test.src -tgt toy/test.tgt -table {{IN}}"),
            ("toy", "gates.pt", "pmi.npz"),
            "pmi.npz",
            tuple("missing directory empty binary truncated dev-zero permission text".split()),
            expect=not_table,
        ),
        Reader(
            "make_toy_corpus-score-hyp",
            sh("onmt_doc_make_toy_corpus score --hyp {IN} --ctx toy/test.ctx"),
            ("toy", "hyp.txt"),
            "hyp.txt",
            tuple("missing directory invalid-utf8 misaligned dev-zero".split()),
        ),
        Reader(
            "import_opennmt-subword",
            sh("onmt_doc_import_opennmt -model onmt.pt -src_subword_model {IN} -output m.pt"),
            ("onmt.pt", "run"),
            "run/subword.model",
            tuple("missing directory binary dev-zero".split()),
            ("m.pt",),
            expect={"empty": REFUSE},
        ),
        Reader(
            "train-config",
            sh("onmt_doc_train -config {IN}"),
            ("toy",),
            "cfg.yaml",
            tuple("missing directory empty invalid-utf8 binary dev-zero permission".split()),
            ("cfgrun/**",),
            expect={"empty": REFUSE},
            timeout=150,
        ),
        Reader(
            "scale_model-config",
            sh("onmt_doc_scale_model -config {IN} -losses 3,2.9,2.95 -output s.yaml"),
            ("toy",),
            "cfg.yaml",
            tuple("missing directory invalid-utf8 dev-zero".split()),
            ("s.yaml",),
        ),
    ]


def reader_cases(r: Reader) -> list[Case]:
    """The input hazards of one reader."""
    out = []
    ext = os.path.splitext(r.valid)[1] or ".txt"
    for hazard in r.hazards:
        expect, note = INPUT_HAZARDS[hazard]
        expect = r.expect.get(hazard, expect)
        path, setup = hazard_file(hazard, r.valid, f"in{ext}")
        if r.valid == "cfg.yaml":  # a config of its own run folder, two steps: cheap when it is valid
            setup = steps(put("cfg.yaml", tiny_config("cfgrun", max_steps=2).encode()), setup)
        checks: list[Check] = []
        if hazard == "directory":
            checks.append(message_has("director", "a folder reported as something else (not 'directory')"))
        if hazard in ("dev-zero", "long-line"):
            checks.append(rss_below())
        if hazard == "dev-zero":  # it exists: "not found" sends the user looking for a typo
            checks.append(message_lacks(r"not found", "/dev/zero reported as 'not found'"))
        if r.lines_to and hazard not in ("dev-zero",):
            checks.append(same_lines(path, r.lines_to, cr_ok=hazard == "cr-only"))
        out.append(
            Case(
                "input-files",
                f"{r.name}/{hazard}",
                fill(r.argv, IN=path),
                expect,
                r.needs,
                r.outputs,
                setup,
                drop_caps=hazard == "permission",
                checks=tuple(checks),
                note=note,
                timeout=r.timeout,
            )
        )
    return out


def cases_input_files() -> list[Case]:
    """Class input-files: every reader x bad file contents and kinds."""
    out = []
    for r in readers():
        out += reader_cases(r)
    return out


# ----------------------------------------------------------------------------- class: checkpoints

CK_HAZARDS: dict[str, str] = {
    "flip-tensor": "16 bytes inverted in the middle of the largest tensor's data (zip intact)",
    "flip-pickle": "16 bytes inverted inside data.pkl",
    "truncated": "the first half of the file",
    "text": "a text file named .pt",
    "shapes": "a tensor of impossible shape, checksums valid",
    "cfg-mismatch": "the stored config says d_model 64 for d_model 32 weights, checksums valid",
    "huge-config": "the stored config says d_model 10^8, checksums valid",
    "missing": "no such file",
    "directory": "a folder",
    "empty": "an empty file",
    "zeros": "the right size, all zero bytes",
    "permission": "mode 000 (capabilities dropped)",
}


def checkpoint_file(hazard: str, base: str, name: str = "bad.pt") -> tuple[str, Optional[Setup]]:
    """(path, setup) of a damaged variant of the checkpoint ``base``."""
    prepared = {"shapes": "shapes.pt", "cfg-mismatch": "cfgmismatch.pt", "huge-config": "huge.pt"}
    if base == "onmt.pt":
        prepared["shapes"] = "onmt_shapes.pt"
    if hazard in prepared:
        return name, copy(name, prepared[hazard])
    how: dict[str, Callable[[bytes], bytes]] = {
        "flip-tensor": flip_middle,
        "flip-pickle": lambda d: flip_middle(d, r"data\.pkl$", 4),
        "truncated": lambda d: d[: len(d) // 2],
        "text": lambda d: b"this is not a checkpoint\n" * 10,
        "empty": lambda d: b"",
        "zeros": lambda d: bytes(len(d)),
    }
    if hazard == "missing":
        return name, None
    if hazard == "directory":
        return name, mkdir(name, files=("keep.txt",))
    if hazard == "permission":
        return name, derive(name, base, lambda d: d, 0o000)
    return name, derive(name, base, how[hazard])


@dataclass
class CkReader:
    """A command that reads a checkpoint given as ``{CK}`` (or placed by ``place``)."""

    name: str
    argv: list[str]
    needs: tuple[str, ...]
    base: str
    hazards: tuple[str, ...]
    outputs: tuple[str, ...] = ()
    place: Optional[str] = None  # copy the damaged file here instead of passing it (resume: last.pt)
    timeout: float = 90.0
    server: bool = False


CORE = ("flip-tensor", "truncated", "text", "shapes", "cfg-mismatch")
GENERIC = ("missing", "directory", "empty", "zeros", "permission")


def ck_readers() -> list[CkReader]:
    """Every reader of a checkpoint."""
    tr = sh("onmt_doc_translate -src toy/test.src -beam 1 -output out.txt -model")
    gate = sh("onmt_doc_gate_analysis -src toy/test.src -tgt toy/test.tgt -table pmi.npz -model")
    return [
        CkReader(
            "translate",
            tr + ["{CK}"],
            ("toy", "model.pt"),
            "model.pt",
            CORE + ("flip-pickle", "huge-config") + GENERIC,
            ("out.txt",),
        ),
        CkReader("ensemble", tr + ["model.pt", "{CK}"], ("toy", "model.pt"), "model.pt", CORE[:4], ("out.txt",)),
        CkReader(
            "resume",
            sh("onmt_doc_train -config tiny.yaml train.max_steps=15"),
            ("toy", "tiny.yaml", "run"),
            "last.pt",
            CORE + ("flip-pickle", "missing", "empty", "permission"),
            ("run/**",),
            "run/checkpoints/last.pt",
            150,
        ),
        CkReader(
            "init_from",
            sh("onmt_doc_train -config tiny.yaml log.dir=run2 train.max_steps=2 train.init_from={CK}"),
            ("toy", "tiny.yaml"),
            "model.pt",
            CORE[:3],
            ("run2/**",),
            timeout=150,
        ),
        CkReader(
            "average",
            sh("onmt_doc_average_checkpoints -output avg.pt -models {CK} step_10.pt"),
            ("step_5.pt", "step_10.pt"),
            "step_5.pt",
            CORE + GENERIC[:4],
            ("avg.pt",),
        ),
        CkReader(
            "release", sh("onmt_doc_release -output ct2 -model {CK}"), ("model.pt",), "model.pt", CORE[:4], ("ct2/**",)
        ),
        CkReader(
            "evaluate",
            sh("onmt_doc_evaluate -suite toy/test.contrastive.json -model {CK}"),
            ("toy", "model.pt"),
            "model.pt",
            CORE[:3],
        ),
        CkReader("gate_analysis", gate + ["{CK}"], ("toy", "gates.pt", "pmi.npz"), "gates.pt", CORE[:4]),
        CkReader(
            "server",
            sh("onmt_doc_server -port 0 -threads 1 -model {CK}"),
            ("model.pt",),
            "model.pt",
            CORE + ("huge-config", "missing"),
            timeout=60,
            server=True,
        ),
        CkReader(
            "import_opennmt",
            sh("onmt_doc_import_opennmt -subword_type none -output m.pt -model {CK}"),
            ("onmt.pt", "onmt_shapes.pt"),
            "onmt.pt",
            ("flip-tensor", "flip-pickle", "truncated", "text", "shapes", "directory"),
            ("m.pt",),
        ),
    ]


def ck_cases(r: CkReader) -> list[Case]:
    """The checkpoint hazards of one reader."""
    out = []
    for hazard in r.hazards:
        path, setup = checkpoint_file(hazard, r.base)
        argv = fill(r.argv, CK=path)
        if r.place:
            if hazard == "missing":
                setup = steps(lambda ctx: os.remove(ctx.dir / r.place))
            else:
                setup = steps(setup, lambda ctx, p=path: os.replace(ctx.dir / p, ctx.dir / r.place))
        checks: list[Check] = []
        if hazard == "directory":
            checks.append(message_has("director", "a folder reported as something else (not 'directory')"))
        if hazard == "huge-config":
            checks += [message_lacks(ALLOCATION_FAILURE, "an allocation failure, not a config check"), rss_below()]
        if r.name == "resume" and hazard in ("flip-tensor", "truncated", "flip-pickle"):
            checks.append(message_has(r"step_\d+\.pt", "a damaged last.pt refused without naming the intact step_N.pt"))
        expect = EITHER if (r.name == "resume" and hazard == "missing") else REFUSE
        out.append(
            Case(
                "checkpoints",
                f"{r.name}/{hazard}",
                argv,
                expect,
                r.needs,
                r.outputs,
                setup,
                drop_caps=hazard == "permission",
                timeout=r.timeout,
                checks=tuple(checks),
                note=CK_HAZARDS[hazard],
                extra={"server_start": r.server},
            )
        )
    return out


def cases_checkpoints() -> list[Case]:
    """Class checkpoints: every checkpoint reader x damaged checkpoints."""
    out = []
    for r in ck_readers():
        out += [c for c in ck_cases(r) if not (r.name == "resume" and c.name.endswith("/missing"))]
    return out


# ----------------------------------------------------------------------------- class: run-folder


def hold_lock(rel: str) -> Setup:
    """Hold the run folder's flock as another training would (released at teardown)."""

    def fn(ctx: Ctx) -> None:
        import fcntl

        fd = os.open(ctx.dir / rel, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": "now", "command": "hostile_review"}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        ctx.state["lock_fd"] = fd

    return fn


def release_lock(ctx: Ctx) -> None:
    """Teardown of :func:`hold_lock`."""
    fd = ctx.state.pop("lock_fd", None)
    if fd is not None:
        os.close(fd)


def cases_run_folder() -> list[Case]:
    """Class run-folder: what training and the run-folder writers promise about a run's files."""
    cls = "run-folder"
    train = sh("onmt_doc_train -config tiny.yaml")
    needs = ("toy", "tiny.yaml", "run")
    drop_last = steps(lambda ctx: os.remove(ctx.dir / "run/checkpoints/last.pt"))
    # what a resumed training may write; never the step_N.pt files it did not make
    resumed = ("run/checkpoints/last.pt", "run/checkpoints/best.pt", "run/config.yaml", "run/cache/**")
    resumed += ("run/checkpoints/step_1[1-9].pt",)
    locked = hold_lock("run/.lock")
    return [
        Case(
            cls,
            "train/last-missing-steps-exist",
            train,
            EITHER,
            needs,
            resumed,
            drop_last,
            timeout=150,
            note="last.pt deleted, step_5.pt and step_10.pt there: no restart at step 0 over them",
        ),
        Case(
            cls,
            "train/last-missing-extend",
            train + ["train.max_steps=15"],
            EITHER,
            needs,
            resumed,
            drop_last,
            timeout=150,
        ),
        Case(
            cls,
            "train/resume-optimizer-sgd",
            train + ["train.max_steps=15", "optim.type=sgd"],
            REFUSE,
            needs,
            timeout=150,
        ),
        Case(
            cls,
            "train/resume-optimizer-adamw",
            train + ["train.max_steps=15", "optim.type=adamw"],
            REFUSE,
            needs,
            timeout=150,
        ),
        Case(
            cls,
            "train/resume-architecture",
            train + ["train.max_steps=15", "model.d_model=64"],
            REFUSE,
            needs,
            timeout=150,
        ),
        Case(
            cls,
            "train/resume-changed-data",
            train + ["train.max_steps=15", "data.train.src=toy/valid.src", "data.train.tgt=toy/valid.tgt"],
            REFUSE,
            needs,
            timeout=150,
        ),
        Case(
            cls,
            "train/best-as-last",
            train + ["train.max_steps=15"],
            REFUSE,
            needs,
            setup=copy("run/checkpoints/last.pt", "run/checkpoints/best.pt"),
            timeout=150,
        ),
        Case(
            cls,
            "train/config-is-run-config",
            sh("onmt_doc_train -config run/config.yaml"),
            EITHER,
            needs,
            resumed[:2] + resumed[3:],
            timeout=150,
            note="-config run/config.yaml (the run's resolved config): training must not write over it",
        ),
        Case(
            cls,
            "train/user-config-named-config-yaml",
            sh("onmt_doc_train -config run2/config.yaml train.max_steps=2"),
            EITHER,
            ("toy",),
            ("run2/checkpoints/**", "run2/cache/**", "run2/vocab.txt", "run2/subword.model"),
            put("run2/config.yaml", tiny_config("run2", max_steps=2).encode()),
            timeout=150,
            note="the user's config is <log.dir>/config.yaml",
        ),
        Case(cls, "train/log-dir-under-file", train + ["log.dir=tiny.yaml/sub"], REFUSE, ("toy", "tiny.yaml")),
        Case(
            cls, "train/log-dir-device", train + ["log.dir=null"], REFUSE, ("toy", "tiny.yaml"), setup=node("null", 3)
        ),
        Case(
            cls,
            "train/log-dir-read-only",
            train + ["log.dir=ro/run"],
            REFUSE,
            ("toy", "tiny.yaml"),
            setup=mkdir("ro", 0o555),
            drop_caps=True,
        ),
        Case(
            cls,
            "train/locked",
            train + ["train.max_steps=15"],
            REFUSE,
            needs,
            setup=locked,
            teardown=release_lock,
            timeout=60,
        ),
        Case(
            cls,
            "build_vocab/locked",
            sh("onmt_doc_build_vocab -config tiny.yaml"),
            REFUSE,
            needs,
            setup=locked,
            teardown=release_lock,
            timeout=60,
        ),
        Case(
            cls,
            "import_opennmt/locked-run-dir",
            sh("onmt_doc_import_opennmt -model onmt.pt -subword_type none -run_dir run -output m.pt"),
            REFUSE,
            ("onmt.pt", "run"),
            setup=locked,
            teardown=release_lock,
            timeout=60,
        ),
        Case(
            cls,
            "build_pmi_table/locked-learning-codec",
            sh("onmt_doc_build_pmi_table -config tiny.yaml -output t.npz"),
            REFUSE,
            ("toy", "tiny.yaml"),
            setup=steps(mkdir("run"), locked),
            teardown=release_lock,
            timeout=60,
        ),
        Case(
            cls,
            "build_vocab/changed-size-with-checkpoints",
            sh("onmt_doc_build_vocab -config tiny.yaml vocab.size=200"),
            REFUSE,
            needs,
            note="a run with checkpoints: its vocabulary is not replaced without -force",
        ),
        Case(
            cls,
            "build_vocab/changed-size-force",
            sh("onmt_doc_build_vocab -config tiny.yaml vocab.size=200 -force"),
            SUCCEED,
            needs,
            ("run/vocab.txt", "run/subword.model", "run/vocab.sha256"),
            checks=(exists("run/vocab.txt.backup-*", "no backup of the old vocabulary"),),
        ),
        Case(
            cls,
            "import_opennmt/run-dir-with-checkpoints",
            sh("onmt_doc_import_opennmt -model onmt.pt -subword_type none -run_dir run -output m.pt"),
            REFUSE,
            ("onmt.pt", "run"),
            note="-run_dir writes a vocabulary into a run whose checkpoints use another",
        ),
        Case(
            cls,
            "average/output-among-run-checkpoints",
            sh("onmt_doc_average_checkpoints -run_dir run -last 2 -output run/checkpoints/step_99.pt"),
            REFUSE,
            ("run",),
        ),
        Case(
            cls,
            "average/output-is-run-last",
            sh("onmt_doc_average_checkpoints -run_dir run -last 2 -output run/checkpoints/last.pt"),
            REFUSE,
            ("run",),
        ),
    ]


# ----------------------------------------------------------------------------- class: config

DUPLICATES = {  # kind: (the tiny config's text, its replacement with a key given twice, the key)
    "top-level": ("log: {dir: cfgrun", "train:\n  max_steps: 3\nlog: {dir: cfgrun", "train"),
    "nested": ("  d_model: 32\n", "  d_model: 32\n  d_model: 64\n", "d_model"),
    "deep": (
        "optim: {type: adam, lr: 1.0e-3}\n",
        "optim:\n  type: adam\n  schedule:\n    type: inverse_sqrt\n    warmup: 10\n    warmup: 20\n",
        "warmup",
    ),
    "list-item": (
        "  - {type: label_smoothed_ce, smoothing: 0.1}\n",
        "  - type: label_smoothed_ce\n    smoothing: 0.1\n    smoothing: 0.2\n",
        "smoothing",
    ),
    "flow-mapping": ("translate: {beam: 2}", "translate: {beam: 2, beam: 3}", "beam"),
}


def dup_pattern(key: str) -> str:
    """What a duplicate-key error must say: the key, and two line numbers (``x.yaml:7: duplicate key
    'model.d_model' (first at line 6)``)."""
    return rf"(?s)(?=.*\b{key}\b)(?=.*\d+\D+\d+)"


def dup_config(kind: str) -> bytes:
    """The tiny config with one key given twice, at the depth ``kind`` says."""
    old, new, _ = DUPLICATES[kind]
    text = tiny_config("cfgrun", max_steps=2)
    assert old in text, kind
    return text.replace(old, new, 1).encode()


def yaml_with(path: str, value: Any) -> Callable[[bytes], bytes]:
    """The tiny config with ``path`` (dotted, list indexes as numbers) set to ``value`` in the file."""

    def how(_: bytes) -> bytes:
        import yaml

        cfg = yaml.safe_load(tiny_config("cfgrun", max_steps=2))
        node: Any = cfg
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return yaml.safe_dump(cfg, sort_keys=False).encode()

    return how


def cases_config() -> list[Case]:
    """Class config: duplicate keys, out-of-range and non-finite values, absurd sizes, bad overrides."""
    cls = "config"
    base = ("toy",)
    train = sh("onmt_doc_train -config cfg.yaml")
    cases = []
    for kind, (_, _, key) in DUPLICATES.items():
        cases.append(
            Case(
                cls,
                f"train/duplicate-key-{kind}",
                train,
                REFUSE,
                base,
                ("cfgrun/**",),
                put("cfg.yaml", dup_config(kind)),
                checks=(message_has(dup_pattern(key), f"duplicate '{key}' not named with both line numbers"),),
            )
        )
    for cmd, extra in (("onmt_doc_scale_model", sh("-losses 3,2.9,2.95 -output s.yaml")),):
        cases.append(
            Case(
                cls,
                f"{cmd[9:]}/duplicate-key-nested",
                [cmd, "-config", "cfg.yaml", *extra],
                REFUSE,
                base,
                ("cfgrun/**",),
                put("cfg.yaml", dup_config("nested")),
                checks=(message_has(dup_pattern("d_model"), "duplicate 'd_model' not named with both line numbers"),),
            )
        )
    nan, inf = float("nan"), float("inf")
    for key in ("model.dropout", "model.attention_dropout", "loss.0.smoothing"):
        for label, value in (("1.0", 1.0), ("-0.1", -0.1), ("nan", nan), ("inf", inf)):
            cases.append(
                Case(
                    cls,
                    f"train/{key}={label}",
                    train,
                    REFUSE,
                    base,
                    ("cfgrun/**",),
                    derive("cfg.yaml", "toy/test.src", yaml_with(key, value)),
                    timeout=120,
                )
            )
    cases.append(
        Case(
            cls,
            "train/optim.betas=[1.0,0.98]",
            train,
            REFUSE,
            base,
            ("cfgrun/**",),
            derive("cfg.yaml", "toy/test.src", yaml_with("optim.betas", [1.0, 0.98])),
        )
    )
    overrides = [
        "optim.lr=.nan",
        "optim.lr=.inf",
        "optim.weight_decay=.inf",
        "train.max_grad_norm=.nan",
        "translate.length_penalty=.nan",
        "translate.max_len_ratio=.inf",
        "translate.temperature=.nan",
        "translate.n_best=0",
        "translate.beam=100000",
        "train.batch_tokens=0",
        "model.encoder.heads=0",
        "model.d_model=33",
        "train.max_steps",
        "=5",
        "loss.5.smoothing=0.1",
        "model.nope=1",
        "train.max_steps=[1,2",
    ]
    setup = put("cfg.yaml", tiny_config("cfgrun", max_steps=2).encode())
    for ov in overrides:
        cases.append(Case(cls, f"train/override {ov}", train + [ov], REFUSE, base, ("cfgrun/**",), setup, timeout=120))
    no_alloc = (message_lacks(ALLOCATION_FAILURE, "an allocation failure, not a config check"), rss_below())
    for ov in (
        "model.d_model=100000000",
        "model.encoder.layers=1000000",
        "model.encoder.ff=1000000000000",
        "vocab.size=1000000000000",
    ):
        cases.append(
            Case(
                cls,
                f"train/absurd {ov}",
                train + [ov],
                REFUSE,
                base,
                ("cfgrun/**",),
                setup,
                checks=no_alloc,
                timeout=120,
            )
        )
    flags = [
        ["-beam", "100000"],
        ["-n_best", "0"],
        sh("-n_best 3 -beam 2"),
        ["-length_penalty", "nan"],
        sh("-temperature inf -strategy sampling"),
        sh("-top_p nan -strategy sampling"),
        ["-max_len_ratio", "inf"],
        ["-batch_tokens", "0"],
        ["-max_length", "0"],
    ]
    for f in flags:
        cases.append(
            Case(cls, f"translate/{' '.join(f)}", TRANSLATE + f + ["-output", "out.txt"], REFUSE, ("toy", "model.pt"))
        )
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    cases += [
        Case(
            cls,
            "train/billion-laughs",
            train,
            REFUSE,
            base,
            ("cfgrun/**",),
            put("cfg.yaml", laughs.encode()),
            timeout=60,
            checks=(rss_below(),),
            note="YAML aliases expanding to 10^9 items",
        ),
        Case(
            cls,
            "train/deep-nesting",
            train,
            REFUSE,
            base,
            ("cfgrun/**",),
            put("cfg.yaml", b"train: " + b"[" * 100000 + b"]" * 100000 + b"\n"),
        ),
    ]
    return cases


# ----------------------------------------------------------------------------- class: unsafe-input

TAG = b"!!python/object/apply:os.system ['touch PWNED']"


def cases_unsafe() -> list[Case]:
    """Class unsafe-input: malicious pickles and YAML python tags must be refused, never run."""
    cls = "unsafe-input"
    evil_ck = derive("evil.pt", "model.pt", evil_zip)
    evil_raw = put("evil.pt", evil_pickle())
    tagged = put("cfg.yaml", tiny_config("cfgrun", max_steps=2).encode().replace(b"seed: 1", b"seed: " + TAG))
    marker = (no_marker(),)
    tr = sh("onmt_doc_translate -src toy/test.src -output out.txt -model evil.pt")
    return [
        Case(cls, "translate/pickle-in-zip", tr, REFUSE, ("toy", "model.pt"), setup=evil_ck, checks=marker),
        Case(cls, "translate/raw-pickle", tr, REFUSE, ("toy",), setup=evil_raw, checks=marker),
        Case(
            cls,
            "average/pickle-in-zip",
            sh("onmt_doc_average_checkpoints -models evil.pt model.pt -output a.pt"),
            REFUSE,
            ("model.pt",),
            setup=evil_ck,
            checks=marker,
        ),
        Case(
            cls,
            "release/pickle-in-zip",
            sh("onmt_doc_release -model evil.pt -output ct2"),
            REFUSE,
            ("model.pt",),
            setup=evil_ck,
            checks=marker,
        ),
        Case(
            cls,
            "resume/pickle-in-last.pt",
            sh("onmt_doc_train -config tiny.yaml train.max_steps=15"),
            REFUSE,
            ("toy", "tiny.yaml", "run"),
            setup=derive("run/checkpoints/last.pt", "last.pt", evil_zip),
            checks=marker,
            timeout=120,
        ),
        Case(
            cls,
            "server/raw-pickle",
            sh("onmt_doc_server -port 0 -model evil.pt"),
            REFUSE,
            (),
            setup=evil_raw,
            checks=marker,
            timeout=60,
            extra={"server_start": True},
        ),
        Case(
            cls,
            "import_opennmt/pickle-in-zip",
            sh("onmt_doc_import_opennmt -model evil.pt -subword_type none -output m.pt"),
            REFUSE,
            ("onmt.pt",),
            setup=derive("evil.pt", "onmt.pt", evil_zip),
            checks=marker,
        ),
        Case(
            cls,
            "gate_analysis/object-array-in-table",
            sh("onmt_doc_gate_analysis -model gates.pt -src toy/test.src -tgt toy/test.tgt -table evil_pmi.npz"),
            REFUSE,
            ("toy", "gates.pt", "evil_pmi.npz"),
            checks=marker,
        ),
        Case(
            cls,
            "train/yaml-python-tag",
            sh("onmt_doc_train -config cfg.yaml"),
            REFUSE,
            ("toy",),
            setup=tagged,
            checks=marker,
        ),
        Case(
            cls,
            "build_vocab/yaml-python-tag",
            sh("onmt_doc_build_vocab -config cfg.yaml"),
            REFUSE,
            ("toy",),
            setup=tagged,
            checks=marker,
        ),
        Case(
            cls,
            "scale_model/yaml-python-tag",
            sh("onmt_doc_scale_model -config cfg.yaml -losses 3,2.9,2.95 -output s.yaml"),
            REFUSE,
            ("toy",),
            setup=tagged,
            checks=marker,
        ),
        Case(
            cls,
            "build_pmi_table/yaml-python-tag",
            sh("onmt_doc_build_pmi_table -config cfg.yaml -output t.npz"),
            REFUSE,
            ("toy",),
            setup=tagged,
            checks=marker,
        ),
        Case(
            cls,
            "train/override-python-tag",
            ["onmt_doc_train", "-config", "cfg.yaml", "train.seed=" + TAG.decode()],
            REFUSE,
            ("toy",),
            setup=put("cfg.yaml", tiny_config("cfgrun", max_steps=2).encode()),
            checks=marker,
        ),
    ]


# ----------------------------------------------------------------------------- class: disk-full


def cases_disk_full() -> list[Case]:
    """Class disk-full: every writer into a nearly full tmpfs, over an existing output."""
    cls = "disk-full"
    old = put("full/out.dat", PRECIOUS)
    old_dir = mkdir("full/ct2", files=("user_notes.txt",))
    space = (message_has(r"space|ENOSPC", "not an ENOSPC error"),)

    def full(
        argv: list[str],
        needs: tuple[str, ...],
        free_kb: int = 0,
        before: Optional[Setup] = old,
        checks: tuple[Check, ...] = (),
        **kw: Any,
    ) -> dict:
        setup = tmpfs("full", 512, free_kb, before)
        return dict(argv=argv, needs=needs, setup=setup, teardown=unmount, checks=space + checks, **kw)

    tr = TRANSLATE + ["-output", "full/out.dat"]
    gate = sh("onmt_doc_gate_analysis -model gates.pt -src toy/test.src -tgt toy/test.tgt -table pmi.npz")
    specs = {
        "translate": full(tr, ("toy", "model.pt")),
        "translate-stdout": full(
            TRANSLATE[:5] + ["-beam", "1"],
            ("toy", "model.pt"),
            before=None,
            stdout="path:full/stdout.txt",
            checks=(same_lines("toy/test.src", "full/stdout.txt"),),
        ),
        "evaluate-json": full(
            sh("onmt_doc_evaluate -hyp hyp.txt -ref toy/test.tgt -json full/out.dat"), ("toy", "hyp.txt")
        ),
        "average": full(
            sh("onmt_doc_average_checkpoints -models step_5.pt step_10.pt -output full/out.dat"),
            ("step_5.pt", "step_10.pt"),
            64,
        ),
        "build_pmi_table": full(
            sh("onmt_doc_build_pmi_table -config tiny.yaml -output full/out.dat"), ("toy", "tiny.yaml", "run"), 16
        ),
        "gate_analysis": full(gate + ["-output", "full/out.dat"], ("toy", "gates.pt", "pmi.npz")),
        "import_opennmt": full(
            sh("onmt_doc_import_opennmt -model onmt.pt -subword_type none -force -output full/out.dat"),
            ("onmt.pt",),
            16,
        ),
        "scale_model": full(
            sh("onmt_doc_scale_model -config tiny.yaml -losses 3,2.9,2.95 -output full/out.dat"), ("toy", "tiny.yaml")
        ),
        "release-force": full(
            sh("onmt_doc_release -model model.pt -output full/ct2 -force"), ("model.pt",), 64, old_dir
        ),
        "make_toy_corpus": full(sh("onmt_doc_make_toy_corpus --train-docs 300 --out full/toy"), (), 16, None),
        "train": full(
            sh("onmt_doc_train -config tiny.yaml log.dir=full/run"), ("toy", "tiny.yaml"), 200, None, timeout=150
        ),
        "build_vocab": full(
            sh("onmt_doc_build_vocab -config tiny.yaml log.dir=full/run"), ("toy", "tiny.yaml"), 2, None
        ),
    }
    return [Case(cls, name, expect=REFUSE, **kw) for name, kw in specs.items()]


# ----------------------------------------------------------------------------- class: api

# (name, expectation, code, a regex the refusal must match or None). Names in the code: T
# (Translator), ck ("model.pt"), t() (a loaded translator, beam 2), nan, inf, shape(result, lens)
# (raises Lost when the result lost or gained sentences), bad files prepared by api_folder().
API_CASES = [
    ("load-none", REFUSE, "T.load(None)", None),
    ("load-empty-list", REFUSE, "T.load([])", None),
    ("load-missing", REFUSE, "T.load('missing.pt')", None),
    ("load-directory", REFUSE, "T.load('adir')", "director"),
    ("load-flipped", REFUSE, "T.load('flip.pt')", None),
    ("load-truncated", REFUSE, "T.load('trunc.pt')", None),
    ("load-text", REFUSE, "T.load('text.pt')", None),
    ("load-pickle", REFUSE, "T.load('evil.pt')", None),
    ("load-shapes", REFUSE, "T.load('shapes.pt')", None),
    ("load-huge-config", REFUSE, "T.load('huge.pt')", None),
    ("load-beam-0", REFUSE, "T.load(ck, beam=0)", None),
    ("load-beam-100000", REFUSE, "T.load(ck, beam=100000)", None),
    ("load-n_best-0", REFUSE, "T.load(ck, n_best=0)", None),
    ("load-n_best-over-beam", REFUSE, "T.load(ck, n_best=5, beam=2)", None),
    ("load-unknown-option", REFUSE, "T.load(ck, bean=4)", "beam"),
    ("load-length_penalty-nan", REFUSE, "T.load(ck, length_penalty=nan)", None),
    ("load-temperature-inf", REFUSE, "T.load(ck, strategy='sampling', temperature=inf)", None),
    ("load-top_p-nan", REFUSE, "T.load(ck, strategy='sampling', top_p=nan)", None),
    ("load-device-tpu", REFUSE, "T.load(ck, device='tpu')", None),
    ("load-dtype-int3", REFUSE, "T.load(ck, dtype='int3')", None),
    ("load-max_length-neg", REFUSE, "T.load(ck, max_length=-1)", None),
    ("load-batch_tokens-0", REFUSE, "T.load(ck, batch_tokens=0)", None),
    ("load-ensemble-bad-member", REFUSE, "T.load([ck, 'text.pt'])", None),
    ("translate-none", REFUSE, "t().translate(None)", None),
    ("translate-no-documents", SUCCEED, "assert t().translate([]) == []", None),
    ("translate-str", REFUSE, "t().translate('the cat sees the dog .')", None),
    ("translate-list-of-str", REFUSE, "t().translate(['the cat', 'a dog'])", None),
    ("translate-ints", REFUSE, "t().translate([[1, 2]])", None),
    ("translate-none-sentence", REFUSE, "t().translate([[None]])", None),
    ("translate-empty-sentence", REFUSE, "t().translate([['']])", None),
    ("translate-line-break", REFUSE, "t().translate([['a cat\\nsees a dog']])", None),
    ("translate-surrogate", REFUSE, "t().translate([['the cat \\ud800 sees']])", None),
    ("translate-dict", REFUSE, "t().translate({'a': ['the cat']})", None),
    ("translate-empty-document", SUCCEED, "shape(t().translate([[]]), [0])", None),
    ("translate-shape", SUCCEED, "shape(t().translate([['the cat sees', 'it sleeps'], ['a dog']]), [2, 1])", None),
    ("translate-generator", EITHER, "t().translate(d for d in [['the cat']])", None),
    ("translate-control-chars", EITHER, "shape(t().translate([['the \\x00\\x01 cat']]), [1])", None),
    ("translate-10000-words", EITHER, "shape(t().translate([[' '.join(['cat'] * 10000)]]), [1])", None),
    ("score-references-none", REFUSE, "t().score([['the cat']], None)", None),
    ("score-mismatched", REFUSE, "t().score([['the cat', 'a dog']], [['die katze']])", None),
    ("score-surrogate", REFUSE, "t().score([['the cat']], [['die \\ud800']])", None),
    ("score-shape", SUCCEED, "r = t().score([['the cat', 'a dog']], [['die katze', 'ein hund']]); shape(r, [2])", None),
]


def cases_api() -> list[Case]:
    """Class api: the Python API with wrong shapes, types, values and damaged checkpoints."""
    return [
        Case("api", name, expect=expect, runner="api", extra={"code": code, "message": msg}, note=code)
        for name, expect, code, msg in API_CASES
    ]


def api_folder(ctx_dir: Path, base: Path) -> None:
    """What the API cases read: a good checkpoint and its damaged variants."""
    data = (base / "model.pt").read_bytes()
    (ctx_dir / "model.pt").write_bytes(data)
    (ctx_dir / "flip.pt").write_bytes(flip_middle(data))
    (ctx_dir / "trunc.pt").write_bytes(data[: len(data) // 2])
    (ctx_dir / "text.pt").write_bytes(b"this is not a checkpoint\n")
    (ctx_dir / "evil.pt").write_bytes(evil_zip(data))
    for name in ("shapes.pt", "huge.pt"):
        shutil.copyfile(base / name, ctx_dir / name)
    (ctx_dir / "adir").mkdir()


API_PRELUDE = """
import math, os
from onmt_doc import Translator as T
nan, inf, ck = math.nan, math.inf, "model.pt"
class Lost(Exception):
    pass
def shape(result, lens):
    got = [len(d) for d in result]
    if got != lens:
        raise Lost(f"result has documents of {got} sentences for {lens}")
_cache = {}
def t():
    if "t" not in _cache:
        _cache["t"] = T.load(ck, device="cpu", beam=2)
    return _cache["t"]
"""


class _Alarm(BaseException):
    """Raised by SIGALRM inside an API case: the call did not end in time."""


def api_worker(spec_path: str) -> int:
    """``--api-worker SPEC``: run a batch of API cases in this process, one JSON line per case on
    stdout (a ``start`` line first, so a crash is attributed to the case that caused it)."""
    spec = json.loads(Path(spec_path).read_text())
    os.chdir(spec["dir"])
    import torch

    torch.set_num_threads(1)
    from onmt_doc.errors import UserError

    ns: dict = {}
    exec(API_PRELUDE, ns)

    def alarm(signum: int, frame: Any) -> None:
        raise _Alarm()

    signal.signal(signal.SIGALRM, alarm)
    for item in spec["cases"]:
        print(json.dumps({"start": item["id"]}), flush=True)
        before = snapshot(Path("."))
        result: dict[str, Any] = {"id": item["id"]}
        signal.alarm(int(item["timeout"]))
        try:
            exec(item["code"], dict(ns))
            result["outcome"] = "returned"
        except _Alarm:
            result["outcome"] = "stall"
        except UserError as e:
            result.update(outcome="refused", type=type(e).__name__, message=str(e))
        except BaseException as e:  # noqa: BLE001 - every other exception is what the case looks for
            kind = "lost" if type(e).__name__ == "Lost" else "exception"
            result.update(outcome=kind, type=type(e).__name__, message=str(e)[:500])
            result["traceback"] = traceback.format_exc()[-3000:]
        finally:
            signal.alarm(0)
        damage, leftovers = compare(before, snapshot(Path(".")), [])
        result.update(damage=damage, leftovers=leftovers, pwned=os.path.exists(PWNED))
        if result["pwned"]:
            os.remove(PWNED)
        print(json.dumps(result), flush=True)
    return 0


# ----------------------------------------------------------------------------- class: server


def _body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


BIG_SENTENCES = 160


def big_request(sentences: int = BIG_SENTENCES, words: int = 100) -> bytes:
    """A large but legal request (about 85,000 characters, under -max_request_chars 100000): some
    15 s of work for the toy model on one thread."""
    vocab = "the cat dog bird sees follows a small big red house boat tree".split()
    rnd = random.Random(1)
    docs = [[" ".join(rnd.choice(vocab) for _ in range(words))] for _ in range(sentences)]
    return _body({"documents": docs})


SMALL = _body({"documents": [["the cat sees the dog .", "it sees the bird ."], ["a bird follows the boat ."]]})


def _shape(lens: list[int], key: str = "translations") -> Callable[[Any], Optional[str]]:
    def check(body: Any) -> Optional[str]:
        got = [len(d) for d in body.get(key, [])] if key == "translations" else [len(body.get(key, []))]
        return None if got == lens else f"answer has {got} sentences for {lens} (data lost)"

    return check


def server_request_specs() -> list[tuple[str, str, str, Optional[bytes], list[int], dict]]:
    """(name, method, path, body, expected statuses (200: success), options) of one-request cases
    on the shared server (docs/deploy.md: 400 shape/JSON, 404 model/path, 405 method, 413 sizes)."""
    deep = b'{"documents": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    deep_obj = b'{"documents": [["x"]], "model": ' + b'{"a":' * 50000 + b"1" + b"}" * 50000 + b"}"
    many = _body({"documents": [["the cat ."] for _ in range(1001)]})
    over = _body({"documents": [["the cat ."]]})
    over = over[:-1] + b" " * (1_000_100 - len(over)) + b"}"
    return [
        ("health", "GET", "/health", None, [200], {}),
        ("models", "GET", "/models", None, [200], {"no_abs_path": True}),
        ("translate-valid", "POST", "/translate", SMALL, [200], {"check": _shape([2, 1])}),
        (
            "translate-one-document",
            "POST",
            "/translate",
            _body({"document": ["the cat .", "a dog ."]}),
            [200],
            {"check": _shape([2], "translation")},
        ),
        (
            "translate-scores-nbest",
            "POST",
            "/translate",
            _body({"document": ["the cat ."], "scores": True, "n_best": 2}),
            [200],
            {},
        ),
        ("malformed-json", "POST", "/translate", b'{"documents": [["the cat"]', [400], {}),
        ("empty-body", "POST", "/translate", b"", [400], {}),
        ("json-null", "POST", "/translate", b"null", [400], {}),
        ("nested-lists-100000", "POST", "/translate", deep, [400, 413], {}),
        ("nested-objects-50000", "POST", "/translate", deep_obj, [400, 413], {}),
        ("lone-surrogate-escape", "POST", "/translate", b'{"documents": [["the cat \\ud800 ."]]}', [400, 200], {}),
        ("invalid-utf8-body", "POST", "/translate", b'{"documents": [["the \xff\xfe cat"]]}', [400], {}),
        ("unknown-key", "POST", "/translate", _body({"documents": [["a"]], "beam": 4}), [400], {}),
        ("model-not-string", "POST", "/translate", _body({"documents": [["a"]], "model": 5}), [400], {}),
        ("model-unknown", "POST", "/translate", _body({"documents": [["a"]], "model": "de-fr"}), [404], {}),
        ("both-keys", "POST", "/translate", _body({"documents": [["a"]], "document": ["a"]}), [400], {}),
        ("documents-string", "POST", "/translate", _body({"documents": "the cat"}), [400], {}),
        ("sentence-empty", "POST", "/translate", _body({"documents": [["the cat", "  "]]}), [400], {}),
        ("sentence-line-break", "POST", "/translate", _body({"documents": [["the cat\nsees"]]}), [400], {}),
        ("n_best-over-limit", "POST", "/translate", _body({"documents": [["a"]], "n_best": 99}), [400], {}),
        ("n_best-negative", "POST", "/translate", _body({"documents": [["a"]], "n_best": -1}), [400], {}),
        ("n_best-string", "POST", "/translate", _body({"documents": [["a"]], "n_best": "2"}), [400], {}),
        ("scores-string", "POST", "/translate", _body({"documents": [["a"]], "scores": "yes"}), [400], {}),
        ("sentence-2001-chars", "POST", "/translate", _body({"documents": [["a" * 2001]]}), [413], {}),
        ("1001-sentences", "POST", "/translate", many, [413], {}),
        ("body-just-over-limit", "POST", "/translate", over, [413], {}),
        ("over-max_request_chars", "POST", "/translate", big_request(250), [413], {}),
        ("body-3MB", "POST", "/translate", b"[" + b" " * 3_000_000 + b"]", [413], {"plain_ok": True}),
        (
            "100000-empty-documents",
            "POST",
            "/translate",
            _body({"documents": [[] for _ in range(100000)]}),
            [200, 413],
            {},
        ),
        ("get-translate", "GET", "/translate", None, [405], {}),
        ("unknown-path", "GET", "/nope", None, [404], {}),
    ]


SERVER_SPECIALS = {
    "slow-client-beside-fast": "a client sends half a body and waits; another request must be answered",
    "idle-connections": "60 idle connections open (over -http_threads 32); a request must be answered",
    "large-request-alone": "a large legal request (200 sentences of 100 words) ends within 60 s",
    "large-and-small": "a small request sent while a large one runs must not wait for it",
    "disconnected-client": "a client sends a large request and disconnects: its work is cancelled",
    "shutdown-503": "SIGTERM during a large request: a new request gets 503, the large one 200, exit 0",
    "api-key": "-api_key_file: without the key 401, with Authorization: Bearer 200, /health open",
}


def cases_server() -> list[Case]:
    """Class server: bad start-ups (commands) and hostile requests on a running server."""
    cls = "server"
    srv = sh("onmt_doc_server -port 0 -threads 1 -model model.pt")
    start = {"server_start": True}
    bad_starts = [
        ("bad-host-256", ["-host", "256.1.1.1"]),
        ("bad-host-name", ["-host", "no-such-host.invalid"]),
        ("bad-host-spaces", ["-host", "exa mple"]),
        ("port-70000", ["-port", "70000"]),
        ("port-negative", ["-port", "-1"]),
        ("max_sentences-0", ["-max_sentences", "0"]),
        ("beam-100000", ["-beam", "100000"]),
        ("n_best-0", ["-n_best", "0"]),
        ("batch_wait_ms-negative", ["-batch_wait_ms", "-1"]),
        ("duplicate-model-name", sh("-model a=model.pt -model a=model.pt")),
        ("api_key-on-command-line", ["-api_key", "s3cret"]),
        ("api_key_file-missing", ["-api_key_file", "nope.key"]),
        ("api_key_file-empty", ["-api_key_file", "/dev/null"]),
        ("empty-checkpoint-name", ["-model", "x="]),
    ]
    cases = [
        Case(cls, f"start/{name}", srv + extra, REFUSE, ("model.pt",), timeout=60, extra=start)
        for name, extra in bad_starts
    ]
    cases.append(
        Case(
            cls,
            "start/port-in-use",
            srv[:2] + ["{PORT}"] + srv[3:],
            REFUSE,
            ("model.pt",),
            timeout=60,
            extra=start,
            setup=_busy_port,
            teardown=_free_port,
        )
    )
    for name, method, path, body, statuses, opts in server_request_specs():
        extra = dict(kind="request", method=method, path=path, body=body, statuses=statuses, **opts)
        cases.append(
            Case(cls, f"request/{name}", expect=SUCCEED if statuses[0] == 200 else REFUSE, runner="server", extra=extra)
        )
    for name, note in SERVER_SPECIALS.items():
        cases.append(Case(cls, f"special/{name}", expect=SUCCEED, runner="server", extra={"kind": name}, note=note))
    return cases


def _busy_port(ctx: Ctx) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    ctx.state["busy"] = s
    ctx.case.argv = [a.replace("{PORT}", str(s.getsockname()[1])) for a in ctx.case.argv]


def _free_port(ctx: Ctx) -> None:
    s = ctx.state.pop("busy", None)
    if s:
        s.close()


# ----------------------------------------------------------------------------- issue 42's classes


def unchanged(rel: str) -> Check:
    """``rel`` holds the workspace's bytes, even as the case's standard output (which the harness
    otherwise lets change): an input must survive being named as the output."""

    def fn(ctx: Ctx) -> Optional[str]:
        same = _read(ctx, rel) == (ctx.work / "base" / rel).read_bytes()
        return None if same else f"{rel}: the input changed (it was also the output)"

    return Check("damaged", fn)


def stderr_has(pattern: str, why: str) -> Check:
    """On success stderr says ``pattern`` (a warning that a damaged file was rebuilt, naming it)."""

    def fn(ctx: Ctx) -> Optional[str]:
        return None if ctx.rc != 0 or re.search(pattern, ctx.stderr) else why

    return Check("other", fn)


def repo_unchanged(rel: str) -> tuple[Setup, Check]:
    """(setup, check) that the repository's own ``rel`` (a folder) is as it was: the benchmark
    runner's cases name real folders of the repository, which the case folder's snapshot misses."""

    def tree() -> dict:  # the folder's own entries: where a run folder's run.json, results.jsonl and stages go
        folder = REPO / rel
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "" for p in folder.iterdir()}

    def setup(ctx: Ctx) -> None:
        ctx.state[rel] = tree()

    def fn(ctx: Ctx) -> Optional[str]:
        return None if tree() == ctx.state[rel] else f"the repository's {rel or '.'} changed"

    return setup, Check("damaged", fn)


def _cache_damage(how: Callable[[Path], None]) -> Setup:
    """Damage the run's mapped cache of the training corpus (the folder with the larger ids)."""

    def fn(ctx: Ctx) -> None:
        folders = sorted((ctx.dir / "run" / "cache").glob("*/src.ids"), key=lambda p: p.stat().st_size)
        how(folders[-1].parent)

    return fn


def _reseal(folder: Path, name: str, array: Any) -> None:
    """Replace a cache file by ``array`` with meta.json's CRC-32 to match: what only the bounds catch."""
    import zlib

    array.tofile(folder / name)
    meta = json.loads((folder / "meta.json").read_text())
    key = {"src.ids": "src", "tgt.ids": "tgt", "src.offsets": "src_offsets", "tgt.offsets": "tgt_offsets"}[name]
    meta["crc32"][key] = zlib.crc32((folder / name).read_bytes())
    (folder / "meta.json").write_text(json.dumps(meta))


def _npz(how: Callable[[dict], dict]) -> Callable[[bytes], bytes]:
    """A PMI table's arrays changed by ``how``, saved again (its CRC-32s valid)."""

    def fn(data: bytes) -> bytes:
        import io

        import numpy as np

        arrays = dict(np.load(io.BytesIO(data)))
        out = io.BytesIO()
        np.savez(out, **how(arrays))
        return out.getvalue()

    return fn


def _marian(name: str, how: Callable[[Path], None]) -> Setup:
    """Change the case's copy of a Marian folder; no folder (no sentencepiece/safetensors): skipped."""

    def fn(ctx: Ctx) -> None:
        if not (ctx.dir / name).is_dir():
            raise Unsupported("no Marian folder in the workspace (needs sentencepiece and safetensors)")
        how(ctx.dir / name)

    return fn


def _config(**changes: Any) -> Callable[[Path], None]:
    def fn(folder: Path) -> None:
        (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()), **changes}))

    return fn


def _record(name: str, flip: bool = False) -> Callable[[Path], None]:
    """The download record huggingface-cli leaves for ``name`` (its sha256), the file then flipped."""

    def fn(folder: Path) -> None:
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        put_in = folder / ".cache" / "huggingface" / "download"
        put_in.mkdir(parents=True)
        (put_in / f"{name}.metadata").write_text(f"{'0' * 40}\n{digest}\n1700000000.0\n")
        if flip:
            data = bytearray((folder / name).read_bytes())
            data[-9] ^= 0x20
            (folder / name).write_bytes(bytes(data))

    return fn


def _nan_weight(folder: Path) -> None:
    code = (
        "from safetensors.torch import load_file, save_file; t = load_file('model.safetensors'); "
        "k = sorted(t)[3]; t[k].view(-1)[0] = float('nan'); save_file(t, 'model.safetensors')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=folder, check=True, env=_env())


def remove(rel: str) -> Setup:
    """Remove a copied file (to put something else in its place)."""
    return lambda ctx: os.remove(ctx.dir / rel)


def _cases(cls: str, rows: list[tuple], **common: Any) -> list[Case]:
    """Cases of ``cls`` from (name, argv, expectation, needs, keywords) rows sharing ``common`` keywords."""
    return [Case(cls, name, argv, expect, needs, **{**common, **kw}) for name, argv, expect, needs, kw in rows]


def cases_stdio_files() -> list[Case]:
    """Class stdio-files: standard input or output that is one of the command's files."""
    src, tgt, tr, needs = (
        "toy/test.src",
        "toy/test.tgt",
        sh("onmt_doc_translate -model model.pt -beam 1"),
        ("toy", "model.pt"),
    )
    same = [  # name, arguments, stdin, stdout, the input that must survive
        ("stdin-is-the-output", ["-src", "-", "-output", src], f"file:{src}", "file", src),
        ("dev-stdin-is-the-output", ["-src", "/dev/stdin", "-output", src], f"file:{src}", "file", src),
        ("dev-fd-0-is-the-output", ["-src", "/dev/fd/0", "-output", src], f"file:{src}", "file", src),
        ("proc-self-fd-0-is-the-output", ["-src", "/proc/self/fd/0", "-output", src], f"file:{src}", "file", src),
        ("stdout-appended-to-src", ["-src", src], "devnull", f"append:{src}", src),
        ("dev-stdout-appended-to-src", ["-src", src, "-output", "/dev/stdout"], "devnull", f"append:{src}", src),
        ("stream-appended-to-src", ["-src", src, "-stream"], "devnull", f"append:{src}", src),
        ("stream-stdin-appended-to-itself", ["-src", "-", "-stream"], f"file:{src}", f"append:{src}", src),
        ("stdout-appended-to-tgt", ["-src", src, "-tgt", tgt], "devnull", f"append:{tgt}", tgt),
        ("stdout-appended-to-model", ["-src", src], "devnull", "append:model.pt", "model.pt"),
    ]
    rows = [
        (f"translate/{n}", tr + a, REFUSE, needs, dict(stdin=i, stdout=o, checks=(unchanged(k),)))
        for n, a, i, o, k in same
    ]
    rows += [
        ("evaluate/json-stdout-appended-to-hyp", sh("onmt_doc_evaluate -hyp hyp.txt -ref toy/test.tgt -json -"), REFUSE,
         ("toy", "hyp.txt"), dict(stdout="append:hyp.txt", checks=(unchanged("hyp.txt"),))),
        ("translate/stdin-from-another-file", tr + ["-src", "-", "-output", "out.txt"], SUCCEED, needs,
         dict(outputs=("out.txt",), stdin=f"file:{src}", checks=(same_lines(src, "out.txt"),))),
        ("translate/stdout-appended-to-a-log", tr + ["-src", src], SUCCEED, needs,
         dict(setup=put("log.txt", PRECIOUS), stdout="append:log.txt", checks=(starts_with("log.txt", PRECIOUS),))),
    ]  # fmt: skip
    return _cases("stdio-files", rows, timeout=60)


def _swap_lines(data: bytes, a: int = 10) -> bytes:
    """Lines ``a`` and ``a + 1`` swapped: same size, other ids for two tokens."""
    lines = data.split(b"\n")
    lines[a], lines[a + 1] = lines[a + 1], lines[a]
    return b"\n".join(lines)


def _pmi_damage(how: Callable[[dict], dict]) -> dict:
    return dict(setup=derive("bad.npz", "pmi.npz", _npz(how)))


def _flip_bin(folder: Path) -> None:
    (folder / "pytorch_model.bin").write_bytes(flip_middle((folder / "pytorch_model.bin").read_bytes()))


def _evil_bin(folder: Path) -> None:
    (folder / "pytorch_model.bin").write_bytes(evil_zip((folder / "pytorch_model.bin").read_bytes()))


def cases_readers_verify() -> list[Case]:
    """Class readers-verify: damaged files that pass for intact (a same-size overwrite, a flipped
    byte, values outside the file's bounds with valid checksums): rebuilt or refused, never used."""
    import numpy as np

    train, run = sh("onmt_doc_train -config tiny.yaml train.max_steps=12"), ("toy", "tiny.yaml", "run")
    rebuilt = stderr_has(
        r"(ids|offsets|meta\.json): binarized cache not as written", "the rebuild not said, no file named"
    )
    caches = {
        "ids-overwritten-same-size": lambda f: (f / "src.ids").write_bytes(bytes((f / "src.ids").stat().st_size)),
        "ids-one-byte-flipped": lambda f: (f / "tgt.ids").write_bytes(b"\x05" + (f / "tgt.ids").read_bytes()[1:]),
        "ids-outside-vocab-resealed": lambda f: _reseal(f, "src.ids", np.fromfile(f / "src.ids", "<i4") + 10**6),
        "offsets-reversed-resealed": lambda f: _reseal(f, "tgt.offsets", np.fromfile(f / "tgt.offsets", "<i8")[::-1]),
        "meta-nested-deep": lambda f: (f / "meta.json").write_text("[" * 100_000),
        "meta-is-dev-zero": lambda f: ((f / "meta.json").unlink(), (f / "meta.json").symlink_to("/dev/zero")),
        "doc-offsets-a-folder": lambda f: ((f / "doc.offsets").unlink(), (f / "doc.offsets").mkdir()),
    }
    resumed = dict(outputs=("run/checkpoints/**", "run/config.yaml"), replaced=("run/cache/**",), checks=(rebuilt,))
    rows = [(f"cache/{n}", train, SUCCEED, run, dict(setup=_cache_damage(how), **resumed)) for n, how in caches.items()]
    gate, pmi = (
        sh("onmt_doc_gate_analysis -model gates.pt -src toy/test.src -tgt toy/test.tgt -table bad.npz"),
        ("toy", "gates.pt", "pmi.npz"),
    )
    imp, bin_imp = (
        sh("onmt_doc_import_marian -model marian -output m.pt"),
        sh("onmt_doc_import_marian -model marian_bin"),
    )
    bin_imp += ["-output", "m.pt"]
    vocab, sw = "run/vocab.txt", "run/subword.model"
    rec, rec_flipped = _record("model.safetensors"), _record("model.safetensors", flip=True)
    m_pt = ("m.pt",)
    rows += [
        ("vocab/two-tokens-swapped", train, REFUSE, run, dict(setup=derive(vocab, vocab, _swap_lines),
         checks=(message_has("changed since it was written", "a changed vocabulary not named"),))),
        ("vocab/subword-model-appended", train, REFUSE, run, dict(setup=derive(sw, sw, lambda d: d + b"x\n"))),
        ("pmi/keys-unsorted", gate, REFUSE, pmi, _pmi_damage(lambda a: {**a, "bi_keys": a["bi_keys"][::-1].copy()})),
        ("pmi/keys-outside", gate, REFUSE, pmi, _pmi_damage(lambda a: {**a, "mono_keys": a["mono_keys"] + 10**9})),
        ("pmi/negative-counts", gate, REFUSE, pmi, _pmi_damage(lambda a: {**a, "src_counts": -a["src_counts"]})),
        ("marian/intact", imp, SUCCEED, ("marian",), dict(outputs=("m.pt",), setup=_marian("marian", lambda f: None))),
        ("marian/download-record-matches", imp, SUCCEED, ("marian",), dict(outputs=m_pt, setup=_marian("marian", rec),
         checks=(stderr_has("matching their download's sha256", "a checked download not said"),))),
        ("marian/byte-flipped-under-a-record", imp, REFUSE, ("marian",), dict(setup=_marian("marian", rec_flipped),
         checks=(message_has("sha256 differs", "the damaged weights not named"),))),
        ("marian/nan-weight", imp, REFUSE, ("marian",), dict(setup=_marian("marian", _nan_weight))),
        ("marian/pytorch-model-bin-flipped", bin_imp, REFUSE, ("marian_bin",),
         dict(setup=_marian("marian_bin", _flip_bin),
         checks=(message_has("CRC", "no CRC named"),))),
        ("opennmt/nan-weight", sh("onmt_doc_import_opennmt -subword_type none -output m.pt -model onmt_nan.pt"), REFUSE,
         ("onmt_nan.pt",), dict(checks=(message_has("NaN", "NaN weights not named"),))),
    ]  # fmt: skip
    return _cases("readers-verify", rows, timeout=150)


SPEC = (
    b"title: t\nsection: Hostile\ndevice: cpu\nbudget_seconds: 120\nstages:\n  - name: env\n    type: environment\n"
    b"    budget_seconds: 60\n    params: {packages: [json], matmul_size: 16, matmul_dtypes: [float32], repeats: 1}\n"
)


def cases_bench_out() -> list[Case]:
    """Class bench-out: where ``python -m benchmarks run`` may write (benchmarks/README.md); the
    repository's own folders are the real ones, checked before and after."""
    run = ["python", "-m", "benchmarks", "run", "s.yaml", "--out"]
    rows = []
    for rel in ("docs", "benchmarks/specs", "benchmarks/results/gpu", ""):
        setup, check = repo_unchanged(rel)
        kw = dict(setup=steps(put("s.yaml", SPEC), setup), checks=(check,))
        rows.append((f"repository-{rel.replace('/', '-') or 'root'}", run + [str(REPO / rel)], REFUSE, (), kw))
    spec, memory, new = put("s.yaml", SPEC), (rss_below(),), ("new/**", "empty/**")
    rows += [
        ("users-run-json", run + ["mine"], REFUSE, (), dict(setup=steps(spec, put("mine/run.json", PRECIOUS)))),
        ("the-case-folder", run + ["."], REFUSE, (), dict(setup=spec)),
        ("a-file", run + ["s.yaml"], REFUSE, (), dict(setup=spec)),
        ("a-home-like-folder", run + ["home"], REFUSE, (), dict(setup=steps(spec, mkdir("home", files=("cv.tex",))))),
        ("several-specs-into-a-users-folder", run[:5] + ["s.yaml", "--out", "mine"], REFUSE, (),
         dict(setup=steps(spec, put("mine/notes.txt", PRECIOUS)))),
        ("a-new-folder", run + ["new"], SUCCEED, (), dict(setup=spec, outputs=new)),
        ("an-empty-folder", run + ["empty"], SUCCEED, (), dict(setup=steps(spec, mkdir("empty")), outputs=new)),
        ("spec-nested-deep", run + ["new"], REFUSE, (), dict(setup=put("s.yaml", b"[" * 100_000))),
        ("spec-is-dev-zero", run + ["new"], REFUSE, (), dict(setup=symlink("s.yaml", "/dev/zero"), checks=memory)),
    ]  # fmt: skip
    return _cases("bench-out", rows, extra={"env": {"PYTHONPATH": str(REPO)}}, timeout=90)


def cases_bounds() -> list[Case]:
    """Class bounds: numbers without a bound, files read without one, values of the wrong type."""
    big, needs, tiny = str(10**6), ("toy", "model.pt"), ("toy", "tiny.yaml")
    rows = [
        ("translate/threads", sh("onmt_doc_translate -model model.pt -src toy/test.src -threads") + [big], REFUSE,
         needs, {}),
        ("evaluate/threads", sh("onmt_doc_evaluate -model model.pt -suite toy/test.contrastive.json -threads") + [big],
         REFUSE, needs, {}),
        ("train/data.workers", sh(f"onmt_doc_train -config tiny.yaml log.dir=run2 data.workers={big}"), REFUSE, tiny,
         dict(checks=(message_has("data.workers", "not named"),))),
        ("build_vocab/data.workers", sh(f"onmt_doc_build_vocab -config tiny.yaml log.dir=run2 data.workers={big}"),
         REFUSE, tiny, {}),
        ("train/train.threads", sh(f"onmt_doc_train -config tiny.yaml train.threads={big} train.max_steps=12"),
         REFUSE, (*tiny, "run"), {}),
    ]  # fmt: skip
    srv, start = (
        sh("onmt_doc_server -port 0 -model model.pt"),
        dict(extra={"server_start": True}, checks=(rss_below(),)),
    )
    for flag, value in (("-threads", big), ("-http_threads", big), ("-batch_wait_ms", "1e12"),
                        ("-shutdown_grace", "1e12"), ("-max_request_bytes", str(10**13)), ("-batch_tokens", str(10**9)),
                        ("-max_sentences", str(10**15)), ("-api_key_file", "/dev/zero")):  # fmt: skip
        rows.append((f"server/{flag[1:]}-{value[:8]}", srv + [flag, value], REFUSE, ("model.pt",), start))
    imp = sh("onmt_doc_import_marian -model marian -output m.pt")
    for name, how in (
        ("scale_embedding-string", _config(scale_embedding="false")),
        ("tie_word_embeddings-number", _config(tie_word_embeddings=1)),
        ("max_position_embeddings-0", _config(max_position_embeddings=0)),
        ("activation_function-list", _config(activation_function=["swish"])),
        ("d_model-float", _config(d_model=16.0)),
        ("config-nested-deep", lambda f: (f / "config.json").write_text("[" * 100_000 + "]" * 100_000)),
        ("vocab-nested-deep", lambda f: (f / "vocab.json").write_text('{"a": ' + "[" * 5000 + "]" * 5000 + "}")),
        ("config-is-dev-zero", lambda f: ((f / "config.json").unlink(), (f / "config.json").symlink_to("/dev/zero"))),
    ):
        rows.append(
            (f"marian/{name}", imp, REFUSE, ("marian",), dict(setup=_marian("marian", how), checks=(rss_below(),)))
        )
    for name, expect, code in (
        ("stream-a-str", REFUSE, "list(t().translate_stream('the cat sees the dog .'))"),
        ("stream-none-line", REFUSE, "list(t().translate_stream(['the cat .', None]))"),
        ("stream-line-break", REFUSE, "list(t().translate_stream(['the cat\\nsees the dog .']))"),
        ("stream-surrogate", REFUSE, "list(t().translate_stream(['the cat \\ud800 .']))"),
        ("stream-lines", SUCCEED, "assert len(list(t().translate_stream(['the cat .', '', 'a dog .']))) == 3"),
    ):
        rows.append(
            (f"api/{name}", [], expect, (), dict(runner="api", extra={"code": code, "message": None}, note=code))
        )
    return _cases("bounds", rows, timeout=120)


LEXICAL_CHOICE = json.dumps({"1": {"inspired by": ["a .", "b ."], "type": "repet", "examples": [  # Bawden et al.'s
    {"src": ["the cat sees the dog .", "it sees the bird ."], "trg": {
        "correct": ["die katze sieht den hund .", "sie sieht den vogel ."],
        "incorrect": ["die katze sieht den hund .", "er sieht den vogel ."]}}]}}).encode()  # fmt: skip


def cases_messages() -> list[Case]:
    """Class messages: refusals that name the real cause, and inputs that only looked like mistakes."""
    srv, start = sh("onmt_doc_server -port 0 -model"), {"extra": {"server_start": True}, "timeout": 60}
    folder = (message_has("director", "a folder reported as something else"),)
    no_code = (
        message_has("runs no code", "not said that nothing ran"),
        message_lacks("weights_only", "torch's advice"),
        no_marker(),
    )
    imp = sh("onmt_doc_import_marian -model marian -output m.pt")
    tr, vocab, why = sh("onmt_doc_translate -src toy/test.src -model"), "run/vocab.txt", "not the plugin's doing"
    rows = [
        ("server/model-is-a-folder", srv + ["adir"], REFUSE, (), dict(setup=mkdir("adir"), checks=folder, **start)),
        ("server/api-key-file-is-a-folder", srv + ["model.pt", "-api_key_file", "adir"], REFUSE, ("model.pt",),
         dict(setup=mkdir("adir"), checks=folder, **start)),
        ("server/checkpoint-named-with-equals", srv + ["lr=0.1.pt"], SUCCEED, (),
         dict(setup=copy("lr=0.1.pt", "model.pt"), **start)),
        ("marian/config-is-a-folder", imp, REFUSE, ("marian",), dict(checks=folder,
         setup=_marian("marian", lambda f: ((f / "config.json").unlink(), (f / "config.json").mkdir())))),
        ("marian/folder-is-a-file", sh("onmt_doc_import_marian -model model.pt -output m.pt"), REFUSE, ("model.pt",),
         dict(checks=(message_has("is a file, not a folder", "a file reported as something else"),))),
        ("train/vocab-is-a-folder", sh("onmt_doc_train -config tiny.yaml train.max_steps=12"), REFUSE,
         ("toy", "tiny.yaml", "run"), dict(setup=steps(remove(vocab), mkdir(vocab)), checks=folder)),
        ("translate/pickle-refusal", tr + ["evil.pt"], REFUSE, ("toy",),
         dict(setup=derive("evil.pt", "model.pt", evil_zip), checks=no_code)),
        ("marian/pickle-refusal", sh("onmt_doc_import_marian -model marian_bin -output m.pt"), REFUSE, ("marian_bin",),
         dict(setup=_marian("marian_bin", _evil_bin), checks=no_code)),
        ("translate/plugin-exits", tr + ["model.pt", "-user_dir", "exits.py"], REFUSE, ("toy", "model.pt"),
         dict(setup=put("exits.py", b"import sys\nsys.exit(3)\n"), checks=(message_has("plugin called exit", why),))),
        ("evaluate/bawden-lexical-choice-detected", sh("onmt_doc_evaluate -model model.pt -suite lexical-choice.json"),
         SUCCEED, ("model.pt",), dict(setup=put("lexical-choice.json", LEXICAL_CHOICE))),
    ]  # fmt: skip
    return _cases("messages", rows, timeout=120)


# ----------------------------------------------------------------------------- running a command case


def _copy_needs(needs: Iterable[str], base: Path, dest: Path) -> None:
    """Fresh copies (never links) of the workspace entries a case may touch."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel in needs:
        src, dst = base / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst)


class _Stdio:
    """The standard streams a case asks for, the threads that feed or drain them, and how a user
    would have written them in a shell (for the report)."""

    def __init__(self, ctx: Ctx):
        self.ctx, self.threads, self.stop = ctx, [], threading.Event()
        self.close_fds: list[int] = []
        self.files: list[Any] = []
        self.closes: list[str] = []
        self.shell = ""
        self.stdin = self._stdin(ctx.case.stdin)
        self.stdout = self._stdout(ctx.case.stdout)

    def _stdin(self, how: str) -> Any:
        if how == "devnull":
            return subprocess.DEVNULL
        if how == "closed":
            self.closes.append("0<&-")
            self.shell += " <&-"
            return subprocess.DEVNULL
        if how == "zero":
            self.shell += " < /dev/zero"
            return self._open("/dev/zero", "rb")
        if how == "endless":
            r, w = os.pipe()
            self.close_fds.append(r)
            self.threads.append(threading.Thread(target=self._endless, args=(w,), daemon=True))
            self.shell = " (an endless line without a line break) |" + self.shell
            return r
        if how.startswith("file:"):
            self.shell += f" < {how[5:]}"
            return self._open(self.ctx.dir / how[5:], "rb")
        raise ValueError(how)

    def _stdout(self, how: str) -> Any:
        if how == "file":
            return self._open(self.ctx.capture, "wb")
        if how == "devfull":
            self.shell += " > /dev/full"
            return self._open("/dev/full", "wb")
        if how == "closed":
            self.closes.append("1>&-")
            self.shell += " >&-"
            return subprocess.DEVNULL
        if how == "broken_pipe":
            r, w = os.pipe()
            os.close(r)
            self.close_fds.append(w)
            self.shell += " | (a reader that has exited)"
            return w
        if how == "pipe":
            r, w = os.pipe()
            self.close_fds.append(w)
            self.threads.append(threading.Thread(target=self._drain, args=(r,), daemon=True))
            self.shell += " | cat"
            return w
        if how.startswith("append:"):
            self.shell += f" >> {how[7:]}"
            return self._open(self.ctx.dir / how[7:], "ab")
        if how.startswith("path:"):
            self.shell += f" > {how[5:]}"
            return self._open(self.ctx.dir / how[5:], "wb")
        raise ValueError(how)

    def _open(self, path: Any, mode: str) -> Any:
        f = open(path, mode)
        self.files.append(f)
        return f

    def _endless(self, w: int) -> None:
        chunk = b"x" * 65536
        with contextlib.suppress(OSError):
            while not self.stop.is_set():
                os.write(w, chunk)
        os.close(w)

    def _drain(self, r: int) -> None:
        with open(self.ctx.capture, "wb") as out:
            while True:
                data = os.read(r, 65536)
                if not data:
                    break
                out.write(data)
        os.close(r)

    def wrapper(self) -> list[str]:
        """``bash -c 'exec 0<&-; exec "$@"'`` when a stream must be closed (not /dev/null)."""
        if not self.closes:
            return []
        return ["bash", "-c", f'exec {" ".join(self.closes)}; exec "$@"', "hostile"]

    def started(self) -> None:
        """After the fork: close our copies of the child's pipe ends, start the helpers."""
        for fd in self.close_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        """After the exit: stop the writers, let the readers reach end of file, close files."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        for f in self.files:
            f.close()


class _FifoReader:
    """Reads a FIFO (non-blocking, opened before the command) until the command has ended."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.chunks: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                data = None
            if data:
                self.chunks.append(data)
                continue
            if self.stop.is_set():
                break
            time.sleep(0.02)

    def close(self) -> bytes:
        """Stop reading (after a last drain) and return what came through."""
        self.stop.set()
        self.thread.join(timeout=10)
        os.close(self.fd)
        return b"".join(self.chunks)


def _wait(proc: subprocess.Popen, timeout: float, err_path: Path, serving_stops: bool) -> tuple[int, float, bool, bool]:
    """(exit status, peak RSS in MB, timed out, started serving) of ``proc``, reaped with wait4
    for its own rusage; a server case that starts serving is stopped at once (it accepted)."""
    deadline = time.monotonic() + timeout
    serving = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss / 1024, False, serving
        if serving_stops and not serving and b": serving " in err_path.read_bytes():
            serving = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = min(deadline, time.monotonic() + 40)
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss / 1024, not serving, serving
        time.sleep(0.05)


def restore_devices(before: dict, after: dict, specials: Iterable[str]) -> None:
    """Put back a machine device node (/dev/full, /dev/null) that a command replaced: the damage is
    reported, but the other users of the machine must not keep it."""
    for path in specials:
        old, new = before.get(path, {}), after.get(path, {})
        if old.get("kind") == "char" and new != old:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            os.mknod(path, old["mode"] | stat.S_IFCHR, old["rdev"])
            os.chmod(path, old["mode"])
            log(f"restored the device node {path}")


def display_command(case: Case, io: Optional[_Stdio] = None) -> str:
    """The case as a user would type it in the case folder (setup described by its note)."""
    argv = [a.replace("{CASE}", "$CASE") for a in case.argv]
    text = ("setpriv --bounding-set=-dac_override,-dac_read_search " if case.drop_caps else "") + shlex.join(argv)
    shell = io.shell if io else ""
    if shell.startswith(" (an endless"):
        return shell.strip() + " " + text
    return text + shell


def run_command_case(case: Case, work: Path, base: Path, case_dir: Path) -> dict:
    """Run one command case in a fresh folder and judge it (module docstring)."""
    ctx = Ctx(case, case_dir, work, case_dir.parent / f"{case_dir.name}.stdout")
    _copy_needs(case.needs, base, case_dir)
    try:
        try:
            if case.setup:
                case.setup(ctx)
        except Unsupported as e:
            return {**_record_head(case, display_command(case)), "skipped": str(e)}
        io = _Stdio(ctx)
        volatile = [case.stdout.split(":", 1)[1]] if case.stdout.startswith(("append:", "path:")) else []
        before = snapshot(case_dir, case.specials)
        fifo = _FifoReader(case_dir / case.fifo) if case.fifo else None
        argv = [console(case.argv[0])] + [a.replace("{CASE}", str(case_dir)) for a in case.argv[1:]]
        cmd = ["prlimit", f"--as={AS_LIMIT}"] + (DROP_CAPS if case.drop_caps else []) + io.wrapper() + argv
        err_path = case_dir.parent / f"{case_dir.name}.stderr"
        start = time.monotonic()
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                cmd,
                cwd=case_dir,
                stdin=io.stdin,
                stdout=io.stdout,
                stderr=err,
                env={**_env(), **case.extra.get("env", {})},
                start_new_session=True,
            )
            io.started()
            rc, rss, timed_out, serving = _wait(proc, case.timeout, err_path, case.extra.get("server_start", False))
        seconds = time.monotonic() - start
        io.finish()
        ctx.fifo_data = fifo.close() if fifo else b""
        ctx.rc, ctx.maxrss_mb = (0 if serving else rc), rss
        ctx.stderr = err_path.read_text(encoding="utf-8", errors="replace")
        after = snapshot(case_dir, case.specials)
        restore_devices(before, after, case.specials)
        done = ctx.rc == 0
        damage, leftovers = compare(
            before, after, list(case.outputs if done else ()) + volatile, case.replaced if done else ()
        )
        flags, problems = judge(case.expect, ctx.rc, ctx.stderr, timed_out)
        record = _finish(case, ctx, flags, problems, damage, leftovers)
        record.update(command=display_command(case, io), rc=rc, seconds=round(seconds, 1), maxrss_mb=round(rss))
        if serving:
            record["problems"].append("the server started serving (accepted the invalid start-up)")
        elif timed_out:
            record["problems"].insert(0, f"still running after {case.timeout:.0f} s (killed)")
        if flags["accepted_invalid"] and not serving:
            record["problems"].insert(0, "exit status 0 where a refusal is expected")
        return record
    finally:
        if case.teardown:
            case.teardown(ctx)
        if "mounts" in ctx.state and not case.teardown:
            unmount(ctx)


def _record_head(case: Case, command: str) -> dict:
    return {"class": case.cls, "name": case.name, "command": command, "note": case.note, "expect": case.expect}


def _finish(case: Case, ctx: Ctx, flags: dict, problems: list[str], damage: list[str], leftovers: list[str]) -> dict:
    """Apply the case's extra checks and leftovers to the flags; the JSON record of the case."""
    for check in case.checks:
        try:
            problem = check.fn(ctx)
        except Exception as e:  # a check that cannot run is reported, not fatal to the review
            problem = f"check failed to run: {type(e).__name__}: {e}"
        if problem:
            (damage if check.kind == "damaged" else problems).append(problem)
    if leftovers:
        problems.append(f"temporary files left behind: {', '.join(leftovers[:3])}")
    flags["damaged"] = flags["damaged"] or bool(damage)
    flags["other"] = flags["other"] or bool(problems) and not flags["accepted_invalid"]
    record = _record_head(case, display_command(case))
    record.update(
        flags=flags,
        behaved=not any(flags.values()),
        damage=damage,
        problems=problems,
        traceback=traceback_tail(ctx.stderr) if flags["traceback"] else "",
        stderr_tail=ctx.stderr.strip().splitlines()[-4:],
    )
    return record


# ----------------------------------------------------------------------------- running API cases

API_TIMEOUT = 60


def judge_api(case: Case, result: Optional[dict], crashed: str = "") -> dict:
    """The record of one API case from the worker's JSON line (None: the worker died in it)."""
    flags = dict.fromkeys(COLUMNS, False)
    problems: list[str] = []
    damage: list[str] = []
    tb = ""
    if result is None:
        flags["traceback" if crashed != "stall" else "stall"] = True
        tb = crashed
    else:
        outcome = result["outcome"]
        damage = list(result.get("damage", []))
        if result.get("pwned"):
            damage.append("the malicious payload ran (PWNED created)")
        if result.get("leftovers"):
            problems.append(f"temporary files left behind: {', '.join(result['leftovers'][:3])}")
        if outcome == "stall":
            flags["stall"] = True
        elif outcome == "exception":
            flags["traceback"] = True
            tb = f"{result['type']}: {result['message']}".splitlines()[0][:300]
        elif outcome == "lost":
            damage.append(result["message"])
        elif outcome == "returned" and case.expect == REFUSE:
            flags["accepted_invalid"] = True
        elif outcome == "refused":
            message = result.get("message", "")
            if case.expect == SUCCEED:
                problems.append(f"valid call refused: {message[:200]}")
            elif len(message.strip().splitlines()) != 1:
                problems.append(f"the error is {len(message.strip().splitlines())} lines, not one")
            elif case.extra.get("message") and not re.search(case.extra["message"], message, re.I):
                problems.append(f"the error does not say {case.extra['message']!r}: {message[:200]!r}")
    flags["damaged"] = bool(damage)
    flags["other"] = bool(problems)
    record = _record_head(case, f"python -c 'from onmt_doc import Translator as T; {case.extra['code']}'")
    record.update(
        flags=flags,
        behaved=not any(flags.values()),
        damage=damage,
        problems=problems,
        traceback=tb,
        stderr_tail=[(result or {}).get("message", "")[:300]],
    )
    return record


def run_api_batch(cases: list[Case], work: Path, base: Path, batch_dir: Path) -> list[dict]:
    """Run API cases in as few Python processes as possible: a crash ends a process, the cases
    after it run in the next one."""
    records: list[dict] = []
    todo = list(cases)
    while todo:
        shutil.rmtree(batch_dir, ignore_errors=True)
        batch_dir.mkdir(parents=True)
        api_folder(batch_dir, base)
        spec = {
            "dir": str(batch_dir),
            "cases": [{"id": c.ident, "code": c.extra["code"], "timeout": API_TIMEOUT} for c in todo],
        }
        spec_path = batch_dir.parent / f"{batch_dir.name}.json"
        spec_path.write_text(json.dumps(spec))
        out_path, err_path = batch_dir.parent / f"{batch_dir.name}.out", batch_dir.parent / f"{batch_dir.name}.err"
        cmd = [
            "prlimit",
            f"--as={AS_LIMIT}",
            sys.executable,
            str(Path(__file__).resolve()),
            "--api-worker",
            str(spec_path),
        ]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=batch_dir, stdout=out, stderr=err, env=_env(), start_new_session=True)
            rc, _, timed_out, _ = _wait(proc, API_TIMEOUT * len(todo) + 90, err_path, False)
        results, started = {}, None
        for line in out_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if "start" in item:
                    started = item["start"]
                else:
                    results[item["id"]] = item
        by_id = {c.ident: c for c in todo}
        done = [c for c in todo if c.ident in results]
        records += [judge_api(c, results[c.ident]) for c in done]
        rest = [c for c in todo if c.ident not in results]
        if rest and started in by_id and started not in results:
            why = (
                "stall"
                if timed_out
                else f"the Python process died (exit {rc}): " + traceback_tail(err_path.read_text(errors="replace"))
            )
            records.append(judge_api(by_id[started], None, why))
            rest = [c for c in rest if c.ident != started]
        elif rest and not done:  # the worker could not start at all
            why = f"the API worker failed before any case (exit {rc}): " + traceback_tail(
                err_path.read_text(errors="replace")
            )
            records += [judge_api(c, None, why) for c in rest]
            rest = []
        todo = rest
    return records


# ----------------------------------------------------------------------------- running server cases

HTTP_TIMEOUT = 60.0


def http_call(
    port: int,
    method: str,
    path: str,
    body: Optional[bytes] = None,
    headers: Optional[dict] = None,
    timeout: float = HTTP_TIMEOUT,
) -> dict:
    """One HTTP request; the status, body and seconds, or the error (``timeout``, a reset ...)."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return {
            "status": resp.status,
            "body": data,
            "type": resp.getheader("Content-Type", ""),
            "seconds": time.monotonic() - start,
        }
    except (socket.timeout, TimeoutError):
        return {"error": "timeout", "seconds": time.monotonic() - start}
    except (OSError, http.client.HTTPException) as e:
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - start}
    finally:
        conn.close()


def judge_http(
    case: Case,
    r: dict,
    statuses: list[int],
    check: Optional[Callable[[Any], Optional[str]]] = None,
    plain_ok: bool = False,
) -> tuple[dict, list[str], list[str]]:
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
        body = json.loads(r["body"])
    except ValueError:
        body = None
        if not (plain_ok and status == 413):
            problems.append(f"the answer is not JSON: {r['body'][:100]!r}")
    if status != 200 and isinstance(body, dict):
        error = str(body.get("error", ""))
        if not error or len(error.splitlines()) != 1:
            problems.append(f"the error is not one line: {error[:150]!r}")
    if status == 200 and check and isinstance(body, dict):
        lost = check(body)
        if lost:
            damage.append(lost)
    flags["other"] = bool(problems)
    flags["damaged"] = bool(damage)
    return flags, problems, damage


class ServerSession:
    """The shared server of the request cases (started with an absolute -model path) and the
    dedicated servers of the shutdown and API-key cases."""

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
        model = str((folder / "model.pt").resolve())
        argv = [
            console("onmt_doc_server"),
            "-model",
            model,
            "-port",
            "0",
            "-threads",
            "1",
            "-beam",
            "2",
            "-n_best",
            "2",
        ]
        log_f = open(log_path, "wb")
        proc = subprocess.Popen(
            argv + extra, cwd=folder, stdout=log_f, stderr=log_f, env=_env(), start_new_session=True
        )
        log_f.close()
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

    def log_size(self) -> int:
        """Bytes of the shared server's log so far (to attribute later lines to a case)."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        """The shared server's log after ``offset``."""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def run(self, case: Case) -> dict:
        """One server case: the flags of its answer(s), and any traceback the server logged."""
        why = self.ensure()
        record = _record_head(case, _http_display(case))
        if why:
            flags = dict.fromkeys(COLUMNS, False)
            flags["traceback" if "Traceback" in why else "other"] = True
            record.update(
                flags=flags,
                behaved=False,
                damage=[],
                problems=[f"the server did not start: {why}"],
                traceback=traceback_tail(why),
            )
            return record
        offset = self.log_size()
        start = time.monotonic()
        kind = case.extra["kind"]
        if kind == "request":
            flags, problems, damage = self.request_case(case)
        else:
            flags, problems, damage = getattr(self, "special_" + kind.replace("-", "_"))(case)
        time.sleep(0.3)
        logged = self.log_since(offset)
        if "Traceback (most recent call last)" in logged:
            flags["traceback"] = True
        if self.proc is not None and self.proc.poll() is not None:
            flags["traceback"] = True
            problems.append(f"the server died (exit {self.proc.returncode})")
        record.update(
            flags=flags,
            behaved=not any(flags.values()),
            damage=damage,
            problems=problems,
            traceback=traceback_tail(logged) if "Traceback" in logged else "",
            seconds=round(time.monotonic() - start, 1),
        )
        return record

    def request_case(self, case: Case) -> tuple[dict, list[str], list[str]]:
        """A single request against the documented statuses."""
        e = case.extra
        r = http_call(self.port, e["method"], e["path"], e["body"])
        flags, problems, damage = judge_http(case, r, e["statuses"], e.get("check"), e.get("plain_ok", False))
        if e.get("no_abs_path") and r.get("status") == 200 and str(self.work.resolve()).encode() in r["body"]:
            problems.append("GET /models reveals the absolute checkpoint path")
            flags["other"] = True
        return flags, problems, damage

    def _small_within(self, label: str, bound: float) -> tuple[dict, list[str], list[str]]:
        r = http_call(self.port, "POST", "/translate", SMALL)
        flags, problems, damage = judge_http(Case("server", label), r, [200], _shape([2, 1]))
        if not flags["stall"] and r["seconds"] > bound:
            flags["stall"] = True
            problems.append(f"a small request took {r['seconds']:.1f} s ({label}); bound {bound:.1f} s")
        return flags, problems, damage

    def special_slow_client_beside_fast(self, case: Case) -> tuple[dict, list[str], list[str]]:
        """A client that sends half a request and waits must not hold the others up."""
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"documents'
        )
        try:
            return self._small_within("beside a slow client", 10)
        finally:
            s.close()

    def special_idle_connections(self, case: Case) -> tuple[dict, list[str], list[str]]:
        """More idle connections than -http_threads must not starve a real request."""
        socks = [socket.create_connection(("127.0.0.1", self.port)) for _ in range(60)]
        try:
            return self._small_within("beside 60 idle connections", 10)
        finally:
            for s in socks:
                s.close()

    def special_large_request_alone(self, case: Case) -> tuple[dict, list[str], list[str]]:
        """The large request of the next cases, alone: it must end within 60 s; its time is the yardstick."""
        r = http_call(self.port, "POST", "/translate", big_request())
        self.big_s = r["seconds"]
        return judge_http(case, r, [200], _shape([1] * BIG_SENTENCES))

    def _bound(self) -> float:
        return max(5.0, 0.3 * (self.big_s or 20.0))

    def special_large_and_small(self, case: Case) -> tuple[dict, list[str], list[str]]:
        """A small request sent while a large one runs must not wait for the large one."""
        big: dict = {}
        t = threading.Thread(target=lambda: big.update(http_call(self.port, "POST", "/translate", big_request())))
        t.start()
        time.sleep(1.0)
        flags, problems, damage = self._small_within(
            f"while a large request ran ({self.big_s or 0:.1f} s alone)", self._bound()
        )
        t.join()
        bflags, bproblems, bdamage = judge_http(case, big, [200], _shape([1] * BIG_SENTENCES))
        return {k: flags[k] or bflags[k] for k in COLUMNS}, problems + bproblems, damage + bdamage

    def special_disconnected_client(self, case: Case) -> tuple[dict, list[str], list[str]]:
        """A client that sends a large request and goes away: its work must be cancelled."""
        body = big_request()
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.sendall(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(1.0)
        s.close()
        return self._small_within(
            f"after a client disconnected from a large request ({self.big_s or 0:.1f} s alone)", self._bound()
        )

    def special_shutdown_503(self, case: Case) -> tuple[dict, list[str], list[str]]:
        """SIGTERM while a large request runs: new requests 503, the running one answered, exit 0."""
        proc, port, why = self.start(self.work / "server_shutdown", [], self.work / "server_shutdown.log")
        flags, problems = dict.fromkeys(COLUMNS, False), []
        if proc is None:
            flags["other"] = True
            return flags, [f"the server did not start: {why}"], []
        keep = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
        keep.request("GET", "/health")
        keep.getresponse().read()
        big: dict = {}
        t = threading.Thread(target=lambda: big.update(http_call(port, "POST", "/translate", big_request())))
        t.start()
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
        rc = self.stop(proc, signal.SIGTERM, 45)
        for label, answer in (("on an open connection", late), ("on a new connection", fresh)):
            if answer.get("status") != 503:
                flags["other"] = True
                got = answer.get("status") or answer.get("error")
                problems.append(f"a request during shutdown {label} got {got}, not 503")
        bflags, bproblems, bdamage = judge_http(case, big, [200], _shape([1] * BIG_SENTENCES))
        if rc != 0:
            flags["other"] = True
            problems.append(f"the server exited {rc}, not 0, after SIGTERM")
        if "Traceback" in (self.work / "server_shutdown.log").read_text(errors="replace"):
            flags["traceback"] = True
        return {k: flags[k] or bflags[k] for k in COLUMNS}, problems + bproblems, bdamage

    def special_api_key(self, case: Case) -> tuple[dict, list[str], list[str]]:
        """-api_key_file (docs/deploy.md): without the key 401 (also for unknown paths), with
        ``Authorization: Bearer KEY`` 200, /health open."""
        folder = self.work / "server_key"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "api.key").write_text("s3cretKEY\n")
        proc, port, why = self.start(folder, ["-api_key_file", str(folder / "api.key")], self.work / "server_key.log")
        flags, problems = dict.fromkeys(COLUMNS, False), []
        if proc is None:
            flags["other"] = True
            return (
                flags,
                [f"the server with -api_key_file did not start: {why.splitlines()[-1][:150] if why else ''}"],
                [],
            )
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
            self.stop(proc)
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

    def close(self) -> None:
        """Stop the shared server."""
        self.stop(self.proc)


def _http_display(case: Case) -> str:
    e = case.extra
    if e.get("kind") != "request":
        return f"(server) {case.note or e.get('kind')}"
    body = e.get("body")
    shown = "" if body is None else f" -d {body[:80]!r}" + (f"... ({len(body)} bytes)" if len(body) > 80 else "")
    return f"curl -X {e['method']} localhost:PORT{e['path']}{shown}"


# ----------------------------------------------------------------------------- the review

CLASSES: dict[str, tuple[Callable[[], list[Case]], str]] = {
    "output-path": (
        cases_output_path,
        "`<writer> … -output X`, X an input (same name, link, hard link, `..`), a folder, a device, a FIFO, "
        "/dev/stdout, a missing or read-only folder",
    ),
    "output-folder": (
        cases_output_folder,
        "`onmt_doc_release -output D [-force]`, `onmt_doc_make_toy_corpus --out D [--force]`",
    ),
    "stdio": (
        cases_stdio,
        "`<command> > /dev/full`, `>&-`, a pipe whose reader exited; `onmt_doc_translate -src - < /dev/zero`, `<&-`",
    ),
    "input-files": (
        cases_input_files,
        "`<reader> -src/-tgt/-hyp/-suite/-table/-config X`, X missing, a folder, invalid UTF-8, /dev/zero, "
        "unreadable, misaligned …",
    ),
    "checkpoints": (
        cases_checkpoints,
        "`<checkpoint reader> -model X.pt` (translate, ensemble, resume, init_from, average, release, evaluate, "
        "gate_analysis, server, import)",
    ),
    "run-folder": (
        cases_run_folder,
        "`onmt_doc_train`/`build_vocab`/`average -run_dir` on a run missing last.pt, changed, locked …",
    ),
    "config": (cases_config, "`onmt_doc_train -config X.yaml [key=value]`, `onmt_doc_translate -beam/-n_best/…`"),
    "unsafe-input": (cases_unsafe, "malicious pickle in `.pt`/`.npz`, `!!python/object` in `-config` or an override"),
    "disk-full": (cases_disk_full, "`<writer> -output full/X` on a nearly full tmpfs, over an existing output"),
    "api": (cases_api, "`Translator.load(…)`, `.translate/.nbest/.score(…)`"),
    "server": (cases_server, "`onmt_doc_server …` start-ups; `curl localhost:PORT/translate -d …`"),
    "stdio-files": (
        cases_stdio_files,
        "`onmt_doc_translate -src - -output x < x`, `-src x >> x`, `-stream`, `/dev/fd/0`; `evaluate -json - >> hyp`",
    ),
    "readers-verify": (
        cases_readers_verify,
        "`onmt_doc_train` over a damaged mapped cache or vocabulary; a PMI table out of bounds; `import_marian`/"
        "`import_opennmt` of flipped, NaN or recorded weights",
    ),
    "bounds": (
        cases_bounds,
        "`-threads`/`data.workers`/`train.threads` 10^6, server counts and waits, `-api_key_file /dev/zero`, "
        "Marian config.json types and depth, `translate_stream(…)`",
    ),
    "bench-out": (
        cases_bench_out,
        "`python -m benchmarks run s.yaml --out X`, X a folder of the repository, a user's …",
    ),
    "messages": (
        cases_messages,
        "a folder where a file is expected, `-model lr=0.1.pt`, a pickle refusal, a plugin's `exit()`, "
        "`-suite lexical-choice.json`",
    ),
}


def all_cases(classes: Optional[list[str]] = None, limit: Optional[int] = None) -> list[Case]:
    """The cases of the chosen classes (all by default), at most ``limit`` per class."""
    out = []
    for name, (make, _) in CLASSES.items():
        if classes and name not in classes:
            continue
        cases = make()
        names = [c.ident for c in cases]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise SystemExit(f"duplicate case names: {sorted(dup)}")
        out += spread(cases, limit)
    return out


def _slug(ident: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", ident)[:120]


class Review:
    """Runs the cases (in parallel where they are independent) and writes results as they come."""

    def __init__(self, work: Path, out: Path, jobs: int, keep: bool):
        self.work, self.out, self.jobs, self.keep = work, out, jobs, keep
        self.lock = threading.Lock()
        self.records: list[dict] = []
        self.total = 0
        self.cases_dir = work / "cases"

    def emit(self, record: dict) -> None:
        """Append one case's record to cases.jsonl (and a progress line)."""
        with self.lock:
            self.records.append(record)
            with open(self.out / "cases.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            bad = [k for k in COLUMNS if record.get("flags", {}).get(k)]
            state = "skipped" if "skipped" in record else ("ok" if record.get("behaved") else ",".join(bad))
            log(f"{len(self.records)}/{self.total} {record['class']}/{record['name']}: {state}")

    def command_task(self, case: Case, index: int) -> None:
        """Run one command case; its folder is kept when it misbehaved (or with --keep)."""
        case_dir = self.cases_dir / f"{index:03d}-{_slug(case.ident)}"
        try:
            record = run_command_case(case, self.work, self.work / "base", case_dir)
        except Exception:  # a harness failure is reported with the case, not lost
            record = {
                **_record_head(case, display_command(case)),
                "skipped": "harness error: " + traceback.format_exc()[-800:],
            }
        record["folder"] = str(case_dir)
        self.emit(record)
        if record.get("behaved") and not self.keep:
            shutil.rmtree(case_dir, ignore_errors=True)
            for suffix in (".stdout", ".stderr"):
                with contextlib.suppress(FileNotFoundError):
                    (case_dir.parent / f"{case_dir.name}{suffix}").unlink()

    def api_task(self, cases: list[Case], index: int) -> None:
        """Run a batch of API cases in one process."""
        for record in run_api_batch(cases, self.work, self.work / "base", self.cases_dir / f"api-{index:02d}"):
            self.emit(record)

    def server_task(self, cases: list[Case]) -> None:
        """Run the server cases in order, on one shared server (a log line belongs to one case)."""
        session = ServerSession(self.work, self.work / "base")
        try:
            for case in cases:
                try:
                    record = session.run(case)
                except Exception:
                    record = {
                        **_record_head(case, _http_display(case)),
                        "skipped": "harness error: " + traceback.format_exc()[-800:],
                    }
                self.emit(record)
        finally:
            session.close()

    def run(self, cases: list[Case]) -> None:
        """All cases: the server's and the API's in their own tasks, the rest one task each."""
        self.total = len(cases)
        self.cases_dir.mkdir(parents=True, exist_ok=True)
        api = [c for c in cases if c.runner == "api"]
        server = [c for c in cases if c.runner == "server"]
        tasks: list[tuple[float, Callable[[], None]]] = []
        if server:
            tasks.append((1000.0, lambda: self.server_task(server)))
        for i in range(0, len(api), 12):
            batch = api[i : i + 12]
            tasks.append((100.0, lambda b=batch, n=i: self.api_task(b, n)))
        for i, c in enumerate(cases):
            if c.runner == "cmd":
                tasks.append((c.timeout, lambda c=c, i=i: self.command_task(c, i)))
        tasks.sort(key=lambda t: -t[0])  # the long ones first: the pool ends together
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            for f in [pool.submit(fn) for _, fn in tasks]:
                f.result()

    def report(self) -> str:
        """table.md, failures.md and summary.json from the records; the table is returned."""
        rows = []
        for name, (_, pattern) in CLASSES.items():
            recs = [r for r in self.records if r["class"] == name and "skipped" not in r]
            if not recs:
                continue
            row = {"class": name, "cases": len(recs), "pattern": pattern, "behaved": sum(r["behaved"] for r in recs)}
            for c in COLUMNS:
                row[c] = sum(bool(r["flags"][c]) for r in recs)
            rows.append(row)
        table = markdown_table(rows)
        skipped = [r for r in self.records if "skipped" in r]
        if skipped:
            table += (
                f"\n{len(skipped)} cases skipped: "
                + "; ".join(f"{r['class']}/{r['name']} ({r['skipped'][:80]})" for r in skipped[:10])
                + "\n"
            )
        (self.out / "table.md").write_text(table, encoding="utf-8")
        (self.out / "failures.md").write_text(failures_markdown(self.records), encoding="utf-8")
        summary = {"rows": rows, "skipped": len(skipped), "cases": len(self.records)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return table


def failures_markdown(records: list[dict], per_class: int = 3) -> str:
    """Up to ``per_class`` failing cases per class and column: the command and what happened."""
    lines = ["# Hostile review: failing cases (examples)", ""]
    for name in CLASSES:
        bad = [r for r in records if r["class"] == name and "skipped" not in r and not r["behaved"]]
        if not bad:
            continue
        lines += [f"## {name} ({len(bad)} failing)", ""]
        for column in COLUMNS:
            hits = [r for r in bad if r["flags"][column]]
            for r in hits[:per_class]:
                what = (
                    r["traceback"]
                    or "; ".join(r["damage"] + r["problems"])
                    or " / ".join(r.get("stderr_tail", [])[-1:])
                )
                lines.append(f"- **{column}** `{r['name']}`: `{r['command'][:300]}` — {what[:400]}")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", help="workspace folder, prepared once (default: a new temporary folder)")
    p.add_argument("--out", default=str(REPO / "runs" / "hostile_review"), help="results folder")
    p.add_argument("--jobs", type=int, default=2, help="cases at once (default 2)")
    p.add_argument("--classes", help="comma-separated classes: " + ", ".join(CLASSES))
    p.add_argument("--limit", type=int, help="at most N cases per class (evenly spread)")
    p.add_argument("--keep", action="store_true", help="keep the folders of cases that behaved")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--report", action="store_true", help="only rebuild table.md and failures.md from <out>/cases.jsonl")
    p.add_argument("--api-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.api_worker:
        return api_worker(args.api_worker)
    classes = args.classes.split(",") if args.classes else None
    unknown = [c for c in classes or [] if c not in CLASSES]
    if unknown:
        p.error(f"unknown classes {unknown}; choose from {', '.join(CLASSES)}")
    if args.report:  # e.g. after an interrupted run: the records written so far
        review = Review(Path(tempfile.gettempdir()), Path(args.out).resolve(), args.jobs, args.keep)
        lines = (Path(args.out) / "cases.jsonl").read_text(encoding="utf-8").splitlines()
        review.records = [json.loads(line) for line in lines if line.strip()]
        with contextlib.suppress(BrokenPipeError):  # `| head`
            print(review.report(), flush=True)
        return 0
    cases = all_cases(classes, args.limit)
    if args.list:
        for c in cases:
            print(
                f"{c.ident}\t{c.expect}\t{display_command(c) if c.runner == 'cmd' else c.note or c.extra.get('kind')}"
            )
        print(f"{len(cases)} cases", file=sys.stderr)
        return 0
    if os.geteuid() != 0:
        p.error("run as root: the review makes device nodes, mounts tmpfs folders and drops capabilities")
    work = Path(args.work or tempfile.mkdtemp(prefix="hostile_review_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "cases.jsonl").write_text("")
    prepare_workspace(work)
    shutil.rmtree(work / "cases", ignore_errors=True)
    review = Review(work, out, args.jobs, args.keep)
    start = time.time()
    log(f"{len(cases)} cases, {args.jobs} at once; results in {out}")
    review.run(cases)
    table = review.report()
    print(table)
    log(f"done in {time.time() - start:.0f} s: {out / 'table.md'}, {out / 'failures.md'}, {out / 'cases.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
