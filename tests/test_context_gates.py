"""Regularized context gates: PMI counts and z* by hand, the gated decoder, the hinge loss,
training with it, the error analysis and the tools' error contract."""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import module_cmd, run_cli, tiny_config, write_config
from model_helpers import random_batch, random_model, toy_codec
from test_cli import assert_one_line_error
from test_decoding import SIZES, assert_stepwise_matches

from onmt_doc.bin.common import run as run_command
from onmt_doc.config import config_from_dict
from onmt_doc.data.batching import collate, make_batch
from onmt_doc.data.example_fields import FieldContext, build_field
from onmt_doc.data.instances import Example, UnitOptions, mark_sentence
from onmt_doc.data.mapped import MappedCorpus, MappedExamples, open_mapped, write_mapped
from onmt_doc.data.pmi import (
    PairCounts,
    PMITable,
    build_table,
    count_table,
    z_star,
    z_star_fields,
    z_star_share,
)
from onmt_doc.data.prepare import build_codec
from onmt_doc.data.vocab import EOS_ID, PAD_ID
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.evaluation.gate_analysis import analyse_gates
from onmt_doc.losses.gate_hinge import PMIGateHinge, PMIGateHingeConfig, gate_hinge
from onmt_doc.models.checkpoint import load_model
from onmt_doc.models.model import full_log_probs
from onmt_doc.modules.context_gate import OutputNormResidual
from onmt_doc.train import distributed
from onmt_doc.train.trainer import Trainer, train

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

ENCODER = {"type": "transformer", "layers": 1, "heads": 4, "ff": 64}


def gated(norm: str = "paper", gate: str = "vector") -> dict:
    return {
        "encoder": ENCODER,
        "decoder": {"type": "gated_transformer", "layers": 2, "heads": 4, "ff": 64, "norm": norm, "gate": gate},
    }


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# Three sentence pairs over 2 source and 5 target types:
#   x = 0 0 0 0   y = 1 2
#   x = 0         y = 3 4
#   x = 1         y = 3
# unigrams: C(x=0) = 5, C(x=1) = 1; C(y=1) = C(y=2) = C(y=4) = 1, C(y=3) = 2
# bilingual pairs, once per sentence pair: (1,0) (2,0) (3,0) (4,0) (3,1) -> each 1, Z = 5
# monolingual (y_i, y_k<i), once per sentence: (2,1) (4,3) -> each 1, Z = 2
# one normaliser for both scenarios (the default): Z = 5 + 2 = 7
HAND = [(ids(0, 0, 0, 0), ids(1, 2)), (ids(0), ids(3, 4)), (ids(1), ids(3))]


def hand_table(normaliser: str = "shared") -> PMITable:
    return count_table(iter(HAND), src_size=2, tgt_size=5, normaliser=normaliser)


@pytest.mark.parametrize("normaliser, z_bi, z_mono", [("shared", 7, 7), ("per_scenario", 5, 2)])
def test_pmi_equals_hand_counts(normaliser, z_bi, z_mono):
    table = hand_table(normaliser)
    # eq. 6: log Z + log C(y, x) - log C(y) - log C(x)
    expected_bi = {
        (1, 0): math.log(z_bi * 1 / (1 * 5)),
        (2, 0): math.log(z_bi * 1 / (1 * 5)),
        (3, 0): math.log(z_bi * 1 / (2 * 5)),
        (4, 0): math.log(z_bi * 1 / (1 * 5)),
        (3, 1): math.log(z_bi * 1 / (2 * 1)),
        (2, 1): -math.inf,
        (1, 1): -math.inf,
    }
    y, x = zip(*expected_bi)
    assert np.allclose(table.bilingual(np.array(y), np.array(x)), list(expected_bi.values()))
    expected_mono = {
        (2, 1): math.log(z_mono * 1 / (1 * 1)),
        (4, 3): math.log(z_mono * 1 / (1 * 2)),
        (1, 2): -math.inf,
        (3, 3): -math.inf,
    }  # order matters: 1 never follows 2
    y, prev = zip(*expected_mono)
    assert np.allclose(table.monolingual(np.array(y), np.array(prev)), list(expected_mono.values()))
    assert table.src_counts.tolist() == [5, 1] and table.tgt_counts.tolist() == [0, 1, 1, 2, 1]
    assert table.n_pairs == 3


def test_pair_counts_are_per_sentence_and_merge_exactly():
    """A pair repeated inside one sentence counts once; bulk merges equal one big count."""
    table = count_table(iter([(ids(0, 0), ids(1, 1, 1))]), src_size=1, tgt_size=2)
    assert table.bi_counts.tolist() == [1] and table.mono_keys.tolist() == [1 * 2 + 1]
    rng = np.random.default_rng(0)
    keys = [rng.integers(0, 50, rng.integers(1, 30)) for _ in range(40)]
    counter = PairCounts(merge_at=8)
    for k in keys:
        counter.add(k)
    got_keys, got_counts = counter.result()
    want_keys, want_counts = np.unique(np.concatenate(keys), return_counts=True)
    assert got_keys.tolist() == want_keys.tolist() and got_counts.tolist() == want_counts.tolist()
    pairs = [(rng.integers(0, 7, rng.integers(1, 9)), rng.integers(0, 9, rng.integers(1, 9))) for _ in range(60)]
    a, b = count_table(iter(pairs), 7, 9, chunk=1), count_table(iter(pairs), 7, 9, chunk=64)
    assert a.bi_keys.tolist() == b.bi_keys.tolist() and a.mono_counts.tolist() == b.mono_counts.tolist()


@pytest.mark.parametrize("normaliser", ["shared", "per_scenario"])
def test_z_star_equals_eq7_by_hand(normaliser):
    table = hand_table(normaliser)
    got = z_star(table, [s for s, _ in HAND], [t for _, t in HAND])
    # pair 1: y=1 first token, seen with x=0 -> 1; y=2: max_x pmi(2,0) = log(Z_bi/5) < pmi(2,1) = log Z_mono -> 0
    # pair 2: y=3 first -> 1; y=4: pmi(4,0) = log(Z_bi/5) vs pmi(4,3) = log(Z_mono/2): log(7/5) < log(7/2),
    #         log 1 = log 1 (not greater) -> 0 under both normalisers
    # pair 3: y=3 first token -> 1
    assert [z.tolist() for z in got] == [[1, 0], [1, 0], [1]]
    # unseen pairs everywhere -> 0; another token at position i keeps x and the prefix y_<i
    assert z_star(table, [ids(1)], [ids(4)])[0].tolist() == [0]
    assert z_star(table, [ids(0, 0, 0, 0)], [ids(1, 2)], queries=[ids(1, 3)])[0].tolist() == [1, 1]


# Where the normaliser decides (x = 0 0 1 1 2 2 3 3, y = 5 6; x = 0, y = 6): C(x=0) = 3, C(x=1..3) = 2,
# C(y=5) = 1, C(y=6) = 2; bilingual pairs 5x{0..3}, 6x{0..3}, (6,0) again: Z_bi = 9; monolingual (6,5): Z_mono = 1.
# y=6 after y=5: max_x pmi(6, x) = log Z_bi + log(2 / (2·3)) (x = 0) against pmi(6, 5) = log Z_mono + log(1 / (2·1)):
# one Z: log(1/3) < log(1/2) -> 0; per scenario: log 3 > log(1/2) -> 1.
SPLIT = [(ids(0, 0, 1, 1, 2, 2, 3, 3), ids(5, 6)), (ids(0), ids(6))]


def test_one_normaliser_cancels_and_per_scenario_favours_the_source():
    shared = count_table(iter(SPLIT), src_size=4, tgt_size=7)  # the default
    per_scenario = count_table(iter(SPLIT), src_size=4, tgt_size=7, normaliser="per_scenario")
    src, tgt = [s for s, _ in SPLIT], [t for _, t in SPLIT]
    assert shared.normaliser == "shared"
    assert [z.tolist() for z in z_star(shared, src, tgt)] == [[1, 0], [1]]
    assert [z.tolist() for z in z_star(per_scenario, src, tgt)] == [[1, 1], [1]]
    # the counts are the same table; the normaliser only changes z*, and the cache key with it
    assert np.array_equal(shared.bi_counts, per_scenario.bi_counts) and shared.digest() != per_scenario.digest()
    assert z_star_share(shared, iter(SPLIT)) == (2, 3) and z_star_share(per_scenario, iter(SPLIT)) == (3, 3)


def test_z_star_cache_is_named_by_its_normaliser_and_a_damaged_one_is_recomputed(tmp_path):
    """z* cached in a corpus's folder under one normaliser is never read back under the other (the
    file is named by the table's digest, which covers it), and a cut file is computed again."""
    write_mapped(str(tmp_path), [[pair] for pair in SPLIT])
    corpus = open_mapped(str(tmp_path))

    def examples(normaliser: str) -> list[list[int]]:
        table = count_table(iter(SPLIT), src_size=4, tgt_size=7, normaliser=normaliser)
        mapped = MappedExamples(corpus, "sentence", UnitOptions(), z_star_fields(table, corpus))
        return [e.extra["z_star"].tolist() for e in mapped]

    assert examples("shared") == [[0, 1, 0, 0], [0, 1, 0]]
    assert examples("per_scenario") == [[0, 1, 1, 0], [0, 1, 0]]
    cached = sorted(tmp_path.glob("zstar-*.i8"))
    assert len(cached) == 2
    written = {path: path.read_bytes() for path in cached}
    assert all(len(b) == 3 + 4 for b in written.values())  # 3 target tokens and their CRC-32
    for path in cached:  # a cut file (an interrupted copy): recomputed, not misread
        path.write_bytes(b"\x01")
    assert examples("shared") == [[0, 1, 0, 0], [0, 1, 0]]
    assert examples("per_scenario") == [[0, 1, 1, 0], [0, 1, 0]]
    assert {path: path.read_bytes() for path in cached} == written
    for path in cached:  # a flipped value, the size unchanged: the CRC-32 tells
        path.write_bytes(bytes([written[path][0] ^ 1]) + written[path][1:])
    assert examples("shared") == [[0, 1, 0, 0], [0, 1, 0]]
    assert examples("per_scenario") == [[0, 1, 1, 0], [0, 1, 0]]
    assert {path: path.read_bytes() for path in cached} == written


def test_table_round_trip_and_vocabulary_check(toy_dir, tmp_path):
    cfg = config_from_dict(tiny_config(toy_dir, tmp_path / "run"))
    codec = build_codec(cfg.data, cfg.vocab, str(tmp_path / "run"))
    table = build_table(str(toy_dir / "train.src"), str(toy_dir / "train.tgt"), codec)
    table.save(str(tmp_path / "table"))  # exactly this name, no suffix added
    loaded = PMITable.load(str(tmp_path / "table"), codec)
    assert loaded.n_pairs == table.n_pairs > 1000 and loaded.digest() == table.digest()
    rng = np.random.default_rng(1)
    y, x = rng.integers(7, len(codec.tgt_vocab), 5000), rng.integers(7, len(codec.src_vocab), 5000)
    known = np.stack([table.bi_keys // table.src_size, table.bi_keys % table.src_size])[:, :2000]
    for a, b in ((y, x), (known[0], known[1])):
        assert np.array_equal(loaded.bilingual(a, b), table.bilingual(a, b))
        assert np.array_equal(loaded.monolingual(a, b % table.tgt_size), table.monolingual(a, b % table.tgt_size))
    assert np.isfinite(loaded.bilingual(known[0], known[1])).all()
    with pytest.raises(UserError, match="table.*other vocabularies"):
        PMITable.load(str(tmp_path / "table"), toy_codec())
    with pytest.raises(UserError, match="missing.npz.*not found"):
        PMITable.load(str(tmp_path / "missing.npz"))


def test_a_table_whose_arrays_index_outside_it_is_refused(tmp_path):
    """The zip's CRC-32s say the bytes are the ones saved; the bounds say they can be a table: keys
    out of order (the lookup is a binary search: counts silently wrong), outside V x V, negative
    counts, arrays of unequal lengths."""
    table = count_table([(np.array([7, 8]), np.array([9, 7]))], 10, 10)
    table.save(str(tmp_path / "good.npz"))
    good = dict(np.load(tmp_path / "good.npz"))
    for name, arrays, message in (
        ("unsorted", {"bi_keys": good["bi_keys"][::-1].copy()}, "bi_keys out of order"),
        ("outside", {"mono_keys": good["mono_keys"] + 100}, "mono_keys out of order or outside"),
        ("negative", {"src_counts": -good["src_counts"]}, "src_counts holds a negative value"),
        ("short", {"bi_counts": good["bi_counts"][:-1]}, "bi_keys for"),
        ("floats", {"tgt_counts": good["tgt_counts"].astype(float)}, "tgt_counts is not a list of integers"),
    ):
        np.savez(tmp_path / f"{name}.npz", **{**good, **arrays})
        with pytest.raises(UserError, match=f"{name}.npz: not a PMI table.*{message}"):
            PMITable.load(str(tmp_path / f"{name}.npz"))
    assert PMITable.load(str(tmp_path / "good.npz")).digest() == table.digest()


# ----------------------------------------------------------------------------- the decoder


@pytest.mark.parametrize("norm", ["paper", "pre", "post"])
def test_gated_stepwise_equals_teacher_forced(norm, device):
    model, _ = random_model(gated(norm), device=device)
    assert_stepwise_matches(model, random_batch(SIZES, device=device), torch.tensor([2, 0, 3, 1]), reorder_at=3)


def test_gated_beam_internal_reorder_keeps_source_fields(device):
    model, _ = random_model(gated(), device=device)
    batch = random_batch(SIZES[:2], device=device)
    k, within = 3, torch.tensor([2, 0, 1, 4, 5, 3], device=device)
    with torch.no_grad():
        forced = full_log_probs(model, batch).repeat_interleave(k, 0)
        expand = torch.arange(2, device=device).repeat_interleave(k)
        state = model.init_state(model.encode(batch), batch).reorder(expand)
        tgt, steps = batch.tgt_in.repeat_interleave(k, 0), []
        for t in range(tgt.size(1)):
            if t == 2:
                state, tgt, steps = state.reorder(within, same_sources=True), tgt[within], [s[within] for s in steps]
            lp, state = model.step(tgt[:, t], state)
            steps.append(lp)
    mask = batch.tgt_out.repeat_interleave(k, 0).ne(PAD_ID)
    assert torch.allclose(forced[mask], torch.stack(steps, 1)[mask], atol=1e-5)


def test_gated_layer_follows_eqs_2_to_4():
    """The paper's placement computed by hand from the layer's weights."""
    model, _ = random_model(gated("paper"))
    batch = random_batch(SIZES)
    layer = model.decoder.layers[0]
    with torch.no_grad():
        enc = model.encode(batch)
        c = model.decoder.embeddings(batch.tgt_in)
        kv = layer.cross_attn.memory_kv(enc.memory)
        out, z = layer(c, kv, enc.attention_mask())

        def ln(module, v):
            return F.layer_norm(v, v.shape[-1:], module.norm.weight, module.norm.bias)

        t = c + ln(layer.self_res, layer.self_attn(c, is_causal=True))  # t = rn∘ln∘att
        s = ln(layer.cross_res, layer.cross_attn.cross(t, kv, enc.attention_mask()))  # s = ln∘att
        want_z = torch.sigmoid(torch.cat([t, s], -1) @ layer.cross_res.gate.weight.T + layer.cross_res.gate.bias)
        mixed = (1 - want_z) * t + want_z * s
        want = mixed + ln(layer.ff_res, layer.ff(mixed))  # c = rn∘ln∘ff
    assert torch.allclose(z, want_z, atol=1e-6) and torch.allclose(out, want, atol=1e-5)
    assert model(batch).aux["gates"].shape == (2, *batch.tgt_in.shape, 32)


@pytest.mark.parametrize("norm", ["paper", "pre", "post"])
def test_sum_instead_of_the_gate_is_the_transformer(norm):
    """The paper's Remark: with t + s in place of the gated sum, the decoder is the Transformer
    decoder with the same blocks (same weights, same outputs). The Transformer has no `paper`
    blocks of its own: there its residual blocks are swapped for x + LN(f(x))."""
    model, _ = random_model(gated(norm, gate="sum"))
    plain, _ = random_model(
        {
            "encoder": ENCODER,
            "decoder": {"type": "transformer", "layers": 2, "heads": 4, "ff": 64, "pre_norm": norm != "post"},
        },
        seed=1,
    )
    if norm == "paper":
        for layer in plain.decoder.layers:
            for name in ("self_res", "cross_res", "ff_res"):
                setattr(layer, name, OutputNormResidual(32, 0.0))
    plain.load_state_dict(model.state_dict())  # strict: the same parameters, no gate
    batch = random_batch(SIZES)
    with torch.no_grad():
        got, want = full_log_probs(model, batch), full_log_probs(plain, batch)
    assert "gates" not in model(batch).aux
    assert torch.allclose(got, want, atol=1e-6, rtol=0), (got - want).abs().max()
    assert_stepwise_matches(model, batch, torch.tensor([2, 0, 3, 1]), reorder_at=3)


def test_hinge_loss_by_hand():
    gates = torch.tensor([0.2, 0.7, 0.5, 0.9]).view(1, 1, 4, 1).repeat(2, 1, 1, 2)  # [L=2, B=1, T=4, D=2]
    gates[1, 0, 0] = torch.tensor([0.6, 0.1])
    z_star_ = torch.tensor([[1, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    hinge, wrong = gate_hinge(gates, z_star_, mask)
    # token 0 (z*=1): layer 0: 0.3 in both dims, layer 1: dims 0 and 0.4 -> mean 0.3 + 0.2
    # token 1 (z*=1): 0.7 > 0.5 -> 0; token 2 (z*=0): 0.5 -> 0; token 3 masked
    assert torch.allclose(hinge, torch.tensor([[0.5, 0.0, 0.0, 0.0]]))
    assert torch.allclose(wrong, torch.tensor([[0.75, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("layers, want", [([], 0.5), ([1], 0.3), ([2], 0.2)])
def test_hinge_regularises_the_chosen_layers(tmp_path, layers, want):
    """Table 5: `layers` picks the regularised layers (1-based, default all); the gates of
    test_hinge_loss_by_hand give 0.3 (layer 1) + 0.2 (layer 2) on the one wrong token."""
    hand_table().save(str(tmp_path / "hand.npz"))
    loss = PMIGateHinge(PMIGateHingeConfig(table=str(tmp_path / "hand.npz"), layers=layers))
    gates = torch.tensor([0.2, 0.7, 0.5, 0.9]).view(1, 1, 4, 1).repeat(2, 1, 1, 2)
    gates[1, 0, 0] = torch.tensor([0.6, 0.1])
    batch = SimpleNamespace(extra={"z_star": torch.tensor([[1, 1, 0, 0]]), "z_star_mask": torch.tensor([[1, 1, 1, 0]])})
    value, stats = loss(SimpleNamespace(aux={"gates": gates}), batch)
    assert value.item() == pytest.approx(want) and stats["gate/hinge"] == pytest.approx(want)
    with pytest.raises(ConfigError, match="'layers' names layer 3"):
        PMIGateHinge(PMIGateHingeConfig(table=str(tmp_path / "hand.npz"), layers=[3]))(
            SimpleNamespace(aux={"gates": gates}), batch
        )
    with pytest.raises(ConfigError, match="'layers' names layer 0"):
        PMIGateHinge(PMIGateHingeConfig(table=str(tmp_path / "hand.npz"), layers=[0]))(
            SimpleNamespace(aux={"gates": gates}), batch
        )

    def hinge_config(layers: list[int]) -> None:  # 2 decoder layers
        config_from_dict({"model": gated(), "loss": [{"type": "pmi_gate_hinge", "table": "t.npz", "layers": layers}]})

    with pytest.raises(ConfigError, match="names layer 3, model.decoder.layers is 2"):
        hinge_config([1, 3])
    with pytest.raises(ConfigError, match="distinct layer numbers"):
        hinge_config([0])


def test_z_star_rides_on_batches_aligned_with_tgt_out(tmp_path):
    table = hand_table()
    docs = [[(s, t) for s, t in HAND[:2]], [HAND[2]]]
    write_mapped(str(tmp_path), docs)
    corpus = open_mapped(str(tmp_path))
    examples = MappedExamples(corpus, "sentence", UnitOptions(), z_star_fields(table, corpus))
    batch = collate(list(examples))
    # tgt_out: <s> y1 y2 </s> <eos>; only the words are supervised (z* of the hand example)
    assert batch.extra["z_star"].tolist() == [[0, 1, 0, 0, 0], [0, 1, 0, 0, 0], [0, 1, 0, 0, 0]]
    assert batch.extra["z_star_mask"].tolist() == [[0, 1, 1, 0, 0], [0, 1, 1, 0, 0], [0, 1, 0, 0, 0]]
    assert batch.tgt_out[2].tolist()[-2:] == [EOS_ID, PAD_ID]
    assert all(torch.equal(batch.extra[k], make_batch(examples, np.arange(3)).extra[k]) for k in batch.extra)
    cached = list(tmp_path.glob("zstar-*.i8"))
    assert len(cached) == 1 and cached[0].stat().st_size == len(corpus.tgt) + 4  # the values and their CRC-32
    in_memory = MappedCorpus.from_documents(docs)  # no folder: computed, not cached
    again = MappedExamples(in_memory, "sentence", UnitOptions(), z_star_fields(table, in_memory))
    assert all(np.array_equal(a.extra["z_star"], b.extra["z_star"]) for a, b in zip(examples, again))


def gated_trainer(toy_dir, tmp_path, unit: str = "", **sections) -> tuple:
    """(a Trainer of a 1-layer gated model with pmi_gate_hinge, its PMI table, its codec): the
    table counted on the toy corpus with the run's own vocabulary and saved where the loss reads it."""
    cfg = tiny_config(toy_dir, tmp_path / "run", **sections)
    cfg["model"]["decoder"] = {"type": "gated_transformer", "layers": 1, "heads": 4, "ff": 64}
    if unit:
        cfg["model"]["unit"] = unit
    cfg["loss"] = [{"type": "label_smoothed_ce"}, {"type": "pmi_gate_hinge", "table": str(tmp_path / "pmi.npz")}]
    parsed = config_from_dict(cfg)
    codec = build_codec(parsed.data, parsed.vocab, str(tmp_path / "run"))
    table = build_table(str(toy_dir / "train.src"), str(toy_dir / "train.tgt"), codec)
    table.save(str(tmp_path / "pmi.npz"))
    return Trainer(config_from_dict(cfg), distributed.init_distributed("cpu")), table, codec


def test_z_star_is_a_data_field_cached_with_the_binarized_data(toy_dir, tmp_path):
    """The loss only declares the z_star field; the data pipeline attaches it to the training
    examples (not to validation: the loss is training-only) and caches it in data.cache_dir, in
    the binarized training corpus's folder beside its ids. A field nobody provides is refused by name."""
    cache = tmp_path / "cache"
    trainer, _, codec = gated_trainer(toy_dir, tmp_path, data={"cache_dir": str(cache)})
    assert PMIGateHinge.needs_fields == ("z_star",) and not hasattr(trainer.losses[1], "table")
    assert all(len(e.extra["z_star"]) == len(e.tgt) for e in trainer.train_examples)
    assert sum(int(e.extra["z_star_mask"].sum()) for e in trainer.train_examples) > 0
    assert trainer.valid_examples and all("z_star" not in e.extra for e in trainer.valid_examples)
    assert len(list(cache.glob("*/meta.json"))) == 2  # train, valid
    assert len(list(cache.glob("*/zstar-*.i8"))) == 1  # beside the training corpus's ids
    with pytest.raises(ValueError, match="no provider for field 'z_star_typo'"):
        build_field("z_star_typo", trainer.losses[1].cfg, FieldContext(codec))


def test_the_gate_hinge_trains_from_the_mapped_cache_with_each_examples_z_star(toy_dir, tmp_path):
    """pmi_gate_hinge needs no list of Examples: the training examples stay index arrays over the
    binarized cache (a k_to_k run: targets of two sentences; max_len drops windows), and every
    batch carries, aligned with tgt_out, the z* that eq. 7 gives each of its target sentences
    (computed here with ``z_star`` on the corpus's sentences), 0 at the markup, <eos> and padding."""
    trainer, table, _ = gated_trainer(
        toy_dir, tmp_path, train={"max_steps": 2}, data={"max_len": 12, "context_sentences": 1}, unit="k_to_k"
    )
    examples = trainer.train_examples
    assert isinstance(examples, MappedExamples) and examples.dropped > 0
    docs = examples.corpus.documents()
    z = [z_star(table, [s for s, _ in doc], [t for _, t in doc]) for doc in docs]

    def expected(e: Example) -> Example:  # the example with eq. 7's labels of its target sentences
        parts = z[e.doc][e.first : e.first + e.n_sents]
        z_e = np.concatenate([np.r_[0, x, 0] for x in parts]).astype(np.int8)
        mask = np.concatenate([np.r_[0, np.ones(len(x), np.int8), 0] for x in parts]).astype(np.int8)
        return Example(e.src, e.tgt, e.doc, e.first, e.n_sents, {"z_star": z_e, "z_star_mask": mask})

    assert any(e.n_sents == 2 for e in examples)
    for idx in trainer.sampler.epoch_batches(0)[:8]:
        batch, reference = make_batch(examples, idx), collate([expected(examples[i]) for i in idx], idx)
        assert batch.tgt_out.equal(reference.tgt_out)
        for key in ("z_star", "z_star_mask"):
            assert batch.extra[key].equal(reference.extra[key]), key
    trainer.train()
    assert trainer.step == 2


# ----------------------------------------------------------------------------- training


def test_regularized_gated_model_learns_toy(toy_dir, tmp_path):
    """Bound: a 2+2-layer d=64 model with the hinge loss (λ = 1) after 250 steps: validation
    accuracy > 85%, ppl < 2 (an untrained one: ~0% and ~vocabulary size); the gate mean and
    variance reach the validation metrics and TensorBoard."""
    from test_training import tb_scalars

    run = tmp_path / "run"
    cfg = tiny_config(
        toy_dir,
        run,
        train={"max_steps": 250, "valid_every": 250, "save_every": 250},
        log={"tensorboard": True, "every": 50},
    )
    cfg["model"]["decoder"] = {"type": "gated_transformer", "layers": 2, "heads": 4, "ff": 128}
    cfg["loss"] = [
        {"type": "label_smoothed_ce", "smoothing": 0.1},
        {"type": "pmi_gate_hinge", "weight": 1.0, "table": str(tmp_path / "pmi.npz")},
    ]
    sections = config_from_dict(cfg)
    codec = build_codec(sections.data, sections.vocab, str(run))
    build_table(str(toy_dir / "train.src"), str(toy_dir / "train.tgt"), codec).save(str(tmp_path / "pmi.npz"))
    metrics = train(config_from_dict(cfg))
    assert metrics["acc"] > 85.0 and metrics["ppl"] < 2.0, metrics
    assert 0.0 < metrics["gate/mean"] < 1.0 and 0.0 < metrics["gate/var"] < 0.25, metrics
    tags = set(tb_scalars(run))
    assert {"valid/gate/mean", "valid/gate/var", "train/gate/hinge", "train/gate/wrong"} <= tags, tags


def particle_corpus(out: Path, n: int = 3000, seed: int = 0) -> Path:
    """Source words s0..s9; each translates to one of four variants t<w>v<k>, and variant 0 is
    always followed by a particle p<w> that no source word explains better than t<w>v0 does:
    PMI gives the particles z* = 0 and the translations z* = 1 (about 1 : 4)."""
    rng = np.random.default_rng(seed)
    src, tgt = [], []
    for _ in range(n):
        words = rng.choice(10, rng.integers(3, 7), replace=False)
        variants = rng.integers(0, 4, len(words))
        src.append(" ".join(f"s{w}" for w in words))
        tgt.append(" ".join(f"t{w}v{v}" + (f" p{w}" if v == 0 else "") for w, v in zip(words, variants)))
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.src").write_text("\n".join(src) + "\n", encoding="utf-8")
    (out / "train.tgt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return out


def wrong_side(trainer: Trainer, batches: list) -> dict[int, float]:
    """Per z* class, the share of gate values on the other side of 0.5 (eval mode, fixed batches)."""
    trainer.model.eval()
    wrong, count = torch.zeros(2), torch.zeros(2)
    with torch.no_grad():
        for idx in batches:
            batch = collate([trainer.train_examples[i] for i in idx], idx)
            z, mask = batch.extra["z_star"], batch.extra["z_star_mask"].bool()
            _, per_token = gate_hinge(trainer.model(batch).aux["gates"], z, mask)
            for c in (0, 1):
                wrong[c] += per_token[mask & (z == c)].sum()
                count[c] += (mask & (z == c)).sum()
    assert count.min() > 100
    return {c: float(wrong[c] / count[c]) for c in (0, 1)}


def test_large_lambda_moves_gates_to_the_side_z_star_names(tmp_path):
    """Bound: with λ = 20, 100 steps take the gates of both z* classes from about half on the
    wrong side of 0.5 to under a quarter (measured: ~0.2%; λ = 0 leaves them near half)."""
    data = particle_corpus(tmp_path / "data")
    cfg = tiny_config(
        data,
        tmp_path / "run",
        train={"max_steps": 100, "valid_every": 1000, "save_every": 1000},
        vocab={"subword": "none", "tokenizer": "space"},
    )
    cfg["data"]["valid"] = {}
    cfg["model"]["decoder"] = {"type": "gated_transformer", "layers": 2, "heads": 4, "ff": 128}
    cfg["loss"] = [
        {"type": "label_smoothed_ce"},
        {"type": "pmi_gate_hinge", "weight": 20.0, "table": str(tmp_path / "pmi.npz")},
    ]
    sections = config_from_dict(cfg)
    codec = build_codec(sections.data, sections.vocab, str(tmp_path / "run"))
    build_table(str(data / "train.src"), str(data / "train.tgt"), codec).save(str(tmp_path / "pmi.npz"))
    trainer = Trainer(config_from_dict(cfg), distributed.init_distributed("cpu"))
    particles = [codec.tgt_vocab.stoi[f"p{w}"] for w in range(10)]
    for ex in trainer.train_examples:  # the data pipeline attached eq. 7's labels
        words = ex.extra["z_star_mask"] == 1
        assert np.array_equal(ex.extra["z_star"][words], ~np.isin(ex.tgt[words], particles))
    batches = trainer.sampler.epoch_batches(0)[:10]
    before = wrong_side(trainer, batches)
    trainer.train()
    after = wrong_side(trainer, batches)
    assert min(before.values()) > 0.3 and max(after.values()) < 0.25, (before, after)


def test_gate_analysis_matches_forced_decoding(tmp_path):
    """FER and CER recomputed from the teacher-forced distribution and eq. 7, gate mean and
    variance from the gates themselves (a random model: plenty of both kinds of errors)."""
    model, codec = random_model(gated())
    rng = np.random.default_rng(5)
    for side in ("src", "tgt"):
        lines = [" ".join(f"w{i}" for i in rng.integers(0, 12, rng.integers(2, 9))) for _ in range(40)]
        (tmp_path / f"t.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    src, tgt = str(tmp_path / "t.src"), str(tmp_path / "t.tgt")
    table = build_table(src, tgt, codec, documents=False)
    cfg = config_from_dict({"data": {"documents": False}})
    result = analyse_gates(model, codec, cfg, src, tgt, table, batch_tokens=64)
    s_ids = codec.encode(Path(src).read_text().splitlines(), "src")
    t_ids = codec.encode(Path(tgt).read_text().splitlines(), "tgt")
    batch = collate(
        [Example(mark_sentence(s), mark_sentence(t), i, 0, 1) for i, (s, t) in enumerate(zip(s_ids, t_ids))]
    )
    with torch.no_grad():
        lp = full_log_probs(model, batch)
        gates = model(batch).aux["gates"]
    real = torch.zeros_like(batch.tgt_out, dtype=torch.bool)
    for row, t in enumerate(t_ids):
        real[row, 1 : 1 + len(t)] = True
    pred = lp.argmax(-1)
    errors = (pred != batch.tgt_out) & real
    words = [slice(1, 1 + len(t)) for t in t_ids]
    z_ref = z_star(table, s_ids, t_ids)
    z_pred = z_star(table, s_ids, t_ids, queries=[pred[row, w].numpy() for row, w in enumerate(words)])
    context_errors = sum(
        int((errors[row, w].numpy() & (z_pred[row] != z_ref[row])).sum()) for row, w in enumerate(words)
    )
    assert result["tokens"] == int(real.sum())
    assert result["FER"] == pytest.approx(100.0 * float(errors.sum()) / float(real.sum()))
    assert result["CER"] == pytest.approx(100.0 * context_errors / float(real.sum()))
    assert 0 < context_errors < int(errors.sum())
    kept = gates[:, batch.tgt_in.ne(PAD_ID)].double()
    assert result["gate_mean"] == pytest.approx(float(kept.mean()), abs=1e-6)
    assert result["gate_var"] == pytest.approx(float(kept.var(unbiased=False)), abs=1e-6)


# ----------------------------------------------------------------------------- errors


def tool(name: str):
    """The command's module (``onmt_doc_<name>``; ``tools/<name>.py`` is a wrapper of it)."""
    return importlib.import_module(f"onmt_doc.bin.{name}")


def one_line_error(capsys, code: int, *needles: str) -> None:
    err = capsys.readouterr().err.strip()
    assert code == 1 and "Traceback" not in err and err.splitlines()[-1].count("error:") == 1, err
    for needle in needles:
        assert needle in err.splitlines()[-1], err


@pytest.fixture()
def keep_logging():
    """The tools point the package logger at the (captured) stderr; restore it afterwards."""
    import logging

    handlers = logging.getLogger("onmt_doc").handlers[:]
    yield
    logging.getLogger("onmt_doc").handlers[:] = handlers


def test_tools_report_mistakes_in_one_line(trained_run, toy_dir, tmp_path, capsys, keep_logging):
    build, analysis = tool("build_pmi_table"), tool("gate_analysis")
    config = str(trained_run / "config.yaml")
    one_line_error(capsys, run_command(build._main, ["-config", config]), "-output")
    one_line_error(
        capsys,
        run_command(
            build._main, ["-config", config, "-src", str(tmp_path / "none.en"), "-output", str(tmp_path / "t.npz")]
        ),
        "none.en",
        "not found",
    )
    ckpt = str(trained_run / "checkpoints" / "last.pt")
    test = ["-src", str(toy_dir / "test.src"), "-tgt", str(toy_dir / "test.tgt")]
    one_line_error(
        capsys,
        run_command(analysis._main, ["-model", ckpt, *test, "-table", str(tmp_path / "no.npz")]),
        "no.npz",
        "not found",
    )
    hand_table().save(str(tmp_path / "hand.npz"))
    one_line_error(
        capsys,
        run_command(analysis._main, ["-model", ckpt, *test, "-table", str(tmp_path / "hand.npz")]),
        "hand.npz",
        "other vocabularies",
    )
    (tmp_path / "junk.npz").write_bytes(b"not a table")
    one_line_error(
        capsys,
        run_command(analysis._main, ["-model", ckpt, *test, "-table", str(tmp_path / "junk.npz")]),
        "junk.npz",
        "not a PMI table",
    )


@pytest.mark.parametrize("flag", [[], ["-normaliser", "per_scenario"]])
def test_build_pmi_table_reports_the_share_of_z_star_1(trained_run, toy_dir, tmp_path, capsys, keep_logging, flag):
    """The last line says what the regulariser will push towards, over the counted corpus."""
    build = tool("build_pmi_table")
    out = str(tmp_path / "t.npz")
    assert run_command(build._main, ["-config", str(trained_run / "config.yaml"), "-output", out, *flag]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    m = re.fullmatch(r"z\* = 1 for ([\d.]+)% of ([\d,]+) target tokens \((\w+) normaliser\)", last)
    assert m, last
    normaliser = flag[1] if flag else "shared"
    _, _, codec = load_model(str(trained_run / "checkpoints" / "last.pt"))
    src = codec.encode((toy_dir / "train.src").read_text(encoding="utf-8").splitlines(), "src")
    tgt = codec.encode((toy_dir / "train.tgt").read_text(encoding="utf-8").splitlines(), "tgt")
    ones = sum(int(z.sum()) for z in z_star(PMITable.load(out, codec, normaliser), src, tgt))
    total = sum(len(t) for t in tgt)
    assert m.group(3) == normaliser and int(m.group(2).replace(",", "")) == total
    assert float(m.group(1)) == pytest.approx(100.0 * ones / total, abs=0.05)


def test_training_with_a_missing_or_foreign_table_fails_in_one_line(toy_dir, tmp_path):
    cfg = tiny_config(toy_dir, tmp_path / "run")
    cfg["model"]["decoder"] = {"type": "gated_transformer", "layers": 1, "heads": 4, "ff": 64}
    cfg["loss"] = [{"type": "label_smoothed_ce"}, {"type": "pmi_gate_hinge", "table": str(tmp_path / "pmi.npz")}]
    path = write_config(cfg, tmp_path / "g.yaml")
    train = module_cmd("onmt_doc.bin.train")
    assert_one_line_error(run_cli(*train, "-config", str(path)), "pmi.npz", "not found")
    hand_table().save(str(tmp_path / "hand.npz"))
    assert_one_line_error(
        run_cli(*train, "-config", str(path), f"loss.1.table={tmp_path}/hand.npz"), "hand.npz", "other vocabularies"
    )
