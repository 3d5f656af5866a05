"""Targeted metrics on translations of documents, next to sacreBLEU's s-BLEU/d-BLEU/chrF
(:mod:`onmt_doc.evaluation.corpus_metrics`): pronoun accuracy and lexical consistency.

- **Pronoun accuracy**, APT-style: the HM-GDC paper (Tan et al., 2019, sec. "Pronoun & Noun
  Translation", Table 5) reports "the accuracy of pronoun translation (Miculicich Werlen and
  Popescu-Belis, 2017)". APT aligns each source pronoun to the reference and the hypothesis with
  word alignments; we have no aligner, so we compare, sentence by sentence, the multiset of target
  pronouns (a per-language list) in the hypothesis with the one in the reference: accuracy = pronoun
  tokens of the reference matched in the hypothesis / pronoun tokens of the reference.
- **Lexical consistency** of repeated source terms within a document (in the spirit of Voita et
  al., 2019's lexical cohesion and of Carpuat, 2009's "one translation per discourse"): a source
  term seen in two or more sentences of a document is consistent when the hypothesis translates it
  by the same lexicon entry every time. The lexicon is given (TSV) or induced from the references
  by the Dice coefficient. docs/evaluation.md lists where both depart from published definitions.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Optional, Sequence

from onmt_doc.data.corpus import iter_lines
from onmt_doc.errors import DataError, UserError
from onmt_doc.evaluation.corpus_metrics import report

# Personal, possessive-free pronoun forms; ``-pronouns FILE`` replaces them (one a line).
PRONOUNS: dict[str, frozenset[str]] = {
    "de": frozenset("ich du er sie es wir ihr mich dich ihn uns euch mir dir ihm ihnen".split()),
    "en": frozenset("i you he she it we they me him her us them".split()),
    "fr": frozenset("je tu il elle on nous vous ils elles me te le la les lui leur se".split()),
    "ru": frozenset("я ты он она оно мы вы они меня тебя его её ее нас вас их мне тебе ему ей нам вам им".split()),
}
_WORD = re.compile(r"\w+", re.UNICODE)
Docs = Sequence[Sequence[str]]


def words(text: str) -> list[str]:
    """Lower-cased word tokens without punctuation, so "Es," matches "es"."""
    return _WORD.findall(text.lower())


def pronoun_list(lang: str, path: Optional[str] = None) -> frozenset[str]:
    """The pronoun forms of a target language, built in or from a file (one form a line)."""
    if path:
        forms = frozenset(w for line in iter_lines(path) for w in words(line))
        if not forms:
            raise DataError(f"{path}: the pronoun list is empty")
        return forms
    if lang not in PRONOUNS:
        raise UserError(
            f"no built-in pronoun list for {lang!r} ({', '.join(sorted(PRONOUNS))}); give one with -pronouns FILE"
        )
    return PRONOUNS[lang]


def pronoun_accuracy(hyps: Sequence[str], refs: Sequence[str], pronouns: frozenset[str]) -> dict:
    """APT-style accuracy: reference pronoun tokens also in the hypothesis sentence (multiset)."""
    correct = total = 0
    for h, r in zip(hyps, refs):
        want = Counter(w for w in words(r) if w in pronouns)
        got = Counter(w for w in words(h) if w in pronouns)
        total += sum(want.values())
        correct += sum((want & got).values())
    return {"accuracy": 100.0 * correct / total if total else 0.0, "correct": correct, "total": total}


def induce_lexicon(
    srcs: Sequence[str],
    refs: Sequence[str],
    min_dice: float = 0.5,
    max_sentence_share: float = 0.1,
    max_entries: int = 3,
) -> dict[str, list[str]]:
    """Source word -> target words, by sentence-level co-occurrence (Dice >= ``min_dice``).

    Words in more than ``max_sentence_share`` of the sentences (function words) and words seen
    once are left out: their "consistency" would measure grammar, not lexical choice.
    """
    n = len(srcs)
    cs: Counter = Counter()
    ct: Counter = Counter()
    pairs: Counter = Counter()
    for s, r in zip(srcs, refs):
        sw, tw = set(words(s)), set(words(r))
        cs.update(sw)
        ct.update(tw)
        pairs.update((a, b) for a in sw for b in tw)
    lexicon: dict[str, list[str]] = {}
    for (a, b), c in pairs.items():
        if cs[a] < 2 or cs[a] > max_sentence_share * n:
            continue
        dice = 2.0 * c / (cs[a] + ct[b])
        if dice >= min_dice:
            lexicon.setdefault(a, []).append((dice, b))  # type: ignore[arg-type]
    return {a: [b for _, b in sorted(c, key=lambda x: (-x[0], x[1]))[:max_entries]] for a, c in lexicon.items()}


def read_lexicon(path: str) -> dict[str, list[str]]:
    """A ``source<TAB>target`` lexicon, several lines per source word allowed."""
    lexicon: dict[str, list[str]] = {}
    for number, line in enumerate(iter_lines(path), 1):  # bounded lines, UTF-8 errors named by line
        if not line:
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not words(parts[0]) or not words(parts[1]):
            raise DataError(f"{path}:{number}: expected 'source<TAB>target', got {line!r:.80}")
        lexicon.setdefault(parts[0].strip().lower(), []).append(parts[1].strip().lower())
    return lexicon


def lexical_consistency(src_docs: Docs, hyp_docs: Docs, lexicon: dict[str, list[str]]) -> dict:
    """Share of repeated source terms (>= 2 sentences of a document, in the lexicon) that the
    translation renders with one and the same lexicon entry every time (a missing one counts
    as inconsistent)."""
    consistent = repeated = 0
    for src_doc, hyp_doc in zip(src_docs, hyp_docs):
        seen: dict[str, list[int]] = {}
        for i, s in enumerate(src_doc):
            for w in set(words(s)):
                if w in lexicon:
                    seen.setdefault(w, []).append(i)
        for term, where in seen.items():
            if len(where) < 2:
                continue
            choices = {_choice(lexicon[term], hyp_doc[i]) for i in where}
            repeated += 1
            consistent += len(choices) == 1 and None not in choices
    return {
        "consistency": 100.0 * consistent / repeated if repeated else 0.0,
        "consistent": consistent,
        "repeated_terms": repeated,
    }


def _choice(entries: list[str], sentence: str) -> Optional[str]:
    present = set(words(sentence))
    return next((e for e in entries if e in present), None)


def translation_metrics(
    src_docs: Optional[Docs],
    hyp_docs: Docs,
    ref_docs: Docs,
    pronouns: frozenset[str],
    lexicon: Optional[dict[str, list[str]]] = None,
) -> dict:
    """BLEU, chrF, d-BLEU (as ``onmt_doc_translate -tgt`` reports them), pronoun accuracy and,
    with the source, lexical consistency of the hypothesis and of the reference (its ceiling)."""
    hyps = [h for d in hyp_docs for h in d]
    refs = [r for d in ref_docs for r in d]
    out = {**report(hyp_docs, ref_docs, documents=True), "pronouns": pronoun_accuracy(hyps, refs, pronouns)}
    if src_docs is not None:
        lex = lexicon if lexicon is not None else induce_lexicon([s for d in src_docs for s in d], refs)
        out["consistency"] = lexical_consistency(src_docs, hyp_docs, lex)
        out["consistency_reference"] = lexical_consistency(src_docs, ref_docs, lex)
    return out
