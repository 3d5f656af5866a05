"""Synthetic English-like -> German-like document-level toy corpus.

Why this exists: tests, the quickstart and the docs need a parallel corpus that
(a) is generated in well under a second with the standard library only, (b) is
learned at the sentence level by a tiny Transformer within about a minute of CPU
training, and (c) contains one phenomenon that *cannot* be translated correctly
without the previous sentence, so that a document-level model can be shown to
beat a sentence-level one on a targeted metric (``onmt_doc.toy.pronoun_scoring.score_context``) even when
BLEU barely moves.

Grammar (every sentence, source side; brackets = optional)::

    S    -> SUBJ VERB_INTR [PP] [ADV] .
          | SUBJ VERB_TR OBJ  [PP] [ADV] .
    SUBJ -> DET [ADJ] NOUN  |  it          ("it" only when context allows it)
    OBJ  -> DET [ADJ] NOUN  |  it
    PP   -> PREP DET NOUN
    DET  -> the | a

The target is word-by-word with two sentence-internal rules: the adjective
follows the noun, and determiners/adjectives agree with the noun's gender
(``the big dog`` -> ``der hund grosser``, ``a big cat`` -> ``eine katze
grosse``).  Source and target sentences therefore always have the same length.

The document-level rule: a source pronoun ``it`` always refers to the *subject
noun of the immediately preceding sentence*.  Its target form is chosen by that
noun's gender (subject position: ``er/sie/es``, object position: ``ihn/sie/es``).
The source pronoun carries no gender hint and the rest of its sentence is drawn
independently of the antecedent, so the correct form is not predictable from
the sentence alone.  A pronoun only appears when the previous sentence has a
noun subject (never in a document's first sentence, never right after a
sentence whose subject is itself a pronoun), so one sentence of context always
suffices.  At most one pronoun per sentence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from onmt_doc.outputs import write_text

__all__ = [
    "Noun",
    "ToySentence",
    "SplitStats",
    "NOUNS",
    "ADJECTIVES",
    "TRANSITIVE_VERBS",
    "INTRANSITIVE_VERBS",
    "PREPOSITIONS",
    "ADVERBS",
    "DETERMINERS",
    "PRONOUN_FORMS",
    "ALL_PRONOUN_FORMS",
    "SOURCE_PRONOUN",
    "SPLITS",
    "generate_documents",
    "write_corpus",
]


@dataclass(frozen=True)
class Noun:
    """A lexicon entry; the target gender drives agreement and pronoun choice."""

    src: str
    tgt: str
    gender: str  # "m", "f" or "n"


# Ten nouns per gender so that antecedent genders are balanced (a constant
# pronoun guess scores about 1/3).
NOUNS: tuple[Noun, ...] = (
    # masculine
    Noun("dog", "hund", "m"),
    Noun("tree", "baum", "m"),
    Noun("garden", "garten", "m"),
    Noun("table", "tisch", "m"),
    Noun("bird", "vogel", "m"),
    Noun("doctor", "arzt", "m"),
    Noun("teacher", "lehrer", "m"),
    Noun("king", "koenig", "m"),
    Noun("river", "fluss", "m"),
    Noun("chair", "stuhl", "m"),
    # feminine
    Noun("cat", "katze", "f"),
    Noun("door", "tuer", "f"),
    Noun("flower", "blume", "f"),
    Noun("city", "stadt", "f"),
    Noun("lamp", "lampe", "f"),
    Noun("mouse", "maus", "f"),
    Noun("bridge", "bruecke", "f"),
    Noun("street", "strasse", "f"),
    Noun("cow", "kuh", "f"),
    Noun("queen", "koenigin", "f"),
    # neuter
    Noun("house", "haus", "n"),
    Noun("horse", "pferd", "n"),
    Noun("book", "buch", "n"),
    Noun("child", "kind", "n"),
    Noun("car", "auto", "n"),
    Noun("boat", "boot", "n"),
    Noun("window", "fenster", "n"),
    Noun("bed", "bett", "n"),
    Noun("sheep", "schaf", "n"),
    Noun("village", "dorf", "n"),
)

# Adjective stems; the target form is stem + gender suffix (agreement).
ADJECTIVES: dict[str, str] = {
    "big": "gross",
    "small": "klein",
    "old": "alt",
    "new": "neu",
    "red": "rot",
    "green": "gruen",
    "quiet": "still",
    "fast": "schnell",
    "happy": "froh",
    "dark": "dunkel",
}
ADJECTIVE_SUFFIX: dict[str, str] = {"m": "er", "f": "e", "n": "es"}

TRANSITIVE_VERBS: dict[str, str] = {
    "sees": "sieht",
    "likes": "mag",
    "finds": "findet",
    "follows": "folgt",
    "visits": "besucht",
    "paints": "malt",
    "watches": "beobachtet",
    "hears": "hoert",
    "carries": "traegt",
    "needs": "braucht",
}
INTRANSITIVE_VERBS: dict[str, str] = {
    "sleeps": "schlaeft",
    "waits": "wartet",
    "sings": "singt",
    "laughs": "lacht",
    "stays": "bleibt",
    "falls": "faellt",
    "rests": "ruht",
    "dreams": "traeumt",
}
PREPOSITIONS: dict[str, str] = {
    "in": "in",
    "near": "bei",
    "behind": "hinter",
    "under": "unter",
    "on": "auf",
    "with": "mit",
}
ADVERBS: dict[str, str] = {
    "today": "heute",
    "often": "oft",
    "again": "wieder",
    "now": "jetzt",
    "slowly": "langsam",
    "there": "dort",
}
# Determiner forms are distinct per gender, so the gender of a target noun
# phrase can be read off its first word.
DETERMINERS: dict[str, dict[str, str]] = {
    "the": {"m": "der", "f": "die", "n": "das"},
    "a": {"m": "ein", "f": "eine", "n": "eins"},
}
SOURCE_PRONOUN = "it"
# Target pronoun forms by syntactic position ("nom" = subject, "acc" = object).
PRONOUN_FORMS: dict[str, dict[str, str]] = {
    "nom": {"m": "er", "f": "sie", "n": "es"},
    "acc": {"m": "ihn", "f": "sie", "n": "es"},
}
# These tokens occur in the target only as context-dependent pronouns.
ALL_PRONOUN_FORMS: frozenset[str] = frozenset(form for forms in PRONOUN_FORMS.values() for form in forms.values())

SPLITS: tuple[str, ...] = ("train", "valid", "test")

# Generation knobs (probabilities per sentence).  PRONOUN_PROB is applied only
# where a pronoun is allowed; with SUBJECT_PRONOUN_PROB it yields ~32% of
# non-first sentences with a context-dependent pronoun.
MAX_DOC_SENTENCES = 6
PRONOUN_PROB = 0.4
SUBJECT_PRONOUN_PROB = 0.7
TRANSITIVE_PROB = 0.6
DEFINITE_PROB = 0.6
ADJECTIVE_PROB = 0.3
PP_PROB = 0.3
ADVERB_PROB = 0.3

_ADJ_KEYS = tuple(ADJECTIVES)
_TR_KEYS = tuple(TRANSITIVE_VERBS)
_INTR_KEYS = tuple(INTRANSITIVE_VERBS)
_PREP_KEYS = tuple(PREPOSITIONS)
_ADV_KEYS = tuple(ADVERBS)


@dataclass(frozen=True)
class ToySentence:
    """One sentence pair plus where its context-dependent target words are."""

    src: tuple[str, ...]
    tgt: tuple[str, ...]
    subject: Noun | None  # None when the subject is a pronoun
    context_words: tuple[tuple[int, str], ...]  # (target word index, expected form)


@dataclass(frozen=True)
class SplitStats:
    """Sizes of one written split, for the CLI summary and sanity checks."""

    documents: int
    sentences: int
    context_words: int


def _noun_phrase(rng: random.Random, noun: Noun, allow_adjective: bool) -> tuple[list[str], list[str]]:
    """Source/target tokens for DET [ADJ] NOUN; target puts the adjective last."""
    det = "the" if rng.random() < DEFINITE_PROB else "a"
    src = [det]
    tgt = [DETERMINERS[det][noun.gender], noun.tgt]
    if allow_adjective and rng.random() < ADJECTIVE_PROB:
        adj = rng.choice(_ADJ_KEYS)
        src.append(adj)
        tgt.append(ADJECTIVES[adj] + ADJECTIVE_SUFFIX[noun.gender])
    src.append(noun.src)
    return src, tgt


def _sentence(rng: random.Random, antecedent: Noun | None) -> ToySentence:
    """Draw one sentence; with an antecedent it contains exactly one ``it``."""
    src: list[str] = []
    tgt: list[str] = []
    ctx: list[tuple[int, str]] = []
    pronoun_slot = None
    if antecedent is not None:
        pronoun_slot = "nom" if rng.random() < SUBJECT_PRONOUN_PROB else "acc"

    subject: Noun | None
    if pronoun_slot == "nom":
        subject = None
        ctx.append((len(tgt), PRONOUN_FORMS["nom"][antecedent.gender]))  # type: ignore[union-attr]
        src.append(SOURCE_PRONOUN)
        tgt.append(ctx[-1][1])
    else:
        subject = rng.choice(NOUNS)
        # An object "it" must not look like it could mean the subject itself.
        while pronoun_slot == "acc" and subject == antecedent:
            subject = rng.choice(NOUNS)
        s, t = _noun_phrase(rng, subject, allow_adjective=True)
        src += s
        tgt += t

    if pronoun_slot == "acc" or rng.random() < TRANSITIVE_PROB:
        verb = rng.choice(_TR_KEYS)
        src.append(verb)
        tgt.append(TRANSITIVE_VERBS[verb])
        if pronoun_slot == "acc":
            ctx.append((len(tgt), PRONOUN_FORMS["acc"][antecedent.gender]))  # type: ignore[union-attr]
            src.append(SOURCE_PRONOUN)
            tgt.append(ctx[-1][1])
        else:
            s, t = _noun_phrase(rng, rng.choice(NOUNS), allow_adjective=True)
            src += s
            tgt += t
    else:
        verb = rng.choice(_INTR_KEYS)
        src.append(verb)
        tgt.append(INTRANSITIVE_VERBS[verb])

    if rng.random() < PP_PROB:
        prep = rng.choice(_PREP_KEYS)
        # No adjective inside the PP keeps sentences at most 12 words long.
        s, t = _noun_phrase(rng, rng.choice(NOUNS), allow_adjective=False)
        src += [prep, *s]
        tgt += [PREPOSITIONS[prep], *t]
    if rng.random() < ADVERB_PROB:
        adv = rng.choice(_ADV_KEYS)
        src.append(adv)
        tgt.append(ADVERBS[adv])
    src.append(".")
    tgt.append(".")
    return ToySentence(tuple(src), tuple(tgt), subject, tuple(ctx))


def generate_documents(n_docs: int, seed: int = 1, split: str = "train") -> list[list[ToySentence]]:
    """Generate ``n_docs`` documents deterministically.

    Each split gets its own ``random.Random`` seeded from (seed, split), so
    changing the size of one split never changes the content of another.
    """
    if n_docs < 0:
        raise ValueError(f"n_docs must be >= 0, got {n_docs}")
    rng = random.Random(f"onmt_doc.toy.corpus:{seed}:{split}")
    docs: list[list[ToySentence]] = []
    for _ in range(n_docs):
        doc: list[ToySentence] = []
        prev_subject: Noun | None = None  # None: no pronoun allowed next
        for _ in range(rng.randint(1, MAX_DOC_SENTENCES)):
            use_pronoun = prev_subject is not None and rng.random() < PRONOUN_PROB
            sent = _sentence(rng, prev_subject if use_pronoun else None)
            doc.append(sent)
            prev_subject = sent.subject
        docs.append(doc)
    return docs


def _write_lines(path: Path, lines: list[str]) -> None:
    """Write lines with '\\n' endings; an empty list gives an empty file."""
    write_text(path, "".join(line + "\n" for line in lines), flag="")


def write_corpus(
    out_dir: str | Path,
    seed: int = 1,
    train_docs: int = 5000,
    valid_docs: int = 145,
    test_docs: int = 145,
) -> dict[str, SplitStats]:
    """Write ``{split}.src/.tgt/.ctx`` for train/valid/test into ``out_dir``.

    Documents are separated by exactly one blank line (same places in src and
    tgt).  Each ``.ctx`` line is ``line_no<TAB>word_index<TAB>expected`` with
    ``line_no`` 1-based in the ``.tgt`` file (blank lines counted) and
    ``word_index`` 0-based in the whitespace-split target line.
    Defaults give about 17.5k / 500 / 500 sentences.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats: dict[str, SplitStats] = {}
    for split, n_docs in zip(SPLITS, (train_docs, valid_docs, test_docs)):
        docs = generate_documents(n_docs, seed=seed, split=split)
        src_lines: list[str] = []
        tgt_lines: list[str] = []
        ctx_lines: list[str] = []
        n_sent = 0
        for d, doc in enumerate(docs):
            if d:
                src_lines.append("")
                tgt_lines.append("")
            for sent in doc:
                src_lines.append(" ".join(sent.src))
                tgt_lines.append(" ".join(sent.tgt))
                for idx, form in sent.context_words:
                    ctx_lines.append(f"{len(tgt_lines)}\t{idx}\t{form}")
                n_sent += 1
        _write_lines(out / f"{split}.src", src_lines)
        _write_lines(out / f"{split}.tgt", tgt_lines)
        _write_lines(out / f"{split}.ctx", ctx_lines)
        stats[split] = SplitStats(len(docs), n_sent, len(ctx_lines))
    return stats
