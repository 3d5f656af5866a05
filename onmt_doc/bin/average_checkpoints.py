"""Average the weights of several checkpoints of one run (Vaswani et al., 2017, sec. 6.1).

onmt_doc_average_checkpoints -models runs/x/checkpoints/step_*.pt -output avg.pt
onmt_doc_average_checkpoints -run_dir runs/x -last 5 -output avg.pt
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Optional

from onmt_doc.bin.common import ArgumentParser, run
from onmt_doc.errors import UserError
from onmt_doc.models.checkpoint import average_checkpoints, save_checkpoint
from onmt_doc.outputs import check_writable_target, refuse_inputs


def _main(argv: Optional[list[str]] = None) -> int:
    p = ArgumentParser(
        prog="onmt_doc_average_checkpoints", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-models", "--models", nargs="+", help="checkpoints to average")
    p.add_argument("-run_dir", "--run_dir", help="a run folder: average its last -last step_N.pt files")
    p.add_argument("-last", "--last", type=int, default=5)
    p.add_argument("-output", "--output", required=True)
    args = p.parse_args(argv)
    if args.last < 1:
        raise UserError(f"-last must be at least 1 (got {args.last})")
    paths = args.models or []
    if args.run_dir:
        found = glob.glob(os.path.join(args.run_dir, "checkpoints", "step_*.pt"))
        found.sort(key=lambda x: int(re.search(r"step_(\d+)\.pt$", x).group(1)))
        paths += found[-args.last :]
    if not paths:
        raise UserError("give -models or a -run_dir with step_N.pt checkpoints")
    inputs = [("-models", path) for path in paths]
    refuse_inputs(args.output, inputs)
    _refuse_training_name(args.output)
    check_writable_target(args.output, make_folder=True)
    save_checkpoint(average_checkpoints(paths), args.output)
    print(f"averaged {len(paths)} checkpoints into {args.output}", file=sys.stderr)
    return 0


TRAINING_NAME = re.compile(r"^(step_\d+|last|best)\.pt$")


def _refuse_training_name(output: str) -> None:
    """An average named like a training checkpoint inside a run's ``checkpoints/`` would be taken
    for one: resumed from (no training state), or counted and deleted by ``train.keep_last``."""
    real = os.path.realpath(output)
    if os.path.basename(os.path.dirname(real)) == "checkpoints" and TRAINING_NAME.match(os.path.basename(real)):
        raise UserError(
            f"-output {output} would be taken for one of the run's own training checkpoints "
            f"(resume, train.keep_last); give it another name, e.g. {os.path.join(os.path.dirname(output), 'avg.pt')}"
        )


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
