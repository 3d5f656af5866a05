"""The contracts between the parts of a model: read this file first when you write a new part.

Every encoder, decoder and loss exchanges data with the rest of the toolkit only through the
dataclasses below, so a new part needs no change anywhere else. One training step and one search
step flow through them like this::

    Batch  (data/batching.py: collate pads examples into tensors)
      │
      ▼
    Encoder.forward(batch) ──────────────► EncoderOut  (memory [B, S, D], pad_mask, groups, extra)
      │
      ├─ training:  Decoder.forward(tgt_in, enc_out, batch) ──► DecoderOut  (hidden [B, T, D], aux)
      │             EncoderDecoder.forward adds the generator ──► ModelOut  ──► every Loss
      │
      └─ search:    Decoder.init_state(enc_out, batch, limit: LengthLimit) ──► DecoderState
                    Decoder.step(tokens [B], state) ──► (hidden [B, D], DecoderState)
                    beam search reorders the state with DecoderState.reorder, and nothing else

Which contract each part implements (the base classes live with their kind):

- an **encoder** (``onmt_doc/encoders/base.py``: ``Encoder``) is built as ``cls(cfg, ctx:
  PartContext)`` and maps a :class:`Batch` to an :class:`EncoderOut`; the ``extra`` keys it fills
  are its ``provides``;
- a **decoder** (``onmt_doc/decoders/base.py``: ``Decoder``) is built the same way, maps
  ``(tgt_in, EncoderOut, Batch)`` to a :class:`DecoderOut` when teacher-forced, and keeps
  everything that changes between search steps in its own :class:`DecoderState` subclass; its
  ``needs`` are the ``EncoderOut.extra`` keys it reads; stepwise decoding must reproduce the
  teacher-forced pass (``tests/test_decoding.py``), and :class:`LengthLimit` is the search's
  output cap that it may split per sentence;
- a **loss** (``onmt_doc/losses/base.py``: ``Loss``) reads a :class:`ModelOut` and the
  :class:`Batch` and returns a sum.

docs/extending.md walks through one complete part of each kind; docs/architecture.md
("Interfaces") tells the same contracts from the side of the trainer and the search.

This module sits below the data pipeline and the building blocks (docs/architecture.md, "Layers"): it
imports torch, numpy, the standard library and ``devices`` (the kernel-path rule) only, so any layer may
import it and no contract drags in an implementation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Optional

import numpy as np
import torch
from torch import nn

from onmt_doc.devices import fused

TARGET_ROWS_MULTIPLE = 8  # the output layer's row count is padded to this (see Batch.tgt_index)


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with ``fn`` applied to every tensor inside it: a tensor, or lists, tuples, dicts and
    dataclass instances (the parts' host plans) holding tensors; anything else (numbers, numpy
    arrays) is kept as it is. How a batch and its plans move to a device or to pinned memory."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple takes its fields as arguments
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: map_tensors(getattr(value, f.name), fn) for f in fields(value) if f.init}
        return dataclasses.replace(value, **changed)
    return value


@dataclass
class Batch:
    """Padded tensors of a batch of instances; the model reads only what its unit fills in.

    Produced by ``collate`` (``onmt_doc/data/batching.py``) for training, validation, translation
    and forced decoding; consumed by encoders (``src``, ``src_groups``, ``doc_index``), decoders
    (``tgt_in``, ``tgt_groups``, the source side for length caps), losses (``tgt_out``, ``extra``)
    and the trainer (the token counts). A context instance (a document window) gives one row per
    sentence; its rows share ``doc_index``. Target fields are None when translating.
    """

    src: torch.Tensor  # [B, S]
    src_groups: torch.Tensor  # [B, S] sentence tag k on sentence k, 0 on padding
    tgt_in: Optional[torch.Tensor] = None  # [B, T] <bos> + target
    tgt_out: Optional[torch.Tensor] = None  # [B, T] target + <eos>
    tgt_groups: Optional[torch.Tensor] = None  # [B, T] tags of tgt_in (0 on <bos> and padding)
    doc_index: Optional[torch.Tensor] = None  # [B] document of each example
    first_sent: Optional[torch.Tensor] = None  # [B] index of the example's first sentence in its document
    extra: dict = field(default_factory=dict)  # [B, T] per-target-token tensors (e.g. z_star)
    # [N'] flat positions (row * T + t) of the non-padding targets of tgt_out, computed on the host by
    # collate so that selecting them needs no device sync; N' is n_tgt_tokens rounded up to a multiple
    # of TARGET_ROWS_MULTIPLE (the extra entries point at position 0 and are cut off after the output
    # layer: an odd row count sends the output layer's matrix products to slow kernels on GPUs)
    tgt_index: Optional[torch.Tensor] = None
    # [N'] a static-shape batch's (train.static_shapes) output-layer targets: tgt_out at tgt_index,
    # <pad> on the extra rows, which the output layer computes (no cut at n_tgt_tokens, whose
    # value changes from batch to batch) and the losses weigh out
    tgt_target: Optional[torch.Tensor] = None
    n_src_tokens: int = 0
    n_tgt_tokens: int = 0  # non-padding tokens of tgt_out
    n_tgt_words: int = 0  # of them, the text (subwords, <unk>) without markup: what throughput compares
    indices: Optional[np.ndarray] = None  # positions of the examples in their source list
    # the host (CPU) batch this one was copied from by :meth:`to`: parts that plan on the host (the
    # fused group attention's sentence offsets) read it instead of reading the device
    host: Optional["Batch"] = field(default=None, repr=False, compare=False)
    # the parts' plans for the fused path, made on the host before the batch moves to the device
    # (``EncoderDecoder.prepare``: the trainer's prefetch thread on a GPU), keyed by name; a part
    # without its plan here makes it in its forward, where a compiled forward leaves its graph for it
    plans: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def size(self) -> int:
        """Rows in the batch."""
        return self.src.size(0)

    def to(self, device: torch.device) -> "Batch":
        """The same batch with every tensor (its plans' too) on ``device``; asynchronous from pinned
        memory (:meth:`pin_memory`), so the host can prepare the next step meanwhile."""
        moved = self._mapped(lambda t: t.to(device, non_blocking=True))
        moved.host = self if self.src.device.type == "cpu" else self.host
        return moved

    def pin_memory(self) -> "Batch":
        """The same batch in page-locked host memory, from which :meth:`to` copies to a GPU without
        blocking (the trainer's prefetching thread pins each batch it prepares)."""
        return self._mapped(lambda t: t.pin_memory())

    def _mapped(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Batch":
        """The batch with ``fn`` applied to every tensor of its fields (``host`` left out: None)."""
        values = {f.name: map_tensors(getattr(self, f.name), fn) for f in fields(self) if f.name != "host"}
        return Batch(**values)


@dataclass
class EncoderOut:
    """What an encoder hands to a decoder: ``memory`` [B, S, D], ``pad_mask`` [B, S] True on
    padding, the source sentence tags of document models, and ``extra`` (the keys the encoder
    ``provides`` and the decoder ``needs``).

    Produced by ``Encoder.forward``; consumed by ``Decoder.forward`` and ``Decoder.init_state``,
    and passed on to losses in :attr:`ModelOut.enc_out`. It lives here, not with the encoders, so
    decoders never import the encoders package.
    """

    memory: torch.Tensor  # [B, S, D]
    pad_mask: torch.Tensor  # [B, S] True on padding
    groups: Optional[torch.Tensor] = None  # [B, S] sentence tags (document models)
    extra: dict = field(default_factory=dict)

    def attention_mask(self) -> torch.Tensor:
        """[B, 1, 1, S] keep-mask for attention over the memory."""
        return (~self.pad_mask)[:, None, None, :]


@dataclass
class PartContext:
    """What every part's constructor receives besides its own config section: the model-wide
    sizes and dropouts, and the embeddings (shared, so encoder, decoder and generator can tie them).

    Produced by ``build_model`` (``onmt_doc/models/builder.py``), which decides whether the two
    sides share one embedding module; consumed by encoder and decoder constructors ``cls(cfg, ctx)``,
    which assign the embeddings to an attribute (registering the shared parameters, never copying).
    The embeddings are ``onmt_doc.modules.embeddings.Embeddings`` (scaled tokens plus positions,
    called as ``emb(ids, offset=step)``); they are typed as modules here so that the contracts,
    which every layer imports, import no building block themselves.
    """

    d_model: int
    dropout: float
    attention_dropout: float
    src_embeddings: nn.Module  # an onmt_doc.modules.embeddings.Embeddings
    tgt_embeddings: nn.Module  # the same module as src_embeddings when model.share_embeddings


@dataclass
class _Moves:
    """The rows a reorder changes: row ``targets[j]`` takes the old row ``sources[j]``; ``gather``:
    copy every row instead (a plain gather), which costs less once many rows move."""

    index: torch.Tensor
    targets: torch.Tensor
    sources: torch.Tensor
    gather: bool = False

    @staticmethod
    def of(index: torch.Tensor) -> "_Moves":
        """The rows that change (on the fused path every row: finding them costs a GPU a device read).
        On the packed (CPU) path, once more than a quarter of the rows move (a sentence beam search
        usually), one gather of every row costs less than gathering the moved rows and writing them
        back: ``gather``."""
        everything = torch.arange(index.numel(), device=index.device)
        if fused(index.device):
            return _Moves(index, everything, index)
        targets = index.ne(everything).nonzero().squeeze(1)
        return _Moves(index, targets, index.index_select(0, targets), 4 * targets.numel() > index.numel())

    def apply(self, x: torch.Tensor, filled: Optional[int] = None) -> torch.Tensor:
        """Moves the rows of ``x`` in place (the moved rows are gathered before any is written) and
        cuts it to the new number of rows; a reorder that adds rows, or whose ``gather`` says so,
        gathers as usual. ``filled``: only the first ``filled`` slots of dimension 2 hold values (a
        cache allocated ahead), so only they move in place."""
        n = self.index.numel()
        if x.size(0) < n or self.gather:
            return x.index_select(0, self.index)
        if self.targets.numel():
            live = x if filled is None else x[:, :, :filled]
            live.index_copy_(0, self.targets, live.index_select(0, self.sources))
        return x if x.size(0) == n else x[:n]


def _reorder(
    value: Any, index: torch.Tensor, same_sources: bool, moves: Optional[_Moves] = None, filled: Optional[int] = None
) -> Any:
    if isinstance(value, torch.Tensor):
        return moves.apply(value, filled) if moves is not None else value.index_select(0, index)
    if isinstance(value, DecoderState):
        return value.reorder(index, same_sources)
    if isinstance(value, (list, tuple)):
        return type(value)(_reorder(v, index, same_sources, moves, filled) for v in value)
    if isinstance(value, dict):
        return {k: _reorder(v, index, same_sources, moves, filled) for k, v in value.items()}
    return value


@dataclass
class DecoderState:
    """Base of every decoder's state dataclass: what a decoder carries from one step to the next.

    Produced by ``Decoder.init_state`` and updated (in place or not) by ``Decoder.step``; consumed
    by the search (``onmt_doc/translate/search.py``) and ensembles, which only ever call
    :meth:`reorder`. Subclasses only declare fields: :meth:`reorder` walks tensors, nested states,
    lists, tuples and dicts generically, so beam search needs no per-decoder code. Every tensor has
    the batch row on dimension 0; other values (step counters, None) are kept as they are.

    The class attributes say which fields a reorder may treat specially:

    - ``source_fields`` depend on the source alone (e.g. cached cross-attention keys/values); they
      are the same for all beams of one sentence, so reordering beams inside their sentence
      (``same_sources=True``) skips them. A field that changes with the target must not be listed.
    - ``shared_fields`` are not per row at all (e.g. one key/value cache per document that several
      rows index into); reordering never touches them.
    - ``owned_fields`` hold tensors that this state alone refers to (caches that grow with the
      output, keys/values computed for the state): whenever a reorder keeps or shrinks the number
      of rows, they are rewritten in place, only at the rows that change, and cut to the new
      number of rows. In long beam searches about four rows in five keep their place at a step,
      and beam search prunes finished sentences by moving the last ones into their places
      (:func:`~onmt_doc.translate.search.fill_holes`), so a reorder copies a small part of what a
      full gather would (on the packed path a reorder that moves more than a quarter of the rows
      gathers, which then costs a CPU less; caches allocated ahead say in :meth:`filled_slots`
      which slots hold values, and only those move). Never list a tensor that may be a view of
      something the caller still reads (the encoder output, a token the search keeps), nor one that
      sits in the state twice.
    """

    source_fields: ClassVar[tuple[str, ...]] = ()
    shared_fields: ClassVar[tuple[str, ...]] = ()
    owned_fields: ClassVar[tuple[str, ...]] = ()

    def reorder(self, index: torch.Tensor, same_sources: bool = False) -> "DecoderState":
        """Select batch rows ``index``; ``same_sources`` when rows only move within a sentence's beam."""
        moves = _Moves.of(index) if self.owned_fields else None
        for f in fields(self):
            if f.name in self.shared_fields or (same_sources and f.name in self.source_fields):
                continue
            owned = moves if f.name in self.owned_fields else None
            filled = self.filled_slots(f.name) if owned is not None else None
            setattr(self, f.name, _reorder(getattr(self, f.name), index, False, owned, filled))
        return self

    def filled_slots(self, name: str) -> Optional[int]:
        """For an owned field whose caches [B, H, C, d] are allocated ahead and filled one slot a step:
        how many of the C slots hold values, so that a reorder moves only those (the rest is
        overwritten before it is read). None (the default): every slot moves."""
        return None

    def nbytes(self) -> int:
        """Bytes held in tensors (used to check that constant-size states stay constant)."""
        total = 0

        def visit(v: Any) -> None:
            nonlocal total
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
            elif isinstance(v, DecoderState):
                total += v.nbytes()
            elif isinstance(v, (list, tuple)):
                for x in v:
                    visit(x)
            elif isinstance(v, dict):
                for x in v.values():
                    visit(x)

        for f in fields(self):
            visit(getattr(self, f.name))
        return total


@dataclass
class DecoderOut:
    """What a teacher-forced pass returns: ``hidden`` for the generator and ``aux`` for losses and
    analysis (gates, attention; ``aux["stats"]`` per-token sums that validation reports).

    Produced by ``Decoder.forward``; consumed by ``EncoderDecoder.forward``, which projects
    ``hidden`` at the non-padding positions and passes ``aux`` on in :class:`ModelOut`.
    """

    hidden: torch.Tensor  # [B, T, D], fed to the generator
    # what losses and analysis read (gates, attention); aux["stats"] holds per-token sums that
    # validation reports, keys "group/name" (TensorBoard valid/group/name, divided by target tokens)
    aux: dict = field(default_factory=dict)


@dataclass
class ModelOut:
    """What a teacher-forced pass hands every loss: logits of real target positions plus the decoder's extras.

    Produced by ``EncoderDecoder.forward`` (``onmt_doc/models/model.py``), which runs the generator
    only where the target is not padding (the largest matrix product of a small model); consumed
    by every ``Loss`` and by the trainer's validation.
    """

    logits: torch.Tensor  # [N, V] at the N non-padding target positions
    target: torch.Tensor  # [N]
    target_mask: torch.Tensor  # [B, T] True at those positions
    hidden: torch.Tensor  # [B, T, D]
    enc_out: EncoderOut
    aux: dict = field(default_factory=dict)
    # a static-shape batch (Batch.tgt_target): logits and target have extra rows whose target is
    # <pad>, which every loss weighs out
    padded_targets: bool = False


@dataclass(frozen=True)
class LengthLimit:
    """Output length cap ``min(ratio × source length + add, max_length)``, at least 1 (of a
    sentence, or of each sentence of a document for document decoders). ``max_length`` bounds the
    work of a long input line whatever the ratio (OpenNMT-py also caps at 250).

    Produced by the search from ``translate.max_len_ratio`` / ``max_len_add``; consumed by
    ``Decoder.max_output_lengths`` (each row's cap) and ``Decoder.init_state`` (so a document
    decoder can cap every sentence).
    """

    ratio: float = 1.5
    add: int = 10
    max_length: int = 250

    def __call__(self, src_len: torch.Tensor) -> torch.Tensor:
        """``src_len`` [B] source lengths -> [B] output length caps."""
        cap = (src_len.float() * self.ratio).long() + self.add
        return cap.clamp(min=1, max=max(self.max_length, 1))
