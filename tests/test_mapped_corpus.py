"""The memory-mapped binarized corpus (onmt_doc/data/mapped.py, data/cache.py; issue 30) and the
one instance builder over it (issue 43).

Every unit's instances are compared with a plain specification written in this file
(:func:`specified_instances`: loops over each document's Python list of sentence pairs, the list
pipeline onmt_doc ran before issue 43), on the mapped cache and on the same documents held in
memory (``build_instances``: translation's path): the same examples, lengths, fingerprint digest
and sampler batches, on the toy corpus and on a few thousand synthetic pairs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config
from model_helpers import toy_codec

from onmt_doc.config import config_from_dict
from onmt_doc.data import mapped as mapped_module
from onmt_doc.data.batching import BatchSampler, CorpusMix, collate, example_lengths, make_batch
from onmt_doc.data.cache import binarize, cache_key, load_mapped, load_tokenized
from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import read_parallel
from onmt_doc.data.instances import Example, UnitOptions, mark_sentence
from onmt_doc.data.mapped import FILES, ConcatExamples, MappedExamples, build_instances, open_mapped
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import Vocab
from onmt_doc.errors import DataError
from onmt_doc.models.checkpoint import load_checkpoint
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.run_builder import build_run
from onmt_doc.train.run_folder import examples_digest
from onmt_doc.train.trainer import train

# (unit, options): every unit, with the keys that change its instances
CASES = [
    ("sentence", {}),
    ("sentence", {"max_len": 9}),
    ("sentence", {"sentence_markup": False}),
    ("document", {"max_tokens": 40}),
    ("context", {}),
    ("context", {"max_sentences": 3, "max_len": 11}),
    ("k_to_1", {"context_sentences": 2, "max_len": 10}),
    ("k_to_k", {"context_sentences": 1}),
    ("k_to_k", {"context_sentences": 3, "max_len": 11}),
]
IDS = [f"{u}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for u, o in CASES]


def synthetic(folder: Path, pairs: int, seed: int = 0, docs: bool = True) -> tuple[str, str]:
    """``pairs`` line pairs of words w0..w39 (1 to 12 a line), blank lines between documents of
    1 to 9 sentences."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    src, tgt = [], []
    left = rng.randint(1, 9)
    for _ in range(pairs):
        src.append(" ".join(f"w{rng.randrange(40)}" for _ in range(rng.randint(1, 12))))
        tgt.append(" ".join(f"w{rng.randrange(40)}" for _ in range(rng.randint(1, 12))))
        left -= 1
        if docs and not left:
            src.append("")
            tgt.append("")
            left = rng.randint(1, 9)
    (folder / "c.src").write_text("\n".join(src) + "\n", encoding="utf-8")
    (folder / "c.tgt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return str(folder / "c.src"), str(folder / "c.tgt")


@pytest.fixture(scope="module")
def toy_codec_bpe(toy_dir) -> Codec:
    """A small BPE codec learned on the toy corpus' first lines."""
    lines = [
        x for ext in ("src", "tgt") for x in (toy_dir / f"train.{ext}").read_text("utf-8").splitlines()[:1500] if x
    ]
    sw = Subword.learn("bpe", "aggressive", 200, lines)
    counts = Counter(t for toks in sw.tokenize_batch(lines) for t in toks)
    vocab = Vocab.build(counts, 1, 0)
    return Codec(sw, sw, vocab, vocab)


@pytest.fixture(scope="module")
def corpora(toy_dir, toy_codec_bpe, tmp_path_factory) -> list[tuple[str, str, Codec]]:
    """(src, tgt, codec): the toy corpus (BPE) and 3000 synthetic pairs (word vocabulary)."""
    folder = tmp_path_factory.mktemp("synthetic")
    src, tgt = synthetic(folder, 3000)
    return [(str(toy_dir / "train.src"), str(toy_dir / "train.tgt"), toy_codec_bpe), (src, tgt, toy_codec())]


def specified_instances(unit: str, docs: list, options: dict) -> tuple[list[Example], int]:
    """The instances of each unit as specified (docs/architecture.md, "The translation unit"),
    written as plain loops over each document's list of (src, tgt) pairs, independently of the
    array rules under test; returns the examples and the pairs (``sentence``, ``context``) or
    windows (``k_to_*``) that ``max_len`` drops."""
    o = {"max_tokens": 512, "max_len": 0, "max_sentences": 0, "context_sentences": 1, **options}
    max_len, mark = o["max_len"], mark_sentence if o.get("sentence_markup", True) else np.asarray

    def long(pairs: list) -> bool:
        return bool(max_len) and any(len(s) > max_len or (t is not None and len(t) > max_len) for s, t in pairs)

    def pack(doc: list, d: int, start: int, end: int, rows: bool = False) -> Example:
        window = doc[start:end]
        tgt = np.concatenate([mark(t) for _, t in window]).astype(np.int64) if window[0][1] is not None else None
        ex = Example(np.concatenate([mark(s) for s, _ in window]).astype(np.int64), tgt, d, start, end - start)
        if rows:
            ex.sent_lens = np.array([(len(s) + 2, 0 if t is None else len(t) + 2) for s, t in window], np.int64)
        return ex

    def windows(doc: list, budget: int) -> list[tuple[int, int]]:  # <bos>/<eos> and markup counted
        out, start, used_src, used_tgt = [], 0, 1, 1
        for i, (s, t) in enumerate(doc):
            ls, lt = len(s) + 2, (len(t) + 2 if t is not None else 0)
            if i > start and (used_src + ls > budget or used_tgt + lt > budget):
                out.append((start, i))
                start, used_src, used_tgt = i, 1, 1
            used_src, used_tgt = used_src + ls, used_tgt + lt
        return out + [(start, len(doc))] if doc else out

    examples, dropped = [], 0
    for d, doc in enumerate(docs):
        if unit == "sentence":
            for i, pair in enumerate(doc):
                dropped += long([pair])
                examples += [] if long([pair]) else [pack(doc, d, i, i + 1)]
        elif unit == "document":
            examples += [pack(doc, d, a, b) for a, b in windows(doc, o["max_tokens"])]
        elif unit == "context":  # windows of max_sentences, whole documents, or token windows (translation)
            size = o["max_sentences"] or max(len(doc), 1)
            spans = [(a, min(a + size, len(doc))) for a in range(0, len(doc), size)]
            if not o["max_sentences"] and o.get("window_tokens"):
                spans = windows(doc, o["window_tokens"])
            for a, b in spans:
                dropped += (b - a) * long(doc[a:b])
                examples += [] if long(doc[a:b]) else [pack(doc, d, a, b, rows=True)]
        else:  # k_to_1 reads the context's sources only; k_to_k every sentence of the window
            for i in range(len(doc)):
                a = max(0, i - o["context_sentences"])
                used = doc[a : i + 1] if unit == "k_to_k" else [(s, None) for s, _ in doc[a:i]] + [doc[i]]
                dropped += long(used)
                if not long(used):
                    examples.append(pack(doc, d, a, i + 1))
                    if unit == "k_to_1":  # the current target alone
                        t = doc[i][1]
                        tgt = None if t is None else mark(t).astype(np.int64)
                        examples[-1].tgt, examples[-1].first, examples[-1].n_sents = tgt, i, 1
    return examples, dropped


def reference(src: str, tgt: str, codec: Codec, unit: str, options: dict) -> tuple[list, int]:
    """Every line read and encoded in memory, then turned into Examples by the specification."""
    docs, _ = load_tokenized(src, tgt, codec, True, 0, None)
    return specified_instances(unit, docs, options)


def same_example(a, b) -> bool:
    return (
        np.array_equal(a.src, b.src)
        and a.src.dtype == b.src.dtype
        and np.array_equal(a.tgt, b.tgt)
        and (a.doc, a.first, a.n_sents) == (b.doc, b.first, b.n_sents)
        and (a.sent_lens is None) == (b.sent_lens is None)
        and (a.sent_lens is None or np.array_equal(a.sent_lens, b.sent_lens))
    )


@pytest.mark.parametrize("unit,options", CASES, ids=IDS)
def test_mapped_instances_equal_the_in_memory_pipeline(corpora, tmp_path, unit, options):
    """Same examples (ids, dtype, document, position, rows), dropped count, lengths, fingerprint
    digest and batches of two epochs on two ranks, for every unit."""
    for src, tgt, codec in corpora:
        ref, ref_dropped = reference(src, tgt, codec, unit, options)
        corpus, _ = load_mapped(src, tgt, codec, True, 0, str(tmp_path))
        mapped = MappedExamples(corpus, unit, UnitOptions(**{"max_tokens": 512, **options}))
        assert len(ref) and (ref_dropped or not options.get("max_len"))  # the case means something
        assert len(mapped) == len(ref) and mapped.dropped == ref_dropped
        assert all(same_example(m, r) for m, r in zip(mapped, ref))
        a, b = example_lengths(ref), mapped.lengths()
        for key in ("src", "tgt", "rows", "real_src", "real"):
            assert (getattr(a, key) is None) == (getattr(b, key) is None), key
            assert getattr(a, key) is None or np.array_equal(getattr(a, key), getattr(b, key)), key
        assert mapped.digest() == examples_digest(ref)
        for rank in (0, 1):
            s_ref = BatchSampler(ref, 300, seed=5, rank=rank, world=2)
            s_map = BatchSampler(mapped, 300, seed=5, rank=rank, world=2)
            for epoch in (0, 1):
                assert [x.tolist() for x in s_ref.epoch_batches(epoch)] == [
                    x.tolist() for x in s_map.epoch_batches(epoch)
                ]
        first = BatchSampler(ref, 300, seed=5).epoch_batches(0)[0]
        batch_ref, batch_map = collate([ref[i] for i in first]), collate([mapped[i] for i in first])
        assert batch_ref.src.equal(batch_map.src) and batch_ref.tgt_out.equal(batch_map.tgt_out)
        # the same documents held in memory (translation's path) give the same instances
        docs, _ = load_tokenized(src, tgt, codec, True, 0, None)
        in_memory, dropped = build_instances(unit, docs, **options)
        assert dropped == ref_dropped and len(in_memory) == len(ref)
        assert all(same_example(m, r) for m, r in zip(in_memory, ref))


@pytest.mark.parametrize(
    "unit,options", [*CASES, ("context", {"window_tokens": 30})], ids=[*IDS, "context-window_tokens=30"]
)
def test_translation_instances_equal_the_specification(unit, options):
    """Documents without targets (translation, a request), some of them empty, with ``context``
    also packed to a token window as translation does (``window_tokens``)."""
    rng = np.random.default_rng(7)
    docs = [[(rng.integers(10, 40, int(rng.integers(1, 14))), None) for _ in range(n)] for n in (5, 0, 1, 9, 3)]
    ref, ref_dropped = specified_instances(unit, docs, options)
    got, dropped = build_instances(unit, docs, **options)
    assert len(ref) and dropped == ref_dropped and len(got) == len(ref)
    assert all(same_example(m, r) for m, r in zip(got, ref))


def same_batch(a, b) -> list[str]:
    """The Batch fields on which ``a`` and ``b`` differ (tensors by value and dtype)."""
    differ = []
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in ("host", "indices"):
            continue
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if x is None or y is None or x.dtype != y.dtype or not torch.equal(x, y):
                differ.append(f.name)
        elif f.name == "extra":
            if x.keys() != y.keys() or any(not torch.equal(x[k], y[k]) for k in x):
                differ.append(f.name)
        elif x != y:
            differ.append(f.name)
    return differ


@pytest.mark.parametrize("unit,options", CASES, ids=IDS)
def test_batches_read_from_the_mapped_corpus_equal_collated_examples(corpora, tmp_path, unit, options):
    """make_batch reads a batch of mapped instances in one gather per side: every field equals
    collate() of the Examples, for batches the sampler gives and for random index sets."""
    rng = np.random.default_rng(3)
    for src, tgt, codec in corpora:
        corpus, _ = load_mapped(src, tgt, codec, True, 0, str(tmp_path))
        mapped = MappedExamples(corpus, unit, UnitOptions(**{"max_tokens": 512, **options}))
        sets = BatchSampler(mapped, 300, seed=5).epoch_batches(0)[:5]
        sets += [rng.choice(len(mapped), size=min(n, len(mapped)), replace=False) for n in (1, 7, 40)]
        for idx in sets:
            fast, slow = make_batch(mapped, idx), collate([mapped[i] for i in idx], idx)
            assert not same_batch(fast, slow), (unit, same_batch(fast, slow))


def test_several_corpora_give_the_same_mixed_batches_and_digest(corpora, tmp_path):
    """Weighted corpora over mapped instances (ConcatExamples) equal the concatenated lists."""
    (s1, t1, c1), _ = corpora
    s2, t2 = synthetic(tmp_path / "b", 400, seed=1, docs=False)
    parts_ref, parts_map = [], []
    for src, tgt in ((s1, t1), (s2, t2)):
        parts_ref.append(reference(src, tgt, c1, "k_to_1", {"context_sentences": 2})[0])
        corpus, _ = load_mapped(src, tgt, c1, True, 0, str(tmp_path))
        parts_map.append(MappedExamples(corpus, "k_to_1", UnitOptions(context_sentences=2)))
    ref, mapped = [e for p in parts_ref for e in p], ConcatExamples(parts_map)
    mix = CorpusMix(["a", "b"], [len(p) for p in parts_ref], [1, 3])
    assert mapped.digest() == examples_digest(ref)
    assert all(same_example(mapped[i], ref[i]) for i in range(0, len(ref), 97))
    a, b = BatchSampler(ref, 250, seed=2, mix=mix), BatchSampler(mapped, 250, seed=2, mix=mix)
    for epoch in (0, 1):
        assert [x.tolist() for x in a.epoch_batches(epoch)] == [x.tolist() for x in b.epoch_batches(epoch)]


def test_workers_give_byte_identical_caches_and_documents_as_read(tmp_path):
    """1 and 2 worker processes (several chunks each) write the same bytes, holding the documents
    read_parallel reads; data.documents false makes every line a document."""
    src, tgt = synthetic(tmp_path / "c", 3000)
    codec = toy_codec()
    for documents in (True, False):
        folders = []
        for workers in (1, 2):
            folder = tmp_path / f"w{workers}-{documents}"
            binarize(src, tgt, codec, documents, 0, str(folder), workers=workers, chunk_lines=700)
            folders.append(folder)
        names = sorted(os.listdir(folders[0]))
        assert names == sorted(os.listdir(folders[1])) and "meta.json" in names
        for name in names:
            assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name
        corpus = open_mapped(str(folders[1]))
        text = read_parallel(src, tgt, documents)
        assert [len(d) for d in corpus.documents()] == [len(d) for d in text]
        flat = [s for d in text for s, _ in d]
        assert [corpus.sentence(i, "src").tolist() for i in (0, 1234, 2999)] == [
            codec.encode([flat[i]], "src")[0].tolist() for i in (0, 1234, 2999)
        ]


def test_workers_end_with_the_pool_and_never_run_the_trainers_signal_handler(tmp_path):
    """Binarizing inside a training process (here a fresh interpreter, as a run is): the forked
    workers inherit its SIGTERM handler (the trainer's only asks for a checkpoint at the next
    step). They must end with the pool, never run that handler (which logged "SIGTERM received" at
    every training start and kept the worker alive, so the pool's exit could hang)."""
    src, tgt = synthetic(tmp_path / "c", 1500)
    script = f"""
import multiprocessing, os, signal, sys
import torch  # noqa: F401  (a training process has it)
sys.path.insert(0, {str(Path(__file__).parent)!r})
from model_helpers import toy_codec
from onmt_doc.data.cache import binarize
from onmt_doc.data.codec import Codec
from onmt_doc.data.workers import _init
signal.signal(signal.SIGTERM, lambda *_: print("handler ran in", os.getpid(), flush=True))
binarize({src!r}, {tgt!r}, toy_codec(), True, 0, {str(tmp_path / "cache")!r}, workers=2, chunk_lines=300)
print("children left:", len(multiprocessing.active_children()), flush=True)
_init(Codec.from_dict, toy_codec().to_dict())  # what each worker runs first: the inherited handler is gone
print("worker SIGTERM default:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["children left: 0", "worker SIGTERM default: True"], r.stdout


def test_a_misaligned_line_deep_inside_is_refused_and_leaves_no_cache(tmp_path):
    """A blank line on one side only at line 2501 (in the fourth chunk, workers busy) names the
    file and line; the cache folder holds nothing afterwards, not even a half-written one."""
    src, tgt = synthetic(tmp_path / "c", 3000, docs=False)
    lines = Path(tgt).read_text(encoding="utf-8").split("\n")
    lines[2500] = ""
    Path(tgt).write_text("\n".join(lines), encoding="utf-8")
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=r"c\.tgt:2501: blank line .*c\.src:2501 has a sentence"):
        binarize(src, tgt, toy_codec(), True, 0, str(cache / "key"), workers=2, chunk_lines=700)
    assert os.listdir(cache) == []


def test_a_changed_file_invalidates_the_cache_and_a_damaged_one_is_rebuilt(tmp_path):
    src, tgt = synthetic(tmp_path / "c", 50)
    codec = toy_codec()
    first, cached = load_mapped(src, tgt, codec, True, 0, str(tmp_path / "cache"))
    again, cached_again = load_mapped(src, tgt, codec, True, 0, str(tmp_path / "cache"))
    assert not cached and cached_again and np.array_equal(first.tgt, again.tgt)
    lines = Path(tgt).read_text(encoding="utf-8").split("\n")
    lines[3] = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13"
    Path(tgt).write_text("\n".join(lines), encoding="utf-8")
    changed, cached_changed = load_mapped(src, tgt, codec, True, 0, str(tmp_path / "cache"))
    assert not cached_changed and len(changed.tgt) != len(first.tgt)
    expected = np.array(changed.tgt)  # a copy: the mapped file is cut below
    del first, again, changed
    folder = tmp_path / "cache" / cache_key(src, tgt, codec, True)
    with open(folder / "tgt.ids", "r+b") as f:  # a cut file: the cache is rebuilt, not misread
        f.truncate(8)
    rebuilt, cached_rebuilt = load_mapped(src, tgt, codec, True, 0, str(tmp_path / "cache"))
    assert not cached_rebuilt and np.array_equal(rebuilt.tgt, expected)


def _reseal(folder: Path, name: str) -> None:
    """Write meta.json's CRC-32 of ``name`` as its bytes are now: damage a checksum cannot see, so
    that what is tested is the bounds check behind it."""
    meta = json.loads((folder / "meta.json").read_text())
    key = next(k for k, (n, _) in FILES.items() if n == name)
    meta["crc32"][key] = zlib.crc32((folder / name).read_bytes())
    (folder / "meta.json").write_text(json.dumps(meta))


def _ids(folder: Path, name: str, dtype: str = "<i4") -> np.ndarray:
    return np.fromfile(folder / name, dtype=dtype)


def _overwrite(f: Path, name: str, data: bytes) -> None:
    (f / name).write_bytes(data)


def _array(f: Path, name: str, array: np.ndarray) -> None:
    """Replace ``name`` by ``array`` and reseal it: the bounds check's job, not the checksum's."""
    array.astype(FILES[next(k for k, (n, _) in FILES.items() if n == name)][1]).tofile(f / name)
    _reseal(f, name)


def _meta(f: Path, **changes) -> None:
    (f / "meta.json").write_text(json.dumps({**json.loads((f / "meta.json").read_text()), **changes}))


DAMAGE = {  # what is done to a complete cache folder, and the file the rebuild must name
    "ids-overwritten-same-size": (lambda f: _overwrite(f, "src.ids", bytes((f / "src.ids").stat().st_size)), "src.ids"),
    "ids-one-byte": (lambda f: _overwrite(f, "tgt.ids", b"\x01" + (f / "tgt.ids").read_bytes()[1:]), "tgt.ids"),
    "ids-outside-vocab": (lambda f: _array(f, "src.ids", _ids(f, "src.ids") + 10_000), "src.ids"),
    "negative-ids": (lambda f: _array(f, "tgt.ids", -_ids(f, "tgt.ids") - 1), "tgt.ids"),
    "offsets-out-of-order": (lambda f: _array(f, "src.offsets", _ids(f, "src.offsets", "<i8")[::-1]), "src.offsets"),
    "offsets-past-the-file": (lambda f: _array(f, "tgt.offsets", _ids(f, "tgt.offsets", "<i8") * 2), "tgt.offsets"),
    "empty-document": (lambda f: _array(f, "doc.offsets", np.r_[0, _ids(f, "doc.offsets", "<i8")]), "doc.offsets"),
    "doc-offsets-missing": (lambda f: (f / "doc.offsets").unlink(), "doc.offsets"),
    "meta-of-format-1": (lambda f: _meta(f, format="onmt_doc mapped corpus 1"), "meta.json"),
    "meta-nested-deep": (lambda f: _overwrite(f, "meta.json", b"[" * 100_000 + b"]" * 100_000), "meta.json"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_cache_not_as_written_is_rebuilt_naming_the_file(tmp_path, damage, warnings_of_onmt_doc):
    """A same-size overwrite of src.ids used to be trained on as it was ("(binarized cache)"), and a
    resume over it blamed the data files. Every file is checked against the CRC-32 meta.json
    records (written as the bytes were), offsets against their files, ids against the vocabulary:
    anything else is rebuilt from the text, with one line naming the file."""
    src, tgt = synthetic(tmp_path / "c", 60)
    codec = toy_codec()
    first, _ = load_mapped(src, tgt, codec, True, 0, str(tmp_path / "cache"))
    expected = [np.array(getattr(first, k)) for k in ("src", "tgt", "src_offsets", "tgt_offsets", "doc_offsets")]
    del first
    folder = tmp_path / "cache" / cache_key(src, tgt, codec, True)
    how, named = DAMAGE[damage]
    how(folder)
    again, cached = load_mapped(src, tgt, codec, True, 0, str(tmp_path / "cache"))
    assert not cached
    for want, key in zip(expected, ("src", "tgt", "src_offsets", "tgt_offsets", "doc_offsets")):
        assert np.array_equal(getattr(again, key), want), key
    said = [r.getMessage() for r in warnings_of_onmt_doc.records]
    assert len(said) == 1 and said[0].startswith(f"{folder / named}: binarized cache not as written ("), said
    open_mapped(str(folder), (len(codec.src_vocab), len(codec.tgt_vocab)))  # the rebuilt folder verifies


def test_ids_outside_the_vocabulary_name_the_range(tmp_path):
    src, tgt = synthetic(tmp_path / "c", 20)
    folder = tmp_path / "m"
    binarize(src, tgt, toy_codec(), True, 0, str(folder))
    with pytest.raises(mapped_module.DamagedCache, match=r"src\.ids: ids \d+\.\.\d+ outside the vocabulary's 0\.\.4"):
        open_mapped(str(folder), (5, 5000))


def test_resume_on_mapped_windows_equals_the_straight_run(toy_dir, tmp_path):
    """A k_to_k run (instances are windows over the mapped corpus) stopped after 4 steps and
    resumed to 8 ends with the weights and data position of the straight 8-step run; its
    training examples are mapped (no list of Example objects) and the fingerprint is the one
    the in-memory examples give."""
    src, tgt = synthetic(tmp_path / "data", 40)

    def cfg(run: str, steps: int):
        c = tiny_config(toy_dir, tmp_path / run, train={"max_steps": steps, "save_every": 4, "batch_tokens": 1500})
        c["data"]["train"] = {"src": src, "tgt": tgt}
        c["data"]["context_sentences"] = 2
        c["model"]["unit"] = "k_to_k"
        c["vocab"]["size"] = 60
        return config_from_dict(c)

    train(cfg("straight", 8))
    train(cfg("resumed", 4))
    train(cfg("resumed", 8))
    a = load_checkpoint(str(tmp_path / "straight" / "checkpoints" / "last.pt"))
    b = load_checkpoint(str(tmp_path / "resumed" / "checkpoints" / "last.pt"))
    assert a["train_state"]["sampler"] == b["train_state"]["sampler"] and a["train_state"]["sampler"]["epoch"] >= 1
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    parts = build_run(cfg("straight", 8), DistContext())
    assert isinstance(parts.train_examples, MappedExamples)
    assert parts.fingerprint["examples"] == examples_digest(list(parts.train_examples))
    assert parts.fingerprint == a["train_state"]["data"]


def test_a_killed_binarization_leaves_nothing_the_next_one_keeps(tmp_path):
    """The staging folder of a binarization whose process died is removed by the next one; the
    staging folder of a live process (another rank binarizing) is left alone."""
    src, tgt = synthetic(tmp_path / "c", 30)
    codec = toy_codec()
    key = cache_key(src, tgt, codec, True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "cache" / f".{key}.tmp{dead.pid}").mkdir(parents=True)
    (tmp_path / "cache" / f".{key}.tmp{dead.pid}" / "src.ids").write_bytes(b"half")
    (tmp_path / "cache" / f".{key}.tmp{os.getppid()}").mkdir()  # a live process's
    load_mapped(src, tgt, codec, True, 0, str(tmp_path / "cache"))
    assert sorted(os.listdir(tmp_path / "cache")) == sorted([key, f".{key}.tmp{os.getppid()}"])
