"""onmt_doc_translate -model CKPT -src FILE|- [-output FILE|-] [-tgt REF] [-beam 5] [-score] …

Streams documents: one output line per input line, blank lines (document breaks) kept, each
document written as soon as it is translated. With -tgt, prints BLEU and chrF (and d-BLEU for
document files) to stderr; with -score, writes the log-probability of each -tgt sentence instead.
-output FILE is written to a temporary file in the same folder and renamed when done, so a failed
run never truncates an existing file; an -output that is (a link to) an input file is refused.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Callable, Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.errors import UserError


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="onmt_doc_translate", description=__doc__)
    p.add_argument("-model", "--model", required=True, help="checkpoint (.pt)")
    p.add_argument("-src", "--src", required=True, help="source file, '-' for standard input")
    p.add_argument("-output", "--output", default="-", help="output file, '-' for standard output")
    p.add_argument("-tgt", "--tgt", help="reference file: report BLEU/chrF/d-BLEU, or the text to -score")
    p.add_argument("-score", "--score", action="store_true", help="forced decoding: log-probs of -tgt")
    p.add_argument("-beam", "--beam", type=int)
    p.add_argument("-n_best", "--n_best", type=int, help="write n hypotheses per line, tab-separated")
    p.add_argument("-length_penalty", "--length_penalty", type=float, help="GNMT alpha, >= 0")
    p.add_argument(
        "-length_penalty_type",
        "--length_penalty_type",
        choices=["gnmt", "avg", "none"],
        help="divisor of hypothesis scores: gnmt ((5+len)/6)^alpha, avg (len), none",
    )
    p.add_argument("-max_len_ratio", "--max_len_ratio", type=float)
    p.add_argument("-max_length", "--max_length", type=int, help="output cap per sentence (tokens)")
    p.add_argument(
        "-max_input_tokens",
        "--max_input_tokens",
        type=int,
        help="longer source lines are translated in pieces of this many subwords",
    )
    p.add_argument(
        "-window_sentences",
        "--window_sentences",
        type=int,
        help="HM-GDC: sentences per translation window (0 = as trained)",
    )
    p.add_argument(
        "-max_line_chars",
        "--max_line_chars",
        type=int,
        help="a longer input line is an error (data.max_line_chars; 0 = no limit)",
    )
    p.add_argument("-batch_tokens", "--batch_tokens", type=int)
    p.add_argument(
        "-batch_size", "--batch_size", type=int, dest="batch_sentences", help="cap on sentences (instances) per batch"
    )
    p.add_argument(
        "-dtype",
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="compute type (default: the checkpoint's translate.dtype, float32)",
    )
    p.add_argument("-device", "--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("-threads", "--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    return p


def _main(argv: Optional[list[str]]) -> int:
    args = _parser().parse_args(argv)
    import torch

    from onmt_doc.errors import UserError
    from onmt_doc.evaluation.corpus_metrics import report
    from onmt_doc.models.checkpoint import load_model
    from onmt_doc.train.distributed import pick_device
    from onmt_doc.train.reporting import setup_logging
    from onmt_doc.translate.translator import Translator, translator_options

    setup_logging()
    if args.score and not args.tgt:
        raise UserError("-score needs -tgt (the translations to score)")
    _check_output(args.output, {"-src": args.src, "-tgt": args.tgt, "-model": args.model})
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device, key="-device")
    model, cfg, codec = load_model(args.model, device)
    opts = translator_options(
        cfg.translate,
        beam=args.beam,
        n_best=args.n_best,
        length_penalty=args.length_penalty,
        length_penalty_type=args.length_penalty_type,
        max_len_ratio=args.max_len_ratio,
        max_length=args.max_length,
        max_input_tokens=args.max_input_tokens,
        window_sentences=args.window_sentences,
        batch_tokens=args.batch_tokens,
        batch_sentences=args.batch_sentences,
        dtype=args.dtype,
    )
    if args.max_line_chars is not None:
        if args.max_line_chars < 0:
            raise UserError(f"-max_line_chars must be >= 0 (got {args.max_line_chars})")
        cfg.data.max_line_chars = args.max_line_chars
    if opts.beam < 1 or opts.n_best < 1 or opts.n_best > opts.beam:
        raise UserError(f"need -beam >= 1 and 1 <= -n_best <= -beam (got {opts.beam}, {opts.n_best})")
    for flag, value, low in (
        ("-batch_tokens", opts.batch_tokens, 1),
        ("-max_length", opts.max_length, 1),
        ("-max_input_tokens", opts.max_input_tokens, 1),
        ("-batch_size", opts.batch_sentences, 0),
        ("-length_penalty", opts.length_penalty, 0),
        ("-window_sentences", opts.window_sentences, 0),
    ):
        if value < low:
            raise UserError(f"{flag} must be at least {low} (got {value})")
    if opts.max_len_ratio <= 0:
        raise UserError(f"-max_len_ratio must be positive (got {opts.max_len_ratio})")
    model.to(getattr(torch, opts.dtype))
    translator = Translator(model, codec, cfg, opts, device)
    start = time.time()
    if args.output == "-":
        pairs = translator.run_files(args.src, sys.stdout, args.tgt, score=args.score)
    else:
        pairs = _write_atomically(
            args.output, lambda out: translator.run_files(args.src, out, args.tgt, score=args.score)
        )
    scores = report(*pairs, cfg.data.documents) if pairs else None
    elapsed = time.time() - start
    print(
        f"{'scored' if args.score else 'translated'} {args.src} in {elapsed:.1f}s ({translator.stats.summary()})",
        file=sys.stderr,
    )
    if scores:
        print(
            " | ".join(f"{k.replace('_', '-').upper() if k != 'chrf' else 'chrF'} {v:.2f}" for k, v in scores.items()),
            file=sys.stderr,
        )
    return 0


def _check_output(output: str, inputs: dict[str, Optional[str]]) -> None:
    """Refuse an -output that is, or resolves to (links, hard links), one of the inputs."""
    if output == "-":
        return
    for flag, path in inputs.items():
        if not path or path == "-":
            continue
        same = os.path.realpath(output) == os.path.realpath(path)
        if not same and os.path.exists(output) and os.path.exists(path):
            same = os.path.samefile(output, path)
        if same:
            raise UserError(f"-output {output} is the {flag} file {path}; writing it would destroy the input")


def _write_atomically(path: str, write: Callable[[IO[str]], object]) -> object:
    """Run ``write`` on a temporary file next to ``path`` (a link's target), renamed to it only on
    success: an interrupted or failed run leaves an existing file as it was."""
    if os.path.isdir(path):
        raise UserError(f"-output {path}: is a directory")
    path = os.path.realpath(path)
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        out = open(tmp, "w", encoding="utf-8")
    except OSError as e:
        raise UserError(f"-output {path}: cannot write in {folder} ({e.strerror})") from None
    try:
        with out:
            result = write(out)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
