#!/usr/bin/env python
"""What a document-level model costs per target word compared with the sentence Transformer of the
same shape and batch budget (issue 16): padding, training speed, where a G-Transformer step spends
its time, and beam-search translation speed, on docmt-en-de TED in one process.

  OMP_NUM_THREADS=1 python benchmarks/document_cost.py [--out runs/bench_doc_cost] [--data ../shared/data]
      [--d-model 256] [--layers 3] [--global-layers 1] [--attention-dropout 0.0]
      [--batch-tokens 2048] [--hm-window 20] [--k 1]
      [--warmup 2] [--rounds 4] [--steps-per-slice 6] [--profile-steps 3]
      [--test-docs 2] [--test-sentences 24] [--translate-rounds 2] [--translate-batch-tokens 4096]
      [--threads 1]

Training data is ``ted.dev.{en,de}`` of ``<data>/docmt-en-de`` (93 TED talks); every system builds
its instances and batches with the trainer's own code (``onmt_doc.train.trainer.Trainer``: the
unit's instances, ``BatchSampler``, ``collate``) from the same ``train.batch_tokens``. Systems:

- ``transformer``: the sentence Transformer (unit ``sentence``), the reference of every ratio;
- ``g_transformer``: G-Transformer (unit ``document``, ``data.max_tokens`` instances), group
  attention on every layer, combined group + global attention on the top ``--global-layers``
  layers of encoder self, decoder self and decoder cross attention (the paper: 2 of 6);
- ``hm_gdc``: HM-GDC (unit ``context``: windows of ``--hm-window`` sentences, each sentence a batch
  row), ``doc_layers`` = ``--global-layers``, the example config's readings;
- ``k_to_1`` / ``k_to_k``: the concatenation baselines with ``data.context_sentences`` = ``--k``.

Parts, each reported in ``<out>/results.md`` and ``results.json``:

1. padding (deterministic, no timing): over every batch of epoch 0, real (non-padding, markup
   included) / computed positions of source and target (HM-GDC: summed over its length buckets,
   ``onmt_doc/modules/row_buckets.py``), the G-Transformer's group-attention blocks and HM-GDC's
   packed document memory; target words per batch (all words the loss covers, and
   corpus words per batch = the corpus' target words / batches per epoch, which differ only for
   ``k_to_k``, whose targets repeat the context sentences);
2. training speed: ``--warmup`` steps each, then ``--rounds`` rounds in which every system takes
   ``--steps-per-slice`` steps in turn (rotating who goes first), so load drift hits all alike; a
   step is what the trainer's loop times (next batch + ``Trainer.train_step``); target words/s
   over wall and over process CPU seconds (one thread: CPU time is the cost even while other jobs
   share the machine), load average and the CPU other processes used;
3. profile (torch.profiler) of ``--profile-steps`` G-Transformer and Transformer steps, forward and
   backward attributed to the part whose forward created each autograd node: plan building,
   group-attention gathers/scatter, the group attention kernel, global attention (projections and
   kernel), gates, the rest of group and combined layers, the Transformer's attention kernels,
   embeddings, output layer + loss, optimizer; and the largest ops of each part;
4. translation (beam 4): the first ``--test-sentences`` sentences of the first ``--test-docs``
   TED test documents, ``--translate-rounds`` rounds with the systems alternating. The models are
   the ones just timed (a few dozen steps: random for practical purposes), so the output length is
   capped at the source length (``translate.max_len_ratio 1.0``, ``max_len_add 0``) and the
   ``</s>``/``<eos>`` output biases are lowered by ``END_PENALTY``: every system decodes every
   sentence to that cap, about the length a translation would have, and none ends early by chance
   (the table shows the output subwords per sentence, the decoder steps and rows per step).

On a quiet machine, scale up with ``--rounds 10 --steps-per-slice 10 --test-docs 4 --test-sentences 50``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from typing import Callable

import torch
from common import (
    CpuMonitor,
    add_data_argument,
    add_shape_arguments,
    copy_vocab,
    cpu_model,
    log,
    read_lines,
    write_results,
)

from onmt_doc.config import TranslateConfig, config_from_dict
from onmt_doc.contracts import Batch
from onmt_doc.data.batching import collate
from onmt_doc.data.prepare import build_codec, load_codec
from onmt_doc.data.vocab import EOS_ID, EOS_SENT_ID, SOS_ID
from onmt_doc.decoders.base import is_word
from onmt_doc.errors import UserError
from onmt_doc.modules import row_buckets
from onmt_doc.modules.document_packing import plan_packing
from onmt_doc.modules.group_attention import plan_self
from onmt_doc.modules.row_buckets import bucket_rows, computed_positions
from onmt_doc.train.distributed import DistContext
from onmt_doc.train.trainer import Trainer
from onmt_doc.translate.translator import Translator

REFERENCE = "transformer"
END_PENALTY = 30.0  # subtracted from the </s> and <eos> output biases before timing translation
SYSTEMS = ["transformer", "g_transformer", "hm_gdc", "k_to_1", "k_to_k"]
LABELS = {
    "transformer": "Transformer (sentence)",
    "g_transformer": "G-Transformer (document)",
    "hm_gdc": "HM-GDC (context)",
    "k_to_1": "k-to-1 (k_to_1)",
    "k_to_k": "k-to-k (k_to_k)",
}


# ----------------------------------------------------------------------------- configs


def system_config(name: str, args: argparse.Namespace, out: str) -> dict:
    """The config of one system: the same shape, data, budget and optimiser for all."""
    data = os.path.join(args.data, "docmt-en-de")
    part = {"layers": args.layers, "heads": args.heads, "ff": args.ff}
    g = {"global_layers": args.global_layers}
    model = {
        "transformer": {"encoder": {"type": "transformer", **part}, "decoder": {"type": "transformer", **part}},
        "g_transformer": {
            "encoder": {"type": "g_transformer", **part, **g},
            "decoder": {"type": "g_transformer", **part, **g, "global_cross_layers": args.global_layers},
        },
        "hm_gdc": {
            "encoder": {"type": "hierarchical", **part, "doc_layers": args.global_layers, "context": "own_sentence"},
            "decoder": {"type": "doc_context", **part, "context": "document"},
        },
        "k_to_1": {
            "unit": "k_to_1",
            "encoder": {"type": "transformer", **part},
            "decoder": {"type": "transformer", **part},
        },
        "k_to_k": {
            "unit": "k_to_k",
            "encoder": {"type": "transformer", **part},
            "decoder": {"type": "transformer", **part},
        },
    }[name]
    return {
        "data": {
            "train": {"src": f"{data}/ted.dev.en", "tgt": f"{data}/ted.dev.de"},
            "documents": True,
            "max_tokens": args.max_tokens,
            "max_sentences": args.hm_window,
            "context_sentences": args.k,
            "cache_dir": os.path.join(out, "cache"),
        },
        "vocab": {"subword": "bpe", "size": args.vocab, "shared": True},
        "model": {"d_model": args.d_model, "dropout": 0.1, "attention_dropout": args.attention_dropout, **model},
        "optim": {"type": "adam", "lr": 5.0e-4, "betas": [0.9, 0.98], "schedule": {"type": "inverse_sqrt"}},
        "train": {"batch_tokens": args.batch_tokens, "max_steps": 100000, "threads": args.threads, "seed": 1},
        "translate": {"beam": 4, "max_len_ratio": 1.0, "max_len_add": 0, "batch_tokens": args.translate_batch_tokens},
        "log": {"dir": os.path.join(out, name), "tensorboard": False},
    }


def make_trainers(args: argparse.Namespace, out: str) -> dict[str, Trainer]:
    """One trainer per system, sharing one BPE vocabulary (learned once, on the training data)."""
    vocab_dir = os.path.join(out, "vocab")
    first = config_from_dict(system_config(REFERENCE, args, out))
    if load_codec(first, vocab_dir) is None:
        log(f"learning BPE {args.vocab} on ted.dev into {vocab_dir}")
        build_codec(first, vocab_dir)
    trainers = {}
    for name in args.systems:
        cfg = config_from_dict(system_config(name, args, out))
        copy_vocab(vocab_dir, cfg.log.dir)
        trainers[name] = Trainer(cfg, DistContext())
        log(f"{name}: {len(trainers[name].train_examples)} instances, {trainers[name].model.n_params() / 1e6:.2f}M")
    torch.set_num_threads(args.threads)
    return trainers


# ----------------------------------------------------------------------------- 1. padding


def words(t: torch.Tensor) -> int:
    """Target words (every non-special token, and <unk>) of a padded tensor."""
    return int(is_word(t).sum())


def padding_stats(trainer: Trainer) -> dict:
    """Real / computed positions over every batch of epoch 0, as the trainer batches them."""
    examples, sampler = trainer.train_examples, trainer.sampler
    unit = trainer.model.unit
    s = defaultdict(float)
    batches = sampler.epoch_batches(0)
    for idx in batches:
        b = collate([examples[i] for i in idx], idx)
        s["rows"] += b.size
        s["sentences"] += int(b.tgt_out.eq(SOS_ID).sum())  # target sentences the loss covers
        s["src_real"] += b.n_src_tokens
        s["tgt_real"] += b.n_tgt_tokens
        if unit == "context":  # rows computed in length buckets (modules/row_buckets.py)
            s["src_pos"] += computed_positions(b.src.ne(0).sum(1))
            s["tgt_pos"] += computed_positions(b.tgt_out.ne(0).sum(1))
        else:
            s["src_pos"] += b.src.numel()
            s["tgt_pos"] += b.tgt_out.numel()
        s["tgt_words"] += words(b.tgt_out)
        s["budget"] += b.size * max(b.src.size(1), b.tgt_out.size(1))
        n_src = b.src.ne(0).sum(1).double()  # encoder self-attention scores: real query x real key pairs
        s["scores_real"] += float((n_src**2).sum())
        if unit == "context":
            s["scores_pos"] += sum(k.rows.numel() * k.length**2 for k in bucket_rows(b.src.ne(0).sum(1)))
        else:
            s["scores_pos"] += b.size * b.src.size(1) ** 2
        if unit == "document":  # group attention blocks (encoder self, decoder self)
            for tags, keep, causal in (
                (b.src_groups, b.src.ne(0), False),
                (b.tgt_groups, b.tgt_in.ne(0), True),
            ):
                for blk in plan_self(tags, keep, causal).buckets:  # summed over the length buckets
                    s["block_real"] += int(blk.q_valid.sum())
                    s["block_pos"] += blk.q_valid.numel()
                    if not causal:  # [g, L, L] block scores of the encoder's group self-attention
                        n_block = blk.q_valid.sum(1).double()
                        s["block_scores_real"] += float((n_block**2).sum())
                        s["block_scores_pos"] += blk.q_valid.numel() * blk.q_valid.size(1)
        if unit == "context":  # the packed document memory C (eq. 8) every target position attends to
            n_docs = int(b.doc_index.max()) + 1
            pad = plan_packing(b.doc_index, n_docs, b.src.size(1), b.src.ne(0)).padding()
            s["docmem_real"] += int((~pad).sum())
            s["docmem_pos"] += pad.numel()
            # the real target positions of a window packed into one query sequence (across buckets) x its slots
            per_doc = torch.bincount(b.doc_index, weights=b.tgt_out.ne(0).sum(1).double(), minlength=n_docs)
            s["doc_attn_pos"] += n_docs * int(per_doc.max()) * pad.size(1)
            s["doc_attn_real"] += int(b.tgt_out.ne(0).sum(1).mul(pad.eq(0).sum(1)[b.doc_index]).sum())
    n = len(batches)
    corpus_words = sum(words(torch.from_numpy(t)) for doc in trainer_docs(trainer) for _, t in doc)
    row = {
        "batches": n,
        "rows_per_batch": s["rows"] / n,
        "sentences_per_batch": s["sentences"] / n,
        "src_real": s["src_real"] / s["src_pos"],
        "tgt_real": s["tgt_real"] / s["tgt_pos"],
        "budget_used": (s["src_pos"] + s["tgt_pos"]) / 2 / s["budget"],
        "enc_scores_real": s["scores_real"] / s["scores_pos"],
        "tgt_tokens_per_batch": s["tgt_real"] / n,
        "tgt_words_per_batch": s["tgt_words"] / n,
        "corpus_words_per_batch": corpus_words / n,
        "positions_per_batch": (s["src_pos"] + s["tgt_pos"]) / n,
    }
    if s["block_pos"]:
        row["group_blocks_real"] = s["block_real"] / s["block_pos"]
        row["group_scores_real"] = s["block_scores_real"] / s["block_scores_pos"]
    if s["docmem_pos"]:
        row["doc_memory_real"] = s["docmem_real"] / s["docmem_pos"]
        row["doc_attention_real"] = s["doc_attn_real"] / s["doc_attn_pos"]
    return row


def trainer_docs(trainer: Trainer) -> list:
    """The tokenized training documents (ids), read through the binarized cache the trainer filled."""
    from onmt_doc.data.cache import load_tokenized
    from onmt_doc.data.prepare import data_cache_dir

    cfg = trainer.cfg
    c = cfg.data.corpora("train")[0]
    docs, _ = load_tokenized(
        c.src, c.tgt, trainer.codec, c.documents, cfg.data.max_line_chars, data_cache_dir(cfg, trainer.run_dir)
    )
    return docs


# ----------------------------------------------------------------------------- 2. training speed


class Timed:
    """A system's training batches and the time, CPU time and words of the steps taken."""

    def __init__(self, trainer: Trainer):
        self.trainer, self.batches = trainer, iter(trainer.sampler)
        self.wall = self.cpu = 0.0
        self.words = self.tokens = self.steps = 0
        self.step_s: list[float] = []

    def step(self, record: bool = True) -> None:
        """One step as the trainer's loop times it: the next batch (collation) and ``train_step``."""
        w0, c0 = time.perf_counter(), time.process_time()
        batch: Batch = next(self.batches)
        self.trainer.train_step([batch])
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if record:
            self.wall, self.cpu, self.steps = self.wall + w, self.cpu + c, self.steps + 1
            self.words += words(batch.tgt_out)
            self.tokens += batch.n_tgt_tokens
            self.step_s.append(w)


def time_training(trainers: dict[str, Trainer], args: argparse.Namespace) -> dict:
    """Interleaved slices of steps; target words/s per system and the machine's load meanwhile."""
    timed = {name: Timed(t) for name, t in trainers.items()}
    for name, t in timed.items():
        for _ in range(args.warmup):
            t.step(record=False)
    monitor = CpuMonitor()
    monitor.start()
    loads, t0 = [os.getloadavg()], time.time()
    names = list(timed)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            for _ in range(args.steps_per_slice):
                timed[name].step()
        loads.append(os.getloadavg())
        log(f"round {r + 1}/{args.rounds}: load {loads[-1][0]:.2f}")
    t1 = time.time()
    monitor.stop()
    rows = {
        name: {
            "steps": t.steps,
            "step_s_median": statistics.median(t.step_s),
            "words_per_s": t.words / t.wall,
            "words_per_cpu_s": t.words / t.cpu,
            "tokens_per_s": t.tokens / t.wall,
            "words_per_step": t.words / t.steps,
        }
        for name, t in timed.items()
    }
    return {
        "systems": rows,
        "seconds": t1 - t0,
        "load_avg_1min": [x[0] for x in loads],
        "other_processes_cores": monitor.foreign(t0, t1),
    }


# ----------------------------------------------------------------------------- 3. profile


@contextlib.contextmanager
def patched(obj, attr: str, wrap: Callable):
    """Replace ``obj.attr`` by ``wrap(original)`` inside the block."""
    original = getattr(obj, attr)
    had_own = attr in vars(obj)  # an instance attribute (or a module's function), not a class method
    setattr(obj, attr, wrap(original))
    try:
        yield
    finally:
        if had_own:
            setattr(obj, attr, original)
        else:
            delattr(obj, attr)


def scoped(name: str) -> Callable:
    """A wrapper factory: the call runs inside the profiler range ``name``."""

    def wrap(fn: Callable) -> Callable:
        def inner(*a, **kw):
            with torch.profiler.record_function(name):
                return fn(*a, **kw)

        return inner

    return wrap


class _ScopedLoss:
    """A loss of the trainer's list, called inside the profiler range ``output layer + loss``."""

    def __init__(self, loss):
        self.loss = loss

    def __getattr__(self, key: str):
        return getattr(self.loss, key)

    def __call__(self, *a, **kw):
        with torch.profiler.record_function("output layer + loss"):
            return self.loss(*a, **kw)


def profile_scopes(trainer: Trainer) -> contextlib.ExitStack:
    """Profiler ranges around the parts of a step (module functions and instance methods, restored
    afterwards); the ranges' names are the rows of the profile table."""
    from onmt_doc.decoders import g_transformer as gdec
    from onmt_doc.encoders import g_transformer as genc
    from onmt_doc.modules import group_attention

    stack = contextlib.ExitStack()
    model = trainer.model
    for mod in (genc, gdec):
        for fn in ("plan_self", "plan_cross"):
            if hasattr(mod, fn):
                stack.enter_context(patched(mod, fn, scoped("plan building")))
        stack.enter_context(patched(mod, "group_attend", scoped("group attention: gathers/scatter")))
    stack.enter_context(patched(group_attention, "_attend", scoped("group attention: kernel")))
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        modes = {getattr(layer, k, None) for k in ("mode", "self_mode", "cross_mode")} - {None}
        kind = "combined" if "combined" in modes else "group" if modes else "sentence"
        stack.enter_context(patched(layer, "forward", scoped(f"{kind} layers: rest")))
        for attr in ("global_attn", "global_self_attn"):
            if getattr(layer, attr, None) is not None:
                stack.enter_context(patched(getattr(layer, attr), "forward", scoped(GLOBAL_PROJ)))
                stack.enter_context(patched(getattr(layer, attr), "attend", scoped("global attention: kernel")))
        if getattr(layer, "global_cross_attn", None) is not None:
            for method in ("cross", "memory_kv"):
                stack.enter_context(patched(layer.global_cross_attn, method, scoped(GLOBAL_PROJ)))
            stack.enter_context(patched(layer.global_cross_attn, "attend", scoped("global attention: kernel")))
        if kind == "sentence":  # the sentence Transformer's attention kernels, to compare with group attention
            for attr in ("self_attn", "cross_attn"):
                if getattr(layer, attr, None) is not None:
                    stack.enter_context(patched(getattr(layer, attr), "attend", scoped("sentence attention: kernel")))
        for attr in ("gate", "self_gate", "cross_gate"):
            if getattr(layer, attr, None) is not None:
                stack.enter_context(patched(getattr(layer, attr), "forward", scoped("gates")))
    for emb in {id(m): m for m in (model.encoder.embeddings, model.decoder.embeddings)}.values():
        stack.enter_context(patched(emb, "forward", scoped("embeddings")))
    stack.enter_context(patched(model, "forward", scoped(MODEL_OTHER)))
    stack.enter_context(patched(model.generator, "forward", scoped("output layer + loss")))
    stack.enter_context(patched(trainer.optimizer, "step", scoped("optimizer")))
    stack.enter_context(patched(trainer, "losses", lambda losses: [_ScopedLoss(x) for x in losses]))
    return stack


STEP = "step"
GLOBAL_PROJ = "global attention: projections"
MODEL_OTHER = "model: masks, word dropout, selections"
OTHER = "other: clipping, zero_grad, accumulate grad"


def attribute(events) -> dict[str, float]:
    """CPU µs per range name, forward and backward: a range's own time is its inclusive time minus
    its nested ranges'; every backward node (``evaluate_function``) goes to the range in which the
    forward op of the same sequence number ran."""
    scopes = {e.name for e in events if e.name == STEP or e.name in SCOPE_NAMES}

    def enclosing(e):
        p = e.cpu_parent
        while p is not None and p.name not in scopes:
            p = p.cpu_parent
        return p

    forward_scope: dict[int, str] = {}
    for e in events:
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::engine") and e.name not in scopes:
            p = enclosing(e)
            if p is not None and p.name != STEP:
                forward_scope.setdefault(e.sequence_nr, p.name)

    def in_backward(e) -> bool:
        p = e.cpu_parent
        while p is not None and not p.name.startswith("autograd::engine"):
            p = p.cpu_parent
        return p is not None

    fwd, bwd, ops = defaultdict(float), defaultdict(float), defaultdict(float)
    for e in events:
        if e.name not in scopes and not e.name.startswith("autograd::engine") and e.cpu_children == []:
            if in_backward(e):
                continue
            p = enclosing(e)  # the leaf ops of the forward pass, by part
            ops[(p.name if p is not None and p.name != STEP else OTHER, e.name)] += e.self_cpu_time_total
        if e.name in scopes:
            fwd[e.name] += e.cpu_time_total
            p = enclosing(e)
            if p is not None:
                fwd[p.name] -= e.cpu_time_total
        elif e.name.startswith("autograd::engine::evaluate_function"):
            p = e.cpu_parent
            if p is not None and p.name.startswith("autograd::engine::evaluate_function"):
                continue  # nested: counted with its parent
            target = forward_scope.get(e.sequence_nr, OTHER)
            bwd[target] += e.cpu_time_total
            ops[(target, e.name.rsplit(": ", 1)[-1])] += e.cpu_time_total
            q = enclosing(e)
            if q is not None:
                fwd[q.name] -= e.cpu_time_total
    fwd[OTHER] += fwd.pop(STEP, 0.0)
    return {"forward": dict(fwd), "backward": dict(bwd), "ops": dict(ops)}


SCOPE_NAMES = {
    MODEL_OTHER,
    "plan building",
    "group attention: gathers/scatter",
    "group attention: kernel",
    GLOBAL_PROJ,
    "global attention: kernel",
    "sentence attention: kernel",
    "gates",
    "combined layers: rest",
    "group layers: rest",
    "sentence layers: rest",
    "embeddings",
    "output layer + loss",
    "optimizer",
}


def profile_steps(trainer: Trainer, steps: int) -> dict:
    """Profile ``steps`` training steps of one trainer; ms per step by part, forward and backward."""
    batches = iter(trainer.sampler)
    batch_list = [next(batches) for _ in range(steps)]
    with profile_scopes(trainer):
        trainer.train_step([batch_list[0]])  # the wrappers' first call outside the profile
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            w0 = time.perf_counter()
            for b in batch_list:
                with torch.profiler.record_function(STEP):
                    trainer.train_step([b])
            wall = time.perf_counter() - w0
    parts = attribute(prof.events())
    n = len(batch_list)
    rows = {}
    for name in set(parts["forward"]) | set(parts["backward"]):
        f, b = parts["forward"].get(name, 0.0) / 1e3 / n, parts["backward"].get(name, 0.0) / 1e3 / n
        top = sorted(((v, op) for (part, op), v in parts["ops"].items() if part == name), reverse=True)[:3]
        rows[name] = {
            "forward_ms": f,
            "backward_ms": b,
            "total_ms": f + b,
            "top_ops": [(op, v / 1e3 / n) for v, op in top],
        }
    return {
        "parts": rows,
        "step_ms_profiled": 1e3 * wall / n,
        "words_per_step": sum(words(b.tgt_out) for b in batch_list) / n,
    }


# ----------------------------------------------------------------------------- 4. translation


def read_docs(path: str) -> list[list[str]]:
    """Documents of a file whose blank lines separate documents."""
    docs, cur = [], []
    for line in read_lines(path):
        if line:
            cur.append(line)
        elif cur:
            docs.append(cur)
            cur = []
    return docs + ([cur] if cur else [])


class StepCounter:
    """Counts a model's incremental decoder steps and the rows (beams x sentences or instances) they
    carry, inside the block: sequential steps cost per-step overhead whatever their width."""

    def __init__(self, model):
        self.model, self.calls, self.rows = model, 0, 0

    def __enter__(self) -> "StepCounter":
        original = self.model.step

        def counted(tokens, state):
            self.calls, self.rows = self.calls + 1, self.rows + tokens.numel()
            return original(tokens, state)

        self.model.step = counted
        return self

    def __exit__(self, *exc) -> None:
        del self.model.step


def time_translation(trainers: dict[str, Trainer], args: argparse.Namespace) -> dict:
    """Beam-4 sentences/s per system, rounds with the systems alternating."""
    src = os.path.join(args.data, "docmt-en-de", "ted.test.en")
    docs = [d[: args.test_sentences] for d in read_docs(src)[: args.test_docs]]
    n = sum(len(d) for d in docs)
    translators = {}
    for name in args.translate_systems:
        if name not in trainers:
            continue
        model = trainers[name].model
        with torch.no_grad():  # no early end by chance: every sentence runs to its cap (the source length)
            model.generator.bias[[EOS_SENT_ID, EOS_ID]] -= END_PENALTY
        translators[name] = Translator(model, trainers[name].codec, trainers[name].cfg)
    secs, cpu, out_words, steps = defaultdict(list), defaultdict(list), {}, {}
    loads = [os.getloadavg()]
    names = list(translators)
    for r in range(args.translate_rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            counter = StepCounter(trainers[name].model) if r == 0 else contextlib.nullcontext()
            with counter:
                w0, c0 = time.perf_counter(), time.process_time()
                hyps = translators[name].translate_documents(docs)
                secs[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
            if r == 0:
                steps[name] = (counter.calls, counter.rows)
            tokenize = trainers[name].codec.tgt_subword.tokenize_batch
            out_words[name] = sum(len(t) for d in hyps for t in tokenize(d)) / n
            assert sum(len(d) for d in hyps) == n, name
        loads.append(os.getloadavg())
        log(f"translation round {r + 1}/{args.translate_rounds}: load {loads[-1][0]:.2f}")
    src_words = sum(len(t) for d in docs for t in trainers[REFERENCE].codec.src_subword.tokenize_batch(d)) / n
    return {
        "sentences": n,
        "source_subwords_per_sentence": src_words,
        "systems": {
            name: {
                "sent_per_s": n / min(secs[name]),
                "sent_per_cpu_s": n / min(cpu[name]),
                "output_subwords_per_sentence": out_words[name],
                "decoder_steps": steps[name][0],
                "rows_per_step": steps[name][1] / max(steps[name][0], 1),
                "seconds": secs[name],
            }
            for name in names
        },
        "load_avg_1min": [x[0] for x in loads],
    }


# ----------------------------------------------------------------------------- report


def render(res: dict) -> str:
    a = res["args"]
    ref = REFERENCE
    lines = [
        f"# Document-level cost vs the sentence Transformer ({res['date']})",
        "",
        f"Machine: {res['machine']}; torch {res['torch']}, {a['threads']} thread(s). Shape: d_model {a['d_model']}, "
        f"{a['layers']}+{a['layers']} layers, {a['heads']} heads, ff {a['ff']}; G-Transformer combined layers "
        f"{a['global_layers']} of {a['layers']}; HM-GDC windows of {a['hm_window']} sentences, doc_layers "
        f"{a['global_layers']}; k = {a['k']}; train.batch_tokens {a['batch_tokens']}, data.max_tokens "
        f"{a['max_tokens']}. Data: ted.dev (training), ted.test (translation).",
        "",
        "## 1. Padding (epoch 0, every batch; real = non-padding positions, markup included)",
        "",
        "| system | batches | rows / batch | tgt sentences / batch | positions / batch | src real | tgt real "
        "| enc self-attn scores real | extra computed positions "
        "| tgt words / batch (vs Transformer) | corpus words / batch (vs Transformer) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    pads = res["padding"]
    for name, p in pads.items():
        extra = []
        if "group_blocks_real" in p:
            extra.append(
                f"group-attention blocks {p['group_blocks_real']:.1%} real, their encoder scores "
                f"{p['group_scores_real']:.1%}"
            )
        if "doc_memory_real" in p:
            extra.append(
                f"doc memory C {p['doc_memory_real']:.1%} real; DocEnc–Decoder attention "
                f"{p['doc_attention_real']:.1%} real"
            )
        lines.append(
            f"| {LABELS[name]} | {p['batches']} | {p['rows_per_batch']:.1f} | {p['sentences_per_batch']:.1f} "
            f"| {p['positions_per_batch']:.0f} "
            f"| {p['src_real']:.1%} | {p['tgt_real']:.1%} | {p['enc_scores_real']:.1%} | {'; '.join(extra) or '–'} "
            f"| {p['tgt_words_per_batch']:.0f} ({p['tgt_words_per_batch'] / pads[ref]['tgt_words_per_batch']:.2f}×) "
            f"| {p['corpus_words_per_batch']:.0f} "
            f"({p['corpus_words_per_batch'] / pads[ref]['corpus_words_per_batch']:.2f}×) |"
        )
    t = res["training"]
    ts = t["systems"]
    lines += [
        "",
        f"## 2. Training speed ({a['warmup']} warm-up steps, then {a['rounds']} rounds × {a['steps_per_slice']} "
        f"steps per system, interleaved; {t['seconds']:.0f} s)",
        "",
        f"Load average (1 min) during the run: {min(t['load_avg_1min']):.2f}–{max(t['load_avg_1min']):.2f}; "
        f"other processes used {t['other_processes_cores']:.2f} cores on average.",
        "",
        "| system | steps | median step s | tgt words / step | tgt words/s (wall) | ratio | tgt words / CPU s "
        "| ratio | corpus words / CPU s ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in ts.items():
        p = pads[name]
        corpus = s["words_per_cpu_s"] * p["corpus_words_per_batch"] / p["tgt_words_per_batch"]
        ref_corpus = ts[ref]["words_per_cpu_s"] * pads[ref]["corpus_words_per_batch"] / pads[ref]["tgt_words_per_batch"]
        lines.append(
            f"| {LABELS[name]} | {s['steps']} | {s['step_s_median']:.3f} | {s['words_per_step']:.0f} "
            f"| {s['words_per_s']:.0f} | {s['words_per_s'] / ts[ref]['words_per_s']:.2f}× "
            f"| {s['words_per_cpu_s']:.0f} | {s['words_per_cpu_s'] / ts[ref]['words_per_cpu_s']:.2f}× "
            f"| {corpus / ref_corpus:.2f}× |"
        )
    for name, prof in res.get("profile", {}).items():
        parts = sorted(prof["parts"].items(), key=lambda kv: -kv[1]["total_ms"])
        total = sum(v["total_ms"] for _, v in parts)
        lines += [
            "",
            f"## 3. Profile: {LABELS[name]}, {a['profile_steps']} steps ({prof['words_per_step']:.0f} tgt words "
            f"/ step, {prof['step_ms_profiled']:.0f} ms / step under the profiler)",
            "",
            "| part | forward ms | backward ms | total ms / step | share | ms per 1k tgt words "
            "| largest ops (ms / step; forward ops and backward nodes) |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for part, v in parts:
            top = ", ".join(f"{op} {ms:.0f}" for op, ms in v["top_ops"])
            lines.append(
                f"| {part} | {v['forward_ms']:.1f} | {v['backward_ms']:.1f} | {v['total_ms']:.1f} "
                f"| {v['total_ms'] / total:.1%} | {1e3 * v['total_ms'] / prof['words_per_step']:.1f} | {top} |"
            )
        lines.append(f"| **total** | | | {total:.1f} | | {1e3 * total / prof['words_per_step']:.1f} | |")
    tr = res.get("translation")
    if tr:
        trs = tr["systems"]
        lines += [
            "",
            f"## 4. Translation, beam 4 ({tr['sentences']} TED test sentences, "
            f"{tr['source_subwords_per_sentence']:.1f} source subwords each; best of {a['translate_rounds']} rounds, "
            f"systems alternating; translate.batch_tokens {a.get('translate_batch_tokens', 4096)})",
            "",
            f"Load average (1 min): {min(tr['load_avg_1min']):.2f}–{max(tr['load_avg_1min']):.2f}.",
            "",
            "| system | sentences/s (wall) | ratio | sentences / CPU s | ratio | output subwords / sentence "
            "| decoder steps | rows / step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, s in trs.items():
            lines.append(
                f"| {LABELS[name]} | {s['sent_per_s']:.2f} | {s['sent_per_s'] / trs[ref]['sent_per_s']:.2f}× "
                f"| {s['sent_per_cpu_s']:.2f} | {s['sent_per_cpu_s'] / trs[ref]['sent_per_cpu_s']:.2f}× "
                f"| {s['output_subwords_per_sentence']:.1f} | {s['decoder_steps']} | {s['rows_per_step']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench_doc_cost")
    add_data_argument(p)
    p.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    p.add_argument("--translate-systems", nargs="+", default=["transformer", "g_transformer", "hm_gdc"])
    add_shape_arguments(
        p, 1, "G-Transformer combined layers (per stack) and HM-GDC doc_layers; the paper's 2 of 6 is 1 of 3"
    )
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument(
        "--attention-dropout",
        type=float,
        default=0.0,
        help="model.attention_dropout of every system; 0.0 is the G-Transformer authors' setting "
        "(gtransformer_base keeps fairseq's default), 0.1 the value of the runs before 2026-11-23 evening",
    )
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=512, help="data.max_tokens (G-Transformer instances)")
    p.add_argument("--hm-window", type=int, default=20, help="data.max_sentences (HM-GDC windows)")
    p.add_argument("--k", type=int, default=1, help="data.context_sentences (k_to_1, k_to_k)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps-per-slice", type=int, default=6)
    p.add_argument("--profile-steps", type=int, default=3, help="0 = no profile")
    p.add_argument("--test-docs", type=int, default=2)
    p.add_argument("--test-sentences", type=int, default=24, help="first N sentences of each test document")
    p.add_argument("--translate-rounds", type=int, default=2, help="0 = no translation")
    p.add_argument(
        "--translate-batch-tokens",
        type=int,
        default=TranslateConfig().batch_tokens,
        help="translate.batch_tokens of every system (padded source tokens per batch)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--bucket-overhead",
        type=int,
        default=None,
        help="HM-GDC length buckets: the cost of one more bucket in positions (default: the library's)",
    )
    args = p.parse_args()
    if args.bucket_overhead is not None:
        row_buckets.BUCKET_OVERHEAD = args.bucket_overhead
    if REFERENCE not in args.systems:
        p.error(f"--systems must include {REFERENCE} (the reference of every ratio)")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(args.threads)
    res = {
        "args": vars(args),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores visible",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "load_avg_start": os.getloadavg(),
    }
    t0 = time.time()
    try:
        trainers = make_trainers(args, out)
    except UserError as e:  # e.g. a --data folder without docmt-en-de: one line, not a traceback
        p.error(str(e))
    log("1. padding")
    res["padding"] = {name: padding_stats(t) for name, t in trainers.items()}
    log("2. training speed")
    res["training"] = time_training(trainers, args)
    if args.profile_steps:
        log("3. profile")
        res["profile"] = {
            name: profile_steps(trainers[name], args.profile_steps)
            for name in ("g_transformer", REFERENCE)
            if name in trainers
        }
    if args.translate_rounds:
        log("4. translation")
        res["translation"] = time_translation(trainers, args)
    res["seconds"] = time.time() - t0
    res["load_avg_end"] = os.getloadavg()
    write_results(out, res, render)
    log(f"done in {res['seconds']:.0f} s; {out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
