"""docs/config.md's key tables, generated from the config dataclasses' field metadata.

The help text of every key lives next to the key (``option(default, help)`` in the dataclass), so
the reference cannot drift from the code. docs/config.md keeps its hand-written prose; only the
text between ``<!-- config-keys NAME -->`` and ``<!-- /config-keys -->`` is generated. NAME is a
top-level section (``data``, ``loss`` for the keys every loss has, ``optim`` ...) or a registered
part as ``kind:name`` (``encoder:g_transformer``, ``schedule:noam``).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any, Literal, Union

from onmt_doc.config import Config, LossConfig, PartConfig
from onmt_doc.registry import registry_for

# kinds of parts with one table per registered name (optimizers all share the optim section's keys)
TABLE_KINDS = ("encoder", "decoder", "loss", "schedule")
BEGIN = "<!-- config-keys {} -->"
END = "<!-- /config-keys -->"
HEADER = "| key | type | default | meaning |\n|---|---|---|---|"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "config.md"


@dataclasses.dataclass(frozen=True)
class Table:
    """One key table: the dataclass, an instance holding the defaults, and whether ``type`` is a row
    (a part's table sits under a heading that already names its type)."""

    cls: type
    defaults: Any
    with_type: bool
    only: tuple[str, ...] = ()  # the keys to list (the root's plain keys); empty: all


def tables() -> dict[str, Table]:
    """Every table docs/config.md must have: the sections, then each registered part."""
    root = Config()
    found: dict[str, Table] = {}
    plain = []  # top-level keys that are not sections (plugins)
    for f in dataclasses.fields(Config):
        obj = LossConfig() if f.name == "loss" else getattr(root, f.name)
        if dataclasses.is_dataclass(obj):
            found[f.name] = Table(type(obj), obj, True)
        else:
            plain.append(f.name)
    if plain:
        found["top-level"] = Table(Config, root, True, tuple(plain))
    for kind in TABLE_KINDS:
        registry = registry_for(kind)
        for name in registry.names():
            found[f"{kind}:{name}"] = Table(registry.get(name).config, registry.get(name).config(type=name), False)
    return found


def config_classes() -> list[type]:
    """Every config dataclass reachable from the tables (nested ones such as data.train included)."""
    seen: list[type] = [Config]
    for table in tables().values():
        todo = [table.cls]
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.append(cls)
            hints = typing.get_type_hints(cls)
            todo.extend(hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name]))
    return seen


def type_text(tp: Any, f: dataclasses.Field) -> str:
    """The type column: as a user writes it in YAML."""
    if f.metadata.get("part"):
        return "part section"
    origin = typing.get_origin(tp)
    if origin is Literal:
        names = [f"`{a}`" for a in typing.get_args(tp)]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(type_text(a, f) for a in args) + (" or null" if type(None) in typing.get_args(tp) else "")
    if origin is list:
        (item,) = typing.get_args(tp)
        return f"list of {type_text(item, f)}"
    if origin is dict or tp is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping `{" + ", ".join(g.name for g in dataclasses.fields(tp)) + "}`"
    return tp.__name__


def value_text(value: Any) -> str:
    """A default in YAML flow style (``null``, ``true``, ``5.0e-4``, ``{type: adam}``)."""
    if isinstance(value, PartConfig):
        return f"{{type: {value.type}}}"
    if dataclasses.is_dataclass(value):
        return (
            "{" + ", ".join(f"{g.name}: {value_text(getattr(value, g.name))}" for g in dataclasses.fields(value)) + "}"
        )
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value and abs(value) < 1e-3:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def row(f: dataclasses.Field, tp: Any, value: Any, prefix: str = "") -> str:
    """One markdown row of a key; its help text comes from the field's ``option(default, help)`` metadata."""
    default = f.metadata.get("shown") or f"`{value_text(value)}`"
    meaning = (prefix + f.metadata.get("help", "")).replace("|", "\\|")
    return f"| `{f.name}` | {type_text(tp, f)} | {default} | {meaning} |"


def render(table: Table) -> str:
    """The table's markdown: a row per key; a nested section's keys follow its last field, marked
    "(inside `train`/`valid`)"."""
    hints = typing.get_type_hints(table.cls)
    fields = [f for f in dataclasses.fields(table.cls) if table.with_type or f.name != "type"]
    fields = [f for f in fields if f.name in table.only] if table.only else fields
    fields = fields or list(dataclasses.fields(table.cls))  # a part without keys of its own: its type
    lines = [HEADER]
    for i, f in enumerate(fields):
        lines.append(row(f, hints[f.name], getattr(table.defaults, f.name)))
        nested = hints[f.name]
        if not dataclasses.is_dataclass(nested) or f.metadata.get("part"):
            continue
        if any(hints[g.name] is nested for g in fields[i + 1 :]):
            continue  # listed once, after the last field of its type
        holders = "/".join(f"`{g.name}`" for g in fields if hints[g.name] is nested)
        inner = typing.get_type_hints(nested)
        for g in dataclasses.fields(nested):
            lines.append(row(g, inner[g.name], getattr(nested(), g.name), f"(inside {holders}) "))
    return "\n".join(lines)


def regenerate(text: str) -> str:
    """``text`` (docs/config.md) with every generated table rewritten; a missing or unknown table
    is an error that says which marker to add or remove."""
    wanted = tables()
    pattern = re.compile(r"<!-- config-keys (\S+) -->\n.*?<!-- /config-keys -->", re.S)
    present = pattern.findall(text)
    unknown = [name for name in present if name not in wanted]
    missing = [name for name in wanted if name not in present]
    if unknown or missing:
        raise ValueError(
            f"docs/config.md: tables of unknown names {unknown}; missing tables {missing} (add "
            f"'{BEGIN.format('kind:name')}' and '{END}' lines under the part's heading)"
        )
    return pattern.sub(lambda m: f"{BEGIN.format(m.group(1))}\n{render(wanted[m.group(1)])}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    """``--check``: exit 1 when docs/config.md is not what the dataclasses generate."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/config.md is current")
    parser.add_argument("--docs", default=str(DOCS), help="the config reference to rewrite")
    args = parser.parse_args(argv)
    path = Path(args.docs)
    text = path.read_text(encoding="utf-8")
    new = regenerate(text)
    if args.check:
        if new != text:
            print(f"{path} is out of date: run python tools/config_reference.py")
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"rewrote {path}")
    return 0
