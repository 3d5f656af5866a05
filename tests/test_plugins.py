"""Plugins: a user's own part, in a folder outside the package, registered without forking.

Everything runs in fresh processes: a registered plugin part would stay in this process's
registries and change what other tests see (the generated docs/config.md lists every part).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import module_cmd, run_cli, tiny_config, write_config

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

PLUGIN = textwrap.dedent(
    '''
    """A user's encoder: the Transformer encoder with its output scaled by a factor of its own."""
    from dataclasses import dataclass

    from onmt_doc.config.options import option
    from onmt_doc.encoders.base import REGISTRY
    from onmt_doc.encoders.transformer import TransformerEncoder, TransformerEncoderConfig


    @dataclass
    class ScaledEncoderConfig(TransformerEncoderConfig):
        scale: float = option(0.5, "factor on the encoder output", above=0)


    @REGISTRY.register("scaled_transformer", ScaledEncoderConfig)
    class ScaledEncoder(TransformerEncoder):
        def __init__(self, cfg, ctx):
            super().__init__(cfg, ctx)
            self.scale = cfg.scale

        def forward(self, batch):
            out = super().forward(batch)
            out.memory = out.memory * self.scale
            return out
    '''
)


def one_line_error(proc, *needles: str) -> str:
    err = proc.stderr.strip()
    lines = [line for line in err.splitlines() if not line.startswith("[")]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_part_from_a_folder_outside_the_package_trains_and_translates(toy_dir, tmp_path):
    plugins = tmp_path / "my_plugins"
    plugins.mkdir()
    (plugins / "scaled.py").write_text(PLUGIN, encoding="utf-8")
    run = tmp_path / "run"
    cfg = tiny_config(toy_dir, run, train={"max_steps": 2, "save_every": 2})
    cfg["model"]["encoder"] = {"type": "scaled_transformer", "layers": 1, "heads": 4, "ff": 64, "scale": 0.25}
    cfg["plugins"] = [str(plugins / "scaled.py")]
    config = write_config(cfg, tmp_path / "c.yaml")
    trained = run_cli(*module_cmd("onmt_doc.bin.train"), "-config", str(config))
    assert trained.returncode == 0, trained.stderr
    resolved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert resolved["plugins"] == [str((plugins / "scaled.py").resolve())]
    assert resolved["model"]["encoder"]["scale"] == 0.25

    src = tmp_path / "in.txt"
    src.write_text("the small house .\n", encoding="utf-8")
    translate = [
        *module_cmd("onmt_doc.bin.translate"),
        "-model",
        str(run / "checkpoints" / "last.pt"),
        "-src",
        str(src),
    ]
    # a checkpoint is data: loading it never imports the plugin by itself
    one_line_error(run_cli(*translate), "scaled.py", "-user_dir")
    done = run_cli(*translate, "-beam", "1", "-user_dir", str(plugins / "scaled.py"))
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done.stderr


def test_a_package_folder_is_a_plugin_too(toy_dir, tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from . import scaled  # noqa: F401\n", encoding="utf-8")
    (package / "scaled.py").write_text(PLUGIN, encoding="utf-8")
    cfg = tiny_config(toy_dir, tmp_path / "run")
    cfg["model"]["encoder"] = {"type": "scaled_transformer", "layers": 1, "heads": 4, "ff": 64}
    config = write_config(cfg, tmp_path / "c.yaml")
    check = [*module_cmd("onmt_doc.bin.train"), "-config", str(config), "train.max_steps=0"]
    one_line_error(run_cli(*check), "unknown encoder type 'scaled_transformer'")
    assert run_cli(*check, "-user_dir", str(package)).returncode == 0


def test_broken_plugins_are_one_line_errors(toy_dir, tmp_path):
    (tmp_path / "syntax.py").write_text("def broken(:\n", encoding="utf-8")
    (tmp_path / "raises.py").write_text("raise RuntimeError('no GPU here')\n", encoding="utf-8")
    config = write_config(tiny_config(toy_dir, tmp_path / "run"), tmp_path / "c.yaml")
    train = [*module_cmd("onmt_doc.bin.train"), "-config", str(config), "train.max_steps=0"]
    one_line_error(run_cli(*train, "-user_dir", str(tmp_path / "missing.py")), "missing.py", "not found")
    one_line_error(run_cli(*train, "-user_dir", str(tmp_path / "syntax.py")), "syntax.py", "SyntaxError")
    one_line_error(run_cli(*train, "-user_dir", str(tmp_path / "raises.py")), "raises.py", "no GPU here")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    one_line_error(run_cli(*train, "-user_dir", str(tmp_path / "exits.py")), "exits.py", "the plugin called exit(3)")
    one_line_error(run_cli(*train, "plugins=[" + str(tmp_path / "raises.py") + "]"), "plugins", "no GPU here")
    bad = Path(config).read_text(encoding="utf-8") + "plugins: just_a_string\n"
    Path(config).write_text(bad, encoding="utf-8")
    one_line_error(run_cli(*module_cmd("onmt_doc.bin.train"), "-config", str(config)), "plugins")


PLUGIN_UNIT = textwrap.dedent(
    '''
    """A user's unit: the sentences of a document two by two, both in and both out."""
    import numpy as np

    from onmt_doc.data.instances import UNITS, Bounds, ChosenUnit, UnitOptions


    @UNITS.register("sentence_pairs", UnitOptions)
    class SentencePairs(ChosenUnit):
        def bounds(self, lengths):
            idx = np.arange(lengths.n, dtype=np.int64)
            starts = (idx - lengths.doc_start()) % 2 == 0
            a = idx[starts]
            return Bounds(a, np.minimum(a + 2, lengths.doc_end()[starts]), 0)

        @classmethod
        def counts_source_sentences(cls):
            return True
    '''
)

# in a fresh process (the plugin registers into this process's registries): the run's training
# examples are index arrays over the mapped cache, as a built-in unit's, and what they hold is the
# plugin's pairs, read the same by make_batch and by collating the Examples
CHECK_MAPPED_UNIT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    from onmt_doc.config import load_config
    from onmt_doc.data.batching import collate, make_batch
    from onmt_doc.data.instances import mark_sentence
    from onmt_doc.data.mapped import MappedExamples
    from onmt_doc.train import distributed
    from onmt_doc.train.trainer import Trainer

    trainer = Trainer(load_config(sys.argv[1]), distributed.init_distributed("cpu"))
    examples = trainer.train_examples
    assert isinstance(examples, MappedExamples), type(examples)
    corpus = examples.corpus
    docs = corpus.documents()
    expected = [(d, i, min(2, len(doc) - i)) for d, doc in enumerate(docs) for i in range(0, len(doc), 2)]
    assert [(e.doc, e.first, e.n_sents) for e in examples] == expected
    for e in examples[:50]:
        pairs = docs[e.doc][e.first : e.first + e.n_sents]
        assert e.src.tolist() == [x for s, _ in pairs for x in mark_sentence(s).tolist()]
        assert e.tgt.tolist() == [x for _, t in pairs for x in mark_sentence(t).tolist()]
    idx = trainer.sampler.epoch_batches(0)[0]
    fast, slow = make_batch(examples, idx), collate([examples[i] for i in idx], idx)
    assert fast.src.equal(slow.src) and fast.tgt_out.equal(slow.tgt_out)
    print("mapped", len(examples))
    """
)


def test_a_plugin_unit_trains_from_the_mapped_cache_and_translates(toy_dir, tmp_path):
    """A unit registered by a plugin states its instances (``Unit.bounds``) like a built-in one:
    training reads them from the binarized cache (no list of Examples), and translation builds
    them with the same code over the documents it is given."""
    (tmp_path / "pairs_unit.py").write_text(PLUGIN_UNIT, encoding="utf-8")
    run = tmp_path / "run"
    cfg = tiny_config(toy_dir, run, train={"max_steps": 2, "save_every": 2})
    cfg["model"]["unit"] = "sentence_pairs"
    cfg["plugins"] = [str(tmp_path / "pairs_unit.py")]
    config = write_config(cfg, tmp_path / "c.yaml")
    trained = run_cli(*module_cmd("onmt_doc.bin.train"), "-config", str(config))
    assert trained.returncode == 0, trained.stderr
    assert "sentence_pairs instances" in trained.stderr
    check = run_cli(sys.executable, "-c", CHECK_MAPPED_UNIT, str(config))
    assert check.returncode == 0 and check.stdout.startswith("mapped "), check.stderr

    src = tmp_path / "in.txt"
    src.write_text("the small house .\nthe cat sleeps .\nit is here .\n", encoding="utf-8")
    translate = [*module_cmd("onmt_doc.bin.translate"), "-model", str(run / "checkpoints" / "last.pt")]
    done = run_cli(*translate, "-src", str(src), "-beam", "1", "-user_dir", str(tmp_path / "pairs_unit.py"))
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 3, done.stderr
