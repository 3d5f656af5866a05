"""PMI tables and the context-gate supervision z* (Li et al., 2020, sec. 2.3, eqs. 6–7).

Counts over a tokenized parallel corpus (the run's subword ids, without markup):

- bilingual ``C(y, x)``: +1 for each sentence pair in which target type y and source type x both
  occur (once per pair, however often they occur);
- monolingual ``C(y_i, y_k)``: +1 for each target sentence in which type y_k occurs before an
  occurrence of type y_i (k < i; once per sentence);
- unigram ``C(w)``: token counts of each side.

``pmi(μ, ν) = log Z + log C(μ, ν) − log C(μ) − log C(ν)`` (eq. 6). The normaliser Z is a choice
made when z* is computed, not when counting (the table holds counts only, so one table serves both):

- ``shared`` (default): one Z, the number of all pairs counted in both scenarios. The paper defines
  the two PMIs "according to different C(μ,ν)" with "Z ... the total number of all possible (μ,ν)
  pairs"; with one Z, log Z cancels in eq. 7;
- ``per_scenario``: each scenario's own Z (the sum of its pair counts); this adds
  log(Z_bi / Z_mono) ≈ log 2 to every bilingual PMI and so favours z* = 1.

An unseen pair has pmi −inf. A z* cache is named by the table's digest, which covers the normaliser.

``z*_i = 1[max_j pmi(y_i, x_j) > max_{k<i} pmi(y_i, y_k)]`` (eq. 7). A max over nothing is −inf:
the first target token gets 1 when it was seen with any source token, a token seen with nothing
gets 0 (the target side).

Pairs are int64 ids (``y·V + x``) generated with numpy for a chunk of sentences at a time and
merged into sorted (key, count) arrays; the table file holds those arrays (``.npz``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Iterable, Iterator, Literal, Optional, Protocol, Sequence

import numpy as np

from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import iter_parallel
from onmt_doc.data.example_fields import FieldContext, register_field
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.outputs import Input, input_problem, output_file

if TYPE_CHECKING:
    from onmt_doc.data.mapped import MappedCorpus

log = logging.getLogger("onmt_doc")

TABLE_FORMAT = 1
Normaliser = Literal["shared", "per_scenario"]
NORMALISERS: tuple[str, ...] = ("shared", "per_scenario")
_ARRAYS = ("src_counts", "tgt_counts", "bi_keys", "bi_counts", "mono_keys", "mono_counts")
Pair = tuple[np.ndarray, np.ndarray]
Z_STAR = "z_star"  # the per-example field of z* (data/example_fields.py): extra["z_star"] and ["z_star_mask"]


# ----------------------------------------------------------------------------- ragged helpers


def ragged_arange(lengths: np.ndarray) -> np.ndarray:
    """``0..l0-1, 0..l1-1, …`` for ``lengths`` [l0, l1, …]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)


def _flatten(seqs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenated ids, lengths and start offsets of ``seqs``."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    flat = np.concatenate(seqs).astype(np.int64) if len(seqs) else np.zeros(0, np.int64)
    return flat, lengths, np.cumsum(lengths) - lengths


def _sorted_unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys (sorted) and their counts; a sort is faster here than np.unique's hashing."""
    keys = np.sort(keys)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, np.int64)
    return keys[starts], np.diff(np.r_[starts, len(keys)])


def _group_max(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Maximum of each consecutive group of ``values``; −inf for empty groups."""
    out = np.full(len(lengths), -np.inf)
    nonempty = lengths > 0
    if values.size:
        out[nonempty] = np.maximum.reduceat(values, (np.cumsum(lengths) - lengths)[nonempty])
    return out


# ----------------------------------------------------------------------------- counting


def _types(seqs: Sequence[np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(sentence, type) of the distinct types of each sentence, sorted by sentence."""
    flat, lengths, _ = _flatten(seqs)
    keys = _sorted_unique(np.repeat(np.arange(len(seqs), dtype=np.int64), lengths) * size + flat)[0]
    return keys // size, keys % size


def bilingual_pairs(src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], src_size: int, tgt_size: int) -> np.ndarray:
    """Keys ``y·src_size + x`` of the distinct (target, source) type pairs of every sentence pair."""
    t_sent, t_type = _types(tgt, tgt_size)
    s_sent, s_type = _types(src, src_size)
    s_count = np.bincount(s_sent, minlength=len(src))
    reps = s_count[t_sent]
    x = s_type[np.repeat((np.cumsum(s_count) - s_count)[t_sent], reps) + ragged_arange(reps)]
    return np.repeat(t_type, reps) * src_size + x


def monolingual_pairs(tgt: Sequence[np.ndarray], tgt_size: int) -> np.ndarray:
    """Keys ``y_i·tgt_size + y_k`` of the distinct ordered type pairs (k < i) of every sentence."""
    flat, lengths, starts = _flatten(tgt)
    sent = np.repeat(np.arange(len(tgt), dtype=np.int64), lengths)
    before = ragged_arange(lengths)  # i: how many tokens precede position p
    later = np.repeat(np.arange(len(flat)), before)
    earlier = np.repeat(starts[sent], before) + ragged_arange(before)
    pairs = flat[later] * tgt_size + flat[earlier]
    per_sentence = _sorted_unique(sent[later] * tgt_size**2 + pairs)[0]  # once per sentence
    return per_sentence % tgt_size**2


class PairCounts:
    """Counts of int64 keys kept as one sorted (keys, counts) table; new keys wait in small sorted
    runs and are merged in by binary search and insertion. Memory follows the number of distinct
    keys (12 bytes each, plus one copy while merging), not the number of occurrences."""

    def __init__(self, merge_at: int = 1 << 21):
        self.keys = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int32)
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.n_pending, self.merge_at = 0, merge_at

    def add(self, keys: np.ndarray) -> None:
        """Count one chunk of keys; merging is deferred until ``merge_at`` pending keys, to amortise the copy."""
        self.pending.append(_sorted_unique(keys))
        self.n_pending += len(self.pending[-1][0])
        if self.n_pending > self.merge_at:
            self._merge()

    def _merge(self) -> None:
        if not self.pending:
            return
        keys = np.concatenate([k for k, _ in self.pending])
        counts = np.concatenate([c for _, c in self.pending])
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        keys, counts = keys[starts], np.add.reduceat(counts, starts)
        pos = np.searchsorted(self.keys, keys)
        old = pos < len(self.keys)
        old[old] = self.keys[pos[old]] == keys[old]
        self.counts[pos[old]] += counts[old].astype(np.int32)
        self.keys = np.insert(self.keys, pos[~old], keys[~old])
        self.counts = np.insert(self.counts, pos[~old], counts[~old].astype(np.int32))
        self.pending, self.n_pending = [], 0

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """The sorted distinct keys and their counts, pending runs merged in."""
        self._merge()
        return self.keys, self.counts


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def vocab_digest(codec: Codec) -> str:
    """Short hash of both vocabularies: a table records it so one built for other vocabularies is refused."""
    h = hashlib.sha256("\n".join(codec.src_vocab.itos).encode())
    h.update(b"\0" + "\n".join(codec.tgt_vocab.itos).encode())
    return h.hexdigest()[:24]


# ----------------------------------------------------------------------------- the table


@dataclass
class PMITable:
    """Unigram and pair counts of a corpus, from which eq. 6's PMI is computed on demand under ``normaliser``."""

    src_counts: np.ndarray  # [V_src] unigram token counts
    tgt_counts: np.ndarray  # [V_tgt]
    bi_keys: np.ndarray  # sorted y·V_src + x
    bi_counts: np.ndarray
    mono_keys: np.ndarray  # sorted y_i·V_tgt + y_k
    mono_counts: np.ndarray
    n_pairs: int = 0  # sentence pairs counted
    vocab: str = ""  # vocab_digest of the codec it was built with
    normaliser: Normaliser = "shared"  # Z of eq. 6 used by bilingual/monolingual (not stored: counts only)

    def __post_init__(self) -> None:
        if self.normaliser not in NORMALISERS:
            raise ValueError(f"normaliser must be one of {', '.join(NORMALISERS)} (got {self.normaliser!r})")
        bi, mono = int(self.bi_counts.sum()), int(self.mono_counts.sum())
        if self.normaliser == "shared":  # eq. 6: one Z, all (μ, ν) pairs; log Z cancels in eq. 7
            self.log_z_bi = self.log_z_mono = float(np.log(max(bi + mono, 1)))
        else:  # each scenario its own Z
            self.log_z_bi, self.log_z_mono = float(np.log(max(bi, 1))), float(np.log(max(mono, 1)))

    @property
    def src_size(self) -> int:
        """Source vocabulary size the keys were built with (``y·src_size + x``)."""
        return len(self.src_counts)

    @property
    def tgt_size(self) -> int:
        """Target vocabulary size the keys were built with (``y_i·tgt_size + y_k``)."""
        return len(self.tgt_counts)

    @staticmethod
    def _count(keys: np.ndarray, counts: np.ndarray, query: np.ndarray) -> np.ndarray:
        idx = np.minimum(np.searchsorted(keys, query), max(len(keys) - 1, 0))
        if not len(keys):
            return np.zeros(len(query), np.int64)
        return np.where(keys[idx] == query, counts[idx], 0)

    @staticmethod
    def _pmi(count: np.ndarray, log_z: float, c_u: np.ndarray, c_v: np.ndarray) -> np.ndarray:
        out = np.full(len(count), -np.inf)
        seen = count > 0
        out[seen] = log_z + np.log(count[seen]) - np.log(c_u[seen]) - np.log(c_v[seen])  # eq. 6
        return out

    def bilingual(self, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """pmi(y, x) of target ids ``y`` and source ids ``x`` (same shape)."""
        y, x = np.asarray(y, np.int64), np.asarray(x, np.int64)
        count = self._count(self.bi_keys, self.bi_counts, y * self.src_size + x)
        return self._pmi(count, self.log_z_bi, self.tgt_counts[y], self.src_counts[x])

    def monolingual(self, y: np.ndarray, prev: np.ndarray) -> np.ndarray:
        """pmi(y_i, y_k) of target ids ``y`` and earlier target ids ``prev``."""
        y, prev = np.asarray(y, np.int64), np.asarray(prev, np.int64)
        count = self._count(self.mono_keys, self.mono_counts, y * self.tgt_size + prev)
        return self._pmi(count, self.log_z_mono, self.tgt_counts[y], self.tgt_counts[prev])

    def digest(self) -> str:
        """Hash of the counts and of the normaliser: z* caches are keyed by it, so z* computed
        with the other normaliser is never read back."""
        h = hashlib.sha256(self.vocab.encode())
        for name in _ARRAYS:
            h.update(np.ascontiguousarray(getattr(self, name)).tobytes())
        h.update(f"normaliser={self.normaliser}".encode())
        return h.hexdigest()[:24]

    def check_vocab(self, codec: Codec, path: str) -> None:
        """Refuse (``UserError``) a table whose ids mean other tokens than ``codec``'s: its PMI would be wrong."""
        if (self.src_size, self.tgt_size) != (len(codec.src_vocab), len(codec.tgt_vocab)) or self.vocab != vocab_digest(
            codec
        ):
            raise UserError(
                f"{path}: PMI table built with other vocabularies than this run's "
                f"({self.src_size}/{self.tgt_size} entries, this run {len(codec.src_vocab)}/"
                f"{len(codec.tgt_vocab)}); rebuild it with onmt_doc_build_pmi_table -config <this config>"
            )

    def save(self, path: str, inputs: Sequence[Input] = (), flag: str = "-output") -> None:
        """One uncompressed ``.npz`` at exactly ``path``, written atomically (never onto ``inputs``)."""
        meta = json.dumps({"format": TABLE_FORMAT, "n_pairs": self.n_pairs, "vocab": self.vocab})
        with output_file(path, inputs, flag, binary=True, make_folder=True) as f:
            np.savez(f, meta=np.array(meta), **{name: getattr(self, name) for name in _ARRAYS})

    @classmethod
    def load(cls, path: str, codec: Optional[Codec] = None, normaliser: Normaliser = "shared") -> "PMITable":
        """The table at ``path`` computing PMI with ``normaliser``; with ``codec``, refused unless
        built with its vocabularies."""
        problem = input_problem(path)
        if problem == "file not found":
            raise UserError(f"{path}: PMI table not found (build it with onmt_doc_build_pmi_table)")
        if problem:
            raise UserError(f"{path}: {problem}")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                arrays = {name: z[name] for name in _ARRAYS}
        except Exception as e:  # an empty, cut or damaged file fails anywhere in zipfile/numpy (EOFError, BadZipFile…)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
            raise UserError(f"{path}: not a PMI table of onmt_doc_build_pmi_table ({reason})") from None
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k, 0), int) for k in ("format", "n_pairs")):
            raise UserError(f"{path}: not a PMI table of onmt_doc_build_pmi_table (its meta entry is not a table's)")
        if meta.get("format", 0) > TABLE_FORMAT:
            raise UserError(f"{path}: PMI table format {meta['format']} is newer than this onmt_doc reads")
        problem = table_problem(arrays)
        if problem:
            raise UserError(f"{path}: not a PMI table of onmt_doc_build_pmi_table ({problem})")
        table = cls(
            **arrays, n_pairs=int(meta.get("n_pairs", 0)), vocab=str(meta.get("vocab", "")), normaliser=normaliser
        )
        if codec is not None:
            table.check_vocab(codec, path)
        return table


def table_problem(arrays: dict[str, np.ndarray]) -> Optional[str]:
    """Why ``arrays`` cannot be a table's (None when they can): the zip's CRC-32s say the bytes are
    the ones saved, this says they index what they claim: integer counts, never negative, keys
    sorted and unique (the lookup is a binary search) inside ``V_tgt × V_src`` / ``V_tgt × V_tgt``."""
    for name, a in arrays.items():
        if a.ndim != 1 or a.dtype.kind not in "iu":
            return f"{name} is not a list of integers"
        if len(a) and a.min() < 0:
            return f"{name} holds a negative value"
    src_size, tgt_size = len(arrays["src_counts"]), len(arrays["tgt_counts"])
    for scenario, size in (("bi", tgt_size * src_size), ("mono", tgt_size * tgt_size)):
        keys, counts = arrays[f"{scenario}_keys"], arrays[f"{scenario}_counts"]
        if len(keys) != len(counts):
            return f"{len(keys)} {scenario}_keys for {len(counts)} {scenario}_counts"
        if len(keys) and (keys.max() >= size or (len(keys) > 1 and np.diff(keys).min() <= 0)):
            return f"{scenario}_keys out of order or outside the vocabularies' {size} pairs"
    return None


def count_table(
    pairs: Iterable[Pair],
    src_size: int,
    tgt_size: int,
    vocab: str = "",
    chunk: int = 512,
    normaliser: Normaliser = "shared",
) -> PMITable:
    """Count a stream of (source ids, target ids) sentence pairs into a table."""
    if chunk * tgt_size**2 >= 2**62:
        chunk = max(1, (2**62 - 1) // tgt_size**2)
    src_counts = np.zeros(src_size, np.int64)
    tgt_counts = np.zeros(tgt_size, np.int64)
    bi, mono, n = PairCounts(), PairCounts(), 0
    for part in _chunks(pairs, chunk):
        src, tgt = [p[0] for p in part], [p[1] for p in part]
        src_counts += np.bincount(_flatten(src)[0], minlength=src_size)
        tgt_counts += np.bincount(_flatten(tgt)[0], minlength=tgt_size)
        bi.add(bilingual_pairs(src, tgt, src_size, tgt_size))
        mono.add(monolingual_pairs(tgt, tgt_size))
        n += len(part)
    bi_keys, bi_counts = bi.result()
    mono_keys, mono_counts = mono.result()
    return PMITable(src_counts, tgt_counts, bi_keys, bi_counts, mono_keys, mono_counts, n, vocab, normaliser)


def tokenized_pairs(
    src: str, tgt: str, codec: Codec, documents: bool, max_chars: int, chunk: int = 8192
) -> Iterator[Pair]:
    """Stream the sentence pairs of a parallel corpus as subword ids (document breaks dropped)."""
    lines = (p for doc in iter_parallel(src, tgt, documents, max_chars) if doc for p in doc)
    for part in _chunks(lines, chunk):
        yield from zip(codec.encode([s for s, _ in part], "src"), codec.encode([t for _, t in part], "tgt"))


def build_table(
    src: str, tgt: str, codec: Codec, documents: bool = True, max_chars: int = 0, normaliser: Normaliser = "shared"
) -> PMITable:
    """The PMI table of a parallel corpus, tokenized with ``codec`` (streamed)."""
    return count_table(
        tokenized_pairs(src, tgt, codec, documents, max_chars),
        len(codec.src_vocab),
        len(codec.tgt_vocab),
        vocab_digest(codec),
        normaliser=normaliser,
    )


# ----------------------------------------------------------------------------- z*


def z_star(
    table: PMITable,
    src: Sequence[np.ndarray],
    tgt: Sequence[np.ndarray],
    queries: Optional[Sequence[np.ndarray]] = None,
    chunk: int = 2048,
) -> list[np.ndarray]:
    """eq. 7 at every target position of each sentence pair (int8 arrays shaped like ``tgt``).

    ``queries`` puts another token at position i while keeping x and the prefix y_<i: the
    context-selection error (sec. 3.3) compares z*(y_i) with z*(ŷ_i).
    """
    out: list[np.ndarray] = []
    for a in range(0, len(tgt), chunk):
        b = a + chunk
        out += _z_star_chunk(table, src[a:b], tgt[a:b], None if queries is None else queries[a:b])
    return out


def _z_star_chunk(
    table: PMITable, src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], queries: Optional[Sequence[np.ndarray]]
) -> list[np.ndarray]:
    t_flat, t_len, _ = _flatten(tgt)
    q_flat = t_flat if queries is None else _flatten(queries)[0]
    if len(q_flat) != len(t_flat):
        raise ValueError("queries must have one token per target position")
    s_flat, s_len, _ = _flatten(src)
    z = _z_star_flat(table, s_flat, s_len, t_flat, t_len, q_flat)
    return np.split(z, np.cumsum(t_len)[:-1]) if len(tgt) else []


def _z_star_flat(
    table: PMITable,
    s_flat: np.ndarray,
    s_len: np.ndarray,
    t_flat: np.ndarray,
    t_len: np.ndarray,
    q_flat: Optional[np.ndarray] = None,
) -> np.ndarray:
    """eq. 7 at every position of sentence pairs given as flat int64 ids and lengths per side
    (``q_flat``: the tokens put at the positions, default the targets themselves): flat int8."""
    q_flat = t_flat if q_flat is None else q_flat
    s_start, t_start = np.cumsum(s_len) - s_len, np.cumsum(t_len) - t_len
    sent = np.repeat(np.arange(len(t_len), dtype=np.int64), t_len)
    # max_j pmi(y_i, x_j): every position with every source token of its sentence
    n_src = s_len[sent]
    x = s_flat[np.repeat(s_start[sent], n_src) + ragged_arange(n_src)]
    source = _group_max(table.bilingual(np.repeat(q_flat, n_src), x), n_src)
    # max_{k<i} pmi(y_i, y_k): every position with the target tokens before it
    n_prev = ragged_arange(t_len)
    prev = t_flat[np.repeat(t_start[sent], n_prev) + ragged_arange(n_prev)]
    target = _group_max(table.monolingual(np.repeat(q_flat, n_prev), prev), n_prev)
    return (source > target).astype(np.int8)  # eq. 7


def z_star_share(table: PMITable, pairs: Iterable[Pair], chunk: int = 2048) -> tuple[int, int]:
    """(tokens with z* = 1, target tokens) over a stream of sentence pairs: what the regulariser
    will push the gates towards (printed by onmt_doc_build_pmi_table)."""
    ones = total = 0
    for part in _chunks(pairs, chunk):
        z = z_star(table, [p[0] for p in part], [p[1] for p in part], chunk=chunk)
        ones += sum(int(a.sum()) for a in z)
        total += sum(len(a) for a in z)
    return ones, total


# ----------------------------------------------------------------------------- training data


def corpus_z_star(table: PMITable, corpus: MappedCorpus, chunk: int = 2048) -> np.ndarray:
    """z* of every target token of ``corpus`` (int8, aligned with its target ids: each sentence is
    its own pair (x, y_<i), even inside a document), computed ``chunk`` sentences at a time.
    A corpus with a cache folder keeps it there, beside the ids, as ``zstar-<table digest>.i8``
    (the digest covers the counts and the normaliser; the file ends with the CRC-32 of its values,
    checked on every open like the ids', docs/reliability.md), read back memory-mapped: a batch
    reads its tokens' z* like their ids, and nothing of it stays in a process's private memory."""
    path = os.path.join(corpus.folder, f"zstar-{table.digest()[:24]}.i8") if corpus.folder else None
    n = len(corpus.tgt)
    if path and os.path.exists(path):
        problem = _z_star_file_problem(path, n)
        if problem is None:
            return _read_mapped(path, n)
        log.warning("%s: %s; computing z* again", path, problem)
    parts = _corpus_chunks(table, corpus, chunk)
    if not path:
        return np.concatenate([np.zeros(0, np.int8), *parts])
    crc = 0
    with output_file(path, flag="", binary=True) as f:
        for z in parts:
            f.write(z.tobytes())
            crc = zlib.crc32(z.tobytes(), crc)
        f.write(struct.pack("<I", crc))
    return _read_mapped(path, n)


def _z_star_file_problem(path: str, n: int) -> Optional[str]:
    """Why the z* cache at ``path`` is not the ``n`` values written with their CRC-32 (None: it is),
    in one sequential read of blocks (never mapped: the check leaves nothing resident)."""
    size = os.path.getsize(path)
    if size != n + 4:
        return f"a damaged z* cache ({size} bytes for {n} tokens and a CRC-32)"
    crc, left = 0, n
    with open(path, "rb") as f:
        while left:
            block = f.read(min(left, 1 << 24))
            if not block:
                return "a damaged z* cache (cut while read)"
            crc, left = zlib.crc32(block, crc), left - len(block)
        (recorded,) = struct.unpack("<I", f.read(4))
    return None if crc == recorded else "a damaged z* cache (CRC-32 mismatch: its bytes changed since written)"


def _corpus_chunks(table: PMITable, corpus: MappedCorpus, chunk: int) -> Iterator[np.ndarray]:
    """z* of ``corpus``'s target ids, ``chunk`` sentences at a time."""
    for i in range(0, corpus.n_sents, chunk):
        j = min(i + chunk, corpus.n_sents)
        s_flat, t_flat = corpus.ids("src", i, j).astype(np.int64), corpus.ids("tgt", i, j).astype(np.int64)
        s_len, t_len = np.diff(corpus.src_offsets[i : j + 1]), np.diff(corpus.tgt_offsets[i : j + 1])
        yield _z_star_flat(table, s_flat, s_len, t_flat, t_len)


def _read_mapped(path: str, n: int) -> np.ndarray:
    """The first ``n`` int8 values of a cached file, memory-mapped read-only (the CRC-32 after them
    is not part of the array)."""
    return np.memmap(path, dtype=np.int8, mode="r", shape=(n,)) if n else np.zeros(0, np.int8)


def z_star_fields(table: PMITable, corpus: MappedCorpus) -> dict[str, np.ndarray]:
    """The z* field's arrays for ``corpus`` (one value per target id): ``z_star`` and
    ``z_star_mask``, 1 on every token (the instances give the markup 0: no supervision)."""
    z = corpus_z_star(table, corpus)
    return {"z_star": z, "z_star_mask": np.broadcast_to(np.int8(1), z.shape)}


def _ones_in(z: np.ndarray) -> int:
    """How many values of a z* array are 1, read from its file (if mapped) in blocks: a pass over a
    mapped array would leave it all in the resident set."""
    if not isinstance(z, np.memmap):
        return int(z.sum(dtype=np.int64))
    ones = 0
    with open(z.filename, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            ones += int(np.frombuffer(block, np.int8).sum(dtype=np.int64))
    return ones


class ZStarSection(Protocol):
    """The keys the z* field reads from the section that asks for it (the ``pmi_gate_hinge``
    loss): the data layer knows these keys, not the loss."""

    type: str
    table: str
    normaliser: Normaliser


@register_field(Z_STAR)
class ZStarField:
    """The z* field: eq. 7's labels of every target token of a corpus (:func:`corpus_z_star`),
    cached in its cache folder beside its ids, named by the table's counts and normaliser. Reads
    the asking section's keys ``table`` (a PMI table of this run's vocabularies) and
    ``normaliser``; the table is loaded when the field is built, so a missing or foreign table
    fails before any data is read."""

    keys = ("z_star", "z_star_mask")

    def __init__(self, section: ZStarSection, ctx: FieldContext):
        if not section.table:
            raise ConfigError(
                f"loss {section.type}: key 'table' is required (a PMI table built with onmt_doc_build_pmi_table)"
            )
        self.who = section.type
        self.table = PMITable.load(section.table, ctx.codec, section.normaliser)

    def values(self, corpus: MappedCorpus) -> dict[str, np.ndarray]:
        """z* of ``corpus`` (``FieldProvider`` contract), and a log line with the share of its
        target tokens labelled source."""
        fields = z_star_fields(self.table, corpus)
        tokens = len(fields["z_star"])
        log.info(
            "%s: z* of %d target tokens, %.1f%% on the source side (z* = 1, %s normaliser)",
            self.who,
            tokens,
            100.0 * _ones_in(fields["z_star"]) / max(tokens, 1),
            self.table.normaliser,
        )
        return fields
