"""Document files, instances, batches, cache."""

from __future__ import annotations

import numpy as np
import pytest
from model_helpers import toy_codec

from onmt_doc.data.batching import BatchSampler, collate, group_tags
from onmt_doc.data.cache import load_tokenized
from onmt_doc.data.corpus import iter_parallel, read_parallel
from onmt_doc.data.instances import Example, mark_sentence
from onmt_doc.data.mapped import build_instances
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, PAD_ID, SOS_ID
from onmt_doc.errors import DataError


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_documents_are_separated_by_blank_lines(tmp_path):
    src = write(tmp_path / "a.en", ["a1", "a2", "", "b1", "", "", "c1"])
    tgt = write(tmp_path / "a.de", ["A1", "A2", "", "B1", "", "", "C1"])
    docs = read_parallel(src, tgt)
    assert docs == [[("a1", "A1"), ("a2", "A2")], [("b1", "B1")], [("c1", "C1")]]
    # the stream keeps every blank line, so writers can reproduce the layout exactly
    items = list(iter_parallel(src, tgt))
    assert [None if i is None else len(i) for i in items] == [2, None, 1, None, None, 1]
    assert read_parallel(src, tgt, documents=False) == [[("a1", "A1")], [("a2", "A2")], [("b1", "B1")], [("c1", "C1")]]


def test_line_count_mismatch_names_file_and_line(tmp_path):
    src = write(tmp_path / "a.en", ["x", "y", "z"])
    tgt = write(tmp_path / "a.de", ["X", "Y"])
    with pytest.raises(DataError, match=r"a\.de: ends at line 2 but .*a\.en continues"):
        read_parallel(src, tgt)


def test_document_break_mismatch_names_first_diverging_line(tmp_path):
    src = write(tmp_path / "a.en", ["x", "y", "", "z"])
    tgt = write(tmp_path / "a.de", ["X", "", "Y", "Z"])
    with pytest.raises(DataError, match=r"a\.de:2: blank line .*a\.en:2 has a sentence"):
        read_parallel(src, tgt)


def test_invalid_utf8_and_long_lines(tmp_path):
    (tmp_path / "bad.en").write_bytes(b"fine\n\xff\xfe broken\n")
    write(tmp_path / "bad.de", ["ok", "ok"])
    with pytest.raises(DataError, match=r"bad\.en:2: invalid UTF-8"):
        read_parallel(str(tmp_path / "bad.en"), str(tmp_path / "bad.de"))
    src = write(tmp_path / "long.en", ["x" * 50])
    tgt = write(tmp_path / "long.de", ["y"])
    with pytest.raises(DataError, match=r"long\.en:1: line has 50 characters"):
        read_parallel(src, tgt, max_chars=20)
    with pytest.raises(DataError, match="file not found"):
        read_parallel(str(tmp_path / "missing.en"), tgt)


def _docs(lengths):
    rng = np.random.default_rng(0)
    return [[(rng.integers(10, 20, n), rng.integers(10, 20, n + 1)) for n in doc] for doc in lengths]


def test_document_instances_respect_budget_and_documents():
    docs = _docs([[3, 4, 5, 2, 9], [30], [1, 1]])
    inst, _ = build_instances("document", docs, max_tokens=20)
    for ex in inst:
        sents = docs[ex.doc][ex.first : ex.first + ex.n_sents]
        assert len(ex.src) == sum(len(s) + 2 for s, _ in sents)
        assert ex.n_sents == 1 or (len(ex.src) + 1 <= 20 and len(ex.tgt) + 1 <= 20)
    # every sentence of every document appears exactly once, in order, never across documents
    seen = [(ex.doc, ex.first + j) for ex in inst for j in range(ex.n_sents)]
    assert seen == [(d, i) for d, doc in enumerate(docs) for i in range(len(doc))]
    # the 30-word sentence is longer than the budget: an instance of its own, not dropped
    assert any(ex.doc == 1 and len(ex.src) == 32 for ex in inst)


def test_sentence_instances_length_filter_counts_drops():
    docs = _docs([[3, 40, 5], [50]])
    inst, dropped = build_instances("sentence", docs, max_len=30)
    assert dropped == 2 and len(inst) == 2
    inst, dropped = build_instances("sentence", docs)
    assert dropped == 0 and len(inst) == 4


def test_markup_and_group_tags():
    ex = [
        Example(
            np.concatenate([mark_sentence([10, 11]), mark_sentence([12])]),
            np.concatenate([mark_sentence([13]), mark_sentence([14, 15])]),
            0,
            0,
            2,
        ),
        Example(mark_sentence([16]), mark_sentence([17]), 1, 0, 1),
    ]
    b = collate(ex)
    assert b.src[0].tolist() == [SOS_ID, 10, 11, EOS_SENT_ID, SOS_ID, 12, EOS_SENT_ID]
    assert b.src_groups[0].tolist() == [1, 1, 1, 1, 2, 2, 2]
    assert b.src_groups[1].tolist() == [1, 1, 1, 0, 0, 0, 0]
    assert b.tgt_in[0].tolist() == [BOS_ID, SOS_ID, 13, EOS_SENT_ID, SOS_ID, 14, 15, EOS_SENT_ID]
    assert b.tgt_out[0].tolist() == [SOS_ID, 13, EOS_SENT_ID, SOS_ID, 14, 15, EOS_SENT_ID, EOS_ID]
    assert b.tgt_groups[0].tolist() == [0, 1, 1, 1, 2, 2, 2, 2]
    assert b.tgt_out[1].tolist()[3:] == [EOS_ID] + [PAD_ID] * 4
    assert b.n_tgt_tokens == 8 + 4
    assert group_tags(np.array([[BOS_ID, SOS_ID, 9, EOS_SENT_ID, EOS_ID, PAD_ID]])).tolist() == [[0, 1, 1, 1, 0, 0]]


def _examples(n, seed=0):
    rng = np.random.default_rng(seed)
    return [
        Example(
            mark_sentence(rng.integers(10, 20, rng.integers(1, 30))),
            mark_sentence(rng.integers(10, 20, rng.integers(1, 30))),
            i,
            0,
            1,
        )
        for i in range(n)
    ]


def test_every_example_used_once_per_epoch_within_budget():
    examples = _examples(500)
    sampler = BatchSampler(examples, batch_tokens=200, seed=7)
    batches = sampler.epoch_batches(0)
    used = np.concatenate(batches)
    assert sorted(used.tolist()) == list(range(500))
    for b in batches:
        longest = max(max(len(examples[i].src), len(examples[i].tgt) + 1) for i in b)
        assert len(b) == 1 or longest * len(b) <= 200
    # a different epoch gives a different order; the same (seed, epoch) the same order
    assert [b.tolist() for b in sampler.epoch_batches(1)] != [b.tolist() for b in batches]
    assert [b.tolist() for b in BatchSampler(examples, 200, seed=7).epoch_batches(0)] == [b.tolist() for b in batches]


def test_ranks_share_an_epoch_and_resume_position():
    examples = _examples(301)
    full = BatchSampler(examples, 150, seed=3).epoch_batches(0)
    ranks = [BatchSampler(examples, 150, seed=3, rank=r, world=2).epoch_batches(0) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    assert set(np.concatenate(ranks[0] + ranks[1]).tolist()) == set(range(301))
    assert [b.tolist() for b in ranks[0]] == [b.tolist() for b in full[0::2]][: len(ranks[0])]
    a = BatchSampler(examples, 150, seed=3)
    it = iter(a)
    first = [next(it).indices.tolist() for _ in range(5)]
    b = BatchSampler(examples, 150, seed=3)
    b.load_state_dict(a.state_dict())
    assert next(iter(b)).indices.tolist() == next(it).indices.tolist()
    assert first[0] == full[0].tolist()


def test_binarized_cache_is_reused_and_invalidated(tmp_path):
    codec = toy_codec()
    src = write(tmp_path / "c.en", ["w1 w2", "w3", "", "w4 w5 w6"])
    tgt = write(tmp_path / "c.de", ["w2", "w3 w3", "", "w6"])
    cache = str(tmp_path / "cache")
    docs1, cached1 = load_tokenized(src, tgt, codec, True, 0, cache)
    docs2, cached2 = load_tokenized(src, tgt, codec, True, 0, cache)
    assert not cached1 and cached2

    def flat(docs):
        return [[(s.tolist(), t.tolist()) for s, t in d] for d in docs]

    assert flat(docs1) == flat(docs2)
    assert [len(d) for d in docs1] == [2, 1]
    write(tmp_path / "c.de", ["w2", "w3 w3", "", "w5"])  # changed file: new key, new ids
    docs3, cached3 = load_tokenized(src, tgt, codec, True, 0, cache)
    assert not cached3 and flat(docs3) != flat(docs1)


def test_per_token_extra_fields_are_padded_like_the_target():
    ex = [
        Example(mark_sentence([10]), mark_sentence([11, 12]), 0, 0, 1, {"z_star": np.array([1, 0, 1, 1])}),
        Example(mark_sentence([10]), mark_sentence([11]), 1, 0, 1, {"z_star": np.array([0, 1, 1])}),
    ]
    b = collate(ex)
    assert b.extra["z_star"].shape == b.tgt_out.shape
    assert b.extra["z_star"].tolist() == [[1, 0, 1, 1, 0], [0, 1, 1, 0, 0]]
