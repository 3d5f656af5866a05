"""``documents``: real documents (docmt-en-de, Maruf et al. 2019) end to end through the library.

A sentence Transformer is pre-trained on sentence pairs (Multi30k train + newstest2008-2013 + the
document training data flattened, about 60k pairs), then every document system starts from it
(``init_from``) and trains on the documents of the three ``*.dev`` sets (the last
``held_out_docs`` documents of each are the validation set): the sentence model fine-tuned, the
G-Transformer fine-tuned (Bao et al. 2021 §3.3), HM-GDC's second step (Tan et al. 2019: sentence
level first, then the document level), a k-to-k concatenation baseline. Each is tested per domain
on ``*.test`` (s-BLEU and d-BLEU) and the reference log-probability is compared with the true
context, no context and another document's context (the context ablation). The data are tiny
next to the papers' (their document models see 0.2-2M sentence pairs and pre-train on millions);
the numbers show whether context is used, not the papers' BLEU."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from benchmarks.stages.training import Profile, checkpoint, free_memory, share_vocab, system_config, train_system
from benchmarks.suite.stage import StageContext, stage
from benchmarks.suite.system import REPO

DOMAINS = ("ted", "news", "europarl")
Docs = list[list[str]]


@dataclass
class DocumentsParams:
    pretrain: str  # the system pre-trained on sentence pairs (a key of the spec's systems)
    systems: list  # the systems trained on documents next, in order (init_from: the pretrain one)
    held_out_docs: int = 4  # last documents of each *.dev set: the validation set
    pretrain_lines: int = 0  # 0: every pre-training pair; else the last N (smoke)
    train_docs: int = 0  # 0: every training document of each domain; else the first N (smoke)
    test_sentences: int = 0  # per domain, whole documents up to this many sentences (0: all)
    ablation_sentences: int = 600  # per domain, scored under each context condition
    beam: int = 4
    translate_batch_tokens: int = 8192
    dtype: str = "float32"  # translation dtype (bfloat16 on a GPU halves memory traffic)
    seed: int = 1
    domains: list = field(default_factory=lambda: list(DOMAINS))
    profile_steps: int = 0  # > 0: profile this many training steps of every system (after profile_skip)
    profile_skip: int = 5


@stage("documents", DocumentsParams)
def documents(p: DocumentsParams, ctx: StageContext) -> None:
    """Prepare, pre-train, train every document system, test and ablate each as soon as trained."""
    data = prepare(ctx, p)
    pre = ctx.systems[p.pretrain]
    pre_dir = ctx.work_dir(p.pretrain)
    row = train_system(ctx, system_config(ctx, pre, _data(data, "pretrain"), {"log": {"dir": pre_dir}}),
                       _profile(ctx, p, p.pretrain))  # fmt: skip
    ctx.record(system=p.pretrain, step="pretrain", **row)
    evaluate(ctx, p, p.pretrain, checkpoint(pre_dir), data)
    for name in p.systems:
        if ctx.seconds_left() < 30:
            ctx.record(system=name, skipped="the stage's budget is spent")
            continue
        system = ctx.systems[name]
        run_dir = ctx.work_dir(name)
        share_vocab(pre_dir, run_dir)
        init = {"train": {"init_from": checkpoint(ctx.work_dir(system.init_from))}} if system.init_from else {}
        try:
            raw = system_config(ctx, system, _data(data, "doc"), init, {"log": {"dir": run_dir}})
            row = train_system(ctx, raw, _profile(ctx, p, name))
            ctx.record(system=name, step="train", **row)
            evaluate(ctx, p, name, checkpoint(run_dir), data)
        except Exception as e:  # one system's failure must not cost the others their numbers
            ctx.record(system=name, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
            free_memory()


def _profile(ctx: StageContext, p: DocumentsParams, system: str) -> Optional[Profile]:
    return Profile(ctx, system, p.profile_skip, p.profile_steps) if p.profile_steps else None


def evaluate(ctx: StageContext, p: DocumentsParams, name: str, ckpt: str, data: dict) -> None:
    """Translate each domain's test documents (s-BLEU, d-BLEU, sentences/s), then the context
    ablation on the references."""
    from onmt_doc import Translator
    from onmt_doc.evaluation.corpus_metrics import d_bleu, s_bleu

    translator = Translator.load(
        ckpt, device=ctx.device, beam=p.beam, batch_tokens=p.translate_batch_tokens, dtype=p.dtype
    )
    for domain in p.domains:
        src, ref = data["test"][domain]
        t0 = time.time()
        hyp = translator.translate(src)
        seconds = time.time() - t0
        flat_h, flat_r = [h for d in hyp for h in d], [r for d in ref for r in d]
        ctx.record(
            system=name,
            domain=domain,
            docs=len(src),
            sentences=len(flat_r),
            s_bleu=s_bleu(flat_h, flat_r),
            d_bleu=d_bleu(hyp, ref),
            sent_per_s=len(flat_r) / seconds,
        )
    for condition in ("true", "none", "shuffled"):
        src, ref = ablated(data["ablation"], condition, p.seed)
        scores = translator.score(src, ref)
        words = sum(len(r.split()) for d in ref for r in d)
        ctx.record(system=name, context=condition, nll_per_word=-sum(map(sum, scores)) / words)
    del translator
    free_memory()


def ablated(docs: tuple[Docs, Docs], condition: str, seed: int) -> tuple[Docs, Docs]:
    """The recipe's context ablation (recipes/docmt-en-de/run.py): true, none or shuffled context."""
    return recipe().ablated(docs, condition, seed)


def recipe():
    """recipes/docmt-en-de/run.py as a module (a folder with a hyphen is no package): the recipe a user
    runs and these stages share its data preparation, ablation and (``docmt_recipe``) everything."""
    if "docmt_recipe" not in sys.modules:
        path = os.path.join(REPO, "recipes", "docmt-en-de", "run.py")
        spec = importlib.util.spec_from_file_location("docmt_recipe", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["docmt_recipe"] = module
        spec.loader.exec_module(module)
    return sys.modules["docmt_recipe"]


def prepare(ctx: StageContext, p: DocumentsParams) -> dict:
    """The recipe's files under the stage's folder (training, validation, pre-training) and the test and
    ablation documents in memory, the ablation ones of every domain together."""
    r = recipe()
    opt = r.Options(ctx.data, ctx.work_dir(), held_out_docs=p.held_out_docs, test_sentences=p.test_sentences,
                    ablation_sentences=p.ablation_sentences, train_docs=p.train_docs,
                    pretrain_lines=p.pretrain_lines, domains=list(p.domains))  # fmt: skip
    data = r.prepare(opt, ctx.record)
    data["ablation"] = r.ablation_docs(data, list(p.domains))
    return data


def _data(paths: dict, which: str) -> dict:
    """The ``data:`` section: pre-training pairs or training documents, the held-out documents."""
    return {
        "data": {
            "train": {"src": paths[f"{which}.en"], "tgt": paths[f"{which}.de"]},
            "valid": {"src": paths["valid.en"], "tgt": paths["valid.de"]},
        }
    }


@dataclass
class RecipeParams:
    minutes: float = 10.0  # the recipe's whole budget (capped by the stage's)
    systems: list = field(
        default_factory=lambda: ["sentence", "sentence_ft", "g_transformer", "hm_gdc", "k_to_1", "k_to_k"]
    )
    test_sentences: int = 600
    ablation_sentences: int = 300
    held_out_docs: int = 4
    bootstrap: int = 1000


@stage("docmt_recipe", RecipeParams)
def docmt_recipe(p: RecipeParams, ctx: StageContext) -> None:
    """recipes/docmt-en-de/run.py in this process, its rows recorded as the stage's (issue 41)."""
    r = recipe()
    minutes = min(p.minutes, max(ctx.seconds_left() - 30, 60) / 60)
    opt = r.Options(ctx.data, ctx.work_dir("recipe"), ctx.device, minutes, ctx.smoke, list(p.systems),
                    held_out_docs=p.held_out_docs, test_sentences=p.test_sentences,
                    ablation_sentences=p.ablation_sentences, bootstrap=p.bootstrap)  # fmt: skip
    r.run(opt, ctx.record)
