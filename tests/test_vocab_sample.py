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


def test_counting_on_workers_gives_the_counts_and_their_order_of_one_process(tmp_path: Path, monkeypatch):
    """The vocabulary is counted on `data.workers` processes (chunks of COUNT_CHUNK lines, merged in
    their order): the same counts, in the same first-seen order (ties in the vocabulary keep it), as
    counting every line here; build_vocab's files are byte-identical for 1 and 2 workers."""
    from collections import Counter

    from onmt_doc.data import prepare

    monkeypatch.setattr(prepare, "COUNT_CHUNK", 250)  # the chunks are cut here, in the parent: 8 of them
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("".join(f"{words[i % 8]} {words[i * 7 % 8]} x{i % 97} .\n" for i in range(2000)), encoding="utf-8")
    tgt.write_text("".join(f"{words[i * 3 % 8]} y{i % 89} !\n" for i in range(2000)), encoding="utf-8")
    files = {}
    for workers in (1, 2):
        run = tmp_path / f"run{workers}"
        cfg = config_from_dict(
            {
                "data": {"train": {"src": str(src), "tgt": str(tgt)}, "documents": False, "workers": workers},
                "vocab": {"subword": "bpe", "size": 120},
                "log": {"dir": str(run)},
            }
        )
        codec = build_codec(cfg.data, cfg.vocab, cfg.log.dir)
        files[workers] = {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}
    assert files[1] == files[2] and "vocab.txt" in files[1]
    lines = src.read_text(encoding="utf-8").splitlines()
    expected: Counter = Counter()
    for line in lines:
        expected.update(codec.src_subword.tokenize(line))
    for workers in (1, 2):
        got = prepare.count_tokens(codec.src_subword, iter(lines), "counting", len(lines), workers)
        assert got == expected and list(got) == list(expected), workers
