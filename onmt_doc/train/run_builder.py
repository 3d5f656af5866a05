"""Building a training run from its config: every part the loop uses, as plain objects.

OpenNMT-py and eole hand their trainers already-built parts; so does this module
(:func:`build_run` -> :class:`RunParts`): the codec (learned by rank 0 when the run folder has
none), the model with ``train.init_from``'s weights and their parameter groups, the optimizer and
schedule, the mixed-precision type and fp16 scaler, the losses and the per-example fields they ask
for, the training examples of every corpus with their mix and sampler, the data fingerprint, the
validation sets, and the validation metrics beyond the losses (BLEU through the translator, so
the loop itself imports neither translation nor evaluation).

The order of the steps is part of the contract: seeding, model initialisation, the per-rank
reseed and data loading consume the random generators in this order, and a fixed seed must give
the same weights, dropout masks and batches as before.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from onmt_doc.config import Config
from onmt_doc.config.data import DataConfig, VocabConfig
from onmt_doc.data.batching import BatchSampler, CorpusMix
from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import read_parallel
from onmt_doc.data.example_fields import FieldContext, FieldProvider
from onmt_doc.data.instances import Example
from onmt_doc.data.mapped import ConcatExamples, IndexedExamples
from onmt_doc.data.prepare import (
    binarize_corpora,
    build_codec,
    load_codec,
    load_examples,
    train_corpora,
)
from onmt_doc.data.static_shapes import StaticShapes
from onmt_doc.errors import UserError
from onmt_doc.evaluation.corpus_metrics import report
from onmt_doc.losses import Loss, build_losses, loss_fields
from onmt_doc.models.builder import build_model
from onmt_doc.models.model import EncoderDecoder
from onmt_doc.optim.optimizers import build_optimizer
from onmt_doc.optim.schedules import Schedule, build_schedule
from onmt_doc.train import distributed
from onmt_doc.train.checkpointing import Resumable
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.hardware import amp_dtype
from onmt_doc.train.init_from import initial_param_groups
from onmt_doc.train.progress import Progress
from onmt_doc.train.run_folder import data_fingerprint
from onmt_doc.translate.translator import Translator, translator_options

log = logging.getLogger("onmt_doc")


@dataclass
class ValidSet:
    """One validation set: its name (for logs and ``train.best_on``), instances and text documents."""

    name: str
    examples: Sequence[Example]
    docs: list
    documents: bool


# a validation metric beyond the losses: (model in eval mode, set) -> {name: value}; {} when it
# does not apply to the set (e.g. BLEU without text documents)
ValidMetric = Callable[[torch.nn.Module, ValidSet], dict]
# the context pictures of a validation: (model in eval mode, set) -> {tag: [H, W, 3] image}; {}
# at the validations ``log.pictures`` skips
ValidPictures = Callable[[torch.nn.Module, ValidSet], dict]


@dataclass
class RunParts:
    """Everything the training loop needs, built (:func:`build_run`) or handed in by a caller."""

    codec: Codec
    model: EncoderDecoder
    losses: list[Loss]
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    amp_dtype: Optional[torch.dtype]
    scaler: Optional[torch.amp.GradScaler]
    train_examples: Sequence[Example]  # index arrays over the mapped corpora for the built-in units
    mix: CorpusMix
    sampler: BatchSampler
    fingerprint: dict  # what the sampler's position means (run_folder.data_fingerprint)
    valid_sets: list[ValidSet] = field(default_factory=list)
    metrics: list[ValidMetric] = field(default_factory=list)
    pictures: Optional[ValidPictures] = None  # log.pictures

    def resumable(self, optimizer_type: str, progress: Progress) -> Resumable:
        """The parts a checkpoint saves and a resume restores (``optimizer_type``: ``optim.type``), with
        the loop's counters."""
        return Resumable(
            self.codec,
            self.model,
            self.optimizer,
            optimizer_type,
            self.scaler,
            self.sampler,
            self.fingerprint,
            progress,
        )


def prepare_codec(data: DataConfig, vocab: VocabConfig, run_dir: str, ctx: DistContext) -> Codec:
    """The run folder's vocabularies; rank 0 learns them first when they are missing."""
    codec = load_codec(vocab, run_dir)
    if codec is None:
        if ctx.main:
            log.info(
                "no vocabulary in %s: learning %s (%d) and building the vocabularies",
                run_dir,
                vocab.subword,
                vocab.size,
            )
            build_codec(data, vocab, run_dir)
        distributed.barrier(ctx)
        codec = load_codec(vocab, run_dir)
    return codec


def build_run(cfg: Config, ctx: DistContext) -> RunParts:
    """Every part of the run ``cfg`` describes, on ``ctx.device``, in the order that fixes what the
    random generators give (seed, model initialisation, per-rank reseed, then the rest)."""
    run_dir = cfg.log.dir
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    codec = prepare_codec(cfg.data, cfg.vocab, run_dir, ctx)
    model = build_model(cfg.model, codec).to(ctx.device)
    groups = initial_param_groups(model, cfg.train, codec)  # train.init_from's weights
    if ctx.rank:  # same initial weights everywhere, a different dropout stream per rank
        torch.manual_seed(cfg.train.seed + ctx.rank)
    losses = build_losses(cfg.loss, codec=codec)
    # the per-example fields the losses ask for (e.g. z*), cached next to the binarized data
    train_fields, valid_fields = loss_fields(losses, FieldContext(codec))
    optimizer = build_optimizer(cfg.optim, groups)
    schedule = build_schedule(cfg.optim.schedule, cfg.model.d_model, cfg.train.max_steps)
    dtype = amp_dtype(cfg.train.amp, ctx.device)
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
    prepare_caches(cfg.data, codec, run_dir, ctx)
    examples, mix = load_training_data(cfg.data, codec, model.unit, run_dir, train_fields)
    valid_sets = load_valid_sets(cfg.data, codec, model.unit, run_dir, valid_fields)
    shapes = StaticShapes() if cfg.train.static_shapes else None
    sampler = BatchSampler(
        examples, cfg.train.batch_tokens, cfg.train.seed, rank=ctx.rank, world=ctx.world, mix=mix, shapes=shapes
    )
    return RunParts(
        codec=codec,
        model=model,
        losses=losses,
        optimizer=optimizer,
        schedule=schedule,
        amp_dtype=dtype,
        scaler=scaler,
        train_examples=examples,
        mix=mix,
        sampler=sampler,
        fingerprint=data_fingerprint(examples, cfg, ctx.world, mix),
        valid_sets=valid_sets,
        metrics=valid_metrics(cfg, codec, ctx.device),
        pictures=valid_pictures(cfg, codec, ctx.device),
    )


def prepare_caches(data: DataConfig, codec: Codec, run_dir: str, ctx: DistContext) -> None:
    """With several processes, rank 0 binarizes the corpora the cache lacks while the others wait,
    then all map the same files (one binarization, one copy in the page cache)."""
    if not ctx.enabled:
        return
    error: Optional[UserError] = None
    if ctx.main:
        try:
            binarize_corpora(data, codec, run_dir)
        except UserError as e:
            error = e
    if not distributed.broadcast_flag(error is None, ctx):
        raise error or UserError("rank 0 could not binarize the training data (see its error)")


def load_training_data(
    data: DataConfig, codec: Codec, unit: str, run_dir: str, fields: list[FieldProvider]
) -> tuple[Sequence[Example], CorpusMix]:
    """Every training corpus' instances for ``unit`` in one sequence (corpus after corpus), and the
    CorpusMix that describes it for the sampler."""
    parts: list[IndexedExamples] = []
    sizes = []
    corpora = train_corpora(data)
    for c in corpora:
        loaded, _ = load_examples(data, codec, c.src, c.tgt, unit, run_dir, fields=fields, documents=c.documents)
        if not loaded:
            raise UserError(f"{c.src}: no training examples (all filtered by data.max_len?)")
        parts.append(loaded)
        sizes.append(len(loaded))
    examples: Sequence[Example] = parts[0] if len(parts) == 1 else ConcatExamples(parts)
    mix = CorpusMix([c.name for c in corpora], sizes, [c.weight for c in corpora])
    if len(corpora) > 1:
        log.info(
            "%d training corpora, examples per epoch (rounds x weight): %s",
            len(corpora),
            ", ".join(
                f"{n} {k} of {size} (weight {w})"
                for n, k, size, w in zip(mix.names, mix.per_epoch, mix.sizes, mix.weights)
            ),
        )
    return examples, mix


def load_valid_sets(
    data: DataConfig, codec: Codec, unit: str, run_dir: str, fields: list[FieldProvider]
) -> list[ValidSet]:
    """The validation sets: instances for ``unit`` (no length filter, only the fields of losses that
    run in validation) and their text documents (for BLEU)."""
    sets = []
    for v in data.corpora("valid"):  # each with both files (checked when the config is read)
        examples, _ = load_examples(
            data, codec, v.src, v.tgt, unit, run_dir, filter_long=False, fields=fields, documents=v.documents
        )
        docs = read_parallel(v.src, v.tgt, v.documents, data.max_line_chars)
        sets.append(ValidSet(v.name, examples, docs, v.documents))
    return sets


def valid_metrics(cfg: Config, codec: Codec, device: torch.device) -> list[ValidMetric]:
    """The validation metrics beyond the losses that ``cfg`` asks for: BLEU with ``train.valid_bleu``,
    CXMI with ``train.valid_cxmi``."""
    metrics = [bleu_metric(cfg, codec, device)] if cfg.train.valid_bleu else []
    return metrics + ([cxmi_metric(cfg, codec, device)] if cfg.train.valid_cxmi else [])


def bleu_metric(cfg: Config, codec: Codec, device: torch.device) -> ValidMetric:
    """Sentence-level BLEU of a validation set translated (in context, for a document set) by the
    current model, with ``translate:`` and ``train.valid_beam``."""

    def bleu(model: torch.nn.Module, v: ValidSet) -> dict:
        if not v.docs:
            return {}
        opts = translator_options(cfg.translate, beam=cfg.train.valid_beam, n_best=1)
        translator = Translator(model, codec, cfg, opts, device)
        hyps = translator.translate_documents([[s for s, _ in d] for d in v.docs])
        refs = [[t for _, t in d] for d in v.docs]
        return {"bleu": report(hyps, refs, v.documents)["bleu"]}

    return bleu


def cxmi_metric(cfg: Config, codec: Codec, device: torch.device) -> ValidMetric:
    """CXMI (``onmt_doc.evaluation.cxmi``) of the current model on the first ``train.valid_cxmi``
    sentences of a document validation set, in document order (the last document cut where the count
    ends: its sentences keep their preceding context). A sentence-level set reports none."""
    from onmt_doc.evaluation.cxmi import cxmi

    def metric(model: torch.nn.Module, v: ValidSet) -> dict:
        if not v.documents or not v.docs:
            return {}
        docs, left = [], cfg.train.valid_cxmi
        for doc in v.docs:
            if left <= 0:
                break
            docs.append(doc[:left])
            left -= len(docs[-1])
        translator = Translator(model, codec, cfg, cfg.translate, device)
        return {"cxmi": cxmi(translator, [d for d in docs if d])["cxmi"]}

    return metric


def valid_pictures(cfg: Config, codec: Codec, device: torch.device) -> Optional[ValidPictures]:
    """With ``log.pictures`` N, the context pictures of the first ``log.picture_documents``
    validation documents of 2 to 6 sentences (the same ones at every validation, so a run shows
    how the reading changes), at the first validation and every N-th after; None without."""
    if not cfg.log.pictures:
        return None
    from onmt_doc.evaluation.context_pictures import require_matplotlib, rgb
    from onmt_doc.evaluation.context_reading import read_document

    require_matplotlib()  # a missing extra fails at the start, not at the first validation
    validations = 0

    def pictures(model: torch.nn.Module, v: ValidSet) -> dict:
        nonlocal validations
        validations += 1
        if (validations - 1) % cfg.log.pictures:
            return {}
        translator = Translator(model, codec, cfg, cfg.translate, device)
        chosen = [d for d in v.docs if 2 <= len(d) <= 6][: cfg.log.picture_documents]
        images = {}
        for k, doc in enumerate(chosen):
            reading = read_document(translator, [s for s, _ in doc], [t for _, t in doc])
            images.update({f"doc{k + 1}/{h.key}": rgb(h) for h in reading.heatmaps})
        return images

    return pictures


def run_summary(cfg: Config, parts: RunParts, ctx: DistContext) -> str:
    """The start-up line: the parts, the model size and where it trains."""
    precision = f"{str(parts.amp_dtype).replace('torch.', '')} mixed precision" if parts.amp_dtype else "float32"
    return (
        f"model: {cfg.model.encoder.type} encoder + {cfg.model.decoder.type} decoder, unit {parts.model.unit}, "
        f"{parts.model.n_params() / 1e6:.2f}M parameters, device {ctx.device}, {ctx.world} process(es), "
        f"{torch.get_num_threads()} threads, {precision}"
    )
