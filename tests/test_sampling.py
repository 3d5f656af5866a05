"""Issue 20, sampling as a search strategy: seeded and repeatable, the rules of the loop still hold
(sentence counts of documents), and the samples follow the model's (tempered, filtered)
distribution."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from conftest import module_cmd, run_cli
from model_helpers import random_batch, random_model, record_raw_hypotheses
from test_decoding import SIZES, TRANSFORMER, stepwise_log_probs
from test_g_transformer import G
from test_hm_gdc import BOTH as HM_GDC
from test_translate_safety import save_random, sentences

from onmt_doc.config import ConfigError, TranslateConfig, config_from_dict
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, SOS_ID, SPECIALS, UNK_ID
from onmt_doc.translate.length_penalty import NoPenalty
from onmt_doc.translate.search import BeamSearch, GreedySearch, SamplingSearch, build_search
from onmt_doc.translate.translator import Translator

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

DOCS = [sentences(6, seed=1), sentences(1, seed=2), sentences(9, seed=3), sentences(4, seed=4)]


def translate(section: dict, model_seed: int = 0, docs=DOCS, **translate_options) -> list[list[str]]:
    """``docs`` translated by a fresh translator of a random model (``model_seed``) with these
    ``translate`` options (``seed`` among them is the sampling seed)."""
    model, codec = random_model(section, seed=model_seed)
    cfg = config_from_dict({"translate": translate_options, "data": {"max_tokens": 40}})
    return Translator(model, codec, cfg).translate_documents(docs)


# ------------------------------------------------------------------------------ options
def test_build_search_picks_sampling_and_checks_its_options():
    search = build_search(TranslateConfig(strategy="sampling", temperature=0.5, top_k=7, top_p=0.9, seed=5, n_best=3))
    assert isinstance(search, SamplingSearch) and search.n_best == 3
    assert (search.temperature, search.top_k, search.top_p, search.seed) == (0.5, 7, 0.9, 5)
    assert isinstance(build_search(TranslateConfig(beam=1)), GreedySearch)  # beam 1 stays greedy
    assert isinstance(build_search(TranslateConfig()), BeamSearch)
    for bad, needle in (({"temperature": 0.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p")):
        with pytest.raises(ConfigError, match=needle):
            build_search(TranslateConfig(strategy="sampling", **bad))
    with pytest.raises(ConfigError, match="translate.top_k"):
        config_from_dict({"translate": {"strategy": "sampling", "top_k": -1}})
    with pytest.raises(ConfigError, match="temperature"):
        config_from_dict({"translate": {"strategy": "sampling", "temperature": -1.0}})
    # samples are independent: more of them than the (unused) beam is fine
    assert config_from_dict({"translate": {"strategy": "sampling", "n_best": 8, "beam": 2}}).translate.n_best == 8


# ------------------------------------------------------------------------------ repeatability
def test_a_seeded_run_repeats_exactly_and_leaves_the_global_generator_alone():
    model, codec = random_model(TRANSFORMER)
    translator = Translator(model, codec, config_from_dict({"translate": {"strategy": "sampling", "seed": 11}}))
    before = torch.get_rng_state()
    first = translator.translate_documents(DOCS)
    assert torch.equal(torch.get_rng_state(), before)
    assert first == translate(TRANSFORMER, strategy="sampling", seed=11)  # a new run: the same samples
    torch.manual_seed(456)  # the global generator has no say
    assert translate(TRANSFORMER, strategy="sampling", seed=11) == first
    assert translate(TRANSFORMER, strategy="sampling", seed=12) != first
    assert first != translate(TRANSFORMER, beam=1)
    assert translator.translate_documents(DOCS) != first  # the same translator draws on: new samples


def test_different_seeds_give_different_samples_on_every_line_set():
    """Over 20 lines of a near-uniform random model, two seeds agreeing everywhere is impossible in
    practice; most lines differ."""
    a = translate(TRANSFORMER, strategy="sampling", seed=1)
    b = translate(TRANSFORMER, strategy="sampling", seed=2)
    lines = [(x, y) for da, db in zip(a, b) for x, y in zip(da, db)]
    assert len(lines) == 20 and sum(x != y for x, y in lines) >= 15


@pytest.mark.parametrize("options", [{"top_k": 1}, {"temperature": 1e-5}], ids=["top_k_1", "temperature_0"])
@pytest.mark.parametrize("model", ["transformer", "g_transformer"])
def test_degenerate_sampling_is_greedy_decoding(options, model):
    section = {"transformer": TRANSFORMER, "g_transformer": G}[model]
    greedy = translate(section, model_seed=5, beam=1)
    assert translate(section, model_seed=5, strategy="sampling", **options) == greedy


def test_sample_scores_are_untempered_model_log_probabilities():
    """A sample drawn at temperature 0.7 with top-k reports the model's own log-probability of its
    tokens (summed step log-probabilities), not the tempered or filtered one."""
    model, _ = random_model(TRANSFORMER, seed=2)
    batch = random_batch(SIZES)
    search = SamplingSearch(temperature=0.7, top_k=5, seed=3, penalty=NoPenalty(), max_len_ratio=1.0, max_len_add=4)
    hyps = search.search(model, batch)
    for row, (hyp,) in enumerate(hyps):
        tokens = torch.tensor([[BOS_ID] + hyp.tokens])
        one = random_batch([SIZES[row]])
        one.src = batch.src[row : row + 1, : int(batch.src[row].ne(0).sum())]
        one.src_groups = batch.src_groups[row : row + 1, : one.src.size(1)]
        with torch.no_grad():
            lp = stepwise_log_probs(model, one, tokens)[0]
        expected = float(lp.gather(1, torch.tensor(hyp.tokens + [EOS_ID])[:, None]).sum())
        assert hyp.log_prob == pytest.approx(expected, abs=1e-4) and hyp.score == hyp.log_prob


def test_the_command_samples_with_its_flags(tmp_path):
    """``onmt_doc_translate -strategy sampling -seed … -top_p … -n_best 2`` (checkpoint: beam 1)
    writes what the API's sampling translator writes for those options, and another seed differs."""
    ckpt = str(save_random(tmp_path / "model.pt", TRANSFORMER, translate={"beam": 1}))
    src = tmp_path / "in.src"
    src.write_text("\n\n".join("\n".join(d) for d in DOCS) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    flags = ["-strategy", "sampling", "-seed", "7", "-top_p", "0.9", "-temperature", "1.2", "-n_best", "2"]
    proc = run_cli(*module_cmd("onmt_doc.bin.translate"), "-model", ckpt, "-src", str(src), "-output", str(out), *flags)
    assert proc.returncode == 0, proc.stderr
    options = dict(strategy="sampling", top_p=0.9, temperature=1.2, n_best=2)
    same, other = io.StringIO(), io.StringIO()
    Translator.load(ckpt, "cpu", seed=7, **options).run_files(str(src), same)
    Translator.load(ckpt, "cpu", seed=8, **options).run_files(str(src), other)
    text = out.read_text(encoding="utf-8")
    assert text == same.getvalue() != other.getvalue()
    lines = [line for line in text.splitlines() if line]
    assert len(lines) == sum(len(d) for d in DOCS) and all(len(line.split("\t")) == 2 for line in lines)


# ------------------------------------------------------------------------------ document rules
@pytest.mark.parametrize("n_best", [1, 3])
def test_sampled_g_transformer_documents_keep_their_sentence_count(n_best):
    """Every raw sampled document hypothesis (before any padding or merging) has the source's
    ``<s> … </s>`` groups, also with several samples per document."""
    model, codec = random_model(G, seed=7)
    cfg = config_from_dict({"data": {"max_tokens": 24}, "translate": {"strategy": "sampling", "n_best": n_best}})
    translator = Translator(model, codec, cfg)
    raw = record_raw_hypotheses(translator)
    out = translator.translate_documents(DOCS)
    assert [len(d) for d in out] == [len(d) for d in DOCS] and translator.stats.docs_repaired == 0
    assert all(len(line.split("\t")) == n_best for d in out for line in d)
    assert len(raw) > len(DOCS)  # max_tokens cut documents into several instances
    for src, hyps in raw:
        n = int(src.eq(SOS_ID).sum())
        assert len(hyps) == n_best
        for h in hyps:
            assert h.tokens.count(SOS_ID) == h.tokens.count(EOS_SENT_ID) == n, (n, h.tokens)


def test_sampled_hm_gdc_windows_keep_one_line_per_sentence():
    out = translate(HM_GDC, strategy="sampling", n_best=2)
    assert [len(d) for d in out] == [len(d) for d in DOCS]
    assert all(len(line.split("\t")) == 2 and all(f.strip() for f in line.split("\t")) for d in out for line in d)


# ------------------------------------------------------------------------------ the distribution
def reference_distribution(log_probs: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The distribution sampling should follow, written out token by token: tempered softmax,
    the k most probable, then the most probable until their mass reaches p."""
    p = np.exp((log_probs - log_probs.max()) / temperature)
    p /= p.sum()
    order = sorted(range(len(p)), key=lambda i: -p[i])
    kept = order[:top_k] if top_k else order
    mass, nucleus = 0.0, []
    total = sum(p[i] for i in kept)
    for i in kept:
        if mass >= top_p:
            break
        nucleus.append(i)
        mass += p[i] / total
    q = np.zeros_like(p)
    q[nucleus] = p[nucleus]
    return q / q.sum()


@pytest.mark.parametrize(
    "temperature, top_k, top_p, wrong",
    [(1.0, 0, 1.0, (0.7, 0, 1.0)), (0.7, 0, 1.0, (1.0, 0, 1.0)), (1.3, 8, 0.8, (1.3, 8, 1.0))],
    ids=["plain", "temperature", "top_k_top_p"],
)
def test_first_words_follow_the_model_distribution(temperature, top_k, top_p, wrong):
    """2,000 samples of one sentence: the first word's frequencies match the reference
    distribution within 4 sigma for every word (and tokens outside the filters never occur),
    while a wrong setting (``wrong``) would be caught by the same tolerance."""
    model, _ = random_model(TRANSFORMER, seed=4)  # first-word probabilities 0.13, 0.09, 0.06, …
    batch = random_batch([(6, 3)])
    n = 2000
    search = SamplingSearch(temperature, top_k, top_p, seed=9, n_best=n, max_len_ratio=0.0, max_len_add=0)
    hyps = search.search(model, batch)[0]
    assert len(hyps) == n
    counts = np.bincount([h.tokens[1] for h in hyps], minlength=model.generator.out_features)
    # the model's distribution of the first word: after <bos> <s>, only words may come (forbid_empty)
    with torch.no_grad():
        lp = stepwise_log_probs(model, batch, torch.tensor([[BOS_ID, SOS_ID]]))[0, 1].double().numpy()
    words = np.array([i >= len(SPECIALS) or i == UNK_ID for i in range(len(lp))])

    def expected(t: float, k: int, p: float) -> np.ndarray:
        q = np.zeros(len(lp))
        q[words] = reference_distribution(lp[words], t, k, p)
        return q

    def worst_sigma(q: np.ndarray) -> float:
        sigma = np.sqrt(n * q * (1 - q)) + 1e-9
        return float(np.max(np.abs(counts - n * q) / np.maximum(sigma, 1.0)))

    q = expected(temperature, top_k, top_p)
    assert counts[q == 0].sum() == 0
    assert q.max() < 0.5 and (q > 0.02).sum() >= 3  # several likely words: the test can see a shape
    assert worst_sigma(q) < 4.0, worst_sigma(q)
    assert worst_sigma(expected(*wrong)) > 4.0
    assert math.isclose(q.sum(), 1.0)
