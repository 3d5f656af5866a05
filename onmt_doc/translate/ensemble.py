"""Ensembles: several models decoded as one, averaging their log-probabilities (or probabilities).

:class:`EnsembleModel` has the decoding interface the search loop and forced decoding use
(``unit``, ``encode``, ``init_state``, ``step``, ``decoder.max_output_lengths``,
``decoder.constrain``, ``full_log_probs``), so beam search, sampling and ``-score`` run on it
unchanged. ``translate.ensemble_average`` picks how the K members' next-token distributions
are combined:

    log_prob (default):  s(y | ·) = 1/K · Σ_k log p_k(y | ·)       (OpenNMT-py's default)
    prob:                log p(y | ·) = log (1/K · Σ_k p_k(y | ·))  (fairseq; OpenNMT-py's
                                                                      ``avg_raw_probs``)

The first is a (unnormalised) geometric mean: a token any member finds unlikely is penalised
hard; the second is a proper distribution, computed with ``logsumexp``. Each member keeps its
own decoding state inside an :class:`EnsembleState`, reordered together, so members may differ
in architecture (a Transformer and an MHPLSTM, a G-Transformer and a document Transformer) as
long as they read the same input: the same vocabularies and subword models, the same translation
unit and the same data settings that shape the input. Translation options and data settings come
from the first model's config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import nn

from onmt_doc.config import Config
from onmt_doc.contracts import Batch, DecoderState, EncoderOut, LengthLimit
from onmt_doc.data.codec import Codec
from onmt_doc.data.instances import unit_class
from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import load_model
from onmt_doc.models.model import EncoderDecoder, full_log_probs


@dataclass
class EnsembleState(DecoderState):
    """One decoding state per member, reordered together (each with its own source/shared fields)."""

    states: list

    def reorder(self, index: torch.Tensor, same_sources: bool = False) -> "EnsembleState":
        """Every member's state follows the beam."""
        self.states = [s.reorder(index, same_sources) for s in self.states]
        return self


AVERAGES = ("log_prob", "prob")


def average_log_probs(log_probs: Sequence[torch.Tensor], average: str = "log_prob") -> torch.Tensor:
    """Elementwise over members: ``mean_k log_probs[k]`` (``log_prob``) or
    ``log(mean_k exp(log_probs[k]))``, the log of the mean probability (``prob``)."""
    if len(log_probs) == 1:
        return log_probs[0]
    stacked = torch.stack(list(log_probs))
    if average == "log_prob":
        return stacked.mean(0)
    if average == "prob":
        return torch.logsumexp(stacked, dim=0) - math.log(len(log_probs))
    raise ValueError(f"unknown ensemble average '{average}' (choose from {', '.join(AVERAGES)})")


class EnsembleDecoder:
    """The decoder-level hooks of the search (``max_output_lengths``, ``constrain``) over all members."""

    def __init__(self, members: Sequence[EncoderDecoder]):
        self.members = list(members)

    def max_output_lengths(self, batch: Batch, limit: LengthLimit) -> torch.Tensor:
        """[B] the smallest of the members' caps, so no member is asked past its own."""
        caps = [m.decoder.max_output_lengths(batch, limit) for m in self.members]
        return torch.stack(caps).min(0).values

    def constrain(self, log_probs: torch.Tensor, state: EnsembleState) -> torch.Tensor:
        """Every member's rules, each with its own state (their intersection; members of one unit
        share them)."""
        for member, member_state in zip(self.members, state.states):
            log_probs = member.decoder.constrain(log_probs, member_state)
        return log_probs


class EnsembleModel(nn.Module):
    """Models decoded as one: log-probabilities or probabilities averaged (see the module docstring)."""

    def __init__(self, members: Sequence[EncoderDecoder], average: str = "log_prob"):
        super().__init__()
        if average not in AVERAGES:
            raise ValueError(f"unknown ensemble average '{average}' (choose from {', '.join(AVERAGES)})")
        self.average = average
        if not members:
            raise ValueError("an ensemble needs at least one model")
        units = {m.unit for m in members}
        if len(units) > 1:
            raise ValueError(f"ensemble members translate different units: {sorted(units)}")
        self.members = nn.ModuleList(members)
        self.unit = members[0].unit
        self.decoder = EnsembleDecoder(members)

    def encode(self, batch: Batch) -> list[EncoderOut]:
        """One encoder output per member."""
        return [m.encode(batch) for m in self.members]

    def init_state(self, enc_out: list[EncoderOut], batch: Batch, limit: Optional[LengthLimit] = None) -> EnsembleState:
        """Each member's first decoding state, from its own encoder output."""
        return EnsembleState([m.init_state(e, batch, limit) for m, e in zip(self.members, enc_out)])

    def step(self, tokens: torch.Tensor, state: EnsembleState) -> tuple[torch.Tensor, EnsembleState]:
        """The members' averaged next-token log-probabilities [B, V] after ``tokens`` [B]."""
        outs = [m.step(tokens, s) for m, s in zip(self.members, state.states)]
        state.states = [s for _, s in outs]
        return average_log_probs([lp for lp, _ in outs], self.average), state

    def full_log_probs(self, batch: Batch, enc_out: Optional[list[EncoderOut]] = None) -> torch.Tensor:
        """[B, T, V] teacher-forced averaged log-probabilities (forced decoding, ``-score``)."""
        enc_out = enc_out if enc_out is not None else [None] * len(self.members)
        return average_log_probs([full_log_probs(m, batch, e) for m, e in zip(self.members, enc_out)], self.average)

    def n_params(self) -> int:
        """Parameters of all members together."""
        return sum(p.numel() for p in self.parameters())


def check_compatible(
    first: tuple[str, Config, Codec, EncoderDecoder], other: tuple[str, Config, Codec, EncoderDecoder]
) -> None:
    """Refuse, in one line naming both files, members that would read different inputs or write
    into different vocabularies."""
    (path_a, cfg_a, codec_a, model_a), (path_b, cfg_b, codec_b, model_b) = first, other
    a, b = codec_a.to_dict(), codec_b.to_dict()
    for key, what in (
        ("src_vocab", "source vocabularies"),
        ("tgt_vocab", "target vocabularies"),
        ("src_subword", "source subword models"),
        ("tgt_subword", "target subword models"),
    ):
        if a[key] != b[key]:
            raise UserError(f"cannot ensemble {path_a} and {path_b}: different {what}")
    if model_a.unit != model_b.unit:
        raise UserError(
            f"cannot ensemble {path_a} and {path_b}: different translation units ({model_a.unit} vs {model_b.unit})"
        )
    settings = unit_class(model_a.unit).input_settings  # the data settings that shape the unit's input
    for (key, va), vb in zip(settings(cfg_a.data).items(), settings(cfg_b.data).values()):
        if va != vb:
            raise UserError(f"cannot ensemble {path_a} and {path_b}: different data.{key} ({va} vs {vb})")


def load_models(
    paths: Sequence[str], device: Optional[torch.device] = None
) -> tuple[EncoderDecoder | EnsembleModel, Config, Codec]:
    """One checkpoint: its model, config and codec (``load_model``). Several: an
    :class:`EnsembleModel` of them (in eval mode), with the first checkpoint's config (translation
    options, data settings) and codec; members that read or write differently are refused."""
    if not paths:
        raise UserError("no model to translate with")
    if len(paths) == 1:
        return load_model(paths[0], device)
    loaded: list[Any] = []
    for path in paths:
        model, cfg, codec = load_model(path, device)
        if loaded:
            check_compatible(loaded[0], (path, cfg, codec, model))
        loaded.append((path, cfg, codec, model))
    _, cfg, codec, _ = loaded[0]
    return EnsembleModel([m for *_, m in loaded]).eval(), cfg, codec
