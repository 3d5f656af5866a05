"""Several training corpora with weights, sentence data in document models, several validation sets."""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config
from test_training import tb_scalars

from onmt_doc.config import config_from_dict, config_to_dict
from onmt_doc.data.batching import BatchSampler, CorpusMix, Lengths, token_batches
from onmt_doc.data.instances import Example
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.models.checkpoint import load_checkpoint
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.trainer import Trainer, train

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)


def lines_of(toy: Path, out: Path, name: str, start: int, stop: int, documents: bool = True) -> dict:
    """Lines ``start:stop`` of the toy training files as a corpus ``{src, tgt}`` (blank lines
    dropped when ``documents`` is false, so the files are plain sentence pairs)."""
    out.mkdir(parents=True, exist_ok=True)
    corpus = {}
    for ext in ("src", "tgt"):
        lines = (toy / f"train.{ext}").read_text(encoding="utf-8").split("\n")[start:stop]
        if not documents:
            lines = [line for line in lines if line.strip()]
        path = out / f"{name}.{ext}"
        path.write_text("\n".join(lines).strip("\n") + "\n", encoding="utf-8")
        corpus[ext] = str(path)
    return corpus


# ----------------------------------------------------------------------------- config shapes


def test_one_corpus_keeps_its_old_shape_and_old_configs_load():
    old = {"data": {"train": {"src": "a.en", "tgt": "a.de"}, "valid": {"src": "v.en", "tgt": "v.de"}}}
    cfg = config_from_dict(old)
    assert cfg.data.train.src == "a.en" and cfg.data.valid.tgt == "v.de"
    assert [(c.name, c.src, c.documents) for c in cfg.data.corpora("train")] == [("train", "a.en", True)]
    assert config_from_dict(config_to_dict(cfg)) == cfg  # a checkpoint's saved config reads back
    assert config_from_dict({}).data.corpora("valid") == []  # no validation files: no set


def test_named_and_listed_corpora_load_with_names_weights_and_documents():
    mapping = config_from_dict(
        {
            "data": {
                "documents": True,
                "train": {
                    "news": {"src": "n.en", "tgt": "n.de", "weight": 3},
                    "sents": {"src": "s.en", "tgt": "s.de", "documents": False},
                },
            }
        }
    )
    got = [(c.name, c.src, c.weight, c.documents) for c in mapping.data.corpora("train")]
    assert got == [("news", "n.en", 3, True), ("sents", "s.en", 1, False)]
    listed = config_from_dict({"data": {"train": [{"src": "a", "tgt": "b"}, {"src": "c", "tgt": "d", "name": "ted"}]}})
    assert [c.name for c in listed.data.corpora("train")] == ["corpus_1", "ted"]
    assert config_from_dict(config_to_dict(mapping)) == mapping  # saved and read back: same corpora


@pytest.mark.parametrize(
    "train, message",
    [
        ({"news": {"src": "a", "wieght": 2}}, r"unknown key 'data\.train\.news\.wieght' \(did you mean 'weight'\?\)"),
        ({"news": {"src": "a", "weight": 0}}, r"data\.train\.news\.weight: must be at least 1, got 0"),
        ({"news": {"src": "a"}, "src": "b"}, r"data\.train\.src: expected a corpus mapping"),
        ([{"name": "x"}, {"name": "x"}], r"data\.train\.1\.name: duplicate corpus name 'x'"),
        ({"news": {"name": "ted"}}, r"data\.train\.news\.name: 'ted' differs from the corpus' key 'news'"),
        ([], r"data\.train: expected at least one corpus"),
    ],
)
def test_corpus_mistakes_name_the_key_path(train, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"data": {"train": train}})


def test_best_on_must_name_a_validation_set():
    valid = {"ted": {"src": "t", "tgt": "t"}, "news": {"src": "n", "tgt": "n"}}
    assert config_from_dict({"data": {"valid": valid}, "train": {"best_on": "news"}}).train.best_on == "news"
    with pytest.raises(ConfigError, match=r"train\.best_on: no validation set 'nwes' \(did you mean 'news'\?\)"):
        config_from_dict({"data": {"valid": valid}, "train": {"best_on": "nwes"}})
    with pytest.raises(ConfigError, match=r"data\.valid\.ted: needs both src and tgt"):
        config_from_dict({"data": {"valid": {"ted": {"src": "t"}}}})
    with pytest.raises(ConfigError, match=r"^config: data\.valid: needs both src and tgt \(or neither\)$"):
        config_from_dict({"data": {"valid": {"tgt": "t"}}})


# ----------------------------------------------------------------------------- the sampler


def toy_examples(lengths: list[int]) -> list[Example]:
    return [Example(np.arange(n), np.arange(n), i, 0, 1) for i, n in enumerate(lengths)]


def test_an_epoch_draws_every_corpus_at_its_weight_and_drops_nothing():
    """Corpus sizes 50, 12, 7 with weights 2, 1, 3: rounds = max(25, 12, 3) = 25, so an epoch takes
    50, 25, 75 examples. Counted here from the batches the sampler yields (all of them, as the
    trainer sees them), not from the sampler's own report."""
    rng = np.random.default_rng(0)
    sizes, weights = [50, 12, 7], [2, 1, 3]
    examples = toy_examples(list(rng.integers(3, 20, sum(sizes))))
    mix = CorpusMix(["a", "b", "c"], sizes, weights)
    sampler = BatchSampler(examples, batch_tokens=60, seed=5, mix=mix)
    offsets = np.cumsum([0] + sizes)
    used = Counter()
    per_epoch = []
    for epoch in range(3):
        drawn = np.concatenate(sampler.epoch_batches(epoch))
        corpus = np.searchsorted(offsets, drawn, side="right") - 1
        per_epoch.append(np.bincount(corpus, minlength=3).tolist())
        used.update(drawn.tolist())
        if epoch == 0:
            assert sorted(drawn[corpus == 0].tolist()) == list(range(50))  # the slowest corpus: each once
    assert per_epoch == [[50, 25, 75]] * 3  # exactly proportional to the weights, every epoch
    assert sampler.epoch_counts(1) == {"a": 50, "b": 25, "c": 75}  # what the trainer logs
    for c in range(3):  # over 3 epochs every example of a corpus is used as often as any other, +-1
        counts = [used[i] for i in range(offsets[c], offsets[c + 1])]
        assert min(counts) >= 1 and max(counts) - min(counts) <= 1, (c, counts)
    b = [used[i] for i in range(50, 62)]  # corpus b: 75 draws over 12 examples = 6 passes + 3
    assert sum(b) == 75 and sorted(Counter(b).items()) == [(6, 9), (7, 3)]


def test_a_single_corpus_keeps_the_batch_order_it_had_before_corpora():
    """Checkpoints written before several corpora existed resume into the same batches: the
    order is the original algorithm's (length sort with a seeded tie-break, token batches, a
    seeded permutation), written out here."""
    examples = toy_examples(list(np.random.default_rng(1).integers(3, 30, 80)))
    sampler = BatchSampler(examples, batch_tokens=90, seed=7)
    for epoch in (0, 1):
        rng = np.random.default_rng([7, epoch])
        lengths = np.array([len(e.src) for e in examples])
        lens = Lengths(lengths, lengths + 1, np.ones(80, dtype=np.int64))
        order = np.lexsort([rng.random(80), lengths, lengths + 1, np.ones(80)])
        batches = token_batches(order, lens, 90)
        expected = [batches[i] for i in rng.permutation(len(batches))]
        assert [b.tolist() for b in sampler.epoch_batches(epoch)] == [b.tolist() for b in expected]


# ----------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def corpora(toy_dir, tmp_path_factory) -> dict:
    """A document corpus (30 lines), a sentence corpus (50 lines, blank ones dropped), a validation set."""
    out = tmp_path_factory.mktemp("corpora")
    return {
        "docs": lines_of(toy_dir, out, "docs", 0, 30),
        "sents": lines_of(toy_dir, out, "sents", 90, 140, documents=False),
        "news": lines_of(toy_dir, out, "news", 200, 260),
    }


def mixed_config(toy_dir: Path, corpora: dict, run: Path, steps: int, **train_keys) -> dict:
    c = tiny_config(
        toy_dir,
        run,
        train={"max_steps": steps, "save_every": 5, "valid_every": 5, "batch_tokens": 500, **train_keys},
        log={"tensorboard": True, "every": 1},
    )
    c["data"]["train"] = {
        "docs": {**corpora["docs"], "weight": 1},
        "sents": {**corpora["sents"], "weight": 2, "documents": False},
    }
    c["data"]["valid"] = {"ted": c["data"]["valid"], "news": corpora["news"]}
    return c


def test_two_weighted_corpora_resume_bit_for_bit(toy_dir, corpora, tmp_path, caplog):
    """10 steps straight == 5 steps, stop, resume, 5 steps, with two weighted corpora: same
    parameters, same loss curve; the run crosses epochs, logs each corpus' examples per epoch and
    reports both validation sets."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    logger, level = logging.getLogger("onmt_doc"), logging.getLogger("onmt_doc").level
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    caplog.handler.setLevel(logging.INFO)
    try:
        train(config_from_dict(mixed_config(toy_dir, corpora, straight, 10)))
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(level)
    messages = [r.getMessage() for r in {id(r): r for r in caplog.records}.values()]  # once each (propagation)
    epoch_lines = [m for m in messages if re.match(r"epoch \d+ done", m)]
    valid_lines = [m for m in messages if m.startswith("validation at step")]
    train(config_from_dict(mixed_config(toy_dir, corpora, resumed, 5)))
    train(config_from_dict(mixed_config(toy_dir, corpora, resumed, 10)))
    a = load_checkpoint(str(straight / "checkpoints" / "last.pt"))
    b = load_checkpoint(str(resumed / "checkpoints" / "last.pt"))
    assert a["train_state"]["sampler"]["epoch"] >= 2  # the run crossed epochs
    assert a["train_state"]["data"]["corpora"] == b["train_state"]["data"]["corpora"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    sa, sb = tb_scalars(straight), tb_scalars(resumed)
    assert sa["train/loss"] == sb["train/loss"]
    assert sa["epoch/examples/docs"] == sb["epoch/examples/docs"]
    (docs_n, sents_n) = (a["train_state"]["data"]["corpora"][0][1], a["train_state"]["data"]["corpora"][1][1])
    rounds = max(-(-docs_n // 1), -(-sents_n // 2))
    assert {v for _, v in sa["epoch/examples/docs"]} == {rounds * 1}
    assert {v for _, v in sa["epoch/examples/sents"]} == {rounds * 2}
    assert len(sa["epoch/examples/docs"]) == a["train_state"]["sampler"]["epoch"]  # one point per finished epoch
    for name in ("ted", "news"):
        assert [s for s, _ in sa[f"valid/{name}/loss"]] == [5, 10]
        assert [line.split(":")[0] for line in valid_lines if f" on {name}:" in line] == [
            f"validation at step {s} on {name}" for s in (5, 10)
        ]
    assert sa["valid/ted/loss"] == sb["valid/ted/loss"]
    assert "valid/loss" not in sa  # several sets: only the named tags
    assert len(epoch_lines) == len(sa["epoch/examples/docs"])
    assert epoch_lines[0].endswith(f": docs {rounds}, sents {rounds * 2} examples")


def test_changed_weight_refuses_exact_resume(toy_dir, corpora, tmp_path):
    run = tmp_path / "run"
    train(config_from_dict(mixed_config(toy_dir, corpora, run, 2)))
    cfg = mixed_config(toy_dir, corpora, run, 4)
    cfg["data"]["train"]["sents"]["weight"] = 3
    with pytest.raises(UserError, match=r"the training corpora \[name, examples, weight\].*'sents', \d+, 2\].*"):
        train(config_from_dict(cfg))


def test_sentence_corpus_feeds_a_document_model_as_one_sentence_documents(toy_dir, corpora, tmp_path):
    """G-Transformer (document unit) on document data + sentence data: the sentence corpus gives
    one-sentence instances, the document corpus multi-sentence ones; validation picks best_on."""
    cfg = mixed_config(toy_dir, corpora, tmp_path / "g", 2, best_on="news")
    layers = {"type": "g_transformer", "layers": 2, "heads": 4, "ff": 128, "global_layers": 1}
    cfg["model"]["encoder"], cfg["model"]["decoder"] = dict(layers), dict(layers)
    trainer = Trainer(config_from_dict(cfg), DistContext())
    assert trainer.model.unit == "document"
    n_docs, n_sents = trainer.mix.sizes
    assert n_sents == len(Path(corpora["sents"]["src"]).read_text(encoding="utf-8").splitlines())  # every line
    assert all(e.n_sents == 1 for e in trainer.train_examples[n_docs:])
    assert max(e.n_sents for e in trainer.train_examples[:n_docs]) > 1
    metrics = trainer.validate()
    assert metrics["loss"] == metrics["news/loss"] != metrics["ted/loss"]  # best.pt and early stopping: news
    assert trainer.early.best == metrics["news/loss"]


def test_each_corpus_has_its_own_cache_entry_keyed_by_its_documents_flag(toy_dir, corpora, tmp_path):
    """The same files twice, once as documents and once as sentences: two binarized-cache entries
    (a key without the flag would serve the second corpus the first one's documents), and a
    second Trainer in the run folder reads both back from the cache unchanged."""
    cfg = mixed_config(toy_dir, corpora, tmp_path / "run", 2)
    cfg["data"]["train"] = {"as_docs": dict(corpora["docs"]), "as_sents": {**corpora["docs"], "documents": False}}
    cfg["data"]["valid"] = corpora["news"]
    first = Trainer(config_from_dict(cfg), DistContext())
    n_docs, n_sents = first.mix.sizes
    lines = Path(corpora["docs"]["src"]).read_text(encoding="utf-8").split("\n")[:-1]
    documents = 1 + lines.count("")
    assert n_docs == n_sents == len(lines) - lines.count("")  # sentence unit: one example per pair
    assert max(e.doc for e in first.train_examples[:n_docs]) + 1 == documents  # blank lines split documents
    assert [e.doc for e in first.train_examples[n_docs:]] == list(range(n_sents))  # every line its own
    entries = sorted((tmp_path / "run" / "cache").glob("*/meta.json"))  # one mapped folder each
    assert len(entries) == 3  # as_docs, as_sents, the validation set
    again = Trainer(config_from_dict(cfg), DistContext())
    assert sorted((tmp_path / "run" / "cache").glob("*/meta.json")) == entries
    assert again.mix.sizes == first.mix.sizes
    assert [e.src.tolist() for e in again.train_examples] == [e.src.tolist() for e in first.train_examples]
