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

import os
import random
import time
from dataclasses import dataclass, field
from typing import Optional

from benchmarks.stages.training import Profile, checkpoint, free_memory, share_vocab, system_config, train_system
from benchmarks.suite.stage import StageContext, stage

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
    """The (source, reference) documents with their true context, none (each sentence alone) or
    shuffled (the same document lengths filled with a random permutation of all sentences, so
    each sentence sits among other documents' sentences). Every condition scores the same
    sentences, so the summed log-probabilities compare."""
    src, ref = docs
    if condition == "true":
        return src, ref
    pairs = [(s, r) for ds, dr in zip(src, ref) for s, r in zip(ds, dr)]
    if condition == "none":
        return [[s] for s, _ in pairs], [[r] for _, r in pairs]
    random.Random(seed).shuffle(pairs)
    out_s, out_r, i = [], [], 0
    for d in src:
        chunk = pairs[i : i + len(d)]
        out_s.append([s for s, _ in chunk])
        out_r.append([r for _, r in chunk])
        i += len(d)
    return out_s, out_r


# ----------------------------------------------------------------------------- data


def read_docs(path: str) -> Docs:
    """Documents of a file in which blank lines separate documents."""
    docs, cur = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.strip():
                cur.append(line)
            elif cur:
                docs.append(cur)
                cur = []
    return docs + ([cur] if cur else [])


def write_docs(path: str, docs: Docs) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    return path


def _pair(data: str, split: str, domain: str) -> tuple[Docs, Docs]:
    src = read_docs(os.path.join(data, "docmt-en-de", f"{domain}.{split}.en"))
    tgt = read_docs(os.path.join(data, "docmt-en-de", f"{domain}.{split}.de"))
    if [len(d) for d in src] != [len(d) for d in tgt]:
        raise ValueError(f"docmt-en-de/{domain}.{split}: source and target documents are not aligned")
    return src, tgt


def _first_sentences(docs: tuple[Docs, Docs], limit: int) -> tuple[Docs, Docs]:
    """Whole documents from the start, up to ``limit`` sentences (at least one document)."""
    if not limit:
        return docs
    n, total = 0, 0
    while n < len(docs[0]) and (n == 0 or total + len(docs[0][n]) <= limit):
        total += len(docs[0][n])
        n += 1
    return docs[0][:n], docs[1][:n]


def prepare(ctx: StageContext, p: DocumentsParams) -> dict:
    """Training, validation and pre-training files under the stage's folder; the test and ablation
    documents in memory."""
    work = ctx.work_dir("data")
    train, valid = {"en": [], "de": []}, {"en": [], "de": []}
    test, ablation = {}, ([], [])
    for domain in p.domains:
        src, tgt = _pair(ctx.data, "dev", domain)
        keep = len(src) - p.held_out_docs
        if keep < 1:
            raise ValueError(f"docmt-en-de/{domain}.dev has {len(src)} documents; held_out_docs={p.held_out_docs}")
        first = min(keep, p.train_docs) if p.train_docs else keep
        for side, docs in (("en", src), ("de", tgt)):
            train[side] += docs[:first]
            valid[side] += docs[keep:]
        test[domain] = _first_sentences(_pair(ctx.data, "test", domain), p.test_sentences)
        a_src, a_ref = _first_sentences(_pair(ctx.data, "test", domain), p.ablation_sentences)
        ablation[0].extend(a_src)
        ablation[1].extend(a_ref)
    paths = {"test": test, "ablation": ablation}
    for side in ("en", "de"):
        paths[f"doc.{side}"] = write_docs(os.path.join(work, f"train.{side}"), train[side])
        paths[f"valid.{side}"] = write_docs(os.path.join(work, f"valid.{side}"), valid[side])
        lines = []
        for rel in (f"multi30k-en-de/train.{side}", f"news-sent-en-de/newstest2008-2013.{side}"):
            with open(os.path.join(ctx.data, rel), encoding="utf-8") as f:
                lines += [line for line in f if line.strip()]
        lines += [s + "\n" for d in train[side] for s in d]
        paths[f"pretrain.{side}"] = os.path.join(work, f"pretrain.{side}")
        with open(paths[f"pretrain.{side}"], "w", encoding="utf-8") as f:
            f.writelines(lines[-p.pretrain_lines :] if p.pretrain_lines else lines)
    n_pre = sum(1 for _ in open(paths["pretrain.en"], encoding="utf-8"))
    ctx.record(
        data="docmt-en-de",
        train_docs=len(train["en"]),
        train_sentences=sum(map(len, train["en"])),
        valid_docs=len(valid["en"]),
        pretrain_pairs=n_pre,
        test_sentences={d: sum(map(len, test[d][0])) for d in test},
    )
    return paths


def _data(paths: dict, which: str) -> dict:
    """The ``data:`` section: pre-training pairs or training documents, the held-out documents."""
    return {
        "data": {
            "train": {"src": paths[f"{which}.en"], "tgt": paths[f"{which}.de"]},
            "valid": {"src": paths["valid.en"], "tgt": paths["valid.de"]},
        }
    }
