#!/usr/bin/env python
"""A large synthetic parallel corpus from real sentence pairs, for data-pipeline benchmarks (issue 30).

python tools/make_synthetic_corpus.py --pairs 1000000 --out /tmp/wmt1m   # train.en, train.de

Each line pair joins two random pairs of Multi30k train and newstest2008-2013 (../shared/data, see
its README), drawn with --seed: real text with realistic subword statistics, almost every line unique,
about 26 words a line. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

SOURCES = (("multi30k-en-de/train.en", "multi30k-en-de/train.de"),
           ("news-sent-en-de/newstest2008-2013.en", "news-sent-en-de/newstest2008-2013.de"))  # fmt: skip


def base_pairs(data: str) -> list[tuple[str, str]]:
    """The non-blank aligned pairs of the source corpora."""
    pairs = []
    for en, de in SOURCES:
        with open(os.path.join(data, en), encoding="utf-8") as f, open(os.path.join(data, de), encoding="utf-8") as g:
            pairs += [(s.strip(), t.strip()) for s, t in zip(f, g) if s.strip() and t.strip()]
    return pairs


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, required=True, help="line pairs to write")
    p.add_argument("--out", required=True, help="folder for train.en and train.de (created)")
    p.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data"), help="the shared data folder")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs must be at least 1 (got {args.pairs})")
    try:
        pairs = base_pairs(args.data)
    except OSError as e:
        print(f"make_synthetic_corpus: {e.filename}: {e.strerror} (--data is ../shared/data)", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    try:  # "x": never over an existing corpus
        with open(os.path.join(args.out, "train.en"), "x", encoding="utf-8") as fs, \
                open(os.path.join(args.out, "train.de"), "x", encoding="utf-8") as ft:  # fmt: skip
            for _ in range(args.pairs):
                (s1, t1), (s2, t2) = rng.choice(pairs), rng.choice(pairs)
                fs.write(f"{s1} {s2}\n")
                ft.write(f"{t1} {t2}\n")
    except FileExistsError as e:
        print(f"make_synthetic_corpus: {e.filename} exists; choose another --out", file=sys.stderr)
        return 1
    print(f"{args.pairs} pairs from {len(pairs)} base pairs in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
