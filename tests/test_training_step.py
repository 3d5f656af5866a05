"""A training step whose cost is the device's (issue 40): no operator that makes a GPU's host wait
(counted on the CPU by ``onmt_doc.train.host_syncs``), batches prepared ahead without changing the
data order or the resume position, and ``train.compile`` giving the eager step's numbers."""

from __future__ import annotations

from dataclasses import replace

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
    """The prefetcher yields the sampler's own batches in its order, across an epoch boundary, each
    prepared (the model's host plans) in its thread, and leaves the sampler at the position of the
    batches consumed (not those read ahead)."""
    trainer = _trainer(trained_run, toy_dir, tmp_path / "pre", {}, train={"batch_tokens": 4096})
    sampler = trainer.sampler
    n = len(sampler.epoch_batches(0)) + 3  # into the second epoch
    plain = [b.src for _, b in zip(range(n), iter(sampler))]
    end_state = sampler.state_dict()
    sampler.load_state_dict({"epoch": 0, "position": 0})
    prefetcher = Prefetcher(sampler, depth=4, pin=False, prepare=lambda b: replace(b, plans={"rows": b.src.shape[0]}))
    try:
        for i, want in enumerate(plain):
            got = next(prefetcher)
            assert torch.equal(got.src, want) and got.plans == {"rows": len(want)}, i  # prepared in the thread
            if i == 5:
                assert sampler.state_dict() == {"epoch": 0, "position": 6, "seed": sampler.seed}
        assert sampler.state_dict() == end_state and sampler.completed_epochs() == 1
    finally:
        prefetcher.close()
    assert not prefetcher._thread.is_alive()


@pytest.mark.parametrize("name", ["g_transformer", "hm_gdc"])
def test_the_trainer_compiles_a_document_model_step_in_one_graph(name, trained_run, toy_dir, tmp_path, monkeypatch):
    """On the fused (GPU) path the trainer has each batch's host plans made before its step
    (``EncoderDecoder.prepare``, in the prefetch thread on a GPU), so ``train.compile`` traces a
    document model's forward in one graph, for every batch shape: the G-Transformer's forward left its
    graph for its sentence offsets (6 graphs), HM-GDC's for its packings (5)."""
    monkeypatch.setattr(devices, "COMPILE_BACKEND", "eager")  # dynamo's graphs, without compiling kernels
    trainer = _trainer(trained_run, toy_dir, tmp_path / name, MODELS[name], train={"compile": "on", "max_steps": 3})
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with devices.forced_path("fused"):
        trainer.train()
    assert trainer.step == 3
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1, dict(
        torch._dynamo.utils.counters["graph_break"]
    )


@pytest.mark.parametrize("mode", ["on", "graphs"])
def test_compiled_step_equals_the_eager_step(mode, trained_run, toy_dir, tmp_path):
    """train.compile=on (and graphs, with static shapes; on a CPU it records no graph): the same loss
    and gradients as the eager step (float rounding aside), and one compilation for batches of
    different shapes."""
    model = {"d_model": 32, "encoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32},
             "decoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32}, "dropout": 0.0}  # fmt: skip
    static = {"static_shapes": mode == "graphs"}
    eager = _trainer(trained_run, toy_dir, tmp_path / "eager", model, train=static)
    comp = _trainer(trained_run, toy_dir, tmp_path / "comp", model, train={"compile": mode, **static})
    batches = [b for _, b in zip(range(3), iter(eager.sampler))]
    assert len({tuple(b.src.shape) for b in batches}) > 1
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
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
    # one graph for every shape: no break (a ContextVar read in the attention split it 19 ways)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


# the ladders of train.static_shapes, written out: lengths 8..64 by 8, then eight per doubling;
# rows 8..64 by 8, then four per doubling
LENGTHS = [*range(8, 65, 8), *range(72, 129, 8), *range(144, 257, 16), *range(288, 513, 32)]
ROWS = [*range(8, 65, 8), *range(80, 129, 16), *range(160, 257, 32), *range(320, 513, 64)]


def test_the_static_shape_ladders():
    """A batch's columns and rows go up to the next value of the ladder (at most 1/8 and 1/4 more)."""
    from onmt_doc.data.static_shapes import rung

    assert [rung(n) for n in range(1, 513)] == [min(x for x in LENGTHS if x >= n) for n in range(1, 513)]
    assert [rung(n, 4) for n in range(1, 513)] == [min(x for x in ROWS if x >= n) for n in range(1, 513)]


def test_static_shapes_change_no_number(trained_run, toy_dir, tmp_path):
    """train.static_shapes: each batch padded to a ladder shape (extra rows, columns and output-layer
    rows) gives the plain batch's loss, statistics and gradients, and the same token counts."""
    model = {"d_model": 32, "encoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32},
             "decoder": {"type": "transformer", "layers": 1, "heads": 2, "ff": 32}, "dropout": 0.0}  # fmt: skip
    plain = _trainer(trained_run, toy_dir, tmp_path / "plain", model)
    static = _trainer(trained_run, toy_dir, tmp_path / "static", model, train={"static_shapes": True})
    static.model.load_state_dict(plain.model.state_dict())
    grew = set()
    for a, b in zip(range(4), zip(iter(plain.sampler), iter(static.sampler))):
        p, s = b
        rows, length = s.src.shape
        assert length in LENGTHS and rows in ROWS and s.tgt_in.shape == s.src.shape
        grew |= {"rows"} if rows > p.src.size(0) else set()
        grew |= {"columns"} if length > max(p.src.size(1), p.tgt_in.size(1)) else set()
        grew |= {"targets"} if s.tgt_index.numel() > p.tgt_index.numel() else set()
        assert (s.n_src_tokens, s.n_tgt_tokens, s.n_tgt_words) == (p.n_src_tokens, p.n_tgt_tokens, p.n_tgt_words)
        numbers = []
        for trainer, batch in ((plain, p), (static, s)):
            total, stats = trainer._losses(batch, training=True)
            total.backward()
            numbers.append([float(total.detach()), float(stats["nll"]), float(stats["correct"]), stats["tokens"]])
        assert numbers[1] == pytest.approx(numbers[0], rel=1e-6), a
        for x, y in zip(plain.model.parameters(), static.model.parameters()):
            assert (x.grad - y.grad).norm() <= 1e-5 * x.grad.norm()
            x.grad = y.grad = None
    assert grew == {"rows", "columns", "targets"}  # every kind of padding was exercised


@pytest.mark.parametrize(
    "train, model, error",
    [
        ({"compile": "graphs"}, {}, "train.compile: graphs needs train.static_shapes: true"),
        ({"static_shapes": True}, MODELS["g_transformer"],
         "train.static_shapes: for sentence-level models only, not the document unit"),
    ],
)  # fmt: skip
def test_static_shapes_and_graphs_refuse_what_they_cannot_do(train, model, error, toy_dir, tmp_path):
    """CUDA graphs replay one shape: without static shapes they are refused; added rows would join a
    document model's documents: static shapes are refused there."""
    from onmt_doc.config.loading import config_from_dict
    from onmt_doc.errors import ConfigError

    cfg = tiny_config(toy_dir, tmp_path / "run", train=train)
    cfg["model"] = {**cfg["model"], **model}
    with pytest.raises(ConfigError, match=error):
        config_from_dict(cfg)
