"""The streaming document translator.

Input is read as a stream of documents; a buffer of up to ``translate.buffer_sentences``
sentences is split into the model's instances (sentences, or document chunks for document
models), translated in length-sorted batches, and each document is written as soon as all its
sentences are done (in input order). Exactly one output line per input line; blank lines kept.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import IO, Callable, Iterable, Iterator, Optional, Sequence

import torch

from onmt_doc.config import Config, TranslateConfig
from onmt_doc.data.batching import collate, ordered_batches
from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import iter_parallel
from onmt_doc.data.instances import Example, build_instances
from onmt_doc.data.vocab import BOS_ID, EOS_ID, EOS_SENT_ID, PAD_ID, SOS_ID
from onmt_doc.evaluation.bleu import report
from onmt_doc.models.model import EncoderDecoder, full_log_probs
from onmt_doc.translate.beam_search import BeamSearch

_SKIP = {BOS_ID, EOS_ID, PAD_ID}


def split_sentences(ids: Sequence[int], n: int) -> list[list[int]]:
    """Split generated ids into ``n`` sentences by their ``<s> … </s>`` markup.

    Sentence models make one sentence; if a model makes too few or too many, missing sentences are
    empty and extra ones are joined to the last, so the output never loses its alignment.
    """
    sents: list[list[int]] = []
    cur: list[int] = []
    for i in ids:
        if i == SOS_ID:
            if cur:
                sents.append(cur)
            cur = []
        elif i == EOS_SENT_ID:
            sents.append(cur)
            cur = []
        elif i not in _SKIP:
            cur.append(i)
    if cur:
        sents.append(cur)
    if n == 1:
        return [[t for s in sents for t in s]]
    if len(sents) > n:
        sents = sents[: n - 1] + [[t for s in sents[n - 1:] for t in s]]
    return sents + [[] for _ in range(n - len(sents))]


class Translator:
    def __init__(self, model: EncoderDecoder, codec: Codec, cfg: Config, options: Optional[TranslateConfig] = None,
                 device: Optional[torch.device] = None):
        self.model, self.codec, self.cfg = model, codec, cfg
        self.opt = options or cfg.translate
        self.device = device or next(model.parameters()).device
        self.search = BeamSearch(self.opt.beam, self.opt.n_best, self.opt.length_penalty,
                                 self.opt.max_len_ratio, self.opt.max_len_add)

    # ------------------------------------------------------------------ shared machinery
    def _instances(self, docs: Sequence[Sequence[tuple]], with_target: bool) -> list[Example]:
        flat_src = self.codec.encode([s for d in docs for s, _ in d], "src")
        flat_tgt = self.codec.encode([t for d in docs for _, t in d], "tgt") if with_target else None
        tok_docs, i = [], 0
        for d in docs:
            tok_docs.append([(flat_src[i + j], flat_tgt[i + j] if flat_tgt else None) for j in range(len(d))])
            i += len(d)
        examples, _ = build_instances(self.model.unit, tok_docs, self.cfg.data.max_tokens,
                                      max_sentences=self.cfg.data.max_sentences)
        return examples

    def _process(self, items: Iterable[Optional[list]], run: Callable[[list, list[Example]], Iterator],
                 with_target: bool) -> Iterator[Optional[list]]:
        """Buffer documents, run ``run`` over their instances, yield each item's outputs in order."""
        buffer: list[Optional[list]] = []
        size = 0
        for item in items:
            buffer.append(item)
            size += len(item) if item else 0
            if size >= self.opt.buffer_sentences:
                yield from self._flush(buffer, run, with_target)
                buffer, size = [], 0
        yield from self._flush(buffer, run, with_target)

    def _flush(self, items: list, run: Callable, with_target: bool) -> Iterator[Optional[list]]:
        docs = [d for d in items if d]
        outputs: list[list] = [[None] * len(d) for d in docs]
        remaining = [len(d) for d in docs]
        doc_of_item = []
        k = 0
        for item in items:
            doc_of_item.append(k if item else None)
            k += 1 if item else 0
        next_item = 0
        examples = self._instances(docs, with_target) if docs else []
        for done_docs in run(outputs, examples):
            for d, n in done_docs:
                remaining[d] -= n
            while next_item < len(items) and (doc_of_item[next_item] is None
                                               or remaining[doc_of_item[next_item]] == 0):
                d = doc_of_item[next_item]
                yield None if d is None else outputs[d]
                next_item += 1
        for i in range(next_item, len(items)):
            yield None if doc_of_item[i] is None else outputs[doc_of_item[i]]

    def _batches(self, examples: list[Example], by_source_only: bool):
        for idx in ordered_batches(examples, self.opt.batch_tokens, by_source_only, self.opt.batch_sentences):
            yield idx, collate([examples[i] for i in idx], idx).to(self.device)

    @staticmethod
    def _rows(idx, batch, examples: list[Example]) -> Iterator[tuple[Example, int, int]]:
        """Per batch row: its instance, the document position of its first sentence and its
        number of sentences (a context instance has one row per sentence)."""
        for d, first in zip(batch.doc_index.tolist(), batch.first_sent.tolist()):
            ex = examples[idx[d]]
            yield ex, first, ex.n_sents if ex.sent_lens is None else 1

    # ------------------------------------------------------------------ translation
    @torch.no_grad()
    def _run_translation(self, outputs: list[list], examples: list[Example]) -> Iterator[list[tuple[int, int]]]:
        for idx, batch in self._batches(examples, by_source_only=True):
            done = []
            for (ex, first, n), hyps in zip(self._rows(idx, batch, examples), self.search.search(self.model, batch)):
                if self.opt.n_best > 1 and n == 1:   # n-best of a sentence: tab-separated
                    lines = ["\t".join(self.codec.decode(split_sentences(h.tokens, 1)[0]) for h in hyps)]
                else:
                    best = hyps[0].tokens if hyps else []
                    lines = [self.codec.decode(sent) for sent in split_sentences(best, n)]
                outputs[ex.doc][first:first + n] = lines
                done.append((ex.doc, n))
            yield done

    def translate_items(self, items: Iterable[Optional[list]]) -> Iterator[Optional[list[str]]]:
        """Translations of a stream of documents (lists of (src, _) pairs; None = blank line)."""
        self.model.eval()
        return self._process(items, self._run_translation, with_target=False)

    def translate_documents(self, docs: Sequence[Sequence[str]]) -> list[list[str]]:
        """Translate in-memory documents (lists of source sentences)."""
        return list(self.translate_items([[(s, None) for s in d] for d in docs]))

    # ------------------------------------------------------------------ forced decoding
    @torch.no_grad()
    def _run_scoring(self, outputs: list[list], examples: list[Example]) -> Iterator[list[tuple[int, int]]]:
        for idx, batch in self._batches(examples, by_source_only=False):
            lp = full_log_probs(self.model, batch).gather(2, batch.tgt_out[..., None]).squeeze(2)
            lp = lp.masked_fill(batch.tgt_out.eq(PAD_ID), 0.0)
            # sentence k owns its <s> … </s> tokens; the final <eos> counts for the last sentence
            tags = torch.cat([batch.tgt_groups[:, 1:], torch.zeros_like(batch.tgt_groups[:, :1])], 1)
            tags = torch.where(batch.tgt_out.eq(EOS_ID), tags.max(1, keepdim=True).values, tags)
            done = []
            for row, (ex, first, n) in enumerate(self._rows(idx, batch, examples)):
                sums = torch.zeros(n + 1, dtype=lp.dtype).index_add_(0, tags[row].cpu(), lp[row].cpu())
                for j in range(n):
                    outputs[ex.doc][first + j] = f"{float(sums[j + 1]):.4f}"
                done.append((ex.doc, n))
            yield done

    def score_items(self, items: Iterable[Optional[list]]) -> Iterator[Optional[list[str]]]:
        """Log-probability of each given target sentence (with its markup and, for the last
        sentence of an instance, the final <eos>)."""
        self.model.eval()
        return self._process(items, self._run_scoring, with_target=True)

    # ------------------------------------------------------------------ files
    def run_files(self, src: str, output: IO[str], tgt: Optional[str] = None, score: bool = False,
                  on_document: Optional[Callable[[int], None]] = None) -> Optional[dict]:
        """Translate (or score) ``src`` into ``output``; with ``tgt`` return BLEU/chrF(/d-BLEU)."""
        documents = self.cfg.data.documents
        items = iter_parallel(src, tgt, documents, self.cfg.data.max_line_chars)
        if not score:
            refs: list[list[str]] = []

            def keep_refs(stream):
                for item in stream:
                    if item and tgt:
                        refs.append([t for _, t in item])
                    yield item

            items = keep_refs(items)
        results = self.score_items(items) if score else self.translate_items(items)
        hyp_docs: list[list[str]] = []
        for n, out in enumerate(results):
            if out is None:
                output.write("\n")
                continue
            output.write("".join(line + "\n" for line in out))
            output.flush()
            if tgt and not score:
                hyp_docs.append(out)
            if on_document:
                on_document(n)
        if tgt and not score:
            return report(hyp_docs, refs, documents)
        return None


def translator_options(base: TranslateConfig, **overrides) -> TranslateConfig:
    """The stored translate section with command-line overrides (None = keep)."""
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
