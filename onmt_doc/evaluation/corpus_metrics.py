"""s-BLEU, d-BLEU and chrF with sacrebleu (default 13a tokenization).

s-BLEU scores sentences as units; d-BLEU (Liu et al., 2020) scores each document's sentences
joined into one segment, so it rewards cross-sentence n-grams and tolerates sentence misalignment.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import sacrebleu
from sacrebleu.metrics import BLEU


def s_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus BLEU of aligned sentence lists (``force=True``: no warning when detokenized text looks
    tokenized)."""
    return sacrebleu.corpus_bleu(list(hyps), [list(refs)], force=True).score


def chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus chrF of aligned sentence lists."""
    return sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score


def d_bleu(hyp_docs: Sequence[Sequence[str]], ref_docs: Sequence[Sequence[str]]) -> float:
    """d-BLEU: corpus BLEU with each document's sentences joined into one segment."""
    return s_bleu([" ".join(d) for d in hyp_docs], [" ".join(d) for d in ref_docs])


def report(hyp_docs: Sequence[Sequence[str]], ref_docs: Sequence[Sequence[str]], documents: bool) -> dict:
    """BLEU and chrF over sentences, plus d-BLEU when the files hold multi-sentence documents."""
    hyps = [h for d in hyp_docs for h in d]
    refs = [r for d in ref_docs for r in d]
    scores = {"bleu": s_bleu(hyps, refs), "chrf": chrf(hyps, refs)}
    if documents and any(len(d) > 1 for d in ref_docs):
        scores["d_bleu"] = d_bleu(hyp_docs, ref_docs)
    return scores


def bleu_ci(
    hyp_docs: Sequence[Sequence[str]],
    ref_docs: Sequence[Sequence[str]],
    level: str = "sentence",
    samples: int = 1000,
    seed: int = 1,
    alpha: float = 0.05,
) -> tuple[float, float, float]:
    """(BLEU, lower, upper): s-BLEU (``level="sentence"``) or d-BLEU (``"document"``) of documents with
    its (1 − alpha) bootstrap confidence interval (Koehn, 2004), resampling whole documents: the unit
    whose sentences share context, so they vary together. sacreBLEU's sufficient statistics are
    summed per document once (``BLEU._extract_corpus_statistics``, what its own paired bootstrap
    uses), so a resample costs a sum, not a re-tokenization; the point estimate is sacreBLEU's corpus
    BLEU exactly."""
    if level not in ("sentence", "document"):
        raise ValueError(f"level must be 'sentence' or 'document', got {level!r}")
    metric = BLEU()
    if level == "document":
        hyps, refs, owner = [" ".join(d) for d in hyp_docs], [" ".join(d) for d in ref_docs], np.arange(len(ref_docs))
    else:
        hyps, refs = [h for d in hyp_docs for h in d], [r for d in ref_docs for r in d]
        owner = np.repeat(np.arange(len(ref_docs)), [len(d) for d in ref_docs])
    stats = np.asarray(metric._extract_corpus_statistics(hyps, [refs]), dtype=np.int64)
    per_doc = np.zeros((len(ref_docs), stats.shape[1]), dtype=np.int64)
    np.add.at(per_doc, owner, stats)
    point = metric._compute_score_from_stats(per_doc.sum(0).tolist()).score
    rng = np.random.default_rng(seed)
    counts = np.stack([np.bincount(rng.integers(0, len(ref_docs), len(ref_docs)), minlength=len(ref_docs))
                       for _ in range(samples)])  # fmt: skip
    scores = [metric._compute_score_from_stats(row.tolist()).score for row in counts @ per_doc]
    low, high = np.quantile(scores, [alpha / 2, 1 - alpha / 2])
    return point, float(low), float(high)
