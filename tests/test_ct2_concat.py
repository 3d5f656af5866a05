"""Issue 33, item 3: concatenation models (k_to_1, k_to_k) through CTranslate2.

``onmt_doc_release`` exports them (the unit and k recorded beside the model), and
``Translator.load(folder, engine="ctranslate2")`` / ``onmt_doc_translate -engine ctranslate2`` translate
documents with them: greedy outputs equal onmt_doc's own greedy outputs, line for line, for a k_to_1
and a k_to_k model trained briefly on the toy corpus (k_to_k decoded both ways: the whole window,
onmt_doc's default, and with ``force_context_prefix``), and for a sentence model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import module_cmd, run_cli, tiny_config
from test_api import read_documents

from onmt_doc import Translator
from onmt_doc.config import config_from_dict
from onmt_doc.errors import UserError

pytest.importorskip("ctranslate2", reason="the export extra: pip install -e '.[export]'")

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

N_DOCS = 40  # the whole toy test set (126 sentences)


def _train(toy: Path, run: Path, unit: str, k: int, steps: int = 150) -> Path:
    from onmt_doc.train.trainer import train

    part = {"type": "transformer", "layers": 2, "heads": 4, "ff": 64}
    cfg = tiny_config(
        toy,
        run,
        data={"context_sentences": k},
        model={"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, "unit": unit, "encoder": part, "decoder": part},
        optim={"type": "adam", "lr": 3.0e-3, "schedule": {"type": "inverse_sqrt", "warmup": 50}},
        train={"max_steps": steps, "save_every": steps, "valid_every": 10000, "batch_tokens": 1024},
    )
    train(config_from_dict(cfg))
    return run / "checkpoints" / "last.pt"


def _export(ckpt: Path, out: Path) -> Path:
    r = run_cli(*module_cmd("onmt_doc.bin.release"), "-model", str(ckpt), "-output", str(out))
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module", params=[("k_to_1", 1), ("k_to_k", 2)], ids=["k_to_1", "k_to_k"])
def concat(request, toy_dir, tmp_path_factory) -> tuple[str, int, Path, Path]:
    """(unit, k, checkpoint, CTranslate2 export) of a concatenation model trained briefly."""
    unit, k = request.param
    run = tmp_path_factory.mktemp(unit)
    ckpt = _train(toy_dir, run, unit, k)
    return unit, k, ckpt, _export(ckpt, run / "ct2")


@pytest.fixture(scope="module")
def docs(toy_dir) -> list[list[str]]:
    return read_documents(toy_dir / "test.src", N_DOCS)


def test_the_export_records_the_unit_and_k(concat):
    unit, k, _, out = concat
    info = json.loads((out / "onmt_doc_export.json").read_text(encoding="utf-8"))
    assert (info["unit"], info["context_sentences"]) == (unit, k)
    config = info["onmt_doc_config"]
    assert config["model"]["unit"] == unit and config["data"]["context_sentences"] == k
    assert "train" not in config["data"], "the export records no training file paths"
    assert ("context_translate_options" in info) == (unit == "k_to_k")
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert f"`{unit}`, k = {k}" in readme and "-engine ctranslate2" in readme


@pytest.mark.parametrize("prefix", [False, True], ids=["window", "force_context_prefix"])
def test_greedy_outputs_equal_onmt_doc(concat, docs, prefix):
    """The same concatenated inputs, decoded greedily by CTranslate2 and by onmt_doc's search: the
    same output lines (and the same repairs counted)."""
    unit, _, ckpt, out = concat
    ours = Translator.load(ckpt, device="cpu", beam=1, force_context_prefix=prefix)
    theirs = Translator.load(out, device="cpu", engine="ctranslate2", beam=1, force_context_prefix=prefix)
    assert theirs.model.unit == unit
    expected = ours.translate(docs)
    assert theirs.translate(docs) == expected
    assert theirs.stats == ours.stats
    lines = [s for d in expected for s in d]
    assert sum(len(s.split()) for s in lines) > 2 * len(lines)  # the model translates: not empty outputs
    if unit == "k_to_k" and prefix:  # the two k_to_k decodings differ here, so a mix-up would show
        window = Translator.load(ckpt, device="cpu", beam=1).translate(docs)
        assert window != expected


def test_context_with_the_request_gives_the_same_outputs(concat, docs):
    """Context passed with a request (docs/deploy.md): sources for k_to_1, sources and targets (a
    person's edit, forced as the prefix) for k_to_k; CTranslate2 reads them as onmt_doc does."""
    _, _, ckpt, out = concat
    ours = Translator.load(ckpt, device="cpu", beam=1)
    theirs = Translator.load(out, device="cpu", engine="ctranslate2", beam=1)
    context = [list(zip(d[:2], ["ein hund schläft .", "er sieht die katze ."])) for d in docs]
    new = [d[2:4] for d in docs]
    expected = ours.translate(new, context=context)
    assert theirs.translate(new, context=context) == expected
    assert [len(d) for d in expected] == [len(d) for d in new]


# the command path is the same for both units: run once
K_TO_K_ONLY = pytest.mark.parametrize("concat", [("k_to_k", 2)], ids=["k_to_k"], indirect=True)


@K_TO_K_ONLY
def test_the_command_writes_the_same_file(concat, toy_dir, tmp_path):
    """``onmt_doc_translate -engine ctranslate2``: the file onmt_doc's greedy search writes, document
    breaks (blank lines) included; the export's files are inputs no -output may overwrite."""
    _, _, ckpt, out = concat
    cmd = [*module_cmd("onmt_doc.bin.translate"), "-src", str(toy_dir / "test.src"), "-beam", "1"]
    r = run_cli(*cmd, "-model", str(ckpt), "-output", str(tmp_path / "ours.txt"))
    assert r.returncode == 0, r.stderr
    r = run_cli(*cmd, "-engine", "ctranslate2", "-model", str(out), "-output", str(tmp_path / "ct2.txt"))
    assert r.returncode == 0, r.stderr
    ours = (tmp_path / "ours.txt").read_text(encoding="utf-8")
    assert (tmp_path / "ct2.txt").read_text(encoding="utf-8") == ours
    assert ours.count("\n") == (toy_dir / "test.src").read_text(encoding="utf-8").count("\n")
    r = run_cli(*cmd, "-engine", "ctranslate2", "-model", str(out), "-output", str(out / "model.bin"))
    assert r.returncode == 1 and "would destroy the input" in r.stderr, r.stderr


def test_a_sentence_model_goes_the_same_way(trained_run, docs, tmp_path):
    ckpt = trained_run / "checkpoints" / "last.pt"
    out = _export(ckpt, tmp_path / "ct2")
    assert json.loads((out / "onmt_doc_export.json").read_text(encoding="utf-8"))["unit"] == "sentence"
    theirs = Translator.load(out, device="cpu", engine="ctranslate2", beam=1)
    expected = Translator.load(ckpt, device="cpu", beam=1).translate(docs)
    assert theirs.translate(docs) == expected
    # an export written before the unit and the config were recorded: a sentence model, read the same
    info = json.loads((out / "onmt_doc_export.json").read_text(encoding="utf-8"))
    for key in ("unit", "context_sentences", "onmt_doc_config"):
        del info[key]
    for side in info["tokenization"].values():
        del side["mode"]
    (out / "onmt_doc_export.json").write_text(json.dumps(info), encoding="utf-8")
    assert Translator.load(out, device="cpu", engine="ctranslate2", beam=1).translate(docs) == expected


@K_TO_K_ONLY
def test_mistakes_are_one_line(concat, docs, tmp_path, monkeypatch):
    _, _, ckpt, out = concat
    with pytest.raises(UserError, match="not a folder; -engine ctranslate2 reads a CTranslate2 export"):
        Translator.load(ckpt, device="cpu", engine="ctranslate2")
    with pytest.raises(UserError, match="a CTranslate2 export; translate it with engine ctranslate2"):
        Translator.load(out, device="cpu")
    with pytest.raises(UserError, match="not an ensemble of 2"):
        Translator.load([out, out], device="cpu", engine="ctranslate2")
    with pytest.raises(UserError, match=r"engine: unknown engine type 'ctranslate' \(did you mean 'ctranslate2'\?\)"):
        Translator.load(out, device="cpu", engine="ctranslate")
    with pytest.raises(UserError, match="read_every, compile: options of onmt_doc's own search"):
        Translator.load(out, device="cpu", engine="ctranslate2", read_every=8, compile="on")
    assert Translator.load(out, device="cpu", engine="ctranslate2", read_every=0, compile="off") is not None
    with pytest.raises(UserError, match="forced decoding .* needs the onmt_doc checkpoint"):
        Translator.load(out, device="cpu", engine="ctranslate2").score(docs[:1], docs[:1])
    r = run_cli(
        *module_cmd("onmt_doc.bin.translate"), "-engine", "ctranslate2", "-model", str(out), "-src", "-",
        "-tgt", str(tmp_path / "t"), "-score",
    )  # fmt: skip
    assert r.returncode == 1 and "-score needs the checkpoint and -engine torch" in r.stderr, r.stderr

    # CTranslate2 missing: a one-line error naming the extra, from the API and from the command
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    with pytest.raises(UserError, match=r"ctranslate2 is not installed; install the export extra"):
        Translator.load(out, device="cpu", engine="ctranslate2")
    fake = tmp_path / "no_ct2"
    fake.mkdir()
    (fake / "ctranslate2.py").write_text("raise ImportError('No module named ctranslate2')\n", encoding="utf-8")
    (tmp_path / "src.txt").write_text("a b c\n", encoding="utf-8")
    r = run_cli(
        *module_cmd("onmt_doc.bin.translate"), "-engine", "ctranslate2", "-model", str(out),
        "-src", str(tmp_path / "src.txt"), env={"PYTHONPATH": f"{fake}:{Path(__file__).resolve().parent.parent}"},
    )  # fmt: skip
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "ctranslate2 is not installed; install the export extra: pip install -e '.[export]'" in r.stderr
