"""G-Transformer: packed group attention against a dense masked reference, stepwise decoding,
document beam search structure, word dropout, fine-tuning from a sentence model, learning."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import init_from_run, make_trainer, tiny_config
from model_helpers import N_WORDS, random_model, record_raw_hypotheses
from test_decoding import stepwise_log_probs

from onmt_doc.config import config_from_dict
from onmt_doc.contracts import LengthLimit
from onmt_doc.data.batching import collate, group_tags
from onmt_doc.data.instances import Example, mark_sentence
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, MASK_ID, PAD_ID, SOS_ID, SPECIALS, UNK_ID
from onmt_doc.errors import ConfigError
from onmt_doc.models.checkpoint import load_model
from onmt_doc.models.model import full_log_probs
from onmt_doc.modules import analysis
from onmt_doc.modules.group_attention import DEC_CROSS, DEC_SELF, ENC_SELF, group_attend, plan_cross, plan_self
from onmt_doc.modules.word_dropout import word_dropout
from onmt_doc.train.trainer import train
from onmt_doc.translate.search import BeamSearch
from onmt_doc.translate.translator import Translator

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

G = {
    "encoder": {"type": "g_transformer", "layers": 3, "heads": 4, "ff": 64, "global_layers": 1},
    "decoder": {
        "type": "g_transformer",
        "layers": 3,
        "heads": 4,
        "ff": 64,
        "global_layers": 2,
        "global_cross_layers": 1,
    },
}
DOC_TRANSFORMER = {
    "encoder": {**G["encoder"], "group_attention": False},
    "decoder": {**G["decoder"], "group_attention": False},
}
# (src words, tgt words) per sentence, per document instance: uneven lengths and counts → padding
DOCS = [[(3, 4), (5, 2), (1, 6)], [(7, 3)], [(2, 2), (4, 4)], [(1, 1), (6, 2), (2, 5), (3, 3)]]


def doc_batch(docs=DOCS, seed: int = 0):
    rng = np.random.default_rng(seed)
    first = len(SPECIALS)
    examples = []
    for d, sents in enumerate(docs):
        src = np.concatenate([mark_sentence(rng.integers(first, first + N_WORDS, s)) for s, _ in sents])
        tgt = np.concatenate([mark_sentence(rng.integers(first, first + N_WORDS, t)) for _, t in sents])
        examples.append(Example(src, tgt, d, 0, len(sents)))
    return collate(examples, np.arange(len(examples)))


# ---------------------------------------------------------------- packed vs dense group attention
def dense_reference(q, k, v, q_tags, q_keep, k_tags, k_keep, causal):
    """The N×N masked formulation (eq. 8): tag-k queries see tag-k keys; tag-0 queries see all."""
    allowed = (q_tags[:, :, None] == k_tags[:, None, :]) | (q_tags[:, :, None] == 0)
    allowed = allowed & k_keep[:, None, :] & q_keep[:, :, None]
    if causal:
        allowed = allowed & torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2)) / q.size(-1) ** 0.5
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    probs = scores.softmax(-1).nan_to_num(0.0)  # queries without keys: zero output
    return probs @ v


def random_tags(rng, lengths_per_row, n, with_bos):
    """Tags of rows made of sentences of the given lengths, optional tag-0 <bos>, then padding."""
    tags = torch.zeros(len(lengths_per_row), n, dtype=torch.long)
    keep = torch.zeros(len(lengths_per_row), n, dtype=torch.bool)
    for r, lengths in enumerate(lengths_per_row):
        pos = 1 if with_bos else 0
        keep[r, :pos] = True
        for k, length in enumerate(lengths, start=1):
            tags[r, pos : pos + length] = k
            keep[r, pos : pos + length] = True
            pos += length
    return tags, keep


@pytest.mark.parametrize("causal,with_bos", [(False, False), (True, True), (True, False)])
def test_packed_self_attention_equals_dense_reference(causal, with_bos, device):
    rng = np.random.default_rng(1)
    rows = [[3, 7, 1, 5], [9], [2, 2, 6], [4, 1]]
    n = 1 + max(sum(r) for r in rows)
    tags, keep = (t.to(device) for t in random_tags(rng, rows, n, with_bos))
    torch.manual_seed(0)
    q, k, v = (torch.randn(len(rows), 2, n, 8, dtype=torch.float64).to(device).requires_grad_() for _ in range(3))
    packed = group_attend(plan_self(tags, keep, causal), q, k, v)
    dense = dense_reference(q, k, v, tags, keep, tags, keep, causal)
    sel = keep[:, None, :, None].expand_as(packed)
    assert torch.allclose(packed[sel], dense[sel], atol=1e-5)
    w = torch.randn_like(packed)
    grads_p = torch.autograd.grad((packed * w * sel).sum(), (q, k, v))
    grads_d = torch.autograd.grad((dense * w * sel).sum(), (q, k, v))
    for gp, gd in zip(grads_p, grads_d):
        assert torch.allclose(gp, gd, atol=1e-5)


def test_packed_cross_attention_equals_dense_reference(device):
    """Target sentence k attends source sentence k; <bos> sees the whole source; a target sentence
    without a source sentence gets a zero output."""
    src_tags, src_keep = (t.to(device) for t in random_tags(None, [[4, 2, 6], [3], [5, 5]], 12, with_bos=False))
    tgt_tags, tgt_keep = (t.to(device) for t in random_tags(None, [[2, 5, 1], [4], [3, 1, 2]], 10, with_bos=True))
    torch.manual_seed(0)
    q = torch.randn(3, 2, 10, 8, dtype=torch.float64).to(device).requires_grad_()
    k, v = (torch.randn(3, 2, 12, 8, dtype=torch.float64).to(device).requires_grad_() for _ in range(2))
    packed = group_attend(plan_cross(tgt_tags, tgt_keep, src_tags, src_keep), q, k, v)
    dense = dense_reference(q, k, v, tgt_tags, tgt_keep, src_tags, src_keep, causal=False)
    sel = tgt_keep[:, None, :, None].expand_as(packed)
    assert torch.allclose(packed[sel], dense[sel], atol=1e-5)
    assert packed[2, :, 7:].abs().sum() == 0  # row 2's third target sentence has no source
    w = torch.randn_like(packed)
    for gp, gd in zip(
        torch.autograd.grad((packed * w * sel).sum(), (q, k, v)),
        torch.autograd.grad((dense * w * sel).sum(), (q, k, v)),
    ):
        assert torch.allclose(gp, gd, atol=1e-5)


def test_group_attention_never_builds_an_n_by_n_mask():
    """Blocks are as long as the longest sentence, not the instance."""
    lengths = [[25] * 40]
    tags, keep = random_tags(None, lengths, 1000, with_bos=False)
    (blocks,) = plan_self(tags, keep, causal=False).buckets  # equal lengths: one bucket
    assert blocks.q_index.shape == blocks.k_index.shape == (40, 25)
    assert blocks.mask.numel() <= 40 * 25 * 25


# ---------------------------------------------------------------- decoding
@pytest.mark.parametrize("section", [G, DOC_TRANSFORMER], ids=["g_transformer", "doc_transformer"])
def test_stepwise_equals_teacher_forced(section, device):
    model, _ = random_model(section, device=device)
    batch = doc_batch().to(device)
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        stepped = stepwise_log_probs(model, batch, batch.tgt_in)
    mask = batch.tgt_out.ne(PAD_ID)
    assert torch.allclose(forced[mask], stepped[mask], atol=1e-5), (forced - stepped)[mask].abs().max()


def test_stepwise_equals_teacher_forced_after_reorder_with_tags(device):
    model, _ = random_model(G, seed=3, device=device)
    batch = doc_batch(seed=2).to(device)
    perm = torch.tensor([2, 0, 3, 1], device=device)
    with torch.no_grad():
        forced = full_log_probs(model, batch)[perm]
        state = model.init_state(model.encode(batch), batch)
        out, tags = [], []
        for t in range(batch.tgt_in.size(1)):
            if t == 6:
                state = state.reorder(perm)
                out, tags = [o[perm] for o in out], [g[perm] for g in tags]
            tokens = batch.tgt_in[:, t] if t < 6 else batch.tgt_in[perm, t]
            lp, state = model.step(tokens, state)
            out.append(lp)
            tags.append(state.tag)
        stepped = torch.stack(out, 1)
        # the decoder's own tags equal the collated target tags
        assert torch.equal(torch.stack(tags, 1), batch.tgt_groups[perm])
    mask = batch.tgt_out[perm].ne(PAD_ID)
    assert torch.allclose(forced[mask], stepped[mask], atol=1e-5)


def test_stepwise_sentence_caches_grow_past_their_initial_capacity(device):
    """With every caps at one word the sentence caches start at 4 slots; teacher-forced targets of
    up to 6 words make them grow, and the scores still equal the teacher-forced pass."""
    model, _ = random_model(G, seed=5, device=device)
    batch = doc_batch(seed=4).to(device)
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        state = model.init_state(model.encode(batch), batch, LengthLimit(ratio=0.0, add=1))
        assert state.sent_capacity == 4
        out = []
        for t in range(batch.tgt_in.size(1)):
            lp, state = model.step(batch.tgt_in[:, t], state)
            out.append(lp)
        grown = [kv[0].size(2) for kv in state.self_kv]
    assert min(grown) > 4
    mask = batch.tgt_out.ne(PAD_ID)
    assert torch.allclose(forced[mask], torch.stack(out, 1)[mask], atol=1e-5)


@pytest.mark.parametrize("section", [G, DOC_TRANSFORMER], ids=["g_transformer", "doc_transformer"])
def test_stepwise_prefix_caches_grow_past_their_initial_capacity(section, device):
    """The global self-attention caches (the whole prefix, written in place) start at 2 slots here
    and double as the instance grows; the scores still equal the teacher-forced pass, also after a
    beam-style reorder in the middle."""
    model, _ = random_model(section, seed=6, device=device)
    batch = doc_batch(seed=5).to(device)
    perm = torch.tensor([1, 1, 3, 0], device=device)  # a row copied over another, as beam search does
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        state = model.init_state(model.encode(batch), batch)
        state.prefix_capacity = 2
        out, rows = [], torch.arange(batch.size, device=device)
        for t in range(batch.tgt_in.size(1)):
            if t == 5:
                state, rows, out = state.reorder(perm), rows[perm], [o[perm] for o in out]
            lp, state = model.step(batch.tgt_in[rows, t], state)
            out.append(lp)
        modes = [layer.self_mode for layer in model.decoder.layers]
        caches = [state.self_kv[i] for i, m in enumerate(modes) if m == "global"]
        caches += [state.global_self_kv[i] for i, m in enumerate(modes) if m == "combined"]
    assert caches and all(kv[0].size(2) >= batch.tgt_in.size(1) > 2 for kv in caches)  # they grew
    mask = batch.tgt_out[rows].ne(PAD_ID)
    assert torch.allclose(forced[rows][mask], torch.stack(out, 1)[mask], atol=1e-5)


def test_group_decoding_state_does_not_grow_with_the_instance():
    """Decoding cost per token is flat: without global layers the state's tensors stay the same size
    from the third sentence of a long document to its last (only the sentence caches, bounded by the
    longest sentence, are kept)."""
    local_only = {
        "encoder": {**G["encoder"], "global_layers": 0},
        "decoder": {**G["decoder"], "global_layers": 0, "global_cross_layers": 0},
    }
    model, _ = random_model(local_only, seed=6)
    batch = doc_batch([[(3, 3)] * 12])
    sizes = []
    with torch.no_grad():
        state = model.init_state(model.encode(batch), batch)
        for t in range(batch.tgt_in.size(1)):
            _, state = model.step(batch.tgt_in[:, t], state)
            sizes.append(state.nbytes())
    third = 1 + 2 * 5  # <bos>, then two sentences of <s> + 3 words + </s>
    assert len(set(sizes[third:])) == 1


def test_group_attention_isolates_sentences_in_the_lower_layers():
    """With no global layer, changing source sentence 2 leaves target sentence 1 unchanged, and
    changing it with global layers on changes it (the global attention really is global)."""
    local_only = {
        "encoder": {**G["encoder"], "global_layers": 0},
        "decoder": {**G["decoder"], "global_layers": 0, "global_cross_layers": 0},
    }
    batch = doc_batch([[(4, 4), (5, 5)]])
    other = doc_batch([[(4, 4), (5, 5)]])
    other.src[0, 6:11] = batch.src[0, 6:11].flip(0)  # reorder the words of source sentence 2
    first = batch.tgt_groups[0].eq(1)
    for section, changes in ((local_only, False), (G, True)):
        model, _ = random_model(section, seed=4)
        with torch.no_grad():
            a, b = full_log_probs(model, batch)[0, first], full_log_probs(model, other)[0, first]
        assert torch.allclose(a, b, atol=1e-6) != changes


def test_document_beam_search_keeps_the_source_sentence_count_untrained(device):
    """The raw beam output (before ``split_sentences``, which would pad or merge to the source
    count anyway) of an untrained model has exactly the source's ``<s> … </s>`` groups, for
    every instance, including documents cut into several instances by data.max_tokens (the
    Translator runs on the model's device)."""
    model, codec = random_model(G, seed=7, device=device)
    docs = [[f"w{i % 9} w{(i * 3) % 11} w5" for i in range(n)] for n in (1, 2, 5, 9)]
    docs.append(["w1", "", "w2 w3"])  # an empty sentence inside
    cfg = config_from_dict({"data": {"max_tokens": 24}, "translate": {"beam": 3, "max_len_add": 2}})
    translator = Translator(model, codec, cfg)
    rows = record_raw_hypotheses(translator)
    out = translator.translate_documents(docs)
    assert [len(d) for d in out] == [len(d) for d in docs]
    assert sum(int(src.eq(SOS_ID).sum()) for src, _ in rows) == sum(len(d) for d in docs)
    assert len(rows) > len(docs)  # max_tokens split documents
    for src, hyps in rows:
        n = int(src.eq(SOS_ID).sum())
        toks = hyps[0].tokens
        assert toks.count(SOS_ID) == toks.count(EOS_SENT_ID) == n, (n, toks)
        opens = [i for i, t in enumerate(toks) if t == SOS_ID]
        closes = [i for i, t in enumerate(toks) if t == EOS_SENT_ID]
        assert all(o < c for o, c in zip(opens, closes)) and all(c < o for c, o in zip(closes, opens[1:]))


def test_constraints_force_the_structure_and_sentence_caps(device):
    """Beam search hypotheses: <s> after <bos> and every </s>, no empty sentence unless capped at
    zero, at most cap words per sentence, exactly the source's number of sentences."""
    model, _ = random_model(G, seed=8, device=device)
    batch = doc_batch(seed=5).to(device)
    with torch.no_grad():
        hyps = BeamSearch(beam=4, n_best=4, max_len_ratio=1.0, max_len_add=1).search(model, batch)
    for row, sents in enumerate(DOCS):
        caps = [s + 1 for s, _ in sents]
        for h in hyps[row]:
            toks = h.tokens
            assert toks.count(SOS_ID) == toks.count(EOS_SENT_ID) == len(sents)
            assert BOS_ID not in toks and EOS_ID not in toks and MASK_ID not in toks
            bounds = [i for i, t in enumerate(toks) if t == SOS_ID]
            for k, start in enumerate(bounds):
                end = toks.index(EOS_SENT_ID, start)
                assert 1 <= end - start - 1 <= caps[k]
            assert toks[0] == SOS_ID and toks[-1] == EOS_SENT_ID


# ---------------------------------------------------------------- word dropout
def test_word_dropout_replaces_only_words_at_rate_p():
    torch.manual_seed(0)
    ids = torch.randint(0, 60, (200, 100))
    out = word_dropout(ids, 0.3, UNK_ID)
    special = ids.lt(len(SPECIALS))
    assert torch.equal(out[special], ids[special])
    changed = out.ne(ids)
    assert out[changed].eq(UNK_ID).all()
    rate = changed.sum().item() / (~special).sum().item()
    assert 0.27 < rate < 0.33


def test_word_dropout_applies_to_inputs_in_training_only():
    model, _ = random_model({**G}, seed=1)
    model.word_dropout, model.word_dropout_id = 0.9, MASK_ID
    batch = doc_batch()
    model.eval()
    with torch.no_grad():
        clean = model(batch).logits
        assert torch.equal(clean, model(batch).logits)
        model.train()
        noisy = model(batch)
    assert not torch.allclose(clean, noisy.logits)
    assert torch.equal(noisy.target, batch.tgt_out[batch.tgt_out.ne(PAD_ID)])  # targets intact


# ---------------------------------------------------------------- config
def test_global_layers_must_fit_the_stack():
    with pytest.raises(ConfigError, match="model.decoder.global_cross_layers"):
        config_from_dict({"model": {"decoder": {"type": "g_transformer", "layers": 2, "global_cross_layers": 3}}})


def hand_tags(docs, side: str, width: int) -> torch.Tensor:
    """Tags written out from the sentence lengths alone: k on the k-th sentence's ``<s>``, words and
    ``</s>``; 0 on the target's leading ``<bos>`` and on padding."""
    rows = []
    for sents in docs:
        row = [0] if side == "tgt" else []
        for k, (s, t) in enumerate(sents, start=1):
            row += [k] * ((s if side == "src" else t) + 2)
        rows.append(row + [0] * (width - len(row)))
    return torch.tensor(rows)


def test_group_tags_of_collation_and_of_the_torch_path_equal_hand_computed_tags():
    batch = doc_batch()
    src_tags = hand_tags(DOCS, "src", batch.src.size(1))
    tgt_tags = hand_tags(DOCS, "tgt", batch.tgt_in.size(1))
    assert torch.equal(batch.src_groups, src_tags) and torch.equal(batch.tgt_groups, tgt_tags)
    assert torch.equal(group_tags(batch.src.clone()), src_tags)  # what the decoders call
    assert torch.equal(group_tags(batch.tgt_in.clone()), tgt_tags)
    with_eos = torch.cat([batch.tgt_out, torch.full((batch.size, 1), PAD_ID)], 1)  # <eos> gets 0
    assert group_tags(with_eos)[with_eos.eq(EOS_ID)].eq(0).all()


# ---------------------------------------------------------------- training
G_TINY = {
    "encoder": {"type": "g_transformer", "layers": 2, "heads": 4, "ff": 128, "global_layers": 1},
    "decoder": {
        "type": "g_transformer",
        "layers": 2,
        "heads": 4,
        "ff": 128,
        "global_layers": 1,
        "global_cross_layers": 1,
    },
}


def test_finetuning_copies_shared_parameters_and_builds_two_lr_groups(trained_run, toy_dir, tmp_path):
    run = tmp_path / "ft"
    ckpt = init_from_run(trained_run, run)
    trainer = make_trainer(
        tiny_config(
            toy_dir,
            run,
            model={"encoder": G_TINY["encoder"], "decoder": G_TINY["decoder"]},
            train={"init_from": str(ckpt), "init_lr_scale": 0.2},
        )
    )
    sentence = torch.load(ckpt, weights_only=True)["model"]
    params = dict(trainer.model.named_parameters())
    shared = set(params) & set(sentence)
    new = set(params) - shared
    assert all(torch.equal(params[n].detach(), sentence[n]) for n in shared)
    assert "encoder.layers.0.self_attn.qkv.weight" in shared and "decoder.layers.1.cross_attn.q.weight" in shared
    assert new and all(any(p in n for p in ("global_", "gate")) for n in new)
    groups = {g["name"]: g for g in trainer.optimizer.param_groups}
    assert groups["initialised"]["lr_scale"] == 0.2 and groups["new"]["lr_scale"] == 1.0
    ids = lambda g: {id(p) for p in g["params"]}  # noqa: E731
    assert ids(groups["initialised"]) == {id(params[n]) for n in shared}
    assert ids(groups["new"]) == {id(params[n]) for n in new}


def test_finetuning_with_other_vocabularies_is_a_clear_error(trained_run, toy_dir, tmp_path):
    from onmt_doc.errors import UserError

    cfg = tiny_config(
        toy_dir,
        tmp_path / "other",
        vocab={"size": 200},
        model={"encoder": G_TINY["encoder"], "decoder": G_TINY["decoder"]},
        train={"init_from": str(trained_run / "checkpoints" / "last.pt")},
    )
    with pytest.raises(UserError, match="other vocabularies"):
        make_trainer(cfg)


def test_small_g_transformer_learns_the_context_dependent_pronouns(toy_dir, tmp_path):
    """A sentence-level model cannot beat chance (~33%) on these pronouns by construction of the
    toy corpus (docs/benchmarks.md measures it); the G-Transformer must get well over that. This
    short run reaches 0.72-0.85 depending on the CPU's float rounding, so the bar is 0.6: far
    above any sentence-level model, without failing on a slower-converging machine."""
    from onmt_doc.toy.pronoun_scoring import score_context

    cfg = tiny_config(
        toy_dir,
        tmp_path,
        data={"max_tokens": 96},
        model={"d_model": 64, "encoder": G_TINY["encoder"], "decoder": G_TINY["decoder"]},
        train={"max_steps": 500, "batch_tokens": 1536, "valid_every": 500, "save_every": 500},
        log={"tensorboard": True, "every": 100},
    )
    cfg["optim"]["lr"] = 3.0e-3
    train(config_from_dict(cfg))
    model, saved, codec = load_model(str(tmp_path / "checkpoints" / "last.pt"))
    hyp = tmp_path / "test.hyp"
    with open(hyp, "w", encoding="utf-8") as out:
        Translator(model, codec, saved).run_files(str(toy_dir / "test.src"), out)
    acc = score_context(str(hyp), str(toy_dir / "test.ctx"))["accuracy"]
    assert acc > 0.6, acc
    tags = _tensorboard_tags(tmp_path / "tensorboard")
    for name in (
        "entropy/enc_self_group",
        "entropy/enc_self_global",
        "entropy/dec_self_group",
        "entropy/dec_cross_group",
        "entropy/dec_cross_global",
        "gate/enc_self",
        "gate/dec_cross",
    ):
        assert f"valid/{name}" in tags


def _tensorboard_tags(folder) -> set:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def test_analysis_records_entropy_only_when_collecting():
    model, _ = random_model(G)
    batch = doc_batch()
    with torch.no_grad():
        model(batch)
        with analysis.collecting() as stats:
            model(batch)
    # every source token, head and layer (3 layers, 4 heads) counted once
    assert stats["entropy/enc_self_group#n"] == batch.src.ne(PAD_ID).sum().item() * 4 * 3
    # group attention is over fewer keys than global attention, so its entropy is lower
    mean = {k: v / stats[k + "#n"] for k, v in stats.items() if not k.endswith("#n")}
    assert mean["entropy/enc_self_group"] < mean["entropy/enc_self_global"]
    assert 0.0 < mean["gate/enc_self"] < 1.0


def test_a_compiled_forward_of_a_prepared_batch_is_one_graph_and_equals_eager():
    """``train.compile`` on the fused (GPU) path: the trainer hands the forward a batch whose sentence
    offsets were planned on the host beforehand (``EncoderDecoder.prepare``, ``Batch.plans``), and
    torch.compile traces the G-Transformer's forward in one graph; a batch not prepared (validation)
    leaves the graph only where the forward plans (``self_plan``, ``cross_plan``). Either way the
    traced forward and backward compute what the eager ones do (the GPU spec's compiled run and a
    user's ``train.compile: on`` would otherwise fail, or silently split, only on a GPU)."""
    from onmt_doc import devices

    model, _ = random_model(G, seed=3)
    batch = doc_batch()
    with devices.forced_path("fused"):
        prepared = model.prepare(batch, torch.device("cpu"))
        assert set(prepared.plans) == {ENC_SELF, DEC_SELF, DEC_CROSS}
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(prepared)
        assert explained.graph_count == 1, [str(r.reason)[:200] for r in explained.break_reasons]
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(batch)
        calls = [" | ".join(f.line for f in r.user_stack) for r in explained.break_reasons]  # where each left
        assert calls and all(re.search(r"\b(self|cross)_plan\(", c) for c in calls), calls
        params = list(model.parameters())
        expected = model(batch).logits
        assert torch.equal(model(prepared).logits, expected)  # the same plans, made earlier
        want = torch.autograd.grad(expected.square().sum(), params, allow_unused=True)
        torch._dynamo.reset()
        got = torch.compile(model, backend="aot_eager", dynamic=True)(prepared).logits
        grads = torch.autograd.grad(got.square().sum(), params, allow_unused=True)
    assert torch.allclose(got, expected, atol=1e-5)
    for a, b in zip(want, grads):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-5))
    assert model.prepare(batch, torch.device("cpu")).plans == {}  # the packed path plans in its forward
