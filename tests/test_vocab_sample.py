"""The subword model's training sample (issue 30): a bounded, seeded sample spread over all the
training files, not their head; the vocabulary still counts every line."""

from __future__ import annotations

from pathlib import Path

from onmt_doc.config import config_from_dict
from onmt_doc.data.prepare import build_codec, sample_lines


def test_sample_is_uniform_over_the_input_seeded_and_in_order():
    lines = [f"line {i}" for i in range(10_000)]
    got = sample_lines(iter(lines), 200)
    index = [int(x.split()[1]) for x in got]
    assert len(got) == 200 and index == sorted(index) and len(set(index)) == 200
    assert sum(i >= 5000 for i in index) > 60 and sum(i < 5000 for i in index) > 60  # both halves
    assert sample_lines(iter(lines), 200) == got  # seeded: the same files give the same sample
    assert sample_lines(iter(lines[:150]), 200) == lines[:150]  # a small corpus is used whole, in order
    assert sample_lines(iter(lines[:150]), 0) == lines[:150]


def test_subword_model_learns_from_the_whole_file_not_its_head(tmp_path: Path):
    """Words that occur only in the second half of the corpus get merged subwords: a model learned on
    the file's first `sample_lines` lines would spell them letter by letter."""
    head = ["the cat sat on the mat ."] * 3000
    tail = ["quixotic zephyrs vex jumbled wizards ."] * 3000
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    for path in (src, tgt):
        path.write_text("\n".join(head + tail) + "\n", encoding="utf-8")
    cfg = config_from_dict(
        {
            "data": {"train": {"src": str(src), "tgt": str(tgt)}, "documents": False},
            "vocab": {"subword": "bpe", "size": 200, "sample_lines": 1000},
            "log": {"dir": str(tmp_path / "run")},
        }
    )
    codec = build_codec(cfg.data, cfg.vocab, cfg.log.dir)
    assert len(codec.src_subword.tokenize("zephyrs")) == 1, codec.src_subword.tokenize("zephyrs")
    assert len(codec.src_subword.tokenize("cat")) == 1
    assert {"zephyrs", "cat"} <= set(codec.src_vocab.stoi)  # counted over every line
