"""Label-smoothed cross entropy (Szegedy et al., 2016), padding excluded.

The loss and its gradient are computed by one autograd function (:class:`_SmoothedNLL`) straight
from the logits: the [N, V] log-probabilities are never materialised, and the backward pass turns
the softmax kept from the forward pass into the gradient in place. Through the generic autograd
graph (log_softmax, gather, sum) the same loss touches the [N, V] matrix about twice as often;
with an 8k vocabulary that was ~12% of a training step of the benchmark Transformer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from onmt_doc.config.options import LossConfig, option
from onmt_doc.contracts import Batch, ModelOut
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.losses.base import REGISTRY, Loss


@dataclass
class LabelSmoothedCEConfig(LossConfig):
    """``loss`` entry keys of ``type: label_smoothed_ce``."""

    smoothing: float = option(
        0.1, "ε; 0 = plain cross entropy; in [0, 1) (1 would ignore the reference)", minimum=0, below=1
    )


class _SmoothedNLL(torch.autograd.Function):
    """Per-token ``(1 − ε)·nll + ε·smooth`` from logits [N, V], with
    nll = lse − z_target and smooth = lse − Σ_{c ≠ pad} z_c / (V − 1) (lse = log Σ_c exp z_c).
    Also returns nll and whether the target logit is the row maximum (both without gradient)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, logits: torch.Tensor, target: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token (loss, nll, target is argmax) [N] each, from ``logits`` [N, V] and ``target`` [N]."""
        top = logits.amax(-1, keepdim=True)
        probs = torch.sub(logits, top).exp_()
        total = probs.sum(-1, keepdim=True)
        probs.div_(total)  # softmax, kept for backward
        lse = (top + total.log()).squeeze(1)
        target_logit = logits.gather(1, target[:, None]).squeeze(1)
        nll = lse - target_logit
        smooth = lse - (logits.sum(-1) - logits[:, PAD_ID]) / (logits.size(1) - 1)
        ctx.save_for_backward(probs, target)
        ctx.eps = eps
        ctx.mark_non_differentiable(nll)
        return (1 - eps) * nll + eps * smooth, nll, target_logit >= top.squeeze(1)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx,
        grad: torch.Tensor,
        _grad_nll: Optional[torch.Tensor],
        _grad_correct: Optional[torch.Tensor],
    ) -> tuple[torch.Tensor, None, None]:
        """Gradient of the per-token loss w.r.t. the logits [N, V], from the saved softmax (in place)."""
        # ∂/∂z_c = p_c − (1 − ε)·[c = target] − ε·[c ≠ pad] / (V − 1)
        probs, target = ctx.saved_tensors
        eps = ctx.eps
        uniform = eps / (probs.size(1) - 1)
        out = probs.sub_(uniform).mul_(grad[:, None])
        out[:, PAD_ID] += uniform * grad
        out.scatter_add_(1, target[:, None], (-(1 - eps) * grad)[:, None])
        return out, None, None


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-token loss [N], per-token nll [N], target is the argmax [N]) for logits [N, V]."""
    return _SmoothedNLL.apply(logits.float(), target, eps)


@REGISTRY.register("label_smoothed_ce", LabelSmoothedCEConfig)
class LabelSmoothedCE(Loss):
    """loss = (1 − ε)·nll + ε·mean over non-pad classes of −log p; stats: nll, tokens, correct
    (the target is the argmax, ties aside)."""

    def __call__(self, out: ModelOut, batch: Batch) -> tuple[torch.Tensor, dict]:
        """Label-smoothed cross entropy summed over the non-padding target tokens of ``out``; the
        statistics stay on the device (the trainer reads them at log time, not every step)."""
        loss, nll, correct = label_smoothed_nll(out.logits, out.target, self.cfg.smoothing)
        tokens = float(out.target.numel())
        if out.padded_targets:  # a static-shape batch: the rows with a <pad> target count nothing
            real = out.target.ne(PAD_ID)
            loss, nll, correct = loss.where(real, 0.0), nll.where(real, 0.0), correct & real
            tokens = float(batch.n_tgt_tokens)
        return loss.sum(), {"nll": nll.sum(), "correct": correct.sum(), "tokens": tokens}
