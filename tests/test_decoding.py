"""Stepwise decoding equals the teacher-forced pass; beam search agrees with forced decoding."""

from __future__ import annotations

import pytest
import torch
from model_helpers import random_batch, random_model

from onmt_doc.contracts import LengthLimit
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, MASK_ID, PAD_ID, SOS_ID
from onmt_doc.models.model import full_log_probs
from onmt_doc.translate.length_penalty import GNMTPenalty
from onmt_doc.translate.search import BeamSearch

TRANSFORMER = {
    "encoder": {"type": "transformer", "layers": 2, "heads": 4, "ff": 64},
    "decoder": {"type": "transformer", "layers": 2, "heads": 4, "ff": 64},
}
POST_NORM = {
    "encoder": {**TRANSFORMER["encoder"], "pre_norm": False},
    "decoder": {**TRANSFORMER["decoder"], "pre_norm": False},
}
SIZES = [(5, 7), (9, 3), (2, 6), (7, 7)]


def stepwise_log_probs(model, batch, tgt_in, reorder_at=None, perm=None):
    """Feed tgt_in one token at a time; optionally permute the batch rows at step ``reorder_at``."""
    state = model.init_state(model.encode(batch), batch)
    out = []
    for t in range(tgt_in.size(1)):
        if reorder_at is not None and t == reorder_at:
            state = state.reorder(perm)
            tgt_in = tgt_in[perm]
            out = [o[perm] for o in out]
        lp, state = model.step(tgt_in[:, t], state)
        out.append(lp)
    return torch.stack(out, 1)


def assert_stepwise_matches(model, batch, perm: torch.Tensor, reorder_at: int = 2) -> None:
    """Stepwise decoding gives the teacher-forced log-probabilities (1e-5), also when the rows are
    permuted by ``perm`` before step ``reorder_at`` (as beam search reorders its state). Runs on
    the batch's device (``perm`` is moved there)."""
    perm = perm.to(batch.src.device)
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        stepped = stepwise_log_probs(model, batch, batch.tgt_in)
        reordered = stepwise_log_probs(model, batch, batch.tgt_in, reorder_at=reorder_at, perm=perm)
    mask = batch.tgt_out.ne(PAD_ID)
    assert torch.allclose(forced[mask], stepped[mask], atol=1e-5), (forced - stepped)[mask].abs().max()
    assert torch.allclose(forced[perm][mask[perm]], reordered[mask[perm]], atol=1e-5)


@pytest.mark.parametrize("section", [TRANSFORMER, POST_NORM], ids=["pre_norm", "post_norm"])
def test_stepwise_equals_teacher_forced(section, device):
    model, _ = random_model(section, device=device)
    batch = random_batch(SIZES, device=device)
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        stepped = stepwise_log_probs(model, batch, batch.tgt_in)
    mask = batch.tgt_out.ne(PAD_ID)
    assert torch.allclose(forced[mask], stepped[mask], atol=1e-5), (forced - stepped)[mask].abs().max()


def test_stepwise_equals_teacher_forced_after_reorder(device):
    """Reordering the state mid-sequence (as beam search does) keeps every row consistent."""
    model, _ = random_model(TRANSFORMER, device=device)
    batch = random_batch(SIZES, device=device)
    perm = torch.tensor([2, 0, 3, 1], device=device)
    with torch.no_grad():
        forced = full_log_probs(model, batch)[perm]
        stepped = stepwise_log_probs(model, batch, batch.tgt_in, reorder_at=3, perm=perm)
    mask = batch.tgt_out[perm].ne(PAD_ID)
    assert torch.allclose(forced[mask], stepped[mask], atol=1e-5)


def test_beam_internal_reorder_keeps_source_fields(device):
    """Rows expanded per beam and shuffled within their sentence (same_sources=True) still match."""
    model, _ = random_model(TRANSFORMER, device=device)
    batch = random_batch(SIZES[:2], device=device)
    k = 3
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        expand = torch.arange(2, device=device).repeat_interleave(k)
        state = model.init_state(model.encode(batch), batch).reorder(expand)
        tgt = batch.tgt_in.repeat_interleave(k, 0)
        within = torch.tensor([2, 0, 1, 4, 5, 3], device=device)  # beams move only inside their sentence
        steps = []
        for t in range(tgt.size(1)):
            if t == 2:
                state = state.reorder(within, same_sources=True)
                tgt = tgt[within]
                steps = [s[within] for s in steps]
            lp, state = model.step(tgt[:, t], state)
            steps.append(lp)
        stepped = torch.stack(steps, 1)
    expected = forced.repeat_interleave(k, 0)
    mask = batch.tgt_out.repeat_interleave(k, 0).ne(PAD_ID)
    assert torch.allclose(expected[mask], stepped[mask], atol=1e-5)


def test_beam_scores_equal_forced_decoding(device):
    """Each hypothesis' log-probability equals the teacher-forced log-probability of its tokens."""
    model, _ = random_model(TRANSFORMER, seed=3, device=device)
    batch = random_batch(SIZES, device=device)
    search = BeamSearch(beam=4, n_best=3, penalty=GNMTPenalty(1.0), max_len_ratio=1.0, max_len_add=4)
    with torch.no_grad():
        results = search.search(model, batch)
        enc = model.encode(batch)
        for row, hyps in enumerate(results):
            assert 1 <= len(hyps) <= 3
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
            for h in hyps:
                tokens = torch.tensor([h.tokens + [EOS_ID]], device=device)
                tgt_in = torch.cat([batch.tgt_in[:1, :1], tokens[:, :-1]], 1)
                sub = random_batch([(1, 1)], device=device)
                sub.src, sub.src_groups = batch.src[row : row + 1], batch.src_groups[row : row + 1]
                sub.tgt_in, sub.tgt_out = tgt_in, tokens
                from onmt_doc.contracts import EncoderOut

                one = EncoderOut(enc.memory[row : row + 1], enc.pad_mask[row : row + 1])
                lp = full_log_probs(model, sub, one)[0].gather(1, tokens[0, :, None]).sum()
                assert abs(float(lp) - h.log_prob) < 1e-4
                lp_len = float(GNMTPenalty(1.0)(torch.tensor(float(len(h.tokens) + 1))))
                assert abs(h.score - h.log_prob / lp_len) < 1e-5


def test_greedy_equals_argmax_of_forced_pass(device):
    """Beam 1 picks, at every step, the argmax of the teacher-forced distribution of its own output
    (sentence markup: ``<s>`` after ``<bos>``, ``<eos>`` after ``</s>`` and at the length cap)."""
    model, _ = random_model(TRANSFORMER, seed=5, device=device)
    batch = random_batch(SIZES, device=device)
    with torch.no_grad():
        hyps = BeamSearch(beam=1, penalty=GNMTPenalty(0.0), max_len_ratio=1.0, max_len_add=5).search(model, batch)
        enc = model.encode(batch)
        state = model.init_state(enc, batch)
        tokens = batch.tgt_in[:, 0]
        greedy = [[] for _ in SIZES]
        done = torch.zeros(len(SIZES), dtype=torch.bool)
        max_len = model.decoder.max_output_lengths(batch, LengthLimit(1.0, 5))
        for t in range(int(max_len.max()) + 1):
            lp, state = model.step(tokens, state)
            forced = torch.where(tokens == BOS_ID, SOS_ID, torch.where(tokens == EOS_SENT_ID, EOS_ID, -1))
            forced[max_len <= t] = EOS_ID
            # no empty sentence: no </s>/<eos> before a word, <s> only at the start, no pad/bos/mask
            lp[:, [PAD_ID, BOS_ID, MASK_ID, SOS_ID]] = float("-inf")
            no_word = torch.tensor([len(g) <= 1 for g in greedy], device=device)  # only <s> so far
            lp[no_word, EOS_SENT_ID] = lp[no_word, EOS_ID] = float("-inf")
            tokens = torch.where(forced >= 0, forced, lp.argmax(-1))
            for i in range(len(SIZES)):
                if not done[i]:
                    if tokens[i] == EOS_ID:
                        done[i] = True
                    else:
                        greedy[i].append(int(tokens[i]))
    assert [h[0].tokens for h in hyps] == greedy


def test_finished_sentences_leave_the_batch_without_changing_results(device):
    """A sentence's result does not depend on which other sentences share its batch."""
    model, _ = random_model(TRANSFORMER, seed=7, device=device)
    search = BeamSearch(beam=3, penalty=GNMTPenalty(0.6), max_len_ratio=1.5, max_len_add=3)
    batch = random_batch(SIZES, seed=4, device=device)
    with torch.no_grad():
        together = search.search(model, batch)
        for i in range(len(SIZES)):
            alone = search.search(
                model,
                random_batch([SIZES[i]], seed=0).__class__(
                    src=batch.src[i : i + 1, : int(batch.src[i].ne(PAD_ID).sum())],
                    src_groups=batch.src_groups[i : i + 1, : int(batch.src[i].ne(PAD_ID).sum())],
                ),
            )
            assert alone[0][0].tokens == together[i][0].tokens
            assert abs(alone[0][0].score - together[i][0].score) < 1e-4


def test_sentence_hypotheses_follow_the_markup(device):
    """Every hypothesis of a sentence model is ``<s> … </s>`` (``</s>`` only last) or was cut at
    the length cap, even from an untrained model that prefers other tokens."""
    model, _ = random_model(TRANSFORMER, seed=11, device=device)
    batch = random_batch(SIZES, seed=2, device=device)
    with torch.no_grad():
        results = BeamSearch(beam=3, n_best=3, max_len_ratio=1.0, max_len_add=6).search(model, batch)
    caps = model.decoder.max_output_lengths(batch, LengthLimit(1.0, 6))
    for hyps, cap in zip(results, caps.tolist()):
        for h in hyps:
            assert h.tokens[0] == SOS_ID
            assert EOS_SENT_ID not in h.tokens[:-1]
            assert h.tokens[-1] == EOS_SENT_ID or len(h.tokens) == cap
