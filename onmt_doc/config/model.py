"""The ``model:`` section, and the parameter-size estimate that refuses a model no machine could hold.

:class:`ModelConfig` holds the sizes every part shares and the ``encoder`` / ``decoder`` part
sections. :func:`check_model_size` runs when the config is read: the parts' ``parameter_estimate``
(a lower bound) against this machine's memory, so a typo such as ``ff: 4000000000`` is a one-line
error naming the key furthest above its default, not an allocation failure halfway through the build.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal, Optional

from onmt_doc.config.options import PartConfig, RootConfig, join_path, option, part
from onmt_doc.errors import ConfigError
from onmt_doc.registry import registry_for


@dataclass
class ModelConfig:
    """``model:`` sizes shared by all parts, and the encoder, decoder and loss sections."""

    d_model: int = option(512, "model width, shared by embeddings, encoder and decoder", minimum=1)
    share_embeddings: bool = option(
        True,
        "one embedding matrix for source and target; needs `vocab.shared: "
        "true` (a config with `vocab.shared: false` must set it to `false`: refused "
        "when the config is read)",
    )
    tie_output: bool = option(True, "the output projection uses the target embedding matrix (it keeps its own bias)")
    dropout: float = option(
        0.1,
        "dropout on embeddings, on every sublayer output before the residual sum, and inside the feed-forward; "
        "in [0, 1)",
        minimum=0,
        below=1,
    )
    attention_dropout: float = option(0.1, "dropout on attention probabilities; in [0, 1)", minimum=0, below=1)
    max_positions: int = option(
        4096, "initial size of the sinusoidal position table; it grows on demand and is not saved", minimum=1
    )
    activation: Literal["relu", "gelu", "swish"] = option(
        "relu",
        "activation of every feed-forward network of the model: `relu` (Vaswani et al., 2017), `gelu` "
        "(exact, erf) or `swish` (SiLU, x·sigmoid(x): Marian / OPUS-MT models)",
    )
    position_layout: Literal["interleaved", "halves"] = option(
        "interleaved",
        "where the sinusoidal position encodings put sin and cos of each frequency: alternating columns "
        "(`interleaved`, OpenNMT-py's) or all sines then all cosines (`halves`, Marian's); both from position 0",
    )
    scale_embedding: bool = option(
        True, "multiply token embeddings by sqrt(`d_model`) before adding positions (`false`: as is)"
    )
    layer_norm_eps: float = option(
        1e-5, "epsilon of every layer norm of the model (torch's default; Marian's in transformers)", above=0
    )
    word_dropout: float = option(
        0.0,
        "training only: each source word and decoder-input word is replaced by "
        "`word_dropout_token` with this probability; special tokens (markup, `<bos>`) "
        "and the targets never change (G-Transformer: 0.3 from scratch, 0.1 fine-tuned); "
        "must be in [0, 1)",
        minimum=0,
        below=1,
    )
    word_dropout_token: Literal["unk", "mask"] = option("unk", "the replacement token of word dropout")
    unit: Optional[str] = option(
        None,
        "the translation unit: `null` = the one the encoder and decoder declare (`sentence`, `document`, "
        "`context`); `k_to_1` / `k_to_k` = the concatenation baselines for sentence-level parts (k = "
        "`data.context_sentences`; see [models/concatenation.md](models/concatenation.md))",
    )
    encoder: PartConfig = part("encoder", "transformer", "the encoder; see [Encoders](#encoders)")
    decoder: PartConfig = part("decoder", "transformer", "the decoder; see [Decoders](#decoders)")

    def part_units(self) -> set[str]:
        """The units the encoder and decoder declare (``{"sentence"}``: sentence-level parts)."""
        sections = (("encoder", self.encoder), ("decoder", self.decoder))
        return {registry_for(k).get(c.type).cls.unit for k, c in sections}

    def resolved_unit(self) -> str:
        """The translation unit: the chosen one, else the one a document-level part declares."""
        return self.unit or next(iter(self.part_units() - {"sentence"}), "sentence")

    def validate(self, path: str, root: RootConfig) -> None:
        """A chosen ``unit`` must be registered and fit the parts (``check_unit``); the parameters
        must fit in memory (``check_model_size``)."""
        check_model_size(self, path)
        if self.unit is not None:  # units live in the data layer: reached through their registry, like parts
            unit = registry_for("unit").get(self.unit, f"{path}.unit").cls
            unit.check_parts(self.unit, self.part_units(), f"{path}.unit")


def physical_memory() -> Optional[int]:
    """This machine's memory in bytes, or None where the OS does not say (the check is then skipped)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_model_size(model: "ModelConfig", path: str) -> None:
    """Refuse a model whose float32 parameters alone (a lower bound: the position table, the parts'
    ``parameter_estimate``) exceed this machine's memory: torch would fail halfway through the build
    with an allocation error, or the machine would swap for minutes first. The message names the
    size key furthest above its default, the likely typo."""
    memory = physical_memory()
    need = 4 * (
        model.max_positions * model.d_model
        + sum(p.parameter_estimate(model.d_model) for p in (model.encoder, model.decoder))
    )
    if memory is None or need <= memory:
        return
    key, value = max(_size_keys(model, path), key=lambda kv: kv[1] / kv[2])[:2]
    raise ConfigError(
        f"{key} {value}: the model would need ~{need / 1e9:,.0f} GB of parameters, more than this machine's "
        f"{memory / 1e9:,.0f} GB of memory"
    )


def _size_keys(model: "ModelConfig", path: str) -> list[tuple[str, int, int]]:
    """(key path, value, default) of every positive-default int key of the model and its parts."""
    found = []
    for where, node in ((path, model), (f"{path}.encoder", model.encoder), (f"{path}.decoder", model.decoder)):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if type(value) is int and type(f.default) is int and f.default > 0:
                found.append((join_path(where, f.name), value, f.default))
    return found
