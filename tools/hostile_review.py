#!/usr/bin/env python
"""Hostile review: several hundred hostile cases against every command, the server and the Python
API, counted per class in the columns of docs/reliability.md ("The hostile review").

  python tools/hostile_review.py [--work DIR] [--out runs/hostile_review] [--jobs 2]
                                 [--classes output-path,server] [--limit N] [--keep] [--list]

The cases are data: tools/hostile/cases.yaml (a case is a line; a class's rules cross commands with
hazards); this file reads them, runs each and judges it. Their words live beside it: setup steps and
checks in tools/hostile/steps.py, server scenarios in scenarios.py, the workspace and the fake
OpenNMT-py and Marian models (shared with the tests) in fixtures.py.

Run it as root on Linux: it makes device nodes (``mknod``), mounts small tmpfs folders for full
disks and drops capabilities (``setpriv``) for permission cases. ``--work`` is prepared once and
reused by the next run with the same ``--work``; each case works on fresh copies (never links) of
the files it may touch, in its own folder. ``--classes`` picks classes, ``--limit N`` runs at most N
cases per class (spread over it), ``--list`` prints the cases, ``--keep`` keeps the folders of cases
that behaved (the others' are always kept under ``<work>/cases``), ``--report`` rebuilds the
reports from ``<out>/cases.jsonl``. The full run takes about 30 minutes on a shared 2-core machine.

Results are written as they come: ``<out>/cases.jsonl`` (a JSON object per case: the command as run
in its folder, what was expected, exit status, stderr tail, traceback, damage, problems), then
``<out>/table.md`` (docs/reliability.md's table), ``<out>/failures.md`` (up to three failing cases per
class and column) and ``<out>/summary.json``.

How a case is judged. It expects a refusal, a success or either; the harness snapshots every file of
its folder (sha256, size, type, mode, link target) before and after, runs it under a 4 GB
address-space limit (``prlimit --as``), and counts it in each column it earns: **damaged** (a file it
may not change changed or vanished, an existing output changed by a failed run, data lost silently, a
malicious payload ran), **traceback** (a traceback, a death by signal, an API exception other than
``UserError``, a server 5xx), **stall** (no end within its timeout), **accepted_invalid** (exit 0
where a refusal is due), **other** (a refusal of more than one stderr line, a valid input refused, a
message that does not say what its checks ask, a temporary file left behind, a wrong HTTP status).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: the hostile package

from hostile import fixtures, scenarios, steps  # noqa: E402
from hostile.fixtures import console, env, log  # noqa: E402
from hostile.steps import COLUMNS, REFUSE, SUCCEED, Case, Ctx, Unsupported, error_lines, has_traceback  # noqa: E402

from onmt_doc.config.loading import read_yaml  # noqa: E402

REPO = steps.REPO
HERE = Path(__file__).resolve()
CASES_FILE = HERE.parent / "hostile" / "cases.yaml"
AS_LIMIT = 4 << 30  # address space of every case: an endless input fails there, not in the machine
LEFTOVER = re.compile(r"\.tmp\d+(\.npz)?(/|$)|\.old\d+(/|$)")
VOLATILE = ("**/.lock", ".lock")  # the run lock's text names its last holder: rewritten by design
SPECIAL_KINDS = ("char", "fifo", "link", "socket", "block")
DROP_CAPS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
API_TIMEOUT = 60

# ----------------------------------------------------------------------------- judging (pure helpers)


def traceback_tail(stderr: str) -> str:
    """The last line of the last traceback (the exception), what a report names."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    idx = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), default=-1)
    for line in lines[idx + 1 :]:
        if not line.startswith((" ", "\t")) and not line.startswith("During handling"):
            return line.strip()[:300]
    return (lines[-1] if lines else "").strip()[:300]


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


def describe_path(path: str) -> dict:
    """Type, mode and content digest of one path, never following a link or reading a device."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"kind": "missing"}
    except OSError as e:
        return {"kind": "error", "error": e.strerror}
    tests = (("file", stat.S_ISREG), ("dir", stat.S_ISDIR), ("link", stat.S_ISLNK), ("char", stat.S_ISCHR))
    tests += (("fifo", stat.S_ISFIFO), ("socket", stat.S_ISSOCK))
    kind = next((k for k, test in tests if test(st.st_mode)), "block")
    d: dict[str, Any] = {"kind": kind, "mode": stat.S_IMODE(st.st_mode)}
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
    return {**out, **{s: describe_path(s) for s in specials}}


# ----------------------------------------------------------------------------- the cases file

RULE_KEYS = ("hazards", "vars", "override", "then")  # a rule command's keys that are not case fields
FIELDS = {"name", "cmd", "expect", "needs", "outputs", "replaced", "setup", "checks", "stdin", "stdout", "drop_caps"}
FIELDS |= {"timeout", "note", "fifo", "specials", "env", "server_start", "code", "message", "method", "path", "json"}
FIELDS |= {"raw", "body", "statuses", "shape", "shape_key", "plain_ok", "no_abs_path", "scenario"}
VAR = re.compile(r"\{([A-Z_]+)\}")
RUNTIME = ("CASE", "PORT")  # filled when the case runs: its folder, a taken port


def _merge(*parts: dict) -> dict:
    """Case fields in order: a later scalar replaces, a later list is appended (setup, checks, outputs)."""
    out: dict = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out[k] + v if isinstance(v, list) and isinstance(out.get(k), list) else v
    return out


def _fill(value: Any, variables: dict, where: str) -> Any:
    """``value`` with ``{NAME}`` replaced everywhere (strings in lists and mappings too)."""
    if isinstance(value, list):
        return [_fill(v, variables, where) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, variables, where) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    unknown = [n for n in VAR.findall(value) if n not in variables and n not in RUNTIME]
    if unknown:
        raise KeyError(f"{where}: {{{unknown[0]}}} is not defined")
    return VAR.sub(lambda m: str(variables.get(m.group(1), m.group(0))), value)


def _flat(items: list) -> list:
    return [x for item in items for x in (_flat(item) if isinstance(item, list) else [item])]


def rule_cases(rules: dict) -> list[tuple[dict, dict]]:
    """(case fields, variables) of each command x each hazard it lists, in the command's order."""
    out = []
    hazards = {h["name"]: h for h in rules["hazards"]}
    for command in rules["commands"]:
        wanted = _flat(command["hazards"])
        unknown = [h for h in wanted if h not in hazards]
        if unknown:
            raise SystemExit(f"{CASES_FILE}: {command['name']} lists unknown hazards {unknown}")
        own = {k: v for k, v in command.items() if k not in RULE_KEYS}
        for hazard in (hazards[h] for h in wanted):
            fields = {k: v for k, v in hazard.items() if k not in ("vars", "for_each")}
            merged = _merge(own, fields, command.get("override", {}).get(hazard["name"], {}))
            merged = _merge(merged, {"setup": command.get("then", [])})
            merged["name"] = f"{command['name']}/{hazard['name']}"
            for each in command["vars"][hazard["for_each"]] if "for_each" in hazard else [None]:
                variables = dict(command.get("vars", {}))
                if each is not None:
                    variables.update(EACH=each, EACH_NAME=each.replace("/", "_"))
                out.append((merged, {**variables, **hazard.get("vars", {})}))
    return out


def make_case(cls: str, raw: dict, variables: dict) -> Case:
    """A :class:`Case` from its fields in cases.yaml, ``{NAME}`` filled (a check naming a variable
    the command lacks, such as ``{LINES}`` where no source fixes the output's lines, is left out)."""
    variables = {**variables, "REPO": str(REPO)}
    for _ in range(3):  # variables made of variables
        variables = {k: _fill(v, variables, f"{cls}: {raw['name']}") for k, v in variables.items()}
    where = f"{cls}/{raw['name']}"
    if set(raw) - FIELDS:  # a typo, or a comma that YAML took for the end of a value
        raise SystemExit(f"{CASES_FILE}: {where}: unknown fields {sorted(set(raw) - FIELDS)}")
    checks = [c if isinstance(c, list) else [c] for c in raw.get("checks", [])]
    if "message" in raw:  # an API case's refusal must say this
        checks.append(["message_has", raw["message"], f"the error does not say {raw['message']!r}"])
    checks = [c for c in checks if not set(VAR.findall(json.dumps(c))) - set(variables)]
    argv = [_fill(a, variables, where) for a in shlex.split(raw.get("cmd", ""))]  # a value is one argument
    raw = _fill({**raw, "checks": checks, "cmd": ""}, variables, where)
    _check_words(raw, where)
    kw: dict[str, Any] = {
        "argv": argv,
        "setup": tuple((s[0], tuple(s[1:])) for s in raw.get("setup", [])),
        "checks": tuple(steps.CHECKS[c[0]](*c[1:]) for c in raw["checks"]),
        "extra": {k: raw[k] for k in ("env", "server_start") if k in raw},
    }
    for k in ("needs", "outputs", "specials", "replaced"):
        kw[k] = tuple(raw.get(k, ()))
    for k in ("expect", "stdin", "stdout", "drop_caps", "timeout", "note", "fifo"):
        if k in raw:
            kw[k] = raw[k]
    if "code" in raw:  # an API call, run in a Python process with others
        kw.update(runner="api", note=raw["code"], extra={"code": raw["code"]})
    elif "scenario" in raw:
        kw.update(runner="server", expect=SUCCEED, extra={"scenario": raw["scenario"]})
    elif "method" in raw:  # one request on the shared server
        req = scenarios.request(raw)
        kw.update(runner="server", expect=SUCCEED if req["statuses"][0] == 200 else REFUSE, extra=req)
    return Case(cls, raw["name"], **kw)


def _check_words(raw: dict, where: str) -> None:
    """Every step, transform, maker, check and scenario a case names exists (a typo fails the load, not the run)."""
    todo, problems = list(raw.get("setup", [])), []
    while todo:
        name, *args = todo.pop()
        words = {"derive": (2, steps.TRANSFORMS), "make": (1, steps.MAKERS), "cache": (0, steps.CACHE_DAMAGES)}
        if name not in steps.STEPS:
            problems.append(f"no setup step {name!r}")
        elif name in words and args[words[name][0]] not in words[name][1]:
            problems.append(f"{name}: no {args[words[name][0]]!r}")
        todo += args[3] if name == "tmpfs" and len(args) > 3 else []
    problems += [f"no check {c[0]!r}" for c in raw.get("checks", []) if c[0] not in steps.CHECKS]
    if "scenario" in raw and raw["scenario"] not in scenarios.SCENARIOS:
        problems.append(f"no scenario {raw['scenario']!r}")
    if problems:
        raise SystemExit(f"{CASES_FILE}: {where}: {'; '.join(problems)}")


def load_classes(path: Path = CASES_FILE) -> dict[str, dict]:
    """The classes of the cases file, in order: each its ``pattern``, ``about``, ``defaults``,
    ``rules`` and ``cases``."""
    return read_yaml(str(path), "hostile review cases")["classes"]


def class_cases(cls: str, spec: dict) -> list[Case]:
    """The cases of one class: its rules' (commands x hazards), then its listed ones, defaults under each."""
    made = rule_cases(spec["rules"]) if "rules" in spec else []
    made += [(c, {}) for c in spec.get("cases", [])]
    cases = [make_case(cls, {**spec.get("defaults", {}), **raw}, variables) for raw, variables in made]
    names = [c.ident for c in cases]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SystemExit(f"duplicate case names: {dup}")
    return cases


def all_cases(classes: Optional[list[str]] = None, limit: Optional[int] = None) -> list[Case]:
    """The cases of the chosen classes (all by default), at most ``limit`` per class."""
    return [
        c
        for cls, spec in load_classes().items()
        if not classes or cls in classes
        for c in spread(class_cases(cls, spec), limit)
    ]


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
    """The standard streams a case asks for (``Case.stdin``, ``Case.stdout``) and the FIFO another
    process reads (``Case.fifo``), the threads that feed or read them, and how a user would have
    written them in a shell (for the report)."""

    def __init__(self, ctx: Ctx):
        self.ctx, self.threads, self.stop = ctx, [], threading.Event()
        self.child_ends: list[int] = []  # pipe ends only the command keeps open
        self.files: list[Any] = []
        self.closes: list[str] = []  # streams the command starts without (closed, not /dev/null)
        self.read: dict[str, list[bytes]] = {"pipe": [], "fifo": []}
        self.shell = ""
        self.stdin = self._stdin(*ctx.case.stdin.partition(":")[::2])
        self.stdout = self._stdout(*ctx.case.stdout.partition(":")[::2])
        if ctx.case.fifo:  # opened before the command, so that its open for writing does not block
            self._reader(os.open(ctx.dir / ctx.case.fifo, os.O_RDONLY | os.O_NONBLOCK), "fifo")

    def _stdin(self, how: str, rel: str) -> Any:  # devnull | closed | endless | file:REL
        if how in ("devnull", "closed"):
            self.closes += ["0<&-"] if how == "closed" else []
            self.shell += " <&-" if how == "closed" else ""
            return subprocess.DEVNULL
        if how == "endless":
            r, w = os.pipe()
            self.child_ends.append(r)
            self.threads.append(threading.Thread(target=self._endless, args=(w,), daemon=True))
            self.shell = " (an endless line without a line break) |"
            return r
        if how != "file":
            raise ValueError(f"stdin: {how}")
        self.shell += f" < {rel}"
        return self._open(self.ctx.dir / rel, "rb")

    def _stdout(self, how: str, rel: str) -> Any:  # file | closed | pipe | broken_pipe | append:REL | path:REL
        if how == "file":
            return self._open(self.ctx.capture, "wb")
        if how == "closed":
            self.closes.append("1>&-")
            self.shell += " >&-"
            return subprocess.DEVNULL
        if how in ("pipe", "broken_pipe"):
            r, w = os.pipe()
            self.child_ends.append(w)
            self._reader(r, "pipe") if how == "pipe" else os.close(r)
            self.shell += " | cat" if how == "pipe" else " | (a reader that has exited)"
            return w
        self.shell += f" {'>>' if how == 'append' else '>'} {rel}"
        return self._open(self.ctx.dir / rel, {"append": "ab", "path": "wb"}[how])

    def _open(self, path: Path, mode: str) -> Any:
        f = open(path, mode)
        self.files.append(f)
        return f

    def _endless(self, w: int) -> None:
        with contextlib.suppress(OSError):
            while not self.stop.is_set():
                os.write(w, b"x" * 65536)
        os.close(w)

    def _reader(self, fd: int, into: str) -> None:
        """A thread that reads ``fd`` (non-blocking) into ``self.read[into]`` until the command has
        ended and nothing is left to read."""

        def run() -> None:
            os.set_blocking(fd, False)
            while True:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    data = None
                if data:
                    self.read[into].append(data)
                elif self.stop.is_set():
                    break
                else:
                    time.sleep(0.02)
            os.close(fd)

        self.threads.append(threading.Thread(target=run, daemon=True))

    def wrapper(self) -> list[str]:
        """``bash -c 'exec 0<&-; exec "$@"'`` when a stream must be closed (not /dev/null)."""
        return ["bash", "-c", f'exec {" ".join(self.closes)}; exec "$@"', "hostile"] if self.closes else []

    def started(self) -> None:
        """After the fork: close our copies of the command's pipe ends, start the threads."""
        for fd in self.child_ends:
            with contextlib.suppress(OSError):
                os.close(fd)
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        """After the exit: stop the writer, let the readers drain, close files; what a pipe
        carried is the captured stdout, what the FIFO carried goes to the checks."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        for f in self.files:
            f.close()
        if self.ctx.case.stdout == "pipe":
            self.ctx.capture.write_bytes(b"".join(self.read["pipe"]))
        self.ctx.fifo_data = b"".join(self.read["fifo"])


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


def display_command(case: Case, io: Optional[_Stdio] = None, argv: Optional[list[str]] = None) -> str:
    """The case as a user would type it in the case folder (setup described by its note)."""
    text = shlex.join([a.replace("{CASE}", "$CASE") for a in argv or case.argv])
    text = ("setpriv --bounding-set=-dac_override,-dac_read_search " if case.drop_caps else "") + text
    shell = io.shell if io else ""
    return shell.strip() + " " + text if shell.startswith(" (an endless") else text + shell


def run_command_case(case: Case, work: Path, base: Path, case_dir: Path) -> dict:
    """Run one command case in a fresh folder and judge it (module docstring)."""
    ctx = Ctx(case, case_dir, work, case_dir.parent / f"{case_dir.name}.stdout", argv=list(case.argv))
    _copy_needs(case.needs, base, case_dir)
    try:
        try:
            steps.run_steps(ctx, case.setup)
            for check in case.checks:
                if check.prepare:
                    check.prepare(ctx)
        except Unsupported as e:
            return {**_record_head(case, display_command(case)), "skipped": str(e)}
        io = _Stdio(ctx)
        volatile = [case.stdout.split(":", 1)[1]] if case.stdout.startswith(("append:", "path:")) else []
        before = snapshot(case_dir, case.specials)
        argv = [console(ctx.argv[0])] + [a.replace("{CASE}", str(case_dir)) for a in ctx.argv[1:]]
        cmd = ["prlimit", f"--as={AS_LIMIT}"] + (DROP_CAPS if case.drop_caps else []) + io.wrapper() + argv
        err_path = case_dir.parent / f"{case_dir.name}.stderr"
        start = time.monotonic()
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=case_dir, stdin=io.stdin, stdout=io.stdout, stderr=err,
                                    env={**env(), **case.extra.get("env", {})}, start_new_session=True)  # fmt: skip
            io.started()
            rc, rss, timed_out, serving = _wait(proc, case.timeout, err_path, case.extra.get("server_start", False))
        seconds = time.monotonic() - start
        io.finish()
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
        record.update(command=display_command(case, io, ctx.argv), rc=rc, seconds=round(seconds, 1))
        record["maxrss_mb"] = round(rss)
        if serving:
            record["problems"].append("the server started serving (accepted the invalid start-up)")
        elif timed_out:
            record["problems"].insert(0, f"still running after {case.timeout:.0f} s (killed)")
        if flags["accepted_invalid"] and not serving:
            record["problems"].insert(0, "exit status 0 where a refusal is expected")
        return record
    finally:
        steps.release(ctx)


def _record_head(case: Case, command: str) -> dict:
    """What every record starts with, a skipped case's too."""
    return {"class": case.cls, "name": case.name, "command": command, "note": case.note, "expect": case.expect}


def _record(case: Case, command: str, flags: dict, damage: list, problems: list, tb: str, tail: list) -> dict:
    """The JSON record of a judged case (a line of cases.jsonl); behaved is no column flagged."""
    return {**_record_head(case, command), "flags": flags, "behaved": not any(flags.values()), "damage": damage,
            "problems": problems, "traceback": tb, "stderr_tail": tail}  # fmt: skip


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
    tb = traceback_tail(ctx.stderr) if flags["traceback"] else ""
    return _record(case, display_command(case), flags, damage, problems, tb, ctx.stderr.strip().splitlines()[-4:])


# ----------------------------------------------------------------------------- API cases

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
    """``--api-worker SPEC``: run a batch of API cases in this process, each as a command would
    have ended (``rc`` 0 for a return, 1 with the message for a ``UserError``, 1 with the traceback
    for anything else), one JSON line per case on stdout; a ``start`` line first, so that a crash is
    put down to the case that caused it."""
    spec = json.loads(Path(spec_path).read_text())
    os.chdir(spec["dir"])
    import torch

    from onmt_doc.errors import UserError

    torch.set_num_threads(1)
    ns: dict = {}
    exec(API_PRELUDE, ns)

    def alarm(signum: int, frame: Any) -> None:
        raise _Alarm()

    signal.signal(signal.SIGALRM, alarm)
    for item in spec["cases"]:
        print(json.dumps({"start": item["id"]}), flush=True)
        before = snapshot(Path("."))
        result: dict[str, Any] = {"id": item["id"], "rc": 0, "stderr": "", "timed_out": False, "lost": []}
        signal.alarm(API_TIMEOUT)
        try:
            exec(item["code"], dict(ns))
        except _Alarm:
            result.update(rc=None, timed_out=True)
        except UserError as e:
            result.update(rc=1, stderr=str(e))
        except ns["Lost"] as e:  # the call returned, with sentences lost or gained
            result["lost"] = [str(e)]
        except BaseException:  # noqa: BLE001 - every other exception is what the case looks for
            result.update(rc=1, stderr=traceback.format_exc()[-3000:])
        finally:
            signal.alarm(0)
        damage, leftovers = compare(before, snapshot(Path(".")), [])
        result.update(damage=damage, leftovers=leftovers, pwned=os.path.exists(fixtures.PWNED))
        if result["pwned"]:
            os.remove(fixtures.PWNED)
        print(json.dumps(result), flush=True)
    return 0


def judge_api(case: Case, result: dict) -> dict:
    """The record of one API call from the worker's line, judged as a command's run is."""
    ctx = Ctx(case, Path("."), Path("."), Path(os.devnull), rc=result["rc"], stderr=result["stderr"])
    flags, problems = judge(case.expect, ctx.rc, ctx.stderr, result["timed_out"])
    damage = result.get("damage", []) + result.get("lost", [])
    damage += ["the malicious payload ran (PWNED created)"] if result.get("pwned") else []
    record = _finish(case, ctx, flags, problems, damage, result.get("leftovers", []))
    return {**record, "command": f"python -c 'from onmt_doc import Translator as T; {case.extra['code']}'"}


def api_folder(folder: Path, base: Path) -> None:
    """What the API cases read: a good checkpoint and its damaged variants."""
    data = (base / "model.pt").read_bytes()
    made = {"model.pt": data, "flip.pt": fixtures.flip_middle(data), "trunc.pt": data[: len(data) // 2]}
    made.update({"text.pt": b"this is not a checkpoint\n", "evil.pt": fixtures.evil_zip(data)})
    for name, content in made.items():
        (folder / name).write_bytes(content)
    for name in ("shapes.pt", "huge.pt"):
        shutil.copyfile(base / name, folder / name)
    (folder / "adir").mkdir()


def _json_lines(text: str) -> list[dict]:
    """The JSON objects of a worker's stdout (a line cut by a kill is no object)."""
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return [x for x in out if isinstance(x, dict)]


def run_api_batch(cases: list[Case], base: Path, batch_dir: Path) -> list[dict]:
    """API cases in as few Python processes as possible (importing torch takes seconds): a worker
    runs them in order; when it dies in one, that case is judged by the death (a traceback, or a
    stall at the batch's deadline) and the cases after it go on in a new worker."""
    records: list[dict] = []
    while cases:
        shutil.rmtree(batch_dir, ignore_errors=True)
        batch_dir.mkdir(parents=True)
        api_folder(batch_dir, base)
        spec_path, out_path, err_path = (batch_dir.parent / f"{batch_dir.name}.{x}" for x in ("json", "out", "err"))
        spec_path.write_text(
            json.dumps({"dir": str(batch_dir), "cases": [{"id": c.ident, "code": c.extra["code"]} for c in cases]})
        )
        cmd = ["prlimit", f"--as={AS_LIMIT}", sys.executable, str(HERE), "--api-worker", str(spec_path)]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=batch_dir, stdout=out, stderr=err, env=env(), start_new_session=True)
            rc, _, timed_out, _ = _wait(proc, API_TIMEOUT * len(cases) + 90, err_path, False)
        lines = _json_lines(out_path.read_text(errors="replace"))
        results = [x for x in lines if "start" not in x]
        records += [judge_api(c, r) for c, r in zip(cases, results)]
        cases = cases[len(results) :]
        if cases and (not lines or "start" in lines[-1]):  # it died in cases[0] (or before any case: all)
            culprits = cases[:1] if lines else cases
            what = "the Python process died" if lines else "the API worker failed before any case"
            why = f"{what} (exit {rc}): {traceback_tail(err_path.read_text(errors='replace'))}"
            crash = {"rc": None if timed_out else -1, "stderr": "" if timed_out else why, "timed_out": timed_out}
            records += [judge_api(c, crash) for c in culprits]
            cases = cases[len(culprits) :]
    return records


# ----------------------------------------------------------------------------- the review


def _slug(ident: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", ident)[:120]


class Review:
    """Runs the cases (in parallel where they are independent) and writes results as they come."""

    def __init__(self, work: Path, out: Path, jobs: int, keep: bool, classes: dict):
        self.work, self.out, self.jobs, self.keep, self.classes = work, out, jobs, keep, classes
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

    def guarded(self, case: Case, command: str, run: Callable[[], dict]) -> dict:
        """A case's record, or (a harness failure) the case skipped with the error: reported, not lost."""
        try:
            return run()
        except Exception:
            return {**_record_head(case, command), "skipped": "harness error: " + traceback.format_exc()[-800:]}

    def command_task(self, case: Case, index: int) -> None:
        """Run one command case; its folder is kept when it misbehaved (or with --keep)."""
        case_dir = self.cases_dir / f"{index:03d}-{_slug(case.ident)}"
        run = lambda: run_command_case(case, self.work, self.work / "base", case_dir)  # noqa: E731
        record = self.guarded(case, display_command(case), run)
        record["folder"] = str(case_dir)
        self.emit(record)
        if record.get("behaved") and not self.keep:
            shutil.rmtree(case_dir, ignore_errors=True)
            for suffix in (".stdout", ".stderr"):
                with contextlib.suppress(FileNotFoundError):
                    (case_dir.parent / f"{case_dir.name}{suffix}").unlink()

    def server_task(self, cases: list[Case]) -> None:
        """Run the server cases in order, on one shared server (a log line belongs to one case)."""
        session = scenarios.ServerSession(self.work, self.work / "base")

        def one(case: Case) -> dict:
            start = time.monotonic()
            flags, problems, damage, logged = session.run(case)
            record = _record(case, scenarios.display(case), flags, damage, problems, traceback_tail(logged), [])
            del record["stderr_tail"]
            return {**record, "seconds": round(time.monotonic() - start, 1)}

        try:
            for case in cases:
                self.emit(self.guarded(case, scenarios.display(case), lambda c=case: one(c)))
        finally:
            session.close()

    def run(self, cases: list[Case]) -> None:
        """All cases: the server's and the API's in their own tasks, the rest one task each."""
        self.total = len(cases)
        self.cases_dir.mkdir(parents=True, exist_ok=True)
        api = [c for c in cases if c.runner == "api"]
        server = [c for c in cases if c.runner == "server"]
        tasks: list[tuple[float, Callable[[], None]]] = [(1000.0, lambda: self.server_task(server))] if server else []
        for i in range(0, len(api), 12):
            folder = self.cases_dir / f"api-{i:02d}"
            batch = lambda b=api[i : i + 12], d=folder: [self.emit(r) for r in run_api_batch(b, self.work / "base", d)]  # noqa: E731
            tasks.append((100.0, batch))
        tasks += [
            (c.timeout, lambda c=c, i=i: self.command_task(c, i)) for i, c in enumerate(cases) if c.runner == "cmd"
        ]
        tasks.sort(key=lambda t: -t[0])  # the long ones first: the pool ends together
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            for f in [pool.submit(fn) for _, fn in tasks]:
                f.result()

    def report(self) -> str:
        """table.md, failures.md and summary.json from the records; the table is returned."""
        rows = []
        for name, spec in self.classes.items():
            recs = [r for r in self.records if r["class"] == name and "skipped" not in r]
            if recs:
                row = {"class": name, "cases": len(recs), "pattern": spec["pattern"]}
                row.update({c: sum(bool(r["flags"][c]) for r in recs) for c in COLUMNS})
                rows.append({**row, "behaved": sum(r["behaved"] for r in recs)})
        table = markdown_table(rows)
        skipped = [r for r in self.records if "skipped" in r]
        if skipped:
            shown = "; ".join(f"{r['class']}/{r['name']} ({r['skipped'][:80]})" for r in skipped[:10])
            table += f"\n{len(skipped)} cases skipped: {shown}\n"
        (self.out / "table.md").write_text(table, encoding="utf-8")
        (self.out / "failures.md").write_text(failures_markdown(self.records, list(self.classes)), encoding="utf-8")
        summary = {"rows": rows, "skipped": len(skipped), "cases": len(self.records)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return table


def failures_markdown(records: list[dict], classes: list[str], per_class: int = 3) -> str:
    """Up to ``per_class`` failing cases per class and column: the command and what happened."""
    lines = ["# Hostile review: failing cases (examples)", ""]
    for name in classes:
        bad = [r for r in records if r["class"] == name and "skipped" not in r and not r["behaved"]]
        if bad:
            lines += [f"## {name} ({len(bad)} failing)", ""]
            for column in COLUMNS:
                for r in [r for r in bad if r["flags"][column]][:per_class]:
                    what = (
                        r["traceback"]
                        or "; ".join(r["damage"] + r["problems"])
                        or " / ".join(r.get("stderr_tail", [])[-1:])
                    )
                    lines.append(f"- **{column}** `{r['name']}`: `{r['command'][:300]}` — {what[:400]}")
            lines.append("")
    return "\n".join(lines) + "\n"


def list_cases(cases: list[Case]) -> int:
    """``--list``: a case a line, ``class/name``, what it expects and how a user would try it."""
    with contextlib.suppress(BrokenPipeError):  # `| head`
        for c in cases:
            shown = display_command(c) if c.runner == "cmd" else c.note or c.extra.get("scenario") or "request"
            print(f"{c.ident}\t{c.expect}\t{shown}")
    print(f"{len(cases)} cases", file=sys.stderr)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", help="workspace folder, prepared once (default: a new temporary folder)")
    p.add_argument("--out", default=str(REPO / "runs" / "hostile_review"), help="results folder")
    p.add_argument("--jobs", type=int, default=2, help="cases at once (default 2)")
    p.add_argument("--classes", help="comma-separated classes (see --list)")
    p.add_argument("--limit", type=int, help="at most N cases per class (evenly spread)")
    p.add_argument("--keep", action="store_true", help="keep the folders of cases that behaved")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--report", action="store_true", help="only rebuild table.md and failures.md from <out>/cases.jsonl")
    p.add_argument("--api-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.api_worker:
        return api_worker(args.api_worker)
    known = load_classes()
    classes = args.classes.split(",") if args.classes else None
    unknown = [c for c in classes or [] if c not in known]
    if unknown:
        p.error(f"unknown classes {unknown}; choose from {', '.join(known)}")
    if args.report:  # e.g. after an interrupted run: the records written so far
        review = Review(Path(tempfile.gettempdir()), Path(args.out).resolve(), args.jobs, args.keep, known)
        review.records = _json_lines((Path(args.out) / "cases.jsonl").read_text(encoding="utf-8"))
        with contextlib.suppress(BrokenPipeError):  # `| head`
            print(review.report(), flush=True)
        return 0
    cases = all_cases(classes, args.limit)
    if args.list:
        return list_cases(cases)
    if os.geteuid() != 0:
        p.error("run as root: the review makes device nodes, mounts tmpfs folders and drops capabilities")
    work = Path(args.work or tempfile.mkdtemp(prefix="hostile_review_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "cases.jsonl").write_text("")
    fixtures.prepare_workspace(work)
    shutil.rmtree(work / "cases", ignore_errors=True)
    review = Review(work, out, args.jobs, args.keep, known)
    start = time.time()
    log(f"{len(cases)} cases, {args.jobs} at once; results in {out}")
    review.run(cases)
    print(review.report())
    log(f"done in {time.time() - start:.0f} s: {out / 'table.md'}, {out / 'failures.md'}, {out / 'cases.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
