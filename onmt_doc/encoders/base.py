"""The encoder interface (its output, ``EncoderOut``, is in ``onmt_doc.contracts``)."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from onmt_doc.contracts import Batch, EncoderOut
from onmt_doc.registry import Registry

# the encoders by YAML name; each encoder module registers itself here, and the package's
# __init__ imports them all (registry_for("encoder") reads it there)
REGISTRY = Registry("encoder")


class Encoder(nn.Module):
    """``forward(batch) -> EncoderOut``. ``unit`` says which instances the encoder needs."""

    unit: ClassVar[str] = "sentence"
    provides: ClassVar[tuple[str, ...]] = ()  # EncoderOut.extra keys it fills for decoders

    def forward(self, batch: Batch) -> EncoderOut:  # pragma: no cover - interface
        """Encode ``batch`` into memory [B, S, D] and its pad mask [B, S] (True on padding), plus the
        ``extra`` keys listed in ``provides``."""
        raise NotImplementedError

    def host_plans(self, batch: Batch) -> dict[str, Any]:
        """What :meth:`forward` reads from ``batch.plans`` on the fused path, planned from the host
        batch ``batch`` (numpy, never a device): ``EncoderDecoder.prepare`` calls it before the batch
        moves to the device. None by default; a part whose forward plans on the host (the
        G-Transformer's sentence offsets) returns its plans here, so a compiled step keeps one graph."""
        return {}
