"""Label-smoothed cross entropy (Szegedy et al., 2016), padding excluded."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from onmt_doc.config import LossConfig
from onmt_doc.data.batching import Batch
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.losses import REGISTRY
from onmt_doc.losses.base import Loss


@dataclass
class LabelSmoothedCEConfig(LossConfig):
    smoothing: float = 0.1


@REGISTRY.register("label_smoothed_ce", LabelSmoothedCEConfig)
class LabelSmoothedCE(Loss):
    """loss = (1 − ε)·nll + ε·mean over non-pad classes of −log p; stats: nll, tokens, correct."""

    def __call__(self, out, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        lprobs = torch.log_softmax(out.logits.float(), dim=-1)          # [N, V], non-pad positions
        target_lp = lprobs.gather(1, out.target[:, None]).squeeze(1)
        nll = -target_lp
        eps = self.cfg.smoothing
        if eps > 0:
            smooth = -(lprobs.sum(-1) - lprobs[:, PAD_ID]) / (lprobs.size(1) - 1)
            loss = ((1 - eps) * nll + eps * smooth).sum()
        else:
            loss = nll.sum()
        with torch.no_grad():
            # the target is the argmax (ties aside); amax is several times cheaper than argmax on CPU
            correct = (target_lp >= lprobs.amax(-1)).sum()
        return loss, {"nll": nll.detach().sum().item(), "correct": correct.item(),
                      "tokens": float(out.target.numel())}
