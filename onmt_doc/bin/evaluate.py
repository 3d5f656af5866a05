"""onmt_doc_evaluate: what document context buys a model.

  # contrastive suite (our JSON or TSV), with context, removed, and shuffled
  onmt_doc_evaluate -model CKPT -suite test.contrastive.json -ablation none remove shuffle -json out.json
  # a published suite from its own files, under its authors' rule (docs/evaluation.md, "Published suites")
  onmt_doc_evaluate -model CKPT -suite consistency_testsets/deixis_test.json -format voita
  # metrics on translations: BLEU, chrF, d-BLEU, pronoun accuracy, lexical consistency
  onmt_doc_evaluate -hyp test.hyp -ref test.tgt -src test.src -lang de
  # how much the model uses context: CXMI per target token, per sentence position, top tokens
  onmt_doc_evaluate -model CKPT -cxmi -src test.src -ref test.tgt -top_tokens 20
  # what the model reads from context in one document: pictures (PNG) and a page (HTML) in DIR
  onmt_doc_evaluate -model CKPT -explain doc.src [-ref doc.tgt] -output DIR

Candidates are scored by forced decoding in context through the code path of
``onmt_doc_translate -score``. Prints a table on stdout; -json writes every number; -tensorboard
DIR logs them as scalars. docs/evaluation.md explains the formats and the metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.errors import UserError
from onmt_doc.outputs import Input, check_writable_target, make_folders, output_file, refuse_inputs, write_text

if TYPE_CHECKING:
    from onmt_doc.translate.translator import Translator


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="onmt_doc_evaluate", description=__doc__)
    s = p.add_argument_group("contrastive suite")
    s.add_argument("-model", "--model", help="checkpoint (.pt); needed with -suite")
    s.add_argument(
        "-suite",
        "--suite",
        help="suite file: JSON array, JSON Lines or TSV; or a published suite's JSON (ContraPro's contrapro.json, "
        "Voita et al.'s consistency_testsets/NAME.json, Bawden et al.'s anaphora.json or lexical-choice.json)",
    )
    s.add_argument(
        "-format",
        "--format",
        default="auto",
        choices=("auto", "json", "tsv", "contrapro", "voita", "bawden"),
        help="the suite's format (auto: told from the file; docs/evaluation.md, 'Suite formats')",
    )
    s.add_argument(
        "-context_src",
        "--context_src",
        help="source context lines: per item (json) or per candidate (contrapro.context.en, bawden's NAME.prev.en)",
    )
    s.add_argument("-context_tgt", "--context_tgt", help="target context lines, as -context_src")
    s.add_argument(
        "-context_lines",
        "--context_lines",
        type=int,
        help="context lines per item (json) or candidate (contrapro, bawden); default 1 (contrapro: from the files)",
    )
    s.add_argument(
        "-text_src",
        "--text_src",
        help="published suites: one source line per candidate (contrapro.text.en, scoring_data/NAME.src, "
        "NAME.current.en), instead of the JSON's text",
    )
    s.add_argument("-text_tgt", "--text_tgt", help="the candidates' target lines, as -text_src (.de, .dst, .fr)")
    s.add_argument(
        "-rule",
        "--rule",
        choices=("strict", "first_best", "block"),
        help="when an item is right (default: the suite's own rule: first_best for voita, else strict); "
        "the other rules are reported beside it",
    )
    s.add_argument(
        "-max_context",
        "--max_context",
        type=int,
        default=0,
        help="at most this many preceding sentences (0 = all the suite gives that the model's window holds)",
    )
    s.add_argument(
        "-ablation",
        "--ablation",
        nargs="+",
        default=["none"],
        choices=("none", "remove", "shuffle"),
        help="context as given (none), removed, or shuffled from another document; several allowed",
    )
    s.add_argument("-seed", "--seed", type=int, default=1, help="seed of the shuffle ablation")
    s.add_argument("-item_scores", "--item_scores", help="write every item's scores (JSON Lines)")
    s.add_argument("-batch_tokens", "--batch_tokens", type=int)
    s.add_argument("-device", "--device", default="auto", help="auto, cpu, cuda, cuda:N")
    s.add_argument("-threads", "--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    t = p.add_argument_group("metrics on translations")
    t.add_argument("-hyp", "--hyp", help="translations (one line per -ref line, blank lines between documents)")
    t.add_argument("-ref", "--ref", help="reference translations")
    t.add_argument("-src", "--src", help="source (for lexical consistency)")
    t.add_argument("-lang", "--lang", default="de", help="target language of the built-in pronoun list")
    t.add_argument("-pronouns", "--pronouns", help="pronoun list file (one form a line), replaces -lang's")
    t.add_argument("-lexicon", "--lexicon", help="source<TAB>target lexicon for consistency (default: induced)")
    c = p.add_argument_group("context usage (CXMI)")
    c.add_argument(
        "-cxmi",
        "--cxmi",
        action="store_true",
        help="CXMI of -model on the documents -src/-ref: mean log p(y|x,context) - log p(y|x) per target token",
    )
    c.add_argument("-cxmi_baseline", "--cxmi_baseline", help="score without context by this model (default: -model)")
    c.add_argument(
        "-top_tokens", "--top_tokens", type=int, default=10, help="list the N tokens of largest mean P-CXMI (0: none)"
    )
    e = p.add_argument_group("context pictures (docs/seeing_context.md)")
    e.add_argument(
        "-explain",
        "--explain",
        metavar="DOC",
        help="one document (a sentence per line): translate it and write to -output what -model reads from "
        "context, as pictures (PNG) and a page (index.html); with -ref, of the reference, with its P-CXMI",
    )
    e.add_argument("-output", "--output", help="-explain: the folder to write (created; must be new or empty)")
    e.add_argument("-force", "--force", action="store_true", help="-explain: replace a non-empty -output folder")
    o = p.add_argument_group("output")
    o.add_argument("-json", "--json", help="write the results as JSON to this file ('-' = stdout)")
    o.add_argument("-tensorboard", "--tensorboard", help="log the results as TensorBoard scalars in this folder")
    return p


def _check(args: argparse.Namespace) -> None:
    if not args.suite and not args.hyp and not args.cxmi and not args.explain:
        raise UserError("nothing to evaluate: give -suite (with -model), -hyp with -ref, -cxmi and/or -explain")
    _check_cxmi(args)
    _check_explain(args)
    if args.suite and not args.model:
        raise UserError("-suite needs -model (the checkpoint that scores the candidates)")
    if bool(args.hyp) != bool(args.ref) and not ((args.cxmi or args.explain) and args.ref):
        raise UserError("-hyp and -ref go together")
    if args.max_context < 0:
        raise UserError(f"-max_context must be 0 or more (got {args.max_context})")
    if args.batch_tokens is not None and args.batch_tokens < 1:
        raise UserError(f"-batch_tokens must be at least 1 (got {args.batch_tokens})")
    if args.context_lines is not None and args.context_lines < 1:
        raise UserError(f"-context_lines must be at least 1 (got {args.context_lines})")
    if args.rule == "block" and args.format not in ("auto", "bawden"):
        raise UserError(f"-rule block needs a suite with blocks of items (-format bawden), not {args.format}")
    _check_outputs(args)


def _check_cxmi(args: argparse.Namespace) -> None:
    if args.cxmi and not (args.model and args.src and args.ref):
        raise UserError("-cxmi needs -model, -src and -ref (documents separated by blank lines)")
    if args.cxmi_baseline and not args.cxmi:
        raise UserError("-cxmi_baseline goes with -cxmi")
    if args.top_tokens < 0:
        raise UserError(f"-top_tokens must be 0 or more (got {args.top_tokens})")


def _check_explain(args: argparse.Namespace) -> None:
    if not args.explain:
        if args.output or args.force:
            raise UserError("-output and -force go with -explain")
        return
    if not (args.model and args.output):
        raise UserError("-explain needs -model and -output (the folder for the pictures and the page)")
    if args.cxmi or args.hyp:
        raise UserError("-explain reads -ref as the explained document's reference: run -cxmi or -hyp on their own")
    from onmt_doc.outputs import refuse_folder_holding_inputs

    inputs = [*_inputs(args), ("-explain", args.explain)]
    refuse_folder_holding_inputs(args.output, inputs, "-output")  # before any work; output_folder checks again
    refuse_inputs(args.output, inputs, "-output")
    if os.path.isdir(args.output) and os.listdir(args.output) and not args.force:
        raise UserError(f"-output {args.output} exists and is not an empty folder; add -force to replace it")
    from onmt_doc.evaluation.context_pictures import require_matplotlib

    require_matplotlib()  # before the model loads


INPUT_FLAGS = (
    "model",
    "cxmi_baseline",
    "suite",
    "context_src",
    "context_tgt",
    "text_src",
    "text_tgt",
    "hyp",
    "ref",
    "src",
    "pronouns",
    "lexicon",
    "explain",
)


def _inputs(args: argparse.Namespace) -> list[Input]:
    return [(f"-{flag}", getattr(args, flag)) for flag in INPUT_FLAGS]


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any scoring, outputs that are inputs, each other, folders or unwritable."""
    if args.json and args.item_scores:
        refuse_inputs(args.json, [("-item_scores", args.item_scores)], "-json")
    for flag in ("json", "item_scores"):
        path = getattr(args, flag)
        if path:
            refuse_inputs(path, _inputs(args), f"-{flag}")
            check_writable_target(path, f"-{flag}")
    if args.tensorboard:
        refuse_inputs(args.tensorboard, _inputs(args), "-tensorboard")


def _translator(args: argparse.Namespace, checkpoint: Optional[str] = None) -> Translator:
    import torch

    from onmt_doc.devices import pick_device
    from onmt_doc.models.checkpoint import load_model
    from onmt_doc.translate.translator import Translator, translator_options

    device = pick_device(args.device, key="-device")
    model, cfg, codec = load_model(checkpoint or args.model, device)
    opts = translator_options(cfg.translate, batch_tokens=args.batch_tokens)
    model.to(getattr(torch, opts.dtype))
    return Translator(model, codec, cfg, opts, device)


def contrastive_results(args: argparse.Namespace) -> dict:
    """Accuracy per ablation mode, each a full pass over the (streamed) suite, under the suite's own
    rule (or -rule), the other rules beside it. The suite and its line files are checked against
    each other before the model loads."""
    from onmt_doc.evaluation.contrastive import ablate, check_rule, evaluate_suite, read_suite, suite_format

    fmt = suite_format(args.suite, args.format)
    rule = check_rule(fmt, args.rule)
    files = (args.context_src, args.context_tgt, args.context_lines, args.text_src, args.text_tgt)
    first = read_suite(args.suite, fmt, *files)
    translator = _translator(args)
    results = {}
    scores = output_file(args.item_scores, _inputs(args), "-item_scores") if args.item_scores else None
    with scores or contextlib.nullcontext() as scores_out:
        for n, mode in enumerate(dict.fromkeys(args.ablation)):
            start = time.time()
            items = first if n == 0 else read_suite(args.suite, fmt, *files)
            results[mode] = evaluate_suite(
                translator, ablate(items, mode, args.seed), args.max_context, scores_out, rule=rule
            )
            results[mode]["format"] = fmt
            results[mode]["seconds"] = round(time.time() - start, 2)
            print(
                f"scored {results[mode]['total']} items (context {mode}) in {results[mode]['seconds']:.1f}s",
                file=sys.stderr,
            )
    return results


def cxmi_results(args: argparse.Namespace) -> dict:
    """CXMI of -model on the documents of -src/-ref (streamed), against -cxmi_baseline if given."""
    from onmt_doc.data.corpus import iter_parallel
    from onmt_doc.evaluation.cxmi import cxmi

    translator = _translator(args)
    baseline = _translator(args, args.cxmi_baseline) if args.cxmi_baseline else None
    start = time.time()
    documents = (doc for doc in iter_parallel(args.src, args.ref, documents=True) if doc)
    result = cxmi(translator, documents, baseline, args.max_context, args.top_tokens)
    result["seconds"] = round(time.time() - start, 2)
    print(f"CXMI: scored {result['sentences']} sentences twice in {result['seconds']:.1f}s", file=sys.stderr)
    return result


MAX_EXPLAIN_SENTENCES = 200  # a picture of a longer document is unreadable


def _explain_document(args: argparse.Namespace) -> tuple[list[str], Optional[list[str]]]:
    """-explain's document (and -ref's sentences): exactly one document, at most MAX_EXPLAIN_SENTENCES."""
    from onmt_doc.data.corpus import iter_parallel

    docs = [d for d in iter_parallel(args.explain, args.ref, documents=True) if d]
    if len(docs) != 1:
        raise UserError(f"-explain {args.explain}: {len(docs)} documents; give one (no blank line between sentences)")
    if len(docs[0]) > MAX_EXPLAIN_SENTENCES:
        raise UserError(
            f"-explain {args.explain}: {len(docs[0])} sentences; "
            f"at most {MAX_EXPLAIN_SENTENCES} make a readable picture"
        )
    return [s for s, _ in docs[0]], [t for _, t in docs[0]] if args.ref else None


def explain(args: argparse.Namespace) -> dict:
    """-explain: translate one document, read what the model reads from context on the reference
    (with its P-CXMI) or on the translation, and write the pictures and the page to -output."""
    from onmt_doc.evaluation.context_pictures import png
    from onmt_doc.evaluation.context_reading import add_pcxmi, read_document
    from onmt_doc.evaluation.explain_page import render
    from onmt_doc.outputs import output_folder, write_bytes

    sources, references = _explain_document(args)
    translator = _translator(args)
    translations = translator.translate([sources])[0]
    reading = read_document(translator, sources, references or translations)
    if references:
        add_pcxmi(reading, translator, sources, references)
    inputs = [*_inputs(args), ("-explain", args.explain)]
    with output_folder(args.output, inputs, "-output", force=args.force) as folder:
        pictures = [(png(h), h.title) for h in reading.heatmaps]
        for h, (data, _) in zip(reading.heatmaps, pictures):
            write_bytes(os.path.join(folder, f"{h.key}.png"), data, inputs, "-output")
        page = render(reading, os.path.basename(args.explain), translations, references, pictures)
        write_text(os.path.join(folder, "index.html"), page, inputs, "-output")
    print(f"-explain: wrote {len(pictures)} pictures and index.html to {args.output}", file=sys.stderr)
    return {
        "model": reading.model,
        "sentences": len(sources),
        "reliance": {"mean": float(reading.measure("reliance").mean()) if len(reading.measure("reliance")) else 0.0},
    }


def translation_results(args: argparse.Namespace) -> dict:
    """Corpus and document metrics of -hyp against -ref; needs no model, so it runs on any system's output."""
    from onmt_doc.data.corpus import read_parallel
    from onmt_doc.evaluation.document_metrics import pronoun_list, read_lexicon, translation_metrics

    pairs = read_parallel(args.hyp, args.ref)
    hyp_docs = [[h.split("\t")[0] for h, _ in d] for d in pairs]
    ref_docs = [[r for _, r in d] for d in pairs]
    src_docs = [[s for s, _ in d] for d in read_parallel(args.src, args.ref)] if args.src else None
    lexicon = read_lexicon(args.lexicon) if args.lexicon else None
    return translation_metrics(src_docs, hyp_docs, ref_docs, pronoun_list(args.lang, args.pronouns), lexicon)


def format_translation(m: dict) -> str:
    """One human-readable line of ``translation_results``; -json keeps every number."""
    parts = [f"BLEU {m['bleu']:.2f}", f"chrF {m['chrf']:.2f}"]
    if "d_bleu" in m:
        parts.append(f"d-BLEU {m['d_bleu']:.2f}")
    p = m["pronouns"]
    parts.append(f"pronouns {p['accuracy']:.1f}% ({p['correct']}/{p['total']})")
    if "consistency" in m:
        c, r = m["consistency"], m["consistency_reference"]
        parts.append(
            f"consistency {c['consistency']:.1f}% of {c['repeated_terms']} repeated terms "
            f"(reference {r['consistency']:.1f}%)"
        )
    return " | ".join(parts)


def write_tensorboard(folder: str, results: dict) -> None:
    """Every number of ``results`` as a scalar at step 0, named by its path."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(folder)
    for name, value in _flatten(results):
        writer.add_scalar(name, value, 0)
    writer.close()


def _flatten(tree: dict, prefix: str = "") -> list[tuple[str, float]]:
    out = []
    for k, v in tree.items():
        name = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out += _flatten(v, name)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((name.replace(" ", "_"), float(v)))
    return out


def _main(argv: Optional[list[str]]) -> int:
    args = _parser().parse_args(argv)
    _check(args)
    import torch

    from onmt_doc.evaluation.contrastive import format_table
    from onmt_doc.train.reporting import setup_logging

    setup_logging()
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict = {}
    if args.hyp:
        results["translation"] = translation_results(args)
        print(format_translation(results["translation"]))
    if args.suite:
        results["contrastive"] = contrastive_results(args)
        print(format_table(results["contrastive"]))
    if args.cxmi:
        from onmt_doc.evaluation.cxmi import format_cxmi

        results["cxmi"] = cxmi_results(args)
        print(format_cxmi(results["cxmi"]))
    if args.explain:
        results["explain"] = explain(args)
    if args.json:
        write_text(args.json, json.dumps(results, indent=1, ensure_ascii=False) + "\n", _inputs(args), "-json")
    if args.tensorboard:
        make_folders(args.tensorboard, "-tensorboard")
        write_tensorboard(args.tensorboard, results)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
