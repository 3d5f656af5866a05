"""``python -m benchmarks run SPEC [--smoke] [--out DIR]`` · ``list`` · ``report SPEC --out DIR``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from onmt_doc.errors import UserError

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")


def default_out(name: str, smoke: bool, parent: Optional[str] = None) -> str:
    """``runs/bench/<spec>[-smoke]``, or ``<parent>/<spec>`` when several specs run at once."""
    from benchmarks.suite.system import REPO

    return os.path.join(
        parent or os.path.join(REPO, "runs", "bench"), name + ("-smoke" if smoke and not parent else "")
    )


def run(spec, out: str, args: argparse.Namespace, argv: list[str], stand_in_root: str) -> int:
    """``run`` for one spec: its data (toy stand-ins under --smoke unless --data, written into
    ``stand_in_root``, a run folder of the suite), then the stages."""
    from benchmarks.suite import report, runner
    from benchmarks.suite.smoke_data import make_smoke_data

    out = os.path.abspath(out)  # the stages' processes run in the repository, not in the caller's folder
    runner.claim_run_folder(out)
    data = args.data
    if not data:
        stand_ins = os.path.join(stand_in_root, ".smoke-data")
        data = make_smoke_data(stand_ins) if args.smoke else os.environ.get("ONMT_DOC_DATA", DEFAULT_DATA)
    if args.only:
        return runner.run_stage(spec, args.only, out, args.smoke, data, args.device, args.deadline)
    if args.stages:
        spec.stages = runner.select_stages(spec, args.stages.split(","))
    rc = runner.run_spec(spec, out, args.smoke, data, args.device, argv, args.in_process)
    if args.report:
        report.write_report(spec, out)
    return rc


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a spec's stages in order, writing results as they come")
    r.add_argument("spec", nargs="+", help="spec files, or names in benchmarks/specs/ (gpu.yaml)")
    r.add_argument("--out", help="the run folder (default runs/bench/<spec>[-smoke]); several specs: their parent")
    r.add_argument("--smoke", action="store_true", help="toy sizes: the whole spec end to end in minutes")
    r.add_argument(
        "--data",
        help="the real data sets (default ../shared/data or $ONMT_DOC_DATA; --smoke: toy stand-ins the suite writes)",
    )
    r.add_argument("--device", default="spec", choices=["spec", "auto", "cuda", "cpu"], help="override the spec's")
    r.add_argument("--stages", help="run only these stages (comma-separated names), in the spec's order")
    r.add_argument("--in-process", action="store_true", help="run the stages in this process (no budgets)")
    r.add_argument("--report", action="store_true", help="regenerate the spec's docs/benchmarks.md section after")
    r.add_argument("--only", help=argparse.SUPPRESS)  # the runner's child: one stage in this process
    r.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    sub.add_parser("list", help="the specs and their stages")
    rep = sub.add_parser("report", help="regenerate a spec's section of docs/benchmarks.md from a run folder")
    rep.add_argument("spec")
    rep.add_argument("--out", help="the run folder (default runs/bench/<spec>)")
    rep.add_argument("--docs", help="the Markdown file (default docs/benchmarks.md)")
    rep.add_argument("--print", action="store_true", help="print the section instead of writing it")
    args = p.parse_args(argv)

    from benchmarks.suite import report
    from benchmarks.suite.spec import all_specs, load_spec
    from benchmarks.suite.system import REPO

    try:
        if args.command == "list":
            for path in all_specs():
                spec = load_spec(path)
                stages = ", ".join(f"{s.name} ({s.type})" for s in spec.stages)
                print(f"{os.path.relpath(path, REPO)}: {spec.title} [{spec.device}, {spec.budget_seconds:.0f} s]")
                print(f"    stages: {stages}")
            return 0
        if args.command == "report":
            spec = load_spec(args.spec)
            out = args.out or default_out(spec.name, False)
            if not os.path.exists(os.path.join(out, "run.json")):
                raise UserError(f"{out}: no run.json (run the spec first, or name its folder with --out)")
            if args.print:
                print(report.render(spec, out))
            else:
                report.write_report(spec, out, args.docs or report.DOCS)
                print(f"updated '## {spec.section}' in {args.docs or report.DOCS}")
            return 0
        specs = [load_spec(path) for path in args.spec]  # all checked before anything runs
        from benchmarks.suite.runner import claim_run_folder

        several = args.out and len(specs) > 1
        if several:  # the parent of the specs' run folders is one too
            claim_run_folder(args.out)
        rc = 0
        for spec in specs:
            out = args.out if args.out and len(specs) == 1 else default_out(spec.name, args.smoke, args.out)
            rc = max(rc, run(spec, out, args, argv, args.out if several else out))
        return rc
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("benchmarks: interrupted; the running stage was stopped (results.jsonl keeps what it measured)",
              file=sys.stderr)  # fmt: skip
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
