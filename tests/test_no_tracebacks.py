"""Issue 27, part 4: a user's mistake, a closed or full output, or a hostile input is one line on
stderr and a non-zero exit, never a traceback, and never memory eaten by a line without end.

Each case runs the installed command in a fresh interpreter with the file descriptors a shell
would give it (closed stdout ``>&-``, ``> /dev/full``, a pipe closed by its reader, closed stdin).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import module_cmd, tiny_config, write_config

TRANSLATE = module_cmd("onmt_doc.bin.translate")
EVALUATE = module_cmd("onmt_doc.bin.evaluate")
BUILD_VOCAB = module_cmd("onmt_doc.bin.build_vocab")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(args, env=ENV, stderr=subprocess.PIPE, timeout=300, **kw)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.decode("utf-8", "replace").strip()
    lines = [line for line in err.splitlines() if not line.startswith("[")]  # log lines
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in err, (proc.returncode, err)
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def model(trained_run) -> str:
    return str(trained_run / "checkpoints" / "last.pt")


@pytest.fixture(scope="module")
def src(tmp_path_factory, toy_dir) -> Path:
    path = tmp_path_factory.mktemp("src") / "test.src"
    path.write_text((toy_dir / "test.src").read_text(encoding="utf-8").split("\n\n")[0] + "\n", encoding="utf-8")
    return path


def translate(model: str, src: str, *extra: str, **kw) -> subprocess.CompletedProcess:
    return run([*TRANSLATE, "-model", model, "-src", src, "-beam", "1", *extra], **kw)


# ----------------------------------------------------------------------------- standard streams


def test_closed_stdout(model, src):
    one_line_error(translate(model, str(src), stdout=None, pass_fds=(), close_fds=True, preexec_fn=_close_stdout))


def _close_stdout() -> None:
    os.close(1)


def test_stdout_on_a_full_disk(model, src):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "wb") as full:
        one_line_error(translate(model, str(src), stdout=full), "no space left")
    with open("/dev/full", "wb") as full:
        one_line_error(run([*EVALUATE, "-hyp", str(src), "-ref", str(src)], stdout=full), "No space left")


def test_stdout_closed_by_its_reader(model, src):
    """``onmt_doc_translate … | head -c 1``: the output is incomplete, so the exit status says so."""
    big = src.parent / "big.src"
    big.write_text((src.read_text(encoding="utf-8") + "\n") * 600, encoding="utf-8")  # more than a pipe holds
    proc = subprocess.Popen(
        [*TRANSLATE, "-model", model, "-src", str(big), "-beam", "1"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(300)
    one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, b"", err), "broken pipe")


def test_closed_stdin(model):
    one_line_error(translate(model, "-", stdin=None, preexec_fn=lambda: os.close(0)), "standard input is closed")


# ----------------------------------------------------------------------------- lines without end


def _memory_cap() -> None:
    """2 GB of address space: a reader that keeps a line without end in memory dies here."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_device_without_line_ends_is_refused_not_read_whole(model):
    one_line_error(translate(model, "/dev/zero", preexec_fn=_memory_cap), "/dev/zero:1", "line longer")


def test_an_endless_line_on_stdin_is_refused(model):
    proc = subprocess.Popen(
        [*TRANSLATE, "-model", model, "-src", "-", "-beam", "1", "-max_line_chars", "0"],
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_memory_cap,
    )

    def feed() -> None:
        try:
            chunk = b"a" * (1 << 20)
            for _ in range(4096):  # 4 GB, more than the cap, if nobody stops reading
                proc.stdin.write(chunk)
        except (BrokenPipeError, ValueError, OSError):
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    err = proc.stderr.read()
    proc.wait(300)
    one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, b"", err), "<stdin>:1", "line longer")


# ----------------------------------------------------------------------------- files a user cannot read


def test_a_folder_given_as_a_file_is_called_a_folder(model, tmp_path):
    one_line_error(translate(model, str(tmp_path)), "is a directory")
    one_line_error(run([*EVALUATE, "-hyp", str(tmp_path), "-ref", str(tmp_path)]), "is a directory")


def without_root_override(args: list[str]) -> list[str]:
    """Run ``args`` so that file permissions apply even to root (CI runs as root): drop the
    capabilities that let root read and write any file."""
    if os.geteuid() != 0:
        return args
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("running as root without setpriv: permissions cannot be tested")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search", *args]


def test_a_file_without_read_permission(tmp_path):
    secret = tmp_path / "secret.src"
    secret.write_text("hello\n", encoding="utf-8")
    secret.chmod(0o000)
    one_line_error(
        run(without_root_override([*EVALUATE, "-hyp", str(secret), "-ref", str(secret)])), "permission denied"
    )


def test_lone_surrogates_are_invalid_utf8_in_files(model, tmp_path):
    path = tmp_path / "x.src"
    path.write_bytes(b"good line\nbad \xed\xa0\x80 line\n")
    one_line_error(translate(model, str(path)), "x.src:2", "invalid UTF-8")


def test_lone_surrogates_and_bad_arguments_through_the_api(model):
    from onmt_doc import Translator
    from onmt_doc.errors import UserError

    for bad in (None, [], [None], 3):
        with pytest.raises(UserError, match="Translator.load: expected a checkpoint path"):
            Translator.load(bad)
    translator = Translator.load(model, beam=1)
    with pytest.raises(UserError, match=r"documents\[0\]\[1\]: column 5 holds a lone surrogate U\+D800"):
        translator.translate([["fine", "bad \ud800"]])


# ----------------------------------------------------------------------------- checked before slow work


def test_a_missing_validation_file_is_found_before_learning_subwords(toy_dir, tmp_path):
    run_dir = tmp_path / "run"
    cfg = tiny_config(toy_dir, run_dir)
    cfg["data"]["valid"]["tgt"] = str(tmp_path / "missing.tgt")
    config = write_config(cfg, tmp_path / "c.yaml")
    one_line_error(run([*BUILD_VOCAB, "-config", str(config)]), "data.valid.tgt", "missing.tgt", "not found")
    assert not (run_dir / "subword.model").exists() and not (run_dir / "vocab.txt").exists()
