"""Binarized corpora: tokenize a parallel corpus once, reuse the ids on every later run.

The cache key covers the bytes of both files, the subword models, the vocabularies and the
document flag, so a changed file or tokenizer can never be served stale ids. The cache is a
folder of memory-mapped flat arrays (``onmt_doc/data/mapped.py``) named by the key, written by a
streaming pass that tokenizes chunks of lines on ``data.workers`` processes (:func:`binarize`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from typing import Iterator, Optional

import numpy as np

from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import iter_aligned, read_parallel
from onmt_doc.data.mapped import DamagedCache, MappedCorpus, MappedWriter, flatten, open_mapped
from onmt_doc.data.progress import Progress
from onmt_doc.data.workers import default_workers, ordered_map
from onmt_doc.errors import UserError
from onmt_doc.outputs import output_folder

log = logging.getLogger("onmt_doc")

TokenizedDocs = list[list[tuple[np.ndarray, np.ndarray]]]


def _file_digest(path: str, h: "hashlib._Hash") -> None:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def cache_key(src: str, tgt: str, codec: Codec, documents: bool) -> str:
    """A digest of everything the binarized examples depend on (file contents, tokenizer,
    vocabularies, document reading), so a stale cache is never reused."""
    h = hashlib.sha256()
    for path in (src, tgt):
        _file_digest(path, h)
    h.update(
        json.dumps(
            {k: (v if k.endswith("vocab") else {**v, "model": None}) for k, v in codec.to_dict().items()},
            sort_keys=True,
        ).encode()
    )
    for sw in (codec.src_subword, codec.tgt_subword):
        h.update(sw.model or b"")
    h.update(b"documents" if documents else b"lines")
    return h.hexdigest()[:24]


CHUNK_LINES = 10_000  # line pairs tokenized per task: memory holds a few chunks, not the corpus


def count_lines(path: str) -> int:
    """Line ends in a file, counted on raw bytes (for the progress line's ETA)."""
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            n += chunk.count(b"\n")
    return n


Chunk = tuple[list[str], list[str], list[int]]  # source lines, target lines, sizes of documents ended
Encoded = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _chunks(
    src: str, tgt: str, documents: bool, max_chars: int, chunk_lines: int, progress: Progress
) -> Iterator[Chunk]:
    """The corpus' sentence pairs in chunks of ``chunk_lines``, each with the sizes of the documents
    that end in it, streamed (:func:`iter_aligned` checks alignment and names file and line)."""
    src_lines: list[str] = []
    tgt_lines: list[str] = []
    sizes: list[int] = []
    current = 0  # sentences of the document being read
    for s, t in iter_aligned(src, tgt, max_chars):
        progress.advance(1)
        if not s:
            if current:
                sizes.append(current)
                current = 0
            continue
        src_lines.append(s)
        tgt_lines.append(t)
        if documents:
            current += 1
        else:
            sizes.append(1)
        if len(src_lines) >= chunk_lines:
            yield src_lines, tgt_lines, sizes
            src_lines, tgt_lines, sizes = [], [], []
    if current:
        sizes.append(current)
    if src_lines or sizes:
        yield src_lines, tgt_lines, sizes


def _encode(codec: Codec, src_lines: list[str], tgt_lines: list[str], sizes: list[int]) -> tuple[Encoded, list[int]]:
    """A chunk's ids (flat arrays and lengths per side), with the sizes of the documents it ends."""
    return (flatten(codec.encode(src_lines, "src")), flatten(codec.encode(tgt_lines, "tgt"))), sizes


def binarize(
    src: str,
    tgt: str,
    codec: Codec,
    documents: bool,
    max_chars: int,
    folder: str,
    workers: int = 1,
    chunk_lines: int = CHUNK_LINES,
) -> None:
    """Write the mapped cache ``folder`` of a parallel corpus, streamed: read in chunks, tokenized
    and encoded by ``workers`` processes (the same bytes whatever their number), appended to flat
    arrays. Built in a temporary folder renamed into place when complete, so an interrupted
    preparation never leaves a half cache."""
    progress = Progress(f"binarizing {src}", count_lines(src))
    with output_folder(folder, flag="data.cache_dir", force=True) as staging:
        writer = MappedWriter(staging)
        try:
            chunks = _chunks(src, tgt, documents, max_chars, chunk_lines, progress)
            encoded = ordered_map(_encode, codec, Codec.from_dict, codec.to_dict(), chunks, workers)
            for (src_ids, tgt_ids), sizes in encoded:
                writer.add_sentences(src_ids, tgt_ids)
                writer.add_documents(sizes)
        except BaseException:
            writer.abort()
            raise
        writer.close()
    progress.done()


def remove_stale_staging(folder: str) -> None:
    """Remove the staging folders (``.<key>.tmp<pid>``, ``outputs.output_folder``) that binarizations
    of ``folder`` killed before they finished left behind: those whose process is gone."""
    parent, name = os.path.split(folder)
    pattern = re.compile(rf"^\.{re.escape(name)}\.tmp(\d+)$")
    for entry in os.scandir(parent) if os.path.isdir(parent) else ():
        m = pattern.match(entry.name)
        if m and entry.is_dir(follow_symlinks=False) and not _alive(int(m.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_mapped(
    src: str,
    tgt: str,
    codec: Codec,
    documents: bool,
    max_chars: int,
    cache_dir: str,
    workers: int = 1,
) -> tuple[MappedCorpus, bool]:
    """The memory-mapped binarized corpus (``<cache_dir>/<cache_key>/``), binarized first when
    missing, or again, saying which file, when it is not what was written (:func:`open_mapped`:
    sizes, CRC-32s, offsets, ids inside ``codec``'s vocabularies); True as second value when it
    was already there."""
    folder = os.path.join(cache_dir, cache_key(src, tgt, codec, documents))
    sizes = (len(codec.src_vocab), len(codec.tgt_vocab))
    if os.path.isdir(folder):
        try:
            return open_mapped(folder, sizes), True
        except DamagedCache as e:
            log.warning("%s: binarized cache not as written (%s); binarizing the corpus again", e.path, e.reason)
    remove_stale_staging(folder)
    binarize(src, tgt, codec, documents, max_chars, folder, workers or default_workers())
    try:  # written just now from the checksums of the bytes it wrote: only the cheap checks
        return open_mapped(folder, sizes, verify=False), False
    except DamagedCache as e:  # pragma: no cover - another process replaced it in between
        raise UserError(f"{e}: the binarized cache changed right after it was written") from None


def load_tokenized(
    src: str, tgt: str, codec: Codec, documents: bool, max_chars: int, cache_dir: Optional[str], workers: int = 1
) -> tuple[TokenizedDocs, bool]:
    """Documents of (src_ids, tgt_ids) sentence pairs; True as second value when read from cache.
    A Python object per sentence: for small corpora (tests, tools); training maps the cache
    (:func:`load_mapped`)."""
    if cache_dir:
        corpus, cached = load_mapped(src, tgt, codec, documents, max_chars, cache_dir, workers)
        return corpus.documents(), cached
    text_docs = read_parallel(src, tgt, documents, max_chars)
    src_ids = codec.encode([s for doc in text_docs for s, _ in doc], "src")
    tgt_ids = codec.encode([t for doc in text_docs for _, t in doc], "tgt")
    doc_offsets = np.zeros(len(text_docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in text_docs], out=doc_offsets[1:])
    return [list(zip(src_ids[a:b], tgt_ids[a:b])) for a, b in zip(doc_offsets[:-1], doc_offsets[1:])], False
