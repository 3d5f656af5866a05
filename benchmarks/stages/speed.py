"""``model_speed`` and ``group_attention``: how fast each architecture trains and decodes, and what
packed group attention saves over dense N×N masking. Random weights: speed and memory, not quality.

Why it is measured this way: every model is its ``config_examples`` model section at one shape
(depth-like keys scaled by ``layers / 6``, so the Reformers keep the papers' equal-parameter depths)
and gets the same sentences, cut into its own unit by the library, with speed counted in corpus
target words, so units compare fairly. Slices run in rotation and ratios are medians of per-round
ratios, so drift on a shared machine hits all alike. Decoding is forced to the source length (random
weights would stop anywhere). ``transformer_no_self_attention`` skips the decoder self-attention: a
free replacement, bounding what any replacement (MHPLSTM's) can gain. ``mfu`` counts FLOPs with
``FlopCounterMode`` (attention included): ``6 × params × tokens`` is wrong for half of these models.
TF32 is off (fp32 rows are true fp32); CPU memory peaks are the resident high-water mark (VmHWM).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
from unittest import mock

from benchmarks.stages.environment import EnvironmentParams, matmul_peak, sync
from benchmarks.stages.training import free_memory
from benchmarks.suite.stage import StageContext, gpu_name, rss_mib, stage

MODELS = ("transformer", "mhplstm", "reformer_base", "reformer_fast", "g_transformer", "hm_gdc")
MODELS += ("transformer_k_to_1", "transformer_k_to_k", "transformer_no_self_attention")
REFERENCE = "transformer"
BASE_LAYERS = 6  # the config examples' Transformer depth; depth-like keys are scaled by layers / 6
DEPTH_KEYS = ("layers", "global_layers", "global_cross_layers", "doc_layers")
END_PENALTY = 30.0  # subtracted from the </s> and <eos> output biases before decoding (forced length)


def shift_ends(model: Any, by: float = -END_PENALTY) -> bool:
    """Add ``by`` to the model's ``</s>`` and ``<eos>`` output biases: lowered (the default), a model
    with random weights decodes every hypothesis to its length cap, the same steps on every model
    and engine. False for a model without an output bias (nothing changed)."""
    import torch

    from onmt_doc.data.vocab import EOS_ID, EOS_SENT_ID

    bias = getattr(getattr(model, "generator", None), "bias", None)
    if bias is None:
        return False
    with torch.no_grad():
        bias[[EOS_SENT_ID, EOS_ID]] += by
    return True


# (training, decoding) speed vs the Transformer as the papers report them (WMT, trained models, GPUs):
# MHPLSTM Xu et al., table 2; the Reformers Li et al. 2020, table 3 (decoding only)
PAPER = {"mhplstm": (1.16, 1.69), "reformer_base": (None, 0.47), "reformer_fast": (None, 0.73)}
AMP_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp32_unfused": "float32"}
VARIANTS = ("packed", "dense", "dense_explicit")


@dataclass
class ModelSpeedParams:
    models: list = field(default_factory=lambda: list(MODELS[:6]))  # measured in this order, transformer first
    d_model: int = 512
    layers: int = 6  # per stack (encoder and decoder); the Reformers' depths scale with it (see above)
    heads: int = 8
    ff: int = 2048
    vocab: int = 32000  # placeholder words (data: random) or the BPE size (data: ted), shared source/target
    batch_tokens: int = 8192  # target tokens (markup included) per training batch
    sentence_words: list = field(default_factory=lambda: [20, 30])  # words per sentence, uniform in [lo, hi)
    doc_sentences: int = 8  # sentences per random document; ted: the first N of each test document
    max_tokens: int = 512  # data.max_tokens of the G-Transformer's document instances
    max_sentences: int = 20  # data.max_sentences: HM-GDC's windows
    context_sentences: int = 1  # data.context_sentences: k of k-to-1 and k-to-k
    data: str = "random"  # random | ted (docmt-en-de: BPE learned on ted.dev, which it trains on)
    ted_docs: int = 0  # ted: the first N training documents (0: all 93; the BPE is learned on all)
    amp: list = field(default_factory=lambda: ["bf16", "fp32"])  # and/or fp32_unfused
    warmup_steps: int = 2
    train_steps: int = 4  # timed, per round
    rounds: int = 1  # training slices per (model, precision), in rotation
    decode_sentences: int = 64  # 0: no decoding
    decode_words: list = field(default_factory=list)  # random decoding sources' [lo, hi) (default: sentence_words)
    decode_batch: int = 64  # sentences per decoding batch (whole documents)
    # document-unit models (the G-Transformer, which takes a document's sentences one after another in one
    # sequence): this many documents per decoding batch instead (0: decode_batch sentences, like every model);
    # set to decode_batch, a batch holds as many rows as the sentence models' (beam × decode_batch)
    decode_document_batch: int = 0
    beam: int = 4
    repeats: int = 2  # timed decoding passes (median), in rotation
    matmul_n: int = 8192  # n of the n×n×n products timed for the peaks of the MFU
    matmul_repeats: int = 10
    count_flops: bool = True
    profile: list = field(default_factory=list)  # models whose training step is profiled by part
    profile_steps: int = 3
    seed: int = 0


@stage("model_speed", ModelSpeedParams)
def model_speed(p: ModelSpeedParams, ctx: StageContext) -> None:
    """``train_slice``/``decode_slice`` records as measured, then ``profile`` and ``speed`` records."""
    import torch
    import torch.utils.flop_counter as fc

    from onmt_doc.losses import build_losses

    # FLOPs: torch's counter lacks CPU's fused SDPA kernels (it has the CUDA ones): the same count
    def fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    def bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    cpu_sdpa = "_scaled_dot_product_flash_attention_for_cpu"
    formulas = {getattr(torch.ops.aten, op, None): f for op, f in ((cpu_sdpa, fwd), (cpu_sdpa + "_backward", bwd))}
    formulas.pop(None, None)

    _known(model=(p.models, MODELS), amp=(p.amp, AMP_DTYPES), data=([p.data], ("random", "ted")))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 rows are true fp32
    torch.manual_seed(p.seed)
    device = ctx.device
    ctx.record(what="setup", weights="random", device=device, gpu=gpu_name(device), tf32=False,
               torch=torch.__version__, threads=torch.get_num_threads(), data=p.data)  # fmt: skip
    peaks, shape = {}, EnvironmentParams(matmul_size=p.matmul_n, repeats=p.matmul_repeats)
    for amp in p.amp if p.count_flops else []:
        peaks[amp] = matmul_peak(device, AMP_DTYPES[amp], shape)
        ctx.record(what="matmul_peak", amp=amp, dtype=AMP_DTYPES[amp], n=p.matmul_n, tflops=peaks[amp])
    data = SpeedData(p, ctx)
    pairs = [(name, amp) for name in sorted(p.models, key=lambda m: m != REFERENCE) for amp in p.amp]
    runs = {pair: Run(*pair) for pair in pairs}
    built: dict[str, tuple] = {}
    rotate_slices(runs, p, ctx, lambda run: train_slice(run, built, data, p, ctx), "train")
    for name in p.profile:
        run = runs.get((name, p.amp[0]))
        if run and run.step:
            profile_parts(run, built[name], p, ctx)
    if p.decode_sentences:
        rotate_slices(runs, p, ctx, lambda run: decode_slice(run, built, data, p, ctx), "decode")
    for name, amp in pairs:  # medians, ratios (medians of the per-round ratios), memory, FLOPs
        run, ref, first = runs[(name, amp)], runs.get((REFERENCE, amp)), runs[(name, p.amp[0])]
        row: dict[str, Any] = {"what": "speed", "model": name, "amp": amp, "weights": "random", **run.info}
        if run.stopped:
            row["error" if run.stopped.startswith("error") else "skipped"] = run.stopped.removeprefix("error: ")
        for kind, key in (("train", "tok_per_s"), ("decode", "sent_per_s")):
            if slices := getattr(run, kind):
                mine = [s[key] for s in slices]
                row[f"{kind}_{key}"] = statistics.median(mine)
                row[f"{kind}_ratio"] = _ratio(mine, [s[key] for s in getattr(ref, kind)] if ref else [])
                mib = [s["peak_mib"] for s in slices if s["peak_mib"] is not None]
                row["peak_mib" if kind == "train" else "decode_peak_mib"] = max(mib, default=None)
        if run.train:
            row["amp_ratio"] = _ratio([s["tok_per_s"] for s in run.train], [s["tok_per_s"] for s in first.train])
            row["step_ms"] = statistics.median(s["step_ms"] for s in run.train)
        if run.decode:
            row["out_tokens_per_sent"] = run.decode[-1]["out_tokens_per_sent"]
        row["paper_train_ratio"], row["paper_decode_ratio"] = PAPER.get(name, (None, None))
        if name in built and p.count_flops and "error" not in row and row.get("train_tok_per_s"):
            model, cfg, batches, _ = built[name]  # FLOPs of one forward + backward, per corpus word
            loss_fn, last, b = build_losses(cfg.loss)[0], batches[-1], batches[-1].to(device)
            model.train()
            with fc.FlopCounterMode(display=False, custom_mapping=formulas) as counter:
                with _autocast(device, amp):
                    loss, _ = loss_fn(model(b), b)
                loss.backward()
            model.zero_grad(set_to_none=True)
            del loss
            sync(device)
            fpw = counter.get_total_flops() / max(last.tgt_words, 1) * last.tgt_words / last.corpus_words
            achieved = fpw * row["train_tok_per_s"]
            row.update(gflops_per_word=fpw / 1e9, tflops=achieved / 1e12, mfu=achieved / 1e12 / peaks[amp])
        ctx.record(**row)


@dataclass
class Run:
    """One (model, precision): its step function and what its slices measured."""

    model: str
    amp: str
    step: Optional[Callable] = None
    train: list = field(default_factory=list)  # per round: {"tok_per_s", "step_ms", "peak_mib"}
    decode: list = field(default_factory=list)  # per round: {"sent_per_s", "out_tokens_per_sent", "peak_mib"}
    decode_pass: Optional[Callable] = None
    stopped: str = ""  # "error: …" or "skipped: …"
    info: dict = field(default_factory=dict)  # params_m and the padding of its batches


def rotate_slices(runs: dict, p: ModelSpeedParams, ctx: StageContext, measure: Callable, kind: str) -> None:
    """``measure(run)`` for every run, round after round; a run that fails is stopped, and when the time
    left is under 1.5× the longest slice the rest is skipped (recorded, never silently dropped)."""
    longest = 0.0
    for r in range(max(p.rounds if kind == "train" else p.repeats, 1)):
        for run in runs.values():
            if run.stopped or (kind == "decode" and not run.train):
                continue
            if ctx.seconds_left() < 1.5 * longest:
                run.stopped = run.stopped or f"{kind} skipped: out of time ({ctx.seconds_left():.0f} s left)"
                if r == 0 or kind == "decode":
                    continue
                return
            t0, first = time.time(), not getattr(run, kind)  # a first slice also builds and warms up: not an estimate
            try:
                got = measure(run)
                getattr(run, kind).append(got)
                ctx.record(what=f"{kind}_slice", round=r + 1, model=run.model, amp=run.amp, **got)
            except Exception as e:  # e.g. out of memory: say so and go on with the next model
                run.stopped = _error(e, "error: ")
            free_memory()
            longest = longest if first else max(longest, time.time() - t0)


def placeholder_codec(words: int):
    """A vocabulary of ``words`` placeholder words ``w0 w1 ...`` without subword splitting."""
    from onmt_doc.data.codec import Codec
    from onmt_doc.data.tokenizer import Subword
    from onmt_doc.data.vocab import SPECIALS, Vocab

    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(words)])
    sw = Subword("none", "none")
    return Codec(sw, sw, vocab, vocab)


def build(name: str, p: ModelSpeedParams, codec) -> tuple[Any, Any]:
    """The model of ``config_examples/<name>.yaml`` at the benchmark's shape (seeded random weights), its config."""
    import torch
    import yaml

    from benchmarks.suite.system import REPO
    from onmt_doc.config import config_from_dict
    from onmt_doc.models.builder import build_model

    example = REFERENCE if name == "transformer_no_self_attention" else name
    with open(os.path.join(REPO, "config_examples", f"{example}.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    section = copy.deepcopy(raw["model"])
    section["d_model"] = p.d_model
    for part in ("encoder", "decoder"):
        stack = section.get(part, {})
        for key in DEPTH_KEYS:
            if isinstance(stack.get(key), int) and stack[key] > 0:
                stack[key] = max(1, round(stack[key] * p.layers / BASE_LAYERS))
        stack.update((key, value) for key, value in (("heads", p.heads), ("ff", p.ff)) if key in stack)
    cfg = config_from_dict({"model": section, "loss": raw.get("loss", []), "optim": raw.get("optim", {})})
    torch.manual_seed(p.seed)
    model = build_model(cfg.model, codec)
    for layer in model.decoder.layers if example != name else ():  # a residual block that returns its input
        del layer.self_res  # (a module attribute takes no plain function)
        layer.self_res = lambda x, fn: x
    return model, cfg


class SpeedData:
    """The codec, training batches and decoding documents: placeholder words, or docmt-en-de TED (a BPE
    learned on ted.dev, training on it; decoding the first ``doc_sentences`` of ted.test documents)."""

    def __init__(self, p: ModelSpeedParams, ctx: StageContext):
        self.p = p
        if p.data == "random":
            self.codec = placeholder_codec(p.vocab)
            n = p.warmup_steps + max(p.train_steps, 1)
            self.train_docs = [self.random_documents(p.seed + 1 + i, tokens=p.batch_tokens) for i in range(n)]
            words = p.decode_words or p.sentence_words
            self.decode_docs = self.random_documents(p.seed + 10_000, sentences=p.decode_sentences, words=words)
            return
        from onmt_doc.config import config_from_dict
        from onmt_doc.data.corpus import read_parallel
        from onmt_doc.data.prepare import build_codec

        d = os.path.join(ctx.data, "docmt-en-de")
        paths = {split: (f"{d}/ted.{split}.en", f"{d}/ted.{split}.de") for split in ("dev", "test")}
        data = {"train": {"src": paths["dev"][0], "tgt": paths["dev"][1]}, "documents": True}
        cfg = config_from_dict({"data": data, "vocab": {"subword": "bpe", "size": p.vocab, "shared": True}})
        self.codec = codec = build_codec(cfg.data, cfg.vocab, ctx.work_dir("vocab"), force=True)

        def encode(split: str, keep: int, with_target: bool) -> list:
            docs = [doc[:keep] if keep else doc for doc in read_parallel(*paths[split], True)]
            src = iter(codec.encode([s for doc in docs for s, _ in doc], "src"))
            tgt = iter(codec.encode([t for doc in docs for _, t in doc], "tgt")) if with_target else None
            return [[(next(src), next(tgt) if tgt else None) for _ in doc] for doc in docs]

        test = encode("test", p.doc_sentences, False)
        starts = [end - len(doc) for doc, end in zip(test, itertools.accumulate(map(len, test)))]
        self.decode_docs = [doc[: p.decode_sentences - at] for doc, at in zip(test, starts) if at < p.decode_sentences]
        train = encode("dev", 0, True)
        self.train_docs = train[: p.ted_docs] if p.ted_docs else train

    def batches(self, unit: str) -> list:
        """Every training batch of ``unit`` (random: one per document group; ted: the sampler's epoch 0),
        each with ``tgt_words`` (loss words) and ``corpus_words`` (corpus target words) attached."""
        if self.p.data == "random":
            return [self.instance_batch(unit, docs) for docs in self.train_docs]
        from onmt_doc.data.batching import BatchSampler, collate

        examples = self.instances(unit, self.train_docs)
        sampler = BatchSampler(examples, self.p.batch_tokens, seed=self.p.seed + 1)
        batches = [collate([examples[i] for i in idx], idx) for idx in sampler.epoch_batches(0)]
        corpus = sum(len(t) for doc in self.train_docs for _, t in doc)
        scale = corpus / sum(_words(b.tgt_out) for b in batches)  # k-to-k's targets repeat their context
        for b in batches:
            b.tgt_words = _words(b.tgt_out)
            b.corpus_words = b.tgt_words * scale
        return batches

    def random_documents(self, seed: int, tokens: int = 0, sentences: int = 0, words: list = ()) -> list:
        """Documents of ``doc_sentences`` random (source, target) id arrays: until the targets hold ``tokens``
        tokens with markup (training), or ``sentences`` sources with target None (decoding)."""
        import numpy as np

        from onmt_doc.data.vocab import SPECIALS

        rng = np.random.default_rng(seed)
        first, (lo, hi) = len(SPECIALS), words or self.p.sentence_words
        docs: list[list[tuple]] = []
        total = 0  # target tokens (training) or sentences (decoding)
        while total < (tokens or sentences):
            docs.append([])
            for _ in range(self.p.doc_sentences if tokens else min(self.p.doc_sentences, sentences - total)):
                src = rng.integers(first, first + self.p.vocab, int(rng.integers(lo, hi)))
                tgt = rng.integers(first, first + self.p.vocab, int(rng.integers(lo, hi))) if tokens else None
                docs[-1].append((src, tgt))
                total += len(tgt) + 2 if tokens else 1
        return docs

    def instance_batch(self, unit: str, docs: list[list[tuple]]):
        """``docs`` as the library cuts them for ``unit`` and collates them, ``tgt_words`` and ``corpus_words`` set."""
        from onmt_doc.data.batching import collate

        batch = collate(self.instances(unit, docs))
        batch.tgt_words = _words(batch.tgt_out) if batch.tgt_out is not None else 0
        batch.corpus_words = sum(len(t) for doc in docs for _, t in doc if t is not None)
        return batch

    def instances(self, unit: str, docs: list) -> list:
        from onmt_doc.data.mapped import build_instances

        kw = {"max_sentences": self.p.max_sentences, "context_sentences": self.p.context_sentences}
        return build_instances(unit, docs, self.p.max_tokens, **kw)[0]


def _words(t) -> int:
    from onmt_doc.translate.rules import is_word

    return int(is_word(t).sum())


def padding(unit: str, batches: list) -> dict:
    """Real / computed positions over ``batches`` (HM-GDC: rows computed in length buckets; the
    G-Transformer's group-attention blocks of the encoder and decoder self-attention)."""
    from onmt_doc.modules.group_attention import plan_self
    from onmt_doc.modules.row_buckets import computed_positions

    s: dict[str, float] = defaultdict(float)
    for b in batches:
        for side, t in (("src", b.src), ("tgt", b.tgt_out)):
            s[f"{side}_real"] += int(t.ne(0).sum())
            s[f"{side}_pos"] += computed_positions(t.ne(0).sum(1)) if unit == "context" else t.numel()
        if unit == "document":
            for tags, keep, causal in ((b.src_groups, b.src.ne(0), False), (b.tgt_groups, b.tgt_in.ne(0), True)):
                for blk in plan_self(tags, keep, causal).buckets:
                    s["block_real"] += int(blk.q_valid.sum())
                    s["block_pos"] += blk.q_valid.numel()
    n = len(batches)
    row = {"batches": n, "rows_per_batch": sum(b.size for b in batches) / n}
    row.update({f"{key}_per_batch": sum(getattr(b, key) for b in batches) / n for key in ("tgt_words", "corpus_words")})
    names = {"src": "src_real", "tgt": "tgt_real", "block": "group_blocks_real"}
    return row | {name: s[f"{k}_real"] / s[f"{k}_pos"] for k, name in names.items() if s[f"{k}_pos"]}


def train_slice(run: Run, built: dict, data: SpeedData, p: ModelSpeedParams, ctx: StageContext) -> dict:
    """``train_steps`` timed steps of one run (its model built and warmed up at its first slice)."""
    if run.model not in built:
        model, cfg = build(run.model, p, data.codec)
        batches = data.batches(model.unit)
        info = {"params_m": sum(q.numel() for q in model.parameters()) / 1e6, **padding(model.unit, batches)}
        built[run.model] = (model.to(ctx.device), cfg, batches[: p.warmup_steps + max(p.train_steps, 1)], info)
    model, cfg, batches, run.info = built[run.model]
    model.train()
    if run.step is None:
        run.step = _step_fn(model, cfg, ctx.device, run.amp)
        for b in batches[: p.warmup_steps]:
            run.step(b)
    timed = batches[p.warmup_steps :][: max(p.train_steps, 1)] or batches[-1:]
    _, seconds, peak = measured(lambda: [run.step(b) for b in timed], ctx.device)
    words = sum(b.corpus_words for b in timed)
    return {"tok_per_s": words / seconds, "step_ms": 1e3 * seconds / len(timed), "peak_mib": peak}


def _step_fn(model, cfg, device: str, amp: str, scope: Callable = lambda name, fn: fn) -> Callable:
    """One training step on a batch (its host plans made and the batch moved to the device inside, as
    the trainer does, here on the step's thread: the trainer's prefetch thread on a GPU); ``scope``
    wraps the loss and the optimizer step (the profile's ranges)."""
    import torch

    from onmt_doc.data.vocab import PAD_ID
    from onmt_doc.losses import build_losses
    from onmt_doc.optim.optimizers import build_optimizer

    def textbook_loss(out, batch, eps: float = 0.1):  # label-smoothed CE through generic autograd
        lprobs = torch.log_softmax(out.logits.float(), dim=-1)
        target_lp = lprobs.gather(1, out.target[:, None]).squeeze(1)
        smooth = -(lprobs.sum(-1) - lprobs[:, PAD_ID]) / (lprobs.size(1) - 1)
        return ((1 - eps) * -target_lp + eps * smooth).sum(), {}

    if amp == "fp32_unfused":
        loss_fn = textbook_loss
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.998), eps=1e-8, foreach=False, fused=False)
    else:
        loss_fn = build_losses(cfg.loss)[0]
        opt = build_optimizer(cfg.optim, [{"params": model.parameters()}])
    loss_fn, opt_step = scope("output layer + loss", loss_fn), scope("optimizer", opt.step)

    prepare = getattr(model, "prepare", None)  # None: a library from before the host plans

    def step(batch) -> None:
        b = (prepare(batch, torch.device(device)) if prepare else batch).to(device)
        with _autocast(device, amp):
            loss, _ = loss_fn(model(b), b)
        (loss / max(b.n_tgt_tokens, 1)).backward()
        opt_step()
        opt.zero_grad(set_to_none=True)

    return step


def decode_slice(run: Run, built: dict, data: SpeedData, p: ModelSpeedParams, ctx: StageContext) -> dict:
    """One timed beam-search pass over the decoding documents, in batches of whole documents (about
    ``decode_batch`` sentences, or ``decode_document_batch`` documents for a document-unit model), outputs
    forced to the source length (set up, with one warm-up batch, at the first)."""

    from onmt_doc.translate.search import BeamSearch

    model, device, amp, docs = built[run.model][0], ctx.device, run.amp, data.decode_docs
    model.eval()
    if run.decode_pass is None:
        if not getattr(model, "_end_lowered", False):  # once per model
            model._end_lowered = shift_ends(model)
        groups, current = [], []
        by_documents = bool(p.decode_document_batch) and model.unit == "document"
        for doc in docs:  # about decode_batch sentences each, or decode_document_batch documents
            current.append(doc)
            size = len(current) if by_documents else sum(map(len, current))
            if size >= (p.decode_document_batch if by_documents else p.decode_batch):
                groups, current = groups + [current], []
        batches = [data.instance_batch(model.unit, g).to(device) for g in groups + [current] * bool(current)]
        search = BeamSearch(beam=p.beam, max_len_ratio=1.0, max_len_add=0)

        def decode_pass() -> tuple[int, int]:
            with _autocast(device, amp):
                out = sum(len(h[0].tokens) for b in batches for h in search.search(model, b) if h)
            return sum(len(d) for d in docs), out

        with _autocast(device, amp):
            search.search(model, batches[0])  # warm-up
        run.decode_pass = decode_pass
    (sentences, out_tokens), seconds, peak = measured(run.decode_pass, device)
    return {"sent_per_s": sentences / seconds, "out_tokens_per_sent": out_tokens / sentences, "peak_mib": peak}


STEP, OTHER = "step", "other: clipping, zero_grad, accumulate grad"


def profile_parts(run: Run, built: tuple, p: ModelSpeedParams, ctx: StageContext) -> None:
    """``profile_steps`` training steps under torch.profiler with ranges patched around the parts of a
    step; one ``profile`` record per part (forward and backward ms per step, share, the largest ops)."""
    import torch

    from onmt_doc.decoders import g_transformer as gdec
    from onmt_doc.encoders import g_transformer as genc
    from onmt_doc.modules import group_attention

    scopes: set = set()

    def scoped(name: str, fn: Callable) -> Callable:
        scopes.add(name)

        def inner(*a, **kw):
            with torch.profiler.record_function(name):
                return fn(*a, **kw)

        return inner

    model, cfg, batches, _ = built
    targets = [(m, fn, "plan building") for m in (genc, gdec) for fn in ("self_plan", "cross_plan") if hasattr(m, fn)]
    targets += [(m, "group_attend", "group attention: gathers/scatter") for m in (genc, gdec)]
    targets += [(group_attention, "_attend", "group attention: kernel")]
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        modes = {getattr(layer, k, None) for k in ("mode", "self_mode", "cross_mode")} - {None}
        kind = "combined" if "combined" in modes else "group" if modes else "sentence"
        targets.append((layer, "forward", f"{kind} layers: rest"))
        for attr in ("global_attn", "global_self_attn", "global_cross_attn"):
            if (sub := getattr(layer, attr, None)) is not None:
                methods = ("cross", "memory_kv") if attr == "global_cross_attn" else ("forward",)
                targets += [(sub, m, "global attention: projections") for m in methods]
                targets += [(sub, "attend", "global attention: kernel")]
        for attr in ("self_attn", "cross_attn") if kind == "sentence" else ():
            if getattr(layer, attr, None) is not None:
                targets.append((getattr(layer, attr), "attend", "sentence attention: kernel"))
        gates = [getattr(layer, a) for a in ("gate", "self_gate", "cross_gate") if getattr(layer, a, None) is not None]
        targets += [(gate, "forward", "gates") for gate in gates]
    embeddings = {id(m): m for m in (model.encoder.embeddings, model.decoder.embeddings)}.values()
    targets += [(emb, "forward", "embeddings") for emb in embeddings]
    targets += [(model, "forward", "model: masks, word dropout, selections")]
    targets += [(model.generator, "forward", "output layer + loss")]
    batches = (batches * p.profile_steps)[: p.profile_steps]
    with contextlib.ExitStack() as patches:
        for obj, attr, name in targets:
            patches.enter_context(mock.patch.object(obj, attr, scoped(name, getattr(obj, attr))))
        step = _step_fn(model, cfg, ctx.device, run.amp, scope=scoped)
        step(batches[0])  # the wrappers' first call outside the profile
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for b in batches:
                with torch.profiler.record_function(STEP):
                    step(b)
    fwd, bwd, ops = attribute(prof.events(), scopes)
    n, words = len(batches), sum(b.corpus_words for b in batches) / len(batches)
    total = sum(fwd.values()) + sum(bwd.values())
    for part in sorted(set(fwd) | set(bwd), key=lambda k: -(fwd.get(k, 0) + bwd.get(k, 0))):
        f, b = fwd.get(part, 0.0) / 1e3 / n, bwd.get(part, 0.0) / 1e3 / n
        top = sorted(((v, op) for (q, op), v in ops.items() if q == part), reverse=True)[:3]
        ctx.record(what="profile", model=run.model, amp=run.amp, part=part, forward_ms=f, backward_ms=b,
                   total_ms=f + b, share=1e3 * n * (f + b) / total, ms_per_1k_words=1e3 * (f + b) / words,
                   top_ops=[f"{op} {v / 1e3 / n:.1f}" for v, op in top])  # fmt: skip


def attribute(events, names: set) -> tuple[dict, dict, dict]:
    """CPU µs per range, forward and backward, and per (range, op): a range's own time is its
    inclusive time minus its nested ranges'; every backward node goes to the range in which the
    forward op of the same sequence number ran."""
    scopes = names | {STEP}

    def up(e, found: Callable[[str], bool]):  # the nearest ancestor whose name is found
        q = e.cpu_parent
        while q is not None and not found(q.name):
            q = q.cpu_parent
        return q

    in_scope, in_engine = scopes.__contains__, lambda name: name.startswith("autograd::engine")

    forward_scope: dict[int, str] = {}
    for e in events:
        if e.sequence_nr >= 0 and not in_engine(e.name) and e.name not in scopes:
            q = up(e, in_scope)
            if q is not None and q.name != STEP:
                forward_scope.setdefault(e.sequence_nr, q.name)
    fwd, bwd, ops = defaultdict(float), defaultdict(float), defaultdict(float)
    for e in events:
        if e.name not in scopes and not in_engine(e.name) and not e.cpu_children and up(e, in_engine) is None:
            q = up(e, in_scope)  # an op of the forward pass
            ops[(q.name if q is not None and q.name != STEP else OTHER, e.name)] += e.self_cpu_time_total
        if e.name in scopes:
            fwd[e.name] += e.cpu_time_total
        elif e.name.startswith("autograd::engine::evaluate_function"):
            q = e.cpu_parent
            if q is not None and q.name.startswith("autograd::engine::evaluate_function"):
                continue  # nested: counted with its parent
            target = forward_scope.get(e.sequence_nr, OTHER)
            bwd[target] += e.cpu_time_total
            ops[(target, e.name.rsplit(": ", 1)[-1])] += e.cpu_time_total
        else:
            continue
        q = up(e, in_scope)  # a scope's or a backward node's time is not its enclosing scope's own
        if q is not None:
            fwd[q.name] -= e.cpu_time_total
    fwd[OTHER] += fwd.pop(STEP, 0.0)
    return dict(fwd), dict(bwd), dict(ops)


# ----------------------------------------------------------------------------- group_attention


@dataclass
class GroupAttentionParams:
    lengths: list = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192])  # tokens per instance
    batch: int = 2  # instances
    d_model: int = 512
    heads: int = 8
    sentence_words: list = field(default_factory=lambda: [20, 26])  # words per sentence, uniform in [lo, hi)
    causal: bool = False  # False: encoder self-attention; True: the decoder's
    amp: str = "bf16"  # q, k, v in bf16 or fp32
    variants: list = field(default_factory=lambda: ["packed", "dense"])  # and/or dense_explicit
    model_layers: int = 0  # > 0: also a G-Transformer encoder + decoder step of this depth, packed vs dense
    ff: int = 1024  # the model step's feed-forward width
    global_layers: int = 0  # the model step's combined layers (0: group attention only, isolating its cost)
    warmup: int = 2
    repeats: int = 5  # timed steps (median)
    seed: int = 0


@stage("group_attention", GroupAttentionParams)
def group_attention(p: GroupAttentionParams, ctx: StageContext) -> None:
    """Per length: one record per variant, the ``model`` records, then each variant's ratio to packed."""
    import torch

    _known(amp=([p.amp], AMP_DTYPES), variant=(p.variants, VARIANTS))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 rows are true fp32
    device, dtype = ctx.device, getattr(torch, AMP_DTYPES[p.amp])
    ctx.record(what="setup", weights="random", device=device, gpu=gpu_name(device), amp=p.amp, tf32=False)
    last = 0.0
    for index, length in enumerate(p.lengths):
        # dense work grows with the square of the length: expect 4× the last length's time
        if ctx.seconds_left() < 4 * last:
            for rest in p.lengths[index:]:
                ctx.record(what="attention", length=rest, skipped=f"out of time ({ctx.seconds_left():.0f} s left)")
            return
        t0 = time.time()
        tags, keep = (t.to(device) for t in group_tags(p, length))
        tokens = int(keep.sum())
        base, results = {"what": "attention", "length": length, "tokens": tokens, "amp": p.amp}, {}
        jobs = [("attention", v, lambda v=v: time_attention(v, tags, keep, p, device, dtype)) for v in p.variants]
        if p.model_layers:  # the model rows' tokens: the same sources, collated with targets
            jobs += [("model", v, lambda v=v: time_model(v, p, length, device, dtype)) for v in ("packed", "dense")]
        for what, variant, measure in jobs:
            row: dict[str, Any] = {**base, "what": what, "variant": variant}
            try:
                row.update(measure())
                results[(what, variant)] = row
            except Exception as e:  # e.g. the dense masks out of memory at long lengths
                row["error"] = _error(e)
            free_memory()
            ctx.record(**row)
        packed = results.get(("attention", "packed"))
        for (what, variant), r in results.items() if packed else ():
            if what == "attention" and variant != "packed":
                ratios = {key: _ratio(r.get(key), packed.get(key)) for key in ("ms", "peak_mib")}
                ctx.record(**base, variant=f"{variant}/packed", **ratios)
        last = time.time() - t0


def group_tags(p: GroupAttentionParams, length: int, batch: bool = False):
    """Sentence tags [B, N] and the non-padding mask of ``p.batch`` collated instances of random sentences
    packed to at most ``length`` tokens (``batch``: the collated batch itself, with targets)."""
    import numpy as np

    from onmt_doc.data.batching import collate
    from onmt_doc.data.instances import Example, mark_sentence
    from onmt_doc.data.vocab import SPECIALS

    rng, (lo, hi), examples = np.random.default_rng(p.seed + length), p.sentence_words, []
    for i in range(p.batch):
        src, tgt, total = [], [], 1
        while total + (n := int(rng.integers(lo, hi))) + 2 <= length:
            src.append(mark_sentence(rng.integers(len(SPECIALS), len(SPECIALS) + 100, n)))
            tgt.append(mark_sentence(rng.integers(len(SPECIALS), len(SPECIALS) + 100, n)))
            total += n + 2
        examples.append(Example(np.concatenate(src), np.concatenate(tgt) if batch else None, i, 0, len(src)))
    b = collate(examples)
    return b if batch else (b.src_groups, b.src.ne(0))


def dense_plan(tags, keep, causal: bool, k_tags=None, k_keep=None):
    """The N×N formulation: [B, 1, N, N] mask of what each query may see (its own sentence; every
    key for tag-0 queries), and [B, 1, N, 1] whether a query sees anything (padding rows: zero).
    ``k_tags``/``k_keep``: the keys' (cross-attention), default the queries'."""
    import torch

    k_tags, k_keep = (tags, keep) if k_tags is None else (k_tags, k_keep)
    m = ((tags[:, :, None] == k_tags[:, None, :]) | (tags[:, :, None] == 0)) & k_keep[:, None, :]
    if causal:
        m = m & torch.ones(tags.size(1), k_tags.size(1), dtype=torch.bool, device=m.device).tril()
    has = m.any(-1, keepdim=True)
    return (m | ~has)[:, None], has[:, None]


def dense_attend(plan, q, k, v, dropout: float = 0.0, probe=None, explicit: bool = False):
    """Attention under a :func:`dense_plan`: SDPA with the mask, or (``explicit``) scores and
    probabilities materialised, as a plain masked implementation does."""
    import torch.nn.functional as F

    mask, has = plan
    if not explicit:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout) * has
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    return F.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1), dropout) @ v * has


def time_attention(variant: str, tags, keep, p: GroupAttentionParams, device: str, dtype) -> dict:
    """Plan + attention forward + backward of one variant (:func:`time_steps`)."""
    import torch

    from onmt_doc.modules import group_attention as ga

    gen = torch.Generator(device="cpu").manual_seed(p.seed)
    shape = (tags.size(0), p.heads, tags.size(1), p.d_model // p.heads)
    q, k, v, w = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def step() -> None:
        if variant == "packed":
            out = ga.group_attend(ga.plan_self(tags, keep, p.causal), q, k, v)
        else:
            out = dense_attend(dense_plan(tags, keep, p.causal), q, k, v, explicit=variant == "dense_explicit")
        (out * w).sum().backward()
        q.grad = k.grad = v.grad = None

    return time_steps(step, p, device)


def time_steps(step: Callable, p: GroupAttentionParams, device: str) -> dict:
    """``warmup`` untimed, then the median wall and CPU ms of ``repeats`` (with one thread, CPU time
    is the cost even on a shared host); the peak memory of the timed steps above their start."""
    for _ in range(p.warmup):
        step()
    times, _, peak = measured(lambda: rotate({"step": step}, p.repeats, device)["step"], device)
    wall, cpu = zip(*times)
    return {"ms": 1e3 * statistics.median(wall), "cpu_ms": 1e3 * statistics.median(cpu), "peak_mib": peak}


def time_model(variant: str, p: GroupAttentionParams, length: int, device: str, dtype) -> dict:
    """A G-Transformer encoder + decoder step (forward + backward; the output layer and optimizer left
    out: their cost does not depend on attention) with the packed plan or the dense one swapped into
    the library's modules; ``attn_mib``: the score + mask tensors the step keeps, from the shapes."""
    import torch

    from onmt_doc.config import config_from_dict
    from onmt_doc.decoders import g_transformer as dec
    from onmt_doc.encoders import g_transformer as enc
    from onmt_doc.models.builder import build_model

    part = dict(type="g_transformer", layers=p.model_layers, heads=p.heads, ff=p.ff, global_layers=p.global_layers)
    section = {"d_model": p.d_model, "dropout": 0.1, "attention_dropout": 0.0, "encoder": part}
    section["decoder"] = {**part, "global_cross_layers": p.global_layers}
    torch.manual_seed(p.seed)
    model = build_model(config_from_dict({"model": section}).model, placeholder_codec(100)).to(device).train()
    b = group_tags(p, length, batch=True).to(device)
    weight = torch.randn(b.tgt_in.size(1), p.d_model, device=device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype, enabled=dtype != torch.float32):
            hidden = model.decoder(b.tgt_in, model.encoder(b), b).hidden
        (hidden.float() * weight).sum().backward()

    dense = {  # the names the G-Transformer modules import (group_attention.self_plan / cross_plan)
        "self_plan": lambda tags, keep, causal, host=None: dense_plan(tags, keep, causal),
        "cross_plan": lambda qt, qk, kt, kk, q_host=None, k_host=None: dense_plan(qt, qk, False, kt, kk),
    }
    dense["group_attend"] = dense_attend
    with contextlib.ExitStack() as stack:
        for mod in (enc, dec) if variant == "dense" else ():
            for name in filter(lambda name: hasattr(mod, name), dense):
                stack.enter_context(mock.patch.object(mod, name, dense[name]))
        row = time_steps(step, p, device)
    n, longest = b.src.size(1), int(torch.bincount(b.src_groups[0]).max())
    groups = int(b.src_groups.max(1).values.sum())  # bytes per query-key pair: 4 per head (scores), 1 (mask)
    per_layer = (b.size * n * n if variant == "dense" else groups * longest**2) * (p.heads * 4 + 1)
    row.update(tokens=int(b.n_src_tokens), sentences=groups, attn_mib=3 * p.model_layers * per_layer / 2**20)
    return row


def rotate(fns: dict[str, Callable[[], Any]], rounds: int, device: str = "cpu") -> dict[str, list[tuple]]:
    """(wall, CPU) seconds of each ``fns`` call, ``rounds`` times in rotation so that drift on a
    shared machine hits all alike; the device synchronized around each call."""
    times: dict[str, list[tuple]] = {name: [] for name in fns}
    for _ in range(max(rounds, 1)):
        for name, fn in fns.items():
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def measured(fn: Callable[[], Any], device: str) -> tuple[Any, float, Optional[float]]:
    """``fn()``, its wall seconds and its peak MiB above what was in use before: CUDA's allocator
    statistics; on CPU the resident high-water mark (VmHWM, reset through clear_refs)."""
    import torch

    cuda = device == "cuda"
    sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / 2**20 if cuda else rss_mib(reset=True) or 0
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else rss_mib("VmHWM")
    return out, seconds, None if peak is None else peak - before


def _ratio(a, b) -> Optional[float]:
    """a / b; for lists of per-round values the median of the per-round ratios (None: nothing to divide)."""
    if isinstance(a, list):
        ratios = [x / y for x, y in zip(a, b) if y]
        return statistics.median(ratios) if ratios else None
    return a / b if a is not None and b else None


def _known(**checks: tuple) -> None:
    for what, (values, known) in checks.items():
        if bad := [v for v in values if v not in known]:
            raise ValueError(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}")


def _error(e: Exception, prefix: str = "") -> str:
    return f"{prefix}{type(e).__name__}: {e}".splitlines()[0][:300]


def _autocast(device: str, amp: str):
    import torch

    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp == "bf16")
