"""Issue 20, ensembles: several models decoded as one by averaging their log-probabilities or probabilities
(onmt_doc/translate/ensemble.py), checked against each member's own outputs."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import torch
from conftest import module_cmd, run_cli, tiny_config
from model_helpers import N_WORDS, random_batch, random_model, record_raw_hypotheses
from test_decoding import SIZES, TRANSFORMER, assert_stepwise_matches, stepwise_log_probs
from test_g_transformer import G, doc_batch
from test_hm_gdc import BOTH as HM_GDC
from test_hm_gdc import context_batch, random_docs
from test_translate_safety import one_line_error

from onmt_doc.config import config_from_dict, config_to_dict
from onmt_doc.data.codec import Codec
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import EOS_SENT_ID, PAD_ID, SOS_ID, SPECIALS, Vocab
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.models.builder import build_model
from onmt_doc.models.checkpoint import save_checkpoint
from onmt_doc.models.model import full_log_probs
from onmt_doc.registry import registry_for
from onmt_doc.train.trainer import train
from onmt_doc.translate.ensemble import EnsembleModel, load_models
from onmt_doc.translate.forced_decoding import sentence_log_probs
from onmt_doc.translate.translator import Translator

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)

MHPLSTM = {"encoder": TRANSFORMER["encoder"], "decoder": {"type": "mhplstm", "layers": 2, "heads": 4, "ff": 64}}
GATED = {"encoder": TRANSFORMER["encoder"], "decoder": {"type": "gated_transformer", "layers": 2, "heads": 4, "ff": 64}}
REFORMER = {"encoder": {"type": "embedding"}, "decoder": {"type": "reformer", "layers": 2, "heads": 4, "ff": 64}}
# a model section and a batch of its unit, one per registered decoder
CASES = {
    "transformer": (TRANSFORMER, lambda: random_batch(SIZES)),
    "mhplstm": (MHPLSTM, lambda: random_batch(SIZES)),
    "gated_transformer": (GATED, lambda: random_batch(SIZES)),
    "reformer": (REFORMER, lambda: random_batch(SIZES)),
    "g_transformer": (G, lambda: doc_batch()),
    "hm_gdc": (HM_GDC, lambda: context_batch(random_docs([3, 1, 2]))),
}


def test_the_cases_cover_every_registered_decoder():
    """A decoder registered later must join CASES: ensembles go through its decoding state too."""
    assert {section["decoder"]["type"] for section, _ in CASES.values()} == set(registry_for("decoder").names())


def _test_lines(toy_dir: Path, n: int) -> list[list[str]]:
    """The first ``n`` documents of the toy test set."""
    docs, cur = [], []
    for line in (toy_dir / "test.src").read_text(encoding="utf-8").splitlines():
        if line.strip():
            cur.append(line)
        elif cur:
            docs.append(cur)
            cur = []
    return (docs + [cur] if cur else docs)[:n]


@pytest.fixture(scope="module")
def second_run(trained_run, toy_dir, tmp_path_factory) -> Path:
    """A second tiny model with the first one's vocabulary, another seed and fewer steps."""
    run = tmp_path_factory.mktemp("trained_seed2")
    for name in ("subword.model", "vocab.txt"):
        shutil.copy(trained_run / name, run / name)
    cfg = tiny_config(toy_dir, run, train={"max_steps": 40, "save_every": 40, "valid_every": 40, "seed": 2})
    train(config_from_dict(cfg))
    return run


def _ckpt(run: Path) -> str:
    return str(run / "checkpoints" / "last.pt")


# ------------------------------------------------------------------------------ one model
@pytest.mark.parametrize("name", CASES)
def test_an_ensemble_of_one_model_equals_the_model(name, device):
    """Step log-probabilities, teacher-forced log-probabilities and forced-decoding sentence scores
    of a one-model ensemble are the model's (1e-6), for every unit."""
    section, make_batch = CASES[name]
    model, _ = random_model(section, seed=3, device=device)
    ensemble = EnsembleModel([model]).eval()
    batch = make_batch().to(device)
    mask = batch.tgt_out.ne(PAD_ID)
    n_sents = [int(batch.tgt_out[r].eq(EOS_SENT_ID).sum()) for r in range(batch.size)]
    with torch.no_grad():
        for fn in (lambda m: stepwise_log_probs(m, batch, batch.tgt_in), lambda m: full_log_probs(m, batch)):
            a, b = fn(model), fn(ensemble)
            assert torch.allclose(a[mask], b[mask], atol=1e-6), (a - b)[mask].abs().max()
        scores_model = torch.tensor(sentence_log_probs(model, batch, n_sents)[0])
        scores_ensemble = torch.tensor(sentence_log_probs(ensemble, batch, n_sents)[0])
    assert torch.allclose(scores_model, scores_ensemble, atol=1e-6)


def test_load_models_with_one_path_is_load_model(trained_run):
    model, cfg, codec = load_models([_ckpt(trained_run)])
    assert not isinstance(model, EnsembleModel) and not model.training
    assert cfg.translate.beam == 3 and codec.tgt_vocab.itos[: len(SPECIALS)] == list(SPECIALS)


def test_an_ensemble_of_a_model_with_itself_translates_like_the_model(trained_run, toy_dir, device):
    """Averaging a distribution with itself changes nothing: the same beam-4 translations."""
    path = _ckpt(trained_run)
    model, cfg, codec = load_models([path])
    ensemble, cfg2, _ = load_models([path, path])
    model, ensemble = model.to(device), ensemble.to(device)  # the Translator runs on the model's device
    assert isinstance(ensemble, EnsembleModel) and len(ensemble.members) == 2
    docs = _test_lines(toy_dir, 12)
    options = config_from_dict({"translate": {"beam": 4}}).translate
    expected = Translator(model, codec, cfg, options).translate_documents(docs)
    got = Translator(ensemble, codec, cfg2, options).translate_documents(docs)
    assert got == expected
    assert sum(len(d) for d in got) > 20


# ------------------------------------------------------------------------------ two models
def test_two_trained_models_average_their_probabilities(trained_run, second_run, toy_dir, device):
    """The ensemble's step log-probabilities are (log p1 + log p2) / 2 of the members' own step
    outputs (the default, ``log_prob``) or log((p1 + p2) / 2) (``prob``), and its translations differ
    from each member's."""
    (a, cfg, codec), (b, _, _) = load_models([_ckpt(trained_run)]), load_models([_ckpt(second_run)])
    ensemble, _, _ = load_models([_ckpt(trained_run), _ckpt(second_run)])
    a, b, ensemble = a.to(device), b.to(device), ensemble.to(device)  # the Translators run on this device
    assert ensemble.average == "log_prob"
    batch = random_batch(SIZES, device=device)
    batch.src.clamp_(max=len(codec.src_vocab) - 1)
    batch.tgt_in.clamp_(max=len(codec.tgt_vocab) - 1)
    mask = batch.tgt_in.ne(PAD_ID)
    with torch.no_grad():
        p1 = stepwise_log_probs(a, batch, batch.tgt_in).double().exp()
        p2 = stepwise_log_probs(b, batch, batch.tgt_in).double().exp()
        for average, expected in (("log_prob", (p1.log() + p2.log()) / 2), ("prob", ((p1 + p2) / 2).log())):
            ensemble.average = average
            got = stepwise_log_probs(ensemble, batch, batch.tgt_in).double()
            assert torch.allclose(got[mask], expected[mask], atol=1e-5), (average, (got - expected)[mask].abs().max())
    assert (p1 - p2)[mask].abs().max() > 0.05  # the members really differ (so the two averages differ)
    ensemble.average = "log_prob"
    docs = _test_lines(toy_dir, 8)
    options = config_from_dict({"translate": {"beam": 2}}).translate
    outs = [Translator(m, codec, cfg, options).translate_documents(docs) for m in (a, b, ensemble)]
    assert outs[2] != outs[0] and outs[2] != outs[1]


def test_mixed_architectures_step_like_their_teacher_forced_pass(device):
    """A Transformer and an MHPLSTM with one vocabulary: stepwise ensemble decoding (with a beam
    reorder mid-way) equals the teacher-forced ensemble pass (1e-5), and beam search runs on it."""
    (t, codec), (m, _) = random_model(TRANSFORMER, seed=1, device=device), random_model(MHPLSTM, seed=2, device=device)
    ensemble = EnsembleModel([t, m]).eval()
    assert_stepwise_matches(ensemble, random_batch(SIZES, device=device), torch.tensor([2, 0, 3, 1]))
    cfg = config_from_dict({"translate": {"beam": 3}})
    out = Translator(ensemble, codec, cfg).translate_documents([[f"w{i} w{i + 1} w3" for i in range(5)]])
    assert len(out[0]) == 5 and all(line.strip() for line in out[0])


@pytest.mark.parametrize("name", CASES)
def test_two_model_ensembles_step_like_their_teacher_forced_pass(name, device):
    """Two members of every decoder (two seeds): stepwise decoding with a reorder mid-way equals the
    teacher-forced ensemble pass, so each member's decoding state is carried and reordered right;
    the steps are the log of the members' mean probability (``prob``), computed from their own steps."""
    section, make_batch = CASES[name]
    members = [random_model(section, seed=1, device=device)[0], random_model(section, seed=2, device=device)[0]]
    ensemble = EnsembleModel(members, average="prob").eval()
    batch = make_batch().to(device)
    assert_stepwise_matches(ensemble, batch, torch.arange(batch.size).flip(0))
    with torch.no_grad():
        p1, p2 = (stepwise_log_probs(m, batch, batch.tgt_in).double().exp() for m in members)
        got = stepwise_log_probs(ensemble, batch, batch.tgt_in).double()
    mask = batch.tgt_out.ne(PAD_ID)
    expected = ((p1 + p2) / 2).log()
    assert torch.allclose(got[mask], expected[mask], atol=1e-5), (got - expected)[mask].abs().max()
    assert (p1 - p2)[mask].abs().max() > 1e-3  # the two seeds really differ


def test_a_g_transformer_ensemble_keeps_the_sentence_count(device):
    """Two G-Transformers (two seeds): every raw document hypothesis has the source's ``<s> … </s>``
    groups, so no line is padded or merged (the Translator runs on the members' device)."""
    members = [random_model(G, seed=7, device=device)[0], random_model(G, seed=8, device=device)[0]]
    ensemble = EnsembleModel(members).eval()
    _, codec = random_model(G, seed=7)
    docs = [[f"w{i % 9} w{(i * 3) % 11} w5" for i in range(n)] for n in (1, 2, 5, 9)]
    cfg = config_from_dict({"data": {"max_tokens": 24}, "translate": {"beam": 3, "max_len_add": 2}})
    translator = Translator(ensemble, codec, cfg)
    raw = record_raw_hypotheses(translator)
    out = translator.translate_documents(docs)
    assert [len(d) for d in out] == [len(d) for d in docs] and translator.stats.docs_repaired == 0
    assert len(raw) > len(docs)  # max_tokens cut documents into several instances
    for src, hyps in raw:
        n = int(src.eq(SOS_ID).sum())
        assert hyps[0].tokens.count(SOS_ID) == hyps[0].tokens.count(EOS_SENT_ID) == n


# ------------------------------------------------------------------------------ refusals
def _save(path: Path, section: dict, words: int = N_WORDS, seed: int = 0, **sections) -> str:
    """A checkpoint of a random model over ``words`` words (other vocabularies for other counts)."""
    torch.manual_seed(seed)
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(words)])
    sw = Subword("none", "none")
    codec = Codec(sw, sw, vocab, vocab)
    cfg = config_from_dict({"model": {"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, **section}, **sections})
    model = build_model(cfg.model, codec)
    save_checkpoint({"config": config_to_dict(cfg), "codec": codec.to_dict(), "model": model.state_dict()}, str(path))
    return str(path)


@pytest.mark.parametrize(
    "other, needle",
    [
        (dict(section=TRANSFORMER, words=N_WORDS + 1), "different source vocabularies"),
        (dict(section=G), "different translation units (sentence vs document)"),
        (dict(section=TRANSFORMER, data={"documents": False}), "different data.documents (True vs False)"),
    ],
)
def test_members_that_read_or_write_differently_are_refused_in_one_line(tmp_path, other, needle):
    a = _save(tmp_path / "a.pt", TRANSFORMER)
    b = _save(tmp_path / "b.pt", **other)
    with pytest.raises(UserError) as err:
        load_models([a, b])
    message = str(err.value)
    assert len(message.splitlines()) == 1 and a in message and b in message and needle in message, message


def test_document_members_need_the_same_instance_budget(tmp_path):
    a = _save(tmp_path / "a.pt", G, data={"max_tokens": 64})
    b = _save(tmp_path / "b.pt", G, seed=1, data={"max_tokens": 128})
    with pytest.raises(UserError, match="different data.max_tokens"):
        load_models([a, b])
    c = _save(tmp_path / "c.pt", G, seed=2, data={"max_tokens": 64})
    ensemble, cfg, _ = load_models([a, c])
    assert isinstance(ensemble, EnsembleModel) and ensemble.unit == "document" and cfg.data.max_tokens == 64


def test_concatenation_members_need_the_same_context_size(tmp_path):
    """k-to-1 members read k previous sentences: another k is another input, refused."""
    k_to_1 = {**TRANSFORMER, "unit": "k_to_1"}
    a = _save(tmp_path / "a.pt", k_to_1, data={"context_sentences": 1})
    b = _save(tmp_path / "b.pt", k_to_1, seed=1, data={"context_sentences": 3})
    with pytest.raises(UserError, match="different data.context_sentences"):
        load_models([a, b])


def test_the_average_is_a_translate_option(trained_run, second_run):
    """``ensemble_average`` reaches the ensemble (default ``log_prob``); an unknown value is refused."""
    a, b = _ckpt(trained_run), _ckpt(second_run)
    assert Translator.load([a, b], "cpu").model.average == "log_prob"
    assert Translator.load([a, b], "cpu", ensemble_average="prob").model.average == "prob"
    with pytest.raises(ConfigError, match="ensemble_average"):
        Translator.load([a, b], "cpu", ensemble_average="median")


def test_an_ensemble_of_different_architectures_loads(tmp_path):
    a = _save(tmp_path / "a.pt", TRANSFORMER)
    b = _save(tmp_path / "b.pt", MHPLSTM, seed=1)
    ensemble, _, _ = load_models([a, b])
    assert [type(m.decoder).__name__ for m in ensemble.members] == ["TransformerDecoder", "MHPLSTMDecoder"]


def test_an_hm_gdc_ensemble_keeps_one_line_per_sentence(device):
    """HM-GDC members in one ensemble: context windows keep one output line per input line."""
    members = [random_model(HM_GDC, seed=1, device=device)[0], random_model(HM_GDC, seed=2, device=device)[0]]
    ensemble = EnsembleModel(members).eval()
    _, codec = random_model(HM_GDC)
    cfg = config_from_dict({"data": {"max_sentences": 2}, "translate": {"beam": 2}})
    docs = [[f"w{i} w{i + 2}" for i in range(n)] for n in (3, 1, 4)]
    out = Translator(ensemble, codec, cfg).translate_documents(docs)
    assert [len(d) for d in out] == [3, 1, 4] and all(line.strip() for d in out for line in d)


# ------------------------------------------------------------------------------ the command
def test_the_command_translates_with_an_ensemble_and_refuses_mismatches(trained_run, second_run, toy_dir, tmp_path):
    """``onmt_doc_translate -model A.pt B.pt`` writes what the API's ensemble translator writes (and
    not what A alone writes); members with other vocabularies stop it with a one-line error."""
    src = tmp_path / "in.src"
    src.write_text("\n\n".join("\n".join(d) for d in _test_lines(toy_dir, 6)) + "\n", encoding="utf-8")
    a, b = _ckpt(trained_run), _ckpt(second_run)
    out = tmp_path / "out.txt"
    proc = run_cli(
        *module_cmd("onmt_doc.bin.translate"), "-model", a, b, "-src", str(src), "-output", str(out), "-beam", "2"
    )
    assert proc.returncode == 0, proc.stderr
    expected, alone = io.StringIO(), io.StringIO()
    Translator.load([a, b], "cpu", beam=2).run_files(str(src), expected)
    Translator.load(a, "cpu", beam=2).run_files(str(src), alone)
    assert out.read_text(encoding="utf-8") == expected.getvalue() != alone.getvalue()
    other = _save(tmp_path / "other.pt", TRANSFORMER, words=N_WORDS + 3)
    proc = run_cli(*module_cmd("onmt_doc.bin.translate"), "-model", a, other, "-src", str(src), "-output", str(out))
    one_line_error(proc, "cannot ensemble", a, other, "different source vocabularies")
