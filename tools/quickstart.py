#!/usr/bin/env python
"""The quickstart in one command: toy corpus → vocabulary → training → translation → scores.

  python tools/quickstart.py [--out runs/quickstart] [--steps 600] [--train-docs 5000] [--eval-docs 145]

Writes the synthetic document-level toy corpus (tools/make_toy_corpus.py), trains the small
sentence-level Transformer of config_examples/quickstart.yaml on it, translates the test set and
prints BLEU, chrF, d-BLEU and the accuracy on the context-dependent pronouns (which a sentence-level
model can only guess: about 1/3). Takes about 2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import sys

try:
    import onmt_doc  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from onmt_doc.bin.common import ArgumentParser, run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(argv=None) -> int:
    p = ArgumentParser(prog="quickstart.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/quickstart", help="run folder (corpus in OUT/data)")
    p.add_argument("--steps", type=int, default=600, help="training steps")
    # smaller corpora make a quick smoke run (the tests use them); the defaults are the documented corpus
    p.add_argument("--train-docs", type=int, default=5000, help="training documents of the toy corpus")
    p.add_argument("--eval-docs", type=int, default=145, help="validation and test documents, each")
    args = p.parse_args(argv)

    from onmt_doc.bin import train, translate
    from onmt_doc.toy.corpus import write_corpus
    from onmt_doc.toy.pronoun_scoring import score_context

    data = os.path.join(args.out, "data")
    for name in ("steps", "train_docs", "eval_docs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    write_corpus(data, seed=1, train_docs=args.train_docs, valid_docs=args.eval_docs, test_docs=args.eval_docs)
    print(f"== toy corpus written to {data}", file=sys.stderr)
    config = os.path.join(REPO, "config_examples", "quickstart.yaml")
    overrides = [
        f"data.{split}.{side}={data}/{split}.{ext}"
        for split in ("train", "valid")
        for side, ext in (("src", "src"), ("tgt", "tgt"))
    ]
    overrides += [
        f"log.dir={args.out}",
        f"train.max_steps={args.steps}",
        f"train.valid_every={args.steps}",
        f"train.save_every={args.steps}",
    ]
    print(f"== onmt_doc_train -config {config} {' '.join(overrides)}", file=sys.stderr)
    if train.main(["-config", config, *overrides]):
        return 1
    hyp = os.path.join(args.out, "test.hyp")
    ckpt = os.path.join(args.out, "checkpoints", "last.pt")
    print(
        f"== onmt_doc_translate -model {ckpt} -src {data}/test.src -tgt {data}/test.tgt -output {hyp}", file=sys.stderr
    )
    if translate.main(["-model", ckpt, "-src", f"{data}/test.src", "-tgt", f"{data}/test.tgt", "-output", hyp]):
        return 1
    ctx = score_context(hyp, os.path.join(data, "test.ctx"))
    print(
        f"context-dependent pronoun accuracy: {100 * ctx['accuracy']:.1f}% ({ctx['correct']}/{ctx['total']}); "
        f"a sentence-level model can only guess (~33%)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run(_main))
