#!/usr/bin/env python3
"""Write the synthetic document-level toy corpus, or score context pronouns.

Usage (also writes DIR/test.contrastive.json and .tsv, the test split's contrastive suite):
    onmt_doc_make_toy_corpus --out DIR [--seed 1] [--force] [--train-docs N]
                                    [--valid-docs N] [--test-docs N]
    onmt_doc_make_toy_corpus score --hyp FILE --ctx DIR/test.ctx [--ref FILE]

Thin wrapper around onmt_doc.toy.corpus; all logic lives there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.errors import UserError

PROG = "onmt_doc_make_toy_corpus"
SUITE_FILES = ("test.contrastive.json", "test.contrastive.tsv")


# the generator holds a split in memory (~1 KB a document): 10 million documents is ~10 GB
MAX_DOCS = 10_000_000


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= MAX_DOCS:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {MAX_DOCS:,}], got {value}")
    return value


def _generate_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog=PROG,
        description="Write train/valid/test .src/.tgt/.ctx files of the toy corpus.",
        epilog=f"To score a hypothesis: {PROG} score --hyp FILE --ctx DIR/test.ctx",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    p.add_argument("--train-docs", type=_non_negative_int, default=5000)
    p.add_argument("--valid-docs", type=_non_negative_int, default=145)
    p.add_argument("--test-docs", type=_non_negative_int, default=145)
    p.add_argument("--force", action="store_true", help="replace corpus files that already exist in --out")
    return p


def _score_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog=f"{PROG} score",
        description="Accuracy of context-dependent pronouns in a line-aligned hypothesis.",
    )
    p.add_argument("--hyp", required=True, type=Path, help="hypothesis file")
    p.add_argument("--ctx", required=True, type=Path, help="the split's .ctx file")
    p.add_argument("--ref", type=Path, default=None, help="reference .tgt (default: CTX with suffix .tgt)")
    return p


def _refuse_existing(out: Path, force: bool) -> None:
    """A corpus folder is often a data folder: files of the same name are not replaced silently."""
    from onmt_doc.outputs import make_folders
    from onmt_doc.toy.corpus import SPLITS

    names = [f"{split}.{ext}" for split in SPLITS for ext in ("src", "tgt", "ctx")] + list(SUITE_FILES)
    existing = [name for name in names if (out / name).exists()]
    if existing and not force:
        shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise UserError(f"--out {out} already holds {shown}; add --force to replace them, or choose another folder")
    make_folders(out, "--out")


def _main(argv: Optional[list[str]]) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in and args_in[0] == "score":
        from onmt_doc.toy.pronoun_scoring import score_context

        args = _score_parser().parse_args(args_in[1:])
        result = score_context(args.hyp, args.ctx, args.ref)
        print(f"context accuracy: {100 * result['accuracy']:.1f}% ({result['correct']}/{result['total']})")
        return 0
    from onmt_doc.toy.contrastive_suite import write_toy_suite
    from onmt_doc.toy.corpus import SPLITS, write_corpus

    args = _generate_parser().parse_args(args_in)
    _refuse_existing(args.out, args.force)
    stats = write_corpus(
        args.out, seed=args.seed, train_docs=args.train_docs, valid_docs=args.valid_docs, test_docs=args.test_docs
    )
    suite = write_toy_suite(args.out, seed=args.seed, test_docs=args.test_docs)
    parts = [
        f"{split} {s.sentences} sentences / {s.documents} docs / {s.context_words} context words"
        for split, s in ((name, stats[name]) for name in SPLITS)
    ]
    print(f"wrote {args.out}: " + "; ".join(parts) + f"; contrastive suite test.contrastive.json/.tsv: {suite} items")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Generate the corpus (or ``score`` a hypothesis); a user mistake is one line on stderr, exit 1."""
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
