"""The decoder interface: teacher-forced ``forward`` for training, ``init_state``/``step`` for
incremental decoding. A stepwise decode must give the same outputs as ``forward`` (tested for
every decoder)."""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import torch
from torch import nn

from onmt_doc.contracts import Batch, DecoderOut, DecoderState, EncoderOut, LengthLimit
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.registry import Registry

# the decoders by YAML name; each decoder module registers itself here, and the package's
# __init__ imports them all (registry_for("decoder") reads it there)
REGISTRY = Registry("decoder")


def force_tokens(log_probs: torch.Tensor, force: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rows with ``force`` ≥ 0 may only continue with that token, which keeps its score in
    ``log_probs`` (so hypothesis scores stay the model's log-probabilities); rows with -1 keep their
    scores: those of ``out`` when given (written in place and returned: scores the caller restricted
    further and owns), else of ``log_probs`` (a new tensor). One pass over the scores. For a
    decoder's :meth:`Decoder.constrain`, and for the search's own rules (``onmt_doc/translate/rules.py``,
    a layer above, which is why it lives here)."""
    index = force.clamp(min=0)[:, None]
    forced = force.ge(0)[:, None]
    kept = torch.where(forced, log_probs.gather(1, index), (log_probs if out is None else out).gather(1, index))
    out = log_probs.masked_fill(forced, float("-inf")) if out is None else out.masked_fill_(forced, float("-inf"))
    return out.scatter_(1, index, kept)


class Decoder(nn.Module):
    """Base of every decoder: teacher-forced :meth:`forward` for training, :meth:`init_state` and
    :meth:`step` for search, which must give the same outputs.

    ``unit``: the instances it decodes (``sentence``, ``document``, ``context``); ``needs``: the
    :class:`EncoderOut` ``extra`` keys it reads, checked against the encoder's ``provides`` when the
    model is built.
    """

    unit: ClassVar[str] = "sentence"
    needs: ClassVar[tuple[str, ...]] = ()  # EncoderOut.extra keys it reads (checked when building)

    def max_output_lengths(self, batch: Batch, limit: LengthLimit) -> torch.Tensor:
        """[B] most tokens beam search may generate per row (the final <eos> forced at the cap);
        at least 3, room for ``<s> word </s>``."""
        return limit(batch.src.ne(PAD_ID).sum(1)).clamp(min=3)

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:  # pragma: no cover
        """Teacher-forced pass: ``tgt_in`` [B, T] (the target shifted right) -> ``hidden`` [B, T, D]."""
        raise NotImplementedError

    def host_plans(self, batch: Batch) -> dict[str, Any]:
        """What the teacher-forced :meth:`forward` reads from ``batch.plans`` on the fused path, planned
        from the host batch (see ``Encoder.host_plans``). None by default."""
        return {}

    def init_state(
        self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None
    ) -> DecoderState:  # pragma: no cover
        """The state before the first step; ``limit`` is for decoders that cap parts of the output."""
        raise NotImplementedError

    def step(self, tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:  # pragma: no cover
        """Hidden state [B, D] for the next tokens [B], and the updated state."""
        raise NotImplementedError

    def constrain(self, log_probs: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """Restrict the next token during search (e.g. document structure) by setting forbidden
        tokens to -inf, forcing with :func:`force_tokens`; default: no rule. The search applies its
        own rules after this (``onmt_doc/translate/rules.py``: forbidden tokens, the length cap, and
        the unit's sentence rules), and a token it forces keeps the score this returns."""
        return log_probs
