"""How much context a model uses: conditional cross-mutual information (CXMI, Fernandes et al.,
2021, "Measuring and Increasing Context Usage in Context-Aware Machine Translation", eq. 3-4).

    CXMI(C → Y | X) ≈ 1/N Σ_tokens [ log q(y_t | y_<t, x, C) − log q(y_t | y_<t, x) ]

over the N target tokens of a document test set: the first term is the model given the preceding
sentences C of the document (sources and reference translations), the second the same model with
the context removed, or a sentence model given as the baseline. Each term of the sum is the
point-wise CXMI of one token (P-CXMI, Fernandes et al., 2023): the tokens with the largest mean are
the words whose translation depends most on context.

Sentence j of a document is scored twice through the forced-decoding path of ``onmt_doc_translate
-score`` (:meth:`Translator.score_tokens`): as the last sentence of the document made of its
context pairs and itself, and alone. Both give the same target tokens (its ``<s> … </s>`` markup
and the final ``<eos>``), so the difference is taken token by token. ``cxmi`` counts the words and
``</s>`` (the decision to end the sentence, a sentence model's ``<eos>``); ``<s>`` and the final
``<eos>`` are left out because they decide the document's structure ("another sentence follows",
"the document ends"), which only the context condition has to decide: with them (``cxmi_all``,
the difference of the two ``-score`` runs per token) a toy G-Transformer's figure is dominated by
those two tokens. The context a model reads is
what the contrastive suites give it (:class:`~onmt_doc.evaluation.contrastive.ContextWindow`: the
most recent sentences that fit one instance; none for sentence models, whose CXMI is therefore 0).
Sentences are streamed: memory holds one document and the translator's read-ahead buffer.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional

from onmt_doc.data.vocab import EOS_ID, SOS_ID
from onmt_doc.errors import DataError, UserError
from onmt_doc.evaluation.contrastive import ContextWindow
from onmt_doc.evaluation.suite_files import ContrastiveItem

if TYPE_CHECKING:
    from onmt_doc.translate.translator import Translator

Pair = tuple[str, str]
POSITIONS = 10  # sentence positions reported one by one; later sentences are pooled as "11+"


@dataclass
class ScoredSentence:
    """Sentence ``index`` of document ``doc``: its tokens' log-probabilities with and without context."""

    doc: int
    index: int
    context_sentences: int  # preceding sentences the model read
    tokens: list[int]
    with_context: list[float]
    without: list[float]

    @property
    def pointwise(self) -> list[float]:
        """P-CXMI of each token: log q(y_t | x, C) − log q(y_t | x)."""
        return [a - b for a, b in zip(self.with_context, self.without)]

    def counted(self) -> list[bool]:
        """Which tokens ``cxmi`` counts: all but ``<s>`` and, in a sentence with markup, the final
        ``<eos>`` (document structure; the module docstring says why)."""
        marked = SOS_ID in self.tokens
        return [t != SOS_ID and not (marked and t == EOS_ID) for t in self.tokens]


def score_documents(
    translator: Translator,
    documents: Iterable[list[Pair]],
    baseline: Optional[Translator] = None,
    max_context: int = 0,
) -> Iterator[ScoredSentence]:
    """Every sentence of ``documents`` (lists of (source, reference) pairs), scored with its context
    by ``translator`` and alone by ``baseline`` (default: the same translator), in order."""
    window = ContextWindow(translator, max_context)
    base = baseline or translator
    pending: deque[tuple[int, int, int]] = deque()

    def items() -> Iterator[tuple[list[Pair], list[Pair]]]:
        for d, doc in enumerate(documents):
            for j, (src, ref) in enumerate(doc):
                before = doc[:j]
                item = ContrastiveItem(f"doc {d + 1}", src, ref, [], [s for s, _ in before], [t for _, t in before])
                context = window(item)
                pending.append((d, j, len(context)))
                yield [*context, (src, ref)], [(src, ref)]

    if base is translator:  # one pass; a sentence without context is one document, scored once (CXMI 0)
        stream = (doc for ctx, alone in items() for doc in ((ctx, alone) if len(ctx) > 1 else (ctx,)))
        results = translator.score_tokens(stream)
        for ctx in results:  # pulling a result has queued its sentence
            d, j, n = pending.popleft()
            yield _scored(d, j, n, ctx[-1], next(results)[-1] if n else ctx[-1])
        return
    with_ctx, alone_docs = _tee_pairs(items())
    for ctx, alone in zip(translator.score_tokens(with_ctx), base.score_tokens(alone_docs)):
        d, j, n = pending.popleft()
        yield _scored(d, j, n, ctx[-1], alone[-1])


def _tee_pairs(stream: Iterator[tuple[list[Pair], list[Pair]]]) -> tuple[Iterator, Iterator]:
    """Two iterators over the first and second members of ``stream``'s pairs; a member read ahead
    by one waits in a queue until the other catches up (the two translators buffer alike)."""
    queues: tuple[deque, deque] = (deque(), deque())

    def side(k: int) -> Iterator[list[Pair]]:
        while True:
            if not queues[k]:
                pair = next(stream, None)
                if pair is None:
                    return
                queues[0].append(pair[0])
                queues[1].append(pair[1])
            yield queues[k].popleft()

    return side(0), side(1)


def _scored(d: int, j: int, n: int, ctx: list, alone: list) -> ScoredSentence:
    if [t for t, _ in ctx] != [t for t, _ in alone]:  # the same codec on both sides (checked by cxmi)
        raise DataError(f"document {d + 1}, sentence {j + 1}: the two models tokenize the reference differently")
    return ScoredSentence(d, j, n, [t for t, _ in ctx], [v for _, v in ctx], [v for _, v in alone])


@dataclass
class Cxmi:
    """Running sums of point-wise CXMI: overall, per sentence position, per target token."""

    total: float = 0.0
    tokens: int = 0
    total_all: float = 0.0  # every scored token, markup included
    tokens_all: int = 0
    sentences: int = 0
    with_context_sentences: int = 0
    by_position: dict = field(default_factory=lambda: defaultdict(lambda: [0.0, 0, 0]))  # [sum, tokens, sentences]
    by_token: dict = field(default_factory=lambda: defaultdict(lambda: [0.0, 0]))  # id -> [sum, count]

    def add(self, s: ScoredSentence) -> None:
        """Count one scored sentence."""
        every = s.pointwise
        self.total_all += sum(every)
        self.tokens_all += len(every)
        kept = [(token, v) for token, v, keep in zip(s.tokens, every, s.counted()) if keep]
        value = sum(v for _, v in kept)
        self.total += value
        self.tokens += len(kept)
        self.sentences += 1
        self.with_context_sentences += s.context_sentences > 0
        cell = self.by_position[min(s.index, POSITIONS)]
        cell[0] += value
        cell[1] += len(kept)
        cell[2] += 1
        for token, v in kept:
            t = self.by_token[token]
            t[0] += v
            t[1] += 1

    def summary(self, token_text: Callable[[int], str], top: int = 0, min_count: int = 3) -> dict:
        """CXMI in nats per target token overall and per sentence position (1-based; the last
        position pools the later ones), and the ``top`` tokens seen at least ``min_count`` times with
        the largest mean P-CXMI (``token_text`` maps an id to its text)."""
        positions = {}
        for pos in sorted(self.by_position):
            s, n, k = self.by_position[pos]
            name = f"{POSITIONS + 1}+" if pos == POSITIONS else str(pos + 1)
            positions[name] = {"cxmi": s / n if n else 0.0, "tokens": n, "sentences": k}
        ranked = sorted(
            ((s / n, n, token) for token, (s, n) in self.by_token.items() if n >= min_count),
            key=lambda x: (-x[0], x[2]),
        )
        return {
            "cxmi": self.total / self.tokens if self.tokens else 0.0,
            "tokens": self.tokens,
            "cxmi_all": self.total_all / self.tokens_all if self.tokens_all else 0.0,
            "tokens_all": self.tokens_all,
            "sentences": self.sentences,
            "sentences_with_context": self.with_context_sentences,
            "positions": positions,
            "top_tokens": [{"token": token_text(token), "p_cxmi": mean, "count": n} for mean, n, token in ranked[:top]],
        }


def cxmi(
    translator: Translator,
    documents: Iterable[list[Pair]],
    baseline: Optional[Translator] = None,
    max_context: int = 0,
    top_tokens: int = 0,
    min_count: int = 3,
) -> dict:
    """CXMI of ``translator`` over ``documents`` (see the module docstring); ``baseline`` scores
    the sentences without context instead of the model itself (it must share the target vocabulary)."""
    if baseline is not None and baseline.codec.tgt_vocab != translator.codec.tgt_vocab:
        raise UserError("the CXMI baseline must have the model's target vocabulary (the same subwords to compare)")
    acc = Cxmi()
    for sentence in score_documents(translator, documents, baseline, max_context):
        acc.add(sentence)
    if not acc.sentences:
        raise DataError("the test set has no sentences")
    itos = translator.codec.tgt_vocab.itos
    return acc.summary(lambda i: itos[i], top_tokens, min_count)


def format_cxmi(result: dict) -> str:
    """Console lines: the overall figure, one line per sentence position, the top tokens."""
    lines = [
        f"CXMI {result['cxmi']:.4f} nats/token over {result['tokens']} target tokens of {result['sentences']} "
        f"sentences ({result['sentences_with_context']} with context); with <s> and <eos>: {result['cxmi_all']:.4f}",
        f"{'position':>8} {'sentences':>9} {'tokens':>7} {'CXMI':>8}",
    ]
    for name, p in result["positions"].items():
        lines.append(f"{name:>8} {p['sentences']:>9} {p['tokens']:>7} {p['cxmi']:>8.4f}")
    if result["top_tokens"]:
        lines.append("tokens with the largest mean P-CXMI: " + ", ".join(
            f"{t['token']} {t['p_cxmi']:.3f} ({t['count']}×)" for t in result["top_tokens"]
        ))  # fmt: skip
    return "\n".join(lines)
