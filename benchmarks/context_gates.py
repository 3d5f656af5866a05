#!/usr/bin/env python3
"""Transformer vs context gates vs regularized context gates (Li et al., 2020) on Multi30k en→de.

The rows of the paper's tables 1, 3 and 4 at CPU scale, all three models with the same encoder,
sizes, vocabulary, batches, schedule and steps:

1. one shared BPE vocabulary (``onmt_doc_build_vocab``), copied into every run folder;
2. the PMI table of the training corpus (``tools/build_pmi_table.py``), timed with its peak
   memory, and the same for a ~100k-pair concatenation of the shared data sets;
3. per model: ``onmt_doc_train``, ``onmt_doc_translate`` of test2016 (BLEU), and
   ``tools/gate_analysis.py`` (FER, CER, CE/FE, gate mean/variance) on test2016;
4. ``<out>/results.md`` (the tables for docs/benchmarks.md) and ``<out>/results.json``.

    python benchmarks/context_gates.py --out runs/bench_context_gates --steps 400   # ~25 min, 2 cores
    python benchmarks/context_gates.py --out runs/bench_cg_smoke --steps 20 --no-concat   # smoke test

Runs are named ``<model>_<norm>`` (``regularized_<norm>_<normaliser>``), so calls with other
``--norm`` / ``--normaliser`` and ``--only models`` add rows to the same ``<out>/results.json``.
The Transformer uses the gated decoders' blocks (pre-norm for ``--norm paper``, which it lacks).
Every model is analysed with z* under both normalisers (CER and CE/FE depend on it).
"""

from __future__ import annotations

import argparse
import os
import sys

from common import (
    base_config,
    bleu,
    last_validation,
    log,
    machine,
    multi30k,
    params_m,
    prepare_run,
    read_json,
    recipe_arguments,
    timed,
    tool,
    write_results,
    write_yaml,
)


def concat_sources(data: str) -> list[tuple[str, str]]:
    """en→de pairs of the shared sets for the 100k-pair counting benchmark (iwslt14 is de→en: swapped)."""
    m30k = multi30k(data)
    return (
        [(f"{m30k}/{n}.en", f"{m30k}/{n}.de") for n in ("train", "valid", "test2016")]
        + [(f"{data}/news-sent-en-de/newstest2008-2013.en", f"{data}/news-sent-en-de/newstest2008-2013.de")]
        + [
            (f"{data}/docmt-en-de/{d}.{s}.en", f"{data}/docmt-en-de/{d}.{s}.de")
            for d in ("ted", "news", "europarl")
            for s in ("dev", "test")
        ]
        + [
            (f"{data}/iwslt14-ted-de-en/{n}.en", f"{data}/iwslt14-ted-de-en/{n}.de")
            for n in ("dev2010", "tst2010", "tst2011", "tst2012")
        ]
    )


def model_configs(args: argparse.Namespace, out: str) -> dict[str, dict]:
    """The three models' configs: same recipe, decoder and losses differ."""
    shape = {"layers": args.layers, "heads": 4, "ff": 4 * args.d_model}
    ce = {"type": "label_smoothed_ce", "smoothing": 0.1}
    hinge = {"type": "pmi_gate_hinge", "weight": args.weight, "table": f"{out}/pmi.npz", "normaliser": args.normaliser}
    gated = {"type": "gated_transformer", "norm": args.norm, **shape}
    decoders = {
        "transformer": ({"type": "transformer", "pre_norm": args.norm != "post", **shape}, [ce]),
        "context_gates": (gated, [ce]),
        "regularized": (gated, [ce, hinge]),
    }
    configs = {}
    for name, (decoder, losses) in decoders.items():
        run = f"{name}_{args.norm}" + (f"_{args.normaliser}" if name == "regularized" else "")
        cfg = base_config(args, f"{out}/{run}/run")
        cfg["model"]["decoder"] = dict(decoder)
        cfg["loss"] = losses
        configs[name] = cfg
    return configs


def write_concat(path: str, limit: int, data: str) -> int:
    """Up to ``limit`` en→de pairs of the shared sets (blank lines dropped), multi30k train
    repeated at the end to reach ``limit``."""
    n = 0
    m30k = multi30k(data)
    with open(path + ".en", "w", encoding="utf-8") as fe, open(path + ".de", "w", encoding="utf-8") as fd:
        for src, tgt in concat_sources(data) + [(f"{m30k}/train.en", f"{m30k}/train.de")] * 3:
            with open(src, encoding="utf-8") as a, open(tgt, encoding="utf-8") as b:
                for s, t in zip(a, b):
                    if s.strip() and t.strip() and n < limit:
                        fe.write(s.strip() + "\n")
                        fd.write(t.strip() + "\n")
                        n += 1
    return n


def summary(stderr: str, marker: str = "sentence pairs:") -> str:
    """The build_pmi_table.py line with ``marker`` (the counts, or the share of z* = 1)."""
    return next((line for line in stderr.splitlines() if marker in line), "")


def count_tokens(path: str, codec_cfg: str) -> float:
    """Mean subwords per target sentence of ``path`` under the run's codec."""
    from onmt_doc.config import load_config
    from onmt_doc.data.prepare import load_codec

    cfg = load_config(codec_cfg)
    codec = load_codec(cfg, cfg.log.dir)
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return sum(len(ids) for ids in codec.encode(lines, "tgt")) / max(len(lines), 1)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    recipe_arguments(p, "runs/bench_context_gates", 400)
    p.add_argument("--weight", type=float, default=1.0, help="λ of the hinge loss")
    p.add_argument("--norm", default="post", choices=["paper", "pre", "post"], help="gated decoder's norm placement")
    p.add_argument(
        "--normaliser",
        default="shared",
        choices=["shared", "per_scenario"],
        help="Z of eq. 6 for the regularized model's z*",
    )
    p.add_argument("--concat", type=int, default=100000, help="pairs of the PMI counting benchmark")
    p.add_argument("--no-concat", dest="concat", action="store_const", const=0)
    p.add_argument(
        "--models", default="transformer,context_gates,regularized", help="comma-separated subset of the three models"
    )
    p.add_argument("--only", choices=["pmi", "models"], help="redo one part, keep the other from <out>/results.json")
    return p.parse_args()


def start_results(args: argparse.Namespace, out: str) -> dict:
    """A fresh results dict; with ``--only``, the other part's rows and commands of the earlier run."""
    results: dict = {"args": vars(args), "machine": machine(), "commands": []}
    old = read_json(f"{out}/results.json") if args.only else None
    if old:
        results["pmi"], results["runs"] = old.get("pmi", {}), old.get("runs", {})
        redo = ("build_pmi_table", " -c ") if args.only == "pmi" else ()  # model runs add rows
        results["commands"] = [c for c in old["commands"] if not any(r in c for r in redo)]
        results["args"] = {**old["args"], **{k: v for k, v in vars(args).items() if k in ("only", "concat")}}
    return results


def main() -> None:
    args = parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    results = start_results(args, out)

    def run(name: str, cmd: list[str]) -> tuple[float, float, str]:
        results["commands"].append(" ".join(cmd))
        log(f"{name}: {' '.join(cmd)}")
        wall, rss, err = timed(cmd, f"{out}/{name}.log", args.threads)
        log(f"{name}: {wall:.1f} s, peak {rss:.0f} MiB")
        return wall, rss, err

    vocab_cfg = write_yaml(base_config(args, f"{out}/vocab"), f"{out}/vocab/config.yaml")
    if not os.path.exists(f"{out}/vocab/vocab.txt"):
        run("build_vocab", [*tool("onmt_doc_build_vocab"), "-config", vocab_cfg])

    if args.only != "models":
        results["pmi"] = count_pmi(args, out, vocab_cfg, run)
    if args.only != "pmi":
        results.setdefault("runs", {}).update(train_models(args, out, run))
    write_results(out, results, render)


def pmi_row(pairs: int, wall: float, rss: float, err: str, tgt: str, vocab_cfg: str, table: str) -> dict:
    """One row of the PMI counting table."""
    return {
        "pairs": pairs,
        "seconds": wall,
        "rss_mib": rss,
        "summary": summary(err),
        "tgt_subwords_per_sentence": count_tokens(tgt, vocab_cfg),
        "file_mib": os.path.getsize(table) / 2**20,
    }


def count_pmi(args: argparse.Namespace, out: str, vocab_cfg: str, run) -> dict:
    """PMI counting: time and peak memory (and the memory of the imports alone)."""
    py = sys.executable
    count = [py, "tools/build_pmi_table.py", "-config", vocab_cfg]
    _, base_rss, _ = run("imports", [py, "-c", "import onmt_doc.data.pmi, onmt_doc.data.prepare, torch"])
    pmi = {"imports_rss_mib": base_rss}
    wall, rss, err = run("pmi_multi30k", [*count, "-output", f"{out}/pmi.npz"])
    _, _, err_ps = run(
        "pmi_multi30k_per_scenario", [*count, "-output", f"{out}/pmi_per_scenario.npz", "-normaliser", "per_scenario"]
    )
    pmi["z_star_train"] = {"shared": summary(err, "z* = 1 for"), "per_scenario": summary(err_ps, "z* = 1 for")}
    pmi["multi30k"] = pmi_row(29000, wall, rss, err, f"{multi30k(args.data)}/train.de", vocab_cfg, f"{out}/pmi.npz")
    if args.concat:
        n = write_concat(f"{out}/concat", args.concat, args.data)
        wall, rss, err = run(
            "pmi_concat",
            [*count, "-src", f"{out}/concat.en", "-tgt", f"{out}/concat.de", "-output", f"{out}/pmi_concat.npz"],
        )
        pmi["concat"] = pmi_row(n, wall, rss, err, f"{out}/concat.de", vocab_cfg, f"{out}/pmi_concat.npz")
    return pmi


def train_models(args: argparse.Namespace, out: str, run) -> dict:
    """Train, translate and analyse the chosen models; rows keyed by run name."""
    models = {}
    for model, cfg in model_configs(args, out).items():
        if model in args.models.split(","):
            name = os.path.basename(os.path.dirname(cfg["log"]["dir"]))
            models[name] = model_row(args, out, run, model, name, cfg)
            log(f"{name}: {models[name]}")
    return models


def model_row(args: argparse.Namespace, out: str, run, model: str, name: str, cfg: dict) -> dict:
    """Train (unless the run has a checkpoint), translate test2016 and analyse the gates of one model."""
    m30k = multi30k(args.data)
    path, ckpt = prepare_run(cfg, out, name)
    row: dict = {"model": model, "norm": args.norm, "normaliser": args.normaliser if model == "regularized" else ""}
    if not os.path.exists(ckpt):
        row["train_seconds"], _, err = run(f"{name}_train", [*tool("onmt_doc_train"), "-config", path])
    else:
        with open(f"{out}/{name}_train.log", encoding="utf-8") as f:
            err = f.read()
    row["valid"] = last_validation(err)
    row["params_m"] = params_m(err)
    _, _, err = run(
        f"{name}_translate",
        [
            *tool("onmt_doc_translate"),
            "-model",
            ckpt,
            "-src",
            f"{m30k}/test2016.en",
            "-tgt",
            f"{m30k}/test2016.de",
            "-beam",
            "4",
            "-threads",
            str(args.threads),
            "-output",
            f"{out}/{name}/test.hyp",
        ],
    )
    row["bleu"] = bleu(err)
    for z in ("shared", "per_scenario"):
        run(
            f"{name}_analysis_{z}",
            [
                sys.executable,
                "tools/gate_analysis.py",
                "-model",
                ckpt,
                "-src",
                f"{m30k}/test2016.en",
                "-tgt",
                f"{m30k}/test2016.de",
                "-table",
                f"{out}/pmi.npz",
                "-normaliser",
                z,
                "-threads",
                str(args.threads),
                "-output",
                f"{out}/{name}/analysis_{z}.json",
            ],
        )
        row[z] = read_json(f"{out}/{name}/analysis_{z}.json")
    return row


def render(results: dict) -> str:
    a = results["args"]
    lines = [
        f"Machine: {results['machine']}; {a['threads']} threads. Model: d_model {a['d_model']}, "
        f"{a['layers']}+{a['layers']} layers, 4 heads, ff {4 * a['d_model']}, {a['steps']} steps of "
        f"{a['batch_tokens']} tokens, λ = {a['weight']}. CER, CE/FE and gates on the wrong side: "
        "z* with the shared / per-scenario normaliser.",
        "",
        "| run | decoder norm | z* of the hinge | params | train s | BLEU | FER % | CER % | CE/FE % | gate mean "
        "| gate var | gates on the wrong side of z* % | valid |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    runs = results.get("runs", {})
    for name, r in runs.items():
        sh, ps = r["shared"], r["per_scenario"]
        gate = (
            f"{sh['gate_mean']:.3f} | {sh['gate_var']:.3f} | {sh['gate_wrong_side']:.1f} / {ps['gate_wrong_side']:.1f}"
            if "gate_mean" in sh
            else "– | – | –"
        )
        lines.append(
            f"| {name} | {r['norm']} | {r['normaliser'] or '–'} | {r['params_m']}M | "
            f"{r.get('train_seconds', float('nan')):.0f} | {r['bleu']:.2f} | {sh['FER']:.1f} | "
            f"{sh['CER']:.1f} / {ps['CER']:.1f} | {sh['CE/FE']:.1f} / {ps['CE/FE']:.1f} | {gate} | "
            f"{r['valid'].replace(' | ', ', ')} |"
        )
    if runs:
        first = next(iter(runs.values()))
        lines += [
            "",
            f"test2016: {first['shared']['tokens']} target subwords (markup excluded), z* = 1 for "
            f"{first['shared']['z_star_source']:.1f}% of them (shared normaliser) and "
            f"{first['per_scenario']['z_star_source']:.1f}% (per-scenario).",
            "",
        ]
    pmi = results.get("pmi", {})
    if "z_star_train" in pmi:
        lines += [
            "Training corpus (tools/build_pmi_table.py, last line): "
            + "; ".join(f"{k}: {v}" for k, v in pmi["z_star_train"].items()),
            "",
        ]
    if pmi:
        lines += [
            "| PMI table | sentence pairs | target subwords / sentence | time s | peak RSS MiB | table file MiB "
            "| counts |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for key, r in pmi.items():
            if isinstance(r, dict) and "pairs" in r:
                lines.append(
                    f"| {key} | {r['pairs']} | {r['tgt_subwords_per_sentence']:.1f} | {r['seconds']:.1f} | "
                    f"{r['rss_mib']:.0f} | {r['file_mib']:.1f} | {r['summary']} |"
                )
        lines += ["", f"Peak RSS of the imports alone (python, torch, onmt_doc): {pmi['imports_rss_mib']:.0f} MiB.", ""]
    lines += ["Commands:", "", "```", *results["commands"], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
