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
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "/work/shared/data"
M30K = f"{DATA}/multi30k-en-de"
TIME = "/usr/bin/time"
# en→de pairs of the shared sets for the 100k-pair counting benchmark (iwslt14 is de→en: swapped)
CONCAT = ([(f"{M30K}/{n}.en", f"{M30K}/{n}.de") for n in ("train", "valid", "test2016")]
          + [(f"{DATA}/news-sent-en-de/newstest2008-2013.en", f"{DATA}/news-sent-en-de/newstest2008-2013.de")]
          + [(f"{DATA}/docmt-en-de/{d}.{s}.en", f"{DATA}/docmt-en-de/{d}.{s}.de")
             for d in ("ted", "news", "europarl") for s in ("dev", "test")]
          + [(f"{DATA}/iwslt14-ted-de-en/{n}.en", f"{DATA}/iwslt14-ted-de-en/{n}.de")
             for n in ("dev2010", "tst2010", "tst2011", "tst2012")])


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def timed(cmd: list[str], log_path: str, threads: int) -> tuple[float, float, str]:
    """Run ``cmd``; wall seconds, peak resident memory (MiB) and its stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    wrapped = [TIME, "-f", "__time__ %e %M", *cmd] if os.path.exists(TIME) else cmd
    start = time.time()
    proc = subprocess.run(wrapped, cwd=REPO, env=env, capture_output=True, text=True)
    with open(log_path, "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}; see {log_path}")
    m = re.search(r"__time__ ([\d.]+) (\d+)", proc.stderr)
    wall, rss = (float(m.group(1)), int(m.group(2)) / 1024) if m else (time.time() - start, float("nan"))
    return wall, rss, proc.stderr


def recipe_arguments(p: argparse.ArgumentParser, out: str, steps: int) -> None:
    """The options ``base_config`` reads (shared by the Multi30k benchmarks built on it)."""
    p.add_argument("--out", default=out)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch_tokens", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)


def base_config(args, run_dir: str) -> dict:
    return {
        "data": {"train": {"src": f"{M30K}/train.en", "tgt": f"{M30K}/train.de"},
                 "valid": {"src": f"{M30K}/valid.en", "tgt": f"{M30K}/valid.de"}, "documents": False},
        "vocab": {"subword": "bpe", "size": 8000, "shared": True},
        "model": {"d_model": args.d_model, "dropout": 0.1, "attention_dropout": 0.1,
                  "encoder": {"type": "transformer", "layers": args.layers, "heads": 4, "ff": 4 * args.d_model}},
        "optim": {"type": "adam", "lr": 0.5, "betas": [0.9, 0.998], "eps": 1.0e-8,
                  "schedule": {"type": "noam", "warmup": args.warmup}},
        "train": {"batch_tokens": args.batch_tokens, "max_steps": args.steps, "valid_every": args.steps,
                  "save_every": args.steps, "keep_last": 1, "valid_bleu": False, "max_grad_norm": 0.0,
                  "threads": args.threads, "seed": 1},
        "translate": {"beam": 4},
        "log": {"dir": run_dir, "tensorboard": True, "every": 50},
    }


def model_configs(args, out: str) -> dict[str, dict]:
    shape = {"layers": args.layers, "heads": 4, "ff": 4 * args.d_model}
    ce = {"type": "label_smoothed_ce", "smoothing": 0.1}
    hinge = {"type": "pmi_gate_hinge", "weight": args.weight, "table": f"{out}/pmi.npz",
             "normaliser": args.normaliser}
    gated = {"type": "gated_transformer", "norm": args.norm, **shape}
    decoders = {"transformer": ({"type": "transformer", "pre_norm": args.norm != "post", **shape}, [ce]),
                "context_gates": (gated, [ce]),
                "regularized": (gated, [ce, hinge])}
    configs = {}
    for name, (decoder, losses) in decoders.items():
        run = f"{name}_{args.norm}" + (f"_{args.normaliser}" if name == "regularized" else "")
        cfg = base_config(args, f"{out}/{run}/run")
        cfg["model"]["decoder"] = dict(decoder)
        cfg["loss"] = losses
        configs[name] = cfg
    return configs


def write_yaml(cfg: dict, path: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def prepare_run(cfg: dict, out: str, name: str) -> tuple[str, str]:
    """Give a model's run folder the shared vocabulary (``<out>/vocab``) and write its config;
    returns (config path, last checkpoint path)."""
    run_dir = cfg["log"]["dir"]
    os.makedirs(run_dir, exist_ok=True)
    for f in ("subword.model", "vocab.txt"):
        shutil.copyfile(f"{out}/vocab/{f}", f"{run_dir}/{f}")
    return write_yaml(cfg, f"{out}/{name}/config.yaml"), f"{run_dir}/checkpoints/last.pt"


def write_results(out: str, results: dict, render) -> None:
    """``<out>/results.json`` and the rendered ``<out>/results.md``, and print the report."""
    with open(f"{out}/results.json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    report = render(results)
    with open(f"{out}/results.md", "w", encoding="utf-8") as f:
        f.write(report)
    print(report)


def write_concat(path: str, limit: int) -> int:
    """Up to ``limit`` en→de pairs of the shared sets (blank lines dropped), multi30k train
    repeated at the end to reach ``limit``."""
    n = 0
    with open(path + ".en", "w", encoding="utf-8") as fe, open(path + ".de", "w", encoding="utf-8") as fd:
        for src, tgt in CONCAT + [(f"{M30K}/train.en", f"{M30K}/train.de")] * 3:
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    recipe_arguments(p, "runs/bench_context_gates", 400)
    p.add_argument("--weight", type=float, default=1.0, help="λ of the hinge loss")
    p.add_argument("--norm", default="paper", choices=["paper", "pre", "post"], help="gated decoder's norm placement")
    p.add_argument("--normaliser", default="shared", choices=["shared", "per_scenario"],
                   help="Z of eq. 6 for the regularized model's z*")
    p.add_argument("--concat", type=int, default=100000, help="pairs of the PMI counting benchmark")
    p.add_argument("--no-concat", dest="concat", action="store_const", const=0)
    p.add_argument("--models", default="transformer,context_gates,regularized",
                   help="comma-separated subset of the three models")
    p.add_argument("--only", choices=["pmi", "models"], help="redo one part, keep the other from <out>/results.json")
    args = p.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    results: dict = {"args": vars(args), "machine": f"{platform.processor() or platform.machine()}, "
                     f"{len(os.sched_getaffinity(0))} cores visible", "commands": []}
    if args.only and os.path.exists(f"{out}/results.json"):
        with open(f"{out}/results.json", encoding="utf-8") as f:
            old = json.load(f)
        results["pmi"], results["runs"] = old.get("pmi", {}), old.get("runs", {})
        redo = ("build_pmi_table", " -c ") if args.only == "pmi" else ()   # model runs add rows
        results["commands"] = [c for c in old["commands"] if not any(r in c for r in redo)]
        results["args"] = {**old["args"], **{k: v for k, v in vars(args).items() if k in ("only", "concat")}}

    def run(name: str, cmd: list[str]) -> tuple[float, float, str]:
        results["commands"].append(" ".join(cmd))
        log(f"{name}: {' '.join(cmd)}")
        wall, rss, err = timed(cmd, f"{out}/{name}.log", args.threads)
        log(f"{name}: {wall:.1f} s, peak {rss:.0f} MiB")
        return wall, rss, err

    vocab_cfg = write_yaml(base_config(args, f"{out}/vocab"), f"{out}/vocab/config.yaml")
    if not os.path.exists(f"{out}/vocab/vocab.txt"):
        run("build_vocab", [shutil.which("onmt_doc_build_vocab") or "onmt_doc_build_vocab", "-config", vocab_cfg])

    if args.only != "models":
        results["pmi"] = count_pmi(args, out, vocab_cfg, run)
    if args.only != "pmi":
        results.setdefault("runs", {}).update(train_models(args, out, run))
    write_results(out, results, render)


def count_pmi(args, out: str, vocab_cfg: str, run) -> dict:
    """PMI counting: time and peak memory (and the memory of the imports alone)."""
    py = sys.executable
    _, base_rss, _ = run("imports", [py, "-c", "import onmt_doc.pmi, onmt_doc.data.prepare, torch"])
    pmi = {"imports_rss_mib": base_rss}
    wall, rss, err = run("pmi_multi30k", [py, "tools/build_pmi_table.py", "-config", vocab_cfg, "-output", f"{out}/pmi.npz"])
    _, _, err_ps = run("pmi_multi30k_per_scenario", [py, "tools/build_pmi_table.py", "-config", vocab_cfg, "-output",
                                                     f"{out}/pmi_per_scenario.npz", "-normaliser", "per_scenario"])
    pmi["z_star_train"] = {"shared": summary(err, "z* = 1 for"), "per_scenario": summary(err_ps, "z* = 1 for")}
    pmi["multi30k"] = {"pairs": 29000, "seconds": wall, "rss_mib": rss, "summary": summary(err),
                       "tgt_subwords_per_sentence": count_tokens(f"{M30K}/train.de", vocab_cfg),
                       "file_mib": os.path.getsize(f"{out}/pmi.npz") / 2 ** 20}
    if args.concat:
        n = write_concat(f"{out}/concat", args.concat)
        wall, rss, err = run("pmi_concat", [py, "tools/build_pmi_table.py", "-config", vocab_cfg, "-src",
                                            f"{out}/concat.en", "-tgt", f"{out}/concat.de", "-output", f"{out}/pmi_concat.npz"])
        pmi["concat"] = {"pairs": n, "seconds": wall, "rss_mib": rss, "summary": summary(err),
                         "tgt_subwords_per_sentence": count_tokens(f"{out}/concat.de", vocab_cfg),
                         "file_mib": os.path.getsize(f"{out}/pmi_concat.npz") / 2 ** 20}
    return pmi


def train_models(args, out: str, run) -> dict:
    """Train, translate and analyse the chosen models; rows keyed by run name."""
    py = sys.executable
    models = {}
    for model, cfg in model_configs(args, out).items():
        if model not in args.models.split(","):
            continue
        name = os.path.basename(os.path.dirname(cfg["log"]["dir"]))
        path, ckpt = prepare_run(cfg, out, name)
        row: dict = {"model": model, "norm": args.norm, "normaliser": args.normaliser if model == "regularized" else ""}
        if not os.path.exists(ckpt):
            row["train_seconds"], _, err = run(f"{name}_train", [shutil.which("onmt_doc_train") or "onmt_doc_train",
                                                                 "-config", path])
        else:
            with open(f"{out}/{name}_train.log", encoding="utf-8") as f:
                err = f.read()
        valid = re.findall(r"validation at step \d+: (.*)", err)
        row["valid"] = valid[-1] if valid else ""
        params = re.search(r"([\d.]+)M parameters", err)
        row["params_m"] = float(params.group(1)) if params else None
        _, _, err = run(f"{name}_translate", [shutil.which("onmt_doc_translate") or "onmt_doc_translate", "-model", ckpt,
                                              "-src", f"{M30K}/test2016.en", "-tgt", f"{M30K}/test2016.de", "-beam", "4",
                                              "-threads", str(args.threads), "-output", f"{out}/{name}/test.hyp"])
        row["bleu"] = float(re.search(r"BLEU ([\d.]+)", err).group(1))
        for z in ("shared", "per_scenario"):
            run(f"{name}_analysis_{z}", [py, "tools/gate_analysis.py", "-model", ckpt, "-src", f"{M30K}/test2016.en",
                                         "-tgt", f"{M30K}/test2016.de", "-table", f"{out}/pmi.npz", "-normaliser", z,
                                         "-threads", str(args.threads), "-output", f"{out}/{name}/analysis_{z}.json"])
            with open(f"{out}/{name}/analysis_{z}.json", encoding="utf-8") as f:
                row[z] = json.load(f)
        models[name] = row
        log(f"{name}: {row}")
    return models


def render(results: dict) -> str:
    a = results["args"]
    lines = [f"Machine: {results['machine']}; {a['threads']} threads. Model: d_model {a['d_model']}, "
             f"{a['layers']}+{a['layers']} layers, 4 heads, ff {4 * a['d_model']}, {a['steps']} steps of "
             f"{a['batch_tokens']} tokens, λ = {a['weight']}. CER, CE/FE and gates on the wrong side: "
             "z* with the shared / per-scenario normaliser.", "",
             "| run | decoder norm | z* of the hinge | params | train s | BLEU | FER % | CER % | CE/FE % | gate mean "
             "| gate var | gates on the wrong side of z* % | valid |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    runs = results.get("runs", {})
    for name, r in runs.items():
        sh, ps = r["shared"], r["per_scenario"]
        gate = (f"{sh['gate_mean']:.3f} | {sh['gate_var']:.3f} | {sh['gate_wrong_side']:.1f} / {ps['gate_wrong_side']:.1f}"
                if "gate_mean" in sh else "– | – | –")
        lines.append(f"| {name} | {r['norm']} | {r['normaliser'] or '–'} | {r['params_m']}M | "
                     f"{r.get('train_seconds', float('nan')):.0f} | {r['bleu']:.2f} | {sh['FER']:.1f} | "
                     f"{sh['CER']:.1f} / {ps['CER']:.1f} | {sh['CE/FE']:.1f} / {ps['CE/FE']:.1f} | {gate} | "
                     f"{r['valid'].replace(' | ', ', ')} |")
    if runs:
        first = next(iter(runs.values()))
        lines += ["", f"test2016: {first['shared']['tokens']} target subwords (markup excluded), z* = 1 for "
                  f"{first['shared']['z_star_source']:.1f}% of them (shared normaliser) and "
                  f"{first['per_scenario']['z_star_source']:.1f}% (per-scenario).", ""]
    pmi = results.get("pmi", {})
    if "z_star_train" in pmi:
        lines += ["Training corpus (tools/build_pmi_table.py, last line): " +
                  "; ".join(f"{k}: {v}" for k, v in pmi["z_star_train"].items()), ""]
    if pmi:
        lines += ["| PMI table | sentence pairs | target subwords / sentence | time s | peak RSS MiB | table file MiB | counts |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for key, r in pmi.items():
            if isinstance(r, dict) and "pairs" in r:
                lines.append(f"| {key} | {r['pairs']} | {r['tgt_subwords_per_sentence']:.1f} | {r['seconds']:.1f} | "
                             f"{r['rss_mib']:.0f} | {r['file_mib']:.1f} | {r['summary']} |")
        lines += ["", f"Peak RSS of the imports alone (python, torch, onmt_doc): {pmi['imports_rss_mib']:.0f} MiB.", ""]
    lines += ["Commands:", "", "```", *results["commands"], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
