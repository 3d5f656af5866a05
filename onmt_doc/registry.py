"""Registries: the one way to name a part in YAML and build it.

Each kind of part (encoder, decoder, loss, optimizer, schedule; and translation units, search
strategies, length penalties) has one :class:`Registry`.
A part registers itself with its own config dataclass; the config loader validates the part's
YAML section against that dataclass, and :meth:`Registry.build` gives the part only that section.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from onmt_doc.errors import ConfigError

# kind -> module whose import fills that kind's registry (imported lazily, so the config package can
# resolve part sections without import cycles).
_REGISTRY_MODULES = {
    "encoder": "onmt_doc.encoders",
    "decoder": "onmt_doc.decoders",
    "loss": "onmt_doc.losses",
    "optimizer": "onmt_doc.optim.optimizers",
    "schedule": "onmt_doc.optim.schedules",
    "unit": "onmt_doc.data.instances",
    "field": "onmt_doc.data.example_fields",  # providers register on import (z*: data/pmi.py)
    "search": "onmt_doc.translate.search",  # strategies: translate.strategy (beam, greedy, sampling)
    "length_penalty": "onmt_doc.translate.length_penalty",  # translate.length_penalty_type
    "engine": "onmt_doc.translate.ctranslate2_engine",  # Translator.load(engine=): torch, ctranslate2
}


@dataclass(frozen=True)
class Entry:
    """One registered part: its YAML name, the class to build and the config dataclass of its section."""

    name: str
    cls: Callable[..., Any]
    config: Optional[type]  # None for kinds without a section of their own (fields)


def closest(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest candidate, or '' when none is close."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


class Registry:
    """The parts of one kind by name; ``get`` turns an unknown name into a ConfigError with a suggestion."""

    def __init__(self, kind: str) -> None:
        """``kind`` names the part kind in error messages (``encoder``, ``loss``…)."""
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, config: Optional[type]) -> Callable:
        """Class decorator: ``@REGISTRY.register("transformer", TransformerEncoderConfig)``."""

        def decorator(cls: type) -> type:
            if name in self._entries:
                raise ValueError(
                    f"{self.kind} '{name}' is already registered by {self._entries[name].cls.__qualname__}"
                )
            self._entries[name] = Entry(name, cls, config)
            return cls

        return decorator

    def names(self) -> list[str]:
        """Registered names, sorted (error messages and the generated docs/config.md list them)."""
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` is registered (no error, unlike :meth:`get`)."""
        return name in self._entries

    def get(self, name: str, where: str = "type") -> Entry:
        """The entry of ``name``; unknown names raise ConfigError at ``where``, with the closest
        registered name and the full list."""
        if name not in self._entries:
            raise ConfigError(
                f"{where}: unknown {self.kind} type '{name}'{closest(name, self._entries)}; "
                f"registered: {', '.join(self.names())}"
            )
        return self._entries[name]

    def build(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        """Build the part named by ``cfg.type``, passing it its own config section."""
        return self.get(cfg.type).cls(cfg, *args, **kwargs)


def registry_for(kind: str) -> Registry:
    """The registry of a kind of part, importing the package that fills it."""
    module = importlib.import_module(_REGISTRY_MODULES[kind])
    return module.REGISTRY
