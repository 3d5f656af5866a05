"""Issue 42: every reader verifies what it reads, every number from a user has a bound.

The readers' own tests hold the cases of each format (the mapped cache in test_mapped_corpus.py,
Marian and OpenNMT-py imports in test_import_*.py, PMI tables in test_context_gates.py, standard
input and output in test_translate_safety.py, the server in test_server.py, the benchmark runner
in test_benchmark_suite.py); here the mechanisms they share: worker and thread counts bounded by the
cores, JSON nesting, vocabularies checked against their digests, a pickle refusal in one sentence,
``translate_stream``'s items checked as ``translate``'s.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from test_translate_safety import TRANSFORMER, translator

from onmt_doc import devices, outputs
from onmt_doc.bin import translate
from onmt_doc.config import config_from_dict
from onmt_doc.data.prepare import build_codec, load_codec
from onmt_doc.data.workers import ordered_map
from onmt_doc.errors import ConfigError, DataError, UserError
from onmt_doc.models.checkpoint import load_checkpoint, save_checkpoint
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.hardware import set_threads

MANIFEST = "vocab.sha256"  # data/prepare.py's record of the codec files' digests

pytestmark = pytest.mark.integration  # learns vocabularies, starts processes


# ----------------------------------------------------------------------------- counts and depths


def test_worker_and_thread_counts_are_bounded_by_the_cores(toy_dir, tmp_path, capsys):
    """A typo of 10^6 workers started a million processes (or asked torch for a million threads)
    before anything else went wrong; now it is one line naming the key, before any work."""
    most = 8 * devices.cpu_cores()
    assert devices.check_count(most, "x") == most
    with pytest.raises(ConfigError, match=rf"^data\.workers {most + 1}: more than 8 per CPU core"):
        list(ordered_map(max, None, None, None, [(1, 2)], most + 1))  # even a one-task corpus
    cfg = config_from_dict(tiny_config(toy_dir, tmp_path / "run", data={"workers": 10**6}))
    with pytest.raises(ConfigError, match=r"^data\.workers 1000000: more than"):
        build_codec(cfg.data, cfg.vocab, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "vocab.txt").exists()  # refused before the subword model was learned
    cfg = config_from_dict(tiny_config(toy_dir, tmp_path / "run", train={"threads": 10**6}))
    with pytest.raises(ConfigError, match=r"^train\.threads 1000000: more than"):
        set_threads(cfg, DistContext())
    assert translate.main(["-model", "m.pt", "-src", "x", "-threads", str(10**6)]) == 1
    assert "-threads 1000000: more than 8 per CPU core" in capsys.readouterr().err


def test_json_nesting_is_bounded(tmp_path):
    """The parser's own limit is a RecursionError near 1000 levels (a traceback), and code walking
    a value nested that deep fails later: a user's JSON is refused past 64 levels, in one line."""
    value = outputs.parse_json("[" * 64 + "]" * 64, "x.json")
    for _ in range(63):
        (value,) = value
    assert value == []
    for depth in (65, 100_000):
        with pytest.raises(DataError, match=r"^x\.json: JSON nested more than 64 deep"):
            outputs.parse_json("[" * depth + "]" * depth, "x.json")
    from onmt_doc.translate.ctranslate2_engine import INFO_FILE, read_export

    (tmp_path / INFO_FILE).write_text("[" * 100_000)  # an export's description (-engine ctranslate2)
    with pytest.raises(DataError, match=f"{INFO_FILE}: JSON nested more than 64 deep"):
        read_export(str(tmp_path))
    with pytest.raises(DataError, match=r"^x\.json: not UTF-8 text"):
        outputs.parse_json(b'{"a": "\xff"}', "x.json")
    with pytest.raises(DataError, match=r"^x\.json: not valid JSON"):
        outputs.parse_json("{", "x.json")


# ----------------------------------------------------------------------------- vocabularies


def test_a_vocabulary_changed_since_it_was_written_is_refused(toy_dir, tmp_path):
    """The run's checkpoints and cache mean the tokens of the vocabulary as written; vocab.sha256
    (sha256sum's format) records it, and every reader of the run folder checks it."""
    cfg = config_from_dict(tiny_config(toy_dir, tmp_path / "run"))
    run = tmp_path / "run"
    build_codec(cfg.data, cfg.vocab, str(run))
    assert sorted((run / MANIFEST).read_text().split()[1::2]) == ["subword.model", "vocab.txt"]
    assert load_codec(cfg.vocab, str(run)) is not None
    vocab = (run / "vocab.txt").read_text(encoding="utf-8").split("\n")
    vocab[10], vocab[11] = vocab[11], vocab[10]  # two tokens swapped: same size, other ids
    (run / "vocab.txt").write_text("\n".join(vocab), encoding="utf-8")
    with pytest.raises(UserError, match=r"vocab\.txt: changed since it was written \(its sha256 differs"):
        load_codec(cfg.vocab, str(run))
    (run / MANIFEST).unlink()  # the documented way to take a changed file as it is
    assert load_codec(cfg.vocab, str(run)).tgt_vocab.itos[10] == vocab[10]


def test_a_forced_new_vocabulary_keeps_the_old_ones_digests_with_its_backup(toy_dir, tmp_path):
    """build_vocab -force over a run with checkpoints keeps the old files as <name>.backup-<time>:
    their record goes with them, so a backup put back is checked like the original."""
    from onmt_doc.data.prepare import save_codec

    cfg = config_from_dict(tiny_config(toy_dir, tmp_path / "run"))
    run = tmp_path / "run"
    codec = build_codec(cfg.data, cfg.vocab, str(run))
    old = {name: (run / name).read_bytes() for name in ("vocab.txt", "subword.model", MANIFEST)}
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step_1.pt").write_bytes(b"a checkpoint trained with the old vocabulary")
    codec.tgt_vocab.itos.append("new_token")  # another vocabulary (a shared codec: both sides)
    save_codec(codec, str(run), shared=True, force=True)
    backups = {p.name.split(".backup-")[0]: p.read_bytes() for p in run.iterdir() if ".backup-" in p.name}
    assert backups == {"vocab.txt": old["vocab.txt"], MANIFEST: old[MANIFEST]}
    assert load_codec(cfg.vocab, str(run)).tgt_vocab.itos[-1] == "new_token"  # the new record fits the new file


@pytest.mark.parametrize(
    "how,message",
    [
        (lambda p: (p.unlink(), p.mkdir()), "vocab.txt: is a directory, not a file"),
        (lambda p: p.write_bytes(b"<pad>\n\xff\xfe\n"), r"vocab.txt:2: invalid UTF-8"),
        (lambda p: (p.unlink(), p.symlink_to("/dev/zero")), "vocab.txt: larger than"),
    ],
    ids=["folder", "invalid-utf8", "dev-zero"],
)
def test_an_unreadable_vocabulary_is_one_line(toy_dir, tmp_path, how, message):
    """A folder or invalid UTF-8 was a traceback (IsADirectoryError, UnicodeDecodeError), /dev/zero
    a machine out of memory."""
    cfg = config_from_dict(tiny_config(toy_dir, tmp_path / "run"))
    build_codec(cfg.data, cfg.vocab, str(tmp_path / "run"))
    (tmp_path / "run" / MANIFEST).unlink()
    how(tmp_path / "run" / "vocab.txt")
    with pytest.raises(DataError, match=message):
        load_codec(cfg.vocab, str(tmp_path / "run"))


# ----------------------------------------------------------------------------- pickles


class _Runs:
    def __reduce__(self):
        return (os.system, ("echo ran",))


def test_a_pickle_refusal_is_one_complete_sentence(tmp_path):
    """torch's refusal is a paragraph that first suggests weights_only=False; cut to a line it
    stopped mid-sentence. The line says what the file asked for and that nothing ran."""
    good = tmp_path / "good.pt"
    save_checkpoint({"config": {}, "codec": {}, "model": {"w": torch.zeros(2)}}, str(good))
    src = zipfile.ZipFile(good)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:  # checksums intact: only the unpickler stops it
        for info in src.infolist():
            dst.writestr(
                info.filename,
                pickle.dumps(_Runs(), protocol=2) if info.filename.endswith("data.pkl") else src.read(info),
            )
    (tmp_path / "evil.pt").write_bytes(out.getvalue())
    with pytest.raises(UserError) as e:
        load_checkpoint(str(tmp_path / "evil.pt"))
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'evil.pt'}: not a readable checkpoint: its pickle asks for the Python "
                              "object posix.system, and loading runs no code")  # fmt: skip
    assert "\n" not in message and "weights_only" not in message and message.endswith(")")


# ----------------------------------------------------------------------------- translate_stream


@pytest.mark.parametrize(
    "lines,message",
    [
        ("w1 w2", r"lines: expected an iterable of lines \(str\), got str"),
        (None, "lines: expected an iterable"),
        (["w1", None], r"lines\[1\]: expected a line \(str\), got NoneType"),
        (["w1", b"w2"], r"lines\[1\]: expected a line \(str\), got bytes"),
        (["w1 \ud800"], r"lines\[0\]: column 4 holds a lone surrogate U\+D800"),
        (["w1\nw2"], r"lines\[0\]: holds a line break"),
    ],
    ids=["str", "none", "none-line", "bytes-line", "surrogate", "line-break"],
)
def test_translate_stream_checks_its_lines_as_translate_checks_sentences(lines, message):
    """A None line was an AttributeError, a lone surrogate the tokenizer's error, a line break
    inside a line two sentences translated as one."""
    t = translator(TRANSFORMER, end_bias=4.0)
    with pytest.raises(UserError, match=message):
        list(t.translate_stream(lines))


def test_translate_stream_still_takes_lines_with_their_line_end(tmp_path):
    """Lines read from a file object keep their line end: that is not a line break inside a line."""
    t = translator(TRANSFORMER, end_bias=4.0)
    path = Path(tmp_path / "in.txt")
    path.write_text("w1 w2\n\nw3\n", encoding="utf-8")
    with open(path, encoding="utf-8") as f:
        out = list(t.translate_stream(f))
    assert len(out) == 3 and out[1] == "" and out[0] and out[2]
