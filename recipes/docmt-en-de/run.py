#!/usr/bin/env python3
"""docmt-en-de: sentence and document systems on real documents, from the raw files to the table.

    python recipes/docmt-en-de/run.py --data ../shared/data --out runs/docmt            # one GPU, ~10 min
    python recipes/docmt-en-de/run.py --data ../shared/data --out runs/docmt_smoke --smoke   # CPU, toy sizes

1. Data: ~60k sentence pairs to pre-train (Multi30k train + newstest2008-13 + the docmt dev sets
   flattened) and the 414 docmt dev documents to fine-tune on, the last ``--held_out_docs`` of each
   domain held out for validation (checkpoints are chosen on them, never on a test set).
2. Systems: the sentence Transformer pre-trained; the same fine-tuned on the documents (the fair
   baseline); the G-Transformer, HM-GDC (its step 2) and the 2-to-1 / 2-to-2 concatenation models, each
   fine-tuned from the pre-trained model; every training gets a share of ``--minutes``.
3. The table: s-BLEU and d-BLEU per domain of docmt-en-de/{ted,news,europarl}.test with 95% bootstrap
   intervals over documents; for the document systems the context ablation (true / no / shuffled
   context: s-BLEU and nats per word), CXMI and the toy contrastive suite's pronoun accuracy (a
   sanity line: context as given, removed, shuffled); every system's validation curve. Each row is written to
   ``OUT/results.jsonl`` and ``OUT/table.md`` when measured, so a cut-off run reports what finished.
4. A GPU checkpoint is a user's: the best document model translates a few test documents greedily on
   the GPU and on the CPU, and the row says how many sentences agree; the concatenation model exported
   to CTranslate2 does the same against onmt_doc's own translations.

README.md beside this file says why each setting is what it is. The GPU spec's ``documents`` stage
(benchmarks/specs/gpu.yaml) runs this same code (:func:`run`).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import yaml

if TYPE_CHECKING:
    from onmt_doc import Translator

HERE = os.path.dirname(os.path.abspath(__file__))
DOMAINS = ("ted", "news", "europarl")
Docs = list[list[str]]
# (system, config, data it trains on, share of the training minutes); every system but the first starts
# from the first's checkpoint (``train.init_from``)
SYSTEMS = [
    ("sentence", "sentence.yaml", "pretrain", 0.40),
    ("sentence_ft", "sentence_ft.yaml", "doc", 0.08),
    ("g_transformer", "g_transformer.yaml", "doc", 0.20),
    ("hm_gdc", "hm_gdc.yaml", "doc", 0.12),
    ("k_to_1", "k_to_1.yaml", "doc", 0.10),
    ("k_to_k", "k_to_k.yaml", "doc", 0.10),
]
DOCUMENT_SYSTEMS = ("g_transformer", "hm_gdc", "k_to_1", "k_to_k")
CONTRASTIVE_NAMES = {"none": "as given", "remove": "removed", "shuffle": "shuffled"}  # the suite's ablations
TRAIN_SHARE = 0.62  # of --minutes; the rest is preparation and evaluation
MAX_MINUTES = 10080  # a week: --minutes beyond it is a mistake
# --smoke: toy shapes and a few steps (CI runs it on the toy stand-ins of the data sets)
SMOKE = {
    "vocab": {"size": 300},
    "model": {
        "d_model": 16,
        "encoder": {"layers": 2, "heads": 2, "ff": 32},
        "decoder": {"layers": 2, "heads": 2, "ff": 32},
    },
    "train": {"batch_tokens": 600, "max_steps": 6, "valid_every": 3, "save_every": 3, "amp": "fp32"},
}
SMOKE_LAYERS = {  # (system, stack) -> keys
    ("g_transformer", "encoder"): {"global_layers": 1},
    ("g_transformer", "decoder"): {"global_layers": 1, "global_cross_layers": 1},
    ("hm_gdc", "encoder"): {"doc_layers": 1},
}


@dataclass
class Options:
    """What a run does; the command line's flags (``--help``)."""

    data: str
    out: str
    device: str = "auto"
    minutes: float = 10.0  # the whole run; trainings get TRAIN_SHARE of it by SYSTEMS' shares
    smoke: bool = False
    systems: list = field(default_factory=lambda: [s[0] for s in SYSTEMS])
    held_out_docs: int = 4  # per domain, the last documents of *.dev: the validation set
    test_sentences: int = 600  # per domain, whole documents up to this many sentences (0: every one)
    ablation_sentences: int = 300  # per domain, for the context ablation and CXMI (0: every one)
    beam: int = 4
    bootstrap: int = 1000
    seed: int = 1
    check_cpu_sentences: int = 40  # greedy GPU vs CPU agreement of the best document model (0: skip)
    contrastive_docs: int = 145  # documents of the toy contrastive suite (0: skip the sanity line)
    train_docs: int = 0  # per domain, the first N training documents (0: all; rehearsals)
    domains: list = field(default_factory=lambda: list(DOMAINS))
    pretrain_lines: int = 0  # the last N pre-training pairs (0: all; rehearsals)

    def __post_init__(self) -> None:
        if self.smoke:  # toy evaluation sizes beside SMOKE's toy shapes
            self.test_sentences, self.ablation_sentences, self.bootstrap = 12, 8, 50
            self.check_cpu_sentences, self.contrastive_docs = 4, 4


Record = Callable[..., dict]


def run(opt: Options, record: Record) -> None:
    """The whole recipe; every measurement goes to ``record(**row)`` as soon as it is taken."""
    deadline = time.time() + 60 * opt.minutes
    data = prepare(opt, record)
    trained: dict[str, str] = {}  # system -> checkpoint
    share = sum(s[3] for s in SYSTEMS if s[0] in opt.systems)
    for name, config, which, part in SYSTEMS:
        if name not in opt.systems:
            continue
        if name != "sentence" and "sentence" not in trained:
            record(system=name, skipped="needs the pre-trained sentence model")
            continue
        minutes = opt.minutes * TRAIN_SHARE * part / share
        if time.time() + 60 * minutes > deadline:
            record(system=name, skipped=f"out of time ({(deadline - time.time()) / 60:.1f} min left)")
            continue
        trained[name] = train(opt, name, config, which, data, trained.get("sentence"), minutes, record)
    evaluate(opt, trained, data, record, deadline)
    check_cpu(opt, trained, data, record, deadline)


# ----------------------------------------------------------------------------- data


def write_docs(path: str, docs: Docs) -> str:
    """Documents one sentence a line, a blank line between documents."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    return path


def pair(data: str, split: str, domain: str) -> tuple[Docs, Docs]:
    """A docmt-en-de split's (source, reference) documents, read as training reads them (misaligned
    files are a one-line error naming the line)."""
    from onmt_doc.data.corpus import read_parallel

    prefix = os.path.join(data, "docmt-en-de", f"{domain}.{split}")
    docs = read_parallel(prefix + ".en", prefix + ".de", documents=True)
    return [[s for s, _ in d] for d in docs], [[t for _, t in d] for d in docs]


def first_sentences(docs: tuple[Docs, Docs], limit: int) -> tuple[Docs, Docs]:
    """Whole documents from the start, up to ``limit`` sentences (at least one document; 0: all)."""
    if not limit:
        return docs
    n, total = 0, 0
    while n < len(docs[0]) and (n == 0 or total + len(docs[0][n]) <= limit):
        total += len(docs[0][n])
        n += 1
    return docs[0][:n], docs[1][:n]


def prepare(opt: Options, record: Record) -> dict:
    """Training, validation and pre-training files under ``OUT/data``; test and ablation documents in memory."""
    work = os.path.join(opt.out, "data")
    os.makedirs(work, exist_ok=True)
    train, valid = {"en": [], "de": []}, {"en": [], "de": []}
    test, ablation = {}, {}
    for domain in opt.domains:
        src, tgt = pair(opt.data, "dev", domain)
        keep = len(src) - opt.held_out_docs
        if keep < 1:
            raise SystemExit(
                f"error: docmt-en-de/{domain}.dev has {len(src)} documents; --held_out_docs is {opt.held_out_docs}"
            )
        first = min(keep, opt.train_docs) if opt.train_docs else keep
        for side, docs in (("en", src), ("de", tgt)):
            train[side] += docs[:first]
            valid[side] += docs[keep:]
        test[domain] = first_sentences(pair(opt.data, "test", domain), opt.test_sentences)
        ablation[domain] = first_sentences(test[domain], opt.ablation_sentences)
    paths: dict = {"test": test, "ablation": ablation}
    for side in ("en", "de"):
        paths[f"doc.{side}"] = write_docs(os.path.join(work, f"train.{side}"), train[side])
        paths[f"valid.{side}"] = write_docs(os.path.join(work, f"valid.{side}"), valid[side])
        lines = []
        for rel in (f"multi30k-en-de/train.{side}", f"news-sent-en-de/newstest2008-2013.{side}"):
            with open(os.path.join(opt.data, rel), encoding="utf-8") as f:
                lines += [line for line in f if line.strip()]
        lines += [s + "\n" for d in train[side] for s in d]
        lines = lines[-opt.pretrain_lines :] if opt.pretrain_lines else lines
        paths[f"pretrain.{side}"] = os.path.join(work, f"pretrain.{side}")
        with open(paths[f"pretrain.{side}"], "w", encoding="utf-8") as f:
            f.writelines(lines)
    record(data="docmt-en-de", train_docs=len(train["en"]), train_sentences=sum(map(len, train["en"])),
           valid_docs=len(valid["en"]), pretrain_pairs=len(lines),
           test_sentences={d: sum(map(len, test[d][0])) for d in opt.domains})  # fmt: skip
    return paths


# ----------------------------------------------------------------------------- training


def merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in key by key (nested mappings merged, the rest replaced)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def system_config(
    opt: Options, name: str, config: str, which: str, data: dict, init: Optional[str], minutes: float
) -> dict:
    """The system's config file with this run's paths, budget and device (and toy shapes with --smoke)."""
    with open(os.path.join(HERE, "configs", config), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw["data"]["train"] = {"src": data[f"{which}.en"], "tgt": data[f"{which}.de"]}
    raw["data"]["valid"] = {"src": data["valid.en"], "tgt": data["valid.de"]}
    raw["log"]["dir"] = os.path.join(opt.out, name)
    raw["train"].update(max_minutes=minutes, device=opt.device, init_from=init)
    if opt.smoke:
        raw = merge(raw, SMOKE)
        raw["train"]["max_minutes"] = None
        for part in ("encoder", "decoder"):
            raw["model"][part].update(SMOKE_LAYERS.get((name, part), {}))
    return raw


def train(
    opt: Options, name: str, config: str, which: str, data: dict, init: Optional[str], minutes: float, record: Record
) -> str:
    """Train one system (its vocabulary the pre-trained model's), record its curve; its best checkpoint."""
    from onmt_doc.config import config_from_dict
    from onmt_doc.train.trainer import train as train_run

    run_dir = os.path.join(opt.out, name)
    if init:  # the same subwords as the model it starts from (init_from checks it)
        os.makedirs(run_dir, exist_ok=True)
        for f in ("subword.model", "vocab.txt"):
            src = os.path.join(os.path.dirname(os.path.dirname(init)), f)
            with open(src, "rb") as a, open(os.path.join(run_dir, f), "wb") as b:
                b.write(a.read())
    raw = system_config(opt, name, config, which, data, init, minutes)
    t0 = time.time()
    train_run(config_from_dict(raw, source=os.path.join(HERE, "configs", config)))
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8")]
    trains, valids = [r for r in rows if r["event"] == "train"], [r for r in rows if r["event"] == "valid"]
    seconds = sum(r["seconds"] for r in trains)
    record(system=name, step="train", steps=trains[-1]["step"] if trains else 0, train_s=seconds,
           wall_s=time.time() - t0, words_per_s=sum(r.get("words", 0) for r in trains) / max(seconds, 1e-9),
           last_train_loss=trains[-1]["loss"] if trains else None,
           best_valid_loss=min((r["loss"] for r in valids), default=None))  # fmt: skip
    for r in valids:  # the curve: did it stop learning or run out of budget? (and, with CXMI, start reading context?)
        record(system=name, curve="valid", at_step=r["step"], valid_loss=r["loss"], valid_ppl=r.get("ppl"),
               valid_cxmi=r.get("cxmi"))  # fmt: skip
    best = os.path.join(run_dir, "checkpoints", "best.pt")
    return best if os.path.exists(best) else os.path.join(run_dir, "checkpoints", "last.pt")


# ----------------------------------------------------------------------------- evaluation


def ablated(docs: tuple[Docs, Docs], condition: str, seed: int) -> tuple[Docs, Docs]:
    """The (source, reference) documents with their true context, none (each sentence alone) or
    shuffled (the same document lengths filled with a random permutation of all sentences); every
    condition holds the same sentences, so their scores compare."""
    src, ref = docs
    if condition == "true":
        return src, ref
    pairs = [(s, r) for ds, dr in zip(src, ref) for s, r in zip(ds, dr)]
    if condition == "none":
        return [[s] for s, _ in pairs], [[r] for _, r in pairs]
    random.Random(seed).shuffle(pairs)
    out_s, out_r, i = [], [], 0
    for d in src:
        out_s.append([s for s, _ in pairs[i : i + len(d)]])
        out_r.append([r for _, r in pairs[i : i + len(d)]])
        i += len(d)
    return out_s, out_r


def ablation_docs(data: dict, domains: list) -> tuple[Docs, Docs]:
    """The ablation documents of every domain, one list of sources and one of references."""
    return [d for dom in domains for d in data["ablation"][dom][0]], [
        d for dom in domains for d in data["ablation"][dom][1]
    ]


def evaluate(opt: Options, trained: dict, data: dict, record: Record, deadline: float) -> None:
    """Every trained system (``trained``: system -> checkpoint, in SYSTEMS' order) in phases, the table's
    core first, so a run its budget cuts off still has the main table whole: test BLEU of every system,
    then for the baseline and the document systems the context ablation, CXMI and the toy suite (system
    by system, the G-Transformer's ablation alone outlasted the budget of the systems after it)."""
    from onmt_doc import Translator

    translators = {name: Translator.load(ckpt, device=opt.device, beam=opt.beam) for name, ckpt in trained.items()}
    for name, translator in translators.items():
        test_bleu(opt, name, translator, data, record, deadline)
    readers = [name for name in translators if name in DOCUMENT_SYSTEMS or name == "sentence_ft"]
    for name in readers:
        context_ablation(opt, name, translators[name], data, record, deadline)
    for name in readers:
        context_cxmi(opt, name, translators[name], data, record, deadline)
    for name in readers:
        contrastive_sanity(opt, name, translators[name], record, deadline)


def test_bleu(opt: Options, name: str, translator: Translator, data: dict, record: Record, deadline: float) -> None:
    """s-BLEU and d-BLEU per test domain, with 95% intervals over documents."""
    from onmt_doc.evaluation.corpus_metrics import bleu_ci

    for domain in opt.domains:
        if time.time() > deadline:
            record(system=name, domain=domain, skipped="out of time")
            continue
        src, ref = data["test"][domain]
        t0 = time.time()
        hyp = translator.translate(src)
        seconds = time.time() - t0
        s, s_lo, s_hi = bleu_ci(hyp, ref, "sentence", opt.bootstrap, opt.seed)
        d, d_lo, d_hi = bleu_ci(hyp, ref, "document", opt.bootstrap, opt.seed)
        n = sum(map(len, src))
        record(system=name, domain=domain, docs=len(src), sentences=n, s_bleu=s, s_bleu_ci=[s_lo, s_hi],
               d_bleu=d, d_bleu_ci=[d_lo, d_hi], sent_per_s=n / seconds)  # fmt: skip


def context_ablation(
    opt: Options, name: str, translator: Translator, data: dict, record: Record, deadline: float
) -> None:
    """The references' nats per word and the s-BLEU of the translations with the true context, none
    and a shuffled one (:func:`ablated`)."""
    from onmt_doc.evaluation.corpus_metrics import bleu_ci

    docs = ablation_docs(data, opt.domains)
    for condition in ("true", "none", "shuffled"):
        if time.time() > deadline:
            record(system=name, context=condition, skipped="out of time")
            continue
        src, ref = ablated(docs, condition, opt.seed)
        words = sum(len(r.split()) for d in ref for r in d)
        nll = -sum(map(sum, translator.score(src, ref))) / words
        hyp = translator.translate(src)
        s, lo, hi = bleu_ci(hyp, ref, "sentence", opt.bootstrap, opt.seed)
        record(system=name, context=condition, nll_per_word=nll, s_bleu=s, s_bleu_ci=[lo, hi])


def context_cxmi(opt: Options, name: str, translator: Translator, data: dict, record: Record, deadline: float) -> None:
    """CXMI on the ablation documents (Fernandes et al., 2021): 0 exactly for a sentence model."""
    from onmt_doc.evaluation.cxmi import cxmi

    if time.time() > deadline:
        record(system=name, skipped="CXMI: out of time")
        return
    docs = ablation_docs(data, opt.domains)
    result = cxmi(translator, [list(zip(s, r)) for s, r in zip(*docs)], top_tokens=5)
    record(system=name, cxmi=result["cxmi"], cxmi_tokens=result["tokens"],
           top_tokens=[t["token"] for t in result["top_tokens"]])  # fmt: skip


def contrastive_sanity(opt: Options, name: str, translator: Translator, record: Record, deadline: float) -> None:
    """The toy contrastive suite (onmt_doc.toy: "it" whose German pronoun the previous sentence's
    subject decides) with its context as given, removed and shuffled: a sanity line, not a result. Its
    words are a toy vocabulary's, so every system scores it out of domain; a model that uses context
    should still rank the right pronoun higher with the context than without, a sentence model
    scores the three alike."""
    from onmt_doc.evaluation.contrastive import ABLATIONS, ablate, evaluate_suite, read_suite
    from onmt_doc.toy.contrastive_suite import write_toy_suite

    if not opt.contrastive_docs:
        return
    suite = os.path.join(opt.out, "data", "toy_suite", "test.contrastive.json")
    if not os.path.exists(suite):
        os.makedirs(os.path.dirname(suite), exist_ok=True)
        write_toy_suite(os.path.dirname(suite), seed=opt.seed, test_docs=opt.contrastive_docs)
    for ablation in ABLATIONS:  # "none": nothing ablated
        if time.time() > deadline:
            record(system=name, contrastive=ablation, skipped="out of time")
            continue
        result = evaluate_suite(translator, ablate(read_suite(suite), ablation, seed=opt.seed))
        record(system=name, contrastive=ablation, accuracy=result["accuracy"], items=result["total"])


def check_cpu(opt: Options, trained: dict, data: dict, record: Record, deadline: float) -> None:
    """Greedy translations of the best document model on the training device and on the CPU agree."""
    import torch

    from onmt_doc import Translator

    name = next((n for n in ("g_transformer", "hm_gdc", "k_to_k", "k_to_1") if n in trained), None)
    if not name or not opt.check_cpu_sentences or time.time() > deadline:
        return
    on_cuda = opt.device.startswith("cuda") or (opt.device == "auto" and torch.cuda.is_available())
    src, _ = first_sentences(data["test"][opt.domains[0]], opt.check_cpu_sentences)
    outs = {}
    for device in ("cuda", "cpu") if on_cuda else ("cpu",):
        outs[device] = [h for d in Translator.load(trained[name], device=device, beam=1).translate(src) for h in d]
    cpu = outs["cpu"]
    other = outs.get("cuda", cpu)
    same = sum(a == b for a, b in zip(other, cpu))
    record(system=name, check="greedy on the training device vs the CPU", devices=list(outs), sentences=len(cpu),
           identical=same)  # fmt: skip
    export_check(opt, trained, src, record)


def export_check(opt: Options, trained: dict, src: Docs, record: Record) -> None:
    """The concatenation models export to CTranslate2 (the G-Transformer and HM-GDC do not): greedy
    translations of the export against onmt_doc's own, on the CPU (skipped without ctranslate2)."""
    import importlib.util

    from onmt_doc import Translator
    from onmt_doc.export.ctranslate2 import export_ctranslate2

    name = next((n for n in ("k_to_k", "k_to_1") if n in trained), None)
    if name is None:
        return
    if importlib.util.find_spec("ctranslate2") is None:
        record(system=name, check="CTranslate2 export", skipped="ctranslate2 is not installed")
        return
    folder = os.path.join(opt.out, name, "ctranslate2")
    export_ctranslate2(trained[name], folder, force=True)
    ours = [h for d in Translator.load(trained[name], device="cpu", beam=1).translate(src) for h in d]
    theirs = [h for d in Translator.load(folder, device="cpu", engine="ctranslate2", beam=1).translate(src) for h in d]
    record(system=name, check="CTranslate2 export, greedy, vs onmt_doc (CPU)", devices=["cpu"], sentences=len(ours),
           identical=sum(a == b for a, b in zip(ours, theirs)))  # fmt: skip


# ----------------------------------------------------------------------------- the command


def table(rows: list[dict]) -> str:
    """The Markdown summary of a run's records (rewritten after every record)."""
    out = ["| system | domain | s-BLEU [95% CI] | d-BLEU [95% CI] | sentences/s |", "|---|---|---|---|---|"]
    for r in rows:
        if "s_bleu_ci" in r and "domain" in r:
            out.append(f"| {r['system']} | {r['domain']} | {r['s_bleu']:.2f} [{r['s_bleu_ci'][0]:.2f}, "
                       f"{r['s_bleu_ci'][1]:.2f}] | {r['d_bleu']:.2f} [{r['d_bleu_ci'][0]:.2f}, "
                       f"{r['d_bleu_ci'][1]:.2f}] | {r['sent_per_s']:.1f} |")  # fmt: skip
    out += ["", "| system | context | nats/word | s-BLEU [95% CI] |", "|---|---|---|---|"]
    for r in rows:
        if "context" in r and "nll_per_word" in r:
            out.append(f"| {r['system']} | {r['context']} | {r['nll_per_word']:.3f} | {r['s_bleu']:.2f} "
                       f"[{r['s_bleu_ci'][0]:.2f}, {r['s_bleu_ci'][1]:.2f}] |")  # fmt: skip
    out += ["", "| system | CXMI (nats/token) |", "|---|---|"]
    out += [f"| {r['system']} | {r['cxmi']:.4f} |" for r in rows if "cxmi" in r]
    out += ["", "| system | toy suite: context | pronoun accuracy % | items |", "|---|---|---|---|"]
    out += [f"| {r['system']} | {CONTRASTIVE_NAMES[r['contrastive']]} | {r['accuracy']:.1f} | {r['items']} |"
            for r in rows if "contrastive" in r and "accuracy" in r]  # fmt: skip
    return "\n".join(out) + "\n"


def import_toolkit() -> Optional[str]:
    """None once ``onmt_doc`` imports, from this checkout when it is not installed (the recipe lives in
    the repository, two folders down); else why not, in one line."""
    root = os.path.dirname(os.path.dirname(HERE))
    if importlib.util.find_spec("onmt_doc") is None and os.path.isdir(os.path.join(root, "onmt_doc")):
        sys.path.insert(0, root)
    try:
        import pyonmttok  # noqa: F401
        import sacrebleu  # noqa: F401

        import onmt_doc.train.reporting  # noqa: F401  (torch and the rest of what the recipe needs)
    except ImportError as e:
        return f"cannot import onmt_doc ({e}): install it first, `pip install -r requirements.txt -e .`"
    return None


def main(argv: Optional[list[str]] = None) -> int:
    """Run the recipe into ``--out`` (results.jsonl, table.md, one run folder per system)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", required=True, help="the folder holding docmt-en-de/, multi30k-en-de/, news-sent-en-de/")
    p.add_argument("--out", required=True, help="a new or empty folder, or one this recipe wrote before")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--minutes", type=float, default=10.0, help="the whole run's budget (default 10)")
    p.add_argument("--smoke", action="store_true", help="toy shapes and a few steps: checks the recipe runs (CPU)")
    p.add_argument("--systems", nargs="+", default=[s[0] for s in SYSTEMS], choices=[s[0] for s in SYSTEMS])
    p.add_argument("--test_sentences", type=int, default=600, help="per domain, whole documents (0: all)")
    p.add_argument("--ablation_sentences", type=int, default=300, help="per domain (0: all)")
    a = p.parse_args(argv)
    if not 0 < a.minutes <= MAX_MINUTES:  # nan and inf included
        print(f"error: --minutes {a.minutes}: must be in (0, {MAX_MINUTES}]", file=sys.stderr)
        return 2
    for flag in ("test_sentences", "ablation_sentences"):
        if getattr(a, flag) < 0:
            print(f"error: --{flag} {getattr(a, flag)}: must be 0 (all) or more", file=sys.stderr)
            return 2
    missing = import_toolkit()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    for rel in ("docmt-en-de/ted.dev.en", "multi30k-en-de/train.en", "news-sent-en-de/newstest2008-2013.en"):
        if not os.path.isfile(os.path.join(a.data, rel)):
            print(f"error: --data {a.data}: {rel} not found (see ../shared/data/README.md)", file=sys.stderr)
            return 2
    marker = os.path.join(a.out, ".docmt-recipe")
    if os.path.isdir(a.out) and os.listdir(a.out) and not os.path.exists(marker):
        print(f"error: --out {a.out} holds files this recipe did not write; choose a new folder", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    open(marker, "a").close()
    opt = Options(a.data, a.out, a.device, a.minutes, a.smoke, a.systems, test_sentences=a.test_sentences,
                  ablation_sentences=a.ablation_sentences)  # fmt: skip
    results, rows = os.path.join(a.out, "results.jsonl"), []
    open(results, "w").close()

    def record(**row) -> dict:
        rows.append(row)
        with open(results, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        with open(os.path.join(a.out, "table.md"), "w", encoding="utf-8") as f:
            f.write(table(rows))
        print("[docmt] " + " ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr, flush=True)
        return row

    from onmt_doc.train.reporting import setup_logging

    setup_logging()
    run(opt, record)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
