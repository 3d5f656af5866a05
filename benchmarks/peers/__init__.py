"""Peer toolkits on Multi30k en→de: ``peer_opennmt`` (onmt_doc vs OpenNMT-py 3.5.1, same shape, steps,
subwords and batch; CTranslate2 of the OpenNMT-py model as a ceiling) and ``ctranslate2`` (onmt_doc's
CTranslate2 export, and the OpenNMT-py model imported into onmt_doc).

The peers live in their own venv (``bash ../shared/peers/setup_peers.sh``); without it (or without
``ctranslate2``) the stages record ``skipped`` and end, so ``--smoke`` passes everywhere. Our side runs
through the library (``train_system``, ``Translator``, ``export_ctranslate2``, ``import_opennmt``) and
its ``log.metrics_file``; only the peer's output is parsed, because there is no other way to read it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

from benchmarks.stages.training import checkpoint, system_config, train_system
from benchmarks.suite.stage import StageContext, stage
from benchmarks.suite.text_files import read_lines, tokenizer, write_lines

SETUP = "bash ../shared/peers/setup_peers.sh"
MARKUP_TOKENS = 3  # <s> </s> <eos>: what onmt_doc's logged target tokens count on top of the subwords
ONMT_STEP = re.compile(
    r"Step\s+(\d+)/\s*\d+;.*?ppl:\s*([\d.]+);.*?bsz:\s*(\d+)/\s*(\d+)/\s*(\d+);\s*(\d+)/\s*(\d+) tok/s;\s*(\d+) sec"
)


@dataclass
class PeerParams:
    system: str  # our Transformer (a key of the spec's systems); OpenNMT-py gets the same shape
    steps: int = 1000  # training steps of both toolkits
    train_lines: int = 0  # the first N training pairs (0: all 29k)
    test_lines: int = 0  # the first N test2016 sentences (0: all 1000)
    onmt_batch_tokens: int = 2048  # OpenNMT-py batch_size (tokens); ours is the system's batch_tokens
    beam: int = 4
    tbatch: int = 32  # sentences per translation batch
    threads: int = 2
    rounds: int = 2  # timed translations per toolkit, alternating
    bf16: bool = True  # also translate our checkpoint with dtype bfloat16
    venv: str = ""  # the peers venv (default $PEERS_DIR/venv or ~/.cache/onmt-peers/venv)


def peer_venv(venv: str) -> Optional[str]:
    """The peers venv, or None when it is not set up."""
    home = os.environ.get("PEERS_DIR", os.path.expanduser("~/.cache/onmt-peers"))
    path = venv or os.path.join(home, "venv")
    return path if os.path.exists(os.path.join(path, "bin", "onmt_train")) else None


def multi30k(ctx: StageContext, train_lines: int, test_lines: int) -> dict:
    """``{split: {lang: path}}`` of Multi30k (train, valid, test), cut to the first N lines if asked."""
    src_dir, out = os.path.join(ctx.data, "multi30k-en-de"), ctx.work_dir("data")
    paths: dict = {}
    for split, name, limit in (
        ("train", "train", train_lines),
        ("valid", "valid", 0),
        ("test", "test2016", test_lines),
    ):
        paths[split] = {}
        for lang in ("en", "de"):
            lines = read_lines(os.path.join(src_dir, f"{name}.{lang}"))
            paths[split][lang] = write_lines(os.path.join(out, f"{split}.{lang}"), lines[: limit or None])
    return paths


def train_ours(ctx: StageContext, system: str, data: dict, steps: int, run_dir: str) -> dict:
    """Train our system on ``data`` for ``steps`` steps (library API); its metrics summary."""
    layer = {
        "data": {"train": {"src": data["train"]["en"], "tgt": data["train"]["de"]}, "documents": False},
        "train": {"max_steps": steps, "valid_every": steps, "save_every": steps, "keep_last": 1},
        "log": {"dir": run_dir},
    }
    layer["data"]["valid"] = {"src": data["valid"]["en"], "tgt": data["valid"]["de"]}
    return train_system(ctx, system_config(ctx, ctx.systems[system], layer))


def scores(hyps: list[str], refs: list[str]) -> dict:
    """BLEU and chrF as ``onmt_doc_translate -tgt`` computes them (detokenized, sacrebleu)."""
    from onmt_doc.evaluation.corpus_metrics import chrf, s_bleu

    return {"bleu": s_bleu(hyps, refs), "chrf": chrf(hyps, refs)}


def translate_ours(ckpt: str, data: dict, device: str, out: str, **options) -> dict:
    """Translate the test set with the library; seconds of the translation alone (load excluded)."""
    from onmt_doc import Translator

    translator = Translator.load(ckpt, device=device, **options)
    src = read_lines(data["test"]["en"])
    t0 = time.perf_counter()
    hyps = [d[0] for d in translator.translate([[s] for s in src])]
    seconds = time.perf_counter() - t0
    write_lines(out, hyps)
    row = {"sentences": len(src), "translate_s": seconds, "sent_per_s": len(src) / seconds}
    return {**row, **scores(hyps, read_lines(data["test"]["de"]))}


def tokenize_splits(tok, data: dict, out: str) -> float:
    """Write every split tokenized for OpenNMT-py; the mean target subwords per training sentence."""
    lengths: list[int] = []
    for split, langs in data.items():
        for lang, path in langs.items():
            toks = tok.tokenize_batch(read_lines(path))[0]
            write_lines(os.path.join(out, f"{split}.{lang}"), [" ".join(t) for t in toks])
            lengths += [len(t) for t in toks] if (split, lang) == ("train", "de") else []
    return sum(lengths) / len(lengths)


def our_training(metrics: str, mean_tgt: float) -> dict:
    """Steady-state rates of our training from its metrics file (report intervals after the first);
    real target subwords = logged tokens × n / (n + 3), n the mean target length."""
    with open(metrics, encoding="utf-8") as f:
        rows = [r for r in map(json.loads, f) if r["event"] == "train"]
    steps = [r["step"] - p for r, p in zip(rows, [0] + [r["step"] for r in rows])]
    steady, k = rows[1:] or rows, steps[1:] or steps
    secs, frac = sum(r["seconds"] for r in steady), mean_tgt / (mean_tgt + MARKUP_TOKENS)
    return {
        "tok_per_s_logged": sum(r["tokens"] for r in steady) / secs,
        "real_tok_per_s": frac * sum(r["tokens"] for r in steady) / secs,
        "steps_per_s": sum(k) / secs,
        "real_tgt_per_step": frac * sum(r["tokens"] for r in rows) / rows[-1]["step"],
    }


def peer_training(log_text: str) -> dict:
    """The same rates from OpenNMT-py's train.log (its tok/s counts target subwords + </s>)."""
    iv = [tuple(float(x) for x in m.groups()) for m in ONMT_STEP.finditer(log_text)]
    if not iv:
        raise RuntimeError("no Step lines in OpenNMT-py's train.log")
    k = [s - p for s, p in zip([i[0] for i in iv], [0.0] + [i[0] for i in iv])]
    steady = list(zip(k, iv))[1:] or list(zip(k, iv))
    secs = sum(n * i[3] / i[6] for n, i in steady)  # bsz tgt × steps / tgt tok/s
    params = re.search(r"\* number of parameters: (\d+)", log_text)
    vppl = re.findall(r"Validation perplexity: ([\d.]+)", log_text)
    return {
        "tok_per_s_logged": sum(n * i[3] for n, i in steady) / secs,
        "real_tok_per_s": sum(n * (i[3] - i[4]) for n, i in steady) / secs,
        "steps_per_s": sum(n for n, _ in steady) / secs,
        "real_tgt_per_step": sum(n * (i[3] - i[4]) for n, i in zip(k, iv)) / iv[-1][0],
        "sents_per_step": sum(n * i[4] for n, i in zip(k, iv)) / iv[-1][0],
        "train_s": iv[-1][7],
        "params": int(params.group(1)) if params else None,
        "valid_ppl": float(vppl[-1]) if vppl else None,
    }


def peer_script(ctx: StageContext) -> Optional[str]:
    """``run_onmt_bench.sh``: in ``$PEERS_SCRIPTS``, else ``../shared/peers`` beside the repository
    (a clone elsewhere has no such folder); None when it is not there."""
    folder = os.environ.get("PEERS_SCRIPTS") or os.path.join(ctx.repo, "..", "shared", "peers")
    script = os.path.join(folder, "run_onmt_bench.sh")
    return script if os.path.exists(script) else None


def run_peer(p: PeerParams, ctx: StageContext, venv: str, tok_dir: str, out: str, skip_train: bool) -> float:
    """``run_onmt_bench.sh`` (:func:`peer_script`): OpenNMT-py training, onmt_translate, CTranslate2."""
    script = peer_script(ctx)
    env = dict(os.environ, STEPS=str(p.steps), LAYERS="3", DMODEL="256", HEADS="4", FF="1024", DROPOUT="0.1")
    env.update(BATCH_TOKENS=str(p.onmt_batch_tokens), WARMUP="100", LR="0.5", BEAM=str(p.beam), TBATCH=str(p.tbatch))
    env.update(THREADS=str(p.threads), VOCAB_SIZE="32768", SRC_EXT="en", TGT_EXT="de", SEED="1234", VENV=venv)
    env.update(SKIP_TRAIN="1" if skip_train else "0", CT2_INT8="1")
    t0 = time.time()
    with open(os.path.join(out, "bench.log"), "a", encoding="utf-8") as log:
        args = [os.path.join(tok_dir, s) for s in ("train", "valid", "test")]
        subprocess.run(["bash", script, *args, out], env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.time() - t0


def peer_translations(out: str, tok, refs: list[str], rnd: int) -> list[dict]:
    """onmt_translate's and CTranslate2's (fp32, int8) timings and detokenized scores of one run."""
    text = open(os.path.join(out, "translate.log"), encoding="utf-8").read()
    rows = []
    for name, hyp, seconds in (
        ("OpenNMT-py", "test.onmt.hyp", re.search(r"Total translation time \(s\): ([\d.]+)", text)),
        ("CTranslate2 fp32 (OpenNMT-py model)", "test.ct2.hyp", _median(out, "ct2_translate.log")),
        ("CTranslate2 int8 (OpenNMT-py model)", "test.ct2int8.hyp", _median(out, "ct2_translate_int8.log")),
    ):
        if seconds is None or not os.path.exists(os.path.join(out, hyp)):
            continue
        subwords = [line.split() for line in read_lines(os.path.join(out, hyp))]
        hyps = write_lines(os.path.join(out, hyp + ".detok"), [tok.detokenize(s) for s in subwords])
        t = float(seconds.group(1))
        rows.append({"toolkit": name, "round": rnd, "sentences": len(refs), "translate_s": t})
        rows[-1].update(sent_per_s=len(refs) / t, out_subwords=sum(map(len, subwords)))
        rows[-1].update(scores(read_lines(hyps), refs))
    return rows


def _median(out: str, name: str) -> Optional[re.Match]:
    path = os.path.join(out, name)
    return re.search(r"median ([\d.]+)s", open(path, encoding="utf-8").read()) if os.path.exists(path) else None


@stage("peer_opennmt", PeerParams)
def peer_opennmt(p: PeerParams, ctx: StageContext) -> None:
    """Train ours then OpenNMT-py (one after the other, never both on the CPU), then translate the
    test set with each in alternation, ``rounds`` times."""
    import torch

    from onmt_doc.models.checkpoint import load_model

    venv = peer_venv(p.venv)
    if venv is None:
        ctx.record(skipped=f"OpenNMT-py venv not found: {SETUP}")
        return
    if peer_script(ctx) is None:
        ctx.record(skipped="run_onmt_bench.sh not found in ../shared/peers beside the repository: set PEERS_SCRIPTS")
        return
    torch.set_num_threads(p.threads)
    data = multi30k(ctx, p.train_lines, p.test_lines)
    ours_dir, peer_dir, tok_dir = ctx.work_dir("onmt_doc"), ctx.work_dir("onmt_py"), ctx.work_dir("tok")
    row = train_ours(ctx, p.system, data, p.steps, ours_dir)
    tok = tokenizer(os.path.join(ours_dir, "subword.model"))
    mean_tgt = tokenize_splits(tok, data, tok_dir)
    params = load_model(checkpoint(ours_dir))[0].n_params()
    ours = our_training(os.path.join(ours_dir, "metrics.jsonl"), mean_tgt)
    ctx.record(what="train", toolkit="onmt_doc", params=params, **ours, train_s=row["train_s"], wall_s=row["wall_s"])
    wall = run_peer(p, ctx, venv, tok_dir, peer_dir, skip_train=False)
    theirs = peer_training(open(os.path.join(peer_dir, "train.log"), encoding="utf-8").read())
    ctx.record(what="train", toolkit="OpenNMT-py 3.5.1", **theirs, wall_s=wall)
    ctx.record(what="ratio", train_real_tok_per_s=ours["real_tok_per_s"] / theirs["real_tok_per_s"])
    refs = read_lines(data["test"]["de"])
    opts, speeds = {"beam": p.beam, "batch_sentences": p.tbatch}, {}
    for rnd in range(p.rounds):
        for dtype in ("float32", "bfloat16")[: 1 + p.bf16]:
            hyp = os.path.join(ours_dir, f"test.{dtype}.hyp")
            r = translate_ours(checkpoint(ours_dir), data, ctx.device, hyp, dtype=dtype, **opts)
            subwords = sum(len(tok.tokenize(h)[0]) for h in read_lines(hyp))
            ctx.record(what="translate", toolkit=f"onmt_doc {dtype}", round=rnd, out_subwords=subwords, **r)
            speeds.setdefault(f"onmt_doc {dtype}", []).append(r["sent_per_s"])
        if rnd:
            run_peer(p, ctx, venv, tok_dir, peer_dir, skip_train=True)
        for r in peer_translations(peer_dir, tok, refs, rnd):
            ctx.record(what="translate", **r)
            speeds.setdefault(r["toolkit"], []).append(r["sent_per_s"])
    mean = {k: sum(v) / len(v) for k, v in speeds.items()}
    ctx.record(what="ratio", translate_sent_per_s=mean["onmt_doc float32"] / mean["OpenNMT-py"])
