"""The streaming document translator.

Input is read as a stream of documents; a buffer of up to ``translate.buffer_sentences``
sentences is split into the model's instances (sentences, or document chunks for document
models), translated in length-sorted batches, and each document is written as soon as all its
sentences are done (in input order). Exactly one output line per input line; blank lines kept.

What an output line can be: empty for a document break (a blank or whitespace-only input line),
otherwise never empty. With ``n_best`` = k > 1, every model writes k tab-separated hypotheses per
line, best first (a document model's j-th field holds the sentence of its j-th best document
translation). Work per input is bounded: a source line longer than ``translate.max_input_tokens``
subwords is split at a word boundary, its pieces translated on their own and joined with a space;
each sentence's output is capped at ``translate.max_length`` tokens; document models translate
long documents in windows (``data.max_tokens``; HM-GDC: ``translate.window_sentences``).

The Python API is this class: ``Translator.load(checkpoint, device=..., beam=...)``, then
``translate(documents)`` (a document is a list of sentences; the same shape comes back),
``nbest(documents)`` and ``score(documents, references)``. ``onmt_doc_translate`` and
``onmt_doc_server`` are thin layers over it (docs/deploy.md).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import asdict, dataclass, fields
from typing import IO, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from onmt_doc.config import Config, TranslateConfig, config_from_dict
from onmt_doc.contracts import Batch
from onmt_doc.data.batching import collate, ordered_batches
from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import iter_parallel
from onmt_doc.data.instances import (
    Example,
    Unit,
    UnitOptions,
    mark_sentence,
    markup_sentences,
    split_sentences,
    unit_class,
)
from onmt_doc.data.line_splitting import split_line
from onmt_doc.data.mapped import MappedCorpus, MappedExamples
from onmt_doc.data.vocab import EOS_SENT_ID, PAD_ID, SOS_ID
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.registry import Registry, closest, registry_for
from onmt_doc.translate.forced_decoding import TokenScores, sentence_log_probs, sentence_token_log_probs
from onmt_doc.translate.request_context import Contexts, DocumentWithContext, check_contexts, check_sentence
from onmt_doc.translate.search import build_search

log = logging.getLogger("onmt_doc")

# characters that would break the one-line-per-input-line output (tab separates n-best fields)
_NOT_IN_LINE = str.maketrans({c: " " for c in "\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})
EMPTY_FILL = "<unk>"  # written (and counted) if a translation decodes to no text
# translation engines by name (``Translator.load(..., engine=...)``, ``-engine``): ``torch`` is this
# module's Translator (onmt_doc's own search over checkpoints), ``ctranslate2`` decodes a CTranslate2
# export (translate/ctranslate2_engine.py, imported by registry_for("engine"): it builds on this module)
ENGINES = Registry("engine")
EXPORT_INFO = "onmt_doc_export.json"  # the file that marks an onmt_doc_release folder


@dataclass
class TranslationStats:
    """What the translator had to repair, for the log and the command's final line."""

    lines_split: int = 0  # source lines longer than max_input_tokens, translated in pieces
    docs_repaired: int = 0  # document instances whose output had the wrong number of sentences
    empty_filled: int = 0  # translations that decoded to no text, written as EMPTY_FILL
    documents: int = 0  # documents (or single lines) written by run_files
    sentences: int = 0  # output lines written by run_files (n-best lines count once)

    def summary(self) -> str:
        """What the final log line reports about repaired and split inputs."""
        return (
            f"{self.lines_split} long lines split, {self.docs_repaired} document outputs padded or "
            f"merged to the source's sentence count, {self.empty_filled} empty translations "
            f"written as {EMPTY_FILL}"
        )


Documents = Sequence[Sequence[str]]


def translator_options(
    base: TranslateConfig, names: Optional[Mapping[str, str]] = None, **overrides: Any
) -> TranslateConfig:
    """``base`` (a checkpoint's translate section) with ``overrides`` (None = keep), checked by the
    config loader like a YAML ``translate:`` section (types, NaN, every key's bounds such as the beam
    cap, ``n_best <= beam``), so the API, the commands and the server refuse the same values with the
    same one-line messages.
    ``names`` says how a message names an option (the command line: ``batch_sentences`` is
    ``-batch_size``); an unknown option is a ConfigError with the closest name."""
    known = [f.name for f in fields(TranslateConfig)]
    for key in overrides:
        if key not in known:
            raise ConfigError(f"unknown translate option '{key}'{closest(key, known)}")
    merged = {**asdict(base), **{k: v for k, v in overrides.items() if v is not None}}

    def name(key: str) -> str:
        return (names or {}).get(key, key)

    try:
        return config_from_dict({"translate": merged}, "translate options").translate
    except ConfigError as e:
        raise ConfigError(re.sub(r"\btranslate\.(\w+)", lambda m: name(m.group(1)), str(e))) from None


def check_documents(documents: Documents, what: str = "documents") -> None:
    """In-memory input as the API takes it: a list of documents, each a list of one-line,
    non-blank sentences (a blank line is a document break in files, not a sentence)."""
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence):
        raise UserError(f"{what}: expected a list of documents (lists of sentences), got {type(documents).__name__}")
    for d, doc in enumerate(documents):
        if isinstance(doc, (str, bytes)) or not isinstance(doc, Sequence):
            raise UserError(
                f"{what}[{d}]: expected a document (a list of sentences), got {type(doc).__name__}; "
                f"to translate one document pass [sentences]"
            )
        for i, sent in enumerate(doc):
            check_sentence(sent, f"{what}[{d}][{i}]")


# context targets given with a request, to force: (document, sentence position) -> marked target ids
Forced = dict[tuple[int, int], np.ndarray]


def forced_prefix(forced: Forced, doc: int, first: int, n: int) -> list[int]:
    """The target prefix of a row whose ``n`` sentences start at ``first``: the given targets of
    its leading sentences, as far as they are given (the context comes first in a document)."""
    ids: list[int] = []
    for p in range(first, first + n):
        if (doc, p) not in forced:
            break
        ids += forced[doc, p].tolist()
    return ids


def _prefix_tensor(prefixes: list[list[int]]) -> Optional[torch.Tensor]:
    """[rows, longest] the rows' prefixes padded with ``<pad>`` (the search's ``prefix``); None if all are empty."""
    longest = max(map(len, prefixes), default=0)
    if not longest:
        return None
    prefix = torch.full((len(prefixes), longest), PAD_ID, dtype=torch.long)
    for r, ids in enumerate(prefixes):
        prefix[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return prefix


def _as_list(value: object) -> list:
    return [value] if isinstance(value, (str, os.PathLike)) or not isinstance(value, (list, tuple)) else list(value)


@ENGINES.register("torch", None)
class Translator:
    """Translate, n-best and score documents with one model (or an ensemble): streaming over
    files for the commands, in memory for the API and the server."""

    def __init__(
        self,
        model: EncoderDecoder,
        codec: Codec,
        cfg: Config,
        options: Optional[TranslateConfig] = None,
        device: Optional[torch.device] = None,
    ):
        self.model, self.codec, self.cfg = model, codec, cfg
        self.opt = options or cfg.translate
        self.device = device or next(model.parameters()).device
        self.search = build_search(self.opt)
        self.stats = TranslationStats()

    @classmethod
    def load(
        cls,
        checkpoint: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
        device: Union[str, torch.device] = "auto",
        option_names: Optional[Mapping[str, str]] = None,
        engine: str = "torch",
        **options: Any,
    ) -> "Translator":
        """A translator for a checkpoint (several: an ensemble, ``translate/ensemble.py``).

        ``device``: ``auto`` (CUDA when there is one), ``cpu``, ``cuda``, ``cuda:N``; ``options``:
        ``translate`` keys (docs/config.md) overriding the checkpoint's, e.g. ``beam=5``,
        ``n_best=3``, ``dtype="bfloat16"``, ``batch_tokens=2048``. ``option_names``: how errors
        name the options (the command line passes its flags). ``engine``: ``torch`` (onmt_doc's own
        search over a checkpoint) or ``ctranslate2``: ``checkpoint`` is then the folder
        ``onmt_doc_release`` wrote (``translate/ctranslate2_engine.py``)."""
        from onmt_doc.devices import configure, pick_device

        engine_flag = (option_names or {}).get("engine", "engine")
        engine_class = registry_for("engine").get(str(engine), engine_flag).cls  # before the (slow) load
        if not checkpoint or not all(isinstance(p, (str, os.PathLike)) for p in _as_list(checkpoint)):
            raise UserError(f"Translator.load: expected a checkpoint path or a list of paths, got {checkpoint!r:.80}")
        known = [f.name for f in fields(TranslateConfig)]
        for key in options:  # before the (slow) load
            if key not in known:
                raise ConfigError(f"unknown translate option '{key}'{closest(key, known)}")
        paths = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
        dev = (
            pick_device(device, key=(option_names or {}).get("device", "device"))
            if isinstance(device, str)
            else configure(torch.device(device))
        )
        return engine_class.load_paths([os.fspath(p) for p in paths], dev, option_names or {}, **options)

    @classmethod
    def load_paths(
        cls, paths: list[str], device: torch.device, option_names: Mapping[str, str], **options: Any
    ) -> "Translator":
        """:meth:`load` of checked arguments, for this engine: a checkpoint, or an ensemble of them."""
        from onmt_doc.models.checkpoint import load_model

        if len(paths) == 1 and os.path.isdir(paths[0]) and os.path.isfile(os.path.join(paths[0], EXPORT_INFO)):
            flag = option_names.get("engine", "engine")
            raise UserError(f"{paths[0]}: a CTranslate2 export; translate it with {flag} ctranslate2")
        if len(paths) == 1:
            model, cfg, codec = load_model(paths[0], device)
        else:
            from onmt_doc.translate.ensemble import load_models

            model, cfg, codec = load_models(paths, device)
        opts = translator_options(cfg.translate, option_names, **options)
        if len(paths) > 1:
            model.average = opts.ensemble_average
        model.to(getattr(torch, opts.dtype))
        return cls(model, codec, cfg, opts, device)

    # ------------------------------------------------------------------ the API
    def translate(self, documents: Documents, context: Optional[Contexts] = None) -> list[list[str]]:
        """The best translation of every sentence: ``documents`` is a list of documents, each a
        list of sentences; the result has the same shape (documents translated in context).
        ``context``: per document, the sentences before it (``request_context.py``)."""
        return [[fields[0][0] for fields in doc] for doc in self.nbest(documents, context)]

    def nbest(self, documents: Documents, context: Optional[Contexts] = None) -> list[list[list[tuple[str, float]]]]:
        """``n_best`` (text, score) pairs per sentence, best first. The score is the hypothesis'
        log-probability divided by the length penalty (what the beam ranks by); a document model's
        sentences share their document (window) hypothesis' score; a line translated in pieces
        (``max_input_tokens``) sums its pieces' scores. ``context``: per document, its preceding
        sentences, each a source or a (source, target or None) pair; what the model reads of them
        is :meth:`context_sides`; forced context targets count in no score (new sentences only)."""
        check_documents(documents)
        contexts = None if context is None else check_contexts(context, len(documents))
        self.model.eval()
        items = self._items([[(s, None) for s in d] for d in documents], contexts)
        return [out or [] for out in self._process(items, self._run_translation, with_target=False)]

    def score(
        self, documents: Documents, references: Documents, context: Optional[Contexts] = None
    ) -> list[list[float]]:
        """Forced decoding: the log-probability of each reference sentence given its source
        document, in the same shape (the numbers ``onmt_doc_translate -score`` prints). With
        ``context`` (as :meth:`nbest`), the documents' new sentences only are scored, in the
        instances a whole document would put them in; a model reading context targets needs them."""
        check_documents(documents)
        check_documents(references, "references")
        if [len(d) for d in documents] != [len(r) for r in references]:
            raise UserError("references: need one reference sentence per source sentence, document by document")
        contexts = None if context is None else check_contexts(context, len(documents))
        items = self._items([list(zip(d, r)) for d, r in zip(documents, references)], contexts)
        return [[float(x) for x in out] if out else [] for out in self.score_items(items, exact=True)]

    def context_sides(self) -> tuple[str, ...]:
        """What this model reads of a request's context: ``("src", "tgt")``, ``("src",)`` or ``()``
        (a sentence model: the context is not used). See ``Unit.context_sides``."""
        return unit_class(self.model.unit).context_sides()

    def instances(self, documents: Sequence[Sequence[tuple[str, str]]]) -> tuple[list[list[tuple]], list[Example]]:
        """The tokenized documents of (source, target) pairs and the instances forced decoding
        runs for them (``score``'s): what the context pictures read the model's attention on."""
        tok_docs, _ = self._encode(documents, with_target=True)
        return tok_docs, self._instances(tok_docs)

    @staticmethod
    def _items(docs: list[list[tuple]], contexts: Optional[list[list[tuple]]]) -> list[Optional[list]]:
        """The translator's items: each document's pairs (with its context, if any); None for an
        empty document."""
        if contexts is None:
            return [d or None for d in docs]
        return [DocumentWithContext(d, c) if d else None for d, c in zip(docs, contexts)]

    # ------------------------------------------------------------------ shared machinery
    def _split_long(self, ids: np.ndarray) -> list[np.ndarray]:
        """A source sentence as pieces of at most ``max_input_tokens`` subwords, cut at word
        boundaries (``onmt_doc/data/line_splitting.py``); counted in the stats when cut."""
        pieces = split_line(ids, self.opt.max_input_tokens, self.codec.src_vocab, self.codec.src_subword)
        self.stats.lines_split += int(len(pieces) > 1)
        return pieces

    def _encode(self, docs: Sequence[Sequence[tuple]], with_target: bool) -> tuple[list[list[tuple]], list[list[int]]]:
        """Tokenized documents and, per sentence, the number of pieces it was split into
        (translation only: a scored target belongs to its whole source line)."""
        flat_src = self.codec.encode([s for d in docs for s, _ in d], "src")
        flat_tgt = self.codec.encode([t for d in docs for _, t in d], "tgt") if with_target else None
        tok_docs, pieces, i = [], [], 0
        for d in docs:
            tok_doc, counts = [], []
            for j in range(len(d)):
                parts = [flat_src[i + j]] if with_target else self._split_long(flat_src[i + j])
                tok_doc += [(p, flat_tgt[i + j] if flat_tgt else None) for p in parts]
                counts.append(len(parts))
            tok_docs.append(tok_doc)
            pieces.append(counts)
            i += len(d)
        return tok_docs, pieces

    def _unit_options(self) -> UnitOptions:
        """The options translation builds instances with: documents windowed to ``data.max_tokens``
        (HM-GDC: ``translate.window_sentences``)."""
        data = self.cfg.data
        return UnitOptions(
            max_tokens=data.max_tokens,
            max_sentences=self.opt.window_sentences or data.max_sentences,
            window_tokens=data.max_tokens,
            context_sentences=data.context_sentences,
            sentence_markup=data.sentence_markup,
        )

    def _unit(self) -> Unit:
        """The model's unit with translation's options."""
        return unit_class(self.model.unit, "unit")(self._unit_options())

    def _instances(self, tok_docs: list[list[tuple]]) -> list[Example]:
        """The instances of tokenized documents: training's code (``MappedExamples``) over arrays
        built in memory."""
        return list(MappedExamples(MappedCorpus.from_documents(tok_docs), self.model.unit, self._unit_options()))

    def _context(
        self, docs: list[list], tok_docs: list[list[tuple]], with_target: bool
    ) -> tuple[list[list[tuple]], Forced]:
        """The tokenized context each document keeps (the unit's window, ``Unit.context_kept``),
        as pairs to put before it, and the context targets to force (translation, a unit reading
        them): (document, position) -> marked ids. Scoring gives a context sentence without a
        target an empty one (scored only where the model reads no context target, and dropped)."""
        unit, sides, most = self._unit(), self.context_sides(), self._context_limit()
        given = [(getattr(d, "context", None) or [])[-most:] if most else [] for d in docs]
        flat = [p for c in given for p in c]
        srcs = self.codec.encode([s for s, _ in flat], "src")
        known = [t is not None and ("tgt" in sides or with_target) for _, t in flat]
        tgts = iter(self.codec.encode([t for (_, t), k in zip(flat, known) if k], "tgt"))
        tok = [(s, next(tgts) if k else None) for s, k in zip(srcs, known)]
        pairs: list[list[tuple]] = []
        forced: Forced = {}
        i = 0
        for d, ctx in enumerate(given):
            mine = tok[i : i + len(ctx)]
            i += len(ctx)
            first = len(tok_docs[d][0][0])
            mine = mine[len(mine) - unit.context_kept([len(s) for s, _ in mine], first) :]
            if with_target:
                if "tgt" in sides and any(t is None for _, t in mine):
                    j = len(given[d]) - len(mine) + next(k for k, (_, t) in enumerate(mine) if t is None)
                    raise UserError(
                        f"context[{d}][{j}]: no target; scoring with a {self.model.unit} model, which reads "
                        "its context's translations, needs them"
                    )
                pairs.append([(s, t if t is not None else np.zeros(0, dtype=np.int64)) for s, t in mine])
            else:
                pairs.append([(s, None) for s, _ in mine])
                forced.update({(d, p): mark_sentence(t) for p, (_, t) in enumerate(mine) if t is not None})
        return pairs, forced

    def _context_limit(self) -> int:
        """The most preceding sentences any instance of this model may hold (0: it reads none): a
        bound taken before tokenizing; ``Unit.context_kept`` then decides on their lengths (a
        marked sentence has at least 3 tokens, so ``max_tokens // 3`` bounds a token window)."""
        if not self.context_sides():
            return 0
        data = self.cfg.data
        return max(data.max_tokens // 3, data.context_sentences, data.max_sentences, self.opt.window_sentences)

    def _needed(self, examples: list[Example], n_context: list[int], forced: Forced, scoring: bool) -> list[bool]:
        """Whether each instance produces an output besides the context's: a new sentence's, or
        (``k_to_k`` forcing its context) a context sentence's translation that a later prefix needs."""
        unit = unit_class(self.model.unit)
        prefixed = set(range(len(n_context))) if self.opt.force_context_prefix else {d for d, _ in forced}
        needed = []
        for ex in examples:
            outputs = range(ex.first, ex.first + ex.n_sents) if ex.sent_lens is not None else None
            positions = outputs or unit.output_sentences(ex.first, ex.n_sents)
            needed.append(
                any(
                    p >= n_context[ex.doc]
                    or (not scoring and unit.has_target_context() and ex.doc in prefixed and (ex.doc, p) not in forced)
                    for p in positions
                )
            )
        return needed

    def _process(
        self, items: Iterable[Optional[list]], run: Callable[[list, list[Example]], Iterator], with_target: bool
    ) -> Iterator[Optional[list]]:
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
        tok_docs, pieces = self._encode(docs, with_target) if docs else ([], [])
        examples, forced, n_context = [], {}, [0] * len(docs)
        if any(getattr(d, "context", None) for d in docs):  # context before the documents
            context, forced = self._context(docs, tok_docs, with_target)
            n_context = [len(c) for c in context]
            tok_docs = [c + d for c, d in zip(context, tok_docs)]
            pieces = [[1] * len(c) + p for c, p in zip(context, pieces)]
        outputs: list[list] = [[None] * len(d) for d in tok_docs]
        remaining = [len(d) for d in tok_docs]
        if docs:
            examples = self._instances(tok_docs)
        if any(n_context):  # instances giving only context outputs are not run: their slots are done
            needed = self._needed(examples, n_context, forced, with_target)
            unit = unit_class(self.model.unit)
            for ex, keep in zip(examples, needed):
                if not keep:
                    remaining[ex.doc] -= (
                        ex.n_sents if ex.sent_lens is not None else len(unit.output_sentences(ex.first, ex.n_sents))
                    )
            examples = [ex for ex, keep in zip(examples, needed) if keep]
        doc_of_item = []
        k = 0
        for item in items:
            doc_of_item.append(k if item else None)
            k += 1 if item else 0
        next_item = 0
        for done_docs in run(outputs, examples, forced=forced):
            for d, n in done_docs:
                remaining[d] -= n
            while next_item < len(items) and (doc_of_item[next_item] is None or remaining[doc_of_item[next_item]] == 0):
                d = doc_of_item[next_item]
                yield None if d is None else self._join(outputs[d][n_context[d] :], pieces[d][n_context[d] :])
                next_item += 1
        for i in range(next_item, len(items)):
            d = doc_of_item[i]
            yield None if d is None else self._join(outputs[d][n_context[d] :], pieces[d][n_context[d] :])

    @staticmethod
    def _join(outputs: list[list], counts: list[int]) -> list[list]:
        """The fields of each input sentence: a sentence translated in pieces gets, per n-best
        field, its pieces' texts joined with a space and their scores summed."""
        lines, i = [], 0
        for c in counts:
            parts = outputs[i : i + c]
            if c == 1:
                lines.append(parts[0])
            else:
                lines.append(
                    [(" ".join(p[j][0] for p in parts), sum(p[j][1] for p in parts)) for j in range(len(parts[0]))]
                )
            i += c
        return lines

    def _batches(self, examples: list[Example], by_source_only: bool):
        for idx in ordered_batches(examples, self.opt.batch_tokens, by_source_only, self.opt.batch_sentences):
            yield idx, collate([examples[i] for i in idx], idx).to(self.device)

    @staticmethod
    def _rows(idx: list[int], batch: Batch, examples: list[Example]) -> Iterator[tuple[Example, int, int]]:
        """Per batch row: its instance, the document position of its first sentence and its
        number of sentences (a context instance has one row per sentence)."""
        for d, first in zip(batch.doc_index.tolist(), batch.first_sent.tolist()):
            ex = examples[idx[d]]
            yield ex, first, ex.n_sents if ex.sent_lens is None else 1

    # ------------------------------------------------------------------ translation
    def _text(self, ids: list[int]) -> str:
        """Detokenized text of one output sentence: one line, never empty."""
        text = self.codec.decode(ids).translate(_NOT_IN_LINE).strip()
        if not text:
            self.stats.empty_filled += 1
            return EMPTY_FILL
        return text

    def _hypothesis_lines(self, hyps: list, n: int) -> list[list[tuple[str, float]]]:
        """[n sentences][n_best fields] of (text, score): the sentences of each hypothesis, best
        first; when the search finished fewer than n_best, the last one is repeated (fixed number
        of fields)."""
        hyps = (hyps or [None])[: self.opt.n_best]
        hyps = hyps + [hyps[-1]] * (self.opt.n_best - len(hyps))
        fields = []
        for h in hyps:
            sents = markup_sentences(h.tokens if h else [])
            if n > 1 and len(sents) != n:
                self.stats.docs_repaired += 1
            score = h.score if h else float("-inf")
            fields.append([(self._text(s), score) for s in split_sentences(h.tokens if h else [], n)])
        return [[f[i] for f in fields] for i in range(n)]

    @staticmethod
    def _place(doc_outputs: list, positions: range, first: int, values: Sequence) -> int:
        """Write a row's ``values`` (one per sentence of the row, which starts at ``first``) at the
        document ``positions`` its output translates (``Unit.output_sentences``); returns how many."""
        for p in positions:
            doc_outputs[p] = values[p - first]
        return len(positions)

    @torch.no_grad()
    def _run_translation(
        self, outputs: list[list], examples: list[Example], forced: Optional[Forced] = None
    ) -> Iterator[list[tuple[int, int]]]:
        """Translate ``examples`` into ``outputs``; ``forced``: context targets given with the
        request, forced as the target prefix of the instances that hold them."""
        unit = unit_class(self.model.unit)
        forced = forced or {}
        if unit.has_target_context():
            prefixed, examples = self._split_prefixed(examples, forced)
            if prefixed:
                yield from self._run_prefixed(outputs, prefixed, forced)
        markup = self.cfg.data.sentence_markup
        for idx, batch in self._batches(examples, by_source_only=True):
            done = []
            rows = list(self._rows(idx, batch, examples))
            prefix = _prefix_tensor([forced_prefix(forced, ex.doc, first, n) for ex, first, n in rows])
            hyps_of_rows = self.search.search(self.model, batch, prefix=prefix, markup=markup)
            for (ex, first, n), hyps in zip(rows, hyps_of_rows):
                lines = self._hypothesis_lines(hyps, n)  # every sentence, so the stats count them all
                done.append((ex.doc, self._place(outputs[ex.doc], unit.output_sentences(first, n), first, lines)))
            yield done

    def _split_prefixed(self, examples: list[Example], forced: Forced) -> tuple[list[Example], list[Example]]:
        """The examples of a unit with target context (``k_to_k``) translated sentence by sentence
        with their context forced (``translate.force_context_prefix``, or a document whose context
        targets were given), and the others."""
        docs = {d for d, _ in forced}
        prefixed = [ex for ex in examples if self.opt.force_context_prefix or ex.doc in docs]
        return prefixed, [ex for ex in examples if not (self.opt.force_context_prefix or ex.doc in docs)]

    def _run_prefixed(
        self, outputs: list[list], examples: list[Example], forced: Optional[Forced] = None
    ) -> Iterator[list[tuple[int, int]]]:
        """A unit whose target holds its context sentences (``k_to_k``) with
        ``translate.force_context_prefix`` or context targets given (``forced``): sentence by
        sentence within each document (the i-th sentences of all buffered documents in one pass),
        each example's previous sentences forced as the target prefix with the given targets or
        the model's own (best) translations of them, so only the last sentence is generated."""
        unit = unit_class(self.model.unit)
        best: dict[tuple[int, int], list[int]] = {k: v.tolist() for k, v in (forced or {}).items()}
        waves: dict[int, list[Example]] = {}
        for ex in examples:
            waves.setdefault(ex.first + ex.n_sents - 1, []).append(ex)
        for i in sorted(waves):
            wave = waves[i]
            for idx, batch in self._batches(wave, by_source_only=True):
                rows = list(self._rows(idx, batch, wave))
                context = [[t for j in range(first, first + n - 1) for t in best[ex.doc, j]] for ex, first, n in rows]
                prefix = _prefix_tensor(context)
                done = []
                for (ex, first, n), hyps in zip(rows, self.search.search(self.model, batch, prefix=prefix)):
                    lines = self._hypothesis_lines(hyps, n)
                    done.append((ex.doc, self._place(outputs[ex.doc], unit.output_sentences(first, n), first, lines)))
                    last = split_sentences(hyps[0].tokens, n)[-1] if hyps else []
                    best[ex.doc, first + n - 1] = [SOS_ID, *last, EOS_SENT_ID]
                yield done

    def translate_items(self, items: Iterable[Optional[list]]) -> Iterator[Optional[list[str]]]:
        """Translations of a stream of documents (lists of (src, _) pairs; None = blank line), as
        output lines: the n-best texts of each sentence joined with a tab."""
        self.model.eval()
        for out in self._process(items, self._run_translation, with_target=False):
            yield None if out is None else ["\t".join(text for text, _ in line) for line in out]

    def translate_stream(self, lines: Iterable[str]) -> Iterator[str]:
        """Translate a stream of lines one at a time, each as soon as it is read (subtitles, chat,
        ``onmt_doc_translate -stream``): every line is a new sentence of the current document,
        translated with the document's earlier lines and their translations as its context (the
        model's own window of it, as :meth:`nbest`'s ``context``); a blank line ends the document
        (written as a blank line). Yields each output line: the n-best texts joined with a tab."""
        if isinstance(lines, (str, bytes)) or not isinstance(lines, Iterable):
            raise UserError(f"lines: expected an iterable of lines (str), got {type(lines).__name__}")
        self.model.eval()
        self.stats = TranslationStats()
        context: list[tuple[str, str]] = []  # the current document's lines and their best translations
        most, in_document = self._context_limit(), False
        for number, line in enumerate(lines):
            if not isinstance(line, str):
                raise UserError(f"lines[{number}]: expected a line (str), got {type(line).__name__}")
            if line.strip():  # a sentence, checked as translate's are (a blank line ends the document)
                check_sentence(line, f"lines[{number}]")
            if not line.strip():
                self.stats.documents += in_document
                context, in_document = [], False
                yield ""
                continue
            item = DocumentWithContext([(line, None)], context)
            out = next(self._flush([item], self._run_translation, with_target=False))[0]
            context = (context + [(line, out[0][0])])[-most:] if most else []
            self.stats.sentences += 1
            in_document = True
            yield "\t".join(text for text, _ in out)
        self.stats.documents += in_document

    def translate_documents(self, docs: Documents) -> list[list[str]]:
        """Translate in-memory documents (lists of source sentences) into output lines (n-best
        fields tab-separated, as in files); :meth:`translate` gives the best only."""
        return list(self.translate_items([[(s, None) for s in d] for d in docs]))

    # ------------------------------------------------------------------ forced decoding
    @torch.no_grad()
    def _run_scoring(
        self, outputs: list[list], examples: list[Example], tokens: bool = False, forced: Optional[Forced] = None
    ) -> Iterator[list[tuple[int, int]]]:
        """Each sentence's log-probability, or (``tokens``) its tokens' (id, log-probability) list."""
        unit = unit_class(self.model.unit)
        scorer = sentence_token_log_probs if tokens else sentence_log_probs
        for idx, batch in self._batches(examples, by_source_only=False):
            rows = list(self._rows(idx, batch, examples))
            values = scorer(self.model, batch, [n for _, _, n in rows])
            done = []
            for (ex, first, n), row_values in zip(rows, values):
                scores = row_values[:n]  # written where the unit says (k_to_k: the last)
                done.append((ex.doc, self._place(outputs[ex.doc], unit.output_sentences(first, n), first, scores)))
            yield done

    def score_items(self, items: Iterable[Optional[list]], exact: bool = False) -> Iterator[Optional[list[str]]]:
        """Log-probability of each given target sentence (with its markup and, for the last
        sentence of an instance, the final <eos>); ``exact`` writes full float precision (repr,
        which reads back to the same float) for callers that compare scores, else 4 decimals."""
        self.model.eval()
        fmt = repr if exact else "{:.4f}".format
        for out in self._process(items, self._run_scoring, with_target=True):
            yield None if out is None else [fmt(x) for x in out]

    def score_tokens(self, items: Iterable[Optional[list]]) -> Iterator[Optional[list[TokenScores]]]:
        """:meth:`score_items` token by token: per given target sentence, the (target id,
        log-probability) of each token it owns, whose sum is its score (point-wise measures)."""
        self.model.eval()
        yield from self._process(items, functools.partial(self._run_scoring, tokens=True), with_target=True)

    # ------------------------------------------------------------------ files
    def run_files(
        self,
        src: str,
        output: IO[str],
        tgt: Optional[str] = None,
        score: bool = False,
        on_document: Optional[Callable[[int], None]] = None,
    ) -> Optional[tuple[list, list]]:
        """Translate (or score) ``src`` into ``output``; with ``tgt`` (translating) return the best
        hypotheses and the references, per document, for the caller's metrics (``evaluation.bleu.report``)."""
        documents = self.cfg.data.documents
        self.stats = TranslationStats()
        items = iter_parallel(src, tgt, documents, self.cfg.data.max_line_chars)
        if not score:
            refs: list[list[str]] = []

            def keep_refs(stream: Iterator) -> Iterator:
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
            self.stats.documents += 1
            self.stats.sentences += len(out)
            if tgt and not score:
                hyp_docs.append([line.split("\t")[0] for line in out])  # metrics of the best hypothesis
            if on_document:
                on_document(n)
        if (self.stats.lines_split, self.stats.docs_repaired, self.stats.empty_filled) != (0, 0, 0):
            log.warning(f"{src}: {self.stats.summary()}")
        if tgt and not score:
            return hyp_docs, refs
        return None
