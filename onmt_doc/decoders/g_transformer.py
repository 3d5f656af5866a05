"""G-Transformer decoder (Bao et al., 2021, sec. 4): group self-attention (tags y/y, causal) and
group cross-attention (queries y, keys x) on every layer; combined group + global attention on the
top ``global_layers`` (self) and ``global_cross_layers`` (cross) layers. The paper's ablations
switch parts off: ``group_self_attention`` / ``group_cross_attention`` (language / translation
locality, table 5), ``top_attention: global`` (global attention alone on the top layers, table 6),
``group_attention: false`` (both localities off: the document Transformer).

Decoding covers a whole document instance in one beam search (sec. 4.3): the target tag of each
token follows the generated ``<s>``/``</s>``, and :meth:`GTransformerDecoder.constrain` keeps the
output's structure: ``<s>`` first and after every ``</s>`` while the source has more sentences,
then ``<eos>``; no ``</s>`` before a sentence has a word; ``</s>`` forced at the sentence's length
cap. The output therefore always has exactly the source's number of sentences.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

from onmt_doc import devices
from onmt_doc.config import Config
from onmt_doc.config.options import check_top_layers, option
from onmt_doc.contracts import Batch, DecoderOut, DecoderState, EncoderOut, LengthLimit, PartContext
from onmt_doc.data.batching import group_tags
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, MASK_ID, PAD_ID, SOS_ID, SPECIALS, UNK_ID
from onmt_doc.decoders.base import REGISTRY, Decoder, force_tokens
from onmt_doc.decoders.transformer import TransformerDecoderConfig, TransformerDecoderLayer
from onmt_doc.modules.attention import KV, MultiHeadAttention
from onmt_doc.modules.group_attention import (
    COMBINED,
    DEC_CROSS,
    DEC_SELF,
    GLOBAL,
    GROUP,
    Plan,
    attention_modes,
    cross_plan,
    gather_block,
    group_attend,
    heads_layout,
    prepared_plan,
    rows_layout,
    self_plan,
    source_block,
    source_spans,
    write_sentence_cache,
)
from onmt_doc.modules.local_global_gate import GateSum
from onmt_doc.modules.varlen_attention import plan_cross_segments, plan_self_segments

PREFIX_CAPACITY = 128  # first size of the global self-attention caches; doubling keeps growth O(prefix)

# tokens that may not appear inside a sentence (</s> is handled separately, <unk> is a word)
_NOT_WORDS = [PAD_ID, SOS_ID, BOS_ID, EOS_ID, MASK_ID]


@functools.lru_cache(maxsize=None)
def _not_words(device: torch.device) -> torch.Tensor:
    """``_NOT_WORDS`` on ``device``, made once: made at every step it is, on a GPU, a blocking copy
    from host memory (the host waits for the device's queue)."""
    return torch.tensor(_NOT_WORDS, device=device)


@dataclass
class GTransformerDecoderConfig(TransformerDecoderConfig):
    """``model.decoder`` keys of ``type: g_transformer``: the Transformer decoder's plus the locality
    switches of tables 5–6."""

    group_attention: bool = option(
        True,
        "`false` = the document-Transformer baseline (all layers global); the "
        "same as `group_self_attention: false` with `group_cross_attention: false`",
    )
    group_self_attention: bool = option(
        True,
        "`false` = self-attention over the whole target prefix on every "
        "layer, no self gates (target language locality off, table 5); "
        "cross-attention keeps its own switch",
    )
    group_cross_attention: bool = option(
        True,
        "`false` = cross-attention over the whole source instance on every "
        "layer, no cross gates (translation locality off, table 5); "
        "self-attention keeps its own switch",
    )
    global_layers: int = option(2, "top layers with combined self-attention; between 0 and `layers`")
    global_cross_layers: int = option(2, "top layers with combined cross-attention; between 0 and `layers`")
    top_attention: Literal["combined", "global"] = option(
        "combined",
        "what those top layers use: group + global gate-summed (eq. 10), or global attention alone "
        '(table 6, "only global attention")',
    )

    def validate(self, path: str, root: Config) -> None:
        """The combined-attention layers are the top of the stack, so at most ``layers`` of them."""
        super().validate(path, root)
        check_top_layers(self, "global_layers", path)
        check_top_layers(self, "global_cross_layers", path)


@dataclass
class GTransformerState(DecoderState):
    """Decoding state of a whole document instance: the per-layer caches plus what
    :meth:`GTransformerDecoder.constrain` needs to keep the output's sentence structure (sentences
    started, words in the current one, the last token, each sentence's word cap)."""

    source_fields: ClassVar[tuple[str, ...]] = (
        "cross_kv",
        "global_cross_kv",
        "memory_mask",
        "src_start",
        "src_len",
        "n_src",
        "caps",
    )
    owned_fields: ClassVar[tuple[str, ...]] = ("self_kv", "global_self_kv", "cross_kv", "global_cross_kv")
    step: int
    tag: torch.Tensor  # [B] group tag of the last token fed
    n_sents: torch.Tensor  # [B] sentences started (<s> fed)
    words: torch.Tensor  # [B] words fed since the last <s>
    sent_len: torch.Tensor  # [B] tokens of the current sentence in the sentence caches, the last one included
    last: torch.Tensor  # [B] the last token fed
    self_kv: list[Optional[KV]]  # group/combined layers: sentence caches [B, H, C, d]; global layers: the prefix
    global_self_kv: list[Optional[KV]]
    cross_kv: list[KV]
    global_cross_kv: list[Optional[KV]]
    memory_mask: torch.Tensor  # [B, 1, 1, S]
    src_start: torch.Tensor  # [B, K+1] first source position of each sentence (source_spans)
    src_len: torch.Tensor  # [B, K+1] its length
    sent_capacity: int  # initial slots of a sentence cache: the longest sentence the caps allow, with markup
    src_width: int  # the longest source sentence (the fused path's source block, read once per search)
    prefix_capacity: int  # initial slots of a global self-attention cache (the whole prefix; doubles when full)
    n_src: torch.Tensor  # [B] source sentences
    caps: torch.Tensor  # [B, K] word cap of each target sentence

    def filled_slots(self, name: str) -> Optional[int]:
        """A prefix cache holds the ``step`` positions fed so far, a sentence cache its current sentence,
        whose slots are below ``step`` too: a reorder moves those only."""
        return self.step if name in ("self_kv", "global_self_kv") else None


@dataclass
class _Forced:
    """What every layer needs in the teacher-forced pass (built once per batch)."""

    keep: torch.Tensor  # [B, T] non-padding targets
    memory: torch.Tensor
    memory_mask: torch.Tensor  # [B, 1, 1, S]
    self_plan: Optional[Plan]
    cross_plan: Optional[Plan]


@dataclass
class _StepMasks:
    """Where one decoding step's group attention reads (see ``group_attention``'s decoding section)."""

    keep: torch.Tensor  # [B, 1] (all True: one real query per row)
    self_slot: torch.Tensor  # [B] slot of the new token in the sentence caches
    self_capacity: int  # slots the sentence caches need for this step
    self_mask: torch.Tensor  # [B, 1, 1, L] the slots of the query's sentence
    cross_positions: Optional[torch.Tensor]  # [B, Ls] the aligned source sentence; None: the whole source
    cross_mask: torch.Tensor  # [B, 1, 1, Ls or S]
    cross_has: torch.Tensor  # [B, 1, 1, 1] the aligned source sentence exists


class GTransformerDecoderLayer(TransformerDecoderLayer):
    """A Transformer decoder layer whose self- and cross-attention are each group (eq. 8), global
    (eq. 5) or combined (eq. 10) according to ``self_mode`` / ``cross_mode``."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ff: int,
        dropout: float,
        attention_dropout: float,
        pre_norm: bool,
        self_mode: str,
        cross_mode: str,
    ) -> None:
        """``self_mode``/``cross_mode``: values of :func:`attention_modes`; ``combined`` adds the global
        attention and its gate."""
        super().__init__(d_model, heads, ff, dropout, attention_dropout, pre_norm)
        self.self_mode, self.cross_mode = self_mode, cross_mode  # group / global / combined
        combined_self, combined_cross = self_mode == COMBINED, cross_mode == COMBINED
        self.global_self_attn = MultiHeadAttention(d_model, heads, attention_dropout) if combined_self else None
        self.self_gate = GateSum(d_model, "dec_self") if combined_self else None
        self.global_cross_attn = (
            MultiHeadAttention(d_model, heads, attention_dropout, self_attention=False) if combined_cross else None
        )
        self.cross_gate = GateSum(d_model, "dec_cross") if combined_cross else None

    def _drop(self) -> float:
        return self.self_attn.dropout if self.training else 0.0

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, x: torch.Tensor, ctx: _Forced) -> torch.Tensor:
        """Teacher-forced ``x`` [B, T, D] -> [B, T, D], with the block plans and masks in ``ctx``."""
        x = self.self_res(x, lambda h: self._self_forced(h, ctx))
        x = self.cross_res(x, lambda h: self._cross_forced(h, ctx))
        return self.ff_res(x, self.ff)

    def _self_forced(self, h: torch.Tensor, ctx: _Forced) -> torch.Tensor:
        if self.self_mode == GLOBAL:
            return self.self_attn(h, is_causal=True, probe=("dec_self_global", ctx.keep))
        attn = self.self_attn
        local = attn.merge(group_attend(ctx.self_plan, *attn.project_qkv(h), self._drop(), "dec_self_group"))
        if self.self_mode == GROUP:
            return local
        glob = self.global_self_attn(h, is_causal=True, probe=("dec_self_global", ctx.keep))
        return self.self_gate(local, glob, ctx.keep)

    def _cross_forced(self, h: torch.Tensor, ctx: _Forced) -> torch.Tensor:
        attn = self.cross_attn
        kv = attn.memory_kv(ctx.memory)
        if self.cross_mode == GLOBAL:
            return attn.cross(h, kv, ctx.memory_mask, probe=("dec_cross_global", ctx.keep))
        local = attn.merge(group_attend(ctx.cross_plan, attn.project_q(h), *kv, self._drop(), "dec_cross_group"))
        if self.cross_mode == GROUP:
            return local
        g_attn = self.global_cross_attn
        glob = g_attn.cross(h, g_attn.memory_kv(ctx.memory), ctx.memory_mask, probe=("dec_cross_global", ctx.keep))
        return self.cross_gate(local, glob, ctx.keep)

    # ------------------------------------------------------------------ incremental decoding
    def step(self, x: torch.Tensor, state: GTransformerState, i: int, masks: _StepMasks) -> torch.Tensor:
        """One position ``x`` [B, 1, D] of layer ``i``; updates that layer's caches in ``state``."""
        x = self.self_res(x, lambda h: self._self_step(h, state, i, masks))
        x = self.cross_res(x, lambda h: self._cross_step(h, state, i, masks))
        return self.ff_res(x, self.ff)

    def _self_step(self, h: torch.Tensor, state: GTransformerState, i: int, masks: _StepMasks) -> torch.Tensor:
        attn = self.self_attn
        if self.self_mode == GLOBAL:  # the cache holds the whole prefix
            local, state.self_kv[i] = attn.step_at(h, state.self_kv[i], state.step, state.prefix_capacity)
            return local
        q, k, v = attn.project_qkv(h)  # eq. 8 over the query's own sentence, the only one cached
        kc, vc = state.self_kv[i] = write_sentence_cache(state.self_kv[i], k, v, masks.self_slot, masks.self_capacity)
        width = masks.self_mask.size(-1)
        local = attn.attend(q, kc[:, :, :width], vc[:, :, :width], masks.self_mask)
        if self.self_mode != COMBINED:
            return local
        glob, state.global_self_kv[i] = self.global_self_attn.step_at(
            h, state.global_self_kv[i], state.step, state.prefix_capacity
        )
        return self.self_gate(local, glob, masks.keep)

    def _cross_step(self, h: torch.Tensor, state: GTransformerState, i: int, masks: _StepMasks) -> torch.Tensor:
        attn, (k, v) = self.cross_attn, state.cross_kv[i]
        if self.cross_mode == GLOBAL:
            return attn.cross(h, (k, v), state.memory_mask)
        if masks.cross_positions is None:  # the first step's <bos>: the whole source
            k, v = heads_layout(k, attn.heads), heads_layout(v, attn.heads)
        else:  # the aligned source sentence only
            k, v = (gather_block(x, masks.cross_positions, attn.heads) for x in (k, v))
        local = F.scaled_dot_product_attention(attn.project_q(h), k, v, attn_mask=masks.cross_mask)
        local = attn.merge(local * masks.cross_has)
        if self.cross_mode == GROUP:
            return local
        glob = self.global_cross_attn.cross(h, state.global_cross_kv[i], state.memory_mask)
        return self.cross_gate(local, glob, masks.keep)


@REGISTRY.register("g_transformer", GTransformerDecoderConfig)
class GTransformerDecoder(Decoder):
    """The G-Transformer decoder: translates a whole document instance in one pass (``unit = "document"``)."""

    unit = "document"

    def __init__(self, cfg: GTransformerDecoderConfig, ctx: PartContext) -> None:
        """Builds one layer per pair of :func:`attention_modes` entries (self, cross); embeddings shared."""
        super().__init__()
        self_modes = attention_modes(
            cfg.layers, cfg.group_attention and cfg.group_self_attention, cfg.global_layers, cfg.top_attention
        )
        cross_modes = attention_modes(
            cfg.layers, cfg.group_attention and cfg.group_cross_attention, cfg.global_cross_layers, cfg.top_attention
        )
        self.group_self = any(m != GLOBAL for m in self_modes)  # some layer needs the block plans
        self.group_cross = any(m != GLOBAL for m in cross_modes)
        self.embeddings = ctx.tgt_embeddings
        self.layers = nn.ModuleList(
            GTransformerDecoderLayer(
                ctx.d_model, cfg.heads, cfg.ff, ctx.dropout, ctx.attention_dropout, cfg.pre_norm, self_mode, cross_mode
            )
            for self_mode, cross_mode in zip(self_modes, cross_modes)
        )
        self.final_norm = nn.LayerNorm(ctx.d_model) if cfg.pre_norm else nn.Identity()

    def host_plans(self, batch: Batch) -> dict[str, Any]:
        """The sentence offsets of the group self- and cross-attention (fused path), from the host
        batch: target sentence k over itself (causal) and over source sentence k."""
        if batch.tgt_in is None or batch.tgt_groups is None:
            return {}
        tgt, src = (batch.tgt_groups, batch.tgt_in.ne(PAD_ID)), (batch.src_groups, batch.src.ne(PAD_ID))
        plans = {}
        if self.group_self:
            plans[DEC_SELF] = plan_self_segments(*tgt, causal=True)
        if self.group_cross:
            plans[DEC_CROSS] = plan_cross_segments(*tgt, *src)
        return plans

    def forward(self, tgt_in: torch.Tensor, enc_out: EncoderOut, batch: Batch) -> DecoderOut:
        """Teacher-forced pass: ``tgt_in`` [B, T] with sentence markup -> ``hidden`` [B, T, D]; the target
        tags come from the markup (:func:`group_tags`)."""
        keep, src_keep = tgt_in.ne(PAD_ID), ~enc_out.pad_mask
        tags = group_tags(tgt_in)
        plan_s = prepared_plan(batch.plans, DEC_SELF) if self.group_self else None
        plan_c = prepared_plan(batch.plans, DEC_CROSS) if self.group_cross else None
        if (self.group_self and plan_s is None) or (self.group_cross and plan_c is None):  # not prepared
            host, tgt_host, src_host = batch.host, None, None
            if host is not None and host.tgt_in is not None:  # the plans' host copies (fused path: no device read)
                tgt_host, src_host = (host.tgt_groups, host.tgt_in.ne(PAD_ID)), (host.src_groups, host.src.ne(PAD_ID))
            if self.group_self:
                plan_s = self_plan(tags, keep, causal=True, host=tgt_host)
            if self.group_cross:
                plan_c = cross_plan(tags, keep, enc_out.groups, src_keep, tgt_host, src_host)
        ctx = _Forced(keep, enc_out.memory, enc_out.attention_mask(), plan_s, plan_c)
        x = self.embeddings(tgt_in)
        for layer in self.layers:
            x = layer(x, ctx)
        return DecoderOut(self.final_norm(x))

    # ------------------------------------------------------------------ incremental decoding
    def max_output_lengths(self, batch: Batch, limit: LengthLimit) -> torch.Tensor:
        """Every sentence at its cap plus its markup, and the final <eos>: never reached before the
        structure is complete, so the cap cannot cut a document short."""
        caps = self._sentence_caps(batch.src_groups, batch.src.ne(PAD_ID), limit)
        return (caps + 2).masked_fill(caps.lt(0), 0).sum(1) + 1

    @staticmethod
    def _sentence_caps(src_tags: torch.Tensor, keep: torch.Tensor, limit: LengthLimit) -> torch.Tensor:
        """[B, K] word cap per source sentence (-1 where the row has fewer sentences)."""
        n_groups = max(int(src_tags.max()), 1)
        counts = torch.zeros(src_tags.size(0), n_groups + 1, dtype=torch.long, device=src_tags.device)
        counts.scatter_add_(1, src_tags * keep, keep.long())
        words = counts[:, 1:] - 2  # minus <s> and </s>
        return torch.where(words.ge(0), limit(words.clamp(min=0)), torch.full_like(words, -1))

    def init_state(self, enc_out: EncoderOut, batch: Batch, limit: Optional[LengthLimit] = None) -> GTransformerState:
        """Empty caches, the memory's cross-attention keys/values, and each source sentence's word cap
        (``limit``, default :class:`LengthLimit`)."""
        b, device = enc_out.memory.size(0), enc_out.memory.device
        src_keep = ~enc_out.pad_mask
        layers = self.layers
        zeros = torch.zeros(b, dtype=torch.long, device=device)
        src_start, src_len = source_spans(enc_out.groups, src_keep)
        caps = self._sentence_caps(enc_out.groups, src_keep, limit or LengthLimit())
        # a tensor of its own per field: torch.compile guards on which inputs alias, and a compiled step
        # met this state's first step with four fields aliased and its later ones with none
        return GTransformerState(
            step=0,
            tag=zeros,
            n_sents=zeros.clone(),
            words=zeros.clone(),
            sent_len=zeros.clone(),
            last=torch.full_like(zeros, BOS_ID),
            self_kv=[None] * len(layers),
            global_self_kv=[None] * len(layers),
            cross_kv=[self._cross_kv(layer, enc_out.memory) for layer in layers],
            global_cross_kv=[
                layer.global_cross_attn.memory_kv(enc_out.memory) if layer.global_cross_attn else None
                for layer in layers
            ],
            memory_mask=enc_out.attention_mask(),
            src_start=src_start,
            src_len=src_len,
            sent_capacity=max(int(caps.max()), 0) + 3,  # <s>, the words, </s>; <eos>
            src_width=max(int(src_len.max()), 1),
            prefix_capacity=PREFIX_CAPACITY,
            n_src=enc_out.groups.max(1).values,
            caps=caps,
        )

    @staticmethod
    def _cross_kv(layer: GTransformerDecoderLayer, memory: torch.Tensor) -> KV:
        """A layer's cross-attention keys/values for decoding: group layers read source sentences
        as blocks of rows (:func:`rows_layout`)."""
        kv = layer.cross_attn.memory_kv(memory)
        return kv if layer.cross_mode == GLOBAL else (rows_layout(kv[0]), rows_layout(kv[1]))

    def step(self, tokens: torch.Tensor, state: GTransformerState) -> tuple[torch.Tensor, GTransformerState]:
        """Feed ``tokens`` [B]: update the structure counters and the token's group tag, then run every
        layer; returns hidden [B, D] and the state."""
        is_sos = tokens.eq(SOS_ID)
        state.n_sents = state.n_sents + is_sos.long()
        is_word = tokens.ge(len(SPECIALS)) | tokens.eq(UNK_ID)
        state.words = torch.where(is_sos, 0, state.words + is_word.long())
        state.sent_len = torch.where(is_sos, 1, state.sent_len + 1)  # a sentence's cache starts at its <s>
        state.last = tokens
        unrestricted = tokens.eq(BOS_ID) | tokens.eq(EOS_ID) | tokens.eq(PAD_ID)
        state.tag = torch.where(unrestricted, 0, state.n_sents)
        masks = self._step_masks(state)
        x = self.embeddings(tokens[:, None], offset=state.step)
        for i, layer in enumerate(self.layers):
            x = layer.step(x, state, i, masks)
        state.step += 1
        return self.final_norm(x)[:, 0], state

    @staticmethod
    def _step_masks(state: GTransformerState) -> _StepMasks:
        """The sentence-cache slots and source block of each row's query (eq. 8). The first step's
        ``<bos>`` (tag 0) is not restricted: it sees the whole source, as in the teacher-forced pass."""
        # the fused (GPU) path masks the whole sentence cache and the longest source sentence rather
        # than read the current widths from the device every step (sentences never outgrow the caches)
        fused = devices.fused(state.tag.device)
        width = state.sent_capacity if fused else int(state.sent_len.max())
        self_mask = (torch.arange(width, device=state.tag.device) < state.sent_len[:, None])[:, None, None, :]
        dtype = state.cross_kv[0][0].dtype
        keep = torch.ones_like(state.tag, dtype=torch.bool)[:, None]
        capacity = max(state.sent_capacity, width)
        if state.step == 0:
            has = state.memory_mask.any(-1, keepdim=True)
            mask = state.memory_mask | ~has
            return _StepMasks(keep, state.sent_len - 1, capacity, self_mask, None, mask, has.to(dtype))
        positions, cross_mask, has = source_block(
            state.src_start, state.src_len, state.tag, state.src_width if fused else None
        )
        # a finished sentence's rows ride along until the search's next device read (and rows at -inf go
        # on): fed <pad>, they may pass their sentence's cap; their writes land in the last slot, unread
        slot = (state.sent_len - 1).clamp(max=capacity - 1) if fused else state.sent_len - 1
        return _StepMasks(keep, slot, capacity, self_mask, positions, cross_mask, has.to(dtype))

    def constrain(self, log_probs: torch.Tensor, state: GTransformerState) -> torch.Tensor:
        """Document structure (see the module docstring); forced tokens keep their model score."""
        last, n, words = state.last, state.n_sents, state.words
        closed = last.eq(EOS_SENT_ID)
        in_sentence = ~(closed | last.eq(BOS_ID))
        cap = state.caps.gather(1, (n - 1).clamp(0, state.caps.size(1) - 1)[:, None]).squeeze(1)
        force = torch.full_like(last, -1)
        force = torch.where(last.eq(BOS_ID) | (closed & n.lt(state.n_src)), SOS_ID, force)
        force = torch.where(closed & n.ge(state.n_src), EOS_ID, force)
        force = torch.where(in_sentence & words.ge(cap), EOS_SENT_ID, force)
        lp = log_probs.index_fill(1, _not_words(log_probs.device), float("-inf"))
        lp[:, EOS_SENT_ID] = lp[:, EOS_SENT_ID].masked_fill(words.eq(0), float("-inf"))
        return force_tokens(log_probs, force, out=lp)
