#!/usr/bin/env python
"""float32 vs bfloat16 translation speed and BLEU of one checkpoint, alternated in one process.

python benchmarks/translate_dtype_ab.py CKPT SRC REF [--rounds 2] [--beam 4] [--batch 32]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from onmt_doc.evaluation.corpus_metrics import s_bleu
from onmt_doc.models.checkpoint import load_model
from onmt_doc.translate.translator import Translator, translator_options


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("ckpt")
    p.add_argument("src")
    p.add_argument("ref")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    src = [line.strip() for line in open(args.src, encoding="utf-8")]
    ref = [line.strip() for line in open(args.ref, encoding="utf-8")]
    docs = [[s] for s in src]
    m32, cfg, codec = load_model(args.ckpt)
    models = {"float32": m32, "bfloat16": copy.deepcopy(m32).to(torch.bfloat16)}
    opts = translator_options(cfg.translate, beam=args.beam, batch_sentences=args.batch)
    for rnd in range(args.rounds):
        for name, model in models.items():
            translator = Translator(model, codec, cfg, opts)
            start = time.time()
            out = translator.translate_documents(docs)
            dt = time.time() - start
            bleu = s_bleu([d[0] for d in out], ref)
            print(f"round {rnd + 1} {name}: {len(docs) / dt:.1f} sent/s ({dt:.2f} s) BLEU {bleu:.2f}", flush=True)


if __name__ == "__main__":
    main()
