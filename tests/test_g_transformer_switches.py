"""G-Transformer ablation switches (Bao et al., 2021: the locality biases of table 5, global
attention alone on the top layers of table 6, the post-norm blocks of the released
``gtransformer_base``). Each switch changes exactly the attention or block it names (checked by
perturbing inputs, or against an equivalent model), keeps stepwise decoding equal to the
teacher-forced pass (the stepwise path masks densely, the forced path packs, so this also checks
packed = dense under every switch) and keeps the document beam search's structure."""

from __future__ import annotations

import copy

import pytest
import torch
from model_helpers import N_WORDS, random_model
from test_decoding import stepwise_log_probs
from test_g_transformer import DOCS, G, doc_batch

from onmt_doc.config import config_from_dict
from onmt_doc.data.vocab import EOS_SENT_ID, PAD_ID, SOS_ID, SPECIALS
from onmt_doc.errors import ConfigError
from onmt_doc.models.model import full_log_probs
from onmt_doc.translate.search import BeamSearch


def section(base: dict = G, encoder: dict = {}, decoder: dict = {}) -> dict:
    return {"encoder": {**base["encoder"], **encoder}, "decoder": {**base["decoder"], **decoder}}


# no combined layer: every layer's attention is exactly what its switches say
LOCAL = section(encoder={"global_layers": 0}, decoder={"global_layers": 0, "global_cross_layers": 0})

# the ablations with the key that selects each (docs/models/g_transformer.md, "Ablation switches")
SWITCHES = {
    "no_language_locality": section(encoder={"group_attention": False}, decoder={"group_self_attention": False}),
    "no_translation_locality": section(decoder={"group_cross_attention": False}),
    "top_global_only": section(encoder={"top_attention": "global"}, decoder={"top_attention": "global"}),
    "post_norm": section(encoder={"pre_norm": False}, decoder={"pre_norm": False}),
    "doc_transformer_post_norm": section(
        encoder={"group_attention": False, "pre_norm": False}, decoder={"group_attention": False, "pre_norm": False}
    ),
}


# ---------------------------------------------------------------- what each switch changes
def perturbed_outputs(model, batch, other):
    with torch.no_grad():
        return full_log_probs(model, batch)[0], full_log_probs(model, other)[0]


@pytest.mark.parametrize(
    "decoder, cross_sees_other_sentence, self_sees_other_sentence",
    [
        ({}, False, False),
        ({"group_cross_attention": False}, True, False),
        ({"group_self_attention": False}, False, True),
    ],
    ids=["both_localities", "no_translation_locality", "no_target_language_locality"],
)
def test_locality_switches_open_exactly_their_attention(decoder, cross_sees_other_sentence, self_sees_other_sentence):
    """Two sentences, no combined layer, group encoder, one decoder layer. Reordering the words of
    source sentence 2 reaches target sentence 1 only through a global cross-attention; changing the
    words of target sentence 1 reaches target sentence 2 only through a global self-attention.
    (One decoder layer: from layer 2 on, a global self-attention would also carry source sentence 2
    to every target token through ``<bos>``, whose tag 0 leaves its cross-attention unrestricted.)"""
    model, _ = random_model(section(LOCAL, decoder={"layers": 1, **decoder}), seed=4)
    batch = doc_batch([[(4, 4), (5, 5)]])
    src_words = slice(7, 12)  # source sentence 2: <s> at 6, words 7–11
    assert batch.src_groups[0, src_words].eq(2).all()
    other_src = copy.copy(batch)
    other_src.src = batch.src.clone()
    other_src.src[0, src_words] = batch.src[0, src_words].flip(0)
    assert not torch.equal(other_src.src, batch.src)
    tgt_words = slice(2, 6)  # target sentence 1: <bos> <s> w w w w </s>
    assert batch.tgt_groups[0, tgt_words].eq(1).all()
    other_tgt = copy.copy(batch)
    other_tgt.tgt_in = batch.tgt_in.clone()
    first = len(SPECIALS)
    other_tgt.tgt_in[0, tgt_words] = (batch.tgt_in[0, tgt_words] - first + 1) % N_WORDS + first

    sent1, sent2 = batch.tgt_groups[0].eq(1), batch.tgt_groups[0].eq(2)
    a, b = perturbed_outputs(model, batch, other_src)
    assert (not torch.allclose(a[sent1], b[sent1], atol=1e-6)) == cross_sees_other_sentence
    a, b = perturbed_outputs(model, batch, other_tgt)
    assert (not torch.allclose(a[sent2], b[sent2], atol=1e-6)) == self_sees_other_sentence


def gated_model(gate_bias: float):
    """The default (combined) G model with every gate shut: bias −100 → g ≈ 0, all global (eq. 10);
    +100 → g ≈ 1, all group."""
    model, _ = random_model(G, seed=5)
    with torch.no_grad():
        for gate in (m for m in model.modules() if m.__class__.__name__ == "GateSum"):
            gate.proj.weight.zero_()
            gate.proj.bias.fill_(gate_bias)
    return model


def test_top_attention_global_is_combined_attention_with_the_gate_shut_to_global():
    """``top_attention: global`` on the top layers computes what combined attention computes when
    its gate passes only the global part: the combined model's global attentions moved into the
    plain attention slots of the switched model give the same log-probabilities; the switched
    model has no gate and no second attention."""
    combined = gated_model(-100.0)
    switched, _ = random_model(SWITCHES["top_global_only"], seed=6)
    names = set(switched.state_dict())
    assert not any(("gate" in n or "global_" in n) for n in names), sorted(names)
    state = combined.state_dict()
    moved = {name: value for name, value in state.items() if name in names}
    for name, value in state.items():  # a combined layer's global attention → the plain slot
        for combined_name, plain_name in (
            (".global_attn.", ".self_attn."),
            (".global_self_attn.", ".self_attn."),
            (".global_cross_attn.", ".cross_attn."),
        ):
            if combined_name in name:
                moved[name.replace(combined_name, plain_name)] = value
    assert set(moved) == names
    switched.load_state_dict(moved)
    batch = doc_batch()
    mask = batch.tgt_out.ne(PAD_ID)
    with torch.no_grad():
        expected, got = full_log_probs(combined, batch), full_log_probs(switched, batch)
        assert torch.allclose(expected[mask], got[mask], atol=1e-5), (expected - got)[mask].abs().max()
        # the comparison can fail: the same gates open to group attention give another model
        local = full_log_probs(gated_model(100.0), batch)
        assert not torch.allclose(local[mask], got[mask], atol=1e-3)


def test_only_group_attention_is_global_layers_zero():
    """Table 6's "only group attention" is ``global_layers: 0`` (and ``global_cross_layers: 0``):
    equal to the combined model with every gate open to the group side."""
    combined = gated_model(100.0)
    group_only, _ = random_model(LOCAL, seed=6)
    group_only.load_state_dict({k: v for k, v in combined.state_dict().items() if k in group_only.state_dict()})
    batch = doc_batch()
    mask = batch.tgt_out.ne(PAD_ID)
    with torch.no_grad():
        assert torch.allclose(full_log_probs(combined, batch)[mask], full_log_probs(group_only, batch)[mask], atol=1e-5)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_post_norm_normalises_every_block_output_and_drops_the_final_norm(pre_norm):
    """``pre_norm: false``: every encoder and decoder layer's output is layer-normalised (mean 0,
    variance 1 per token with the initial gains) and there is no final norm; pre-norm layers pass
    the unnormalised residual stream and the stack ends in a final norm."""
    keys = {"pre_norm": pre_norm}
    model, _ = random_model(section(encoder=keys, decoder=keys), seed=2)
    outputs = []
    hooks = [
        layer.register_forward_hook(lambda m, i, o: outputs.append(o))
        for layer in [*model.encoder.layers, *model.decoder.layers]
    ]
    batch = doc_batch()
    with torch.no_grad():
        full_log_probs(model, batch)
    for h in hooks:
        h.remove()
    assert len(outputs) == 6
    for out in outputs:
        normalised = torch.allclose(out.mean(-1), torch.zeros(()), atol=1e-4) and torch.allclose(
            out.var(-1, unbiased=False), torch.ones(()), atol=1e-3
        )
        assert normalised != pre_norm
    for part in (model.encoder, model.decoder):
        assert isinstance(part.final_norm, torch.nn.LayerNorm) == pre_norm


# ---------------------------------------------------------------- decoding under every switch
@pytest.mark.parametrize("name", list(SWITCHES))
def test_stepwise_equals_teacher_forced_under_every_switch(name, device):
    model, _ = random_model(SWITCHES[name], seed=3, device=device)
    batch = doc_batch(seed=1).to(device)
    perm = torch.tensor([2, 0, 3, 1], device=device)
    with torch.no_grad():
        forced = full_log_probs(model, batch)
        stepped = stepwise_log_probs(model, batch, batch.tgt_in)
        reordered = stepwise_log_probs(model, batch, batch.tgt_in, reorder_at=6, perm=perm)
    mask = batch.tgt_out.ne(PAD_ID)
    assert torch.allclose(forced[mask], stepped[mask], atol=1e-5), (forced - stepped)[mask].abs().max()
    assert torch.allclose(forced[perm][mask[perm]], reordered[mask[perm]], atol=1e-5)


@pytest.mark.parametrize("name", list(SWITCHES))
def test_document_beam_search_keeps_the_structure_under_every_switch(name, device):
    """Every hypothesis of a 4-beam search has the source's sentences, each ``<s> … </s>`` with at
    least one and at most its cap of words."""
    model, _ = random_model(SWITCHES[name], seed=8, device=device)
    batch = doc_batch(seed=5).to(device)
    with torch.no_grad():
        hyps = BeamSearch(beam=4, n_best=4, max_len_ratio=1.0, max_len_add=1).search(model, batch)
    for row, sents in enumerate(DOCS):
        for h in hyps[row]:
            toks = h.tokens
            assert toks.count(SOS_ID) == toks.count(EOS_SENT_ID) == len(sents), toks
            starts = [i for i, t in enumerate(toks) if t == SOS_ID]
            for k, start in enumerate(starts):
                words = toks.index(EOS_SENT_ID, start) - start - 1
                assert 1 <= words <= sents[k][0] + 1


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_bad_top_attention_names_the_key(part):
    with pytest.raises(ConfigError, match=f"model.{part}.top_attention"):
        config_from_dict({"model": {part: {"type": "g_transformer", "top_attention": "gated"}}})
