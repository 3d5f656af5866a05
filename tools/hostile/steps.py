"""The words cases.yaml is written in: a case's setup steps (``[put, out.dat, "text"]``), the byte
transforms ``derive`` and ``make`` apply, and the checks a case adds to the common judgement
(``[message_has, director, why]``). Each is a small function registered by name; the runner
(tools/hostile_review.py) looks the names up, so a new word is a function here and a new case is a
line there.

Text arguments are YAML strings of which each character is one byte (``"\\xff\\xfe"`` is FF FE), or
lists of parts, a part being such a string or ``[string, count]`` (``[["[", 100000]]``: 100,000
brackets)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import random
import re
import shutil
import socket
import stat
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from hostile import fixtures

REPO = Path(__file__).resolve().parents[2]
REFUSE, SUCCEED, EITHER = "refuse", "succeed", "either"
COLUMNS = ("damaged", "traceback", "stall", "accepted_invalid", "other")
PRECIOUS = b"precious old output: must survive a failed run\n"  # a user's file: [keep, REL], [mkdir, REL, FILE]
RSS_LIMIT_MB = 1500  # more than this on an endless or huge input counts as "ate memory"
LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d( [A-Z]+)?\]")
NOISE = (re.compile(r"^no pair has frequency >= \d+\. Stopping"),)  # the BPE learner's documented line


# ----------------------------------------------------------------------------- a case and its run


@dataclass
class Check:
    """An extra rule of one case: ``fn(ctx) -> problem or None``; ``kind`` is the column it fills;
    ``prepare(ctx)``, if any, runs after the setup (to remember what must not change)."""

    kind: str  # "damaged" or "other"
    fn: Callable[["Ctx"], Optional[str]]
    prepare: Optional[Callable[["Ctx"], None]] = None


@dataclass
class Case:
    """One hostile case: a command run in a fresh folder (or an API call, or an HTTP request)."""

    cls: str
    name: str
    argv: list[str] = field(default_factory=list)  # a console script and its arguments; {CASE} = the folder
    expect: str = REFUSE
    needs: tuple[str, ...] = ()  # workspace entries copied into the case folder
    outputs: tuple[str, ...] = ()  # globs that may change when the command succeeds
    setup: tuple[tuple[str, tuple], ...] = ()  # (step name, arguments), in order
    stdin: str = "devnull"  # devnull | closed | endless | file:PATH
    stdout: str = "file"  # file | closed | pipe | broken_pipe | append:PATH | path:PATH
    drop_caps: bool = False
    timeout: float = 90.0
    checks: tuple[Check, ...] = ()
    note: str = ""
    fifo: Optional[str] = None  # a FIFO in the folder the harness reads while the command runs
    specials: tuple[str, ...] = ()  # absolute device paths whose type must not change
    replaced: tuple[str, ...] = ()  # globs of the toolkit's own files it may rebuild whole on success (a cache)
    runner: str = "cmd"  # cmd | api | server
    extra: dict = field(default_factory=dict)  # env, server_start; an API case's code; a request; a scenario

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
    argv: list[str] = field(default_factory=list)  # the case's arguments, {PORT} filled by a setup step

    def stdout_bytes(self) -> bytes:
        """What the command wrote to its captured stdout (empty when not captured)."""
        return self.capture.read_bytes() if self.capture.exists() else b""


class Unsupported(Exception):
    """This machine cannot set up the case (no tmpfs, no Marian folder): the case is skipped and said so."""


def data(text: Any) -> bytes:
    """Bytes of a text argument (module docstring): one byte per character, parts repeated."""
    if isinstance(text, str):
        return text.encode("latin-1")
    return b"".join(data(p[0]) * int(p[1]) if isinstance(p, list) else data(p) for p in text)


def error_lines(stderr: str) -> list[str]:
    """The stderr lines a refusal is judged on: everything but progress/log lines and known noise,
    since the contract allows progress lines before the one error line."""
    return [
        line
        for line in stderr.splitlines()
        if line.strip() and not LOG_LINE.match(line) and not any(n.match(line) for n in NOISE)
    ]


def has_traceback(stderr: str, rc: Optional[int], timed_out: bool) -> bool:
    """A bug, not a refusal: a Python traceback, a fatal interpreter error or a death by signal
    (our own kill after a timeout excepted)."""
    if "Traceback (most recent call last)" in stderr or "Fatal Python error" in stderr:
        return True
    return rc is not None and rc < 0 and not timed_out


def count_lines(content: bytes) -> int:
    """Lines as the toolkit counts them: ``\\n``-terminated, a last line without one counted too."""
    if not content:
        return 0
    return content.count(b"\n") + (0 if content.endswith(b"\n") else 1)


# ----------------------------------------------------------------------------- byte transforms and makers


def _source(ctx: Ctx, rel: str) -> Path:
    """A file of the case folder, else of the workspace (a hostile variant of a good file)."""
    return ctx.dir / rel if (ctx.dir / rel).exists() else ctx.work / "base" / rel


def _npz(content: bytes, key: str, op: str, arg: int = 0) -> bytes:
    """A PMI table with one array changed (``reverse``, ``add`` arg, ``negate``), saved again (CRCs valid)."""
    import numpy as np

    arrays = dict(np.load(io.BytesIO(content)))
    a = arrays[key]
    arrays[key] = {"reverse": lambda: a[::-1].copy(), "add": lambda: a + arg, "negate": lambda: -a}[op]()
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def _swap_lines(content: bytes, a: int = 10) -> bytes:
    """Lines ``a`` and ``a + 1`` swapped: same size, other ids for two tokens."""
    lines = content.split(b"\n")
    lines[a], lines[a + 1] = lines[a + 1], lines[a]
    return b"\n".join(lines)


def _random_bytes(rnd: random.Random, n: int) -> bytes:
    return bytes(rnd.randrange(256) for _ in range(n))


TRANSFORMS: dict[str, Callable[..., bytes]] = {  # [derive, REL, SRC, name, args...]: name(bytes of SRC, *args)
    "empty": lambda d: b"",
    "insert_in_line": lambda d, junk, line=2: fixtures.insert_in_line(d, data(junk), line),
    "drop_line": fixtures.drop_line,
    "append": lambda d, text: d + data(text),
    "prefix": lambda d, text: data(text) + d,
    "cr_only": lambda d: d.replace(b"\n", b"\r"),
    "first_half": lambda d: d[: len(d) // 2],
    "zeros": lambda d: bytes(len(d)),
    "random_bytes": lambda d, seed, n: _random_bytes(random.Random(seed), n),
    "flip_middle": fixtures.flip_middle,
    "evil_zip": fixtures.evil_zip,
    "swap_lines": _swap_lines,
    "npz": _npz,
}


def _config_with(path: str, value: Any) -> bytes:
    """The tiny config with ``path`` (dotted, list indexes as numbers) set to ``value`` in the file."""
    import yaml

    cfg = yaml.safe_load(fixtures.tiny_config("cfgrun", max_steps=2))
    node: Any = cfg
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    node[int(keys[-1]) if isinstance(node, list) else keys[-1]] = value
    return yaml.safe_dump(cfg, sort_keys=False).encode()


def _config_replace(old: str, new: str) -> bytes:
    """The tiny config (log.dir cfgrun, 2 steps) with ``old`` replaced once by ``new`` (a key twice, a tag)."""
    text = fixtures.tiny_config("cfgrun", max_steps=2)
    if old not in text:
        raise ValueError(f"{old!r} is not in the tiny config")
    return text.replace(old, new, 1).encode()


MAKERS: dict[str, Callable[..., bytes]] = {  # [make, REL, name, args...]: a file made from nothing
    "tiny_config": lambda log_dir, max_steps=10: fixtures.tiny_config(log_dir, max_steps=max_steps).encode(),
    "config_with": _config_with,
    "config_replace": _config_replace,
    "evil_pickle": fixtures.evil_pickle,
    "json": lambda value: json.dumps(value).encode(),
}


# ----------------------------------------------------------------------------- setup steps


def put(ctx: Ctx, rel: str, text: Any) -> None:
    """Write the bytes of ``text`` to ``rel`` in the case folder (parents made)."""
    p = ctx.dir / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data(text) if not isinstance(text, bytes) else text)


def keep(ctx: Ctx, rel: str) -> None:
    """A user's file (or an existing output) that must survive: PRECIOUS bytes."""
    put(ctx, rel, PRECIOUS)


def derive(ctx: Ctx, rel: str, src: str, how: str, *args: Any) -> None:
    """Write ``TRANSFORMS[how](bytes of src, *args)`` to ``rel``: a hostile variant of a good file."""
    put(ctx, rel, TRANSFORMS[how](_source(ctx, src).read_bytes(), *args))


def make(ctx: Ctx, rel: str, how: str, *args: Any) -> None:
    """Write ``MAKERS[how](*args)`` to ``rel`` (a config, a malicious pickle)."""
    put(ctx, rel, MAKERS[how](*args))


def copy(ctx: Ctx, rel: str, src: str) -> None:
    """A copy of a case (or workspace) file under another name (never a link)."""
    p = ctx.dir / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_source(ctx, src), p)


def symlink(ctx: Ctx, rel: str, target: str) -> None:
    """A symbolic link ``rel`` -> ``target`` (target as written, relative to the link's folder)."""
    p = ctx.dir / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, p)


def hardlink(ctx: Ctx, rel: str, target: str) -> None:
    """A hard link ``rel`` to the case file ``target``: same inode, another name."""
    os.link(ctx.dir / target, ctx.dir / rel)


def mkdir(ctx: Ctx, rel: str, *files: str) -> None:
    """A folder, with user files (PRECIOUS) in it that must survive."""
    p = ctx.dir / rel
    p.mkdir(parents=True, exist_ok=True)
    for f in files:
        (p / f).write_bytes(PRECIOUS)


def chmod(ctx: Ctx, rel: str, mode: Any) -> None:
    """Change a file's or folder's mode, written in octal digits (``555``, ``0``)."""
    os.chmod(ctx.dir / rel, int(str(mode), 8))


def node(ctx: Ctx, rel: str, minor: int) -> None:
    """A private character device (1, minor): 7 is /dev/full, 3 is /dev/null; private so that a
    command replacing its output device replaces a node in the case folder, not the machine's."""
    os.mknod(ctx.dir / rel, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    os.chmod(ctx.dir / rel, 0o666)


def fifo(ctx: Ctx, rel: str) -> None:
    """A named pipe; the runner reads it while the command runs (the case's ``fifo``)."""
    os.mkfifo(ctx.dir / rel)


def remove(ctx: Ctx, rel: str) -> None:
    """Remove a copied file (to put something else in its place)."""
    os.remove(ctx.dir / rel)


def move(ctx: Ctx, rel: str, dest: str) -> None:
    """Rename a case file (a damaged checkpoint put where the command finds it: a run's last.pt)."""
    os.replace(ctx.dir / rel, ctx.dir / dest)


def requires(ctx: Ctx, rel: str) -> None:
    """The workspace folder ``rel`` was copied (the Marian folders need sentencepiece and safetensors)."""
    if not (ctx.dir / rel).is_dir():
        raise Unsupported(f"no {rel} folder in the workspace (needs sentencepiece and safetensors)")


def json_set(ctx: Ctx, rel: str, key: str, value: Any) -> None:
    """One key of a JSON object file set (a Marian config.json value of the wrong type)."""
    p = ctx.dir / rel
    p.write_text(json.dumps({**json.loads(p.read_text()), key: value}))


def download_record(ctx: Ctx, folder: str, name: str, flip: bool = False) -> None:
    """The download record huggingface-cli leaves for ``name`` (its sha256), the file then flipped."""
    f = ctx.dir / folder
    digest = hashlib.sha256((f / name).read_bytes()).hexdigest()
    records = f / ".cache" / "huggingface" / "download"
    records.mkdir(parents=True)
    (records / f"{name}.metadata").write_text(f"{'0' * 40}\n{digest}\n1700000000.0\n")
    if flip:
        content = bytearray((f / name).read_bytes())
        content[-9] ^= 0x20
        (f / name).write_bytes(bytes(content))


def nan_weight(ctx: Ctx, folder: str) -> None:
    """A NaN in one tensor of ``folder``/model.safetensors (saved again, so it reads as intact)."""
    code = (
        "from safetensors.torch import load_file, save_file; t = load_file('model.safetensors'); "
        "k = sorted(t)[3]; t[k].view(-1)[0] = float('nan'); save_file(t, 'model.safetensors')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ctx.dir / folder, check=True, env=fixtures.env())


def _reseal(folder: Path, name: str, array: Any) -> None:
    """Replace a cache file by ``array`` with meta.json's CRC-32 to match: what only the bounds catch."""
    array.tofile(folder / name)
    meta = json.loads((folder / "meta.json").read_text())
    key = {"src.ids": "src", "tgt.ids": "tgt", "src.offsets": "src_offsets", "tgt.offsets": "tgt_offsets"}[name]
    meta["crc32"][key] = zlib.crc32((folder / name).read_bytes())
    (folder / "meta.json").write_text(json.dumps(meta))


def _ids(f: Path, name: str, dtype: str) -> Any:
    import numpy as np

    return np.fromfile(f / name, dtype)


CACHE_DAMAGES: dict[str, Callable[[Path], Any]] = {  # [cache, name]: a mapped cache folder damaged so
    "ids-overwritten-same-size": lambda f: (f / "src.ids").write_bytes(bytes((f / "src.ids").stat().st_size)),
    "ids-one-byte-flipped": lambda f: (f / "tgt.ids").write_bytes(b"\x05" + (f / "tgt.ids").read_bytes()[1:]),
    "ids-outside-vocab-resealed": lambda f: _reseal(f, "src.ids", _ids(f, "src.ids", "<i4") + 10**6),
    "offsets-reversed-resealed": lambda f: _reseal(f, "tgt.offsets", _ids(f, "tgt.offsets", "<i8")[::-1]),
    "meta-nested-deep": lambda f: (f / "meta.json").write_text("[" * 100_000),
    "meta-is-dev-zero": lambda f: ((f / "meta.json").unlink(), (f / "meta.json").symlink_to("/dev/zero")),
    "doc-offsets-a-folder": lambda f: ((f / "doc.offsets").unlink(), (f / "doc.offsets").mkdir()),
}


def cache(ctx: Ctx, damage: str) -> None:
    """Damage the run's mapped cache of the training corpus (the folder with the larger ids) as named."""
    folders = sorted((ctx.dir / "run" / "cache").glob("*/src.ids"), key=lambda p: p.stat().st_size)
    CACHE_DAMAGES[damage](folders[-1].parent)


def lock(ctx: Ctx, rel: str) -> None:
    """Hold the run folder's flock as another training would (released when the case ends)."""
    fd = os.open(ctx.dir / rel, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": "now", "command": "hostile_review"}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    ctx.state["lock_fd"] = fd


def busy_port(ctx: Ctx) -> None:
    """A port taken by another listener, given to the command as ``{PORT}`` (freed when the case ends)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    ctx.state["busy"] = s
    ctx.argv = [a.replace("{PORT}", str(s.getsockname()[1])) for a in ctx.argv]


def tmpfs(ctx: Ctx, rel: str, size_kb: int, free_kb: int, before: list = ()) -> None:
    """Mount a ``size_kb`` tmpfs at ``rel``, run the steps ``before`` (existing outputs), then fill it
    to ``free_kb`` free: a disk that fills up while the command writes (unmounted when the case ends)."""
    p = ctx.dir / rel
    p.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(p)], capture_output=True)
    if r.returncode != 0:
        raise Unsupported(f"cannot mount a tmpfs: {r.stderr.decode(errors='replace').strip()}")
    ctx.state.setdefault("mounts", []).append(p)
    run_steps(ctx, [(s[0], tuple(s[1:])) for s in before])
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


STEPS: dict[str, Callable[..., None]] = {
    f.__name__: f
    for f in (put, keep, derive, make, copy, symlink, hardlink, mkdir, chmod, node, fifo, remove, move, requires)
    + (json_set, download_record, nan_weight, cache, lock, busy_port, tmpfs)
}


def run_steps(ctx: Ctx, steps: Any) -> None:
    """Run (name, arguments) steps in order."""
    for name, args in steps:
        STEPS[name](ctx, *args)


def release(ctx: Ctx) -> None:
    """Undo what steps hold while the command runs: the lock, the taken port, the tmpfs mounts."""
    if "lock_fd" in ctx.state:
        os.close(ctx.state.pop("lock_fd"))
    with contextlib.suppress(KeyError):
        ctx.state.pop("busy").close()
    for p in ctx.state.pop("mounts", []):
        subprocess.run(["umount", "-l", str(p)], capture_output=True)


# ----------------------------------------------------------------------------- checks


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
        content = _read(ctx, src)
        want = {count_lines(content)}
        if cr_ok:
            want.add(count_lines(content.replace(b"\r", b"\n")))
        got = count_lines(_read(ctx, out))
        return None if got in want else f"{out}: {got} lines for {sorted(want)} source lines (data lost)"

    return Check("damaged", fn)


def _refusal(ctx: Ctx) -> Optional[str]:
    """The error lines of a refusal; None when the command did not refuse (nothing to check)."""
    if ctx.rc in (0, None) or has_traceback(ctx.stderr, ctx.rc, False):
        return None
    return "\n".join(error_lines(ctx.stderr))


def message_has(pattern: str, why: str, says: bool = True) -> Check:
    """On a refusal the error line must say ``pattern`` (case-insensitive), e.g. "directory"; with
    ``says`` false it must not."""

    def fn(ctx: Ctx) -> Optional[str]:
        text = _refusal(ctx)
        if text is None or bool(re.search(pattern, text, re.I)) == says:
            return None
        return f"{why}: {text[-200:]!r}"

    return Check("other", fn)


def message_lacks(pattern: str, why: str) -> Check:
    """On a refusal the error line must not say ``pattern`` (an allocation failure instead of a check)."""
    return message_has(pattern, why, says=False)


def dup_pattern(key: str) -> str:
    """What a duplicate-key error must say: the key, and two line numbers (``x.yaml:7: duplicate key
    'model.d_model' (first at line 6)``)."""
    return rf"(?s)(?=.*\b{key}\b)(?=.*\d+\D+\d+)"


def duplicate_named(key: str) -> Check:
    """A duplicate-key refusal names ``key`` and both line numbers."""
    return message_has(dup_pattern(key), f"duplicate '{key}' not named with both line numbers")


def no_marker() -> Check:
    """A malicious pickle or YAML tag creates PWNED when it runs: code execution is damage."""

    def fn(ctx: Ctx) -> Optional[str]:
        return "the malicious payload ran (PWNED created)" if (ctx.dir / fixtures.PWNED).exists() else None

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


def starts_with(rel: str, prefix: bytes = PRECIOUS) -> Check:
    """A file opened for appending (``>>``) keeps what it held: replacing it loses data."""

    def fn(ctx: Ctx) -> Optional[str]:
        return (
            None
            if _read(ctx, rel).startswith(prefix)
            else f"{rel}: its earlier content is gone (the file was replaced)"
        )

    return Check("damaged", fn)


def exists(pattern: str, why: str) -> Check:
    """On success a file matching ``pattern`` must exist (e.g. the backup -force promises)."""

    def fn(ctx: Ctx) -> Optional[str]:
        if ctx.rc != 0:
            return None
        return None if list(ctx.dir.glob(pattern)) else why

    return Check("other", fn)


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


def repo_unchanged(rel: str) -> Check:
    """The repository's own folder ``rel`` is as it was: the benchmark runner's cases name real
    folders of the repository, which the case folder's snapshot misses."""

    def tree() -> dict:  # the folder's own entries: where a run folder's run.json, results.jsonl and stages go
        folder = REPO / rel
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "" for p in folder.iterdir()}

    def prepare(ctx: Ctx) -> None:
        ctx.state[rel] = tree()

    def fn(ctx: Ctx) -> Optional[str]:
        return None if tree() == ctx.state[rel] else f"the repository's {rel or '.'} changed"

    return Check("damaged", fn, prepare)


CHECKS: dict[str, Callable[..., Check]] = {
    f.__name__: f
    for f in (same_lines, message_has, message_lacks, duplicate_named, no_marker, rss_below, starts_with, exists)
    + (unchanged, stderr_has, repo_unchanged)
}
