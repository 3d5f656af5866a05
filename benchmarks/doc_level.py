#!/usr/bin/env python
"""Document-level quality on docmt-en-de (TED, News, Europarl): s-BLEU and d-BLEU per domain and
training time of sentence- and document-level systems trained with the same recipe.

  python benchmarks/doc_level.py [--out runs/bench_doc] [--systems sent doc_transformer g_scratch
                                  sent_pretrained g_finetuned hm_scratch hm_finetuned] [--steps 800]
                                  [--pretrain-steps 1200] [--finetune-steps 400] [--d-model 256] [--layers 3]
                                  [--threads 2] [--data ../shared/data]

Data (``--data``, by default ../shared/data beside the repository, see its README):
- document training: the three `*.dev` sets, minus the last 4 documents of each, which are the
  validation set; test: each `*.test`, reported per domain;
- sentence pre-training (for `sent_pretrained`, the model `g_finetuned` starts from): multi30k
  train + news-sent + the document training data flattened.

Systems run one after the other; two invocations with different `--systems` may run side by side
(e.g. `sent_pretrained g_finetuned` beside the rest) and share `OUT/results.json`.

One shared BPE vocabulary (learned on the pre-training data, which contains the document training
data) serves every system, so `train.init_from` can copy parameters. Systems:
- `sent`: sentence Transformer on the document training data's sentence pairs;
- `doc_transformer`: the G-Transformer machinery with group attention off, on document instances;
- `g_scratch`: G-Transformer from random initialisation (word dropout 0.3);
- `sent_pretrained`: sentence Transformer on the pre-training data;
- `g_finetuned`: G-Transformer initialised from `sent_pretrained`, copied parameters at
  lr × 0.2, new ones at lr (word dropout 0.1);
- `hm_scratch`: HM-GDC (hierarchical encoder + doc_context decoder, context in encoder and
  decoder) trained in one step on document windows of `--hm-window` sentences (about the
  G-Transformer's 512-token instances);
- `hm_finetuned`: HM-GDC two-step training: initialised from `sent_pretrained` (sentence-level
  parameters at lr × 0.2), document-level parameters new.
Results: `OUT/results.json` and a Markdown table on stdout. Later document-level models add an
entry to SYSTEMS.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from common import (
    add_data_argument,
    add_shape_arguments,
    copy_vocab,
    read_json,
    run_streamed,
    scores,
    write_json,
    write_yaml,
)

DOMAINS = ("ted", "news", "europarl")
HELD_OUT_DOCS = 4


def read_docs(path: str) -> list[list[str]]:
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
    if cur:
        docs.append(cur)
    return docs


def write_docs(path: str, docs: list[list[str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")


def prepare(out: str, shared: str) -> str:
    """Write the training, validation and pre-training files from the ``shared`` data sets;
    return the data folder."""
    data = os.path.join(out, "data")
    if os.path.exists(os.path.join(data, "done")):
        return data
    os.makedirs(data, exist_ok=True)
    train = {"en": [], "de": []}
    valid = {"en": [], "de": []}
    for domain in DOMAINS:
        src = read_docs(os.path.join(shared, "docmt-en-de", f"{domain}.dev.en"))
        tgt = read_docs(os.path.join(shared, "docmt-en-de", f"{domain}.dev.de"))
        assert [len(d) for d in src] == [len(d) for d in tgt], domain
        for side, docs in (("en", src), ("de", tgt)):
            train[side] += docs[:-HELD_OUT_DOCS]
            valid[side] += docs[-HELD_OUT_DOCS:]
    for side in ("en", "de"):
        write_docs(os.path.join(data, f"train.{side}"), train[side])
        write_docs(os.path.join(data, f"valid.{side}"), valid[side])
        with open(os.path.join(data, f"pretrain.{side}"), "w", encoding="utf-8") as f:
            for path in (
                os.path.join(shared, "multi30k-en-de", f"train.{side}"),
                os.path.join(shared, "news-sent-en-de", f"newstest2008-2013.{side}"),
            ):
                with open(path, encoding="utf-8") as g:
                    f.writelines(line for line in g if line.strip())
            f.writelines(s + "\n" for d in train[side] for s in d)
    open(os.path.join(data, "done"), "w").close()
    return data


def model_section(args, encoder: str, decoder: str, **extra) -> list[str]:
    """Overrides of the model shape, the same for every system."""
    o = [f"model.d_model={args.d_model}", f"model.encoder.type={encoder}", f"model.decoder.type={decoder}"]
    for side in ("encoder", "decoder"):
        o += [f"model.{side}.layers={args.layers}", f"model.{side}.heads={args.heads}", f"model.{side}.ff={args.ff}"]
    return o + [f"{k}={v}" for k, v in extra.items()]


def g_parts(args, group: bool) -> dict:
    """G-Transformer switches: group attention on (with global layers) or off."""
    extra = {"model.encoder.group_attention": str(group).lower(), "model.decoder.group_attention": str(group).lower()}
    if group:
        extra.update({f"model.{side}.global_layers": args.global_layers for side in ("encoder", "decoder")})
        extra["model.decoder.global_cross_layers"] = args.global_layers
    return extra


def systems(args, data: str, out: str) -> dict:
    """name -> (training overrides, documents?) for onmt_doc_train on the base config."""
    doc_data = [
        f"data.train.src={data}/train.en",
        f"data.train.tgt={data}/train.de",
        f"data.valid.src={data}/valid.en",
        f"data.valid.tgt={data}/valid.de",
    ]
    steps = [f"train.max_steps={args.steps}"]
    return {
        "sent": doc_data + steps + model_section(args, "transformer", "transformer"),
        "doc_transformer": doc_data
        + steps
        + model_section(args, "g_transformer", "g_transformer", **g_parts(args, False)),
        "g_scratch": doc_data
        + steps
        + model_section(args, "g_transformer", "g_transformer", **g_parts(args, True), **{"model.word_dropout": 0.3}),
        # data.documents stays true: the pre-training file (no blank lines) is one stream of
        # sentences either way, and the checkpoint must read the test files as documents (d-BLEU)
        "sent_pretrained": [
            f"data.train.src={data}/pretrain.en",
            f"data.train.tgt={data}/pretrain.de",
            f"data.valid.src={data}/valid.en",
            f"data.valid.tgt={data}/valid.de",
            f"train.max_steps={args.pretrain_steps}",
        ]
        + model_section(args, "transformer", "transformer"),
        "g_finetuned": doc_data
        + [
            f"train.max_steps={args.finetune_steps}",
            f"train.init_from={out}/sent_pretrained/checkpoints/last.pt",
            "train.init_lr_scale=0.2",
        ]
        + model_section(args, "g_transformer", "g_transformer", **g_parts(args, True), **{"model.word_dropout": 0.1}),
        "hm_scratch": doc_data + steps + model_section(args, "hierarchical", "doc_context", **hm_parts(args)),
        "hm_finetuned": doc_data
        + [
            f"train.max_steps={args.finetune_steps}",
            f"train.init_from={out}/sent_pretrained/checkpoints/last.pt",
            "train.init_lr_scale=0.2",
        ]
        + model_section(args, "hierarchical", "doc_context", **hm_parts(args)),
    }


def hm_parts(args) -> dict:
    """HM-GDC document encoder layers (sharing the sentence layers' self-attention, as the paper)
    and document windows: a whole TED talk (~100 sentences) makes every sentence's DocEnc-Decoder
    attention cover ~3000 words, 10-20x the cost of a sentence step on a CPU."""
    return {"model.encoder.doc_layers": min(args.global_layers, args.layers), "data.max_sentences": args.hm_window}


BASE = {
    "vocab": {"subword": "bpe", "size": 8000, "shared": True},
    "model": {"dropout": 0.2, "attention_dropout": 0.1},
    "data": {"max_tokens": 512},
    "optim": {"type": "adam", "lr": 1.0e-3, "betas": [0.9, 0.98], "schedule": {"type": "inverse_sqrt", "warmup": 400}},
    "train": {
        "batch_tokens": 2048,
        "valid_every": 100000,
        "save_every": 100000,
        "keep_last": 1,
        "valid_bleu": False,
        "seed": 1,
    },
    "translate": {"beam": 4, "max_len_ratio": 1.3, "max_len_add": 10},
    "log": {"tensorboard": False, "every": 100},
}


def run(cmd: list[str], log_path: str, threads: int) -> float:
    """Wall seconds of ``cmd`` (its output in ``log_path``; exit on failure)."""
    t0 = time.time()
    run_streamed(cmd, log_path, threads, header=False)
    return time.time() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench_doc")
    p.add_argument(
        "--systems",
        nargs="+",
        default=[
            "sent",
            "doc_transformer",
            "g_scratch",
            "sent_pretrained",
            "g_finetuned",
            "hm_scratch",
            "hm_finetuned",
        ],
    )
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--pretrain-steps", type=int, default=1200)
    p.add_argument("--finetune-steps", type=int, default=400)
    add_shape_arguments(p, 2, "G-Transformer combined layers per stack; HM-GDC document layers")
    p.add_argument(
        "--hm-window", type=int, default=20, help="HM-GDC document windows (data.max_sentences; 0 = whole documents)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--test-docs", type=int, default=0, help="first N documents of each test set (0 = all; smoke tests)")
    add_data_argument(p)
    args = p.parse_args()
    out = os.path.abspath(args.out)
    data = prepare(out, args.data)
    base = write_yaml({**BASE, "train": {**BASE["train"], "threads": args.threads}}, os.path.join(out, "base.yaml"))
    vocab_dir = os.path.join(out, "vocab")
    if not os.path.exists(os.path.join(vocab_dir, "vocab.txt")):
        run(
            [
                sys.executable,
                "-m",
                "onmt_doc.bin.build_vocab",
                "-config",
                base,
                f"log.dir={vocab_dir}",
                f"data.train.src={data}/pretrain.en",
                f"data.train.tgt={data}/pretrain.de",
                "data.documents=false",
            ],
            os.path.join(out, "vocab.log"),
            args.threads,
        )
    results_path = os.path.join(out, "results.json")
    table = systems(args, data, out)
    for name in args.systems:
        run_dir = os.path.join(out, name)
        copy_vocab(vocab_dir, run_dir)
        seconds = run(
            [sys.executable, "-m", "onmt_doc.bin.train", "-config", base, f"log.dir={run_dir}", *table[name]],
            os.path.join(run_dir, "train.log"),
            args.threads,
        )
        row = {"train_s": seconds, "overrides": table[name]}
        for domain in DOMAINS:
            src, ref = _test_files(args.data, data, domain, args.test_docs)
            hyp = os.path.join(run_dir, f"{domain}.hyp")
            log = os.path.join(run_dir, f"{domain}.translate.log")
            t = run(
                [
                    sys.executable,
                    "-m",
                    "onmt_doc.bin.translate",
                    "-model",
                    os.path.join(run_dir, "checkpoints", "last.pt"),
                    "-src",
                    src,
                    "-tgt",
                    ref,
                    "-output",
                    hyp,
                ],
                log,
                args.threads,
            )
            row[domain] = {**_scores(log), "translate_s": t}
        results = read_json(results_path, {})
        results[name] = row  # re-read first: several runs of this script may share OUT
        write_json(results_path, results)
        print(json.dumps({name: row}), file=sys.stderr)
    results = read_json(results_path)
    print("| system | train time | " + " | ".join(f"{d} s-BLEU | {d} d-BLEU" for d in DOMAINS) + " |")
    print("|---|---|" + "---|---|" * len(DOMAINS))
    for name, row in results.items():
        cells = " | ".join(f"{row[d]['bleu']:.2f} | {row[d]['d_bleu']:.2f}" for d in DOMAINS)
        print(f"| {name} | {row['train_s'] / 60:.1f} min | {cells} |")
    return 0


def _test_files(shared: str, data: str, domain: str, n_docs: int) -> tuple[str, str]:
    """A domain's test files, or (``n_docs``) their first documents, written under ``data``."""
    paths = [os.path.join(shared, "docmt-en-de", f"{domain}.test.{side}") for side in ("en", "de")]
    if not n_docs:
        return paths[0], paths[1]
    out = [os.path.join(data, f"{domain}.test{n_docs}.{side}") for side in ("en", "de")]
    for path, short in zip(paths, out):
        write_docs(short, read_docs(path)[:n_docs])
    return out[0], out[1]


def _scores(log_path: str) -> dict:
    """Parse the 'BLEU x | chrF y | D-BLEU z' line that onmt_doc_translate -tgt prints."""
    with open(log_path, encoding="utf-8") as f:
        parts = scores(f.read())
    return {"bleu": parts["BLEU"], "chrf": parts["chrF"], "d_bleu": parts["D-BLEU"]}


if __name__ == "__main__":
    sys.exit(main())
