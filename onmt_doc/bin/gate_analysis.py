"""Context-selection error analysis (regularized context gates, sec. 3.3–3.4) of a checkpoint.

  onmt_doc_gate_analysis -model runs/x/checkpoints/last.pt -src test.en -tgt test.de \
      -table runs/x/pmi.npz [-output analysis.json]

Forced decoding of the reference: FER, CER and CE/FE (in %) over the real target tokens, and for
gated decoders the mean and variance of the gates (``onmt_doc/evaluation/gate_analysis.py``).
The table must be built with the checkpoint's vocabularies (onmt_doc_build_pmi_table); z* uses
``-normaliser`` (default: the checkpoint's ``pmi_gate_hinge`` loss, else ``shared``), reported as
``normaliser`` in the output.
"""

from __future__ import annotations

import argparse
import json
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.errors import UserError
from onmt_doc.outputs import check_readable_file, check_writable_target, refuse_inputs, write_text


def _main(argv: Optional[list[str]] = None) -> int:
    p = ArgumentParser(
        prog="onmt_doc_gate_analysis", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-model", "--model", required=True, help="checkpoint")
    p.add_argument("-src", "--src", required=True)
    p.add_argument("-tgt", "--tgt", required=True)
    p.add_argument("-table", "--table", required=True, help="PMI table (onmt_doc_build_pmi_table)")
    p.add_argument(
        "-normaliser",
        "--normaliser",
        choices=["shared", "per_scenario"],
        help="Z of eq. 6 for z* (default: the checkpoint's pmi_gate_hinge loss, else shared)",
    )
    p.add_argument("-output", "--output", help="also write the numbers as JSON here")
    p.add_argument("-batch_tokens", "--batch_tokens", type=int, default=4096)
    p.add_argument("-threads", "--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    args = p.parse_args(argv)
    if args.batch_tokens < 1:
        raise UserError(f"-batch_tokens must be at least 1 (got {args.batch_tokens})")
    inputs = [("-model", args.model), ("-src", args.src), ("-tgt", args.tgt), ("-table", args.table)]
    for flag, path in inputs[1:]:
        check_readable_file(path, flag)
    if args.output:
        refuse_inputs(args.output, inputs)
        check_writable_target(args.output)

    import torch

    from onmt_doc.data.pmi import PMITable
    from onmt_doc.evaluation.gate_analysis import analyse_gates
    from onmt_doc.models.checkpoint import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model, cfg, codec = load_model(args.model)
    normaliser = args.normaliser or next(
        (getattr(c, "normaliser") for c in cfg.loss if c.type == "pmi_gate_hinge"), "shared"
    )
    table = PMITable.load(args.table, codec, normaliser)
    result = analyse_gates(model, codec, cfg, args.src, args.tgt, table, args.batch_tokens)
    for key, value in result.items():
        shown = (
            [round(v, 4) for v in value]
            if isinstance(value, list)
            else (f"{value:.4f}" if isinstance(value, float) else value)
        )
        print(f"{key}\t{shown}")
    if args.output:
        write_text(args.output, json.dumps(result, indent=1), inputs)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
