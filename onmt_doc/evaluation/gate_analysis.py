"""Error analysis of context selection (Li et al., 2020, sec. 3.3–3.4) by forced decoding.

At every real target token y_i (markup and ``<eos>`` excluded) of a test set, with the reference
prefix as decoder input:

- forced-decoding translation error (FE): ``P(y_i | y_<i, x) < P(ŷ_i | y_<i, x)``, ŷ_i the argmax;
- the share of tokens with z*(y_i) = 1 (the source side);
- context-selection error (CE): an FE with ``z*(y_i) ≠ z*(ŷ_i)`` (eq. 7, with ŷ_i in place of y_i
  and the same x and y_<i); FER and CER are their shares of the tokens, CE/FE their ratio;
- gate statistics (gated decoders): mean and variance of every gate dimension of every layer at
  every non-padding decoder position, and the share of gate values on the other side of 0.5 than
  z*(y_i) says (at the real tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from onmt_doc.config import Config
from onmt_doc.data.batching import collate, ordered_batches
from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import read_parallel
from onmt_doc.data.instances import Example, UnitOptions
from onmt_doc.data.mapped import MappedCorpus, MappedExamples
from onmt_doc.data.pmi import PMITable, z_star, z_star_fields
from onmt_doc.data.vocab import PAD_ID
from onmt_doc.losses.gate_hinge import gate_hinge
from onmt_doc.models.model import EncoderDecoder


@dataclass
class GateAnalysis:
    """Running counts of the error analysis over a test set; :meth:`summary` turns them into percentages."""

    tokens: int = 0  # real target tokens
    source: int = 0  # of which z* = 1
    forced_errors: int = 0
    context_errors: int = 0
    gate_values: int = 0  # gate entries counted for mean/variance
    gate_sum: float = 0.0
    gate_sq: float = 0.0
    gate_wrong: float = 0.0  # sum over real tokens of the per-token wrong-side fraction
    layer_sums: list = field(default_factory=list)

    def add_gates(self, gates: torch.Tensor, keep: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the gate statistics of one batch: ``gates`` [L, B, T, D], ``keep`` [B, T] non-padding
        positions, ``z`` / ``mask`` [B, T] z* and where it is defined (eq. 5's wrong-side fraction)."""
        g = gates.double()[:, keep]  # [L, N, D]
        self.gate_values += g.numel()
        self.gate_sum += float(g.sum())
        self.gate_sq += float((g * g).sum())
        per_layer = g.sum((1, 2)).tolist()
        self.layer_sums = per_layer if not self.layer_sums else [a + b for a, b in zip(self.layer_sums, per_layer)]
        self.gate_wrong += float(gate_hinge(gates.float(), z, mask)[1].sum())

    def summary(self) -> dict:
        """FER, CER, CE/FE and the z* source share in percent; gate mean, variance and wrong-side share
        when gates were added."""
        n = max(self.tokens, 1)
        out = {
            "tokens": self.tokens,
            "z_star_source": 100.0 * self.source / n,
            "FER": 100.0 * self.forced_errors / n,
            "CER": 100.0 * self.context_errors / n,
            "CE/FE": 100.0 * self.context_errors / max(self.forced_errors, 1),
        }
        if self.gate_values:
            mean = self.gate_sum / self.gate_values
            per_layer = self.gate_values / len(self.layer_sums)
            out.update(
                {
                    "gate_mean": mean,
                    "gate_var": self.gate_sq / self.gate_values - mean**2,
                    "gate_layer_means": [s / per_layer for s in self.layer_sums],
                    "gate_wrong_side": 100.0 * self.gate_wrong / n,
                }
            )
        return out


def _sentences(ex: Example, docs: Sequence) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(offset of y_1 in the example's target, source ids, target ids) of each of its sentences."""
    out, offset = [], 0
    for s, t in docs[ex.doc][ex.first : ex.first + ex.n_sents]:
        out.append((offset + 1, s, t))
        offset += len(t) + 2
    return out


def _context_errors(
    table: PMITable, examples: list[Example], docs: Sequence, rows: np.ndarray, pred: np.ndarray, errors: np.ndarray
) -> int:
    """Forced errors whose prediction has another z* than the reference token."""
    srcs, tgts, preds, refs, errs = [], [], [], [], []
    for row, i in enumerate(rows):
        ex = examples[i]
        for start, s, t in _sentences(ex, docs):
            srcs.append(s)
            tgts.append(t)
            preds.append(pred[row, start : start + len(t)])
            refs.append(ex.extra["z_star"][start : start + len(t)])
            errs.append(errors[row, start : start + len(t)])
    if not tgts:
        return 0
    z_pred = np.concatenate(z_star(table, srcs, tgts, queries=preds))
    return int((np.concatenate(errs) & (z_pred != np.concatenate(refs))).sum())


@torch.no_grad()
def analyse_gates(
    model: EncoderDecoder,
    codec: Codec,
    cfg: Config,
    src: str,
    tgt: str,
    table: PMITable,
    batch_tokens: int = 4096,
    device: Optional[torch.device] = None,
) -> dict:
    """FER, CER, CE/FE (in %) and gate statistics of ``model`` on a parallel test set."""
    device = device or next(model.parameters()).device
    text = read_parallel(src, tgt, cfg.data.documents, cfg.data.max_line_chars)
    flat_src = codec.encode([s for d in text for s, _ in d], "src")
    flat_tgt = codec.encode([t for d in text for _, t in d], "tgt")
    docs, i = [], 0
    for d in text:
        docs.append(list(zip(flat_src[i : i + len(d)], flat_tgt[i : i + len(d)])))
        i += len(d)
    corpus = MappedCorpus.from_documents(docs)
    options = UnitOptions(cfg.data.max_tokens, sentence_markup=cfg.data.sentence_markup)
    examples = list(MappedExamples(corpus, model.unit, options, z_star_fields(table, corpus)))
    model.eval()
    result = GateAnalysis()
    for idx in ordered_batches(examples, batch_tokens):
        batch = collate([examples[i] for i in idx], idx).to(device)
        out = model.decoder(batch.tgt_in, model.encode(batch), batch)
        logits = model.generator(out.hidden).float()  # [B, T, V]
        gold = logits.gather(2, batch.tgt_out[..., None]).squeeze(2)
        real = batch.extra["z_star_mask"].bool()
        errors = (gold < logits.amax(-1)) & real  # P(y_i) < P(ŷ_i)
        result.tokens += int(real.sum())
        result.source += int((batch.extra["z_star"].bool() & real).sum())
        result.forced_errors += int(errors.sum())
        result.context_errors += _context_errors(
            table, examples, docs, idx, logits.argmax(-1).cpu().numpy(), errors.cpu().numpy()
        )
        if "gates" in out.aux:
            result.add_gates(out.aux["gates"], batch.tgt_in.ne(PAD_ID), batch.extra["z_star"], real)
    return {**result.summary(), "normaliser": table.normaliser}
