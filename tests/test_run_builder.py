"""Building a run (onmt_doc/train/run_builder.py) apart from the loop, and the data layer's
preparation from the sections it reads (onmt_doc/data/prepare.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config
from test_training import small_corpus

from onmt_doc.config import config_from_dict
from onmt_doc.config.data import CorpusConfig, DataConfig, VocabConfig
from onmt_doc.data.prepare import build_codec, load_codec, load_examples
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.run_builder import RunParts, build_run
from onmt_doc.train.trainer import Trainer

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)


def test_prepare_needs_only_the_data_and_vocab_sections(toy_dir, tmp_path):
    """No whole Config: the data layer reads `data:` and `vocab:` and nothing of training or the model."""
    data = small_corpus(toy_dir, tmp_path / "data")
    section = DataConfig(train=CorpusConfig(str(data / "train.src"), str(data / "train.tgt")))
    vocab = VocabConfig(size=60)
    run = str(tmp_path / "run")
    assert load_codec(vocab, run) is None
    codec = build_codec(section, vocab, run)
    assert load_codec(vocab, run).to_dict() == codec.to_dict()
    examples, docs = load_examples(section, codec, str(data / "train.src"), str(data / "train.tgt"), "sentence", run)
    assert len(examples) == sum(len(d) for d in docs) > 0


def test_build_run_gives_plain_parts_in_a_fixed_random_order(toy_dir, tmp_path):
    data = small_corpus(toy_dir, tmp_path / "data")
    raw = tiny_config(toy_dir, tmp_path / "run", train={"max_steps": 2, "valid_bleu": True})
    raw["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
    cfg = config_from_dict(raw)
    parts = build_run(cfg, DistContext())
    assert isinstance(parts, RunParts) and parts.model.unit == "sentence"
    assert parts.sampler.examples is parts.train_examples and parts.mix.sizes == [len(parts.train_examples)]
    assert [v.name for v in parts.valid_sets] == ["valid"] and len(parts.metrics) == 1  # BLEU, as a callable
    assert parts.fingerprint["n_examples"] == len(parts.train_examples)
    again = build_run(cfg, DistContext())  # the vocabulary is read back; the same seed, the same weights
    for (name, a), b in zip(parts.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_trainer_takes_handed_in_parts_and_metric_callables(toy_dir, tmp_path):
    data = small_corpus(toy_dir, tmp_path / "data")
    raw = tiny_config(toy_dir, tmp_path / "run", train={"max_steps": 2, "valid_every": 2, "save_every": 2})
    raw["data"]["train"] = {"src": str(data / "train.src"), "tgt": str(data / "train.tgt")}
    cfg = config_from_dict(raw)
    parts = build_run(cfg, DistContext())
    seen = []
    parts.metrics = [lambda model, v: seen.append(v.name) or {"stub": 1.0}]
    trainer = Trainer(cfg, DistContext(), parts=parts)
    assert trainer.model is parts.model and trainer.sampler is parts.sampler
    metrics = trainer.train()
    assert seen == ["valid"] and metrics["stub"] == 1.0 and "loss" in metrics
    assert (tmp_path / "run" / "checkpoints" / "step_2.pt").exists()
