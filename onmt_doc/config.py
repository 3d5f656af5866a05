"""Strict nested configuration: one dataclass per YAML section.

Loading is strict: an unknown key is an error naming the file, the key path and the closest valid
key; a wrong type names the key and the expected type. Parts chosen by ``type:`` (encoder,
decoder, losses, optimizer, schedule) are validated against the config dataclass their registry
entry declares, so each part sees only its own section. Every key has a default except the data
paths, which the commands that need them check.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import yaml

from onmt_doc.errors import ConfigError
from onmt_doc.registry import closest, registry_for

FORMAT_VERSION = 1


@dataclass
class PartConfig:
    """Base of every registered part's config: ``type`` names the registry entry."""

    type: str = ""


@dataclass
class LossConfig(PartConfig):
    """Base of every loss config: losses in the ``loss:`` list are summed with these weights."""

    weight: float = 1.0


def part(kind: str, default_type: Optional[str] = None, **kw: Any) -> Any:
    """A config field holding a registered part (or, without a default type, a list of them)."""
    metadata = {"part": kind}
    if default_type is None:
        return field(default_factory=list, metadata=metadata, **kw)
    return field(default_factory=lambda: default_part(kind, default_type), metadata=metadata, **kw)


def default_part(kind: str, name: str) -> PartConfig:
    return registry_for(kind).get(name).config(type=name)


# ----------------------------------------------------------------------------- sections


@dataclass
class CorpusConfig:
    src: Optional[str] = None
    tgt: Optional[str] = None


@dataclass
class DataConfig:
    train: CorpusConfig = field(default_factory=CorpusConfig)
    valid: CorpusConfig = field(default_factory=CorpusConfig)
    # blank lines separate documents; false = every line stands alone (blank lines are then
    # skipped in training and kept in translation output)
    documents: bool = True
    max_tokens: int = 512          # document instance budget (subword tokens with markup)
    max_sentences: int = 0         # context unit (HM-GDC): document window size (0 = whole documents)
    max_len: int = 0               # drop training pairs with a side longer than this (0 = keep all)
    max_line_chars: int = 20000    # a longer line is an error (a sign of a broken file)
    cache_dir: Optional[str] = None  # binarized data cache; default: <log.dir>/cache


@dataclass
class VocabConfig:
    subword: Literal["bpe", "sentencepiece", "none"] = "bpe"
    size: int = 8000               # BPE merges / SentencePiece pieces
    shared: bool = True            # one subword model and one vocabulary for both sides
    min_freq: int = 1              # vocabulary entries seen fewer times are dropped
    max_size: int = 0              # cap on vocabulary entries (0 = no cap)
    tokenizer: Literal["aggressive", "conservative", "space", "char", "none"] = "aggressive"
    sample_lines: int = 0          # learn the subword model on this many lines (0 = all)


@dataclass
class ModelConfig:
    d_model: int = 512
    share_embeddings: bool = True  # source and target embeddings (needs vocab.shared)
    tie_output: bool = True        # output projection = target embedding matrix
    dropout: float = 0.1
    attention_dropout: float = 0.1
    max_positions: int = 4096      # sinusoidal table size, grown on demand
    # training only: replace source and decoder-input words (never special tokens) by
    # word_dropout_token with this probability (G-Transformer uses 0.3 from scratch, 0.1 fine-tuned)
    word_dropout: float = 0.0
    word_dropout_token: Literal["unk", "mask"] = "unk"
    encoder: PartConfig = part("encoder", "transformer")
    decoder: PartConfig = part("decoder", "transformer")


@dataclass
class OptimConfig(PartConfig):
    """Optimizer section; ``type`` is adam, adamw, sgd or a torch-optimizer name (radam, lamb…)."""

    type: str = "adam"
    lr: float = 5.0e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1.0e-9
    weight_decay: float = 0.0
    params: dict = field(default_factory=dict)  # other constructor arguments, checked by name
    schedule: PartConfig = part("schedule", "inverse_sqrt")


@dataclass
class TrainConfig:
    batch_tokens: int = 4096       # padded tokens per batch: B * max(src_len, tgt_len)
    accum: int = 1                 # batches per optimizer step
    max_steps: int = 100000
    max_epochs: int = 0            # 0 = no limit
    valid_every: int = 1000
    valid_bleu: bool = True        # translate the validation set at each validation
    valid_beam: int = 1            # beam for validation BLEU (1 = greedy, fast)
    save_every: int = 1000
    keep_last: int = 5
    early_stopping: int = 0        # stop after this many validations without improvement (0 = off)
    early_stopping_metric: Literal["loss", "bleu"] = "loss"
    max_grad_norm: float = 1.0     # 0 = no clipping
    # mixed precision; auto = bf16 on GPUs (fp16 where bf16 is missing), fp32 on CPUs
    amp: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    seed: int = 1
    init_from: Optional[str] = None  # checkpoint whose matching parameters initialise the model
    init_lr_scale: float = 0.2     # lr scale of the parameters copied by init_from
    resume: bool = True            # continue from <log.dir>/checkpoints/last.pt when it exists
    # a resume whose data or batching keys (train.batch_tokens, train.seed, processes) changed:
    # exact = refuse; next_epoch = accept, continue with the new batch order from the next epoch
    resume_data: Literal["exact", "next_epoch"] = "exact"
    device: str = "auto"           # auto | cpu | cuda | cuda:N
    threads: int = 0               # CPU threads per process (0 = OMP_NUM_THREADS alone, else cores / local processes)


@dataclass
class TranslateConfig:
    beam: int = 5
    n_best: int = 1
    length_penalty: float = 1.0    # GNMT alpha; 0 = none
    max_len_ratio: float = 1.5     # output length cap = ratio * source length + max_len_add
    max_len_add: int = 10
    max_length: int = 250          # absolute output cap per sentence (subword tokens), whatever the ratio
    # longer source lines are split at a word boundary into pieces of at most this many subword
    # tokens, translated separately and joined with a space (bounds the quadratic cost of a line)
    max_input_tokens: int = 200
    # context unit (HM-GDC): sentences per translation window; 0 = data.max_sentences, or windows
    # packed to data.max_tokens when that is 0 too (never a whole long document at once)
    window_sentences: int = 0
    batch_tokens: int = 4096       # padded source tokens per translation batch
    batch_sentences: int = 0       # cap on batch rows: sentences (document unit: instances); 0 = no cap
    buffer_sentences: int = 2000   # sentences read ahead (sorted by length within the buffer)
    # weights and activations while translating; bfloat16 is several times faster on CPUs with
    # AMX/AVX512-BF16 and on GPUs, at a small cost in exactness (scores stay float32)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


@dataclass
class LogConfig:
    dir: str = "runs/default"
    tensorboard: bool = True
    every: int = 50


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: list[LossConfig] = part("loss", None)
    optim: OptimConfig = part("optimizer", "adam")
    train: TrainConfig = field(default_factory=TrainConfig)
    translate: TranslateConfig = field(default_factory=TranslateConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        if not self.loss:
            self.loss = [default_part("loss", "label_smoothed_ce")]


# ----------------------------------------------------------------------------- loading

def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


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
                raise ConfigError(f"{self.source}: unknown key '{_join(path, key)}'"
                                  f"{closest(str(key), fields)}")
        kwargs = {}
        for name, f in fields.items():
            if name in data:
                kind = f.metadata.get("part")
                if kind:
                    kwargs[name] = self.part_field(kind, data[name], _join(path, name), f)
                else:
                    kwargs[name] = self.value(hints[name], data[name], _join(path, name))
        return cls(**kwargs)

    def part_field(self, kind: str, data: Any, path: str, f: dataclasses.Field) -> Any:
        if f.default_factory is list:  # a list of parts (losses)
            if not isinstance(data, list):
                self.fail(path, f"expected a list of {kind} sections, got {type(data).__name__}")
            return [self.part(kind, item, _join(path, i), None) for i, item in enumerate(data)]
        return self.part(kind, data, path, f.default_factory().type)

    def part(self, kind: str, data: Any, path: str, default_type: Optional[str]) -> PartConfig:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping with a 'type' key, got {data!r}")
        name = data.get("type", default_type)
        if name is None:
            self.fail(path, f"missing 'type' (registered: {', '.join(registry_for(kind).names())})")
        entry = registry_for(kind).get(str(name), where=f"{self.source}: {_join(path, 'type')}")
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
            if value not in typing.get_args(tp):
                self.fail(path, f"expected {_type_name(tp)}, got {value!r}")
            return value
        if origin is list:
            if not isinstance(value, (list, tuple)):
                self.fail(path, f"expected a list, got {value!r}")
            (item,) = typing.get_args(tp) or (Any,)
            return [self.value(item, v, _join(path, i)) for i, v in enumerate(value)]
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                self.fail(path, f"expected a mapping, got {value!r}")
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
                    return float(value)
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(path, f"expected float, got {value!r}")
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                self.fail(path, f"expected str, got {value!r}")
            return value
        raise TypeError(f"config field {path} has unsupported type {tp!r}")


def apply_overrides(raw: dict, overrides: list[str], source: str = "command line") -> dict:
    """Apply ``a.b.c=value`` overrides (list items by index: ``loss.1.weight=0.5``) to a raw dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: override '{item}' is not of the form key.path=value")
        key, text = item.split("=", 1)
        try:
            value = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError:
            value = text
        parts = key.split(".")
        node: Any = raw
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            where = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not name.isdigit() or int(name) >= len(node):
                    raise ConfigError(f"{source}: override '{key}': '{where}' needs an index "
                                      f"below {len(node)}")
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


# keys whose value must be at least this (a zero would divide by zero or silently do nothing)
_MINIMUM = {"data.max_tokens": 1, "data.max_sentences": 0, "vocab.size": 1, "model.d_model": 1, "train.batch_tokens": 1,
            "train.accum": 1, "train.max_steps": 0, "train.valid_every": 1, "train.save_every": 1,
            "train.keep_last": 1, "train.threads": 0, "train.valid_beam": 1, "translate.beam": 1, "translate.n_best": 1,
            "translate.batch_tokens": 1, "translate.buffer_sentences": 1, "translate.batch_sentences": 0,
            "translate.length_penalty": 0, "translate.max_len_add": 0, "translate.max_length": 1,
            "translate.max_input_tokens": 1, "translate.window_sentences": 0, "log.every": 1}


def _check_values(cfg: "Config", source: str) -> None:
    for key, minimum in _MINIMUM.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value < minimum:
            raise ConfigError(f"{source}: {key}: must be at least {minimum}, got {value}")
    if cfg.translate.n_best > cfg.translate.beam:
        raise ConfigError(f"{source}: translate.n_best ({cfg.translate.n_best}) cannot exceed translate.beam "
                          f"({cfg.translate.beam})")
    if cfg.train.early_stopping_metric == "bleu" and not cfg.train.valid_bleu:
        raise ConfigError(f"{source}: train.early_stopping_metric: bleu needs train.valid_bleu: true")
    if cfg.model.share_embeddings and not cfg.vocab.shared:   # checked before any subword learning
        raise ConfigError(f"{source}: model.share_embeddings: true needs one shared vocabulary "
                          f"(vocab.shared: true), or set model.share_embeddings: false")
    if not 0.0 <= cfg.model.word_dropout < 1.0:
        raise ConfigError(f"{source}: model.word_dropout: must be in [0, 1), got {cfg.model.word_dropout}")
    for which in ("encoder", "decoder"):
        part_cfg = getattr(cfg.model, which)
        heads = getattr(part_cfg, "heads", None)
        if heads and cfg.model.d_model % heads:
            raise ConfigError(f"{source}: model.{which}.heads: model.d_model ({cfg.model.d_model}) is not "
                              f"divisible by {heads} heads")
        for key in ("global_layers", "global_cross_layers"):   # top layers of a stack (G-Transformer)
            value = getattr(part_cfg, key, None)
            if value is not None and not 0 <= value <= part_cfg.layers:
                raise ConfigError(f"{source}: model.{which}.{key}: must be between 0 and "
                                  f"model.{which}.layers ({part_cfg.layers}), got {value}")
        if getattr(part_cfg, "share_attention", False) and part_cfg.doc_layers > part_cfg.layers:
            raise ConfigError(f"{source}: model.{which}.doc_layers ({part_cfg.doc_layers}): with share_attention "
                              f"each document layer reuses a sentence layer's self-attention, so at most "
                              f"model.{which}.layers ({part_cfg.layers}); or set share_attention: false")


def config_from_dict(raw: dict, source: str = "config") -> Config:
    cfg = _Loader(source).dataclass(Config, raw, "")
    _check_values(cfg, source)
    return cfg


def load_config(path: Optional[str], overrides: Optional[list[str]] = None) -> Config:
    """Read a YAML config (or none: all defaults) and apply dotted overrides."""
    raw: Any = {}
    source = path or "command line"
    if path:
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: config file not found")
        try:
            with open(path, encoding="utf-8") as f:
                raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not valid UTF-8") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    if overrides:
        config_from_dict(copy.deepcopy(raw), source)      # a mistake in the file is the file's
        apply_overrides(raw, list(overrides))
        source = f"{source} with command-line overrides" if path else source
    return config_from_dict(raw, source)


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str) -> None:
    """Write the resolved config (every key, defaults included) atomically."""
    text = (f"# onmt_doc resolved config, format_version {FORMAT_VERSION}\n"
            + yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
