#!/usr/bin/env python3
"""Fixed-seed fingerprints of every config example: proof that a refactoring changed nothing.

Each ``config_examples/*.yaml`` is trained for a few steps on a small toy corpus (its own model
shape, optimizer and unit; data paths, vocabulary size and batch size replaced), then translates a
few test documents. The fingerprint of a config is the sha256 of its final weights (every tensor's
bytes, in name order), the loss it logged and the sha256 of its translations. Run it before and
after a change that must not alter behaviour and compare:

    python tools/fixed_seed_check.py --out runs/fixed_seed/before.json
    ... refactor ...
    python tools/fixed_seed_check.py --out runs/fixed_seed/after.json --compare runs/fixed_seed/before.json

One thread, a fixed seed and the same corpus make the runs bit-identical on one machine; the
comparison exits 1 naming every config whose fingerprint moved.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "config_examples"
# runs whose train.init_from names another example's run: trained after it, from its checkpoint
INIT_FROM = {"g_transformer_finetune": "transformer", "hm_gdc_finetune": "hm_gdc"}


def _toy_corpus(folder: Path) -> Path:
    from onmt_doc.toy.corpus import write_corpus

    toy = folder / "toy"
    write_corpus(toy, seed=5, train_docs=120, valid_docs=4, test_docs=4)
    return toy


def _point_at(section: Any, src: str, tgt: str) -> Any:
    """A ``data.train``/``data.valid`` value with every corpus' files replaced."""
    if isinstance(section, dict) and ("src" in section or "tgt" in section):
        return {**section, "src": src, "tgt": tgt}
    if isinstance(section, dict):
        return {name: _point_at(corpus, src, tgt) for name, corpus in section.items()}
    return section


def small_config(name: str, toy: Path, work: Path, steps: int) -> Path:
    """The example's model and training settings on the toy corpus, for ``steps`` steps."""
    raw = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text(encoding="utf-8"))
    data = raw.setdefault("data", {})
    data["train"] = _point_at(data.get("train"), str(toy / "train.src"), str(toy / "train.tgt"))
    data["valid"] = _point_at(data.get("valid"), str(toy / "valid.src"), str(toy / "valid.tgt"))
    raw.setdefault("vocab", {})["size"] = 200
    raw["train"] = {
        **raw.get("train", {}),
        "max_steps": steps,
        "save_every": steps,
        "valid_every": steps,
        "valid_bleu": False,
        "batch_tokens": 768,
        "accum": 1,
        "seed": 1,
    }
    if name in INIT_FROM:
        raw["train"]["init_from"] = str(work / INIT_FROM[name] / "checkpoints" / "last.pt")
    raw["log"] = {**raw.get("log", {}), "dir": str(work / name), "tensorboard": False}
    for loss in raw.get("loss", []):
        if loss.get("type") == "pmi_gate_hinge":
            loss["table"] = str(work / name / "pmi.npz")
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def weights_digest(checkpoint: Path) -> str:
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint(name: str, toy: Path, work: Path, steps: int) -> dict:
    """Train ``name`` for ``steps`` steps, translate the toy test set, return the digests."""
    from onmt_doc.bin import build_pmi_table, translate
    from onmt_doc.config import load_config
    from onmt_doc.train.trainer import train

    config = small_config(name, toy, work, steps)
    cfg = load_config(str(config))
    if any(loss.type == "pmi_gate_hinge" for loss in cfg.loss):
        assert build_pmi_table.main(["-config", str(config), "-output", str(work / name / "pmi.npz")]) == 0
    metrics = train(cfg) or {}
    ckpt = work / name / "checkpoints" / "last.pt"
    out = work / f"{name}.hyp"
    args = ["-model", str(ckpt), "-src", str(toy / "test.src"), "-output", str(out), "-beam", "2"]
    assert translate.main(args + ["-max_length", "30", "-threads", "1"]) == 0, name
    return {
        "weights": weights_digest(ckpt),
        "translation": hashlib.sha256(out.read_bytes()).hexdigest(),
        "loss": metrics.get("loss"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="fingerprints JSON to write")
    p.add_argument("--compare", help="fingerprints JSON of the reference run")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--configs", nargs="*", help="example names (default: all)")
    p.add_argument("--work", help="work folder (default: a temporary one)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    names = args.configs or sorted(p.stem for p in EXAMPLES.glob("*.yaml"))
    names.sort(key=lambda n: n in INIT_FROM)  # the runs others start from come first
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        toy = _toy_corpus(work)
        results = {name: fingerprint(name, toy, work, args.steps) for name in names}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(results)} configs fingerprinted into {args.out}", file=sys.stderr)
    if not args.compare:
        return 0
    reference = json.loads(Path(args.compare).read_text(encoding="utf-8"))
    moved = [n for n in results if n in reference and results[n] != reference[n]]
    for n in moved:
        print(f"{n}: {reference[n]} -> {results[n]}", file=sys.stderr)
    print(f"{len(moved)} of {len(results)} configs differ from {args.compare}", file=sys.stderr)
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
