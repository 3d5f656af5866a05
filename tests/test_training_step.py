"""A training step whose cost is the device's (issue 40): no operator that makes a GPU's host wait
(counted on the CPU by ``onmt_doc.train.host_syncs``), batches prepared ahead without changing the
data order or the resume position, and ``train.compile`` giving the eager step's numbers."""

from __future__ import annotations

import pytest
import torch
from conftest import init_from_run, make_trainer, tiny_config

from onmt_doc import devices
from onmt_doc.train.host_syncs import OpCounter
from onmt_doc.train.prefetch import Prefetcher

pytestmark = pytest.mark.integration  # builds trainers on the toy corpus

# every decoder family and unit, at toy size
MODELS = {
    "transformer": {},
    "g_transformer": {
        "encoder": {"type": "g_transformer", "layers": 2, "heads": 4, "ff": 64, "global_layers": 1},
        "decoder": {
            "type": "g_transformer",
            "layers": 2,
            "heads": 4,
            "ff": 64,
            "global_layers": 1,
            "global_cross_layers": 1,
        },
    },  # fmt: skip
    "mhplstm": {"decoder": {"type": "mhplstm", "layers": 2, "heads": 4, "ff": 64}},
    "reformer": {"encoder": {"type": "embedding"}, "decoder": {"type": "reformer", "layers": 2, "heads": 4, "ff": 64}},
    "context_gates": {"decoder": {"type": "gated_transformer", "layers": 2, "heads": 4, "ff": 64}},
    "k_to_1": {"unit": "k_to_1"},
    "hm_gdc": {
        "encoder": {"type": "hierarchical", "layers": 2, "heads": 4, "ff": 64, "doc_layers": 1},
        "decoder": {"type": "doc_context", "layers": 2, "heads": 4, "ff": 64},
    },
}


def _trainer(trained_run, toy_dir, run, model: dict, **sections):
    """A Trainer with ``model`` over tiny_config's, reusing trained_run's vocabulary and cache."""
    init_from_run(trained_run, run)
    cfg = tiny_config(toy_dir, run, data={"cache_dir": str(trained_run / "cache"), "documents": True}, **sections)
    cfg["model"] = {**cfg["model"], **model}
    return make_trainer(cfg)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_training_step_makes_no_host_sync(name, trained_run, toy_dir, tmp_path):
    """The fused (GPU) path of every model, run on the CPU: no .item(), no boolean-mask indexing, no
    nonzero/unique/bincount in the forward, the losses, the backward or the optimizer step."""
    trainer = _trainer(trained_run, toy_dir, tmp_path / name, MODELS[name])
    batches = iter(trainer.sampler)
    trainer.train_step([next(batches)])  # first step: lazy state (optimizer) outside the count
    with devices.forced_path("fused"), OpCounter() as ops:
        trainer.train_step([next(batches)])
    assert ops.total > 100  # the counter saw the step
    assert ops.syncs == 0, dict(ops.sync_ops)


def test_the_statistics_are_read_once_per_progress_line(trained_run, toy_dir, tmp_path):
    """A step returns its loss statistics as device tensors; the loop reads them when it logs."""
    trainer = _trainer(trained_run, toy_dir, tmp_path / "stats", {})
    values = trainer.train_step([next(iter(trainer.sampler))])
    assert all(isinstance(values[k], torch.Tensor) for k in ("loss", "nll", "correct", "grad_norm"))


def test_prefetching_keeps_the_order_and_the_resume_position(trained_run, toy_dir, tmp_path):
    """The prefetcher yields the sampler's own batches in its order, across an epoch boundary, and
    leaves the sampler at the position of the batches consumed (not those read ahead)."""
    trainer = _trainer(trained_run, toy_dir, tmp_path / "pre", {}, train={"batch_tokens": 4096})
    sampler = trainer.sampler
    n = len(sampler.epoch_batches(0)) + 3  # into the second epoch
    plain = [b.src for _, b in zip(range(n), iter(sampler))]
    end_state = sampler.state_dict()
    sampler.load_state_dict({"epoch": 0, "position": 0})
    prefetcher = Prefetcher(sampler, depth=4, pin=False)
    try:
        for i, want in enumerate(plain):
            got = next(prefetcher).src
            assert torch.equal(got, want), i
            if i == 5:
                assert sampler.state_dict() == {"epoch": 0, "position": 6, "seed": sampler.seed}
        assert sampler.state_dict() == end_state and sampler.completed_epochs() == 1
    finally:
        prefetcher.close()
    assert not prefetcher._thread.is_alive()


def test_compiled_step_equals_the_eager_step(trained_run, toy_dir, tmp_path):
    """train.compile=on: the same loss and gradients as the eager step (float rounding aside), and one
    compilation for batches of different shapes."""
    model = {"d_model": 32, "encoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32},
             "decoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32}, "dropout": 0.0}  # fmt: skip
    eager = _trainer(trained_run, toy_dir, tmp_path / "eager", model)
    comp = _trainer(trained_run, toy_dir, tmp_path / "comp", model, train={"compile": "on"})
    batches = [b for _, b in zip(range(3), iter(eager.sampler))]
    assert len({tuple(b.src.shape) for b in batches}) > 1
    torch._dynamo.reset()
    for batch in batches:
        losses = []
        for trainer in (eager, comp):
            total, _ = trainer._losses(batch, training=True)
            total.backward()
            losses.append(float(total.detach()))
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
        for a, b in zip(eager.model.parameters(), comp.model.parameters()):
            assert (a.grad - b.grad).norm() <= 1e-5 * a.grad.norm()  # fused kernels reorder float sums
            a.grad = b.grad = None
