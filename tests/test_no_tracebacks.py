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

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

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


# ----------------------------------------------------------------------------- found by the hostile review


def test_dev_stdout_appended_to_a_file_keeps_what_the_file_held(src, tmp_path):
    """``-json /dev/stdout >> log.txt``: /dev/stdout resolves to log.txt itself; renaming a new file
    over it erased the log. It is written through the open descriptor instead."""
    log = tmp_path / "log.txt"
    log.write_text("earlier lines\n", encoding="utf-8")
    with open(log, "ab") as out:
        proc = run([*EVALUATE, "-hyp", str(src), "-ref", str(src), "-json", "/dev/stdout"], stdout=out)
    assert proc.returncode == 0, proc.stderr
    text = log.read_text(encoding="utf-8")
    assert text.startswith("earlier lines\n") and '"bleu"' in text


def test_results_printed_to_a_closed_stdout_are_an_error(src):
    one_line_error(run([*EVALUATE, "-hyp", str(src), "-ref", str(src)], stdout=None, preexec_fn=_close_stdout), ">&-")


def test_inputs_that_are_devices_or_folders_or_garbage(model, src, tmp_path, toy_dir, capsys):
    """Each reader reports what is wrong with its input in one line; those reading a device run in
    their own process under a memory cap, the others in this one (through ``main``)."""
    from onmt_doc.bin import evaluate, gate_analysis, make_toy_corpus, train, translate

    folder = tmp_path / "folder"
    folder.mkdir()
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    lexicon = tmp_path / "lexicon.tsv"
    lexicon.write_bytes(b"house\tHaus\nbad\t\xff\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("train: " + "[" * 100_000 + "\n", encoding="utf-8")
    config = write_config(tiny_config(toy_dir, tmp_path / "run"), tmp_path / "c.yaml")
    devices = [
        ([*module_cmd("onmt_doc.bin.train"), "-config", "/dev/zero"], "larger than"),
        ([*EVALUATE, "-model", model, "-suite", "/dev/zero"], "/dev/zero"),
        ([*module_cmd("onmt_doc.bin.make_toy_corpus"), "score", "--hyp", "/dev/zero", "--ctx", "/dev/zero"], "line"),
    ]
    for args, needle in devices:
        one_line_error(run(args, preexec_fn=_memory_cap), needle)
    in_process = [
        (train.main, ["-config", str(folder)], "is a directory"),
        (train.main, ["-config", str(deep)], "nested too deeply"),
        (train.main, ["-config", str(config), "data.valid.src=/dev/zero"], "not a regular file"),
        (train.main, ["-config", str(config), "vocab.size=1000000000000"], "vocab.size"),
        (translate.main, ["-model", str(folder), "-src", str(src)], "is a directory"),
        (evaluate.main, ["-hyp", str(src), "-ref", str(src), "-lexicon", str(lexicon)], "lexicon.tsv:2"),
        (make_toy_corpus.main, ["--out", str(tmp_path / "t"), "--train-docs", "1000000000000"], "10,000,000"),
        (
            gate_analysis.main,
            ["-model", model, "-src", str(src), "-tgt", str(src), "-table", str(empty)],
            "not a PMI table",
        ),
    ]
    for command, args, needle in in_process:
        status = command(args)
        err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]
        assert status == 1 and len(err) == 1 and needle in err[0], (args, err)


def test_a_subword_model_that_is_not_one_is_refused_by_the_importer(tmp_path):
    from hostile.fixtures import onmt_opt, onmt_state, write_onmt

    sd, gen = onmt_state()
    ckpt = write_onmt(tmp_path / "onmt.pt", sd, gen, onmt_opt())
    garbage = tmp_path / "random.model"
    garbage.write_bytes(os.urandom(4096))
    importer = [*module_cmd("onmt_doc.bin.import_opennmt"), "-model", str(ckpt), "-output", str(tmp_path / "m.pt")]
    one_line_error(run([*importer, "-src_subword_model", str(garbage)]), "is not a bpe model")
    one_line_error(run([*importer, "-src_subword_model", "/dev/zero"], preexec_fn=_memory_cap), "larger than")
    assert not (tmp_path / "m.pt").exists()


def test_a_checkpoint_whose_weights_do_not_fit_its_config(trained_run, src, tmp_path):
    """Valid checksums, a stored config of another width: one line in the commands and the API,
    and averaging refuses it instead of writing a broken average."""
    import torch

    from onmt_doc import Translator
    from onmt_doc.errors import UserError
    from onmt_doc.models.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(str(trained_run / "checkpoints" / "last.pt"))
    ckpt["config"]["model"]["d_model"] = 32
    ckpt.pop("format_version")
    bad = tmp_path / "bad.pt"
    save_checkpoint(ckpt, str(bad))
    one_line_error(translate(str(bad), str(src)), "weights do not match the stored config", "size mismatch")
    with pytest.raises(UserError, match="weights do not match"):
        Translator.load(str(bad))
    average = module_cmd("onmt_doc.bin.average_checkpoints")
    good = str(trained_run / "checkpoints" / "last.pt")
    one_line_error(run([*average, "-models", str(bad), good, "-output", str(tmp_path / "avg.pt")]), "do not match")
    assert not (tmp_path / "avg.pt").exists()
    (tmp_path / "checkpoints").mkdir()
    out = tmp_path / "checkpoints" / "step_99.pt"
    one_line_error(run([*average, "-models", good, good, "-output", str(out)]), "training checkpoints")
    assert not out.exists() and torch.load(good, weights_only=True)


def test_a_damaged_binarized_cache_is_binarized_again(toy_dir, tmp_path, warnings_of_onmt_doc):
    from onmt_doc.config import config_from_dict
    from onmt_doc.data.prepare import build_codec, load_examples

    cfg = config_from_dict(tiny_config(toy_dir, tmp_path / "run"))
    codec = build_codec(cfg.data, cfg.vocab, cfg.log.dir)
    first, _ = load_examples(cfg.data, codec, cfg.data.train.src, cfg.data.train.tgt, "sentence", cfg.log.dir)
    expected = [e.src.tolist() for e in first]  # read before the file it maps is cut
    (cache,) = (tmp_path / "run" / "cache").glob("*/src.ids")
    cache.write_bytes(cache.read_bytes()[:1000])
    again, _ = load_examples(cfg.data, codec, cfg.data.train.src, cfg.data.train.tgt, "sentence", cfg.log.dir)
    assert [e.src.tolist() for e in again] == expected
    assert f"{cache}: binarized cache not as written (" in warnings_of_onmt_doc.text
    assert "binarizing the corpus again" in warnings_of_onmt_doc.text
