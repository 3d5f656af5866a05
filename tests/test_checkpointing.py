"""The checkpoint code alone (onmt_doc/train/checkpointing.py): save, prune and resume a run's live
objects in a folder, without a config file, a corpus or a training loop."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from model_helpers import N_WORDS, random_model

from onmt_doc.config import config_from_dict, config_to_dict
from onmt_doc.data.batching import BatchSampler
from onmt_doc.data.instances import Example, mark_sentence
from onmt_doc.data.vocab import SPECIALS
from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import load_checkpoint
from onmt_doc.train import checkpointing
from onmt_doc.train.checkpointing import Checkpointer, Resumable
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.progress import EarlyStopping, Progress
from onmt_doc.train.run_folder import data_fingerprint

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

MODEL = {
    "encoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32},
    "decoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32},
}
CONFIG = config_to_dict(config_from_dict({}))


def examples(n: int = 40) -> list[Example]:
    rng = np.random.default_rng(0)
    first = len(SPECIALS)
    return [
        Example(
            mark_sentence(rng.integers(first, first + N_WORDS, 3 + i % 5)),
            mark_sentence(rng.integers(first, first + N_WORDS, 2 + i % 7)),
            i,
            0,
            1,
        )
        for i in range(n)
    ]


def live_run(seed: int, batch_tokens: int = 60) -> Resumable:
    """A run's objects as a builder would hand them over: a random model, Adam, a sampler."""
    model, codec = random_model(MODEL, seed=seed)
    data = examples()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = BatchSampler(data, batch_tokens, seed=3)
    fingerprint = data_fingerprint(data, config_from_dict({"train": {"batch_tokens": batch_tokens}}), 1)
    progress = Progress(EarlyStopping("loss", 3))
    return Resumable(codec, model, optimizer, "adam", None, sampler, fingerprint, progress)


def advance(run: Resumable, steps: int) -> None:
    """Steps that move every part: weights and Adam's moments, the data position, the counters."""
    batches = iter(run.sampler)
    for _ in range(steps):
        run.model.train()
        out = run.model(next(batches))
        torch.nn.functional.cross_entropy(out.logits.float(), out.target).backward()
        run.optimizer.step()
        run.optimizer.zero_grad()
        run.progress.step += 1
        run.progress.pending.add({"loss": 1.5, "tokens": 10})
    run.progress.early.update(2.0)
    run.progress.early.update(2.5)


def test_save_then_resume_restores_every_part_and_the_random_streams(tmp_path):
    run = live_run(seed=0)
    advance(run, 4)
    ckpts = Checkpointer(str(tmp_path), keep_last=2)
    ckpts.save(checkpointing.payload(CONFIG, run, DistContext()), run.progress.step)
    after_save = (torch.rand(3), random.random())  # what dropout and shuffling would draw next

    other = live_run(seed=1)  # other weights, a fresh optimizer, sampler and counters
    torch.manual_seed(99)
    random.seed(99)
    assert checkpointing.resume_from(str(tmp_path), other, CONFIG, "exact", DistContext())
    for (name, a), b in zip(run.model.state_dict().items(), other.model.state_dict().values()):
        assert torch.equal(a, b), name
    mine, theirs = run.optimizer.state_dict(), other.optimizer.state_dict()
    assert mine["param_groups"] == theirs["param_groups"] and mine["state"].keys() == theirs["state"].keys()
    assert all(torch.equal(v, theirs["state"][k][n]) for k, s in mine["state"].items() for n, v in s.items())
    assert other.sampler.state_dict() == run.sampler.state_dict()
    p, q = run.progress, other.progress
    assert (q.step, q.saved_step, q.early.best, q.early.bad) == (4, 4, p.early.best, p.early.bad) == (4, 4, 2.0, 1)
    assert q.pending.values == p.pending.values == {"loss": 6.0, "tokens": 40.0}
    again = (torch.rand(3), random.random())
    assert torch.equal(again[0], after_save[0]) and again[1] == after_save[1]


def test_payload_layout_best_has_no_training_state_and_prune_keeps_the_newest(tmp_path):
    run = live_run(seed=0)
    ckpts = Checkpointer(str(tmp_path), keep_last=2)
    for step in (1, 2, 3):
        run.progress.step = step
        ckpts.save(checkpointing.payload(CONFIG, run, DistContext()), step)
    (tmp_path / ".step_4.pt.tmp4242").write_bytes(b"\0")  # a killed save of this run
    (tmp_path / ".avg.pt.tmp4242").write_bytes(b"\0")  # another command's file in progress
    ckpts.save_best(checkpointing.payload(CONFIG, run, DistContext(), with_train_state=False))
    ckpts.prune(3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".avg.pt.tmp4242",
        "best.pt",
        "last.pt",
        "step_2.pt",
        "step_3.pt",
    ]
    last = load_checkpoint(str(tmp_path / "last.pt"))
    assert list(last) == ["format_version", "config", "codec", "model", "step", "train_state"]
    assert list(last["train_state"]) == [
        *("step", "optimizer_type", "optimizer", "scaler", "sampler", "data"),
        *("early_stopping", "pending", "rng"),
    ]
    assert "train_state" not in load_checkpoint(str(tmp_path / "best.pt"))
    assert checkpointing.step_checkpoints(str(tmp_path)) == [str(tmp_path / "step_2.pt"), str(tmp_path / "step_3.pt")]


def test_an_empty_folder_is_a_new_run(tmp_path):
    assert checkpointing.resume_source(str(tmp_path)) is None
    assert not checkpointing.resume_from(str(tmp_path), live_run(seed=0), CONFIG, "exact", DistContext())


@pytest.fixture()
def saved(tmp_path):
    """A folder with one checkpoint of an advanced run (its position inside epoch 0)."""
    run = live_run(seed=0)
    advance(run, 2)
    Checkpointer(str(tmp_path), keep_last=1).save(checkpointing.payload(CONFIG, run, DistContext()), 2)
    return tmp_path


def test_restore_refuses_another_optimizer_type(saved):
    run = live_run(seed=0)
    run.optimizer_type = "sgd"
    with pytest.raises(UserError, match=r"cannot resume with optim\.type sgd: .* a adam optimizer"):
        checkpointing.resume_from(str(saved), run, CONFIG, "exact", DistContext())


def test_restore_refuses_another_data_position_unless_next_epoch(saved):
    with pytest.raises(UserError, match=r"train\.batch_tokens 60 -> 80.*train\.resume_data=next_epoch"):
        checkpointing.resume_from(str(saved), live_run(seed=0, batch_tokens=80), CONFIG, "exact", DistContext())
    run = live_run(seed=0, batch_tokens=80)
    checkpointing.resume_from(str(saved), run, CONFIG, "next_epoch", DistContext())
    assert run.sampler.state_dict() == {"epoch": 1, "position": 0, "seed": 3}


def test_config_changes_name_every_differing_leaf():
    old = {"optim": {"lr": 0.002, "type": "adam"}, "train": {"seed": 1}}
    new = {"optim": {"lr": 0.001, "type": "adam"}, "train": {"seed": 1, "accum": 2}}
    assert checkpointing.config_changes(old, new) == ["optim.lr 0.002 -> 0.001", "train.accum None -> 2"]
