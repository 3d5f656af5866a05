"""The fast CPU dropout: rate, scaling, gradient, determinism, eval mode."""

from __future__ import annotations

import pytest
import torch

from onmt_doc.modules.dropout import Dropout

pytestmark = pytest.mark.integration  # trains models or starts processes (README: fast tests alone)


def test_rate_and_scale_match_inverted_dropout():
    torch.manual_seed(0)
    y = Dropout(0.1).train()(torch.ones(2_000_000))
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 1e-3  # ~6 standard deviations
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    assert abs(y.mean().item() - 1.0) < 2e-3


def test_masks_are_not_correlated_across_the_four_lanes_of_a_word():
    torch.manual_seed(1)
    keep = (Dropout(0.5).train()(torch.ones(400_000)) != 0).float().view(-1, 4)
    corr = torch.corrcoef(keep.T)
    assert (corr - torch.eye(4)).abs().max() < 0.02


def test_gradient_is_the_mask_and_seed_reproduces_it():
    d = Dropout(0.3).train()
    x = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(5)
    y = d(x)
    y.sum().backward()
    mask = (y != 0).float() / 0.7
    assert torch.allclose(x.grad, mask)
    torch.manual_seed(5)
    assert torch.equal(d(x), y)


def test_eval_and_zero_rate_are_identity():
    x = torch.randn(10, 10)
    assert torch.equal(Dropout(0.3).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
