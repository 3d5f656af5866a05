"""Quality stages: systems trained through the library, then translated and scored.

``train_translate`` trains the listed systems in order on one corpus (``toy``: the project's toy
corpus, whose pronouns depend on the previous sentence; ``multi30k``: Multi30k en→de, test2016),
every system sharing the first one's subword model and vocabulary (so ``init_from`` can copy
parameters and rows compare models, not vocabularies). Each system is scored as soon as it is
trained: BLEU, chrF and d-BLEU of its beam translation of the test set, and as the spec asks,

- ``pronouns``: the toy corpus's context-dependent pronouns (``onmt_doc.toy.pronoun_scoring``),
  which a sentence model can only guess (about 1/3);
- ``contrastive``: the toy contrastive suite with the context as given, removed and another
  document's (``onmt_doc.evaluation.contrastive``), with the APT-style pronoun accuracy and the
  lexical consistency of the translation (``document_metrics.translation_metrics``);
  ``contrastive_speed``: items/s and peak memory of a ContraPro-size suite, streamed;
- ``gates``: the PMI tables of the training corpus (and of ``pmi_concat_pairs`` pairs of every
  en→de set, a counting benchmark) before training, which ``pmi_gate_hinge`` losses read, then the
  context-selection analysis (FER, CER, CE/FE, gate statistics) of every system under both
  normalisers of z* (``onmt_doc.evaluation.gate_analysis``);
- ``decodings``: a trained system translated again with other translate options (k-to-k with
  ``force_context_prefix``).

``long_documents``: milliseconds per sentence when one document grows (random-weight models: the
cost of decoding does not depend on what the weights learned), so windowed translation shows flat.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from dataclasses import dataclass, field

from benchmarks.stages.training import checkpoint, free_memory, share_vocab, system_config, train_system
from benchmarks.suite.stage import StageContext, rss_mib, stage
from benchmarks.suite.text_files import read_docs, write_docs

Docs = list[list[str]]
CONCAT_SETS = [f"multi30k-en-de/{n}" for n in ("train", "valid", "test2016")] + ["news-sent-en-de/newstest2008-2013"]
CONCAT_SETS += [f"docmt-en-de/{d}.{s}" for d in ("ted", "news", "europarl") for s in ("dev", "test")]
CONCAT_SETS += [f"iwslt14-ted-de-en/{n}" for n in ("dev2010", "tst2010", "tst2011", "tst2012")]


@dataclass
class TrainTranslateParams:
    systems: list  # trained and scored in this order; a system's init_from must come before it
    corpus: str = "toy"  # toy | multi30k
    toy_docs: list = field(default_factory=lambda: [5000, 145, 145])  # train, valid, test documents (seed 1)
    train_lines: int = 0  # multi30k: the first N training pairs (0: all)
    valid_lines: int = 0  # multi30k: the first N validation pairs (0: all)
    test_lines: int = 0  # multi30k: the first N test2016 sentences (0: all)
    beam: int = 4
    pronouns: bool = False
    contrastive: bool = False
    cxmi: bool = False  # CXMI of each system on the test documents (onmt_doc.evaluation.cxmi)
    contrastive_speed: list = field(default_factory=list)  # systems timed on the ContraPro-size suite
    speed_items: int = 12000
    gates: bool = False
    pmi_concat_pairs: int = 0  # 0: count the training corpus only
    decodings: dict = field(default_factory=dict)  # name -> {system: S, options: {translate key: value}}
    stream: list = field(default_factory=list)  # systems timed line by line (Translator.translate_stream)
    stream_lines: int = 400  # test lines streamed (whole documents, in order)
    ctranslate2: list = field(default_factory=list)  # systems also exported and translated by CTranslate2


@stage("train_translate", TrainTranslateParams)
def train_translate(p: TrainTranslateParams, ctx: StageContext) -> None:
    """Train every system, scoring each (and its decodings) as soon as it is trained; a re-run starts
    from scratch (a run folder with a checkpoint would resume, or refuse to)."""
    shutil.rmtree(os.path.join(ctx.out, ctx.name), ignore_errors=True)
    data = prepare(p, ctx)
    first = ctx.work_dir(p.systems[0])
    if p.gates:
        data["pmi"] = count_pmi(p, ctx, data, first)
    for name in p.systems:
        if ctx.seconds_left() < 30:
            ctx.record(system=name, skipped="the stage's budget is spent")
            continue
        try:
            run_dir = train_one(ctx, name, data, first)
            evaluate(p, ctx, name, checkpoint(run_dir), data, {})
            for dec, d in p.decodings.items():
                if d["system"] == name:
                    evaluate(p, ctx, dec, checkpoint(run_dir), data, d.get("options", {}))
        except Exception as e:  # one system's failure must not cost the others their numbers
            ctx.record(system=name, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
            free_memory()


def train_one(ctx: StageContext, name: str, data: dict, first: str) -> str:
    """Train one system (vocabulary of the first, init_from, the PMI table its losses read)."""
    system, run_dir = ctx.systems[name], ctx.work_dir(name)
    if run_dir != first:
        share_vocab(first, run_dir)
    init = {"train": {"init_from": checkpoint(ctx.work_dir(system.init_from))}} if system.init_from else {}
    raw = system_config(ctx, system, data["layer"], init, {"log": {"dir": run_dir}})
    for loss in raw.get("loss", []):
        if loss.get("type") == "pmi_gate_hinge":
            loss["table"] = data["pmi"]
    ctx.record(system=name, step="train", **train_system(ctx, raw))
    return run_dir


def prepare(p: TrainTranslateParams, ctx: StageContext) -> dict:
    """The corpus's files, the ``data:`` layer of every system and the test documents."""
    if p.corpus == "toy":
        from onmt_doc.toy.corpus import write_corpus

        d = ctx.work_dir("data")
        write_corpus(d, seed=1, train_docs=p.toy_docs[0], valid_docs=p.toy_docs[1], test_docs=p.toy_docs[2])
        f = {s: (os.path.join(d, f"{s}.src"), os.path.join(d, f"{s}.tgt")) for s in ("train", "valid", "test")}
        src, ref = read_docs(f["test"][0]), read_docs(f["test"][1])
    elif p.corpus == "multi30k":
        m = os.path.join(ctx.data, "multi30k-en-de")
        f = {s: (os.path.join(m, f"{s}.en"), os.path.join(m, f"{s}.de")) for s in ("train", "valid", "test2016")}
        f["train"] = tuple(head(path, p.train_lines, ctx.work_dir("data")) for path in f["train"])
        f["valid"] = tuple(head(path, p.valid_lines, ctx.work_dir("data")) for path in f["valid"])
        f["test"] = tuple(head(path, p.test_lines, ctx.work_dir("data")) for path in f.pop("test2016"))
        src, ref = ([[line] for line in read_docs(path)[0]] for path in f["test"])
    else:
        raise ValueError(f"corpus: expected toy or multi30k, got {p.corpus!r}")
    split = {s: {"src": f[s][0], "tgt": f[s][1]} for s in ("train", "valid")}
    return {"files": f, "layer": {"data": split}, "src": src, "ref": ref, "dir": os.path.dirname(f["test"][0])}


def head(path: str, lines: int, out: str) -> str:
    """``path``, or a copy of its first ``lines`` lines under ``out`` (0: the file itself)."""
    if not lines:
        return path
    short = os.path.join(out, f"{os.path.basename(path)}.{lines}")
    with open(path, encoding="utf-8") as f, open(short, "w", encoding="utf-8") as g:
        g.writelines(line for _, line in zip(range(lines), f))
    return short


def evaluate(p: TrainTranslateParams, ctx: StageContext, name: str, ckpt: str, data: dict, options: dict) -> None:
    """Translate the test documents and record the scores the spec asks for."""
    from onmt_doc import Translator
    from onmt_doc.evaluation.corpus_metrics import report

    tr = Translator.load(ckpt, device=ctx.device, beam=p.beam, **options)
    t0 = time.time()
    hyp = tr.translate(data["src"])
    seconds, n = time.time() - t0, sum(map(len, data["src"]))
    row = {"system": name, **report(hyp, data["ref"], documents=True), "sentences": n, "translate_s": seconds}
    row.update(sent_per_s=n / seconds, params_m=sum(t.numel() for t in tr.model.parameters()) / 1e6)
    if p.pronouns:
        from onmt_doc.toy.pronoun_scoring import score_context

        found = score_context(write_docs(ctx.work_dir(name, "out") + "/test.hyp", hyp), data["dir"] + "/test.ctx")
        row.update(pronoun_acc=100 * found["accuracy"], pronouns=found["total"])
    ctx.record(**row)
    if p.contrastive:
        contrastive(p, ctx, tr, name, hyp, data)
    if p.cxmi:
        context_usage(ctx, tr, name, data)
    if p.gates:
        gates(ctx, tr, name, data)
    if name in p.contrastive_speed:
        contrastive_speed(p, ctx, tr, name)
    if name in p.stream:
        stream_latency(p, ctx, tr, name, data)
    if name in p.ctranslate2 and not options:
        through_ctranslate2(p, ctx, name, ckpt, data, hyp, seconds)
    del tr
    free_memory()


def stream_latency(p: TrainTranslateParams, ctx: StageContext, tr, name: str, data: dict) -> None:
    """Per-line latency of ``translate_stream`` (``onmt_doc_translate -stream``): whole test documents
    in order, up to ``stream_lines`` lines, each translated with its document's earlier lines and
    translations as context; the time from a line given to its translation returned."""
    lines: list[str] = []
    for doc in data["src"]:
        if len(lines) + len(doc) > p.stream_lines and lines:
            break
        lines += [*doc, ""]
    latencies, given = [], [0.0]

    def timed():
        for line in lines:
            given[0] = time.perf_counter()
            yield line

    t0 = time.time()
    for out in tr.translate_stream(timed()):
        if out:
            latencies.append(1000 * (time.perf_counter() - given[0]))
    seconds = time.time() - t0
    ms = sorted(latencies)
    ctx.record(
        system=name,
        stream_lines=len(ms),
        stream_sent_per_s=len(ms) / seconds,
        latency_mean_ms=sum(ms) / len(ms),
        latency_p50_ms=ms[len(ms) // 2],
        latency_p95_ms=ms[min(len(ms) - 1, int(0.95 * len(ms)))],
        context_read="+".join(tr.context_sides()) or "none",
    )


def through_ctranslate2(
    p: TrainTranslateParams, ctx: StageContext, name: str, ckpt: str, data: dict, hyp: Docs, seconds: float
) -> None:
    """The checkpoint exported (``onmt_doc_release``, float32) and the test documents translated by
    CTranslate2 (``engine="ctranslate2"``, same beam, threads and batches): sentences/s against
    onmt_doc's own search of the same checkpoint, and how many outputs are identical."""
    from onmt_doc import Translator
    from onmt_doc.evaluation.corpus_metrics import report
    from onmt_doc.export.ctranslate2 import export_ctranslate2

    folder = ctx.work_dir(name, "ct2")
    export_ctranslate2(ckpt, folder, force=True)
    tr = Translator.load(folder, device=ctx.device, engine="ctranslate2", beam=p.beam)
    t0 = time.time()
    out = tr.translate(data["src"])
    ct2_s, n = time.time() - t0, sum(map(len, data["src"]))
    same = sum(a == b for d, e in zip(out, hyp) for a, b in zip(d, e))
    ctx.record(
        system=f"{name} (CTranslate2)",
        **report(out, data["ref"], documents=True),
        sentences=n,
        translate_s=ct2_s,
        sent_per_s=n / ct2_s,
        speedup=seconds / ct2_s,
        identical=same / n,
    )


def contrastive(p: TrainTranslateParams, ctx: StageContext, tr, name: str, hyp: Docs, data: dict) -> None:
    """The toy suite under each context ablation, and the translation's document metrics."""
    from onmt_doc.evaluation.contrastive import ABLATIONS, ablate, evaluate_suite, read_suite
    from onmt_doc.evaluation.document_metrics import pronoun_list, translation_metrics
    from onmt_doc.toy.contrastive_suite import write_toy_suite

    suite = os.path.join(data["dir"], "test.contrastive.json")
    if not os.path.exists(suite):
        write_toy_suite(data["dir"], seed=1, test_docs=p.toy_docs[2])
    acc = {f"contrastive_{m}": evaluate_suite(tr, ablate(read_suite(suite), m)) for m in ABLATIONS}
    t = translation_metrics(data["src"], hyp, data["ref"], pronoun_list("de"))
    ctx.record(
        system=name,
        **{k: v["accuracy"] for k, v in acc.items()},
        items=acc["contrastive_none"]["total"],
        apt_pronoun_acc=t["pronouns"]["accuracy"],
        consistency=t["consistency"]["consistency"],
        consistency_reference=t["consistency_reference"]["consistency"],
        repeated_terms=t["consistency"]["repeated_terms"],
    )


def context_usage(ctx: StageContext, tr, name: str, data: dict, top: int = 5) -> None:
    """CXMI over the test documents with their reference context (nats per target token), and the
    tokens of largest mean point-wise CXMI."""
    from onmt_doc.evaluation.cxmi import cxmi

    t0 = time.time()
    docs = ([*zip(s, r)] for s, r in zip(data["src"], data["ref"]))
    res = cxmi(tr, docs, top_tokens=top)
    top_tokens = ", ".join(f"{t['token']} {t['p_cxmi']:.2f}" for t in res["top_tokens"])
    ctx.record(system=name, cxmi=res["cxmi"], cxmi_all=res["cxmi_all"], cxmi_tokens=res["tokens"],
               cxmi_top=top_tokens, cxmi_s=time.time() - t0)  # fmt: skip


def contrastive_speed(p: TrainTranslateParams, ctx: StageContext, tr, name: str) -> None:
    """Scoring speed and memory on ``speed_items`` toy items with 1-3 context sentences (ContraPro's
    12,000 items of 3 candidates), streamed from a JSON Lines file."""
    import json

    from onmt_doc.evaluation.contrastive import evaluate_suite, read_suite
    from onmt_doc.toy.contrastive_suite import toy_items
    from onmt_doc.toy.corpus import generate_documents

    path = os.path.join(ctx.work_dir(), "speed_suite.jsonl")
    if not os.path.exists(path):
        base = [i for i in toy_items(generate_documents(400, seed=7, split="test")) if len(i["context_src"]) <= 3]
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(base[n % len(base)]) + "\n" for n in range(p.speed_items))
    rss = rss_mib(reset=True)
    t0 = time.time()
    res = evaluate_suite(tr, read_suite(path))
    seconds = time.time() - t0
    peak = rss_mib("VmHWM")
    ctx.record(system=name, speed_items=res["total"], seconds=seconds, items_per_s=res["total"] / seconds,
               peak_rss_mib=peak, rss_added_mib=peak - rss if peak and rss else None)  # fmt: skip


def count_pmi(p: TrainTranslateParams, ctx: StageContext, data: dict, first: str) -> str:
    """Learn the first system's codec, count the training corpus's PMI table (and the concatenation's):
    time, peak memory, pairs, sizes, the share of z* = 1 per normaliser. Returns the table's path."""
    from onmt_doc.config import config_from_dict
    from onmt_doc.data.prepare import build_codec

    raw = system_config(ctx, ctx.systems[p.systems[0]], data["layer"], {"log": {"dir": first}})
    cfg = config_from_dict(raw, source=first)
    codec = build_codec(cfg.data, cfg.vocab, first)
    ctx.record(what="pmi", corpus="imports", rss_mib=rss_mib())
    corpora = {"train": data["files"]["train"]}
    if p.pmi_concat_pairs:
        corpora["concat"] = concat(ctx, p.pmi_concat_pairs)
    for name, (src, tgt) in corpora.items():
        pmi_table(ctx, name, src, tgt, codec, cfg)
    return os.path.join(ctx.work_dir(), "pmi_train.npz")


def pmi_table(ctx: StageContext, name: str, src: str, tgt: str, codec, cfg) -> None:
    """One table counted, saved and described (``onmt_doc.data.pmi``, as onmt_doc_build_pmi_table)."""
    from onmt_doc.data.pmi import PMITable, build_table, tokenized_pairs, z_star_share

    path = os.path.join(ctx.work_dir(), f"pmi_{name}.npz")
    rss_mib(reset=True)
    t0 = time.time()
    table = build_table(src, tgt, codec, cfg.data.documents, cfg.data.max_line_chars)
    seconds, peak = time.time() - t0, rss_mib("VmHWM")
    table.save(path)
    row = {"what": "pmi", "corpus": name, "pairs": table.n_pairs, "seconds": seconds, "peak_rss_mib": peak}
    row.update(bilingual_pairs=len(table.bi_keys), monolingual_pairs=len(table.mono_keys))
    for z in ("shared", "per_scenario"):
        pairs = tokenized_pairs(src, tgt, codec, cfg.data.documents, cfg.data.max_line_chars)
        ones, total = z_star_share(PMITable.load(path, codec, z), pairs)
        row[f"z_star_{z}"] = 100 * ones / max(total, 1)
    ctx.record(**row, tgt_subwords_per_sentence=total / max(table.n_pairs, 1), file_mib=os.path.getsize(path) / 2**20)


def concat(ctx: StageContext, limit: int) -> tuple[str, str]:
    """Up to ``limit`` en→de pairs of every shared set (iwslt14 is de→en: read the other way round),
    blank lines dropped, Multi30k train repeated to reach ``limit``."""
    out = os.path.join(ctx.work_dir("data"), "concat")
    sets = CONCAT_SETS + ["multi30k-en-de/train"] * 3
    n = 0
    with open(out + ".en", "w", encoding="utf-8") as fe, open(out + ".de", "w", encoding="utf-8") as fd:
        for name in sets:
            with open(os.path.join(ctx.data, name + ".en"), encoding="utf-8") as a:
                with open(os.path.join(ctx.data, name + ".de"), encoding="utf-8") as b:
                    for s, t in zip(a, b):
                        if s.strip() and t.strip() and n < limit:
                            fe.write(s.strip() + "\n")
                            fd.write(t.strip() + "\n")
                            n += 1
    return out + ".en", out + ".de"


def gates(ctx: StageContext, tr, name: str, data: dict) -> None:
    """FER, CER, CE/FE and the gate statistics on the test set, z* under both normalisers."""
    from onmt_doc.data.pmi import PMITable
    from onmt_doc.evaluation.gate_analysis import analyse_gates

    src, tgt = data["files"]["test"]
    for z in ("shared", "per_scenario"):
        table = PMITable.load(data["pmi"], tr.codec, z)
        res = analyse_gates(tr.model.float(), tr.codec, tr.cfg, src, tgt, table, device=tr.device)
        res.pop("gate_layer_means", None)
        ctx.record(system=name, z_star=z, **res)


# ----------------------------------------------------------------------------- long documents


@dataclass
class LongDocumentsParams:
    models: dict  # name -> model section (encoder, decoder), random weights at d_model
    sizes: list = field(default_factory=lambda: [100, 1000, 10000])  # sentences of the one document
    whole_document: list = field(default_factory=list)  # models also timed with the document as one window
    whole_document_up_to: int = 1000  # ... for sizes up to this (it grows quadratically)
    d_model: int = 64
    words: int = 200  # placeholder vocabulary
    beam: int = 4
    end_bias: float = 0.0  # added to the </s>/<eos> output bias (0: every sentence decodes to its cap)


@stage("long_documents", LongDocumentsParams)
def long_documents(p: LongDocumentsParams, ctx: StageContext) -> None:
    """Per model and size: ms per sentence of ``translate`` on one document of random 5-15-word
    sentences; a size whose projected time exceeds the budget is recorded as skipped."""
    runs = [(name, 0, p.sizes) for name in p.models]
    runs += [(name, 1, [n for n in p.sizes if n <= p.whole_document_up_to]) for name in p.whole_document]
    for name, whole, sizes in runs:
        ms = 0.0
        for n in sizes:
            if ms * n / 1000 > ctx.seconds_left() - 10:
                ctx.record(model=name, whole_document=bool(whole), sentences=n, skipped="over the budget")
                continue
            tr = random_translator(p, p.models[name], window_sentences=n if whole else 0)
            doc = random_document(n, p.words)
            t0 = time.perf_counter()
            out = tr.translate([doc])
            ms = 1000 * (time.perf_counter() - t0) / n
            if len(out[0]) != n or not all(out[0]):
                raise RuntimeError(f"{name}: {n} sentences in, {len(out[0])} out or an empty line")
            ctx.record(model=name, whole_document=bool(whole), sentences=n, ms_per_sentence=ms)


def random_translator(p: LongDocumentsParams, section: dict, window_sentences: int):
    """A seeded random-weight model with the training defaults, as a Translator."""
    import torch

    from benchmarks.stages.speed import placeholder_codec
    from onmt_doc import Translator
    from onmt_doc.config import config_from_dict
    from onmt_doc.data.vocab import EOS_ID, EOS_SENT_ID
    from onmt_doc.models.builder import build_model

    codec = placeholder_codec(p.words)
    torch.manual_seed(0)
    model_section = {"d_model": p.d_model, "dropout": 0.0, "attention_dropout": 0.0, **section}
    translate = {"beam": p.beam, "window_sentences": window_sentences}
    cfg = config_from_dict({"model": model_section, "translate": translate})
    model = build_model(cfg.model, codec).eval()
    with torch.no_grad():
        model.generator.bias[[EOS_SENT_ID, EOS_ID]] += p.end_bias
    return Translator(model, codec, cfg)


def random_document(n: int, words: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(words)}" for _ in range(rng.randint(5, 15))) for _ in range(n)]
