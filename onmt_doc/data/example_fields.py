"""Per-example fields: arrays aligned with an example's target that a loss asks for by name.

A loss declares the fields it reads (``needs_fields = ("z_star",)``); the data pipeline builds
each field's provider from that loss's own config section (the keys the provider reads, e.g. a
table path) and a :class:`FieldContext`. A provider gives one value per target token of a corpus
(:meth:`FieldProvider.values`, aligned with the corpus's target ids, caching what is slow in the
corpus's cache folder beside them); the instances take their target sentences' values like their
ids, with 0 at the markup (``MappedExamples``), so a batch reads them with its ids and collation
pads them into ``Batch.extra`` (0 for ``<eos>`` and padding). A loss only computes its formula: it
never sees the corpus, the whole config or the run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from onmt_doc.data.codec import Codec
from onmt_doc.registry import Registry

if TYPE_CHECKING:
    from onmt_doc.data.mapped import MappedCorpus


@dataclass
class FieldContext:
    """What every field provider gets besides the section that asked for it."""

    codec: Codec


class FieldProvider(Protocol):
    """What a registered field factory returns: the values of the ``Example.extra`` arrays a loss reads."""

    keys: tuple[str, ...]  # the Example.extra keys it fills

    def values(self, corpus: MappedCorpus) -> dict[str, np.ndarray]:
        """Per key, one value per target id of ``corpus`` (``len(corpus.tgt)``, sentence after
        sentence, without markup): read per batch, so a memory-mapped array costs no memory."""


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


def field_values(providers: Sequence[FieldProvider], corpus: MappedCorpus) -> dict[str, np.ndarray]:
    """Every provider's values for ``corpus``, each giving the keys it declares (``MappedExamples``
    checks that there is one value per target id)."""
    out: dict[str, np.ndarray] = {}
    for provider in providers:
        values = provider.values(corpus)
        if set(values) != set(provider.keys):
            raise ValueError(f"{type(provider).__name__} gave fields {sorted(values)}, declares {list(provider.keys)}")
        out.update(values)
    return out
