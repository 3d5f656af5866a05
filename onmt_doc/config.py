"""Strict nested configuration: one dataclass per YAML section.

Loading is strict: an unknown key is an error naming the file, the key path and the closest valid
key; a wrong type names the key and the expected type. Parts chosen by ``type:`` (encoder,
decoder, losses, optimizer, schedule) are validated against the config dataclass their registry
entry declares, so each part sees only its own section. Every key has a default except the data
paths, which the commands that need them check.

Every key is declared with :func:`option` (or :func:`part`): its help text lives in the field's
metadata, and ``docs/config.md``'s key tables are generated from it (``tools/config_reference.py``).
Checks that types cannot express live with the dataclass that owns the keys: a field's bounds
(``minimum``, ``maximum``, ``above``, ``below`` metadata; probabilities such as every dropout are
``minimum=0, below=1``), and a ``validate(path, root)`` method that the loader calls on every section
and every part section once the whole config is read, so a new part brings its own checks.

Nothing is silently replaced or let through: a key written twice in one YAML mapping is an error
naming both lines (PyYAML keeps the last one), a float key refuses NaN and infinities (from the file
and from command-line overrides alike), and a model whose parameters alone would not fit in this
machine's memory is refused before anything is built, naming the size key that is furthest above its
default.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Sequence, Union

import yaml

from onmt_doc.errors import ConfigError, UserError
from onmt_doc.outputs import Input, input_problem, read_input_bytes, write_text
from onmt_doc.registry import closest, registry_for

FORMAT_VERSION = 1
MAX_BEAM = 256  # translate.beam, translate.n_best and train.valid_beam: rows per sentence of one search


@dataclass(frozen=True)
class Bounds:
    """The values a numeric key accepts: inclusive ``minimum`` / ``maximum``, exclusive ``above`` /
    ``below``. Kept in the field's metadata, so one check covers every key of every part."""

    minimum: Optional[float] = None
    maximum: Optional[float] = None
    above: Optional[float] = None
    below: Optional[float] = None

    def holds(self, value: float) -> bool:
        """Whether ``value`` is inside; written as positive comparisons so NaN is never inside."""
        return (
            (self.minimum is None or value >= self.minimum)
            and (self.maximum is None or value <= self.maximum)
            and (self.above is None or value > self.above)
            and (self.below is None or value < self.below)
        )

    def text(self) -> str:
        """The accepted values in words: ``at least 1``, ``greater than 0``, ``in [0, 1)``."""
        low = ("[", self.minimum) if self.minimum is not None else ("(", self.above) if self.above is not None else None
        high = (
            (self.maximum, "]") if self.maximum is not None else (self.below, ")") if self.below is not None else None
        )
        if low and high:
            return f"in {low[0]}{low[1]}, {high[0]}{high[1]}"
        if low:
            return f"{'at least' if low[0] == '[' else 'greater than'} {low[1]}"
        assert high is not None
        return f"{'at most' if high[1] == ']' else 'less than'} {high[0]}"


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Optional[Callable[[], Any]] = None,
    minimum: Optional[float] = None,
    maximum: Optional[float] = None,
    above: Optional[float] = None,
    below: Optional[float] = None,
    shown: Optional[str] = None,
    load: Optional[Callable[["_Loader", Any, str], Any]] = None,
) -> Any:
    """A config key with its help text (the meaning column of docs/config.md).

    ``factory`` builds mutable or nested defaults; a list or dict ``default`` is copied per
    instance. ``minimum`` / ``maximum`` (inclusive), ``above`` / ``below`` (exclusive): the loader
    refuses values outside (a zero that would divide by zero or silently do nothing, a dropout of 1
    that drops everything, a beam no search can hold); a probability is ``minimum=0, below=1``.
    ``shown``: the default as the docs print it, when the value misleads (a required key whose
    default is null). ``load(loader, value, path)``: reads a key whose YAML may take several shapes
    (``data.train``: one corpus or several)."""
    metadata: dict[str, Any] = {"help": help}
    if load is not None:
        metadata["load"] = load
    if (minimum, maximum, above, below) != (None, None, None, None):
        metadata["bounds"] = Bounds(minimum, maximum, above, below)
    if shown is not None:
        metadata["shown"] = shown
    if isinstance(default, (list, dict)):
        value = default
        factory = lambda: copy.deepcopy(value)  # noqa: E731
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def check_bounds(node: Any, path: str) -> None:
    """Every field of the dataclass ``node`` inside its bounds (null keys skipped; a list's bounds
    hold for each item); the loader calls it on every section, and a section built in code
    (``TranslateConfig(...)``) can call it itself."""
    for f in dataclasses.fields(node):
        bounds, value = f.metadata.get("bounds"), getattr(node, f.name)
        if bounds is None or value is None:
            continue
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if not bounds.holds(item):
                where = _join(path, f.name) if i is None else _join(_join(path, f.name), i)
                raise ConfigError(f"{where}: must be {bounds.text()}, got {item}")


@dataclass
class PartConfig:
    """Base of every registered part's config: ``type`` names the registry entry."""

    type: str = option("", "registered name of the part")

    def validate(self, path: str, root: "Config") -> None:
        """Check values against each other and the rest of the config (``root``) once it is read.

        ``path`` is the section's key path (``model.encoder``, ``loss.1``); raise a one-line
        :class:`ConfigError` starting with the key path (the loader adds the file name)."""

    def parameter_estimate(self, d_model: int) -> int:
        """A lower bound of the part's parameter count, so a size no machine could allocate is
        refused when the config is read (``check_model_size``), not by torch halfway through the
        build: each of ``layers`` layers holds at least four d_model × d_model attention projections
        and a feed-forward of inner size ``ff``. A part whose keys differ overrides it."""
        layers, ff = getattr(self, "layers", 0), getattr(self, "ff", 0)
        return layers * (4 * d_model * d_model + 2 * d_model * ff)


@dataclass
class LossConfig(PartConfig):
    """Base of every loss config: losses in the ``loss:`` list are summed with these weights."""

    type: str = option("", "registered loss name", shown="(required)")
    weight: float = option(1.0, "factor of this loss in the sum; at least 0", minimum=0)


def part(kind: str, default_type: Optional[str] = None, help: str = "") -> Any:
    """A config field holding a registered part (or, without a default type, a list of them)."""
    metadata = {"part": kind, "help": help}
    if default_type is None:
        return field(default_factory=list, metadata=metadata)
    return field(default_factory=lambda: default_part(kind, default_type), metadata=metadata)


def default_part(kind: str, name: str) -> PartConfig:
    """The config of registered part ``name`` of ``kind`` with all its defaults."""
    return registry_for(kind).get(name).config(type=name)


def check_heads(heads: int, path: str, root: "Config") -> None:
    """Attention splits model.d_model into ``heads`` equal slices; a remainder would fail deep in a layer."""
    if heads and root.model.d_model % heads:
        raise ConfigError(f"{path}.heads: model.d_model ({root.model.d_model}) is not divisible by {heads} heads")


def check_top_layers(cfg: Any, key: str, path: str) -> None:
    """``key`` counts the top layers of the stack with a feature, so it fits in ``cfg.layers``."""
    value = getattr(cfg, key)
    if not 0 <= value <= cfg.layers:
        raise ConfigError(f"{path}.{key}: must be between 0 and {path}.layers ({cfg.layers}), got {value}")


def physical_memory() -> Optional[int]:
    """This machine's memory in bytes, or None where the OS does not say (the check is then skipped)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_model_size(model: "ModelConfig", path: str) -> None:
    """Refuse a model whose float32 parameters alone (a lower bound: the position table, the parts'
    ``parameter_estimate``) exceed this machine's memory: torch would fail halfway through the build
    with an allocation error, or the machine would swap for minutes first. The message names the
    size key furthest above its default, the likely typo."""
    memory = physical_memory()
    need = 4 * (
        model.max_positions * model.d_model
        + sum(p.parameter_estimate(model.d_model) for p in (model.encoder, model.decoder))
    )
    if memory is None or need <= memory:
        return
    key, value = max(_size_keys(model, path), key=lambda kv: kv[1] / kv[2])[:2]
    raise ConfigError(
        f"{key} {value}: the model would need ~{need / 1e9:,.0f} GB of parameters, more than this machine's "
        f"{memory / 1e9:,.0f} GB of memory"
    )


def _size_keys(model: "ModelConfig", path: str) -> list[tuple[str, int, int]]:
    """(key path, value, default) of every positive-default int key of the model and its parts."""
    found = []
    for where, node in ((path, model), (f"{path}.encoder", model.encoder), (f"{path}.decoder", model.decoder)):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if type(value) is int and type(f.default) is int and f.default > 0:
                found.append((_join(where, f.name), value, f.default))
    return found


# ----------------------------------------------------------------------------- sections


@dataclass
class CorpusConfig:
    """One parallel corpus: its files and how it is sampled among several (``data.train``)."""

    src: Optional[str] = option(None, "source file")
    tgt: Optional[str] = option(None, "target file, line-aligned with `src`")
    documents: Optional[bool] = option(
        None,
        "this corpus' own `data.documents` (`null` = `data.documents`); `false` makes every line a "
        "one-sentence document, so sentence-level data can train a document model",
    )
    weight: int = option(
        1,
        "several training corpora: examples drawn from this corpus per round (OpenNMT-py's `weight`); see "
        "[data.md](data.md#several-corpora). No effect with one corpus or on validation sets",
        minimum=1,
    )
    name: Optional[str] = option(
        None,
        "the corpus' tag in logs, TensorBoard (`valid/<name>/*`) and `train.best_on`; in the mapping form the "
        "key is the name; `null` in a list = `corpus_<i>` (1-based); one corpus: `train` / `valid`",
    )


def load_corpora(loader: "_Loader", data: Any, path: str) -> Union[CorpusConfig, dict[str, CorpusConfig]]:
    """``data.train`` / ``data.valid``: one corpus ``{src, tgt}`` (as always), or several: a mapping
    ``{name: {src, tgt, weight, documents}}`` (OpenNMT-py's ``data:`` shape) or a list of corpora
    with optional ``name``. Several corpora load as a name -> CorpusConfig dict, in file order."""
    if isinstance(data, list):
        items = [(_join(path, i), item, f"corpus_{i + 1}") for i, item in enumerate(data)]
    elif isinstance(data, dict) and any(isinstance(v, dict) for v in data.values()):
        items = [(_join(path, key), item, str(key)) for key, item in data.items()]
        for where, item, _ in items:
            if not isinstance(item, dict):
                loader.fail(
                    where,
                    f"expected a corpus mapping {{src, tgt, ...}}, got {item!r} (the keys of one corpus "
                    f"cannot be mixed with named corpora)",
                )
    else:
        return loader.dataclass(CorpusConfig, data, path)
    if not items:
        loader.fail(path, "expected at least one corpus")
    corpora: dict[str, CorpusConfig] = {}
    for where, item, default_name in items:
        corpus = loader.dataclass(CorpusConfig, item, where)
        if isinstance(data, dict) and corpus.name not in (None, default_name):
            loader.fail(_join(where, "name"), f"'{corpus.name}' differs from the corpus' key '{default_name}'")
        name = corpus.name or default_name
        if name in corpora:
            loader.fail(_join(where, "name"), f"duplicate corpus name '{name}'")
        corpus.name = name
        corpora[name] = corpus
    return corpora


@dataclass
class DataConfig:
    """``data:`` files and how they become instances."""

    train: CorpusConfig = option(
        help="training files; both required by training. Several corpora: a mapping of named corpora, or a "
        "list, each with its own `src`, `tgt`, `documents`, `weight` (see [data.md](data.md#several-corpora))",
        factory=CorpusConfig,
        load=load_corpora,
    )
    valid: CorpusConfig = option(
        help="validation files; both or neither. Without them: no validation, no `best.pt`, no early stopping. "
        "Several sets: the same shapes as `train`, each reported on its own (`train.best_on` picks the one "
        "for `best.pt` and early stopping)",
        factory=CorpusConfig,
        load=load_corpora,
    )
    documents: bool = option(
        True,
        "blank lines separate documents; `false` = every line stands alone (blank "
        "lines are then skipped in training and kept in translation output)",
    )
    max_tokens: int = option(
        512,
        "budget of a document instance, per side, in subword tokens with markup; used by `document`-unit models only",
        minimum=1,
    )
    max_sentences: int = option(
        0,
        "`context`-unit models (HM-GDC): documents are cut into windows of at most "
        "this many sentences, each window one instance whose sentences are batch rows "
        "sharing its context (0 = whole documents)",
        minimum=0,
    )
    context_sentences: int = option(
        1,
        "concatenation units (`model.unit: k_to_1` / `k_to_k`): k, the previous sentences of the same document "
        "given as context (fewer at a document's start); see [models/concatenation.md](models/concatenation.md)",
        minimum=1,
    )
    max_len: int = option(
        0,
        "drop training sentence pairs with a side longer than this many subwords; the count is logged (0 = keep all)",
        minimum=0,
    )
    max_line_chars: int = option(
        20000,
        "a longer line is an error, a sign of a broken file (0 = no limit); "
        "`onmt_doc_translate -max_line_chars` overrides the checkpoint's value",
        minimum=0,
    )
    cache_dir: Optional[str] = option(None, "binarized data cache; `null` = `<log.dir>/cache`")
    sentence_markup: bool = option(
        True,
        "wrap each sentence in onmt_doc's markup (source `<s> … </s>`, target `<bos> <s> … </s> <eos>`); "
        "`false` = the bare sequences other toolkits use (source `w1 … wn`, target `<bos> w1 … wn <eos>`), "
        "as `onmt_doc_import_opennmt` writes it; `sentence` unit only (every other unit needs the markup)",
    )

    def corpora(self, split: Literal["train", "valid"]) -> list[CorpusConfig]:
        """The corpora of ``data.train`` or ``data.valid`` with their name and ``documents`` resolved
        (copies); a single ``valid`` without files is no set at all."""
        value = getattr(self, split)
        if isinstance(value, CorpusConfig):
            if split == "valid" and not value.src and not value.tgt:
                return []
            value = {value.name or split: value}
        return [
            dataclasses.replace(c, name=name, documents=self.documents if c.documents is None else c.documents)
            for name, c in value.items()
        ]

    def validate(self, path: str, root: "Config") -> None:
        """Each corpus of several holds its own keys' minimums (the loader checks one corpus itself);
        a validation set with one file of two is a mistake, not "no validation"; sentences without
        markup only for the sentence unit (the others find their sentences by it)."""
        for split in ("train", "valid"):
            value = getattr(self, split)
            if isinstance(value, dict):
                for name, corpus in value.items():
                    _validate(corpus, f"{path}.{split}.{name}", root)
                    if split == "valid" and not (corpus.src and corpus.tgt):
                        raise ConfigError(f"{path}.valid.{name}: needs both src and tgt")
        if isinstance(self.valid, CorpusConfig) and bool(self.valid.src) != bool(self.valid.tgt):
            raise ConfigError(f"{path}.valid: needs both src and tgt (or neither)")
        if not self.sentence_markup:  # documents, windows and concatenations are cut by their <s> … </s>
            m = root.model
            parts = (("encoder", m.encoder), ("decoder", m.decoder))
            declared = {registry_for(k).get(c.type).cls.unit for k, c in parts}
            unit = m.unit or next(iter(declared - {"sentence"}), "sentence")
            if unit != "sentence":
                raise ConfigError(f"{path}.sentence_markup: false is for the sentence unit only, not {unit}")


@dataclass
class VocabConfig:
    """``vocab:`` the subword model and vocabularies ``onmt_doc_build_vocab`` learns."""

    subword: Literal["bpe", "sentencepiece", "none"] = option("bpe", "subword model")
    size: int = option(8000, "BPE merges, or SentencePiece pieces (at most 10,000,000)", minimum=1, maximum=10_000_000)
    shared: bool = option(True, "one subword model and one vocabulary for both sides")
    min_freq: int = option(1, "vocabulary entries seen fewer times are dropped", minimum=0)
    max_size: int = option(
        0,
        "cap on vocabulary entries, specials included (0 = no cap; at most 10,000,000)",
        minimum=0,
        maximum=10_000_000,
    )
    tokenizer: Literal["aggressive", "conservative", "space", "char", "none"] = option(
        "aggressive",
        "pyonmttok pre-tokenization mode (with joiners; `none` = split on spaces, no joiners); "
        "ignored by SentencePiece",
    )
    sample_lines: int = option(
        0,
        "learn the subword model on the first this many non-blank lines of each file "
        "(0 = all); the vocabulary counts all lines",
        minimum=0,
    )


@dataclass
class ModelConfig:
    """``model:`` sizes shared by all parts, and the encoder, decoder and loss sections."""

    d_model: int = option(512, "model width, shared by embeddings, encoder and decoder", minimum=1)
    share_embeddings: bool = option(
        True,
        "one embedding matrix for source and target; needs `vocab.shared: "
        "true` (a config with `vocab.shared: false` must set it to `false`: refused "
        "when the config is read)",
    )
    tie_output: bool = option(True, "the output projection uses the target embedding matrix (it keeps its own bias)")
    dropout: float = option(
        0.1,
        "dropout on embeddings, on every sublayer output before the residual sum, and inside the feed-forward; "
        "in [0, 1)",
        minimum=0,
        below=1,
    )
    attention_dropout: float = option(0.1, "dropout on attention probabilities; in [0, 1)", minimum=0, below=1)
    max_positions: int = option(
        4096, "initial size of the sinusoidal position table; it grows on demand and is not saved", minimum=1
    )
    word_dropout: float = option(
        0.0,
        "training only: each source word and decoder-input word is replaced by "
        "`word_dropout_token` with this probability; special tokens (markup, `<bos>`) "
        "and the targets never change (G-Transformer: 0.3 from scratch, 0.1 fine-tuned); "
        "must be in [0, 1)",
        minimum=0,
        below=1,
    )
    word_dropout_token: Literal["unk", "mask"] = option("unk", "the replacement token of word dropout")
    unit: Optional[str] = option(
        None,
        "the translation unit: `null` = the one the encoder and decoder declare (`sentence`, `document`, "
        "`context`); `k_to_1` / `k_to_k` = the concatenation baselines for sentence-level parts (k = "
        "`data.context_sentences`; see [models/concatenation.md](models/concatenation.md))",
    )
    encoder: PartConfig = part("encoder", "transformer", "the encoder; see [Encoders](#encoders)")
    decoder: PartConfig = part("decoder", "transformer", "the decoder; see [Decoders](#decoders)")

    def validate(self, path: str, root: "Config") -> None:
        """A chosen ``unit`` must be registered and fit the parts (``check_unit``); the parameters
        must fit in memory (``check_model_size``)."""
        check_model_size(self, path)
        if self.unit is not None:  # units live in the data layer: reached through their registry, like parts
            sections = (("encoder", self.encoder), ("decoder", self.decoder))
            part_units = {registry_for(k).get(c.type).cls.unit for k, c in sections}
            registry_for("unit").get(self.unit, f"{path}.unit").cls.check_parts(self.unit, part_units, f"{path}.unit")


@dataclass
class OptimConfig(PartConfig):
    """Optimizer section; ``type`` is adam, adamw, sgd or a torch-optimizer name (radam, lamb…)."""

    type: str = option("adam", "optimizer name, see [Optimizers](#optimizers)")
    lr: float = option(
        5.0e-4, "base learning rate; the lr of a step is `lr × lr_scale × schedule factor`; at least 0", minimum=0
    )
    betas: list[float] = option(
        [0.9, 0.98], "passed when the optimizer accepts `betas`; each in [0, 1)", minimum=0, below=1
    )
    eps: float = option(1.0e-9, "passed when the optimizer accepts `eps`; at least 0", minimum=0)
    weight_decay: float = option(0.0, "passed when the optimizer accepts `weight_decay`; at least 0", minimum=0)
    params: dict = option(
        {}, "any other constructor argument by name, e.g. `{momentum: 0.9, nesterov: true}` for `sgd`"
    )
    schedule: PartConfig = part("schedule", "inverse_sqrt", "learning-rate schedule, see [Schedules](#schedules)")


@dataclass
class TrainConfig:
    """``train:`` batching, optimisation, validation and checkpoints."""

    batch_tokens: int = option(
        4096,
        "padded tokens per batch: B × max(source length, target length + 1), "
        "markup included; `context` (HM-GDC) windows count the sum of their rows' own lengths, since "
        "their rows run in length buckets (see [data.md](data.md#token-budget)); also the validation "
        "batch size",
        minimum=1,
    )
    accum: int = option(1, "batches per optimizer step, per process", minimum=1)
    max_steps: int = option(
        100000, "optimizer steps; training stops there, validating and saving at that step", minimum=0
    )
    max_epochs: int = option(
        0,
        "stop once this many epochs are done (0 = no limit). Checked before each step, "
        "so the step that starts the next epoch still runs; there is no extra save or "
        "validation when this limit ends the run",
        minimum=0,
    )
    valid_every: int = option(1000, "validate every this many steps (and at `max_steps`)", minimum=1)
    valid_bleu: bool = option(True, "translate the validation set at each validation and report BLEU")
    valid_beam: int = option(
        1, f"beam for validation BLEU (1 = greedy, fast); at most {MAX_BEAM}", minimum=1, maximum=MAX_BEAM
    )
    save_every: int = option(
        1000,
        "write `step_N.pt` and `last.pt` every this many steps (and at `max_steps` and when early stopping)",
        minimum=1,
    )
    keep_last: int = option(
        5,
        "how many `step_N.pt` files to keep (at least 1; older ones are deleted, and so "
        "are leftovers `*.tmp<pid>` of interrupted saves)",
        minimum=1,
    )
    early_stopping: int = option(
        0, "stop after this many validations in a row without improvement (0 = off)", minimum=0
    )
    early_stopping_metric: Literal["loss", "bleu"] = option(
        "loss",
        "validation metric for early stopping and `best.pt` (lower loss / higher BLEU is better); `bleu` "
        "needs `valid_bleu: true`",
    )
    best_on: Optional[str] = option(
        None,
        "with several validation sets: the name of the one whose metric chooses `best.pt` and drives early "
        "stopping (`null` = the first); every set is still reported",
    )
    max_grad_norm: float = option(
        1.0, "clip the gradient norm to this (0 = no clipping; the norm is still logged)", minimum=0
    )
    amp: Literal["auto", "bf16", "fp16", "fp32"] = option(
        "auto",
        "mixed precision. `auto`: bf16 autocast on GPUs (fp16 with gradient scaling where bf16 is "
        "missing), float32 on CPUs. `bf16` on a CPU with AMX (Sapphire Rapids and later) is about 1.6× faster "
        "for d_model 256 models but slower for tiny ones, so it is opt-in there ([benchmarks](benchmarks.md)); "
        "`fp16` on a CPU logs a warning and trains in float32; `fp32` turns mixed precision off",
    )
    seed: int = option(1, "seeds torch, Python's `random` and the data order")
    init_from: Optional[str] = option(
        None,
        "checkpoint whose parameters initialise the model: every parameter "
        "with the same name is copied (a shape mismatch is an error naming it), "
        "the others start fresh. Its vocabularies must equal the run folder's "
        "(copy its vocabulary and subword files into `log.dir`)",
    )
    init_lr_scale: float = option(
        0.2,
        "learning-rate scale of the parameters copied by `init_from` (the new "
        "ones train at the full rate; G-Transformer fine-tuning: 1e-4 vs 5e-4)",
        minimum=0,
    )
    resume: bool = option(
        True,
        "continue from `<log.dir>/checkpoints/last.pt` when it exists (see "
        "[getting_started.md](getting_started.md#resume)); a `last.pt` without training state "
        "(`best.pt`, an averaged checkpoint) is refused: use `init_from`",
    )
    resume_data: Literal["exact", "next_epoch"] = option(
        "exact",
        "a resume after the training data, `batch_tokens`, `seed` or the number of processes changed: "
        "`exact` refuses it (the checkpoint's data position would index another batch order); `next_epoch` "
        "accepts it and continues with the new batch order from the start of the next epoch",
    )
    device: str = option(
        "auto", "`auto`, `cpu`, `cuda` or `cuda:N`; `auto` and `cuda` put process *i* of a node on `cuda:i`"
    )
    threads: int = option(
        0,
        "CPU threads per process (at least 0); 0 = automatic: `OMP_NUM_THREADS` when set "
        "and training runs in one process, else cores / processes on this node; no effect on "
        "GPUs",
        minimum=0,
    )

    def validate(self, path: str, root: "Config") -> None:
        """Early stopping on BLEU needs the BLEU that only valid_bleu computes."""
        if self.early_stopping_metric == "bleu" and not self.valid_bleu:
            raise ConfigError(f"{path}.early_stopping_metric: bleu needs {path}.valid_bleu: true")
        names = [c.name for c in root.data.corpora("valid")]
        if self.best_on is not None and self.best_on not in names:
            raise ConfigError(
                f"{path}.best_on: no validation set '{self.best_on}'{closest(self.best_on, names)} "
                f"(data.valid has: {', '.join(names) or 'none'})"
            )


@dataclass
class TranslateConfig:
    """``translate:`` search and batching for ``onmt_doc_translate``, validation BLEU and the API."""

    beam: int = option(
        5,
        f"beam size (1 = greedy); at most {MAX_BEAM} (each sentence searches `2 × beam` candidates over the "
        "vocabulary at every step); flag `-beam`",
        minimum=1,
        maximum=MAX_BEAM,
    )
    n_best: int = option(
        1,
        "hypotheses per output line, tab-separated, for every model (see "
        f"[getting_started.md](getting_started.md#translation)); at least 1, at most `beam` (sampling: at most "
        f"{MAX_BEAM}); flag `-n_best`",
        minimum=1,
        maximum=MAX_BEAM,
    )
    length_penalty: float = option(
        1.0,
        "GNMT α: scores are divided by `((5 + length) / 6)^α`, length counting "
        "`<eos>`; 0 = none, at least 0; flag `-length_penalty`",
        minimum=0,
    )
    length_penalty_type: Literal["gnmt", "avg", "none"] = option(
        "gnmt",
        "what a finished hypothesis' log-probability is divided by: `gnmt` = `((5 + length) / 6)^α` with "
        "α = `length_penalty`, `avg` = its length (OpenNMT-py's `avg`: mean log-probability per token; ignores "
        "`length_penalty`), `none` = 1; flag `-length_penalty_type`",
    )
    max_len_ratio: float = option(
        1.5,
        "output length cap = ratio × source length (in tokens, markup included) + `max_len_add`; greater than 0; "
        "flag `-max_len_ratio`",
        above=0,
    )
    max_len_add: int = option(10, "constant part of the cap (at least 0)", minimum=0)
    max_length: int = option(
        250,
        "absolute output cap per sentence in subword tokens, whatever the ratio "
        "(OpenNMT-py caps at 250, CTranslate2 at 256); at least 1; flag `-max_length`",
        minimum=1,
    )
    max_input_tokens: int = option(
        200,
        "a source line longer than this many subwords is split at a word "
        "boundary (the last one in the second half of each piece, else at the limit) "
        "into pieces translated on their own and joined with a space; the final line "
        "counts them. Bounds the quadratic cost of one line; at least 1; `-score` does "
        "not split; flag `-max_input_tokens`",
        minimum=1,
    )
    force_context_prefix: bool = option(
        False,
        "`k_to_k` unit: translate a document sentence by sentence, forcing the model's own translations of the "
        "k previous sentences as the target prefix and generating only the last sentence; `false` = decode all "
        "k+1 sentences and keep the last; flag `-force_context_prefix`",
    )
    window_sentences: int = option(
        0,
        "`context` unit (HM-GDC): sentences per translation window; 0 = "
        "`data.max_sentences`, or, when that is 0 too, windows packed to "
        "`data.max_tokens` tokens, so a long document is never one window (time per "
        "sentence stays flat); flag `-window_sentences`",
        minimum=0,
    )
    batch_tokens: int = option(
        4096,
        "padded source tokens per translation batch (`context` windows: the sum of their rows' lengths); flag "
        "`-batch_tokens`",
        minimum=1,
    )
    batch_sentences: int = option(
        0,
        "cap on batch rows: sentences (for the `document` unit: document "
        "instances); 0 = no cap, at least 0; flag `-batch_size`",
        minimum=0,
    )
    buffer_sentences: int = option(
        2000,
        "read whole documents until at least this many sentences are buffered, "
        "then translate them in length-sorted batches",
        minimum=1,
    )
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32",
        "compute type of the weights while translating (`onmt_doc_translate -dtype`); bfloat16 is much "
        "faster on GPUs and on CPUs with AMX, at a small cost in exactness; beam scores stay float32",
    )
    ensemble_average: Literal["log_prob", "prob"] = option(
        "log_prob",
        "several models (`-model A.pt B.pt`): `log_prob` = mean of the members' log-probabilities (OpenNMT-py's "
        "default), `prob` = log of the mean probability (fairseq, OpenNMT-py's `avg_raw_probs`); flag "
        "`-ensemble_average`",
    )
    strategy: Literal["beam", "sampling"] = option(
        "beam",
        "`beam` = beam search (greedy for `beam: 1`); `sampling` = each output token drawn from the model's "
        "distribution (back-translation), shaped by `temperature`, `top_k`, `top_p`; `n_best` = independent "
        "samples per line, best score first (`beam` is then unused); flag `-strategy`",
    )
    temperature: float = option(
        1.0,
        "sampling: the log-probabilities are divided by this before drawing (< 1 sharper, > 1 flatter); "
        "greater than 0; reported scores stay the untempered model log-probabilities; flag `-temperature`",
        above=0,
    )
    top_k: int = option(
        0, "sampling: draw among the k most probable tokens only; 0 = the whole vocabulary; flag `-top_k`", minimum=0
    )
    top_p: float = option(
        1.0,
        "sampling (nucleus): draw among the most probable tokens whose probabilities (after `temperature` and "
        "`top_k`) sum to at least p; in (0, 1], 1 = no cut; flag `-top_p`",
        above=0,
        maximum=1,
    )
    seed: int = option(
        1,
        "sampling: seed of the search's own random generator, so a run repeats exactly (with the same batches) "
        "and torch's global generator is left alone; flag `-seed`",
    )

    def validate(self, path: str, root: Optional["Config"]) -> None:
        """The n best hypotheses come from the beam, so there are at most beam of them (samples are
        independent: up to MAX_BEAM). The search calls this on sections built in code, which no
        loader has seen, so the keys' bounds are checked here too (``root`` is then None)."""
        check_bounds(self, path)
        if self.strategy == "beam" and self.n_best > self.beam:
            raise ConfigError(f"{path}.n_best ({self.n_best}) cannot exceed {path}.beam ({self.beam})")


@dataclass
class LogConfig:
    """``log:`` the run folder and progress reporting."""

    dir: str = option(
        "runs/default",
        "the run folder: config, vocabularies, cache, checkpoints, TensorBoard (see "
        "[getting_started.md](getting_started.md#the-run-folder)); one training at a time holds its "
        "`.lock` ([one training per run folder](getting_started.md#one-training-per-run-folder))",
    )
    tensorboard: bool = option(True, "write TensorBoard scalars to `<dir>/tensorboard`")
    every: int = option(50, "progress line and `train/*` scalars every this many steps", minimum=1)


@dataclass
class Config:
    """A whole run: one section per dataclass, loaded strictly (unknown keys are errors)."""

    data: DataConfig = option(help="files and how they become instances", factory=DataConfig)
    vocab: VocabConfig = option(help="subword model and vocabularies", factory=VocabConfig)
    model: ModelConfig = option(help="the network: width, embeddings, encoder and decoder", factory=ModelConfig)
    loss: list[LossConfig] = part(
        "loss", None, "the losses, summed with their weights (empty: one `label_smoothed_ce`)"
    )
    optim: OptimConfig = part("optimizer", "adam", "the optimizer and its learning-rate schedule")
    train: TrainConfig = option(help="the training loop", factory=TrainConfig)
    translate: TranslateConfig = option(help="beam search and translation batching", factory=TranslateConfig)
    log: LogConfig = option(help="the run folder and progress logging", factory=LogConfig)

    def __post_init__(self) -> None:
        if not self.loss:
            self.loss = [default_part("loss", "label_smoothed_ce")]

    def validate(self, path: str, root: "Config") -> None:
        """Checks across sections; run before any subword learning, so a mistake costs nothing."""
        if self.model.share_embeddings and not self.vocab.shared:
            raise ConfigError(
                "model.share_embeddings: true needs one shared vocabulary "
                "(vocab.shared: true), or set model.share_embeddings: false"
            )


# ----------------------------------------------------------------------------- loading


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, dict):
        return origin.__name__
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


class _Loader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, message: str) -> None:
        raise ConfigError(f"{self.source}: {path}: {message}")

    def dataclass(self, cls: type, data: Any, path: str) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path or "top level", f"expected a mapping, got {type(data).__name__} {data!r}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in fields:
                raise ConfigError(f"{self.source}: unknown key '{_join(path, key)}'{closest(str(key), fields)}")
        kwargs = {}
        for name, f in fields.items():
            if name in data:
                kind = f.metadata.get("part")
                if kind:
                    kwargs[name] = self.part_field(kind, data[name], _join(path, name), f)
                elif "load" in f.metadata:
                    kwargs[name] = f.metadata["load"](self, data[name], _join(path, name))
                else:
                    kwargs[name] = self.value(hints[name], data[name], _join(path, name))
        return cls(**kwargs)

    def part_field(self, kind: str, data: Any, path: str, f: dataclasses.Field) -> Any:
        if f.default_factory is list:  # a list of parts (losses)
            if not isinstance(data, list):
                self.fail(path, f"expected a list of {kind} sections, got {type(data).__name__}")
            return [self.part(kind, item, _join(path, i), None) for i, item in enumerate(data)]
        return self.part(kind, data, path, f.default_factory().type)

    def part(self, kind: str, data: Any, path: str, default_type: Optional[str]) -> PartConfig:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping with a 'type' key, got {data!r}")
        name = data.get("type", default_type)
        if name is None:
            self.fail(path, f"missing 'type' (registered: {', '.join(registry_for(kind).names())})")
        entry = registry_for(kind).get(str(name), where=f"{self.source}: {_join(path, 'type')}")
        cfg = self.dataclass(entry.config, {**data, "type": name}, path)
        return cfg

    def value(self, tp: Any, value: Any, path: str) -> Any:
        origin = typing.get_origin(tp)
        if tp is Any:
            return value
        if origin is Union:
            args = typing.get_args(tp)
            if value is None and type(None) in args:
                return None
            errors = []
            for arg in args:
                if arg is type(None):
                    continue
                try:
                    return self.value(arg, value, path)
                except ConfigError as e:
                    errors.append(e)
            self.fail(path, f"expected {_type_name(tp)}, got {value!r}")
        if origin is Literal:
            if value not in typing.get_args(tp):
                self.fail(path, f"expected {_type_name(tp)}, got {value!r}")
            return value
        if origin is list:
            if not isinstance(value, (list, tuple)):
                self.fail(path, f"expected a list, got {value!r}")
            (item,) = typing.get_args(tp) or (Any,)
            return [self.value(item, v, _join(path, i)) for i, v in enumerate(value)]
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                self.fail(path, f"expected a mapping, got {value!r}")
            self.finite(value, path)
            return dict(value)
        if dataclasses.is_dataclass(tp):
            return self.dataclass(tp, value, path)
        if tp is bool:
            if not isinstance(value, bool):
                self.fail(path, f"expected bool (true/false), got {value!r}")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(path, f"expected int, got {value!r}")
            return value
        if tp is float:
            if isinstance(value, str):  # YAML 1.1 reads 5e-4 as a string
                try:
                    value = float(value)
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(path, f"expected float, got {value!r}")
            self.finite(value, path)
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                self.fail(path, f"expected str, got {value!r}")
            return value
        raise TypeError(f"config field {path} has unsupported type {tp!r}")

    def finite(self, value: Any, path: str) -> None:
        """NaN or an infinity (``.nan``, ``.inf``, ``1e999``) would reach the model and the search
        unnoticed, so no number of the config may be one, also inside free-form mappings
        (``optim.params``)."""
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(path, f"expected a finite number, got {value}")
        if isinstance(value, dict):
            for key, item in value.items():
                self.finite(item, _join(path, key))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                self.finite(item, _join(path, i))


class DuplicateKeyError(yaml.YAMLError):
    """A key written twice in one YAML mapping: PyYAML would keep the last value without a word."""

    def __init__(self, key: str, line: int, first: int) -> None:
        """``key``: its dotted path; ``line`` and ``first``: 1-based lines of the repeat and the first."""
        super().__init__(f"duplicate key '{key}' (first at line {first})")
        self.key, self.line, self.first = key, line, first


class StrictYAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only, no Python tags) that refuses a key written twice in
    one mapping, at any depth: ``yaml.load(text, Loader=StrictYAMLLoader)``."""

    def construct_document(self, node: yaml.Node) -> Any:
        """Check the composed document (which still has every key and its line) before building it."""
        _refuse_duplicate_keys(node, "", set())
        return super().construct_document(node)


_MERGE_TAG = "tag:yaml.org,2002:merge"  # ``<<: *defaults``: merged keys may be overridden, on purpose


def _refuse_duplicate_keys(node: yaml.Node, path: str, seen: set[int]) -> None:
    """Raise :class:`DuplicateKeyError` for the first key repeated in a mapping of ``node``'s tree
    (a node reached twice through an alias is checked once)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, _join(path, i), seen)
    elif isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            where = path
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                where = _join(path, key_node.value)
                line, key = key_node.start_mark.line + 1, (key_node.tag, key_node.value)
                if key in first:
                    raise DuplicateKeyError(where, line, first[key])
                first[key] = line
            _refuse_duplicate_keys(value_node, where, seen)


def apply_overrides(raw: dict, overrides: list[str], source: str = "command line") -> dict:
    """Apply ``a.b.c=value`` overrides (list items by index: ``loss.1.weight=0.5``) to a raw dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: override '{item}' is not of the form key.path=value")
        key, text = item.split("=", 1)
        try:
            value = yaml.load(text, Loader=StrictYAMLLoader) if text != "" else ""
        except DuplicateKeyError as e:
            raise ConfigError(f"{source}: override '{key}': duplicate key '{e.key}'") from None
        except RecursionError:
            raise ConfigError(f"{source}: override '{key}': value nested too deeply") from None
        except yaml.YAMLError:
            value = text
        parts = key.split(".")
        node: Any = raw
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            where = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not name.isdigit() or int(name) >= len(node):
                    raise ConfigError(f"{source}: override '{key}': '{where}' needs an index below {len(node)}")
                if last:
                    node[int(name)] = value
                else:
                    node = node[int(name)]
            elif isinstance(node, dict):
                if last:
                    node[name] = value
                else:
                    if node.get(name) is None:
                        node[name] = _default_at(raw, parts[: i + 1], source)
                    node = node[name]
            else:
                raise ConfigError(f"{source}: override '{key}': '{'.'.join(parts[:i])}' is not a section")
    return raw


def _default_at(raw: dict, parts: list[str], source: str) -> Any:
    """The resolved default of a section an override reaches into (e.g. the default loss list)."""
    node: Any = config_to_dict(config_from_dict(copy.deepcopy(raw), source))
    for name in parts:
        if isinstance(node, list) and name.isdigit() and int(name) < len(node):
            node = node[int(name)]
        elif isinstance(node, dict) and name in node:
            node = node[name]
        else:
            return {}
    return copy.deepcopy(node) if isinstance(node, (dict, list)) else {}


def _validate(node: Any, path: str, root: Config) -> None:
    """Check every field's bounds, then the sections and parts inside, then the node's own
    ``validate`` (so a section's cross-checks see children that are already valid)."""
    check_bounds(node, path)
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            _validate(value, _join(path, f.name), root)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    _validate(item, _join(_join(path, f.name), i), root)
    check = getattr(node, "validate", None)
    if check is not None:
        check(path, root)


def config_from_dict(raw: dict, source: str = "config") -> Config:
    """A validated Config from nested plain values; errors name ``source`` and the key."""
    cfg = _Loader(source).dataclass(Config, raw, "")
    try:
        _validate(cfg, "", cfg)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return cfg


# the largest config file read (a config is a few KB; this only stops /dev/zero and endless pipes)
CONFIG_BYTES = 16 << 20


def load_config(path: Optional[str], overrides: Optional[list[str]] = None) -> Config:
    """Read a YAML config (or none: all defaults) and apply dotted overrides."""
    raw: Any = {}
    source = path or "command line"
    if path:
        problem = input_problem(path)
        if problem:
            raise ConfigError(f"{path}: config {problem}")
        try:
            text = read_input_bytes(path, limit=CONFIG_BYTES, what="config file").decode("utf-8")
            raw = yaml.load(text, Loader=StrictYAMLLoader) or {}
        except UserError as e:
            raise ConfigError(str(e)) from None
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply to be a config") from None
        except DuplicateKeyError as e:
            raise ConfigError(f"{path}:{e.line}: duplicate key '{e.key}' (first at line {e.first})") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not valid UTF-8") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    if overrides:
        config_from_dict(copy.deepcopy(raw), source)  # a mistake in the file is the file's
        apply_overrides(raw, list(overrides))
        source = f"{source} with command-line overrides" if path else source
    return config_from_dict(raw, source)


def config_to_dict(cfg: Config) -> dict:
    """Plain nested values (what checkpoints and ``config.yaml`` store)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str, inputs: Sequence[Input] = ()) -> None:
    """Write the resolved config (every key, defaults included) atomically, never onto ``inputs``."""
    text = f"# onmt_doc resolved config, format_version {FORMAT_VERSION}\n" + yaml.safe_dump(
        config_to_dict(cfg), sort_keys=False, allow_unicode=True
    )
    write_text(path, text, inputs, flag="")
