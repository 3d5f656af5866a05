"""onmt_doc_translate -model CKPT -src FILE|- [-output FILE|-] [-tgt REF] [-beam 5] [-score] …

Streams documents: one output line per input line, blank lines (document breaks) kept, each
document written as soon as it is translated. With -tgt, prints BLEU and chrF (and d-BLEU for
document files) to stderr; with -score, writes the log-probability of each -tgt sentence instead.
-output FILE is written to a temporary file in the same folder and renamed when done, so a failed
run never truncates an existing file; an -output that is (a link to) an input file is refused, and so
are standard input and output that are one (``-src - < x -output x``, ``-src x >> x``).
Several -model checkpoints translate as an ensemble. -engine ctranslate2 -model FOLDER translates
with a CTranslate2 export of onmt_doc_release (sentence, k_to_1 and k_to_k models) instead of
onmt_doc's own search. -stream translates line by line as lines arrive (standard input, a pipe):
each line is written and flushed as soon as it is translated, with the document's earlier lines and
their translations as context; a blank line starts a new document. A thin layer over the Python API
(``Translator.load`` … ``run_files``, ``translate_stream``; docs/deploy.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Iterator, Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.errors import UserError
from onmt_doc.outputs import check_writable_target, output_file, refuse_inputs, write_text

if TYPE_CHECKING:
    from onmt_doc.translate.translator import Translator


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="onmt_doc_translate", description=__doc__)
    p.add_argument(
        "-model",
        "--model",
        required=True,
        nargs="+",
        help="checkpoint (.pt); several: an ensemble; with -engine ctranslate2: the folder onmt_doc_release wrote",
    )
    p.add_argument(
        "-engine",
        "--engine",
        default="torch",
        help="torch: onmt_doc's own search over the checkpoint (default); ctranslate2: CTranslate2 over the "
        "folder onmt_doc_release wrote (sentence, k_to_1, k_to_k models; needs the export extra)",
    )
    p.add_argument("-src", "--src", required=True, help="source file, '-' for standard input")
    p.add_argument("-output", "--output", default="-", help="output file, '-' for standard output")
    p.add_argument("-tgt", "--tgt", help="reference file: report BLEU/chrF/d-BLEU, or the text to -score")
    p.add_argument("-score", "--score", action="store_true", help="forced decoding: log-probs of -tgt")
    p.add_argument(
        "-stream",
        "--stream",
        action="store_true",
        help="translate each line as soon as it is read and write it at once (flushed), the document's earlier "
        "lines and translations as context, a blank line starting a new document; output to standard output",
    )
    p.add_argument(
        "-metrics_file",
        "--metrics_file",
        help="also write the run's numbers as one JSON object: seconds, documents, sentences/s, repairs, and "
        "BLEU/chrF/d-BLEU with -tgt (for scripts; the log is for people)",
    )
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
        "-force_context_prefix",
        "--force_context_prefix",
        action="store_const",
        const=True,
        help="k_to_k models: force the previous sentences' own translations as the target prefix",
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
    p.add_argument(
        "-ensemble_average",
        "--ensemble_average",
        choices=["log_prob", "prob"],
        help="several -model: average log-probabilities (default) or probabilities",
    )
    p.add_argument("-strategy", "--strategy", help="decoding strategy: beam or sampling (translate.strategy)")
    p.add_argument("-temperature", "--temperature", type=float, help="sampling: softmax temperature")
    p.add_argument("-top_k", "--top_k", type=int, help="sampling: draw from the k most likely tokens (0 = all)")
    p.add_argument("-top_p", "--top_p", type=float, help="sampling: draw from the smallest set of mass p (nucleus)")
    p.add_argument("-seed", "--seed", type=int, help="sampling: random seed")
    p.add_argument(
        "-read_every", "--read_every", type=int, help="beam search: steps between device reads (0 = per device)"
    )
    p.add_argument(
        "-compile",
        "--compile",
        choices=["off", "on", "auto"],
        help="compile the decoding step with torch.compile (auto: on CUDA; translate.compile)",
    )
    p.add_argument("-device", "--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("-threads", "--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    return p


# flag -> translate option (TranslateConfig key) it overrides; None values keep the checkpoint's
OPTION_FLAGS = {
    "beam": "beam",
    "n_best": "n_best",
    "length_penalty": "length_penalty",
    "length_penalty_type": "length_penalty_type",
    "max_len_ratio": "max_len_ratio",
    "max_length": "max_length",
    "max_input_tokens": "max_input_tokens",
    "window_sentences": "window_sentences",
    "force_context_prefix": "force_context_prefix",
    "batch_tokens": "batch_tokens",
    "batch_size": "batch_sentences",
    "dtype": "dtype",
    "ensemble_average": "ensemble_average",
    "strategy": "strategy",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "seed": "seed",
    "read_every": "read_every",
    "compile": "compile",
}


def translate_overrides(args: argparse.Namespace) -> dict:
    """The translate options the command line sets (given flags only, so a checkpoint's sampling
    or other keys are not overridden by absent flags)."""
    return {option: getattr(args, option) for option in OPTION_FLAGS.values() if getattr(args, option) is not None}


def _model_files(models: list[str]) -> list[str]:
    """The files the models are read from: a checkpoint, or each file of an export folder (which
    no output may overwrite)."""
    files = []
    for model in models:
        if os.path.isdir(model):
            files += sorted(os.path.join(model, name) for name in os.listdir(model))
        else:
            files.append(model)
    return files


def _main(argv: Optional[list[str]]) -> int:
    args = _parser().parse_args(argv)
    import torch

    from onmt_doc.evaluation.corpus_metrics import report
    from onmt_doc.train.reporting import setup_logging
    from onmt_doc.translate.translator import Translator

    setup_logging()
    if args.score and not args.tgt:
        raise UserError("-score needs -tgt (the translations to score)")
    if args.stream and (args.tgt or args.score or args.output != "-"):
        raise UserError("-stream writes its translations to standard output as it reads: no -tgt, -score or -output")
    if args.engine == "ctranslate2" and args.score:
        raise UserError("-score needs the checkpoint and -engine torch: a CTranslate2 export only translates")
    inputs = [("-src", args.src), ("-tgt", args.tgt), *(("-model", m) for m in _model_files(args.model))]
    refuse_inputs(args.output, inputs)
    check_writable_target(args.output)
    if args.metrics_file:
        output = "/dev/stdout" if args.output == "-" else args.output  # the translations, wherever they go
        refuse_inputs(args.metrics_file, [*inputs, ("-output", output)], "-metrics_file")
        check_writable_target(args.metrics_file, "-metrics_file")
    if args.max_line_chars is not None and args.max_line_chars < 0:
        raise UserError(f"-max_line_chars must be >= 0 (got {args.max_line_chars})")
    if args.threads:
        torch.set_num_threads(args.threads)
    names = {option: f"-{flag}" for flag, option in OPTION_FLAGS.items()}
    translator = Translator.load(
        args.model,
        args.device,
        option_names={**names, "device": "-device", "engine": "-engine"},
        engine=args.engine,
        **translate_overrides(args),
    )
    if args.max_line_chars is not None:
        translator.cfg.data.max_line_chars = args.max_line_chars
    if args.stream:
        return _stream(translator, args, inputs)
    start = time.time()
    with output_file(args.output, inputs) as out:
        pairs = translator.run_files(args.src, out, args.tgt, score=args.score)
    scores = report(*pairs, translator.cfg.data.documents) if pairs else None
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
    if args.metrics_file:
        s = translator.stats
        metrics = {"src": args.src, "model": args.model, "score": args.score, "seconds": elapsed}
        metrics.update(documents=s.documents, sentences=s.sentences, sent_per_s=s.sentences / max(elapsed, 1e-9))
        metrics.update(lines_split=s.lines_split, docs_repaired=s.docs_repaired, empty_filled=s.empty_filled)
        write_text(args.metrics_file, json.dumps({**metrics, **(scores or {})}) + "\n", inputs, "-metrics_file")
    return 0


def _stream(translator: "Translator", args: argparse.Namespace, inputs: list) -> int:
    """-stream: each line written and flushed as soon as it is translated; per-line latency (from
    the line read to its translation written) in the final log line and the -metrics_file."""
    from onmt_doc.data.corpus import iter_lines

    latencies: list[float] = []
    read_at = [0.0]

    def timed(lines: Iterator[str]) -> Iterator[str]:
        for line in lines:
            read_at[0] = time.perf_counter()
            yield line

    start = time.time()
    for text in translator.translate_stream(timed(iter_lines(args.src, translator.cfg.data.max_line_chars))):
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        if text:
            latencies.append(time.perf_counter() - read_at[0])
    elapsed = time.time() - start
    latency = latency_summary(latencies)
    print(
        f"streamed {len(latencies)} lines from {args.src} in {elapsed:.1f}s; latency per line "
        f"mean {latency['latency_mean_ms']:.1f} ms, p50 {latency['latency_p50_ms']:.1f} ms, "
        f"p95 {latency['latency_p95_ms']:.1f} ms ({translator.stats.summary()})",
        file=sys.stderr,
    )
    if args.metrics_file:
        s = translator.stats
        metrics = {"src": args.src, "model": args.model, "stream": True, "seconds": elapsed, "sentences": s.sentences}
        metrics.update(documents=s.documents, lines_split=s.lines_split, empty_filled=s.empty_filled, **latency)
        write_text(args.metrics_file, json.dumps(metrics) + "\n", inputs, "-metrics_file")
    return 0


def latency_summary(seconds: list[float]) -> dict[str, float]:
    """Mean, median, 95th percentile and maximum of per-line latencies, in milliseconds (0 for none)."""
    ms = sorted(1000.0 * x for x in seconds) or [0.0]

    def quantile(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    return {
        "latency_mean_ms": sum(ms) / len(ms),
        "latency_p50_ms": quantile(0.5),
        "latency_p95_ms": quantile(0.95),
        "latency_max_ms": ms[-1],
    }


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
