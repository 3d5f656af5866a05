"""onmt_doc_translate -model CKPT -src FILE|- [-output FILE|-] [-tgt REF] [-beam 5] [-score] …

Streams documents: one output line per input line, blank lines (document breaks) kept, each
document written as soon as it is translated. With -tgt, prints BLEU and chrF (and d-BLEU for
document files) to stderr; with -score, writes the log-probability of each -tgt sentence instead.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, run


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="onmt_doc_translate", description=__doc__)
    p.add_argument("-model", "--model", required=True, help="checkpoint (.pt)")
    p.add_argument("-src", "--src", required=True, help="source file, '-' for standard input")
    p.add_argument("-output", "--output", default="-", help="output file, '-' for standard output")
    p.add_argument("-tgt", "--tgt", help="reference file: report BLEU/chrF/d-BLEU, or the text to -score")
    p.add_argument("-score", "--score", action="store_true", help="forced decoding: log-probs of -tgt")
    p.add_argument("-beam", "--beam", type=int)
    p.add_argument("-n_best", "--n_best", type=int, help="write n hypotheses per line, tab-separated")
    p.add_argument("-length_penalty", "--length_penalty", type=float)
    p.add_argument("-max_len_ratio", "--max_len_ratio", type=float)
    p.add_argument("-batch_tokens", "--batch_tokens", type=int)
    p.add_argument("-batch_size", "--batch_size", type=int, dest="batch_sentences",
                   help="cap on sentences (instances) per batch")
    p.add_argument("-dtype", "--dtype", choices=["float32", "bfloat16", "float16"],
                   help="compute type (default: the checkpoint's translate.dtype, float32)")
    p.add_argument("-device", "--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("-threads", "--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    return p


def _main(argv: Optional[list[str]]) -> int:
    args = _parser().parse_args(argv)
    import torch

    from onmt_doc.errors import UserError
    from onmt_doc.models.checkpoint import load_model
    from onmt_doc.train.distributed import pick_device
    from onmt_doc.translate.translator import Translator, translator_options

    if args.score and not args.tgt:
        raise UserError("-score needs -tgt (the translations to score)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device, key="-device")
    model, cfg, codec = load_model(args.model, device)
    opts = translator_options(cfg.translate, beam=args.beam, n_best=args.n_best,
                              length_penalty=args.length_penalty, max_len_ratio=args.max_len_ratio,
                              batch_tokens=args.batch_tokens, batch_sentences=args.batch_sentences,
                              dtype=args.dtype)
    if opts.beam < 1 or opts.n_best < 1 or opts.n_best > opts.beam:
        raise UserError(f"need -beam >= 1 and 1 <= -n_best <= -beam (got {opts.beam}, {opts.n_best})")
    for flag, value in (("-batch_tokens", opts.batch_tokens), ("-max_len_ratio", opts.max_len_ratio)):
        if value <= 0:
            raise UserError(f"{flag} must be positive (got {value})")
    model.to(getattr(torch, opts.dtype))
    translator = Translator(model, codec, cfg, opts, device)
    start = time.time()
    try:
        out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    except OSError as e:
        raise UserError(f"-output {args.output}: cannot write ({e.strerror})") from None
    try:
        scores = translator.run_files(args.src, out, args.tgt, score=args.score)
    finally:
        if out is not sys.stdout:
            out.close()
    elapsed = time.time() - start
    print(f"{'scored' if args.score else 'translated'} {args.src} in {elapsed:.1f}s", file=sys.stderr)
    if scores:
        print(" | ".join(f"{k.replace('_', '-').upper() if k != 'chrf' else 'chrF'} {v:.2f}"
                         for k, v in scores.items()), file=sys.stderr)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
