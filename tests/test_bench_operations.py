"""The peer and operations benchmark stages: the parsing and bookkeeping they rely on (their smoke runs,
``python -m benchmarks run peers.yaml --smoke`` etc., exercise the rest)."""

import json
import os

import pytest

from benchmarks.peers import our_training, peer_training
from benchmarks.stages.operations import logged_steps, orphan_bytes
from benchmarks.suite.spec import load_spec

STEP = "[2026-11-21 10:00:{} INFO] Step {}/1000; acc: 5.0; ppl: {}; xent: 6.8; lr: 0.00100; sents:  3200; "
ONMT_LOG = "\n".join(
    [
        "[2026-11-21 10:00:00,100 INFO] * number of parameters: 7565616",
        STEP.format("10,000", 25, "900.00") + "bsz: 1500/1800/128; 1000/1200 tok/s;     10 sec;",
        STEP.format("20,000", 50, "400.00") + "bsz: 1500/1800/128; 1500/2000 tok/s;     20 sec;",
        "[2026-11-21 10:00:21,000 INFO] Validation perplexity: 72.8559",
    ]
)


def test_peer_training_rates_from_its_log():
    r = peer_training(ONMT_LOG)
    assert r["params"] == 7565616 and r["valid_ppl"] == pytest.approx(72.8559)
    assert r["tok_per_s_logged"] == pytest.approx(2000)  # the intervals after the first only
    assert r["real_tok_per_s"] == pytest.approx(2000 * (1800 - 128) / 1800)
    assert r["real_tgt_per_step"] == pytest.approx(1800 - 128) and r["sents_per_step"] == pytest.approx(128)


def test_our_training_rates_from_the_metrics_file(tmp_path):
    rows = [{"event": "train", "step": s, "tokens": 1300.0, "seconds": t} for s, t in ((10, 5.0), (20, 1.0), (30, 1.0))]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + [{"event": "valid", "step": 30}]))
    r = our_training(str(path), mean_tgt=10.0)
    assert r["tok_per_s_logged"] == pytest.approx(1300) and r["steps_per_s"] == pytest.approx(10)
    assert r["real_tok_per_s"] == pytest.approx(1000) and r["real_tgt_per_step"] == pytest.approx(100)


def test_logged_steps_and_orphans(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"event": "train", "step": 1}\n{"event": "train", "step": 2}\n{"eve')
    assert logged_steps(str(tmp_path), 0) == [1, 2]  # a line cut off by a kill is skipped
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for name, size in (("step_3.pt", 10), ("step_6.pt", 20), ("step_9.pt", 40), (".step_12.pt.tmp123", 5)):
        (ckpts / name).write_bytes(b"x" * size)
    assert orphan_bytes(str(tmp_path), keep_last=2) == 10 + 5


@pytest.mark.parametrize("name", ["peers.yaml", "fault_injection.yaml", "server_load.yaml"])
def test_specs_load(name):
    """Smoke budgets stay small: 40 s, but for the peers, which on a machine with their venv train and
    translate with OpenNMT-py for real at smoke size (~150 s; without it they are skipped at once)."""
    spec = load_spec(name)
    assert spec.smoke_budget_seconds <= (400 if name == "peers.yaml" else 40)
    assert os.path.basename(spec.path) == name
