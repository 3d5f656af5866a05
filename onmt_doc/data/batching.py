"""Token-budget batches: collation into padded tensors, bucketing, sharding and resumable order."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from onmt_doc.contracts import TARGET_ROWS_MULTIPLE, Batch
from onmt_doc.data.instances import Example
from onmt_doc.data.lengths import Lengths
from onmt_doc.data.mapped import IndexedExamples, MappedExamples, Rows
from onmt_doc.data.static_shapes import StaticShapes, pad_batch_arrays
from onmt_doc.data.vocab import BOS_ID, EOS_ID, PAD_ID, SOS_ID, SPECIALS, UNK_ID


def group_tags(ids: torch.Tensor) -> torch.Tensor:
    """Tag k on every token of the k-th ``<s> … </s>`` sentence, 0 on <bos>/<eos>/padding.

    Works on numpy arrays (collation) and torch tensors (decoders) alike."""
    tags = (ids == SOS_ID).cumsum(1)
    untagged = (ids == PAD_ID) | (ids == BOS_ID) | (ids == EOS_ID)
    if isinstance(tags, torch.Tensor):  # masked_fill_: a boolean index would read the mask's size from a GPU
        return tags.masked_fill_(untagged, 0)
    tags[untagged] = 0
    return tags


def _pad(flat: np.ndarray, lens: np.ndarray, prefix: Optional[int] = None, suffix: Optional[int] = None) -> np.ndarray:
    """Rows of ``lens`` ids, one after the other in ``flat``, as a [R, max + extras] array padded with
    ``<pad>``, each row after ``prefix`` and before ``suffix`` when given (vectorised: one scatter)."""
    extra = (prefix is not None) + (suffix is not None)
    rows = len(lens)
    out = np.full((rows, (int(lens.max()) if rows else 0) + extra), PAD_ID, dtype=np.int64)
    start = 1 if prefix is not None else 0
    row = np.repeat(np.arange(rows), lens)
    col = np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens) + start
    out[row, col] = flat
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(rows), lens + start] = suffix
    return out


def sentence_rows(examples: Sequence[Example]) -> tuple[list[Example], list[int]]:
    """Split context instances into one example per sentence; also return each row's instance."""
    rows, owner = [], []
    for b, e in enumerate(examples):
        if e.sent_lens is None:
            rows.append(e)
            owner.append(b)
            continue
        ends = e.sent_lens.cumsum(0)
        starts = ends - e.sent_lens
        for j, ((s0, t0), (s1, t1)) in enumerate(zip(starts, ends)):
            extra = {k: v[t0:t1] for k, v in e.extra.items()}
            rows.append(Example(e.src[s0:s1], None if e.tgt is None else e.tgt[t0:t1], e.doc, e.first + j, 1, extra))
            owner.append(b)
    return rows, owner


def _flat(seqs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter((len(x) for x in seqs), dtype=np.int64, count=len(seqs))
    return (np.concatenate(seqs).astype(np.int64) if len(seqs) else np.zeros(0, np.int64)), lens


def example_rows(examples: Sequence[Example]) -> Rows:
    """The batch rows of ``examples`` (a context instance gives one row per sentence) as flat streams."""
    rows, owner = sentence_rows(examples)
    src, src_lens = _flat([e.src for e in rows])
    tgt, tgt_lens = _flat([e.tgt for e in rows]) if rows and rows[0].tgt is not None else (None, None)
    extra = {key: _flat([e.extra[key] for e in rows]) for key in (rows[0].extra if rows else {})}
    first = np.fromiter((e.first for e in rows), dtype=np.int64, count=len(rows))
    return Rows(src, src_lens, tgt, tgt_lens, np.asarray(owner, dtype=np.int64), first, extra)


def collate(examples: Sequence[Example], indices: Optional[np.ndarray] = None) -> Batch:
    """Padded tensors of ``examples``; a context instance gives one row per sentence, and
    ``doc_index`` says which example (document window) each row comes from."""
    return collate_rows(example_rows(examples), indices)


def make_batch(examples: Sequence[Example], idx: np.ndarray, shapes: Optional[StaticShapes] = None) -> Batch:
    """The batch of ``examples[i] for i in idx``: read straight from the mapped corpus when the
    examples are mapped instances (no Example made), else :func:`collate` of them; with ``shapes``,
    padded to a static shape (``train.static_shapes``)."""
    if isinstance(examples, MappedExamples):
        rows = examples.batch_rows(idx)
    else:
        rows = example_rows([examples[i] for i in idx])
    return collate_rows(rows, idx, shapes)


def collate_rows(rows: Rows, indices: Optional[np.ndarray] = None, shapes: Optional[StaticShapes] = None) -> Batch:
    """The Batch of ``rows``: every tensor padded here, the host-side counts and positions
    (``n_*``, ``tgt_index``) computed here, so nothing has to be read back from a GPU. With
    ``shapes`` (training batches with targets), padded to a static shape: extra rows and columns,
    and ``tgt_target``, the output layer's targets with ``<pad>`` on its extra rows."""
    src = _pad(rows.src, rows.src_lens)
    n_src_tokens = int((src != PAD_ID).sum())  # before padding: an added row's <eos> is not text
    owner, first, tgt_in, tgt_out = rows.owner, rows.first, None, None
    if rows.tgt is not None:
        tgt_in = _pad(rows.tgt, rows.tgt_lens, prefix=BOS_ID)
        tgt_out = _pad(rows.tgt, rows.tgt_lens, suffix=EOS_ID)
        if shapes is not None:
            src, tgt_in, tgt_out = pad_batch_arrays(shapes, src, tgt_in, tgt_out)
            added = len(src) - len(owner)  # rows of their own (instances after the batch's)
            owner = np.concatenate([owner, np.arange(added) + (int(owner.max()) + 1 if len(owner) else 0)])
            first = np.concatenate([first, np.zeros(added, dtype=first.dtype)])
    batch = Batch(
        src=torch.from_numpy(src),
        src_groups=torch.from_numpy(group_tags(src)),
        doc_index=torch.from_numpy(owner),
        first_sent=torch.from_numpy(first),
        n_src_tokens=n_src_tokens,
        indices=indices,
    )
    if tgt_in is not None and tgt_out is not None:
        batch.tgt_in, batch.tgt_out = torch.from_numpy(tgt_in), torch.from_numpy(tgt_out)
        batch.tgt_groups = torch.from_numpy(group_tags(tgt_in))
        index = target_index(tgt_out, None if shapes is None else shapes.target_step(*tgt_out.shape))
        batch.tgt_index = torch.from_numpy(index)
        batch.n_tgt_tokens = int((tgt_out != PAD_ID).sum())
        batch.n_tgt_words = int(((tgt_out >= len(SPECIALS)) | (tgt_out == UNK_ID)).sum())
        if shapes is not None:
            target = tgt_out.reshape(-1)[index]
            target[batch.n_tgt_tokens :] = PAD_ID
            batch.tgt_target = torch.from_numpy(target)
        for key, (flat, lens) in rows.extra.items():
            extra = _pad(flat, lens, suffix=0)
            if shapes is not None:  # to the static shape, zeros on the added rows and columns
                extra = np.pad(extra, [(0, tgt_out.shape[0] - extra.shape[0]), (0, tgt_out.shape[1] - extra.shape[1])])
            batch.extra[key] = torch.from_numpy(extra)
    return batch


def target_index(tgt_out: np.ndarray, step: Optional[int] = None) -> np.ndarray:
    """Flat positions of the non-padding targets (``Batch.tgt_index``), padded with position 0 to a
    multiple of ``step`` rows (default ``TARGET_ROWS_MULTIPLE``; a static shape's own step)."""
    index = np.flatnonzero(tgt_out.reshape(-1) != PAD_ID)
    short = -len(index) % (step or TARGET_ROWS_MULTIPLE)
    return np.concatenate([index, np.zeros(short, dtype=index.dtype)]) if short else index


def example_lengths(examples: Sequence[Example]) -> Lengths:
    """Per example, the padded lengths its batch row needs (what the token budget counts); for
    mapped instances computed from the corpus offsets, without making an example."""
    if isinstance(examples, IndexedExamples):
        return examples.lengths()

    def longest(e: Example, side: int) -> int:
        if e.sent_lens is not None:
            return int(e.sent_lens[:, side].max())
        seq = e.src if side == 0 else e.tgt
        return 0 if seq is None else len(seq)

    n = len(examples)
    src = np.fromiter((longest(e, 0) for e in examples), dtype=np.int64, count=n)
    tgt = np.fromiter((longest(e, 1) + 1 if e.tgt is not None else 0 for e in examples), dtype=np.int64, count=n)
    rows = np.fromiter((e.rows for e in examples), dtype=np.int64, count=n)
    if all(e.sent_lens is None for e in examples):
        return Lengths(src, tgt, rows)

    def sums(e: Example) -> tuple[int, int]:
        lens = e.sent_lens if e.sent_lens is not None else np.array([[len(e.src), 0]])
        row_tgt = lens[:, 1] + 1 if e.tgt is not None else 0  # <bos>/<eos>
        return int(lens[:, 0].sum()), int(np.maximum(lens[:, 0], row_tgt).sum())

    real_src, real = np.array([sums(e) for e in examples], dtype=np.int64).reshape(n, 2).T
    return Lengths(src, tgt, rows, real_src, real)


def token_batches(
    order: np.ndarray, lengths: Lengths, batch_tokens: int, max_rows: int = 0, by_source_only: bool = False
) -> list[np.ndarray]:
    """Cut ``order`` into consecutive batches with rows * max(src, tgt length) <= batch_tokens
    (and rows <= max_rows when set).

    An example longer than the budget forms a batch of its own rather than being dropped.
    Context instances (``lengths.real`` set) count the sum of their rows' real lengths instead:
    their models run rows in length buckets, so that is what a batch computes.
    """
    if lengths.real is not None:
        return _real_token_batches(order, lengths, batch_tokens, max_rows, by_source_only)
    size = lengths.src if by_source_only else np.maximum(lengths.src, lengths.tgt)
    batches, start, longest, rows = [], 0, 0, 0
    for i, idx in enumerate(order):
        n, r = size[idx], lengths.rows[idx]
        if i > start and (max(longest, n) * (rows + r) > batch_tokens or (max_rows and rows + r > max_rows)):
            batches.append(order[start:i])
            start, longest, rows = i, 0, 0
        longest, rows = max(longest, n), rows + r
    if len(order) > start:
        batches.append(order[start:])
    return batches


def _real_token_batches(
    order: np.ndarray, lengths: Lengths, batch_tokens: int, max_rows: int, by_source_only: bool
) -> list[np.ndarray]:
    """:func:`token_batches` for context instances: the rows' summed real lengths <= batch_tokens."""
    size = lengths.real_src if by_source_only else lengths.real
    batches, start, total, rows = [], 0, 0, 0
    for i, idx in enumerate(order):
        n, r = size[idx], lengths.rows[idx]
        if i > start and (total + n > batch_tokens or (max_rows and rows + r > max_rows)):
            batches.append(order[start:i])
            start, total, rows = i, 0, 0
        total, rows = total + n, rows + r
    if len(order) > start:
        batches.append(order[start:])
    return batches


class CorpusMix:
    """Several training corpora in one example list, drawn in proportion to integer weights.

    Corpus c holds the examples ``offsets[c]:offsets[c + 1]`` of the list. Following OpenNMT-py, a
    weight is the number of examples drawn from its corpus per *round*; an **epoch** is the number of
    rounds that uses every example of the corpus slowest to go through once:
    ``rounds = max_c ceil(size_c / weight_c)``, and corpus c gives ``rounds * weight_c`` examples per
    epoch (exactly proportional to the weights). Each corpus is read as an endless stream of passes,
    every pass a seeded permutation of all its examples; an epoch takes its next ``rounds * weight_c``
    examples from that stream, so a smaller corpus is repeated (every example as often as any other,
    give or take one) and the remainder of a pass carries over to the next epoch: nothing is ever
    dropped. With one corpus its weight has no effect: an epoch is every example once.
    """

    def __init__(self, names: Sequence[str], sizes: Sequence[int], weights: Sequence[int]):
        if not (len(names) == len(sizes) == len(weights)) or not names:
            raise ValueError("CorpusMix needs one name, size and weight per corpus")
        self.names, self.sizes, self.weights = list(names), [int(n) for n in sizes], [int(w) for w in weights]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        if len(self.sizes) == 1:
            self.per_epoch = [self.sizes[0]]
        else:
            rounds = max(-(-n // w) for n, w in zip(self.sizes, self.weights))
            self.per_epoch = [rounds * w for w in self.weights]

    def corpus_of(self, index: np.ndarray) -> np.ndarray:
        """The corpus number of each example index."""
        return np.searchsorted(self.offsets, index, side="right") - 1

    def draw(self, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
        """The example indices of an epoch, corpus after corpus (a pure function of seed and epoch)."""
        if len(self.sizes) == 1:
            return np.arange(self.sizes[0], dtype=np.int64)
        parts = []
        for c, (n, count) in enumerate(zip(self.sizes, self.per_epoch)):
            start, end = epoch * count, (epoch + 1) * count  # positions in the corpus' stream of passes
            passes = []
            for p in range(start // n, (end - 1) // n + 1):
                order = np.random.default_rng([seed, p, c + 1]).permutation(n) if shuffle else np.arange(n)
                passes.append(order)
            stream = np.concatenate(passes)[start - (start // n) * n :][:count]
            parts.append(stream + self.offsets[c])
        return np.concatenate(parts).astype(np.int64)

    def counts(self, index: np.ndarray) -> dict[str, int]:
        """Examples per corpus among ``index``."""
        found = np.bincount(self.corpus_of(np.asarray(index, dtype=np.int64)), minlength=len(self.sizes))
        return {name: int(k) for name, k in zip(self.names, found)}


class BatchSampler:
    """Seeded bucketed batches, the same on every rank, each rank taking its share.

    An epoch's batches are a pure function of (seed, epoch): examples are sorted by length with a
    random tie-break, cut into token-budget batches and shuffled. Resuming is therefore just a
    position (epoch, batches consumed), which the checkpoint stores. Every example is used every
    epoch; with several ranks the last round is completed by repeating batches from the start of
    the epoch so all ranks take the same number of steps. With a :class:`CorpusMix` of several
    corpora, an epoch's examples are the mix's draw for that epoch (weighted, repeats allowed),
    bucketed and shuffled the same way, so batches mix corpora.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        batch_tokens: int,
        seed: int = 1,
        shuffle: bool = True,
        rank: int = 0,
        world: int = 1,
        mix: Optional[CorpusMix] = None,
        shapes: Optional[StaticShapes] = None,
    ):
        """``shapes``: pad every batch to a static shape (``train.static_shapes``)."""
        self.examples, self.shapes = examples, shapes
        self.lengths = example_lengths(examples)
        self.batch_tokens, self.seed, self.shuffle = batch_tokens, seed, shuffle
        self.rank, self.world = rank, world
        self.mix = mix or CorpusMix(["train"], [len(examples)], [1])
        if int(self.mix.offsets[-1]) != len(examples):
            raise ValueError(
                f"the corpus mix covers {int(self.mix.offsets[-1])} examples, the list has {len(examples)}"
            )
        self.epoch, self.position = 0, 0
        self._cache: dict[int, list[np.ndarray]] = {}  # the last two epochs' batches (a prefetcher reads ahead)

    def epoch_examples(self, epoch: int) -> np.ndarray:
        """Every example index of an epoch (before batching and sharding), repeats included."""
        return self.mix.draw(self.seed, epoch, self.shuffle)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches (example indices) for an epoch."""
        if epoch in self._cache:
            return self._cache[epoch]
        items = self.epoch_examples(epoch)
        n = len(items)
        lengths = self.lengths if len(self.mix.sizes) == 1 else self.lengths.take(items)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            order = lengths.sort_order(rng.random(n))
        else:
            order = lengths.sort_order()
        batches = [items[b] for b in token_batches(order, lengths, self.batch_tokens)]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.world > 1:
            short = (-len(batches)) % self.world
            batches = batches + [batches[i % len(batches)] for i in range(short)]
            batches = batches[self.rank :: self.world]
        self._cache = {e: b for e, b in self._cache.items() if e == epoch - 1}
        self._cache[epoch] = batches
        return batches

    def __iter__(self) -> Iterator[Batch]:
        """Batches forever (epoch after epoch), continuing from the current position."""
        for batch, epoch, position in self.batches_from(self.epoch, self.position):
            self.epoch, self.position = epoch, position
            yield batch

    def batches_from(self, epoch: int, position: int) -> Iterator[tuple[Batch, int, int]]:
        """Batches forever from (``epoch``, ``position``), each with the position after it, without
        moving the sampler: a reader ahead (``train/prefetch.py``) sets the position of the batches
        actually consumed, which is what a checkpoint saves."""
        while True:
            batches = self.epoch_batches(epoch)
            while position < len(batches):
                idx = batches[position]
                position += 1
                yield make_batch(self.examples, idx, self.shapes), epoch, position
            epoch, position = epoch + 1, 0

    def completed_epochs(self) -> int:
        """Epochs fully consumed (the iterator only moves to the next epoch when asked for a batch)."""
        return self.epoch + (self.position >= len(self.epoch_batches(self.epoch)))

    def epoch_counts(self, epoch: int) -> dict[str, int]:
        """Examples each corpus gives to an epoch (all ranks together, before the last round's repeats)."""
        return self.mix.counts(self.epoch_examples(epoch))

    def state_dict(self) -> dict:
        """Where the sampler is (for exact resume)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a ``state_dict`` of the same data."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def ordered_batches(
    examples: Sequence[Example], batch_tokens: int, by_source_only: bool = False, max_rows: int = 0
) -> list[np.ndarray]:
    """Deterministic length-sorted batches for validation and translation."""
    lengths = example_lengths(examples)
    return token_batches(
        lengths.sort_order(by_source_only=by_source_only), lengths, batch_tokens, max_rows, by_source_only
    )
