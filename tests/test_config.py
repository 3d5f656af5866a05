"""Strict configs, registries and overrides."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from onmt_doc.config import (
    Config,
    LossConfig,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)
from onmt_doc.errors import ConfigError
from onmt_doc.registry import Registry


def write(tmp_path, data) -> str:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data, encoding="utf-8")
    return str(path)


def test_defaults_match_design_keys():
    cfg = load_config(None)
    assert cfg.data.documents is True and cfg.data.max_tokens == 512
    assert cfg.model.encoder.type == "transformer" and cfg.model.decoder.type == "transformer"
    assert [line.type for line in cfg.loss] == ["label_smoothed_ce"]
    assert cfg.optim.schedule.type == "inverse_sqrt"
    assert cfg.translate.beam == 5 and cfg.train.keep_last == 5


def test_unknown_key_names_file_path_and_closest(tmp_path):
    path = write(tmp_path, {"model": {"encoder": {"type": "transformer", "layer": 3}}})
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert path in msg and "model.encoder.layer" in msg and "'layers'" in msg
    assert "\n" not in msg


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'trian'.*'train'"):
        load_config(write(tmp_path, {"trian": {"max_steps": 3}}))


def test_wrong_type_names_key_and_expected_type(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.max_steps: expected int, got 'many'"):
        load_config(write(tmp_path, {"train": {"max_steps": "many"}}))
    with pytest.raises(ConfigError, match=r"data\.documents: expected bool"):
        load_config(write(tmp_path, {"data": {"documents": "yes please"}}))
    with pytest.raises(ConfigError, match=r"vocab\.subword: expected one of 'bpe', 'sentencepiece', 'none'"):
        load_config(write(tmp_path, {"vocab": {"subword": "wordpiece"}}))


def test_unknown_part_type_lists_registered_names(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, {"model": {"decoder": {"type": "transfomer"}}}))
    msg = str(e.value)
    assert "model.decoder.type" in msg and "unknown decoder type 'transfomer'" in msg
    assert "did you mean 'transformer'" in msg and "registered: " in msg


def test_part_gets_only_its_own_keys(tmp_path):
    """A key of another part (the schedule's warmup on the optimizer) is rejected."""
    with pytest.raises(ConfigError, match="optim.warmup"):
        load_config(write(tmp_path, {"optim": {"type": "adam", "warmup": 10}}))


def test_float_accepts_yaml11_exponent_strings(tmp_path):
    cfg = load_config(write(tmp_path, "optim: {lr: 5e-4}\n"))
    assert cfg.optim.lr == pytest.approx(5e-4)


def test_overrides_reach_nested_keys_and_list_items(tmp_path):
    path = write(tmp_path, {"loss": [{"type": "label_smoothed_ce"}, {"type": "label_smoothed_ce", "smoothing": 0.0}]})
    cfg = load_config(
        path,
        [
            "loss.1.weight=0.5",
            "model.encoder.layers=3",
            "data.train.src=a.txt",
            "optim.betas=[0.9,0.99]",
            "model.decoder.type=transformer",
        ],
    )
    assert cfg.loss[1].weight == 0.5 and cfg.loss[0].weight == 1.0
    assert cfg.model.encoder.layers == 3 and cfg.data.train.src == "a.txt"
    assert cfg.optim.betas == [0.9, 0.99]
    with pytest.raises(ConfigError, match="needs an index below 2"):
        load_config(path, ["loss.5.weight=0.5"])
    with pytest.raises(ConfigError, match="unknown key 'train.max_step'"):
        load_config(path, ["train.max_step=3"])
    with pytest.raises(ConfigError, match="not of the form"):
        apply_overrides({}, ["train.max_steps"])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.d_model=128", "loss.0.smoothing=0.2", "optim.schedule.type=noam"])
    path = tmp_path / "resolved.yaml"
    save_config(cfg, str(path))
    again = load_config(str(path))
    assert config_to_dict(again) == config_to_dict(cfg)
    assert path.read_text().startswith("# onmt_doc resolved config, format_version")


def test_invalid_yaml_names_line(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml:\d+: invalid YAML"):
        load_config(write(tmp_path, "train:\n  max_steps: [1,\n"))


def test_registry_rejects_duplicates_and_lists_names():
    reg = Registry("widget")

    @dataclasses.dataclass
    class WConfig(LossConfig):
        pass

    @reg.register("a", WConfig)
    class A:
        def __init__(self, cfg):
            self.cfg = cfg

    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", WConfig)(A)
    with pytest.raises(ConfigError, match="registered: a"):
        reg.get("b")
    assert isinstance(reg.build(WConfig(type="a")), A)


DOCS = Path(__file__).resolve().parent.parent / "docs" / "config.md"
PART_KINDS = {
    ("model", "encoders"): "encoder",
    ("model", "decoders"): "decoder",
    ("loss", "losses"): "loss",
    ("optim", "schedules"): "schedule",
}


def config_md_tables() -> dict[tuple, set[str]]:
    """docs/config.md's key tables: {(section, part kind or None, part name or None): keys}.

    ``## `data``` opens a section; ``### Encoders`` (Decoders, Losses, Schedules) a kind of part
    inside it; ``#### `name``` one registered part. Rows are ``| `key` | type | default | meaning |``.
    Fenced code blocks are skipped (the resolved YAML example has lines starting with #)."""
    tables: dict[tuple, set[str]] = {}
    section = kind = name = None
    top_level = fenced = False
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        m = re.match(r"(#+) (.*)$", line)
        if m:
            level, title = len(m.group(1)), m.group(2).strip()
            if level == 2:
                section = title.strip("`") if title.startswith("`") else None
                top_level = title == "Top-level keys"  # keys outside every section (plugins)
                kind = name = None
            elif level == 3:
                kind, name = PART_KINDS.get((section, title.lower())), None
            elif level == 4 and kind:
                name = title.strip("`")
            continue
        row = re.match(r"\| `([a-z_0-9]+)` \|", line)
        if row and (section or top_level):
            tables.setdefault((section or "top-level", kind, name), set()).add(row.group(1))
    return tables


def field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_config_key_is_in_its_sections_table():
    """Each section's table in docs/config.md lists every key of its dataclass (nested ones such
    as data.train.src too), and every registered encoder, decoder, loss and schedule has its own
    table with every key of its config; no table lists a key that does not exist."""
    from onmt_doc.registry import registry_for

    tables = config_md_tables()
    missing, stale = [], []

    def check(where: str, cls, table_key: tuple, extra_allowed: set = frozenset()):
        documented = tables.get(table_key)
        if documented is None:
            missing.append(f"{where}: no table in docs/config.md")
            return
        expected = set()
        for f in dataclasses.fields(cls):
            if f.name == "type" or f.metadata.get("part"):
                continue
            expected.add(f.name)
            value = getattr(cls(), f.name) if f.name != "schedule" else None
            if dataclasses.is_dataclass(value):  # data.train / data.valid: {src, tgt}
                expected |= field_names(type(value))
        fields = field_names(cls) | extra_allowed
        missing.extend(f"{where}.{k}" for k in sorted(expected - documented))
        stale.extend(f"{where}.{k}" for k in sorted(documented - expected - fields))

    cfg = Config()
    plain = {f.name for f in dataclasses.fields(Config) if not dataclasses.is_dataclass(getattr(cfg, f.name))}
    plain -= {"loss"}  # a list of loss sections, checked below
    if plain != tables.get(("top-level", None, None), set()):
        missing.append(f"top-level keys {sorted(plain)} vs the 'Top-level keys' table")
    for section in dataclasses.fields(Config):
        if section.name in plain:
            continue
        if section.name == "loss":  # the base of every loss: LossConfig's keys
            check("loss", LossConfig, ("loss", None, None), {"type"})
            continue
        obj = getattr(cfg, section.name)
        train_keys = field_names(type(obj.train)) if section.name == "data" else set()
        check(
            section.name, type(obj), (section.name, None, None), {"encoder", "decoder", "schedule", "type"} | train_keys
        )
    for (section, heading), kind in PART_KINDS.items():
        registered = registry_for(kind).names()
        documented = {name for (s, k, name) in tables if s == section and k == kind}
        assert set(registered) <= documented, f"{kind}s without a table: {set(registered) - documented}"
        assert documented <= set(registered), f"{kind} tables of unregistered parts: {documented - set(registered)}"
        for name in registered:
            check(f"{kind}:{name}", registry_for(kind).get(name).config, (section, kind, name), {"type"})
    assert not missing, f"keys missing from their table in docs/config.md: {missing}"
    assert not stale, f"docs/config.md tables list keys that do not exist: {stale}"


def test_every_registered_optimizer_is_named_in_the_optim_section():
    from onmt_doc.registry import registry_for

    text = DOCS.read_text(encoding="utf-8")
    optim = text[text.index("## `optim`") : text.index("### Schedules")]
    absent = [n for n in registry_for("optimizer").names() if f"`{n}`" not in optim]
    assert not absent, f"optimizers not listed under optim in docs/config.md: {absent}"


def test_resolved_config_example_in_the_docs_is_what_training_writes(tmp_path):
    """The 'fully resolved' YAML in docs/config.md equals save_config's output for the minimal
    config shown above it (so a new key with its default shows up there too)."""
    text = DOCS.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    minimal = yaml.safe_load(blocks[0])
    resolved = next(b for b in blocks if b.startswith("# onmt_doc resolved config"))
    path = tmp_path / "resolved.yaml"
    save_config(load_config(write(tmp_path, minimal)), str(path))
    assert yaml.safe_load(resolved) == yaml.safe_load(path.read_text(encoding="utf-8"))


def test_every_config_example_loads():
    from pathlib import Path

    examples = sorted((Path(__file__).resolve().parent.parent / "config_examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_config(str(path))


def test_values_that_would_divide_by_zero_are_rejected(tmp_path):
    for override, needle in (
        ("log.every=0", "log.every: must be at least 1"),
        ("train.accum=0", "train.accum: must be at least 1"),
        ("model.d_model=30", "not divisible by 8 heads"),
        ("train.early_stopping_metric=bleu", None),
    ):
        extra = ["train.valid_bleu=false"] if override.endswith("bleu") else []
        with pytest.raises(ConfigError, match=needle or "needs train.valid_bleu"):
            load_config(None, [override, *extra])


def test_override_mistakes_are_blamed_on_the_command_line(tmp_path):
    path = write(tmp_path, {"train": {"max_steps": 3}})
    with pytest.raises(ConfigError, match=r"x\.yaml with command-line overrides: unknown key 'train.max_step'"):
        load_config(path, ["train.max_step=3"])
    with pytest.raises(ConfigError, match=r"x\.yaml: unknown key 'train.bad'"):
        load_config(write(tmp_path, {"train": {"bad": 3}}), ["train.max_steps=3"])


def test_an_unquoted_on_or_off_is_the_setting_of_that_name(tmp_path):
    """YAML 1.1 reads ``compile: off`` as false; where a key's settings include ``on`` and ``off``,
    false and true are those settings (before: "expected one of 'off', …, got False")."""
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  compile: off\ntranslate:\n  compile: on\n", encoding="utf-8")
    cfg = load_config(str(path))
    assert (cfg.train.compile, cfg.translate.compile) == ("off", "on")
    with pytest.raises(ConfigError, match="translate.strategy"):
        config_from_dict({"translate": {"strategy": False}})  # other choices stay strict
