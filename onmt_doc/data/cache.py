"""Binarized corpora: tokenize a parallel corpus once, reuse the ids on every later run.

The cache key covers the bytes of both files, the subword models, the vocabularies and the
document flag, so a changed file or tokenizer can never be served stale ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Optional

import numpy as np

from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import read_parallel
from onmt_doc.outputs import output_file

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


def _flatten(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    flat = np.concatenate(seqs).astype(np.int32) if seqs else np.zeros(0, np.int32)
    return flat, offsets


def _split(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def _read_cache(path: str) -> Optional[tuple[list, list, np.ndarray]]:
    """A binarized corpus, or None when the file is damaged (it is then binarized again)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return _split(z["src"], z["src_offsets"]), _split(z["tgt"], z["tgt_offsets"]), z["doc_offsets"]
    except Exception as e:  # a cut or damaged .npz fails anywhere in zipfile/numpy
        log.warning("%s: unreadable binarized cache (%s); binarizing the corpus again", path, type(e).__name__)
        return None


def load_tokenized(
    src: str, tgt: str, codec: Codec, documents: bool, max_chars: int, cache_dir: Optional[str]
) -> tuple[TokenizedDocs, bool]:
    """Documents of (src_ids, tgt_ids) sentence pairs; True as second value when read from cache."""
    path = None
    if cache_dir:
        path = os.path.join(cache_dir, cache_key(src, tgt, codec, documents) + ".npz")
        cached = _read_cache(path) if os.path.exists(path) else None
        if cached is not None:
            src_ids, tgt_ids, doc_offsets = cached
            docs = [list(zip(src_ids[a:b], tgt_ids[a:b])) for a, b in zip(doc_offsets[:-1], doc_offsets[1:])]
            return docs, True
    text_docs = read_parallel(src, tgt, documents, max_chars)
    src_ids = codec.encode([s for doc in text_docs for s, _ in doc], "src")
    tgt_ids = codec.encode([t for doc in text_docs for _, t in doc], "tgt")
    doc_offsets = np.zeros(len(text_docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in text_docs], out=doc_offsets[1:])
    docs = [list(zip(src_ids[a:b], tgt_ids[a:b])) for a, b in zip(doc_offsets[:-1], doc_offsets[1:])]
    if path:
        s_flat, s_off = _flatten(src_ids)
        t_flat, t_off = _flatten(tgt_ids)
        with output_file(path, flag="", binary=True, make_folder=True) as f:
            np.savez(f, src=s_flat, src_offsets=s_off, tgt=t_flat, tgt_offsets=t_off, doc_offsets=doc_offsets)
    return docs, False
