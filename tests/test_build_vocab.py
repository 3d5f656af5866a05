"""onmt_doc_build_vocab, SentencePiece, separate vocabularies (vocab.shared: false) and the
quickstart tool, end to end on a slice of the toy corpus."""

from __future__ import annotations

import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, module_cmd, run_cli, tiny_config, write_config
from test_training import small_corpus
from test_unicode import SRC_MAP, TGT_MAP, write_variant

from onmt_doc.data.vocab import SPECIALS
from onmt_doc.errors import UserError

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

BUILD_VOCAB = module_cmd("onmt_doc.bin.build_vocab")


def expected_vocab(path: Path, min_freq: int) -> list[str]:
    """Whitespace words by count (ties alphabetical), counted here with Counter."""
    counts = Counter(w for line in path.read_text(encoding="utf-8").split("\n") for w in line.split())
    words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
    return list(SPECIALS) + words


def test_build_vocab_cli_writes_separate_counted_vocabularies(toy_dir, tmp_path):
    data = small_corpus(toy_dir, tmp_path / "data", lines=200)
    cfg = tiny_config(
        toy_dir, tmp_path / "run", vocab={"subword": "none", "tokenizer": "space", "shared": False, "min_freq": 2}
    )
    cfg["model"]["share_embeddings"] = False
    cfg["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
    proc = run_cli(*BUILD_VOCAB, "-config", str(write_config(cfg, tmp_path / "x.yaml")))
    assert proc.returncode == 0, proc.stderr
    assert "source /" in proc.stderr and "target entries" in proc.stderr
    run = tmp_path / "run"
    for side in ("src", "tgt"):
        got = (run / f"vocab.{side}").read_text(encoding="utf-8").split("\n")[:-1]
        assert got == expected_vocab(data / f"train.{side}", 2), side
    assert not (run / "vocab.txt").exists()
    # a mistake is one line, not a traceback
    bad = run_cli(*BUILD_VOCAB, "-config", str(tmp_path / "x.yaml"), "vocab.subword=wordpiece")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "vocab.subword" in bad.stderr


def test_training_uses_the_vocabulary_build_vocab_wrote(toy_dir, tmp_path):
    from onmt_doc.config import config_from_dict
    from onmt_doc.models.checkpoint import load_checkpoint
    from onmt_doc.train.trainer import train

    data = small_corpus(toy_dir, tmp_path / "data", lines=120)
    cfg = tiny_config(toy_dir, tmp_path / "run", vocab={"size": 60}, train={"max_steps": 2, "save_every": 2})
    cfg["data"] = {"train": {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}}
    proc = run_cli(*BUILD_VOCAB, "-config", str(write_config(cfg, tmp_path / "x.yaml")))
    assert proc.returncode == 0, proc.stderr
    vocab = tmp_path / "run" / "vocab.txt"
    model = (tmp_path / "run" / "subword.model").read_bytes()
    assert "@@" in model.decode("utf-8") or len(model.splitlines()) > 10  # a BPE merge table
    # hand-edit the vocabulary: refused as a changed file (issue 42: vocab.sha256 records the files
    # as written) until its record is deleted; then training takes the file as it is, not a new one
    tokens = vocab.read_text(encoding="utf-8").split("\n")[:-1]
    vocab.write_text("\n".join(tokens + ["handmade_token"]) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"vocab\.txt: changed since it was written.*delete vocab\.sha256"):
        train(config_from_dict(cfg))
    (tmp_path / "run" / "vocab.sha256").unlink()
    train(config_from_dict(cfg))
    ckpt = load_checkpoint(str(tmp_path / "run" / "checkpoints" / "last.pt"))
    assert ckpt["codec"]["src_vocab"] == tokens + ["handmade_token"]
    assert ckpt["codec"]["src_subword"]["model"] == model


def test_sentencepiece_with_separate_vocabularies_trains_and_translates(toy_dir, tmp_path):
    """SentencePiece on the non-ASCII variant, vocab.shared: false: separate subword models and
    vocabularies; share_embeddings then refused with a clear error, or off and trained."""
    from onmt_doc.config import config_from_dict
    from onmt_doc.errors import ConfigError
    from onmt_doc.models.checkpoint import load_model
    from onmt_doc.train.trainer import train
    from onmt_doc.translate.translator import Translator

    write_variant(toy_dir, tmp_path / "data", "train", 300)
    data = tmp_path / "data"
    cfg = tiny_config(
        toy_dir,
        tmp_path / "run",
        vocab={"subword": "sentencepiece", "size": 100, "shared": False},
        train={"max_steps": 3, "save_every": 3},
    )
    cfg["data"] = {"train": {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}}
    with pytest.raises(ConfigError, match="share_embeddings.*vocab.shared"):
        config_from_dict(cfg)  # refused when read, before any subword learning
    assert not (tmp_path / "run").exists()
    cfg["model"]["share_embeddings"] = False
    train(config_from_dict(cfg))
    run = tmp_path / "run"
    src_model, tgt_model = (run / "src.subword").read_bytes(), (run / "tgt.subword").read_bytes()
    assert src_model != tgt_model
    model, saved, codec = load_model(str(run / "checkpoints" / "last.pt"))
    assert codec.src_subword.kind == codec.tgt_subword.kind == "sentencepiece"
    assert codec.src_vocab != codec.tgt_vocab and "▁hund" not in codec.src_vocab.stoi
    assert any(t.endswith("katze") or "ネ" in t for t in codec.tgt_vocab.itos)
    assert model.encoder.embeddings.tokens.weight.size(0) == len(codec.src_vocab)  # own tables
    assert model.generator.weight.size(0) == len(codec.tgt_vocab)
    # every target line (non-ASCII ones included) survives encode -> decode, up to SentencePiece's
    # own NFKC normalisation (its default rule): decomposed marks come back composed ("bau\u0308m"
    # -> "baüm"); BPE keeps them as they are (test_unicode.py)
    lines = [line for line in (data / "train.tgt").read_text(encoding="utf-8").split("\n") if line][:300]
    assert sum(any(w in line for w in TGT_MAP.values()) for line in lines) > 50
    for line, ids in zip(lines, codec.encode(lines, "tgt")):
        assert codec.decode(list(ids)) == unicodedata.normalize("NFKC", line)
    src_line = " ".join(["the", SRC_MAP["dog"], "sees", "a", SRC_MAP["bird"], "."])
    src_ids = codec.encode([src_line], "src")[0].tolist()
    assert 1 not in src_ids  # no <unk>: the source model covers it
    (out,) = Translator(model, codec, saved).translate_documents([[src_line]])
    assert len(out) == 1 and isinstance(out[0], str)


def test_quickstart_tool_runs_end_to_end(tmp_path):
    out = tmp_path / "qs"
    proc = run_cli(
        sys.executable,
        str(REPO / "tools" / "quickstart.py"),
        "--out",
        str(out),
        "--steps",
        "3",
        "--train-docs",
        "40",
        "--eval-docs",
        "4",
    )
    assert proc.returncode == 0, proc.stderr
    assert "context-dependent pronoun accuracy" in proc.stderr and "BLEU" in proc.stderr
    src = (out / "data" / "test.src").read_text(encoding="utf-8").split("\n")
    hyp = (out / "test.hyp").read_text(encoding="utf-8").split("\n")
    assert len(hyp) == len(src)
    assert (out / "checkpoints" / "last.pt").exists() and (out / "config.yaml").exists()
    assert "max_steps: 3" in (out / "config.yaml").read_text(encoding="utf-8")
    bad = run_cli(sys.executable, str(REPO / "tools" / "quickstart.py"), "--out", str(out), "--steps", "0")
    assert bad.returncode != 0 and "--steps must be at least 1" in bad.stderr and "Traceback" not in bad.stderr
