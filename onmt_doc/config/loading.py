"""The root :class:`Config` and everything that turns text into it and back: the strict YAML
loader, dotted command-line overrides, validation, ``config.yaml``.

Loading is strict: an unknown key is an error naming the file, the key path and the closest valid
key; a wrong type names the key and the expected type. Parts chosen by ``type:`` (encoder,
decoder, losses, optimizer, schedule) are validated against the config dataclass their registry
entry declares, so each part sees only its own section. Every key has a default except the data
paths, which the commands that need them check. Once the whole config is read, every section and
part section is checked (``validate_tree``: bounds, then nested sections, then ``validate``).

Nothing is silently replaced or let through: a key written twice in one YAML mapping is an error
naming both lines (PyYAML keeps the last one), and a float key refuses NaN and infinities (from the
file and from command-line overrides alike).

This module sits on top of the package: it imports every section module and ``options``, none of
which imports it (a key's ``load`` hook sees the loader as ``options.SectionLoader``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import typing
from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence, Union

import yaml

from onmt_doc.config.data import DataConfig, VocabConfig
from onmt_doc.config.model import ModelConfig
from onmt_doc.config.options import (
    FORMAT_VERSION,
    LossConfig,
    PartConfig,
    default_part,
    join_path,
    option,
    part,
    validate_tree,
)
from onmt_doc.config.train import LogConfig, OptimConfig, TrainConfig
from onmt_doc.config.translate import TranslateConfig
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.outputs import Input, input_problem, read_input_bytes, write_text
from onmt_doc.plugins import import_plugins, loaded_plugins
from onmt_doc.registry import closest, registry_for


@dataclass
class Config:
    """A whole run: one section per dataclass, loaded strictly (unknown keys are errors)."""

    plugins: list[str] = option(
        help="Python files or package folders imported before the rest is read, so their parts "
        "(`type: my_encoder`) resolve ([extending.md](extending.md#plugins)); the resolved config "
        "records every plugin's absolute path. Translating a checkpoint that uses one needs `-user_dir`",
        factory=list,
    )
    data: DataConfig = option(help="files and how they become instances", factory=DataConfig)
    vocab: VocabConfig = option(help="subword model and vocabularies", factory=VocabConfig)
    model: ModelConfig = option(help="the network: width, embeddings, encoder and decoder", factory=ModelConfig)
    loss: list[LossConfig] = part(
        "loss", None, "the losses, summed with their weights (empty: one `label_smoothed_ce`)"
    )
    optim: OptimConfig = part("optimizer", "adam", "the optimizer and its learning-rate schedule")
    train: TrainConfig = option(help="the training loop", factory=TrainConfig)
    translate: TranslateConfig = option(help="beam search and translation batching", factory=TranslateConfig)
    log: LogConfig = option(help="the run folder and progress logging", factory=LogConfig)

    def __post_init__(self) -> None:
        if not self.loss:
            self.loss = [default_part("loss", "label_smoothed_ce")]

    def validate(self, path: str, root: "Config") -> None:
        """Checks across sections; run before any subword learning, so a mistake costs nothing."""
        if self.model.share_embeddings and not self.vocab.shared:
            raise ConfigError(
                "model.share_embeddings: true needs one shared vocabulary "
                "(vocab.shared: true), or set model.share_embeddings: false"
            )


# ----------------------------------------------------------------------------- reading sections


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, dict):
        return origin.__name__
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


class _Loader:
    """Reads plain values into the section dataclasses strictly; every message names ``source``
    (the ``options.SectionLoader`` a key's ``load`` hook receives)."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, message: str) -> None:
        raise ConfigError(f"{self.source}: {path}: {message}")

    def dataclass(self, cls: type, data: Any, path: str) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path or "top level", f"expected a mapping, got {type(data).__name__} {data!r}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in fields:
                raise ConfigError(f"{self.source}: unknown key '{join_path(path, key)}'{closest(str(key), fields)}")
        kwargs = {}
        for name, f in fields.items():
            if name in data:
                kind = f.metadata.get("part")
                if kind:
                    kwargs[name] = self.part_field(kind, data[name], join_path(path, name), f)
                elif "load" in f.metadata:
                    kwargs[name] = f.metadata["load"](self, data[name], join_path(path, name))
                else:
                    kwargs[name] = self.value(hints[name], data[name], join_path(path, name))
        return cls(**kwargs)

    def part_field(self, kind: str, data: Any, path: str, f: dataclasses.Field) -> Any:
        if f.default_factory is list:  # a list of parts (losses)
            if not isinstance(data, list):
                self.fail(path, f"expected a list of {kind} sections, got {type(data).__name__}")
            return [self.part(kind, item, join_path(path, i), None) for i, item in enumerate(data)]
        return self.part(kind, data, path, f.default_factory().type)

    def part(self, kind: str, data: Any, path: str, default_type: Optional[str]) -> PartConfig:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping with a 'type' key, got {data!r}")
        name = data.get("type", default_type)
        if name is None:
            self.fail(path, f"missing 'type' (registered: {', '.join(registry_for(kind).names())})")
        entry = registry_for(kind).get(str(name), where=f"{self.source}: {join_path(path, 'type')}")
        cfg = self.dataclass(entry.config, {**data, "type": name}, path)
        return cfg

    def value(self, tp: Any, value: Any, path: str) -> Any:
        origin = typing.get_origin(tp)
        if tp is Any:
            return value
        if origin is Union:
            args = typing.get_args(tp)
            if value is None and type(None) in args:
                return None
            errors = []
            for arg in args:
                if arg is type(None):
                    continue
                try:
                    return self.value(arg, value, path)
                except ConfigError as e:
                    errors.append(e)
            self.fail(path, f"expected {_type_name(tp)}, got {value!r}")
        if origin is Literal:
            if isinstance(value, bool) and {"on", "off"} <= set(typing.get_args(tp)):
                value = "on" if value else "off"  # YAML 1.1 reads an unquoted on / off as a boolean
            if value not in typing.get_args(tp):
                self.fail(path, f"expected {_type_name(tp)}, got {value!r}")
            return value
        if origin is list:
            if not isinstance(value, (list, tuple)):
                self.fail(path, f"expected a list, got {value!r}")
            (item,) = typing.get_args(tp) or (Any,)
            return [self.value(item, v, join_path(path, i)) for i, v in enumerate(value)]
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                self.fail(path, f"expected a mapping, got {value!r}")
            self.finite(value, path)
            return dict(value)
        if dataclasses.is_dataclass(tp):
            return self.dataclass(tp, value, path)
        if tp is bool:
            if not isinstance(value, bool):
                self.fail(path, f"expected bool (true/false), got {value!r}")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(path, f"expected int, got {value!r}")
            return value
        if tp is float:
            if isinstance(value, str):  # YAML 1.1 reads 5e-4 as a string
                try:
                    value = float(value)
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(path, f"expected float, got {value!r}")
            self.finite(value, path)
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                self.fail(path, f"expected str, got {value!r}")
            return value
        raise TypeError(f"config field {path} has unsupported type {tp!r}")

    def finite(self, value: Any, path: str) -> None:
        """NaN or an infinity (``.nan``, ``.inf``, ``1e999``) would reach the model and the search
        unnoticed, so no number of the config may be one, also inside free-form mappings
        (``optim.params``)."""
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(path, f"expected a finite number, got {value}")
        if isinstance(value, dict):
            for key, item in value.items():
                self.finite(item, join_path(path, key))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                self.finite(item, join_path(path, i))


# ----------------------------------------------------------------------------- strict YAML


class DuplicateKeyError(yaml.YAMLError):
    """A key written twice in one YAML mapping: PyYAML would keep the last value without a word."""

    def __init__(self, key: str, line: int, first: int) -> None:
        """``key``: its dotted path; ``line`` and ``first``: 1-based lines of the repeat and the first."""
        super().__init__(f"duplicate key '{key}' (first at line {first})")
        self.key, self.line, self.first = key, line, first


class StrictYAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only, no Python tags) that refuses a key written twice in
    one mapping, at any depth: ``yaml.load(text, Loader=StrictYAMLLoader)``."""

    def construct_document(self, node: yaml.Node) -> Any:
        """Check the composed document (which still has every key and its line) before building it."""
        _refuse_duplicate_keys(node, "", set())
        return super().construct_document(node)


_MERGE_TAG = "tag:yaml.org,2002:merge"  # ``<<: *defaults``: merged keys may be overridden, on purpose


def _refuse_duplicate_keys(node: yaml.Node, path: str, seen: set[int]) -> None:
    """Raise :class:`DuplicateKeyError` for the first key repeated in a mapping of ``node``'s tree
    (a node reached twice through an alias is checked once)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, join_path(path, i), seen)
    elif isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            where = path
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                where = join_path(path, key_node.value)
                line, key = key_node.start_mark.line + 1, (key_node.tag, key_node.value)
                if key in first:
                    raise DuplicateKeyError(where, line, first[key])
                first[key] = line
            _refuse_duplicate_keys(value_node, where, seen)


# ----------------------------------------------------------------------------- overrides, validation, files


def apply_overrides(raw: dict, overrides: list[str], source: str = "command line") -> dict:
    """Apply ``a.b.c=value`` overrides (list items by index: ``loss.1.weight=0.5``) to a raw dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: override '{item}' is not of the form key.path=value")
        key, text = item.split("=", 1)
        try:
            value = yaml.load(text, Loader=StrictYAMLLoader) if text != "" else ""
        except DuplicateKeyError as e:
            raise ConfigError(f"{source}: override '{key}': duplicate key '{e.key}'") from None
        except RecursionError:
            raise ConfigError(f"{source}: override '{key}': value nested too deeply") from None
        except yaml.YAMLError:
            value = text
        parts = key.split(".")
        node: Any = raw
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            where = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not name.isdigit() or int(name) >= len(node):
                    raise ConfigError(f"{source}: override '{key}': '{where}' needs an index below {len(node)}")
                if last:
                    node[int(name)] = value
                else:
                    node = node[int(name)]
            elif isinstance(node, dict):
                if last:
                    node[name] = value
                else:
                    if node.get(name) is None:
                        node[name] = _default_at(raw, parts[: i + 1], source)
                    node = node[name]
            else:
                raise ConfigError(f"{source}: override '{key}': '{'.'.join(parts[:i])}' is not a section")
    return raw


def _default_at(raw: dict, parts: list[str], source: str) -> Any:
    """The resolved default of a section an override reaches into (e.g. the default loss list)."""
    node: Any = config_to_dict(config_from_dict(copy.deepcopy(raw), source))
    for name in parts:
        if isinstance(node, list) and name.isdigit() and int(name) < len(node):
            node = node[int(name)]
        elif isinstance(node, dict) and name in node:
            node = node[name]
        else:
            return {}
    return copy.deepcopy(node) if isinstance(node, (dict, list)) else {}


def config_from_dict(raw: dict, source: str = "config") -> Config:
    """A validated Config from nested plain values; errors name ``source`` and the key. Plugins
    named in ``raw`` are not imported here (a checkpoint's config is data): they must have been
    imported already (``plugins:`` of a config file, or ``-user_dir``)."""
    _require_plugins(raw, source)
    cfg = _Loader(source).dataclass(Config, raw, "")
    try:
        validate_tree(cfg, "", cfg)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return cfg


def _require_plugins(raw: dict, source: str) -> None:
    """A config made with plugins names them; reading it without them would fail later, at the
    first part type they register, with a less helpful message."""
    named = raw.get("plugins") if isinstance(raw, dict) else None
    if not isinstance(named, list):
        return
    loaded = set(loaded_plugins())
    missing = [p for p in named if isinstance(p, str) and os.path.realpath(p) not in loaded]
    if missing:
        raise ConfigError(
            f"{source}: made with the plugin(s) {', '.join(missing)}; give -user_dir PATH for each "
            f"(it runs their code: only for plugins you trust)"
        )


def _import_plugins(raw: dict, source: str) -> None:
    """Import the ``plugins:`` of a config file, then record every plugin of this process by its
    absolute path (those of ``-user_dir`` too), so the run's checkpoints name what they need."""
    named = raw.get("plugins", [])
    if not isinstance(named, list) or not all(isinstance(p, str) for p in named):
        raise ConfigError(f"{source}: plugins: expected a list of paths, got {named!r:.80}")
    import_plugins(named, f"{source}: plugins")
    if named or loaded_plugins():
        raw["plugins"] = loaded_plugins()


# the largest config file read (a config is a few KB; this only stops /dev/zero and endless pipes)
CONFIG_BYTES = 16 << 20


def read_yaml(path: str, what: str = "config") -> Any:
    """A user's YAML file (a config, a benchmark spec), read strictly: bounded in size, UTF-8, no
    key twice in a mapping, no Python tags, not nested past the parser's depth; every problem a
    one-line ``ConfigError`` naming the file (and line)."""
    problem = input_problem(path)
    if problem:
        raise ConfigError(f"{path}: {what} {problem}")
    try:
        text = read_input_bytes(path, limit=CONFIG_BYTES, what=f"{what} file").decode("utf-8")
        return yaml.load(text, Loader=StrictYAMLLoader)
    except UserError as e:
        raise ConfigError(str(e)) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a {what}") from None
    except DuplicateKeyError as e:
        raise ConfigError(f"{path}:{e.line}: duplicate key '{e.key}' (first at line {e.first})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid UTF-8") from None


def load_config(path: Optional[str], overrides: Optional[list[str]] = None) -> Config:
    """Read a YAML config (or none: all defaults) and apply dotted overrides."""
    raw: Any = {}
    source = path or "command line"
    if path:
        raw = read_yaml(path) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    _import_plugins(raw, source)
    if overrides:
        config_from_dict(copy.deepcopy(raw), source)  # a mistake in the file is the file's
        apply_overrides(raw, list(overrides))
        source = f"{source} with command-line overrides" if path else source
        _import_plugins(raw, source)  # plugins=[...] given as an override
    return config_from_dict(raw, source)


def config_to_dict(cfg: Config) -> dict:
    """Plain nested values (what checkpoints and ``config.yaml`` store)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str, inputs: Sequence[Input] = ()) -> None:
    """Write the resolved config (every key, defaults included) atomically, never onto ``inputs``."""
    text = f"# onmt_doc resolved config, format_version {FORMAT_VERSION}\n" + yaml.safe_dump(
        config_to_dict(cfg), sort_keys=False, allow_unicode=True
    )
    write_text(path, text, inputs, flag="")
