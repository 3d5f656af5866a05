"""Per-example fields: arrays aligned with an example's target that a loss asks for by name.

A loss declares the fields it reads (``needs_fields = ("z_star",)``); the data pipeline builds
each field's provider from that loss's own config section (the keys the provider reads, e.g. a
table path) and a :class:`FieldContext`, and the provider fills ``Example.extra`` before training,
caching what is slow next to the binarized data. Collation pads the arrays into ``Batch.extra``.
So a loss only computes its formula: it never sees the corpus, the whole config or the run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

from onmt_doc.data.codec import Codec
from onmt_doc.data.instances import Example
from onmt_doc.registry import Registry


@dataclass
class FieldContext:
    """What every field provider gets besides the section that asked for it."""

    codec: Codec
    cache_dir: Optional[str] = None  # the binarized data's cache folder (None: no caching)


class FieldProvider(Protocol):
    """What a registered field factory returns: fills the ``Example.extra`` arrays a loss reads."""

    keys: tuple[str, ...]  # the Example.extra keys it fills

    def attach(self, examples: Sequence[Example], docs: Sequence) -> None:
        """Fill ``extra[key]`` of every example (aligned with its target) from the tokenized
        documents ``docs`` the examples index."""


ProviderFactory = Callable[[Any, FieldContext], FieldProvider]
# field providers by name, in the registry every pluggable kind uses; a provider has no config
# section of its own (it reads the keys of the section that asks for it)
REGISTRY = Registry("field")


def register_field(name: str) -> Callable[[ProviderFactory], ProviderFactory]:
    """Decorator of a provider factory ``(section, ctx) -> FieldProvider`` under ``name``."""
    return REGISTRY.register(name, None)


def build_field(name: str, section: Any, ctx: FieldContext) -> FieldProvider:
    """The provider of field ``name``, reading its keys from ``section`` (the asking part's config).
    An unknown name is a programming error of the loss that asks for it, not a user's mistake."""
    if name not in REGISTRY:
        raise ValueError(f"no provider for field '{name}' (registered: {', '.join(REGISTRY.names()) or 'none'})")
    return REGISTRY.get(name).cls(section, ctx)


def attach_fields(examples: Sequence[Example], docs: Sequence, providers: Sequence[FieldProvider]) -> None:
    """Let every provider fill its fields of ``examples``."""
    for provider in providers:
        provider.attach(examples, docs)
