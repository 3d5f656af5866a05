"""Multi-head attention through ``scaled_dot_product_attention``.

Self-attention projects queries, keys and values with one fused matrix; cross-attention projects
the memory's keys/values once per source (cached for decoding). Masks are boolean, ``True`` where
a query may attend, broadcastable to [B, heads, queries, keys].
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from onmt_doc.devices import fused
from onmt_doc.modules import analysis

KV = tuple[torch.Tensor, torch.Tensor]
Probe = tuple[str, torch.Tensor]  # (statistic name, query keep-mask [B, Tq])


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017, sec. 3.2.2), self or cross.

    ``self_attention=True`` fuses the q/k/v projections into one matrix; ``False`` projects queries
    and the memory's keys/values separately, so :meth:`memory_kv` runs once per source and every
    decoding step reuses it. Masks are boolean, True where a query may attend.
    """

    def __init__(self, d_model: int, heads: int, dropout: float, self_attention: bool = True) -> None:
        """Raises ValueError when ``heads`` does not divide ``d_model``."""
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by {heads} heads")
        self.heads, self.d_head, self.dropout = heads, d_model // heads, dropout
        self.self_attention = self_attention
        if self_attention:
            self.qkv = nn.Linear(d_model, 3 * d_model)
        else:
            self.q = nn.Linear(d_model, d_model)
            self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        """[B, T, n*D] -> n tensors [B, H, T, d_head]."""
        b, t, _ = x.shape
        return x.view(b, t, n, self.heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, self.heads * self.d_head))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention queries, keys and values [B, H, T, d_head]."""
        q, k, v = self._split(self.qkv(x), 3)
        return q, k, v

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        """Cross-attention queries [B, H, T, d_head]."""
        return self._split(self.q(x), 1)[0]

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, T, d_head] head outputs -> projected [B, T, D]."""
        return self._merge(x)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
        probe: Optional[Probe] = None,
    ) -> torch.Tensor:
        """softmax(q kᵀ / sqrt(d_head)) v over heads, merged and projected. With a ``probe``
        (name, query keep-mask [B, Tq]) and analysis active, the probabilities are materialised
        once to record their entropy; inside ``analysis.capturing`` also to be captured, under
        the probe's name or the module's (``analysis.capture_key``)."""
        key = analysis.capture_key(self, probe[0] if probe is not None else None)
        if key is not None or (probe is not None and analysis.active()):
            probs = attention_probs(q, k, mask, is_causal)
            if probe is not None:
                analysis.record_entropy(probe[0], probs, probe[1])
            if key is not None:
                analysis.capture(key, probs)
            return self._merge(probs.to(v.dtype) @ v)
        p = self.dropout if self.training else 0.0
        return self._merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal))

    # --- self-attention
    def forward(
        self,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
        probe: Optional[Probe] = None,
    ) -> torch.Tensor:
        """Self-attention of ``x`` [B, T, D] -> [B, T, D]; ``mask`` broadcastable to [B, H, T, T]."""
        q, k, v = self._split(self.qkv(x), 3)
        return self.attend(q, k, v, mask, is_causal, probe)

    def step(
        self, x: torch.Tensor, cache: Optional[KV], mask: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, KV]:
        """Self-attention of new positions over the cached prefix and themselves."""
        q, k, v = self._split(self.qkv(x), 3)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        return self.attend(q, k, v, mask), (k, v)

    def step_at(self, x: torch.Tensor, cache: Optional[KV], position: int, capacity: int) -> tuple[torch.Tensor, KV]:
        """:meth:`step` for one new position [B, 1, D] at ``position``. On the fused (GPU) path it is
        written in place into caches [B, H, C, d] that start with ``capacity`` slots and double when
        full, so a step neither allocates nor copies the prefix (and a compiled step keeps its shapes).
        On the packed (CPU) path the caches are the prefix itself, grown by :meth:`step`'s
        concatenation: CPU attention copies a strided prefix to contiguous memory at every step
        anyway, so slots allocated ahead would save nothing there and make every reorder move more."""
        if not fused(x.device):
            return self.step(x, cache)
        q, k, v = self._split(self.qkv(x), 3)
        if cache is None:
            b, h, _, d = k.shape
            cache = (k.new_zeros(b, h, capacity, d), v.new_zeros(b, h, capacity, d))
        cache = grow_kv(cache, position + 1)
        if torch.compiler.is_compiling():  # a tensor index: the position stays out of the graph's guards
            where = torch.full((1,), position, dtype=torch.long, device=k.device)
            cache[0].index_copy_(2, where, k)
            cache[1].index_copy_(2, where, v)
        else:  # eager: a slice copy, a third of index_copy_'s time
            cache[0][:, :, position : position + 1] = k
            cache[1][:, :, position : position + 1] = v
        return self.attend(q, cache[0][:, :, : position + 1], cache[1][:, :, : position + 1]), cache

    # --- cross-attention
    def memory_kv(self, memory: torch.Tensor) -> KV:
        """Keys and values [B, H, S, d_head] of ``memory`` [B, S, D], computed once and cached for decoding."""
        k, v = self._split(self.kv(memory), 2)
        return k, v

    def cross(
        self, x: torch.Tensor, kv: KV, mask: Optional[torch.Tensor] = None, probe: Optional[Probe] = None
    ) -> torch.Tensor:
        """Cross-attention of ``x`` [B, T, D] over ``kv`` from :meth:`memory_kv` -> [B, T, D]; ``mask``
        broadcastable to [B, H, T, S]."""
        (q,) = self._split(self.q(x), 1)
        return self.attend(q, kv[0], kv[1], mask, probe=probe)


def grow_kv(cache: KV, slots: int) -> KV:
    """Caches [B, H, C, d] with at least ``slots`` slots along C: doubled (or more, if that is not
    enough) when too small, so filling a cache one slot at a time copies it O(log n) times."""
    size = cache[0].size(2)
    if slots <= size:
        return cache
    grow = max(slots, 2 * size) - size
    k, v = (torch.cat([c, c.new_zeros(c.size(0), c.size(1), grow, c.size(3))], 2) for c in cache)
    return k, v


def attention_probs(
    q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor] = None, is_causal: bool = False
) -> torch.Tensor:
    """Explicit attention probabilities [..., Tq, Tk] (analysis and test references); rows without
    any allowed key are all zeros."""
    scores = (q @ k.transpose(-1, -2)).float() / q.size(-1) ** 0.5
    if is_causal:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(t, s, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1).nan_to_num(0.0)
