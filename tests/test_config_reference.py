"""docs/config.md's key tables are generated from the config dataclasses' help metadata."""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

import pytest

from onmt_doc.config import Config, PartConfig, config_from_dict, option
from onmt_doc.config_reference import DOCS, Table, config_classes, main, regenerate, render, tables, value_text
from onmt_doc.errors import ConfigError


def test_docs_config_md_is_what_the_dataclasses_generate():
    """Regenerating gives the same text: run ``python tools/config_reference.py`` after changing a key."""
    text = DOCS.read_text(encoding="utf-8")
    assert regenerate(text) == text, "docs/config.md is out of date: run python tools/config_reference.py"
    assert main(["--check"]) == 0


def test_every_config_field_has_help():
    """Every key of every section and registered part (nested ones included) explains itself."""
    classes = config_classes()
    assert Config in classes and len(classes) > 15
    bare = [
        f"{cls.__name__}.{f.name}"
        for cls in classes
        for f in dataclasses.fields(cls)
        if not f.metadata.get("help", "").strip()
    ]
    assert not bare, f"config fields without help metadata (use option(default, help)): {bare}"


def test_check_fails_when_a_table_is_stale(tmp_path):
    stale = DOCS.read_text(encoding="utf-8").replace("| `beam` | int | `5` |", "| `beam` | int | `4` |")
    path = tmp_path / "config.md"
    path.write_text(stale, encoding="utf-8")
    assert main(["--check", "--docs", str(path)]) == 1
    assert main(["--docs", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == DOCS.read_text(encoding="utf-8")


def test_a_registered_part_without_a_table_is_named():
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("<!-- config-keys decoder:mhplstm -->")
    end = text.index("<!-- /config-keys -->", start) + len("<!-- /config-keys -->")
    with pytest.raises(ValueError, match=r"missing tables \['decoder:mhplstm'\]"):
        regenerate(text[:start] + text[end:])


@dataclasses.dataclass
class _Example(PartConfig):
    rate: float = option(5.0e-4, "a rate | with a bar")
    mode: Literal["a", "b", "c"] = option("a", "a mode")
    path: Optional[str] = option(None, "a path", shown="(required)")
    ids: list[int] = option([1, 2], "some ids")


def test_rows_show_yaml_types_and_defaults():
    lines = render(Table(_Example, _Example(type="x"), False)).splitlines()
    assert lines[2:] == [
        "| `rate` | float | `5.0e-4` | a rate \\| with a bar |",
        "| `mode` | `a`, `b` or `c` | `a` | a mode |",
        "| `path` | str or null | (required) | a path |",
        "| `ids` | list of int | `[1, 2]` | some ids |",
    ]
    assert _Example().ids is not _Example().ids  # a list default is copied per instance
    assert value_text(1.0e-9) == "1.0e-9" and value_text(0.1) == "0.1" and value_text({}) == "{}"


def test_every_section_and_part_has_a_table():
    names = set(tables())
    assert {
        "data",
        "model",
        "loss",
        "optim",
        "translate",
        "encoder:hierarchical",
        "decoder:g_transformer",
        "loss:pmi_gate_hinge",
        "schedule:noam",
    } <= names


@pytest.mark.parametrize(
    "section, message",
    [
        (
            {"model": {"encoder": {"type": "g_transformer", "layers": 2, "global_layers": 3}}},
            "x.yaml: model.encoder.global_layers: must be between 0 and model.encoder.layers (2), got 3",
        ),
        (
            {"model": {"decoder": {"type": "mhplstm", "hidden_layers": 3}}},
            "x.yaml: model.decoder.hidden_layers: must be 1 or 2, got 3",
        ),
        (
            {"model": {"decoder": {"type": "reformer", "heads": 7}}},
            "x.yaml: model.decoder.heads: model.d_model (512) is not divisible by 7 heads",
        ),
        (
            {
                "model": {"decoder": {"type": "gated_transformer", "layers": 2}},
                "loss": [{"type": "label_smoothed_ce"}, {"type": "pmi_gate_hinge", "table": "t.npz", "layers": [3]}],
            },
            "x.yaml: loss.1.layers: names layer 3, model.decoder.layers is 2",
        ),
        (
            {"loss": [{"type": "pmi_gate_hinge", "table": "t.npz", "layers": [1, 1]}]},
            "x.yaml: loss.0.layers: must list distinct layer numbers from 1, got [1, 1]",
        ),
        ({"translate": {"beam": 2, "n_best": 3}}, "x.yaml: translate.n_best (3) cannot exceed translate.beam (2)"),
    ],
)
def test_parts_and_sections_validate_themselves(section, message):
    """Each check lives with the dataclass that owns the keys; the loader adds the file name."""
    with pytest.raises(ConfigError) as e:
        config_from_dict(section, "x.yaml")
    assert str(e.value) == message
