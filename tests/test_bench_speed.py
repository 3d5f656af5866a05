"""The speed stages' own pieces (benchmarks/stages/speed.py): the dense variant the group-attention
benchmark times computes what packed group attention computes, and the models are built at the
benchmark's shape with the Reformers' depths scaled."""

import pytest
import torch

from benchmarks.stages.speed import (
    GroupAttentionParams,
    ModelSpeedParams,
    build,
    dense_plan,
    group_tags,
    placeholder_codec,
)
from onmt_doc.modules import group_attention as ga


@pytest.mark.parametrize("causal", [False, True])
def test_dense_variant_equals_packed_group_attention(causal):
    p = GroupAttentionParams(batch=2, d_model=16, heads=2, sentence_words=[3, 7], causal=causal)
    tags, keep = group_tags(p, 40)
    torch.manual_seed(0)
    q, k, v = (torch.randn(tags.size(0), 2, tags.size(1), 8) for _ in range(3))
    packed = ga.group_attend(ga.plan_self(tags, keep, causal), q, k, v)
    mask, has = dense_plan(tags, keep, causal)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask) * has
    sel = keep[:, None, :, None].expand_as(dense)
    assert torch.allclose(packed[sel], dense[sel], atol=1e-5)


def test_models_take_the_benchmark_shape_and_reformer_depths_scale():
    p = ModelSpeedParams(d_model=32, layers=3, heads=2, ff=64, vocab=50)
    codec = placeholder_codec(p.vocab)
    _, cfg = build("transformer", p, codec)
    assert (cfg.model.d_model, cfg.model.encoder.layers, cfg.model.decoder.layers) == (32, 3, 3)
    assert (cfg.model.decoder.heads, cfg.model.decoder.ff) == (2, 64)
    _, base = build("reformer_base", p, codec)  # 7 layers for a 6+6 Transformer
    _, fast = build("reformer_fast", p, codec)  # 5 PreNet + 5
    assert base.model.decoder.layers == 4
    assert (fast.model.encoder.layers, fast.model.decoder.layers) == (2, 2)
