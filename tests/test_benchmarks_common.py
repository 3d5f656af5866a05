"""benchmarks/common.py: the pieces whose mistakes would silently corrupt a report (docs rewriting,
log parsing, stop accounting). Loaded by path: benchmarks/ is not a package."""

from __future__ import annotations

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("bench_common", os.path.join(ROOT, "benchmarks", "common.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_update_docs_section_replaces_only_its_section(common, tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text("# Benchmarks\n\n## A\n\nold a\n\n## B\n\nkeep b\n", encoding="utf-8")
    common.update_docs_section(str(path), "## A", "## A\n\nnew a\n")
    assert path.read_text(encoding="utf-8") == "# Benchmarks\n\n## A\n\nnew a\n\n## B\n\nkeep b\n"
    common.update_docs_section(str(path), "## C", "## C\n\nc\n")  # missing: appended
    assert path.read_text(encoding="utf-8").endswith("keep b\n\n## C\n\nc\n")


def test_log_parsers_read_onmt_doc_lines(common):
    log = (
        "[02:07:35 INFO] model: transformer encoder + transformer decoder, 7.98M parameters, device cpu\n"
        "[02:08:56 INFO] step 50/300 | loss 6.600 | ppl 495.76 | acc 22.4% | lr 1.56e-03 | 1194 tgt tok/s\n"
        "[02:10:11 INFO] step 100/300 | loss 5.300 | ppl 109.84 | acc 32.8% | lr 3.13e-03 | 1282 tgt tok/s\n"
        "[02:10:12 INFO] step 150/300 | loss 5.300 | ppl 109.84 | acc 32.8% | lr 3.13e-03 | 1300 tgt tok/s\n"
        "[01:40:51 INFO] validation at step 300: loss 3.97 | ppl 22.88 | acc 48.66 | gate/mean 0.26\n"
    )
    assert common.params_m(log) == 7.98
    assert common.logged_tok_rate(log) == 1291  # median after the first report
    assert common.validation_metrics(log) == {"loss": 3.97, "ppl": 22.88, "acc": 48.66, "gate/mean": 0.26}
    assert common.scores("translated 3 lines in 1.5s\nBLEU 12.50 | chrF 40.10 | D-BLEU 14.00\n") == {
        "BLEU": 12.5,
        "chrF": 40.1,
        "D-BLEU": 14.0,
    }


def test_overlap_counts_open_and_closed_stops(common):
    stops = [[1.0, 3.0], [5.0, None]]  # the second stop is still going
    assert common.overlap(stops, 2.0, 6.0) == pytest.approx(2.0)
    assert common.overlap(stops, 3.0, 5.0) == 0.0
