"""HM-GDC: hierarchical document encoder, DocEnc–Decoder attention, context-unit data and decoding."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import init_from_run, make_trainer, tiny_config
from model_helpers import N_WORDS, assert_forced_scores_keep_breaks, random_model
from test_decoding import assert_stepwise_matches

from onmt_doc import devices
from onmt_doc.config import config_from_dict
from onmt_doc.contracts import LengthLimit
from onmt_doc.data.batching import collate, example_lengths, ordered_batches, token_batches
from onmt_doc.data.mapped import build_instances
from onmt_doc.data.vocab import BOS_ID, PAD_ID, SOS_ID, SPECIALS
from onmt_doc.encoders.hierarchical import own_sentence_context
from onmt_doc.errors import ConfigError
from onmt_doc.evaluation.corpus_metrics import report
from onmt_doc.models.checkpoint import load_model
from onmt_doc.models.model import full_log_probs
from onmt_doc.modules import row_buckets
from onmt_doc.modules.attention import MultiHeadAttention, attention_probs
from onmt_doc.modules.document_packing import attend_documents, document_memory, plan_packing
from onmt_doc.modules.row_buckets import bucket_rows, unbucket
from onmt_doc.train.trainer import train
from onmt_doc.translate.search import BeamSearch
from onmt_doc.translate.translator import Translator

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

ENC = {"type": "hierarchical", "layers": 2, "heads": 4, "ff": 64, "doc_layers": 1}
DEC = {"type": "doc_context", "layers": 2, "heads": 4, "ff": 64}
BOTH = {"encoder": ENC, "decoder": DEC}
DECODER_ONLY = {"encoder": {**ENC, "word_context": False}, "decoder": DEC}
ENCODER_ONLY = {"encoder": ENC, "decoder": {"type": "transformer", "layers": 2, "heads": 4, "ff": 64}}
POST_NORM = {
    "encoder": {**ENC, "pre_norm": False, "share_attention": False, "pooling": "max"},
    "decoder": {**DEC, "pre_norm": False},
}
# the readings of eqs. 5-6 and 8-9 (the defaults: encoder own_sentence, decoder document)
DOCUMENT = {"encoder": {**ENC, "context": "document"}, "decoder": DEC}
DOCUMENT_DECODER_ONLY = {"encoder": {**ENC, "context": "document", "word_context": False}, "decoder": DEC}
OWN_DECODER = {"encoder": ENC, "decoder": {**DEC, "context": "own_sentence"}}
OWN_DECODER_ONLY = {"encoder": {**ENC, "word_context": False}, "decoder": {**DEC, "context": "own_sentence"}}
VARIANTS = {
    "both": BOTH,
    "decoder_only": DECODER_ONLY,
    "encoder_only": ENCODER_ONLY,
    "post_norm": POST_NORM,
    "document": DOCUMENT,
    "document_decoder_only": DOCUMENT_DECODER_ONLY,
    "own_decoder": OWN_DECODER,
    "own_decoder_only": OWN_DECODER_ONLY,
}


def random_docs(sizes, seed=0):
    """Documents of (src, tgt) word-id pairs; ``sizes`` = sentences per document."""
    rng = np.random.default_rng(seed)
    first = len(SPECIALS)

    def sent():
        return rng.integers(first, first + N_WORDS, int(rng.integers(1, 8)))

    return [[(sent(), sent()) for _ in range(n)] for n in sizes]


def context_batch(docs, max_sentences=0):
    examples, _ = build_instances("context", docs, max_sentences=max_sentences)
    return collate(examples, np.arange(len(examples)))


def sentence_log_probs(model, batch) -> list[torch.Tensor]:
    """Teacher-forced log-probabilities of every row's real target tokens."""
    with torch.no_grad():
        lp = full_log_probs(model, batch).gather(2, batch.tgt_out[..., None]).squeeze(2)
    return [lp[r][batch.tgt_out[r].ne(PAD_ID)] for r in range(batch.size)]


# ----------------------------------------------------------------------------- data


def test_context_instances_are_windows_of_whole_sentences():
    docs = random_docs([5, 2, 1])
    examples, dropped = build_instances("context", docs, max_sentences=2)
    assert dropped == 0
    assert [(e.doc, e.first, e.n_sents) for e in examples] == [(0, 0, 2), (0, 2, 2), (0, 4, 1), (1, 0, 2), (2, 0, 1)]
    batch = collate(examples, np.arange(len(examples)))
    assert batch.size == 8 and batch.doc_index.tolist() == [0, 0, 1, 1, 2, 3, 3, 4]
    assert batch.first_sent.tolist() == [0, 1, 2, 3, 4, 0, 1, 0]
    for row, (d, j) in enumerate([(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (2, 0)]):
        src, tgt = docs[d][j]
        assert batch.src[row][batch.src[row].ne(PAD_ID)].tolist()[1:-1] == src.tolist()
        assert batch.tgt_out[row][batch.tgt_out[row].ne(PAD_ID)].tolist()[1:-2] == tgt.tolist()
    whole, _ = build_instances("context", docs)
    assert [e.n_sents for e in whole] == [5, 2, 1]


def test_context_windows_with_a_long_pair_are_dropped_whole_and_counted():
    docs = random_docs([4])
    docs[0][1] = (np.arange(len(SPECIALS), len(SPECIALS) + 30), docs[0][1][1])
    examples, dropped = build_instances("context", docs, max_sentences=2, max_len=20)
    assert dropped == 2 and [(e.first, e.n_sents) for e in examples] == [(2, 2)]


def test_context_batches_count_the_real_length_of_every_sentence_row_against_the_budget():
    """The model computes rows in length buckets, so the budget bounds the rows' summed real
    lengths (max of source and target with <bos>/<eos>), not rows x the longest row."""
    examples, _ = build_instances("context", random_docs([6, 3, 3, 1, 1, 6, 2], seed=1))
    lengths = example_lengths(examples)
    budget = 60
    batches = token_batches(lengths.sort_order(), lengths, budget)
    for k, idx in enumerate(batches):
        batch = collate([examples[i] for i in idx], idx)
        real = torch.maximum(batch.src.ne(PAD_ID).sum(1), batch.tgt_out.ne(PAD_ID).sum(1)).sum()
        assert real <= budget or len(idx) == 1
        if k + 1 < len(batches):  # full: the next window would not have fitted
            nxt = examples[batches[k + 1][0]]
            assert real + np.maximum(nxt.sent_lens[:, 0], nxt.sent_lens[:, 1] + 1).sum() > budget
        src_only = batch.src.ne(PAD_ID).sum()
        assert src_only == sum(examples[i].sent_lens[:, 0].sum() for i in idx)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(examples)))
    assert any(len(idx) > 1 for idx in batches)  # several windows share a batch
    by_source = token_batches(lengths.sort_order(by_source_only=True), lengths, budget, by_source_only=True)
    for idx in by_source:
        assert sum(examples[i].sent_lens[:, 0].sum() for i in idx) <= budget or len(idx) == 1
    # windows of one size are batched together (little padding in per-document attention)
    sizes = [[examples[i].n_sents for i in idx] for idx in ordered_batches(examples, 10**6)]
    assert sizes == [sorted(s) for s in sizes]


# ----------------------------------------------------------------------------- packing


def test_packing_round_trip_keeps_rows_in_their_document():
    row_doc = torch.tensor([1, 0, 1, 2, 0, 1])
    keep = torch.rand(6, 4).gt(0.3)
    keep[:, 0] = True
    x = torch.randn(6, 4, 3)
    p = plan_packing(row_doc, 3, 4, keep)
    packed = p.pack(x)
    for d in range(3):
        expected = torch.cat([x[r][keep[r]] for r in range(6) if row_doc[r] == d])
        n = expected.size(0)
        assert torch.equal(packed[d, :n], expected) and not p.padding()[d, :n].any()
        assert p.padding()[d, n:].all() and packed[d, n:].eq(0).all()
    assert torch.equal(p.unpack(packed), x * keep[..., None])


def test_attend_documents_equals_a_loop_over_rows():
    """Each row's queries attend to its own document's keys only, as an explicit per-row loop."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, 0.0, self_attention=False).eval()
    row_doc = torch.tensor([2, 0, 2, 1, 0, 2])
    memory, pad = torch.randn(3, 5, 16), torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [0, 0, 0, 1, 1]]).bool()
    h = torch.randn(6, 3, 16)
    out = attend_documents(attn, h, row_doc, document_memory(attn, memory, pad))
    for r in range(6):
        d = row_doc[r]
        k, v = attn.memory_kv(memory[d : d + 1, ~pad[d]])
        q = attn.project_q(h[r : r + 1])
        ref = attn.merge(attention_probs(q, k) @ v)
        assert torch.allclose(out[r], ref[0], atol=1e-5)


def test_row_buckets_are_an_optimal_cut_covering_every_row_once():
    lengths = torch.tensor([5, 3, 9, 3, 12, 4, 30, 7, 5])
    for overhead in (0, 4, 20, 10**6):
        buckets = bucket_rows(lengths, overhead)
        rows = torch.cat([b.rows for b in buckets])
        assert sorted(rows.tolist()) == list(range(9))
        assert all(int(lengths[b.rows].max()) == b.length for b in buckets)
        cost = sum(b.rows.numel() * b.length + overhead for b in buckets)
        ordered = sorted(lengths.tolist())
        best = min(  # every cut of the sorted lengths into runs
            sum((j - i) * ordered[j - 1] + overhead for i, j in zip((0, *cuts), (*cuts, 9)))
            for n in range(9)
            for cuts in itertools.combinations(range(1, 9), n)
        )
        assert cost == best
    assert len(bucket_rows(lengths, 0)) == len(set(lengths.tolist()))
    assert len(bucket_rows(lengths, 10**6)) == 1
    x = torch.randn(9, 30, 2)
    keep = torch.arange(30)[None, :] < lengths[:, None]
    parts = [b.take(x) for b in bucket_rows(lengths, 0)]
    assert torch.equal(unbucket(parts, bucket_rows(lengths, 0), 30), x * keep[..., None])


# ----------------------------------------------------------------------------- model


def per_sentence(model, docs, order, overhead, monkeypatch) -> dict:
    """{(document, sentence): teacher-forced log-probs} with the documents batched in ``order``
    (lists of document numbers, one batch each) and rows bucketed with ``overhead``."""
    monkeypatch.setattr(row_buckets, "BUCKET_OVERHEAD", overhead)
    out = {}
    for batch_docs in order:
        batch = context_batch([docs[d] for d in batch_docs])
        for r, lp in enumerate(sentence_log_probs(model, batch)):
            out[batch_docs[int(batch.doc_index[r])], int(batch.first_sent[r])] = lp
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_batch_composition_and_length_buckets_do_not_change_log_probs(name, monkeypatch):
    """The same documents alone, together, in another order, with other documents beside them,
    in one padded row tensor (no buckets) or one bucket per row length: every sentence keeps its
    log-probabilities (1e-5)."""
    model, _ = random_model(VARIANTS[name])
    docs = random_docs([4, 2, 5, 1, 3], seed=7)
    docs[2][1] = (np.arange(len(SPECIALS), len(SPECIALS) + 20), docs[2][1][1])  # a long row beside short ones
    reference = per_sentence(model, docs, [[0, 1, 2, 3, 4]], 10**9, monkeypatch)  # one padded tensor
    variants = [
        ([[0, 1, 2, 3, 4]], 0),  # one bucket per length
        ([[0], [1], [2], [3], [4]], 0),  # a document per batch
        ([[4, 2], [1, 3, 0]], 0),
        ([[3, 0, 4, 1, 2]], row_buckets.BUCKET_OVERHEAD),  # the default cut
    ]
    for order, overhead in variants:
        got = per_sentence(model, docs, order, overhead, monkeypatch)
        assert got.keys() == reference.keys()
        for key, lp in reference.items():
            assert torch.allclose(got[key], lp, atol=1e-5), (order, overhead, key)


@pytest.mark.parametrize("name", ["both", "document", "own_decoder"])
def test_stepwise_equals_teacher_forced_with_one_bucket_per_length(name, monkeypatch, device):
    monkeypatch.setattr(row_buckets, "BUCKET_OVERHEAD", 0)
    model, _ = random_model(VARIANTS[name], device=device)
    batch = context_batch(random_docs([3, 1, 4])).to(device)
    assert_stepwise_matches(model, batch, torch.tensor([5, 0, 7, 2, 1, 6, 3, 4]))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_stepwise_equals_teacher_forced(name, device):
    model, _ = random_model(VARIANTS[name], device=device)
    batch = context_batch(random_docs([3, 1, 4])).to(device)
    assert_stepwise_matches(model, batch, torch.tensor([5, 0, 7, 2, 1, 6, 3, 4]))


def test_beam_expansion_and_internal_reorder_keep_document_context(device):
    """Rows repeated per beam (as beam search does) and shuffled within their sentence still see
    their own document. The shuffle is drawn on the CPU."""
    model, _ = random_model(BOTH, device=device)
    batch = context_batch(random_docs([3, 2])).to(device)
    k = 3
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        expand = torch.arange(batch.size, device=device).repeat_interleave(k)
        state = model.init_state(model.encode(batch), batch).reorder(expand)
        tgt = batch.tgt_in.repeat_interleave(k, 0)
        out = []
        for t in range(tgt.size(1)):
            if t == 2:  # shuffle beams inside each sentence
                within = torch.cat([torch.randperm(k) + k * s for s in range(batch.size)]).to(device)
                state = state.reorder(within, same_sources=True)
                tgt, out = tgt[within], [o[within] for o in out]
            lp, state = model.step(tgt[:, t], state)
            out.append(lp)
    stepped = torch.stack(out, 1).view(batch.size, k, tgt.size(1), -1)
    mask = batch.tgt_out.ne(PAD_ID)
    for b in range(k):
        assert torch.allclose(forced[mask], stepped[:, b][mask], atol=1e-5)


@pytest.mark.parametrize(
    "name",
    ["both", "decoder_only", "encoder_only", "document", "document_decoder_only", "own_decoder", "own_decoder_only"],
)
def test_documents_do_not_leak_into_each_other_but_context_is_used(name):
    model, _ = random_model(VARIANTS[name])
    docs = random_docs([3, 2, 4], seed=4)
    base = sentence_log_probs(model, context_batch(docs))
    # the same documents in another order: every sentence's output is unchanged
    permuted = sentence_log_probs(model, context_batch([docs[2], docs[0], docs[1]]))
    rows = {(0, j): j for j in range(3)} | {(1, j): 3 + j for j in range(2)} | {(2, j): 5 + j for j in range(4)}
    moved = {(2, j): j for j in range(4)} | {(0, j): 4 + j for j in range(3)} | {(1, j): 7 + j for j in range(2)}
    for key, row in rows.items():
        assert torch.allclose(base[row], permuted[moved[key]], atol=1e-5), key
    # another sentence of document 0 changes: sentence 0 of document 0 sees it ...
    edited = [list(d) for d in docs]
    edited[0][2] = (np.array([len(SPECIALS) + 1] * 6), edited[0][2][1])
    after = sentence_log_probs(model, context_batch(edited))
    assert (base[0] - after[0]).abs().max() > 1e-4
    # ... and the other documents do not
    for row in range(3, 9):
        assert torch.allclose(base[row], after[row], atol=1e-5)


def encode_with_document_state_perturbed(model, batch, doc: int, slot: int) -> torch.Tensor:
    """The words with context h^ctx [R, L, D] when the document encoder's output H^S (eq. 4) of
    sentence ``slot`` of document ``doc`` is changed directly (nothing else is)."""
    enc = model.encoder
    encode_document = enc.encode_document

    def perturbed(*args):
        h_s, pad = encode_document(*args)
        return h_s.index_put((torch.tensor([doc]), torch.tensor([slot])), torch.full_like(h_s[0, 0], 3.0)), pad

    enc.encode_document = perturbed
    try:
        with torch.no_grad():
            return enc(batch).extra["sentence_context"]
    finally:
        del enc.encode_document


@pytest.mark.parametrize("reading", ["own_sentence", "document"])
def test_context_switch_decides_which_slots_of_the_document_state_a_word_reads(reading):
    """eqs. 5-6: with own_sentence a word of sentence i reads H^S_i only: changing another slot of
    H^S changes nothing for it; with document every slot of its document reaches it. Other
    documents are untouched either way."""
    model, _ = random_model({"encoder": {**ENC, "context": reading}, "decoder": DEC})
    batch = context_batch(random_docs([3, 2], seed=2))  # rows 0-2: document 0, rows 3-4: document 1
    with torch.no_grad():
        base = model.encoder(batch).extra["sentence_context"]
    after = encode_with_document_state_perturbed(model, batch, doc=0, slot=2)
    changed = [(base[r] - after[r]).abs().max().item() > 1e-4 for r in range(batch.size)]
    expected = {"own_sentence": [False, False, True, False, False], "document": [True, True, True, False, False]}
    assert changed == expected[reading]


def test_own_sentence_words_still_read_the_other_sentences_through_the_document_encoder():
    """With own_sentence the other sentences reach a word through eq. 4 (self-attention over the
    sentence vectors): changing the words of sentence 2 changes the context of sentence 0."""
    model, _ = random_model(BOTH)
    docs = random_docs([3], seed=2)
    edited = [list(docs[0])]
    edited[0][2] = (np.array([len(SPECIALS) + 1] * 6), edited[0][2][1])
    with torch.no_grad():
        base = model.encoder(context_batch(docs)).extra["sentence_context"]
        after = model.encoder(context_batch(edited)).extra["sentence_context"]
    assert (base[0] - after[0]).abs().max() > 1e-4


def test_own_sentence_context_is_a_per_head_weighting_of_the_own_slot():
    """eqs. 5-6 written out per word and head: α = σ(q·k/√d_head) with q = W_Q h_ij, k = W_K h_ij,
    d^ctx_ij = W_O [α_1 W_V1 H^S_i; …; α_H W_VH H^S_i] + b_O."""
    torch.manual_seed(0)
    d, n_heads = 16, 4
    attn = MultiHeadAttention(d, n_heads, 0.0, self_attention=False)
    h, slot = torch.randn(3, 5, d), torch.randn(3, 1, d)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1, 3:] = False
    out = own_sentence_context(attn, h, slot, keep)
    wq, bq = attn.q.weight, attn.q.bias
    wk, bk, wv, bv = attn.kv.weight[:d], attn.kv.bias[:d], attn.kv.weight[d:], attn.kv.bias[d:]
    dh = d // n_heads
    for r in range(3):
        for j in range(5):
            if not keep[r, j]:
                assert out[r, j].eq(0).all()
                continue
            q, k, v = wq @ h[r, j] + bq, wk @ h[r, j] + bk, wv @ slot[r, 0] + bv
            heads = [
                torch.sigmoid(q[i * dh : (i + 1) * dh] @ k[i * dh : (i + 1) * dh] / dh**0.5) * v[i * dh : (i + 1) * dh]
                for i in range(n_heads)
            ]
            ref = attn.out.weight @ torch.cat(heads) + attn.out.bias
            assert torch.allclose(out[r, j], ref, atol=1e-5)


def test_own_sentence_decoder_reads_only_its_own_sentences_words():
    """eqs. 8-9 with decoder context own_sentence: the DocEnc-Decoder attention of a sentence
    reads its own words h^ctx_i; with document it reads every word of the document (C)."""
    batch = context_batch(random_docs([3], seed=6))
    changed = {}
    for reading in ("own_sentence", "document"):
        model, _ = random_model({"encoder": {**ENC, "word_context": False}, "decoder": {**DEC, "context": reading}})
        with torch.no_grad():
            enc_out = model.encoder(batch)
            base = model.decoder(batch.tgt_in, enc_out, batch).hidden
            # the words of sentence 2 change in both views of h^ctx (per row, and packed as C)
            enc_out.extra["sentence_context"] = enc_out.extra["sentence_context"].clone()
            enc_out.extra["sentence_context"][2] += 1.0
            c = enc_out.extra["doc_memory"].clone()
            first = int(batch.src[:2].ne(PAD_ID).sum())  # C holds the words of rows 0, 1, 2 in order
            c[0, first:] += 1.0
            enc_out.extra["doc_memory"] = c
            after = model.decoder(batch.tgt_in, enc_out, batch).hidden
        changed[reading] = [(base[r] - after[r]).abs().max().item() > 1e-4 for r in range(3)]
    assert changed == {"own_sentence": [False, False, True], "document": [True, True, True]}


def test_document_encoder_shares_the_sentence_self_attention_unless_told_not_to():
    shared, _ = random_model(BOTH)
    enc = shared.encoder
    assert enc.doc_layers[0].self_attn is enc.layers[0].self_attn
    assert enc.sentence_attn is enc.layers[-1].self_attn
    unshared, _ = random_model({"encoder": {**ENC, "share_attention": False}, "decoder": DEC})
    n_attn = sum(p.numel() for p in enc.layers[0].self_attn.parameters())
    assert unshared.n_params() - shared.n_params() == 2 * n_attn


@pytest.mark.parametrize(
    "model_section, key",
    [
        ({"encoder": {"type": "transformer"}, "decoder": DEC}, "model.decoder.type"),
        ({"encoder": {**ENC, "word_context": False}, "decoder": {"type": "transformer"}}, "model.encoder.word_context"),
    ],
)
def test_parts_that_do_not_fit_are_a_config_error(model_section, key):
    with pytest.raises(ConfigError, match=key):
        random_model(model_section)


def test_shared_document_layers_cannot_outnumber_sentence_layers():
    with pytest.raises(ConfigError, match="model.encoder.doc_layers"):
        config_from_dict({"model": {"encoder": {**ENC, "doc_layers": 3}}})


@pytest.mark.parametrize("name", ["both", "document", "own_decoder"])
def test_beam_search_translates_each_document_as_if_it_were_alone(name, device):
    """Batch composition (other documents, finished rows leaving) never changes a translation."""
    model, _ = random_model(VARIANTS[name], seed=3, device=device)
    docs = random_docs([3, 1, 4], seed=5)
    search = BeamSearch(beam=3, max_len_ratio=1.0, max_len_add=3)
    together = [h[0].tokens for h in search.search(model, context_batch(docs).to(device))]
    alone = [h[0].tokens for d in docs for h in search.search(model, context_batch([d]).to(device))]
    assert together == alone


# ----------------------------------------------------------------------------- training

HM_TINY = {
    "encoder": {"type": "hierarchical", "layers": 2, "heads": 4, "ff": 128, "doc_layers": 1},
    "decoder": {"type": "doc_context", "layers": 2, "heads": 4, "ff": 128},
}


def test_two_step_training_copies_the_sentence_parameters_and_builds_two_lr_groups(trained_run, toy_dir, tmp_path):
    """Step 2 of the recipe: θs from a sentence Transformer (at lr × init_lr_scale), θd new."""
    run = tmp_path / "step2"
    ckpt = init_from_run(trained_run, run)
    trainer = make_trainer(tiny_config(toy_dir, run, model=HM_TINY, train={"init_from": str(ckpt)}))
    sentence = torch.load(ckpt, weights_only=True)["model"]
    params = dict(trainer.model.named_parameters())
    shared = set(params) & set(sentence)
    new = set(params) - shared
    assert all(torch.equal(params[n].detach(), sentence[n]) for n in shared)
    assert {"encoder.layers.1.self_attn.qkv.weight", "decoder.layers.0.cross_attn.kv.weight"} <= shared
    document_level = ("encoder.doc_layers.", "encoder.doc_norm.", "encoder.context_attn.", ".doc_attn.")
    assert new and all(any(p in n for p in document_level) for n in new), sorted(new)
    # the document encoder's self-attentions are the sentence layers': initialised, not new
    assert trainer.model.encoder.doc_layers[0].self_attn.qkv.weight is params["encoder.layers.0.self_attn.qkv.weight"]
    groups = {g["name"]: g for g in trainer.optimizer.param_groups}
    assert groups["initialised"]["lr_scale"] == 0.2 and groups["new"]["lr_scale"] == 1.0
    assert {id(p) for p in groups["new"]["params"]} == {id(params[n]) for n in new}


@pytest.fixture(scope="module")
def hm_run(toy_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("hm_gdc")
    cfg = tiny_config(
        toy_dir,
        run,
        model={"d_model": 64, **HM_TINY},
        train={"max_steps": 600, "batch_tokens": 1536, "valid_every": 600, "save_every": 600},
    )
    cfg["optim"]["lr"] = 3.0e-3
    train(config_from_dict(cfg))
    return run


def test_small_hm_gdc_learns_context_dependent_pronouns_a_sentence_model_cannot(hm_run, tmp_path):
    """The toy pronoun's form depends on the previous sentence's subject; a sentence Transformer of
    this size is at chance (28% on this kind of test set, docs/models/hm_gdc.md). The default
    HM-GDC (own_sentence: each word reads its own slot of the document encoder) must be far above
    it, and the same model with every sentence alone (windows of one sentence) back at chance: the
    gain comes from the other sentences."""
    from onmt_doc.toy.corpus import write_corpus
    from onmt_doc.toy.pronoun_scoring import score_context

    data = tmp_path / "test"
    write_corpus(data, seed=11, train_docs=1, valid_docs=1, test_docs=300)
    model, saved, codec = load_model(str(hm_run / "checkpoints" / "last.pt"))
    assert saved.model.encoder.context == "own_sentence"
    saved.translate.beam = 2
    acc = {}
    for name, window in (("document", 0), ("alone", 1)):
        saved.data.max_sentences = window
        hyp = tmp_path / f"{name}.hyp"
        with open(hyp, "w", encoding="utf-8") as out:
            Translator(model, codec, saved).run_files(str(data / "test.src"), out)
        acc[name] = score_context(str(hyp), str(data / "test.ctx"))
    assert acc["document"]["total"] > 200, acc
    assert acc["document"]["accuracy"] > 0.42 and acc["alone"]["accuracy"] < 0.40, acc
    assert acc["document"]["accuracy"] - acc["alone"]["accuracy"] > 0.12, acc


def test_context_windows_keep_the_output_aligned_line_by_line(hm_run, toy_dir, tmp_path):
    """Documents cut into windows of 2 sentences: one output line per input line, breaks kept."""
    model, saved, codec = load_model(str(hm_run / "checkpoints" / "last.pt"))
    saved.data.max_sentences = 2
    hyp = tmp_path / "test.hyp"
    with open(hyp, "w", encoding="utf-8") as out:
        pairs = Translator(model, codec, saved).run_files(str(toy_dir / "test.src"), out, tgt=str(toy_dir / "test.tgt"))
    scores = report(*pairs, saved.data.documents)
    src = (toy_dir / "test.src").read_text(encoding="utf-8").split("\n")
    out_lines = hyp.read_text(encoding="utf-8").split("\n")
    assert len(out_lines) == len(src)
    assert [not line.strip() for line in out_lines] == [not line.strip() for line in src]
    assert scores["bleu"] > 50, scores
    # forced decoding (-score) of the references: one log-probability per line, breaks kept
    assert_forced_scores_keep_breaks(Translator(model, codec, saved), toy_dir, tmp_path / "test.scores")


@pytest.mark.parametrize("variant", ["both", "document", "own_decoder"])
def test_a_compiled_forward_of_a_prepared_batch_is_one_graph(variant):
    """On the fused (GPU) path the trainer hands the forward a batch whose packings were planned on the
    host beforehand (``EncoderDecoder.prepare``, ``Batch.plans``): torch.compile traces HM-GDC's forward
    in one graph, and it computes what the eager forward of the batch not prepared does. A batch not
    prepared (validation) leaves the graph where the forward plans: once for the encoder
    (``plan_encoder``: buckets, both packings and the document reading's query plan) and once for the
    decoder, whatever the reading (the ``own_sentence`` decoder planned in every layer: 14 graphs)."""
    from onmt_doc import devices

    model, _ = random_model(VARIANTS[variant], seed=3)
    batch = context_batch(random_docs([3, 1, 2, 4], seed=2))
    with devices.forced_path("fused"):
        prepared = model.prepare(batch, torch.device("cpu"))
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(prepared)
        assert explained.graph_count == 1, [str(r.reason)[:200] for r in explained.break_reasons]
        torch._dynamo.reset()
        planned = [" | ".join(f.line for f in r.user_stack) for r in torch._dynamo.explain(model)(batch).break_reasons]
        assert len(planned) == 2, planned
        decoder_plan = "_plan_own_rows" if variant == "own_decoder" else "_plan_rows"
        assert "plan_encoder(" in planned[0] and decoder_plan + "(" in planned[1], planned
        with torch.no_grad():
            expected = model(batch).logits
            assert torch.equal(model(prepared).logits, expected)  # the same plans, made earlier
            torch._dynamo.reset()
            got = torch.compile(model, backend="eager", dynamic=True)(prepared).logits
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_fused_decoding_step_reads_each_document_in_one_masked_call(name):
    """On the fused (GPU) path a decoding step attends from each row to its own document as one
    attention call over every document's keys, masked by document (no packing plan made on the host
    from a device read, per layer and step): stepwise = teacher-forced (1e-5), also after the rows
    are permuted, and the step is one graph for ``torch.compile`` (nine at two layers before: the
    packing plan broke it at every layer)."""
    model, _ = random_model(VARIANTS[name])
    batch = context_batch(random_docs([3, 1, 4]))
    with devices.forced_path("fused"):
        assert_stepwise_matches(model, batch, torch.tensor([5, 0, 7, 2, 1, 6, 3, 4]))
        with torch.no_grad():
            state = model.init_state(model.encode(batch), batch, LengthLimit(1.0, 5))
            _, state = model.step(torch.full((batch.size,), BOS_ID), state)
            torch._dynamo.reset()
            explained = torch._dynamo.explain(model.step)(torch.full((batch.size,), SOS_ID), state)
            torch._dynamo.reset()
    assert explained.graph_count == 1, [str(b.reason)[:120] for b in explained.break_reasons]
