"""Translation through a CTranslate2 export (``onmt_doc_release``): the engine behind
``onmt_doc_translate -engine ctranslate2 -model FOLDER`` and ``Translator.load(FOLDER, engine="ctranslate2")``.

An export is a plain Transformer over the sentences of one unit (``sentence``, or the concatenation
units ``k_to_1`` / ``k_to_k`` with ``data.context_sentences`` = k, docs/models/concatenation.md).
:class:`CTranslate2Translator` is the streaming :class:`~onmt_doc.translate.translator.Translator`
with CTranslate2 in place of onmt_doc's search: the same reading, buffering, tokenization, long-line
splitting, instances (``build_instances``: the same concatenated, marked sources), batches and
output lines; only the decoding call differs. Each row is decoded as onmt_doc's rules decode it
(``onmt_doc/translate/rules.py``), with CTranslate2's options and target prefixes:

- ``sentence`` and ``k_to_1``: target prefix ``<s>``, stop at ``</s>`` or ``<eos>``
  (:func:`translation_options`); the output is the sentence.
- ``k_to_k`` (default, ``translate.force_context_prefix: false``): onmt_doc decodes all k+1
  sentences of a window (``<s>`` forced after each ``</s>``, no ``<eos>`` before the last) and keeps
  the last. Here the window's sentences are decoded one after another, each call continuing the
  tokens decoded so far as its target prefix (the context sentences end at ``</s>`` with ``<eos>``
  suppressed, ``last=False``). With greedy search this is exactly onmt_doc's search (a greedy
  decoder continuing its own prefix makes the same choices); with a beam, each sentence is searched
  on its own, given the best translation of the ones before.
- ``k_to_k`` with ``translate.force_context_prefix``: sentence by sentence over each document (the
  i-th sentences of all buffered documents together), the best translations already made for the
  k previous sentences forced as the target prefix, as ``Translator._run_prefixed`` does.

Length caps are onmt_doc's (per row ``min(max_len_ratio × source + max_len_add, max_length)``, at
least 3, plus a forced prefix): a call decodes to its longest row's cap and each row is cut at its
own, which for greedy search is exactly onmt_doc's cap. Scores are CTranslate2's (its length
normalisation: the log-probability divided by length^α for ``length_penalty_type: gnmt``, by the
length for ``avg``; none for ``none``), so only the texts compare with onmt_doc's. Forced decoding
(``-score``) needs the checkpoint.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch

from onmt_doc.config import Config, config_from_dict
from onmt_doc.data.batching import ordered_batches
from onmt_doc.data.codec import Codec
from onmt_doc.data.instances import Example, split_sentences, unit_class
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import BOS, EOS, EOS_SENT, EOS_SENT_ID, MASK, PAD, SOS, SOS_ID, Vocab
from onmt_doc.errors import ConfigError, DataError, UserError
from onmt_doc.outputs import parse_json, read_input_bytes
from onmt_doc.translate.search import Hypothesis
from onmt_doc.translate.translator import ENGINES, EXPORT_INFO, Forced, Translator, translator_options

EXPORT_JSON_BYTES = 1 << 30  # the largest file of an export read (vocabularies, subword models)

INFO_FILE = EXPORT_INFO
REGISTRY = ENGINES  # what registry_for("engine") reads: torch (translator.py) and ctranslate2 (here)
# units whose model is a plain Transformer over (concatenated) marked sentences: what CTranslate2 runs
UNITS = ("sentence", "k_to_1", "k_to_k")
# onmt_doc's translate.dtype -> CTranslate2's compute type; float32 keeps the export's own weight type
COMPUTE_TYPES = {"float32": "default", "bfloat16": "bfloat16", "float16": "float16"}


def import_ctranslate2() -> Any:
    """The ``ctranslate2`` module, or a one-line error saying how to install the optional extra."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError("ctranslate2 is not installed; install the export extra: pip install -e '.[export]'") from None
    return ctranslate2


def translation_options(max_positions: int = 1024, markup: bool = True, last: bool = True) -> dict:
    """``Translator.translate_batch`` keyword arguments that decode a sentence as onmt_doc's search
    does (onmt_doc/translate/rules.py): stop at ``</s>`` (after which onmt_doc forces ``<eos>``) or
    ``<eos>``; never ``<pad>``/``<bos>``/``<mask>``, and ``<s>`` only in the target prefix, which
    ends with the sentence's ``<s>`` (``[["<s>"]]`` for a sentence); no ``</s>`` or ``<eos>`` right
    after ``<s>`` (no empty sentence, whatever the prefix). ``last`` false: a context sentence of a
    ``k_to_k`` window, which ends at ``</s>`` only (``<eos>`` suppressed: more sentences follow).
    ``markup`` false (``data.sentence_markup``): no prefix, ``<eos>`` ends, ``<s>``/``</s>``
    never generated, at least one word."""
    if not markup:
        return {
            "end_token": [EOS],
            "suppress_sequences": [[PAD], [BOS], [MASK], [SOS], [EOS_SENT]],
            "min_decoding_length": 1,  # one word before <eos> (no prefix)
            "max_decoding_length": min(250, max_positions - 1),
        }
    suppress = [[PAD], [BOS], [MASK], [SOS], [SOS, EOS_SENT], [SOS, EOS]]  # pairs: they see the prefix
    return {
        "end_token": [EOS_SENT, EOS] if last else [EOS_SENT],
        "suppress_sequences": suppress if last else [*suppress, [EOS]],
        "max_decoding_length": min(250, max_positions - 1),  # counts the target prefix
    }


def source_tokens(tokens: Sequence[str], markup: bool = True) -> list[str]:
    """A tokenized source sentence with our markup, ``<s> … </s>`` (as it is without markup)."""
    return [SOS, *tokens, EOS_SENT] if markup else list(tokens)


def target_prefix(markup: bool = True) -> list[str]:
    """The target prefix of each sentence: ``<s>`` with markup, none without."""
    return [SOS] if markup else []


def target_words(tokens: Sequence[str]) -> list[str]:
    """A CTranslate2 output without its ``<s>`` prefix and any markup, ready to detokenize."""
    return [t for t in tokens if t not in (PAD, SOS, EOS_SENT, BOS, EOS, MASK)]


# ----------------------------------------------------------------------------- reading an export


def _read_json(path: str) -> Any:
    """An export's JSON file: bounded in size and depth, every problem one line naming it."""
    return parse_json(read_input_bytes(path, limit=EXPORT_JSON_BYTES, what="JSON file"), path)


def _vocabulary(folder: str, side: str) -> Vocab:
    """The ``side`` ("source"/"target") vocabulary CTranslate2 saved (JSON list, or a token a line)."""
    for name in ("shared_vocabulary", f"{side}_vocabulary"):
        path = os.path.join(folder, f"{name}.json")
        if os.path.isfile(path):
            tokens = _read_json(path)
            break
        path = os.path.join(folder, f"{name}.txt")
        if os.path.isfile(path):
            data = read_input_bytes(path, limit=EXPORT_JSON_BYTES, what="vocabulary")
            try:
                tokens = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n").split("\n")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            tokens = tokens[:-1] if tokens and not tokens[-1] else tokens
            break
    else:
        raise UserError(f"{folder}: no {side} vocabulary (shared_vocabulary.json or {side}_vocabulary.json)")
    try:
        return Vocab(tokens)
    except DataError as e:
        raise UserError(f"{path}: {e}") from None


def _subword(folder: str, settings: Mapping[str, Any]) -> Subword:
    """The :class:`Subword` an export's tokenization ``settings`` describe; exports written before
    ``mode`` was recorded give it by their pyonmttok options (joiners: the mode; none: ``none``)."""
    mode = settings.get("mode")
    if mode is None:
        mode = settings["pyonmttok_mode"] if "joiner_annotate" in settings["pyonmttok_options"] else "none"
    model = None
    if settings.get("subword_model"):
        path = os.path.join(folder, settings["subword_model"])
        model = read_input_bytes(path, limit=EXPORT_JSON_BYTES, what="subword model")
    return Subword(settings["kind"], mode, model, settings.get("suffix", ()))  # suffix: a Marian import's </s>


def read_export(folder: str) -> tuple[dict, Config, Codec]:
    """An export's ``onmt_doc_export.json``, the onmt_doc config it records (the data settings that
    build the inputs, the model and translate sections) and its codec; mistakes in one line."""
    info_path = os.path.join(folder, INFO_FILE)
    if not os.path.isdir(folder):
        raise UserError(f"{folder}: not a folder; -engine ctranslate2 reads a CTranslate2 export (onmt_doc_release)")
    if not os.path.isfile(info_path):
        raise UserError(f"{folder}: no {INFO_FILE}; not a CTranslate2 export written by onmt_doc_release")
    info = _read_json(info_path)
    if not isinstance(info, dict):
        raise UserError(f"{info_path}: not an onmt_doc export description (expected a JSON object)")
    try:
        unit = info.get("unit", "sentence")  # exports before concatenation units were sentence models
        if unit not in UNITS:
            raise UserError(f"{info_path}: unit {unit!r} has no CTranslate2 translation (only {', '.join(UNITS)})")
        raw = info.get("onmt_doc_config") or {"data": {"sentence_markup": bool(info["target_prefix"])}}
        raw = {**raw, "model": {**raw.get("model", {}), "unit": unit}}
        raw["data"] = {**raw.get("data", {}), "context_sentences": info.get("context_sentences") or 1}
        src, tgt = info["tokenization"]["source"], info["tokenization"]["target"]
        max_positions = int(info["max_positions"])
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"{info_path}: not an onmt_doc export description (missing or wrong: {e})") from None
    try:
        cfg = config_from_dict(raw, info_path)
    except ConfigError as e:
        raise UserError(str(e)) from None
    src_sw = _subword(folder, src)
    tgt_sw = src_sw if tgt == src else _subword(folder, tgt)
    codec = Codec(src_sw, tgt_sw, _vocabulary(folder, "source"), _vocabulary(folder, "target"))
    info["max_positions"] = max_positions
    return info, cfg, codec


class CTranslate2Model:
    """A CTranslate2 export in the place of the translator's model: its ``unit`` and its decoding
    call (:meth:`decode`)."""

    def __init__(self, folder: str, info: dict, cfg: Config, device: torch.device, compute_type: str) -> None:
        ct2 = import_ctranslate2()
        self.folder, self.unit, self.markup = folder, info.get("unit", "sentence"), cfg.data.sentence_markup
        self.max_positions = info["max_positions"]
        kind = "cuda" if device.type == "cuda" else "cpu"
        try:
            self.translator = ct2.Translator(
                folder,
                device=kind,
                device_index=device.index or 0,
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=torch.get_num_threads(),
            )
        except (RuntimeError, ValueError) as e:  # a damaged model.bin, a compute type the device lacks
            raise UserError(f"{folder}: CTranslate2 cannot load it ({str(e).splitlines()[0]})") from None

    def eval(self) -> "CTranslate2Model":
        """Nothing to switch: a CTranslate2 model only translates (the torch model's interface)."""
        return self

    def decode(
        self, rows: Sequence[tuple[list[str], list[str], int]], search: dict, last: bool = True, n_hyp: int = 1
    ) -> list[list[tuple[list[str], float]]]:
        """Each row's ``n_hyp`` best (tokens, score), best first: a row is (source tokens, target
        prefix ending with the sentence's ``<s>``, cap on its target tokens, prefix included); the
        tokens hold the prefix and the end token ``</s>`` (never ``<eos>``), cut at the row's cap.
        ``search``: the strategy's CTranslate2 options; ``last``: see :func:`translation_options`."""
        if not rows:
            return []
        longest = max(len(src) for src, _, _ in rows)
        if longest > self.max_positions:
            raise UserError(
                f"a source of {longest} tokens (markup and context sentences included) is longer than the "
                f"{self.max_positions} positions of {self.folder}; export again with a larger -max_positions"
            )
        options = translation_options(self.max_positions, self.markup, last)
        options["max_decoding_length"] = min(max(cap for _, _, cap in rows), self.max_positions - 1)
        try:
            results = self.translator.translate_batch(
                [src for src, _, _ in rows],
                target_prefix=[prefix or None for _, prefix, _ in rows],
                max_input_length=0,
                return_end_token=True,
                return_scores=True,
                num_hypotheses=n_hyp,
                **search,
                **options,
            )
        except (RuntimeError, ValueError) as e:  # options CTranslate2 refuses (e.g. n_best samples of top_k 1)
            raise UserError(f"{self.folder}: CTranslate2 refused to translate ({str(e).splitlines()[0]})") from None
        out = []
        for (_, _, cap), result in zip(rows, results):
            hyps = []
            for tokens, score in zip(result.hypotheses, result.scores):
                tokens = tokens[:-1] if tokens and tokens[-1] == EOS else tokens
                hyps.append((tokens[:cap], score))
            out.append(hyps)
        return out


# translate options of onmt_doc's search loop, which CTranslate2's own search has no use for: asked for, refused
OWN_SEARCH_OPTIONS = ("read_every", "compile")


@ENGINES.register("ctranslate2", None)
class CTranslate2Translator(Translator):
    """The streaming translator decoding with a CTranslate2 export (see the module docstring)."""

    model: CTranslate2Model

    @classmethod
    def load_paths(
        cls, paths: list[str], device: torch.device, option_names: Mapping[str, str], **options: Any
    ) -> "CTranslate2Translator":
        """A translator for the export in ``paths[0]`` (:meth:`Translator.load`); ``options`` override
        the ``translate`` section the export recorded (the checkpoint's)."""
        if len(paths) > 1:
            flag = option_names.get("engine", "engine")
            raise UserError(f"{flag} ctranslate2 translates with one exported model, not an ensemble of {len(paths)}")
        own = [name for name in OWN_SEARCH_OPTIONS if options.get(name) not in (None, 0, "off")]
        if own:
            names = ", ".join(option_names.get(name, name) for name in own)
            raise UserError(f"{names}: options of onmt_doc's own search, which an export does not run (engine torch)")
        info, cfg, codec = read_export(paths[0])
        opts = translator_options(cfg.translate, option_names, **options)
        if opts.strategy == "sampling":
            import_ctranslate2().set_random_seed(opts.seed)
        model = CTranslate2Model(paths[0], info, cfg, device, COMPUTE_TYPES[opts.dtype])
        return cls(model, codec, cfg, opts, device)  # type: ignore[arg-type]

    def _search_options(self) -> dict:
        """The strategy as CTranslate2 options: beam (greedy for 1) or sampling."""
        o = self.opt
        if o.strategy == "sampling":
            return {
                "beam_size": 1,
                "sampling_topk": o.top_k,
                "sampling_topp": o.top_p,
                "sampling_temperature": o.temperature,
            }
        penalty = {"gnmt": o.length_penalty, "avg": 1.0, "none": 0.0}[o.length_penalty_type]
        return {"beam_size": o.beam, "length_penalty": penalty}

    def _caps(self, examples: Sequence[Example]) -> list[int]:
        """Each row's length cap, as the Transformer decoder gives it (``Decoder.max_output_lengths``:
        the search's ``LengthLimit`` of the marked source length, at least 3)."""
        lengths = torch.tensor([len(ex.src) for ex in examples])
        return self.search.limit(lengths).clamp(min=3).tolist()

    def _hypotheses(self, hyps: list[tuple[list[str], float]]) -> list[Hypothesis]:
        ids = self.codec.tgt_vocab.ids
        return [Hypothesis(ids(tokens), score, score) for tokens, score in hyps]

    def _batches_of(self, examples: list[Example]) -> Iterator[list[Example]]:
        """The examples in onmt_doc's translation batches (length-sorted, ``batch_tokens``, ``batch_size``)."""
        for idx in ordered_batches(examples, self.opt.batch_tokens, True, self.opt.batch_sentences):
            yield [examples[i] for i in idx]

    def _run_translation(
        self, outputs: list[list], examples: list[Example], forced: Optional[Forced] = None
    ) -> Iterator[list[tuple[int, int]]]:
        unit = unit_class(self.model.unit)
        forced = forced or {}
        if unit.has_target_context():  # as Translator._run_translation: given context targets are forced
            prefixed, examples = self._split_prefixed(examples, forced)
            if prefixed:
                yield from self._run_prefixed(outputs, prefixed, forced)
        src_tokens = self.codec.src_vocab.tokens
        for batch in self._batches_of(examples):
            rows = [(src_tokens(ex.src.tolist()), ex.n_sents, cap) for ex, cap in zip(batch, self._caps(batch))]
            if unit.counts_source_sentences():
                decoded = self._decode_windows(rows)
            else:
                prefix = target_prefix(self.model.markup)
                decoded = self.model.decode(
                    [(s, prefix, c) for s, _, c in rows], self._search_options(), True, self.opt.n_best
                )
            done = []
            for ex, hyps in zip(batch, decoded):
                lines = self._hypothesis_lines(self._hypotheses(hyps), ex.n_sents)
                positions = unit.output_sentences(ex.first, ex.n_sents)
                done.append((ex.doc, self._place(outputs[ex.doc], positions, ex.first, lines)))
            yield done

    def _decode_windows(self, rows: list[tuple[list[str], int, int]]) -> list[list[tuple[list[str], float]]]:
        """``k_to_k`` windows (source tokens, sentences n, cap) decoded sentence after sentence: each
        call continues every row's tokens so far with ``<s>``; a context sentence ends at ``</s>``,
        the last also at ``<eos>``; a row that reaches its cap ends there, as in onmt_doc's search."""
        search = self._search_options()
        tokens: list[list[str]] = [[] for _ in rows]
        results: list[Optional[list[tuple[list[str], float]]]] = [None] * len(rows)
        j = 0
        while any(r is None for r in results):
            for last in (False, True):
                group = [r for r, (_, n, _) in enumerate(rows) if results[r] is None and (j == n - 1) == last]
                calls = [(rows[r][0], [*tokens[r], SOS], rows[r][2]) for r in group]
                for r, hyps in zip(group, self.model.decode(calls, search, last, self.opt.n_best if last else 1)):
                    out = hyps[0][0]
                    if last or len(out) >= rows[r][2] or out[-1] != EOS_SENT:  # done, or cut at the cap
                        results[r] = hyps
                    else:
                        tokens[r] = out
            j += 1
        return results  # type: ignore[return-value]

    def _run_prefixed(
        self, outputs: list[list], examples: list[Example], forced: Optional[Forced] = None
    ) -> Iterator[list[tuple[int, int]]]:
        """``k_to_k`` with ``translate.force_context_prefix``, as :meth:`Translator._run_prefixed`:
        the i-th sentences of all documents together, each window's previous sentences forced as
        the target prefix with the best translations already made of them."""
        unit = unit_class(self.model.unit)
        src_tokens, tgt_tokens = self.codec.src_vocab.tokens, self.codec.tgt_vocab.tokens
        best: dict[tuple[int, int], list[int]] = {k: v.tolist() for k, v in (forced or {}).items()}
        waves: dict[int, list[Example]] = {}
        for ex in examples:
            waves.setdefault(ex.first + ex.n_sents - 1, []).append(ex)
        for i in sorted(waves):
            for batch in self._batches_of(waves[i]):
                context = [
                    [t for j in range(ex.first, ex.first + ex.n_sents - 1) for t in best[ex.doc, j]] for ex in batch
                ]
                rows = [  # the prefix comes on top of the cap
                    (src_tokens(ex.src.tolist()), [*tgt_tokens(ids), SOS], cap + len(ids))
                    for ex, ids, cap in zip(batch, context, self._caps(batch))
                ]
                done = []
                for ex, hyps in zip(batch, self.model.decode(rows, self._search_options(), True, self.opt.n_best)):
                    found = self._hypotheses(hyps)
                    lines = self._hypothesis_lines(found, ex.n_sents)
                    positions = unit.output_sentences(ex.first, ex.n_sents)
                    done.append((ex.doc, self._place(outputs[ex.doc], positions, ex.first, lines)))
                    last = split_sentences(found[0].tokens, ex.n_sents)[-1] if found else []
                    best[ex.doc, ex.first + ex.n_sents - 1] = [SOS_ID, *last, EOS_SENT_ID]
                yield done

    def _run_scoring(
        self, outputs: list[list], examples: list[Example], tokens: bool = False, forced: Optional[Forced] = None
    ) -> Iterator:
        raise UserError(
            f"{self.model.folder}: forced decoding (-score, Translator.score) needs the onmt_doc checkpoint; "
            "a CTranslate2 export only translates"
        )
