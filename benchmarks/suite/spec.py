"""Benchmark specs: one YAML file names the systems (a ``config_examples/`` file plus overrides),
the stages to run in order (each a registered stage type with its parameters, its smoke-size
overrides and its time budget) and the tables ``report`` renders. Unknown keys are errors, never
ignored, and every error names the spec file and the key."""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from benchmarks.suite.system import REPO, System
from onmt_doc.config.loading import read_yaml
from onmt_doc.errors import ConfigError

SPECS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "specs")


@dataclass
class Table:
    """A Markdown table of a stage's records: the columns to show, the records to keep."""

    columns: list = field(default_factory=list)  # record keys; empty: every key
    where: dict = field(default_factory=dict)  # keep records whose keys have these values
    needs: list = field(default_factory=list)  # keep records that hold all these keys
    title: str = ""


@dataclass
class StageSpec:
    """One step of a spec: its registered type, parameters, smoke overrides, budget, tables."""

    type: str
    name: str = ""
    params: dict = field(default_factory=dict)
    smoke: dict = field(default_factory=dict)  # parameters replaced under --smoke
    budget_seconds: float = 600.0
    smoke_budget_seconds: Optional[float] = None  # under --smoke (default: budget_seconds)
    note: str = ""  # a sentence under the stage's tables (what the numbers are, what they are not)
    tables: list = field(default_factory=list)


@dataclass
class Spec:
    """A whole benchmark: what runs, on which device, within which time, rendered where."""

    title: str
    section: str  # the docs/benchmarks.md heading ``report`` regenerates ("## <section>")
    stages: list
    description: str = ""
    device: str = "auto"  # auto (cuda when present), cuda, cpu
    budget_seconds: float = 3600.0
    smoke_budget_seconds: Optional[float] = None
    systems: dict = field(default_factory=dict)
    path: str = ""
    name: str = ""


def fill(cls: type, data: Any, where: str) -> Any:
    """``cls(**data)`` for a dataclass, refusing unknown keys, missing required keys and values of
    the wrong type, each with ``where`` (file: key path) in the message."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'; known: {', '.join(sorted(fields))}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in data:
            raise ConfigError(f"{where}: missing key '{name}'")
        if name in data:
            _check_type(data[name], hints[name], f"{where}.{name}")
    return cls(**data)


def _check_type(value: Any, hint: Any, where: str) -> None:
    """A plain check of YAML values against simple annotations (int, float, str, bool, list, dict,
    Optional[...]); anything richer is the stage's own business."""
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        if value is None and type(None) in typing.get_args(hint):
            return
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    base = origin or hint
    if base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base in (str, bool, list, dict):
        ok = isinstance(value, base)
    else:
        ok = True
    if not ok:
        raise ConfigError(f"{where}: expected {getattr(base, '__name__', base)}, got {value!r}")


def load_spec(path: str) -> Spec:
    """Read and check a spec file (a bare name is looked up in benchmarks/specs/)."""
    if not os.path.exists(path) and os.path.exists(os.path.join(SPECS_DIR, path)):
        path = os.path.join(SPECS_DIR, path)
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: no such spec (python -m benchmarks list shows them)")
    raw = read_yaml(path, "spec")
    spec = fill(Spec, raw, path)
    spec.path, spec.name = path, os.path.splitext(os.path.basename(path))[0]
    if spec.device not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"{path}: device: expected auto, cuda or cpu, got {spec.device!r}")
    spec.systems = {name: _system(name, raw_sys, f"{path}: systems.{name}") for name, raw_sys in spec.systems.items()}
    spec.stages = [_stage(i, s, spec) for i, s in enumerate(spec.stages)]
    names = [s.name for s in spec.stages]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"{path}: stage name '{dup}' is used twice")
    return spec


def _system(name: str, raw: Any, where: str) -> System:
    system = fill(System, raw, where)
    system.name = name
    if not os.path.isfile(os.path.join(REPO, system.config)):
        raise ConfigError(f"{where}.config: no such file {system.config}")
    return system


def _stage(index: int, raw: Any, spec: Spec) -> StageSpec:
    from benchmarks.stage_types import STAGES  # fills the registry

    where = f"{spec.path}: stages[{index}]"
    st = fill(StageSpec, raw, where)
    st.name = st.name or st.type
    entry = STAGES.get(st.type, where=f"{where}.type")
    fill(entry.config, st.params, f"{where}.params")  # checked now, not after an hour of earlier stages
    fill(entry.config, {**st.params, **st.smoke}, f"{where}.smoke")
    st.tables = [fill(Table, t, f"{where}.tables[{i}]") for i, t in enumerate(st.tables)]
    for key in ("systems", "system", "init_from"):
        for name in _as_list(st.params.get(key)):
            if name not in spec.systems:
                raise ConfigError(f"{where}.params.{key}: unknown system '{name}'; the spec has {sorted(spec.systems)}")
    return st


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def stage_params(spec: Spec, st: StageSpec, smoke: bool) -> Any:
    """The stage's parameter dataclass, smoke overrides applied when ``smoke``."""
    from benchmarks.stage_types import STAGES

    entry = STAGES.get(st.type)
    return fill(entry.config, {**st.params, **(st.smoke if smoke else {})}, f"{spec.path}: {st.name}")


def all_specs() -> list[str]:
    """The spec files of benchmarks/specs, sorted."""
    return sorted(os.path.join(SPECS_DIR, n) for n in os.listdir(SPECS_DIR) if n.endswith(".yaml"))
