"""s-BLEU, d-BLEU and chrF with sacrebleu (default 13a tokenization).

s-BLEU scores sentences as units; d-BLEU (Liu et al., 2020) scores each document's sentences
joined into one segment, so it rewards cross-sentence n-grams and tolerates sentence misalignment.
"""

from __future__ import annotations

from typing import Sequence

import sacrebleu


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
