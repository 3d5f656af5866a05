"""Word dropout (Bowman et al., 2016; G-Transformer appendix C.1): during training, input tokens are
replaced by ``<unk>`` or ``<mask>`` with probability p. Special tokens (markup, ``<bos>``) are
never replaced, so sentence structure and group tags are unchanged."""

from __future__ import annotations

import torch

from onmt_doc.data.vocab import SPECIALS


def word_dropout(ids: torch.Tensor, p: float, replacement: int) -> torch.Tensor:
    """``ids`` [B, T] with each non-special token replaced by ``replacement`` with probability ``p``;
    identity for ``p <= 0`` (callers apply it only in training)."""
    if p <= 0:
        return ids
    drop = torch.rand(ids.shape, device=ids.device).lt(p) & ids.ge(len(SPECIALS))
    return ids.masked_fill(drop, replacement)
