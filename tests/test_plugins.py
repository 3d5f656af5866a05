"""Plugins: a user's own part, in a folder outside the package, registered without forking.

Everything runs in fresh processes: a registered plugin part would stay in this process's
registries and change what other tests see (the generated docs/config.md lists every part).
"""

from __future__ import annotations

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
