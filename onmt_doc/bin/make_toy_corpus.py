#!/usr/bin/env python3
"""Write the synthetic document-level toy corpus, or score context pronouns.

Usage (also writes DIR/test.contrastive.json and .tsv, the test split's contrastive suite):
    onmt_doc_make_toy_corpus --out DIR [--seed 1] [--train-docs N]
                                    [--valid-docs N] [--test-docs N]
    onmt_doc_make_toy_corpus score --hyp FILE --ctx DIR/test.ctx [--ref FILE]

Thin wrapper around onmt_doc.toy.corpus; all logic lives there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from onmt_doc.evaluation.toy_pronouns import score_context
from onmt_doc.toy.contrastive_suite import write_toy_suite
from onmt_doc.toy.corpus import SPLITS, write_corpus

PROG = "onmt_doc_make_toy_corpus"


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one stderr line and exit status 1."""

    def error(self, message: str) -> NoReturn:
        _fail(message)


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(1)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _generate_parser() -> _Parser:
    p = _Parser(
        prog=PROG,
        description="Write train/valid/test .src/.tgt/.ctx files of the toy corpus.",
        epilog=f"To score a hypothesis: {PROG} score --hyp FILE --ctx DIR/test.ctx",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    p.add_argument("--train-docs", type=_non_negative_int, default=5000)
    p.add_argument("--valid-docs", type=_non_negative_int, default=145)
    p.add_argument("--test-docs", type=_non_negative_int, default=145)
    return p


def _score_parser() -> _Parser:
    p = _Parser(
        prog=f"{PROG} score",
        description="Accuracy of context-dependent pronouns in a line-aligned hypothesis.",
    )
    p.add_argument("--hyp", required=True, type=Path, help="hypothesis file")
    p.add_argument("--ctx", required=True, type=Path, help="the split's .ctx file")
    p.add_argument("--ref", type=Path, default=None, help="reference .tgt (default: CTX with suffix .tgt)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Generate the corpus (or ``score`` a hypothesis); a bad path or value is one line on stderr, exit 1."""
    args_in = sys.argv[1:] if argv is None else argv
    try:
        if args_in and args_in[0] == "score":
            args = _score_parser().parse_args(args_in[1:])
            result = score_context(args.hyp, args.ctx, args.ref)
            print(f"context accuracy: {100 * result['accuracy']:.1f}% ({result['correct']}/{result['total']})")
            return 0
        args = _generate_parser().parse_args(args_in)
        stats = write_corpus(
            args.out,
            seed=args.seed,
            train_docs=args.train_docs,
            valid_docs=args.valid_docs,
            test_docs=args.test_docs,
        )
        suite = write_toy_suite(args.out, seed=args.seed, test_docs=args.test_docs)
    except (OSError, ValueError) as exc:
        _fail(str(exc))
    parts = [
        f"{split} {s.sentences} sentences / {s.documents} docs / {s.context_words} context words"
        for split, s in ((name, stats[name]) for name in SPLITS)
    ]
    print(f"wrote {args.out}: " + "; ".join(parts) + f"; contrastive suite test.contrastive.json/.tsv: {suite} items")
    return 0


if __name__ == "__main__":
    sys.exit(main())
