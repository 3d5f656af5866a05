"""Search strategies and length penalties: hand-computed penalties, greedy = beam 1, and every
hypothesis' score is the forced-decoding log-probability of its tokens divided by its penalty."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from model_helpers import N_WORDS, random_batch, random_model
from test_decoding import SIZES, TRANSFORMER
from test_g_transformer import G, doc_batch
from test_hm_gdc import BOTH, context_batch, random_docs

from onmt_doc import devices
from onmt_doc.bin.translate import _parser
from onmt_doc.config import ConfigError, TranslateConfig, config_from_dict
from onmt_doc.contracts import LengthLimit
from onmt_doc.data.batching import collate
from onmt_doc.data.instances import Example, mark_sentence
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, PAD_ID, SPECIALS
from onmt_doc.models.model import full_log_probs
from onmt_doc.registry import registry_for
from onmt_doc.translate.length_penalty import AveragePenalty, GNMTPenalty, NoPenalty, build_length_penalty
from onmt_doc.translate.search import BeamSearch, GreedySearch, Search, build_search, fill_holes

PENALTIES = {"gnmt_0.6": GNMTPenalty(0.6), "avg": AveragePenalty(), "none": NoPenalty()}


# ------------------------------------------------------------------------------ length penalties
@pytest.mark.parametrize(
    "penalty, length, expected",
    [
        (GNMTPenalty(1.0), 1, 1.0),  # (5 + 1) / 6
        (GNMTPenalty(1.0), 7, 2.0),  # (5 + 7) / 6
        (GNMTPenalty(0.6), 7, 2.0**0.6),  # 1.5157…
        (GNMTPenalty(2.0), 10, 6.25),  # (15 / 6)^2
        (GNMTPenalty(0.0), 10, 1.0),  # alpha 0: no penalty
        (AveragePenalty(), 7, 7.0),
        (NoPenalty(), 7, 1.0),
    ],
)
def test_length_penalties_against_hand_computed_values(penalty, length, expected):
    assert float(penalty(torch.tensor(float(length)))) == pytest.approx(expected, rel=1e-6)


def test_length_penalties_are_elementwise_and_leave_their_input_alone():
    lengths = torch.tensor([1.0, 7.0, 19.0])
    for penalty in PENALTIES.values():
        out = penalty(lengths)
        assert out.shape == lengths.shape and out.dtype == lengths.dtype
        assert torch.equal(lengths, torch.tensor([1.0, 7.0, 19.0]))
    assert torch.allclose(GNMTPenalty(1.0)(lengths), torch.tensor([1.0, 2.0, 4.0]))


def test_build_length_penalty_by_name():
    assert build_length_penalty("gnmt", 0.6) == GNMTPenalty(0.6)
    assert build_length_penalty("avg", 0.6) == AveragePenalty()
    assert build_length_penalty("none", 0.6) == NoPenalty()
    with pytest.raises(ValueError, match="wu"):
        build_length_penalty("wu")


# ------------------------------------------------------------------------------ configuration
def test_build_search_follows_the_translate_section():
    greedy = build_search(TranslateConfig(beam=1, length_penalty=0.3))
    assert isinstance(greedy, GreedySearch) and greedy.n_best == 1 and greedy.penalty == GNMTPenalty(0.3)
    beam = build_search(TranslateConfig(beam=4, n_best=2, length_penalty_type="avg", max_length=9))
    assert isinstance(beam, BeamSearch) and (beam.beam, beam.n_best) == (4, 2)
    assert beam.penalty == AveragePenalty() and beam.limit.max_length == 9


def test_strategies_and_penalties_are_registries_with_suggestions():
    assert registry_for("search").names() == ["beam", "greedy", "sampling"]
    assert registry_for("length_penalty").names() == ["avg", "gnmt", "none"]
    assert registry_for("search").get("greedy").cls is GreedySearch
    assert registry_for("length_penalty").get("avg").cls is AveragePenalty
    with pytest.raises(ConfigError, match=r"translate.strategy: unknown search type 'beem' \(did you mean 'beam'\?\)"):
        build_search(TranslateConfig(strategy="beem"))
    with pytest.raises(ValueError, match=r"unknown length penalty type 'gmnt' \(did you mean 'gnmt'\?\)"):
        build_length_penalty("gmnt")


def test_length_penalty_type_is_checked_and_has_a_flag():
    assert config_from_dict({"translate": {"length_penalty_type": "none"}}).translate.length_penalty_type == "none"
    with pytest.raises(ConfigError, match="length_penalty_type"):
        config_from_dict({"translate": {"length_penalty_type": "wu"}})
    args = _parser().parse_args(["-model", "m.pt", "-src", "-", "-length_penalty_type", "avg"])
    assert args.length_penalty_type == "avg"


# ------------------------------------------------------------------------------ greedy = beam 1
CASES = {
    "transformer": (TRANSFORMER, lambda: random_batch(SIZES * 2, seed=1)),
    "g_transformer": (G, lambda: doc_batch(seed=5)),
    "hm_gdc": (BOTH, lambda: context_batch(random_docs([3, 1, 4], seed=5))),
}


@pytest.mark.parametrize("name", CASES)
def test_greedy_equals_beam_one(name, device):
    """Greedy keeps the argmax; beam 1 keeps the best candidate not ending in ``<eos>`` and stops
    when the best does: the same tokens, scores and log-probabilities, bit for bit."""
    section, make_batch = CASES[name]
    for seed in (0, 1):
        model, _ = random_model(section, seed=seed, device=device)
        batch = make_batch().to(device)
        greedy = GreedySearch(penalty=GNMTPenalty(0.6), max_len_ratio=1.0, max_len_add=4).search(model, batch)
        beam = BeamSearch(beam=1, penalty=GNMTPenalty(0.6), max_len_ratio=1.0, max_len_add=4).search(model, batch)
        as_tuples = [[(h.tokens, h.score, h.log_prob) for h in hyps] for hyps in greedy]
        assert as_tuples == [[(h.tokens, h.score, h.log_prob) for h in hyps] for hyps in beam]
        assert all(len(hyps) == 1 for hyps in greedy)


# ------------------------------------------------------------------------------ scores = forced decoding
def ending_model(seed: int, bias: float = 3.0, device=None):
    """A random Transformer whose ``</s>`` and ``<eos>`` logits are raised, so hypotheses end at
    many lengths (an untrained model otherwise runs to the length cap) and the penalty decides the
    ranking (``<eos>`` follows ``</s>``: the search forces it there and allows it nowhere else)."""
    model, _ = random_model(TRANSFORMER, seed=seed, device=device)
    with torch.no_grad():
        model.generator.bias[[EOS_SENT_ID, EOS_ID]] += bias
    return model


def forced_log_probs(model, sources: list[np.ndarray], targets: list[list[int]], sentences: list[int]) -> list[float]:
    """Teacher-forced log-probability of each target (``<eos>`` appended) given its source, on the
    model's device."""
    examples = [
        Example(src, np.array(tgt, dtype=np.int64), i, 0, n)
        for i, (src, tgt, n) in enumerate(zip(sources, targets, sentences))
    ]
    batch = collate(examples, np.arange(len(examples))).to(next(model.parameters()).device)
    with torch.no_grad():
        lp = full_log_probs(model, batch).gather(2, batch.tgt_out[..., None]).squeeze(2)
    return lp.masked_fill(batch.tgt_out.eq(PAD_ID), 0.0).sum(1).tolist()


def check_scores_are_forced_scores(search: Search, model, batch, sentences: list[int]) -> None:
    results = search.search(model, batch)
    assert len(results) == batch.size
    flat = [(row, h) for row, hyps in enumerate(results) for h in hyps]
    sources = [batch.src[row][batch.src[row].ne(PAD_ID)].cpu().numpy() for row, _ in flat]
    forced = forced_log_probs(model, sources, [h.tokens for _, h in flat], [sentences[row] for row, _ in flat])
    for (row, h), lp in zip(flat, forced):
        assert EOS_ID not in h.tokens
        assert h.log_prob == pytest.approx(lp, abs=1e-4)
        assert h.score == pytest.approx(h.log_prob / float(search.penalty(torch.tensor(len(h.tokens) + 1.0))), rel=1e-6)
    for hyps in results:
        assert 1 <= len(hyps) <= search.n_best
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


@pytest.mark.parametrize("penalty", PENALTIES)
def test_beam_scores_are_penalized_forced_scores(penalty, device):
    model = ending_model(seed=2, device=device)
    batch = random_batch(SIZES, seed=6, device=device)
    search = BeamSearch(beam=4, n_best=4, penalty=PENALTIES[penalty], max_len_ratio=1.0, max_len_add=4)
    check_scores_are_forced_scores(search, model, batch, [1] * batch.size)


def test_greedy_scores_are_penalized_forced_scores(device):
    model = ending_model(seed=4, bias=2.0, device=device)
    batch = random_batch(SIZES, seed=3, device=device)
    search = GreedySearch(penalty=AveragePenalty(), max_len_ratio=1.0, max_len_add=4)
    check_scores_are_forced_scores(search, model, batch, [1] * batch.size)


def test_document_beam_scores_are_penalized_forced_scores(device):
    """G-Transformer: whole documents, with the decoder's own structure rules."""
    model, _ = random_model(G, seed=1, device=device)
    batch = doc_batch(seed=3).to(device)
    search = BeamSearch(beam=3, n_best=3, penalty=GNMTPenalty(1.0), max_len_ratio=1.0, max_len_add=2)
    check_scores_are_forced_scores(search, model, batch, [int(n) for n in batch.src_groups.max(1).values])


def test_the_penalty_only_reranks_finished_hypotheses(device):
    """The search runs on raw log-probabilities, so every penalty draws from the same finished
    hypotheses: one that another penalty returned but this one did not scores no better, under
    this penalty, than the ones it returned. Raw scores favour the short ones, ``avg`` the long."""
    model = ending_model(seed=1, device=device)
    batch = random_batch(SIZES, seed=1, device=device)
    runs = {
        name: BeamSearch(beam=5, n_best=3, penalty=p, max_len_ratio=1.5, max_len_add=6).search(model, batch)
        for name, p in PENALTIES.items()
    }
    for row in range(batch.size):
        pool = {tuple(h.tokens): h.log_prob for hyps in runs.values() for h in hyps[row]}
        for name, penalty in PENALTIES.items():
            returned = {tuple(h.tokens) for h in runs[name][row]}
            worst = min(h.score for h in runs[name][row])
            for tokens, log_prob in pool.items():
                if tokens not in returned:
                    assert log_prob / float(penalty(torch.tensor(len(tokens) + 1.0))) <= worst + 1e-6
        assert [h.score for h in runs["none"][row]] == [h.log_prob for h in runs["none"][row]]
    best = [(len(runs["none"][row][0].tokens), len(runs["avg"][row][0].tokens)) for row in range(batch.size)]
    assert all(raw <= avg for raw, avg in best) and any(raw < avg for raw, avg in best)


# ------------------------------------------------------------------------------ batch composition
@pytest.mark.parametrize(
    "done, expected",
    [
        ([True, False, False, True, False, False], [4, 1, 2, 5]),  # holes 0 and 3 take the last two
        ([False, False, True], [0, 1]),  # the last finished: nothing moves
        ([True, True, False], [2]),
        ([False, True, False, True, False], [0, 4, 2]),
    ],
)
def test_pruning_moves_the_last_sentences_into_the_places_of_finished_ones(done, expected):
    assert fill_holes(torch.tensor(done)).tolist() == expected


ALONE_CASES = {
    "transformer": (TRANSFORMER, lambda: random_batch(SIZES * 3, seed=3)),
    "gated_transformer": (
        {**TRANSFORMER, "decoder": {"type": "gated_transformer", "layers": 2, "heads": 4, "ff": 64}},
        lambda: random_batch(SIZES * 3, seed=3),
    ),
    "mhplstm": (
        {**TRANSFORMER, "decoder": {"type": "mhplstm", "layers": 2, "heads": 4, "ff": 64}},
        lambda: random_batch(SIZES * 3, seed=3),
    ),
    "reformer": (
        {"encoder": {"type": "embedding"}, "decoder": {"type": "reformer", "layers": 2, "heads": 4, "ff": 64}},
        lambda: random_batch(SIZES * 3, seed=3),
    ),
    "g_transformer": (G, lambda: doc_batch([[(3, 3)], [(2, 2), (5, 5), (1, 1)], [(4, 4), (2, 2)], [(6, 6)]], seed=2)),
}


def row_alone(batch, i: int):
    """Row ``i`` of ``batch`` as a batch of its own, without padding."""
    n = int(batch.src[i].ne(PAD_ID).sum())
    return type(batch)(src=batch.src[i : i + 1, :n], src_groups=batch.src_groups[i : i + 1, :n])


@pytest.mark.parametrize("name", ALONE_CASES)
@pytest.mark.parametrize("n_best", [1, 2])
def test_every_decoder_translates_a_row_as_if_it_were_alone(name, n_best, device):
    """Rows that finish early leave the batch and the others go on from a reordered state: the
    n-best lists of every row equal those of the row searched alone, for every decoder."""
    section, make_batch = ALONE_CASES[name]
    model, _ = random_model(section, seed=4, device=device)
    batch = make_batch().to(device)
    search = BeamSearch(beam=3, n_best=n_best, penalty=AveragePenalty(), max_len_ratio=1.5, max_len_add=3)
    with torch.no_grad():
        together = search.search(model, batch)
        alone = [search.search(model, row_alone(batch, i))[0] for i in range(batch.size)]
    assert [[h.tokens for h in hyps] for hyps in together] == [[h.tokens for h in hyps] for hyps in alone]
    for hyps, ref in zip(together, alone):
        assert np.allclose([h.score for h in hyps], [h.score for h in ref], atol=1e-4)
    lengths = {len(hyps[0].tokens) for hyps in together}
    assert len(lengths) > 2  # sentences do finish at different steps


def shared_source_batch(name: str, rows: int = 6, seed: int = 5):
    """``rows`` examples with one source and different targets, as the beams of one sentence (or
    one G-Transformer instance) hold different hypotheses."""
    rng = np.random.default_rng(seed)

    def words(n: int) -> np.ndarray:
        return mark_sentence(rng.integers(len(SPECIALS), len(SPECIALS) + N_WORDS, n))

    if name == "g_transformer":
        src = np.concatenate([words(n) for n in (3, 5, 2)])
        tgts = [np.concatenate([words(int(n)) for n in rng.integers(1, 6, 3)]) for _ in range(rows)]
        examples = [Example(src, tgt, i, 0, 3) for i, tgt in enumerate(tgts)]
    else:
        src = words(5)
        examples = [Example(src, words(int(rng.integers(2, 8))), i, 0, 1) for i in range(rows)]
    return collate(examples, np.arange(rows))


@pytest.mark.parametrize("name", ALONE_CASES)
def test_beam_reorders_that_copy_and_swap_rows_keep_every_row_exact(name, device):
    """At every step a few rows move inside the beam (one copied over another, or swapped) and the
    rest stay, as in a long beam search; caches in ``owned_fields`` are then rewritten in place,
    only where rows move. Each row goes on exactly as the teacher-forced pass of the history it now
    holds (1e-5). The moves are drawn on the CPU (the same on every device)."""
    section, _ = ALONE_CASES[name]
    model, _ = random_model(section, seed=4, device=device)
    batch = shared_source_batch(name).to(device)
    n, gen = batch.size, torch.Generator().manual_seed(0)
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        state = model.init_state(model.encode(batch), batch)
        origin, steps = torch.arange(n, device=device), []  # origin: the example whose history each row holds
        for t in range(batch.tgt_in.size(1)):
            if t:
                index = torch.arange(n)
                index[torch.randperm(n, generator=gen)[:2]] = torch.randint(n, (2,), generator=gen)
                index = index.to(device)
                state, origin = state.reorder(index, same_sources=True), origin[index]
            log_probs, state = model.step(batch.tgt_in[origin, t], state)
            steps.append((t, origin, log_probs))
    assert len({tuple(o.tolist()) for _, o, _ in steps}) > 5  # the rows did move
    for t, rows, log_probs in steps:
        real = batch.tgt_out[rows, t].ne(PAD_ID)
        assert torch.allclose(log_probs[real], forced[rows, t][real], atol=1e-5), (name, t)


def test_beam_search_reads_the_device_only_where_candidates_end():
    """On the fused (GPU) path a step's flags are read in one transfer, which no operator counts; the
    only other reads are the rows of candidates that end (one ``nonzero`` on such a step). It read
    ~9 values a step before (`.any()` three times, a Python list of finished counts, ``fill_holes``'
    sizes, a forcing check, the reorder's moved rows)."""
    from onmt_doc import devices
    from onmt_doc.train.host_syncs import OpCounter

    model, _ = random_model(TRANSFORMER)
    batch = random_batch([(5, 7), (9, 3), (2, 6), (7, 7)])
    search = BeamSearch(beam=4, n_best=2, max_len_ratio=1.0, max_len_add=5)
    with devices.forced_path("fused"), OpCounter() as ops:
        hyps = search.search(model, batch)
    assert set(ops.sync_ops) <= {"aten.nonzero"}
    assert ops.syncs <= sum(len(h) for h in hyps)  # at most one read per finished hypothesis
    with devices.forced_path("fused"):
        fused_hyps = search.search(model, batch)
    with devices.forced_path("packed"):
        packed_hyps = search.search(model, batch)
    assert [[(h.tokens, h.score) for h in row] for row in fused_hyps] == [
        [(h.tokens, h.score) for h in row] for row in packed_hyps
    ]


def test_the_self_attention_caches_are_allocated_once_per_search_on_the_fused_path():
    """On the fused (GPU) path a sentence Transformer's caches hold the search's longest output from
    the first step and are written in place: no step allocates them again (they grew by
    concatenation, one copy a step). On the packed (CPU) path they are the prefix itself: CPU
    attention copies a strided prefix to contiguous memory anyway, and full-size caches made every
    reorder move more (CPU translation 1.2x slower, docs/benchmarks.md). Stepwise = teacher-forced
    is tests/test_decoding.py's, on both paths."""
    model, _ = random_model(TRANSFORMER)
    batch = random_batch([(5, 7), (9, 3)])
    limit = LengthLimit(ratio=1.0, add=5)
    for path in ("fused", "packed"):
        with devices.forced_path(path):
            state = model.init_state(model.encode(batch), batch, limit)
            storages = []
            for step in range(6):
                _, state = model.step(torch.full((2,), BOS_ID if step == 0 else len(SPECIALS)), state)
                k, v = state.self_kv[0]
                storages.append((k.untyped_storage().data_ptr(), v.untyped_storage().data_ptr(), k.size(2)))
        if path == "fused":
            assert len(set(storages)) == 1  # one allocation, at the first step
            assert storages[0][2] >= 9 + 5 + 1  # room for the longest source's output and <bos>
        else:
            assert [s[2] for s in storages] == [1, 2, 3, 4, 5, 6]


def test_a_reorder_moves_the_filled_slots_of_caches_allocated_ahead():
    """A state whose caches are allocated ahead (``filled_slots``) reorders the slots that hold
    values as a gather would, and leaves the rest alone (on the fused path it had moved every slot:
    twice the work at mid-output, more early on)."""
    model, _ = random_model(TRANSFORMER)
    batch = random_batch([(5, 7), (9, 3), (4, 4)])
    index = torch.tensor([2, 0, 0])
    with devices.forced_path("fused"), torch.no_grad():
        state = model.init_state(model.encode(batch), batch, LengthLimit(ratio=1.0, add=5))
        for step in range(4):
            _, state = model.step(torch.full((3,), BOS_ID if step == 0 else len(SPECIALS) + step), state)
        k = state.self_kv[0][0]
        k[:, :, state.step :] = torch.arange(3.0)[:, None, None, None]  # slots no step wrote: left alone
        before = k.clone()
        state.reorder(index)
    after = state.self_kv[0][0]
    assert state.filled_slots("self_kv") == 4 and after.size(2) > 4
    assert torch.equal(after[:, :, :4], before[:, :, :4].index_select(0, index))
    assert torch.equal(after[:, :, 4:], before[:, :, 4:])


@pytest.mark.parametrize("name", ["transformer", "g_transformer"])
def test_a_search_step_makes_no_tensor_from_host_data(name):
    """A tensor made from Python data (``torch.tensor([...], device=...)``) is, on a GPU, a blocking
    copy from host memory: the host waits until the device has done everything queued. The search's
    forbidden-token list and the G-Transformer's non-word list were made at every step, so every
    decoding step of every model waited for the GPU, whatever ``read_every`` saved. Now such tensors
    are made only where the search reads the device anyway (collecting ended hypotheses)."""
    from onmt_doc.train.host_syncs import OpCounter

    section, make_batch = CASES[name]
    model, _ = random_model(section)
    batch = make_batch()
    search = BeamSearch(beam=3, max_len_ratio=1.0, max_len_add=5)
    with devices.forced_path("fused"), OpCounter() as ops:
        search.search(model, batch)
    steps = ops.names["aten.topk"]  # one per step
    assert steps > 8
    assert ops.host_data <= 2 * search.device_reads < steps


# ------------------------------------------------------------------------------ reading the device every k steps
def _outputs(hyps):
    return [[(h.tokens, h.score, h.log_prob) for h in row] for row in hyps]


def assert_same_hypotheses(got, expected):
    """The same tokens, and scores equal to float32 rounding (a batch that holds other rows may
    round a row's sums differently: the packed path buckets rows by length)."""
    assert [[h[0] for h in row] for row in got] == [[h[0] for h in row] for row in expected]
    numbers = [[h[1:] for h in row] for row in got], [[h[1:] for h in row] for row in expected]
    assert np.allclose(*(np.array([x for row in side for h in row for x in h]) for side in numbers), rtol=1e-6)


READ_CASES = {**ALONE_CASES, "hm_gdc": CASES["hm_gdc"]}


@pytest.mark.parametrize("name", READ_CASES)
@pytest.mark.parametrize("n_best", [1, 2])
@pytest.mark.parametrize("path", ["packed", "fused"])
def test_reading_the_device_every_k_steps_changes_no_output(name, n_best, path, device):
    """``translate.read_every`` k > 1 keeps finished sentences in the batch, masked, and collects
    ended candidates k steps late: every decoder, on either kernel path, gives the same hypotheses,
    scores and log-probabilities as reading every step, and waits for the device less often (the
    fused path's G-Transformer wrote a finished row's token past its sentence cache)."""
    from onmt_doc import devices

    section, make_batch = READ_CASES[name]
    model, _ = random_model(section, seed=4, device=device)
    batch = make_batch().to(device)
    searches = {k: BeamSearch(beam=3, n_best=n_best, penalty=AveragePenalty(), max_len_ratio=1.5, max_len_add=3,
                              read_every=k) for k in (1, 2, 5, 64)}  # fmt: skip
    with devices.forced_path(path):
        outputs = {k: _outputs(s.search(model, batch)) for k, s in searches.items()}
    for k in (2, 5, 64):
        assert_same_hypotheses(outputs[k], outputs[1])
    assert len({len(row[0][0]) for row in outputs[1]}) > 2  # sentences finish at different steps
    reads = {k: s.device_reads for k, s in searches.items()}
    assert reads[64] < reads[5] < reads[1]


def test_reading_late_keeps_forced_prefixes_and_greedy_exact(device):
    """The late reads with a forced target prefix (its log-probability is subtracted at collection,
    after the prefix's rows may have moved) and with greedy search (one row per sentence)."""
    model = ending_model(seed=7, bias=2.0, device=device)
    batch = random_batch(SIZES * 2, seed=6).to(device)
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, batch.size)
    words = [rng.integers(len(SPECIALS), len(SPECIALS) + N_WORDS, int(n)).tolist() for n in lengths]
    prefix = torch.full((batch.size, 5), PAD_ID, dtype=torch.long)
    for i, w in enumerate(words):
        prefix[i, : len(w) + 1] = torch.tensor([SPECIALS.index("<s>"), *w])
    prefix = prefix.to(device)
    for make in (lambda k: BeamSearch(beam=4, n_best=3, max_len_ratio=1.0, max_len_add=6, read_every=k),
                 lambda k: GreedySearch(max_len_ratio=1.0, max_len_add=6, read_every=k)):  # fmt: skip
        every_step = _outputs(make(1).search(model, batch, prefix=prefix))
        assert_same_hypotheses(_outputs(make(3).search(model, batch, prefix=prefix)), every_step)
        assert_same_hypotheses(_outputs(make(8).search(model, batch)), _outputs(make(1).search(model, batch)))
        assert all(row[0][0][: len(w) + 1] == [SPECIALS.index("<s>"), *w] for row, w in zip(every_step, words))


def test_read_every_defaults_per_device_and_sampling_reads_every_step():
    """0 = every step on the packed (CPU) path, FUSED_READ_EVERY on the fused (GPU) path; sampling
    always reads every step (a finished row left in the batch would draw and change later draws),
    and asking it for more is a config error, not a silently ignored key."""
    from onmt_doc import devices
    from onmt_doc.translate.search import FUSED_READ_EVERY, SamplingSearch

    cpu = torch.device("cpu")
    assert BeamSearch().read_interval(cpu) == 1 and BeamSearch(read_every=4).read_interval(cpu) == 4
    with devices.forced_path("fused"):
        assert BeamSearch().read_interval(cpu) == FUSED_READ_EVERY > 1
        assert SamplingSearch().read_interval(cpu) == 1
    assert build_search(TranslateConfig(read_every=6)).read_interval(cpu) == 6
    with pytest.raises(ConfigError, match="read_every"):
        config_from_dict({"translate": {"strategy": "sampling", "read_every": 4}})
    with pytest.raises(ConfigError, match="read_every"):
        config_from_dict({"translate": {"read_every": 65}})
    assert _parser().parse_args(["-model", "m.pt", "-src", "-", "-read_every", "4"]).read_every == 4
    assert _parser().parse_args(["-model", "m.pt", "-src", "-", "-compile", "auto"]).compile == "auto"
    assert build_search(TranslateConfig(compile="on")).compile == "on"


def _compile_batches(name: str) -> list:
    """Batches of different sizes for the compiled-step test below."""
    rng = np.random.default_rng(1)
    if name == "hm_gdc":
        return [
            context_batch(random_docs(sizes, seed=s)) for s, sizes in enumerate([[3, 1, 4], [2, 5], [4, 4, 1], [2, 3]])
        ]
    batches = [random_batch(SIZES * k, seed=k) for k in (1, 2, 3)]
    return batches + [random_batch([(int(n), 3) for n in rng.integers(2, 12, rows)], seed=rows) for rows in (5, 13, 7)]


@pytest.mark.parametrize("name", ["transformer", "hm_gdc"])
def test_a_compiled_decoding_step_gives_the_same_output_and_compiles_a_few_times(name, monkeypatch):
    """``translate.compile``: the search steps ``torch.compile(model.step)`` (dynamic shapes), here on the
    fused path. The outputs equal eager decoding, and after three searches have compiled the step a few
    times (its first step, the beam's widening, the cache's last slot) further batches compile nothing
    more: the sentence Transformer's position is written into its caches with ``index_copy_``, so no
    guard is on the step number (before, an indexed assignment specialised it: every step recompiled
    until torch's limit of 8, then ran eagerly), and sizes that happen to be equal are not unified
    (duck shaping off: HM-GDC reached the limit on these batches). torch's ``aot_eager`` backend here:
    the same graphs as inductor without generating kernels."""
    from torch._dynamo.utils import counters

    from onmt_doc import devices

    monkeypatch.setattr(devices, "COMPILE_BACKEND", "aot_eager")
    section = {"transformer": TRANSFORMER, "hm_gdc": BOTH}[name]
    model, _ = random_model(section, seed=2)
    batches = _compile_batches(name)
    eager = BeamSearch(beam=3, n_best=2, max_len_ratio=1.5, max_len_add=4)
    compiled = BeamSearch(beam=3, n_best=2, max_len_ratio=1.5, max_len_add=4, compile="on")
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    with devices.forced_path("fused"):
        for batch in batches:
            assert_same_hypotheses(_outputs(compiled.search(model, batch)), _outputs(eager.search(model, batch)))
            graphs.append(counters["stats"]["unique_graphs"])
    frames = dict(counters["frames"])
    torch._dynamo.reset()
    assert graphs[-1] <= 5 and graphs[-1] == graphs[2], graphs
    assert frames["total"] == frames["ok"]  # no frame fell back to eager (torch's limit of 8 compilations)


def test_no_two_fields_of_a_fresh_g_transformer_state_are_one_tensor():
    """torch.compile guards on which inputs alias: a compiled G-Transformer step met the state's first
    step with four counters as one tensor and its later steps with none, and torch failed while
    explaining the recompilation (a TypeError, with a batch of one row after larger ones). Each
    field is a tensor of its own (the compiled search itself: session 10's closing note)."""
    model, _ = random_model(G)
    batch = doc_batch()
    state = model.init_state(model.encode(batch), batch, LengthLimit(1.0, 5))
    tensors = [(f.name, getattr(state, f.name)) for f in dataclasses.fields(state)]
    storages = [(name, t.untyped_storage().data_ptr()) for name, t in tensors if isinstance(t, torch.Tensor)]
    assert len({ptr for _, ptr in storages}) == len(storages), storages
