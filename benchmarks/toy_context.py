#!/usr/bin/env python
"""Context-dependent pronouns of the toy corpus: sentence-level Transformer vs document-level
models of the same size, same steps and same batch size.

  python benchmarks/toy_context.py [--out runs/bench_toy] [--steps 600] [--threads 2]
                                   [--systems transformer g_transformer]

Every system trains config_examples/quickstart.yaml's model size (d_model 128, 2+2 layers, 4 heads,
ff 256) on the toy corpus (tools/make_toy_corpus.py, seed 1), translates its test set (beam 4) and
reports BLEU, d-BLEU and the accuracy on the pronouns whose form depends on the previous sentence
(a sentence-level model can only guess: about 1/3). Later document-level models add an entry to
SYSTEMS; DECODINGS translate a trained system's model again with other translation flags (k-to-k
with its own previous translations forced as the target prefix): list the trained system first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common import REPO, score_line, thread_env, write_json

HM_PART = "{type: hierarchical, layers: 2, heads: 4, ff: 256, doc_layers: 1}"
HM_DEC = "{type: doc_context, layers: 2, heads: 4, ff: 256}"
G_PART = "{type: g_transformer, layers: 2, heads: 4, ff: 256, global_layers: 1}"
SYSTEMS = {
    "transformer": [],
    "g_transformer": [
        f"model.encoder={G_PART}",
        "model.decoder={type: g_transformer, layers: 2, heads: 4, ff: 256, global_layers: 1, global_cross_layers: 1}",
        "data.max_tokens=128",
    ],
    # HM-GDC readings of eqs. 5-6 (docs/models/hm_gdc.md): hm_gdc = the defaults (every word reads
    # its own sentence's slot H^S_i), hm_gdc_document = every word attends over all H^S_k;
    # hm_gdc_own_decoder also restricts the DocEnc-Decoder attention to the sentence's own words
    "hm_gdc": [f"model.encoder={HM_PART}", f"model.decoder={HM_DEC}"],
    "hm_gdc_document": [f"model.encoder={HM_PART}", "model.encoder.context=document", f"model.decoder={HM_DEC}"],
    "hm_gdc_own_decoder": [f"model.encoder={HM_PART}", f"model.decoder={HM_DEC}", "model.decoder.context=own_sentence"],
    # concatenation baselines (docs/models/concatenation.md): the Transformer on k-to-1 / k-to-k units
    **{
        f"{unit}_k{k}": [f"model.unit={unit}", f"data.context_sentences={k}"]
        for unit in ("k_to_1", "k_to_k")
        for k in (1, 3)
    },
}
# systems that translate another system's model with other translation flags (no training of
# their own; the trained system runs first, in the same --out)
DECODINGS = {f"k_to_k_k{k}_prefix": (f"k_to_k_k{k}", ["-force_context_prefix"]) for k in (1, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench_toy")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS) + list(DECODINGS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides for every system (ablations, e.g. model.encoder.doc_layers=2)",
    )
    args = p.parse_args()
    from onmt_doc.toy.corpus import write_corpus
    from onmt_doc.toy.pronoun_scoring import score_context

    out = os.path.abspath(args.out)
    data = os.path.join(out, "data")
    write_corpus(data, seed=1)
    config = os.path.join(REPO, "config_examples", "quickstart.yaml")
    rows = {}
    for name in args.systems:
        trained, flags = DECODINGS.get(name, (name, []))
        run_dir = os.path.join(out, trained)
        overrides = [
            f"data.{split}.{side}={data}/{split}.{side}" for split in ("train", "valid") for side in ("src", "tgt")
        ]
        overrides += [
            f"log.dir={run_dir}",
            f"train.max_steps={args.steps}",
            f"train.valid_every={args.steps}",
            f"train.save_every={args.steps}",
            "log.tensorboard=false",
            f"train.threads={args.threads}",
        ]
        env = thread_env(args.threads)
        t0 = time.time()
        if name in DECODINGS:
            if trained not in rows:
                p.error(f"{name} translates {trained}'s model: list {trained} before it in --systems")
        else:
            subprocess.run(
                [sys.executable, "-m", "onmt_doc.bin.train", "-config", config, *overrides, *SYSTEMS[name], *args.set],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(out, f"{name}.train.log"), "w"),
                env=env,
            )
        train_s = rows[trained]["train_s"] if name in DECODINGS else time.time() - t0
        hyp = os.path.join(run_dir, f"test.{name}.hyp" if name in DECODINGS else "test.hyp")
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "onmt_doc.bin.translate",
                "-model",
                os.path.join(run_dir, "checkpoints", "last.pt"),
                "-src",
                f"{data}/test.src",
                "-tgt",
                f"{data}/test.tgt",
                "-output",
                hyp,
                *flags,
            ],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        )
        bleu_line = score_line(res.stderr)
        ctx = score_context(hyp, os.path.join(data, "test.ctx"))
        rows[name] = {
            "train_s": train_s,
            "scores": bleu_line,
            "pronoun_acc": 100 * ctx["accuracy"],
            "pronouns": ctx["total"],
        }
        print(json.dumps({name: rows[name]}), file=sys.stderr)
    write_json(os.path.join(out, "results.json"), rows)
    print("| system | train time | scores | context-dependent pronouns |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['train_s']:.0f} s | {r['scores']} | {r['pronoun_acc']:.1f}% of {r['pronouns']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
