"""Single-shot gradient-based model scaling (Li et al., 2020, eqs. 7-11).

Trains the base config and its l+ε (more layers) and w+ε (wider FFN) variants for a short budget
(or reads their validation losses from -losses), estimates dL/dl and dL/dw, solves eq. 11 for the
parameter ratio -beta and writes the scaled config:

  onmt_doc_scale_model -config config_examples/reformer_fast.yaml -beta 2 -steps 500 \\
      -work_dir runs/scaling -output reformer_fast_scaled.yaml [key.path=value ...]
  onmt_doc_scale_model -config config_examples/reformer_fast.yaml -beta 2 \\
      -losses 3.21,3.15,3.17 -output reformer_fast_scaled.yaml
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import yaml

from onmt_doc.bin.common import ArgumentParser, add_config_args, run
from onmt_doc.errors import UserError
from onmt_doc.outputs import check_writable_target, output_file, refuse_inputs


def _main(argv: Optional[list[str]] = None) -> int:
    p = ArgumentParser(
        prog="onmt_doc_scale_model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_args(p)
    p.add_argument(
        "-epsilon",
        "--epsilon",
        type=int,
        default=1,
        help="ε of eq. 10: extra layers, and extra d_model units of FFN width (default 1)",
    )
    p.add_argument("-beta", "--beta", type=float, default=2.0, help="parameter ratio of eq. 11 (default 2)")
    p.add_argument("-losses", "--losses", help="BASE,DEEPER,WIDER validation losses: skip the short runs")
    p.add_argument("-steps", "--steps", type=int, default=1000, help="training steps of each short run")
    p.add_argument("-work_dir", "--work_dir", default="runs/scale_model", help="run folders of the short runs")
    p.add_argument("-ff_multiple", "--ff_multiple", type=int, default=8, help="round the new FFN size to this")
    p.add_argument("-output", "--output", required=True, help="the scaled config (YAML)")
    args = p.parse_args(argv)
    if args.epsilon < 1 or args.steps < 1 or args.ff_multiple < 1:
        raise UserError("-epsilon, -steps and -ff_multiple must be at least 1")

    from onmt_doc.config import load_config
    from onmt_doc.models.depth_width_scaling import (
        measure_losses,
        parse_losses,
        plan_scaling,
        scaled_config,
        scaled_parts,
    )

    cfg = load_config(args.config, args.overrides)
    refuse_inputs(args.output, [("-config", args.config)])
    check_writable_target(args.output)  # before the short runs, not after them
    scaled_parts(cfg)  # a model without layers/ff fails before any training
    losses = parse_losses(args.losses)
    if losses is None:
        from onmt_doc.train.reporting import setup_logging
        from onmt_doc.train.trainer import train

        setup_logging(0)

        def short_run(name: str, overrides: list[str]):
            return load_config(
                args.config,
                list(args.overrides)
                + overrides
                + [
                    f"train.max_steps={args.steps}",
                    f"train.valid_every={args.steps}",
                    f"train.save_every={args.steps}",
                    f"log.dir={os.path.join(args.work_dir, name)}",
                ],
            )

        losses = measure_losses(short_run, cfg, args.epsilon, train)
    dec = cfg.model.decoder
    plan = plan_scaling(dec.layers, dec.ff, cfg.model.d_model, losses, args.epsilon, args.beta, args.ff_multiple)
    with output_file(args.output, [("-config", args.config)]) as f:
        f.write(
            f"# scaled by onmt_doc_scale_model from {args.config}: validation losses "
            f"base/deeper/wider {losses[0]:.4f}/{losses[1]:.4f}/{losses[2]:.4f}, epsilon {args.epsilon}\n"
            f"# {plan.summary()}\n"
        )
        yaml.safe_dump(scaled_config(cfg, plan), f, sort_keys=False, allow_unicode=True)
    print(f"{plan.summary()}; wrote {args.output}", file=sys.stderr)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: user mistakes end as one line and exit status 1 (``run``)."""
    return run(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
