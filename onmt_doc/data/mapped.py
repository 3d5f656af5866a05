"""Memory-mapped binarized corpora and the instances of a unit as index arrays over them.

A binarized corpus is a folder of flat arrays (fairseq's "mmap indexed dataset" idea: one token
array plus offsets; Ott et al., 2019, ``fairseq/data/indexed_dataset.py``):

* ``src.ids`` / ``tgt.ids``: every sentence's subword ids, one after the other (int32, no markup);
* ``src.offsets`` / ``tgt.offsets``: int64, sentence i is ``ids[offsets[i]:offsets[i + 1]]``;
* ``doc.offsets``: int64, document d holds sentences ``doc_offsets[d]:doc_offsets[d + 1]``;
* ``meta.json``: the format name, the array lengths and each file's CRC-32, written last (a folder
  without it, or whose files disagree with it, is not a cache: :func:`open_mapped` checks sizes,
  checksums, offsets and id ranges, and the caller binarizes such a corpus again).

Files are raw little-endian arrays. A training process reads the offsets into memory (the index,
16 bytes per sentence pair) and holds besides only what it computes from them (instance boundaries
and lengths, a few int64 per instance); the ids stay on disk and in the page cache, shared by every
process of a machine: a batch's sentences are read with ``pread`` when it is collated, and the one
pass over every id (the fingerprint digest) reads a read-only ``mmap`` and hands the pages back as
it goes (:meth:`MappedCorpus.drop_pages`), so neither leaves the corpus in the resident set.

:class:`MappedExamples` is the list of a unit's instances (:class:`Example` objects) as index
arrays: the unit states which sentences ``[a, b)`` each instance holds (``Unit.bounds``, computed
from the offsets alone) and which of them are its target (``Unit.target_span``); an Example is made
only when asked for (:meth:`MappedExamples.__getitem__`), and a batch is read in one gather per side
(:meth:`MappedExamples.batch_rows`). Per-example fields (z*: ``data/example_fields.py``) are arrays
aligned with the target ids, read per batch the same way.

The same classes serve a corpus held in memory (:meth:`MappedCorpus.from_documents`: a small
corpus, a request, a document being translated, ``-stream``): :func:`build_instances` gives its
Examples, so training and translation share one implementation of the instance rules.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import zlib
from dataclasses import dataclass, field
from itertools import chain
from typing import IO, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from onmt_doc.data.instances import MARKUP, Example, SentenceLengths, UnitOptions, mark_concat, unit_class
from onmt_doc.data.lengths import Lengths
from onmt_doc.data.vocab import EOS_SENT_ID, SOS_ID

FORMAT = "onmt_doc mapped corpus 2"  # 2: meta.json holds each file's CRC-32
ID_DTYPE, OFFSET_DTYPE = np.dtype("<i4"), np.dtype("<i8")
FILES = {
    "src": ("src.ids", ID_DTYPE),
    "tgt": ("tgt.ids", ID_DTYPE),
    "src_offsets": ("src.offsets", OFFSET_DTYPE),
    "tgt_offsets": ("tgt.offsets", OFFSET_DTYPE),
    "doc_offsets": ("doc.offsets", OFFSET_DTYPE),
}


@dataclass
class MappedCorpus:
    """A binarized parallel corpus: flat id arrays and offsets. Opened from disk (:func:`open_mapped`),
    the offsets are read into memory (the index: 16 bytes per sentence pair, 8 per document) and
    the ids are mapped; the ids of the sentences a batch needs are read with ``pread``
    (:meth:`sentence`, :meth:`ids`), which leaves no pages in the resident set, where touching
    the mapping would map the neighbouring pages too (the kernel's fault-around)."""

    src: np.ndarray
    tgt: np.ndarray
    src_offsets: np.ndarray
    tgt_offsets: np.ndarray
    doc_offsets: np.ndarray
    maps: list = field(default_factory=list, repr=False)  # the mmap objects behind src and tgt
    files: dict = field(default_factory=dict, repr=False)  # side -> the ids file, open for pread
    folder: Optional[str] = None  # the cache folder (None: held in memory); fields are cached in it
    has_tgt: bool = True  # False: sentences without targets (translation; tgt empty, its offsets 0)

    @classmethod
    def from_documents(cls, docs: Sequence[Sequence[tuple]]) -> "MappedCorpus":
        """Tokenized documents of (src_ids, tgt_ids) pairs held in memory as the same arrays (a
        small corpus, a request, a document being translated); every target None (translation)
        makes a corpus without targets. Ids may be arrays or lists."""
        pairs = [p for d in docs for p in d]
        targets = {t is not None for _, t in pairs}
        if len(targets) > 1:
            raise ValueError("every sentence pair has a target, or none has")
        has_tgt = targets != {False}
        src, src_lens = flatten([np.asarray(s) for s, _ in pairs])
        tgt, tgt_lens = flatten([np.asarray(t) for _, t in pairs]) if has_tgt else flatten([])
        if not has_tgt:
            tgt_lens = np.zeros(len(pairs), np.int64)

        def offsets(lens: np.ndarray) -> np.ndarray:
            return np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype(OFFSET_DTYPE)

        sizes = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        return cls(src, tgt, offsets(src_lens), offsets(tgt_lens), offsets(sizes), has_tgt=has_tgt)

    def sentence_lengths(self) -> SentenceLengths:
        """What a unit's instances depend on (``Unit.bounds``): lengths and document bounds."""
        return SentenceLengths(self.lengths("src"), self.lengths("tgt") if self.has_tgt else None, self.doc_offsets)

    def advise(self, name: str) -> None:
        """``madvise`` every mapping with ``mmap.MADV_<name>`` (no-op where the OS lacks it)."""
        advice = getattr(mmap, f"MADV_{name}", None)
        for m in self.maps if advice is not None else ():
            m.madvise(advice)

    def drop_pages(self) -> None:
        """Take the mapped pages out of this process' resident set (``MADV_DONTNEED``: clean file
        pages, read again from the page cache or the disk when next used)."""
        self.advise("DONTNEED")

    @property
    def n_sents(self) -> int:
        """Sentence pairs."""
        return len(self.src_offsets) - 1

    @property
    def n_docs(self) -> int:
        """Documents (none empty)."""
        return len(self.doc_offsets) - 1

    def __len__(self) -> int:
        """Documents: the corpus reads as the list of its documents (:meth:`__iter__`)."""
        return self.n_docs

    def __iter__(self) -> Iterator[list[tuple[np.ndarray, Optional[np.ndarray]]]]:
        """Each document as (src_ids, tgt_ids) pairs of views (tgt_ids None without targets), made
        one at a time."""
        off = self.doc_offsets.tolist()
        for a, b in zip(off[:-1], off[1:]):
            yield [(self.sentence(i, "src"), self.sentence(i, "tgt") if self.has_tgt else None) for i in range(a, b)]

    def lengths(self, side: str) -> np.ndarray:
        """Subword ids per sentence of one side (int64, without markup)."""
        off = self.src_offsets if side == "src" else self.tgt_offsets
        return np.diff(off)

    def sentence(self, i: int, side: str) -> np.ndarray:
        """The ids of sentence ``i`` of one side (int32)."""
        return self.ids(side, i, i + 1)

    def ids(self, side: str, a: int, b: int) -> np.ndarray:
        """The ids of sentences ``[a, b)`` of one side, one after the other (int32)."""
        flat, off = (self.src, self.src_offsets) if side == "src" else (self.tgt, self.tgt_offsets)
        start, end = int(off[a]), int(off[b])
        f = self.files.get(side)
        if f is None or end == start or not hasattr(os, "pread"):  # in memory, or no pread (Windows)
            return flat[start:end]
        data = os.pread(f.fileno(), (end - start) * ID_DTYPE.itemsize, start * ID_DTYPE.itemsize)
        return np.frombuffer(data, dtype=ID_DTYPE)

    def documents(self) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        """Every document as (src_ids, tgt_ids) pairs of views: what ``Unit.instances`` and field
        providers read (a Python object per sentence: for small corpora and field providers only)."""
        return list(self)


class DamagedCache(Exception):
    """A cache folder that is not what :class:`MappedWriter` wrote (missing, cut, changed, another
    format): the file and why, so that the caller rebuilds it saying which file it was."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


VERIFY_CHUNK = 1 << 22  # bytes read at a time while checking an ids file


def _scan_ids(path: str, dtype: np.dtype) -> tuple[int, int, int]:
    """CRC-32, smallest and largest id of an ids file, in one sequential read of fixed-size chunks
    (never mapped, so the check leaves nothing in the resident set)."""
    crc, low, high = 0, np.iinfo(dtype).max, np.iinfo(dtype).min
    buf = bytearray(VERIFY_CHUNK)
    with open(path, "rb", buffering=0) as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while n := f.readinto(buf):
            view = memoryview(buf)[:n]
            crc = zlib.crc32(view, crc)
            ids = np.frombuffer(view, dtype=dtype)
            if len(ids):
                low, high = min(low, int(ids.min())), max(high, int(ids.max()))
    return crc, low, high


def _check_offsets(folder: str, arrays: dict[str, np.ndarray], ids: dict[str, int]) -> None:
    """Offsets that index only inside their ids file, in order, sentences aligned on both sides and
    documents of at least one sentence; a violation names the file (:class:`DamagedCache`)."""
    n_sents = len(arrays["src_offsets"]) - 1
    for key, end in (("src_offsets", ids["src"]), ("tgt_offsets", ids["tgt"]), ("doc_offsets", n_sents)):
        off, name = arrays[key], os.path.join(folder, FILES[key][0])
        if not len(off) or off[0] != 0 or off[-1] != end:
            raise DamagedCache(name, f"offsets do not span the {end} entries they index")
        step = np.diff(off)
        if len(step) and (step.min() < (1 if key == "doc_offsets" else 0)):
            raise DamagedCache(name, "offsets out of order")
    if len(arrays["tgt_offsets"]) != n_sents + 1:
        raise DamagedCache(os.path.join(folder, FILES["tgt_offsets"][0]), "not as many sentences as src.offsets")


def open_mapped(folder: str, vocab_sizes: Optional[tuple[int, int]] = None, verify: bool = True) -> MappedCorpus:
    """The corpus in ``folder``, memory-mapped read-only, after checking it is what was written:
    ``meta.json`` of this format, each file of the size and CRC-32 it records (``verify``: one
    sequential read of the ids, ~0.6 s a GB warm, ~1 s from disk), offsets inside their files and
    in order, and (with ``vocab_sizes``, source and target) every id inside its vocabulary.
    Anything else is a :class:`DamagedCache` naming the file; the caller binarizes it again."""
    meta_path = os.path.join(folder, "meta.json")
    try:
        with open(meta_path, "rb") as f:
            meta = json.loads(f.read(1 << 20))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise DamagedCache(meta_path, f"format {found!r}, not {FORMAT!r} (another onmt_doc version wrote it)")
        lengths, crcs = meta["lengths"], meta["crc32"]
        arrays, sizes = {}, {}
        for key, (name, dtype) in FILES.items():
            path, n = os.path.join(folder, name), int(lengths[key])
            if os.path.getsize(path) != n * dtype.itemsize:
                raise DamagedCache(
                    path, f"{os.path.getsize(path)} bytes, not the {n * dtype.itemsize} meta.json records"
                )
            sizes[key] = n
            if key.endswith("offsets"):
                arrays[key] = np.fromfile(path, dtype=dtype, count=n)
                if zlib.crc32(arrays[key].tobytes()) != int(crcs[key]):
                    raise DamagedCache(path, "CRC-32 mismatch: its bytes changed since it was written")
            elif verify:
                crc, low, high = _scan_ids(path, dtype)
                if crc != int(crcs[key]):
                    raise DamagedCache(path, "CRC-32 mismatch: its bytes changed since it was written")
                size = None if vocab_sizes is None else vocab_sizes[key == "tgt"]
                if n and (low < 0 or (size is not None and high >= size)):
                    bound = f"the vocabulary's 0..{size - 1}" if size is not None else "0 and up"
                    raise DamagedCache(path, f"ids {low}..{high} outside {bound}")
    except DamagedCache:
        raise
    except FileNotFoundError as e:
        raise DamagedCache(e.filename or meta_path, "missing (an interrupted or foreign folder)") from None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise DamagedCache(meta_path, f"unreadable ({type(e).__name__})") from None
    _check_offsets(folder, arrays, {"src": sizes["src"], "tgt": sizes["tgt"]})
    maps, files = [], {}
    for key in ("src", "tgt"):
        name, dtype = FILES[key]
        if not sizes[key]:
            arrays[key] = np.zeros(0, dtype)
            continue
        files[key] = open(os.path.join(folder, name), "rb", buffering=0)
        maps.append(mmap.mmap(files[key].fileno(), 0, access=mmap.ACCESS_READ))
        arrays[key] = np.frombuffer(maps[-1], dtype=dtype, count=sizes[key])
    return MappedCorpus(**arrays, maps=maps, files=files, folder=folder)


class MappedWriter:
    """Appends sentences and documents to the raw files of a cache folder being built, so that
    binarization holds one chunk at a time; :meth:`close` writes ``meta.json`` last, with the
    CRC-32 of every file computed from the bytes as they were written (no second pass)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.files: dict[str, IO[bytes]] = {k: open(os.path.join(folder, n), "wb") for k, (n, _) in FILES.items()}
        self.ends = {"src": 0, "tgt": 0, "doc": 0}
        self.lengths = dict.fromkeys(FILES, 0)
        self.crc32 = dict.fromkeys(FILES, 0)
        for key in ("src_offsets", "tgt_offsets", "doc_offsets"):
            self._write(key, np.zeros(1, OFFSET_DTYPE))

    def _write(self, key: str, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=FILES[key][1]).tobytes()
        self.files[key].write(data)
        self.crc32[key] = zlib.crc32(data, self.crc32[key])
        self.lengths[key] += len(array)

    def add_sentences(self, src: tuple[np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray]) -> None:
        """Append aligned sentences of both sides, each side as (flat ids, length per sentence)."""
        for side, (flat, lens) in (("src", src), ("tgt", tgt)):
            if not len(lens):
                continue
            self._write(side, flat)
            self._write(f"{side}_offsets", self.ends[side] + np.cumsum(lens, dtype=np.int64))
            self.ends[side] += int(np.sum(lens))

    def add_documents(self, sizes: Sequence[int]) -> None:
        """Append documents of ``sizes`` sentences (following the sentences already added)."""
        if sizes:
            self._write("doc_offsets", self.ends["doc"] + np.cumsum(np.asarray(sizes, dtype=np.int64)))
            self.ends["doc"] += int(sum(sizes))

    def close(self) -> None:
        """Flush the arrays, then write ``meta.json`` (its presence marks a complete folder)."""
        for f in self.files.values():
            f.close()
        meta = {"format": FORMAT, "lengths": self.lengths, "crc32": self.crc32}
        with open(os.path.join(self.folder, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, sort_keys=True)

    def abort(self) -> None:
        """Close the files of a failed build (the folder is then removed by its owner)."""
        for f in self.files.values():
            f.close()


def flatten(seqs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Id arrays as (flat int32 ids, int64 length of each): what :class:`MappedWriter` appends."""
    lens = np.fromiter((len(x) for x in seqs), dtype=np.int64, count=len(seqs))
    flat = np.concatenate(seqs).astype(ID_DTYPE) if lens.sum() else np.zeros(0, ID_DTYPE)
    return flat, lens


def write_mapped(folder: str, docs: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]]) -> None:
    """A cache folder for tokenized documents held in memory (tests, small corpora)."""
    w = MappedWriter(folder)
    w.add_sentences(flatten([s for d in docs for s, _ in d]), flatten([t for d in docs for _, t in d]))
    w.add_documents([len(d) for d in docs])
    w.close()


# ----------------------------------------------------------------------------- gathering


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``concat(arange(s, e) for s, e in zip(starts, ends))``, vectorised."""
    if len(starts) == 1:  # one instance (``examples[i]``): the vectorised form's dozen calls cost ~50 µs
        return np.arange(int(starts[0]), int(ends[0]), dtype=np.int64)
    lens = ends - starts
    total = int(lens.sum())
    if not total:
        return np.zeros(0, np.int64)
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
    steps = np.ones(total, np.int64)
    first = np.concatenate([[0], np.cumsum(lens)[:-1]])
    steps[0] = starts[0]
    steps[first[1:]] = starts[1:] - (starts[:-1] + lens[:-1] - 1)
    return np.cumsum(steps)


def gather(
    flat: np.ndarray,
    offsets: np.ndarray,
    sents: np.ndarray,
    markup: bool,
    ends: tuple[int, int] = (SOS_ID, EOS_SENT_ID),
    dtype: np.dtype = np.dtype(np.int64),
) -> np.ndarray:
    """The values of sentences ``sents`` one after the other, each between ``ends`` when
    ``markup``: for ids, the concatenation of the sentences' ``mark_sentence`` arrays in one
    gather; a per-token field gets ``ends`` (0, 0) and keeps its own ``dtype``."""
    starts, stops = offsets[sents], offsets[sents + 1]
    values = flat[_ranges(starts, stops)].astype(dtype)
    return mark_concat(values, stops - starts, *ends, dtype=dtype) if markup else values


# ----------------------------------------------------------------------------- instances


@dataclass
class Rows:
    """A batch's rows as flat id streams: what ``batching.collate_rows`` pads into a Batch."""

    src: np.ndarray  # int64 ids of every row's source, row after row (markup included)
    src_lens: np.ndarray  # [R] ids of each row's source
    tgt: Optional[np.ndarray]  # the same for the targets (None when translating)
    tgt_lens: Optional[np.ndarray]
    owner: np.ndarray  # [R] the instance (position in the batch's index list) each row comes from
    first: np.ndarray  # [R] each row's first sentence in its document
    extra: dict = field(default_factory=dict)  # name -> (flat values, [R] lengths): per-target-token fields


class IndexedExamples(Sequence[Example]):
    """Examples made on demand, whose batching lengths and fingerprint digest are computed without
    making them (``batching.example_lengths`` and ``run_folder.examples_digest`` ask these)."""

    has_rows: bool  # context windows whose sentences are batch rows (``sent_lens`` set)

    def __iter__(self) -> Iterator[Example]:
        return (self[i] for i in range(len(self)))

    def lengths(self) -> Lengths:
        """``batching.example_lengths(list(self))``, from the offsets alone."""
        raise NotImplementedError

    def digest_chunks(self) -> list[Iterator[bytes]]:
        """The bytes ``run_folder.examples_digest`` hashes, as its four consecutive sections
        (shapes, source ids, target ids, context row lengths), each streamed in chunks."""
        raise NotImplementedError

    def digest(self) -> str:
        """``run_folder.examples_digest(list(self))`` in memory bounded by a chunk of instances."""
        h = hashlib.sha256()
        for section in self.digest_chunks():
            for data in section:
                h.update(data)
        return h.hexdigest()


# corpora up to this many ids (both sides) keep the Examples they made: a few tens of MB at most,
# and a small corpus is read for many epochs, where making them again each batch costs ~20% of a
# small model's training step on the CPU; a larger corpus makes each when its batch is collated
MEMO_IDS = 2_000_000
ITER_CHUNK = 4096  # Examples made at once when iterating over all of them


def _split(flat: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
    """``flat`` cut into consecutive pieces of ``lens`` (views)."""
    return [flat] if len(lens) == 1 else np.split(flat, np.cumsum(lens)[:-1]) if len(lens) else []


class MappedExamples(IndexedExamples):
    """A unit's instances of a :class:`MappedCorpus` as two index arrays (8 bytes each per
    instance): the unit ``unit`` (by name, through the unit registry: a plugin unit as a built-in
    one) states them (``Unit.bounds``) and what each holds (``Unit.target_span``,
    ``Unit.rows_are_sentences``, ``Unit.marked``). ``examples[i]`` is made from the corpus's ids
    when asked for (and kept, for a corpus of at most :data:`MEMO_IDS` ids). ``fields``: per key,
    one value per target id of the corpus (``example_fields.field_values``), given to each
    instance's target like its ids, with 0 at the markup."""

    def __init__(
        self, corpus: MappedCorpus, unit: str, options: UnitOptions, fields: Optional[Mapping[str, np.ndarray]] = None
    ) -> None:
        self.corpus = corpus
        self.unit = unit_class(unit, "unit")(options)
        self.a, self.b, self.dropped = self.unit.bounds(corpus.sentence_lengths())
        self.markup = self.unit.marked()
        self.rows = self.unit.rows_are_sentences()  # every sentence of an instance is a batch row
        self.has_rows = self.rows and len(self.a) > 0
        self.fields = dict(fields or {})
        for key, values in self.fields.items():
            if len(values) != len(corpus.tgt):
                raise ValueError(f"field '{key}' has {len(values)} values for {len(corpus.tgt)} target ids")
        self._memo: Optional[dict[int, Example]] = {} if len(corpus.src) + len(corpus.tgt) <= MEMO_IDS else None

    def __len__(self) -> int:
        return len(self.a)

    def _doc_start(self, sents: np.ndarray) -> np.ndarray:
        """The first sentence of the document of each of ``sents``."""
        off = self.corpus.doc_offsets
        return off[np.searchsorted(off, sents, side="right") - 1]

    def __getitem__(self, i: Union[int, slice]) -> Union[Example, list[Example]]:  # type: ignore[override]
        if isinstance(i, slice):
            return self.make(np.arange(*i.indices(len(self))))
        i = int(i) if i >= 0 else len(self) + int(i)
        if self._memo is None:
            return self.make([i])[0]
        if i not in self._memo:
            self._memo[i] = self.make([i])[0]
        return self._memo[i]

    def __iter__(self) -> Iterator[Example]:
        """Every Example in order, made a chunk at a time (``list(examples)``: translation's)."""
        for start in range(0, len(self), ITER_CHUNK):
            yield from self.make(np.arange(start, min(start + ITER_CHUNK, len(self))))

    def make(self, idx: Sequence[int]) -> list[Example]:
        """The Examples at ``idx``, read from the corpus's ids in one gather per side (an Example
        at a time cost ~0.1 ms of numpy calls: a tenth of a second per thousand sentences translated)."""
        c, idx = self.corpus, np.asarray(idx, dtype=np.int64)
        a, b = self.a[idx], self.b[idx]
        ta, tb = self.unit.target_span(a, b)
        docs = np.searchsorted(c.doc_offsets, a, side="right") - 1
        srcs = _split(gather(c.src, c.src_offsets, _ranges(a, b), self.markup), self._marked_sums("src", a, b))
        tgts: list = [None] * len(idx)
        extras: dict[str, list[np.ndarray]] = {}
        if c.has_tgt:
            tgt_sents, tgt_lens = _ranges(ta, tb), self._marked_sums("tgt", ta, tb)
            tgts = _split(gather(c.tgt, c.tgt_offsets, tgt_sents, self.markup), tgt_lens)
            for key, values in self.fields.items():
                field_values = gather(values, c.tgt_offsets, tgt_sents, self.markup, (0, 0), values.dtype)
                extras[key] = _split(field_values, tgt_lens)
        first, n_sents = (ta - c.doc_offsets[docs]).tolist(), (tb - ta).tolist()
        out = [Example(*e) for e in zip(srcs, tgts, docs.tolist(), first, n_sents)]
        for key, parts in extras.items():
            for ex, part in zip(out, parts):
                ex.extra[key] = part
        if self.rows:  # each sentence's marked (source, target) length; 0 without a target
            sents = _ranges(a, b)
            ls = c.lengths("src")[sents] + self._markup_ids()
            lt = c.lengths("tgt")[sents] + self._markup_ids() if c.has_tgt else np.zeros(len(sents), np.int64)
            for ex, part in zip(out, _split(np.stack([ls, lt], axis=1), b - a)):
                ex.sent_lens = part
        return out

    def batch_rows(self, idx: np.ndarray) -> "Rows":
        """The batch rows of instances ``idx`` as ``collate`` makes them from ``[self[i] for i in
        idx]``, read in one gather per side instead of one Example at a time (a batch of short
        sentences is ~600 of them: making each in Python cost more than a GPU step)."""
        c, idx = self.corpus, np.asarray(idx, dtype=np.int64)
        a, b = self.a[idx], self.b[idx]
        if self.rows:  # every sentence of an instance is a row of its own
            src_sents = tgt_sents = _ranges(a, b)
            owner = np.repeat(np.arange(len(idx), dtype=np.int64), b - a)
            src_lens = c.lengths("src")[src_sents] + self._markup_ids()
            tgt_lens = c.lengths("tgt")[tgt_sents] + self._markup_ids()
            first = src_sents - self._doc_start(src_sents)
        else:
            ta, tb = self.unit.target_span(a, b)
            src_sents, tgt_sents = _ranges(a, b), _ranges(ta, tb)
            owner = np.arange(len(idx), dtype=np.int64)
            src_lens, tgt_lens = self._marked_sums("src", a, b), self._marked_sums("tgt", ta, tb)
            first = ta - self._doc_start(ta)
        src = gather(c.src, c.src_offsets, src_sents, self.markup)
        if not c.has_tgt:
            return Rows(src, src_lens, None, None, owner, first)
        tgt = gather(c.tgt, c.tgt_offsets, tgt_sents, self.markup)
        extra = {
            key: (gather(values, c.tgt_offsets, tgt_sents, self.markup, (0, 0), values.dtype), tgt_lens)
            for key, values in self.fields.items()
        }
        return Rows(src, src_lens, tgt, tgt_lens, owner, first, extra)

    def _markup_ids(self) -> int:
        """Ids an instance's sentence holds besides its own: ``<s>`` and ``</s>``, when marked."""
        return MARKUP if self.markup else 0

    def _tgt_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self.unit.target_span(self.a, self.b)

    def _marked_sums(self, side: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Marked ids of sentences [a, b) of one side, per instance (cumulative sums kept: every batch asks)."""
        cache = self.__dict__.setdefault("_cumsums", {})
        if side not in cache:
            cache[side] = np.concatenate([[0], np.cumsum(self.corpus.lengths(side) + self._markup_ids())])
        cs = cache[side]
        return cs[b] - cs[a]

    def lengths(self) -> Lengths:
        """See :meth:`IndexedExamples.lengths`."""
        ta, tb = self._tgt_bounds()
        c, n = self.corpus, len(self)
        if not self.rows:
            src = self._marked_sums("src", self.a, self.b)
            tgt = self._marked_sums("tgt", ta, tb) + 1 if c.has_tgt else np.zeros(n, np.int64)
            return Lengths(src, tgt, np.ones(n, np.int64))
        ls, lt = c.lengths("src") + self._markup_ids(), c.lengths("tgt") + self._markup_ids()
        row_tgt = lt + 1 if c.has_tgt else np.zeros_like(lt)  # a row's target gets <bos>/<eos>
        bounds = np.stack([self.a, self.b], axis=1).ravel()  # a0 b0 a1 b1 …; max over [a_i, b_i)
        src = np.maximum.reduceat(np.append(ls, 0), bounds)[0::2] if n else np.zeros(0, np.int64)
        tgt = np.maximum.reduceat(np.append(row_tgt, 0), bounds)[0::2] if n else np.zeros(0, np.int64)
        cs_src = np.concatenate([[0], np.cumsum(ls)])
        cs_real = np.concatenate([[0], np.cumsum(np.maximum(ls, row_tgt))])
        return Lengths(src, tgt, self.b - self.a, cs_src[self.b] - cs_src[self.a], cs_real[self.b] - cs_real[self.a])

    def digest_chunks(self, chunk: int = 8192) -> list[Iterator[bytes]]:
        """See :meth:`IndexedExamples.digest_chunks`."""
        ta, tb = self._tgt_bounds()
        n, c = len(self), self.corpus
        spans = [(i, min(i + chunk, n)) for i in range(0, n, chunk)]

        def shapes() -> Iterator[bytes]:
            src_len, tgt_len = self._marked_sums("src", self.a, self.b), self._marked_sums("tgt", ta, tb)
            rows = self.b - self.a if self.rows else np.ones(n, np.int64)
            for i, j in spans:
                yield np.stack([src_len[i:j], tgt_len[i:j], rows[i:j]], axis=1).astype(np.int64).tobytes()

        def ids(flat: np.ndarray, off: np.ndarray, a: np.ndarray, b: np.ndarray) -> Iterator[bytes]:
            c.advise("SEQUENTIAL")
            for k, (i, j) in enumerate(spans):
                yield gather(flat, off, _ranges(a[i:j], b[i:j]), self.markup).tobytes()
                if k % 16 == 15:
                    c.drop_pages()
            c.drop_pages()

        def rows() -> Iterator[bytes]:
            if not self.has_rows:
                return
            ls, lt = c.lengths("src") + self._markup_ids(), c.lengths("tgt") + self._markup_ids()
            for i, j in spans:
                sents = _ranges(self.a[i:j], self.b[i:j])
                yield np.stack([ls[sents], lt[sents]], axis=1).astype(np.int64).tobytes()

        return [shapes(), ids(c.src, c.src_offsets, self.a, self.b), ids(c.tgt, c.tgt_offsets, ta, tb), rows()]


def build_instances(
    unit: str,
    docs: Sequence[Sequence[tuple]],
    max_tokens: int = 512,
    max_len: int = 0,
    max_sentences: int = 0,
    window_tokens: int = 0,
    context_sentences: int = 1,
    sentence_markup: bool = True,
) -> tuple[list[Example], int]:
    """The Examples of tokenized ``docs`` held in memory (pairs of id arrays or lists, targets None
    when translating) for the unit ``unit`` and the pairs ``max_len`` dropped: the training
    pipeline's code (:class:`MappedExamples`) over arrays built in memory. The options are the
    ``data`` keys of :class:`~onmt_doc.data.instances.UnitOptions` and translation's
    ``window_tokens``."""
    options = UnitOptions(max_tokens, max_len, max_sentences, window_tokens, context_sentences, sentence_markup)
    examples = MappedExamples(MappedCorpus.from_documents(docs), unit, options)
    return list(examples), examples.dropped


class ConcatExamples(IndexedExamples):
    """Several corpora's :class:`IndexedExamples` one after the other (``data.train`` with several
    corpora), as the concatenated lists of examples were."""

    def __init__(self, parts: Sequence[IndexedExamples]) -> None:
        self.parts = list(parts)
        self.offsets = np.concatenate([[0], np.cumsum([len(p) for p in self.parts])]).astype(np.int64)
        self.has_rows = any(p.has_rows for p in self.parts)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: Union[int, slice]) -> Union[Example, list[Example]]:  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i) + len(self) if int(i) < 0 else int(i)
        p = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.parts[p][i - int(self.offsets[p])]

    def lengths(self) -> Lengths:
        """See :meth:`IndexedExamples.lengths`."""
        each = [p.lengths() for p in self.parts]
        fields = ["src", "tgt", "rows"] + (["real_src", "real"] if self.has_rows else [])
        return Lengths(*[np.concatenate([getattr(x, f) for x in each]) for f in fields])

    def digest_chunks(self) -> list[Iterator[bytes]]:
        """See :meth:`IndexedExamples.digest_chunks`."""
        sections = [p.digest_chunks() for p in self.parts]
        return [chain.from_iterable([s[k] for s in sections]) for k in range(4)]
