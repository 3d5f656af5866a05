"""The fused label-smoothed cross entropy against the textbook formula, and its gradient."""

import pytest
import torch

from onmt_doc.data.vocab import PAD_ID
from onmt_doc.losses.label_smoothing import _SmoothedNLL, label_smoothed_nll


def reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-token loss against the smoothed target distribution q: 1 − ε on the target, ε/(V−1)
    on every non-pad class (the target included), nothing on pad."""
    lprobs = torch.log_softmax(logits, dim=-1)
    v = logits.size(1)
    q = torch.full_like(lprobs, eps / (v - 1))
    q[:, PAD_ID] = 0.0
    q.scatter_add_(1, target[:, None], torch.full((len(target), 1), 1 - eps, dtype=logits.dtype, device=logits.device))
    return -(q * lprobs).sum(-1)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_and_gradient_equal_the_formula(eps, device):
    torch.manual_seed(0)  # drawn on the CPU: the same values on every device
    logits = (torch.randn(37, 50, dtype=torch.float64) * 4).to(device).requires_grad_()
    target = torch.randint(1, 50, (37,)).to(device)
    weights = torch.rand(37, dtype=torch.float64).to(device)
    loss, nll, correct = _SmoothedNLL.apply(logits, target, eps)
    expected = reference(logits, target, eps)
    assert torch.allclose(loss, expected, atol=1e-10)
    lp = torch.log_softmax(logits, -1)
    assert torch.allclose(nll, -lp.gather(1, target[:, None]).squeeze(1), atol=1e-10)
    assert torch.equal(correct, logits.argmax(-1).eq(target))
    (grad,) = torch.autograd.grad((loss * weights).sum(), logits)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), logits)
    assert torch.allclose(grad, expected_grad, atol=1e-10)


def test_gradient_equals_finite_differences(device):
    torch.manual_seed(2)
    logits = torch.randn(5, 7, dtype=torch.float64).to(device).requires_grad_()
    target = torch.tensor([1, 2, 6, 3, 3], device=device)
    direction = torch.randn(5, 7, dtype=torch.float64).to(device)
    weights = torch.rand(5, dtype=torch.float64).to(device)

    def f(z):
        return (_SmoothedNLL.apply(z, target, 0.2)[0] * weights).sum()

    f(logits).backward()
    h = 1e-6
    with torch.no_grad():
        numeric = (f(logits + h * direction) - f(logits - h * direction)) / (2 * h)
    assert abs(float((logits.grad * direction).sum()) - float(numeric)) < 1e-7


def test_float32_and_bfloat16_logits(device):
    torch.manual_seed(1)
    logits = (torch.randn(64, 300) * 3).to(device)
    target = torch.randint(1, 300, (64,)).to(device)
    loss, _, _ = label_smoothed_nll(logits, target, 0.1)
    assert torch.allclose(loss.double(), reference(logits.double(), target, 0.1), atol=1e-4)
    half = logits.bfloat16().requires_grad_()
    loss_bf16, _, _ = label_smoothed_nll(half, target, 0.1)
    loss_bf16.sum().backward()
    assert half.grad.dtype == torch.bfloat16 and torch.isfinite(half.grad.float()).all()
    assert torch.allclose(loss_bf16.double(), reference(half.double(), target, 0.1), atol=1e-4)


def test_no_targets(device):
    logits = torch.zeros(0, 10, device=device, requires_grad=True)
    loss, nll, correct = label_smoothed_nll(logits, torch.zeros(0, dtype=torch.long, device=device), 0.1)
    loss.sum().backward()
    assert loss.shape == (0,) and logits.grad.shape == (0, 10)
