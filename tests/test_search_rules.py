"""Each decoding rule alone (onmt_doc/translate/rules.py), Sockeye style: a hand-made log-probability
tensor in, the expected masked tensor out, both written by hand; then their order, the rules each
unit asks for, and the units' answers to the search and the translator."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from onmt_doc.contracts import Batch
from onmt_doc.data.instances import unit_class
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, PAD_ID, SOS_ID, UNK_ID
from onmt_doc.errors import ConfigError
from onmt_doc.translate.rules import (
    ForbiddenTokens,
    LengthCap,
    SentenceCount,
    SentenceMarkup,
    Step,
    TargetPrefix,
    apply_rules,
    count_words,
    is_word,
    search_rules,
)

X = float("-inf")
W1, W2 = 7, 8  # two words after the 7 specials
#       <pad> <unk>  <s>  </s> <bos> <eos> <mask>  w1    w2
ROW = [-1.0, -1.1, -1.2, -1.3, -1.4, -1.5, -1.6, -1.7, -1.8]
SOS_ONLY = [X, X, -1.2, X, X, X, X, X, X]
EOS_ONLY = [X, X, X, X, X, -1.5, X, X, X]
W1_ONLY = [X, X, X, X, X, X, X, -1.7, X]


def log_probs(rows: int) -> torch.Tensor:
    return torch.tensor([ROW] * rows)


def step(t: int, last: list[int], origin: list[int] | None = None) -> Step:
    return Step(t, torch.tensor(last), torch.tensor(origin if origin is not None else range(len(last))))


def check(rules, lp: torch.Tensor, at: Step, expected: list[list[float]]) -> None:
    before = lp.clone()
    assert torch.equal(apply_rules(rules, lp, at), torch.tensor(expected)), apply_rules(rules, lp, at)
    assert torch.equal(lp, before)  # rules never write into the scores forced tokens keep


# ------------------------------------------------------------------------------ one rule at a time
def test_sentence_markup_forces_s_after_bos_and_eos_after_the_closing_tag():
    """<eos> only after </s>: after a word the sentence must be closed first (a hypothesis
    ``<s> w <eos>`` would be scored without the </s> that forced decoding of its text scores)."""
    rule = SentenceMarkup()
    at = step(1, [BOS_ID, EOS_SENT_ID, W1, SOS_ID])
    assert rule.forced(at).tolist() == [SOS_ID, EOS_ID, -1, -1]
    no_eos = [-1.0, -1.1, -1.2, -1.3, -1.4, X, -1.6, -1.7, -1.8]
    check([rule], log_probs(4), at, [SOS_ONLY, EOS_ONLY, no_eos, no_eos])


def test_words_and_their_count_in_the_current_sentence():
    assert is_word(torch.arange(9)).tolist() == [False, True, False, False, False, False, False, True, True]
    words = count_words(torch.tensor([2, 0, 5, 3]), torch.tensor([SOS_ID, UNK_ID, W1, EOS_SENT_ID]))
    assert words.tolist() == [0, 1, 6, 3]  # <s> starts a sentence; </s> is no word


def test_forbidden_tokens_follow_the_words_of_each_rows_sentence():
    rule = ForbiddenTokens(2, torch.device("cpu"))
    # first step: after <bos> only <s> or a word; no </s> / <eos> before a word; <pad> <bos> <mask> never
    first = [X, -1.1, -1.2, X, X, X, X, -1.7, -1.8]
    check([rule], log_probs(2), step(0, [BOS_ID, BOS_ID]), [first, first])
    # rows 0, 0, 1 go on with <s>, w1, <unk>: words 0, 1, 1
    rule.advance(torch.tensor([0, 0, 1]), torch.tensor([SOS_ID, W1, UNK_ID]))
    assert rule.words.tolist() == [0, 1, 1]
    no_word = [X, -1.1, X, X, X, X, X, -1.7, -1.8]
    in_sentence = [X, -1.1, X, -1.3, X, -1.5, X, -1.7, -1.8]
    check([rule], log_probs(3), step(1, [SOS_ID, W1, UNK_ID]), [no_word, in_sentence, in_sentence])
    # rows 1, 2, 0 go on with </s>, <s>, w2: words 1, 0, 1; <s> is allowed after </s>
    rule.advance(torch.tensor([1, 2, 0]), torch.tensor([EOS_SENT_ID, SOS_ID, W2]))
    assert rule.words.tolist() == [1, 0, 1]
    closed = [X, -1.1, -1.2, -1.3, X, -1.5, X, -1.7, -1.8]
    check([rule], log_probs(3), step(2, [EOS_SENT_ID, SOS_ID, W2]), [closed, no_word, in_sentence])


def test_forbidden_tokens_without_markup_never_give_s_or_its_closing_tag():
    rule = ForbiddenTokens(2, torch.device("cpu"), markup=False)
    first = [X, -1.1, X, X, X, X, X, -1.7, -1.8]
    check([rule], log_probs(2), step(0, [BOS_ID, BOS_ID]), [first, first])
    rule.advance(torch.tensor([0, 1]), torch.tensor([W1, W2]))
    after_word = [X, -1.1, X, X, X, -1.5, X, -1.7, -1.8]
    check([rule], log_probs(2), step(1, [W1, W2]), [after_word, after_word])


def test_sentence_count_opens_the_next_sentence_and_holds_eos_back():
    rule = SentenceCount(torch.tensor([2, 1]))  # batch row 0: two source sentences, row 1: one
    no_eos = [-1.0, -1.1, -1.2, -1.3, -1.4, X, -1.6, -1.7, -1.8]
    check([rule], log_probs(2), step(0, [BOS_ID, BOS_ID]), [no_eos, ROW])
    # batch row 0 widens to two live rows; row 0 closes its first sentence, batch row 1 its only one
    rule.advance(torch.tensor([0, 0, 1]), torch.tensor([EOS_SENT_ID, W1, EOS_SENT_ID]))
    assert rule.closed.tolist() == [1, 0, 1]
    at = step(1, [EOS_SENT_ID, W1, EOS_SENT_ID], origin=[0, 0, 1])
    assert rule.forced(at).tolist() == [SOS_ID, -1, -1]
    check([rule], log_probs(3), at, [SOS_ONLY, no_eos, ROW])


def test_target_prefix_is_forced_token_by_token_keeping_model_scores():
    rule = TargetPrefix(torch.tensor([[SOS_ID, W1, EOS_SENT_ID], [SOS_ID, PAD_ID, PAD_ID]]))
    assert rule.lengths.tolist() == [3, 1]
    at = step(1, [SOS_ID, SOS_ID, SOS_ID], origin=[0, 0, 1])
    assert rule.forced(at).tolist() == [W1, W1, -1]  # batch row 1 is past its prefix
    check([rule], log_probs(3), at, [W1_ONLY, W1_ONLY, ROW])
    assert rule.forced(step(3, [EOS_SENT_ID, W2], origin=[0, 1])) is None  # past every prefix
    lp = log_probs(1)
    lp[0, W1] = X  # a forced token the model (or the decoder's constrain) gives -inf stays -inf
    check([rule], lp, step(1, [SOS_ID], origin=[0]), [[X] * 9])


def test_length_cap_forces_eos_and_tells_the_search_when_a_sentence_is_done():
    rule = LengthCap(torch.tensor([2, 5]))
    at = step(2, [W1, W1, W2], origin=[0, 1, 0])
    assert rule.forced(at).tolist() == [EOS_ID, -1, EOS_ID]
    check([rule], log_probs(3), at, [EOS_ONLY, ROW, EOS_ONLY])
    assert rule.reached(torch.tensor([1, 0]), 2).tolist() == [False, True]
    assert rule.reached(torch.tensor([1, 0]), 5).tolist() == [True, True]


# ------------------------------------------------------------------------------ their order
def test_a_later_rule_wins_and_forced_tokens_keep_their_model_score():
    """The search's order: the sentence rules, the forbidden tokens, the prefix, the cap last. At
    the first step markup forces <s>, the prefix w1 over it and the cap <eos> over both, at its
    model score although the forbidden tokens refuse <eos> before a word."""
    rules = [
        SentenceMarkup(),
        SentenceCount(torch.tensor([2, 2, 2, 1])),
        ForbiddenTokens(4, torch.device("cpu")),
        TargetPrefix(torch.tensor([[W1], [W1], [PAD_ID], [PAD_ID]])),
        LengthCap(torch.tensor([0, 5, 5, 5])),
    ]
    check(rules, log_probs(4), step(0, [BOS_ID] * 4), [EOS_ONLY, W1_ONLY, SOS_ONLY, SOS_ONLY])
    # after </s>: <s> while the source has sentences to go (the count over markup), else <eos>
    for rule in rules:
        rule.advance(torch.tensor([2, 3]), torch.tensor([EOS_SENT_ID, EOS_SENT_ID]))
    check(rules, log_probs(2), step(1, [EOS_SENT_ID, EOS_SENT_ID], origin=[2, 3]), [SOS_ONLY, EOS_ONLY])


# ------------------------------------------------------------------------------ the rules of each unit
def batch() -> Batch:
    src = torch.tensor([[SOS_ID, W1, EOS_SENT_ID, SOS_ID, W2, EOS_SENT_ID], [SOS_ID, W1, EOS_SENT_ID, 0, 0, 0]])
    return Batch(src=src, src_groups=torch.zeros_like(src))


@pytest.mark.parametrize(
    "unit, markup, expected",
    [
        ("sentence", True, ["SentenceMarkup", "ForbiddenTokens", "LengthCap"]),
        ("sentence", False, ["ForbiddenTokens", "LengthCap"]),
        ("context", True, ["SentenceMarkup", "ForbiddenTokens", "LengthCap"]),
        ("k_to_1", True, ["SentenceMarkup", "ForbiddenTokens", "LengthCap"]),
        ("document", True, ["ForbiddenTokens", "LengthCap"]),  # the decoder's constrain frames documents
        ("k_to_k", True, ["SentenceMarkup", "SentenceCount", "ForbiddenTokens", "LengthCap"]),
    ],
)
def test_each_unit_asks_for_its_rules(unit, markup, expected):
    rules = search_rules(unit, batch(), torch.tensor([5, 6]), markup=markup)
    assert [type(r).__name__ for r in rules.rules] == expected
    assert rules.rules[-1] is rules.cap and rules.cap.caps.tolist() == [5, 6]


def test_k_to_k_counts_the_source_sentences_and_a_prefix_lengthens_the_cap():
    prefix = torch.tensor([[SOS_ID, W1, EOS_SENT_ID], [PAD_ID, PAD_ID, PAD_ID]])
    rules = search_rules("k_to_k", batch(), torch.tensor([5, 6]), prefix=prefix)
    names = [type(r).__name__ for r in rules.rules]
    assert names == ["SentenceMarkup", "SentenceCount", "ForbiddenTokens", "TargetPrefix", "LengthCap"]
    assert rules.rules[1].sentences.tolist() == [2, 1]
    assert rules.cap.caps.tolist() == [8, 6]


def test_bare_sentences_are_for_the_sentence_unit_only():
    with pytest.raises(ConfigError, match="sentences without markup are for the sentence unit only, not k_to_1"):
        search_rules("k_to_1", batch(), torch.tensor([5, 6]), markup=False)


# ------------------------------------------------------------------------------ what units answer
DATA = SimpleNamespace(documents=True, sentence_markup=True, max_tokens=512, max_sentences=4, context_sentences=2)


@pytest.mark.parametrize(
    "unit, marks, counts, bare, context, written, settings",
    [
        ("sentence", True, False, True, False, [3], {"documents": True, "sentence_markup": True}),
        ("document", False, False, False, False, [3, 4, 5], {"documents": True, "max_tokens": 512}),
        ("context", True, False, False, False, [3], {"documents": True, "max_tokens": 512, "max_sentences": 4}),
        ("k_to_1", True, False, False, False, [3], {"documents": True, "context_sentences": 2}),
        ("k_to_k", True, True, False, True, [5], {"documents": True, "context_sentences": 2}),
    ],
)
def test_units_answer_what_search_and_translation_do_with_a_row(unit, marks, counts, bare, context, written, settings):
    cls = unit_class(unit)
    assert cls.search_marks_sentences() is marks
    assert cls.counts_source_sentences() is counts
    assert cls.markup_optional() is bare
    assert cls.has_target_context() is context
    # a row starting at sentence 3: one sentence, or three (document, k_to_k)
    n = 1 if unit in ("sentence", "context", "k_to_1") else 3
    assert list(cls.output_sentences(3, n)) == written
    assert cls.input_settings(DATA) == settings
