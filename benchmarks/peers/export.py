"""``ctranslate2``: our checkpoint exported to CTranslate2 (float32, int8) against our own translator
(float32, bfloat16), and the OpenNMT-py model of ``peer_opennmt`` imported into onmt_doc against
``onmt_translate`` of the same checkpoint (BLEU, identical outputs, forced-decoding agreement).

Every translator gets the same beam, batch, length penalty (``avg``; CTranslate2 ``length_penalty 1``)
and length cap; sentences/s are of the translation alone (model loading excluded)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass

from benchmarks.peers import (
    SETUP,
    multi30k,
    peer_venv,
    read_lines,
    scores,
    tokenizer,
    train_ours,
    translate_ours,
    write_lines,
)
from benchmarks.stages.training import checkpoint
from benchmarks.suite.stage import StageContext, stage


@dataclass
class ExportParams:
    system: str  # trained here when the ``run`` stage left no checkpoint of it
    run: str = "peer_opennmt"  # the stage whose work folder holds onmt_doc/ and onmt_py/
    steps: int = 1000  # of the fallback training, and the OpenNMT-py checkpoint model_step_N.pt
    train_lines: int = 0
    test_lines: int = 0
    beam: int = 4
    tbatch: int = 32
    max_length: int = 100
    threads: int = 2
    agreement_sentences: int = 100  # forced decoding by OpenNMT-py and by the imported model
    venv: str = ""


@stage("ctranslate2", ExportParams)
def ctranslate2_stage(p: ExportParams, ctx: StageContext) -> None:
    """Export and translate; then the import part when ``peer_opennmt`` left an OpenNMT-py model."""
    import torch

    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        ctx.record(skipped=f"ctranslate2 is not installed: pip install 'ctranslate2>=4,<5' (or {SETUP})")
        return
    torch.set_num_threads(p.threads)
    data = multi30k(ctx, p.train_lines, p.test_lines)
    ours_dir = os.path.join(ctx.out, p.run, "onmt_doc")
    if not os.path.exists(checkpoint(ours_dir)):
        ours_dir = ctx.work_dir("onmt_doc")
        ctx.record(what="note", trained_here=p.system, **train_ours(ctx, p.system, data, p.steps, ours_dir))
    ckpt, refs = checkpoint(ours_dir), read_lines(data["test"]["de"])
    opts = {"beam": p.beam, "batch_sentences": p.tbatch, "length_penalty_type": "avg", "max_length": p.max_length}
    opts["max_len_ratio"] = 100.0
    ours = {}
    for dtype in ("float32", "bfloat16"):
        ours[dtype] = os.path.join(ctx.work_dir(), f"ours_{dtype}.hyp")
        r = translate_ours(ckpt, data, "cpu", ours[dtype], dtype=dtype, **opts)
        ctx.record(what="translate", translator=f"onmt_doc {dtype}", **r)
    for q in ("float32", "int8"):
        model_dir, r = export(ckpt, ctx.work_dir(f"ct2_{q}"), q)
        ctx.record(what="export", quantization=q, **r)
        r = ct2_translate(p, model_dir, data, os.path.join(ctx.work_dir(), f"ct2_{q}.hyp"))
        same = sum(a == b for a, b in zip(read_lines(ours["float32"]), read_lines(r.pop("hyp"))))
        ctx.record(what="translate", translator=f"CTranslate2 {q}", identical_to_float32=same, **r)
    venv, peer = peer_venv(p.venv), os.path.join(ctx.out, p.run, "onmt_py", f"model_step_{p.steps}.pt")
    if venv is None or not os.path.exists(peer):
        why = f"OpenNMT-py venv not found: {SETUP}" if venv is None else f"no {p.run} OpenNMT-py checkpoint"
        ctx.record(what="import", skipped=why)
        return
    import_part(p, ctx, venv, peer, os.path.join(ours_dir, "subword.model"), data, refs)


def export(ckpt: str, out: str, quantization: str) -> tuple[str, dict]:
    """``export_ctranslate2`` (what ``onmt_doc_release`` does), timed."""
    from onmt_doc.export.ctranslate2 import export_ctranslate2

    t0 = time.perf_counter()
    export_ctranslate2(ckpt, out, quantization=quantization, force=True)
    return out, {"export_s": time.perf_counter() - t0}


def ct2_translate(p: ExportParams, model_dir: str, data: dict, hyp: str) -> dict:
    """The exported model through CTranslate2's Python API, tokenized and decoded as
    ``onmt_doc_export.json`` says (``translation_options``)."""
    import ctranslate2
    import pyonmttok

    from onmt_doc.export.ctranslate2 import source_tokens, target_words, translation_options

    with open(os.path.join(model_dir, "onmt_doc_export.json"), encoding="utf-8") as f:
        info = json.load(f)["tokenization"]["source"]
    options = {
        k: os.path.join(model_dir, v) if k.endswith("_model_path") else v for k, v in info["pyonmttok_options"].items()
    }
    tok = pyonmttok.Tokenizer(info["pyonmttok_mode"], **options)
    src = [source_tokens(t) for t in tok.tokenize_batch(read_lines(data["test"]["en"]))[0]]
    tr = ctranslate2.Translator(model_dir, device="cpu", inter_threads=1, intra_threads=p.threads)
    opts = {**translation_options(), "max_decoding_length": p.max_length + 1}  # + the <s> prefix
    t0 = time.perf_counter()
    res = tr.translate_batch(
        src, target_prefix=[["<s>"]] * len(src), beam_size=p.beam, max_batch_size=p.tbatch,
        batch_type="examples", length_penalty=1.0, **opts,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    hyps = [tok.detokenize(target_words(r.hypotheses[0])) for r in res]
    write_lines(hyp, hyps)
    row = {"compute_type": tr.compute_type, "sentences": len(src), "translate_s": seconds}
    return {**row, "sent_per_s": len(src) / seconds, **scores(hyps, read_lines(data["test"]["de"])), "hyp": hyp}


def in_venv(venv: str, command: str, log: str, threads: int) -> str:
    """A command in the peers venv (its own torch); its stderr, for the peer's timings."""
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(threads))
    shell = f"source {venv}/bin/activate && {command}"
    res = subprocess.run(["bash", "-c", shell], env=env, capture_output=True, text=True, check=True)
    with open(log, "w", encoding="utf-8") as f:
        f.write(res.stdout + res.stderr)
    return res.stderr


def import_part(p: ExportParams, ctx: StageContext, venv: str, peer: str, subword: str, data: dict, refs: list) -> None:
    """OpenNMT-py's model: ``onmt_translate`` (avg, none), imported (``import_opennmt``, no sentence
    markup) and translated by us with the same settings, and forced-decoding agreement."""
    from onmt_doc.convert.opennmt import import_opennmt

    work, tok = ctx.work_dir("import"), tokenizer(subword)
    tok_src = write_lines(
        os.path.join(work, "test.en"), [" ".join(tok.tokenize(s)[0]) for s in read_lines(data["test"]["en"])]
    )
    tok_tgt = write_lines(os.path.join(work, "test.de"), [" ".join(tok.tokenize(s)[0]) for s in refs])
    imported = os.path.join(work, "imported.pt")
    t0 = time.perf_counter()
    import_opennmt(peer, imported, subword, force=True)
    ctx.record(what="import", import_s=time.perf_counter() - t0)
    ctx.record(what="agreement", **agreement(p, venv, peer, imported, tok_src, tok_tgt, work))
    for pen in ("avg", "none"):
        hyp = os.path.join(work, f"onmt_{pen}.hyp")
        err = in_venv(
            venv,
            f"onmt_translate -model {peer} -src {tok_src} -output {hyp} -beam_size {p.beam} -batch_size {p.tbatch} "
            f"-batch_type sents -max_length {p.max_length} -length_penalty {pen} -report_time",
            hyp + ".log",
            p.threads,
        )
        theirs = [tok.detokenize(line.split()) for line in read_lines(hyp)]
        m = re.search(r"Total translation time \(s\): ([\d.]+)", err)
        t = float(m.group(1)) if m else float("nan")
        ctx.record(what="translate", translator=f"OpenNMT-py onmt_translate ({pen})", translate_s=t,
                   sentences=len(refs), sent_per_s=len(refs) / t, **scores(theirs, refs))  # fmt: skip
        out = os.path.join(work, f"imported_{pen}.hyp")
        opts = {"beam": p.beam, "batch_sentences": p.tbatch, "length_penalty_type": pen, "max_length": p.max_length}
        r = translate_ours(imported, data, "cpu", out, max_len_ratio=100.0, **opts)
        same = sum(a == b for a, b in zip(theirs, read_lines(out)))
        ctx.record(what="import", length_penalty=pen, onmt_bleu=scores(theirs, refs)["bleu"], imported_bleu=r["bleu"],
                   identical=same, sentences=len(refs))  # fmt: skip


def agreement(p: ExportParams, venv: str, peer: str, imported: str, src: str, tgt: str, work: str) -> dict:
    """The largest |difference| of a token log-probability between OpenNMT-py's own forced decoding
    and the imported model's, on OpenNMT-py's sequences (no markup; its ``</s>`` is our ``<eos>``)."""
    import numpy as np
    import torch

    from onmt_doc.data.batching import collate
    from onmt_doc.data.mapped import build_instances
    from onmt_doc.models.checkpoint import load_model
    from onmt_doc.models.model import full_log_probs

    n, out = min(p.agreement_sentences, len(read_lines(src))), os.path.join(work, "onmt_scores.json")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onmt_scores.py")
    in_venv(venv, f"python {script} {peer} {src} {tgt} {n} {out}", out + ".log", p.threads)
    with open(out, encoding="utf-8") as f:
        theirs = json.load(f)
    model, _, codec = load_model(imported)
    pairs = [(np.array(codec.src_vocab.ids(s.split())), np.array(codec.tgt_vocab.ids(t.split())))
             for s, t in zip(read_lines(src)[:n], read_lines(tgt)[:n])]  # fmt: skip
    worst, eos = 0.0, codec.tgt_vocab.stoi["<eos>"]
    with torch.no_grad():
        for i in range(0, n, 20):
            examples, _ = build_instances("sentence", [pairs[i : i + 20]], sentence_markup=False)
            lp = full_log_probs(model, collate(examples))
            for row, k in enumerate(range(i, min(i + 20, n))):
                ids = [*pairs[k][1], eos]
                got = lp[row, torch.arange(len(ids)), torch.tensor(ids)].numpy()
                worst = max(worst, float(np.abs(got - np.array(theirs[k])).max()))
    return {"sentences": n, "max_abs_diff": worst}
