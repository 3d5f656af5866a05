"""Time per sentence when one document grows from 100 to 10,000 sentences (issue 14).

Document models must translate a long document in windows (G-Transformer: instances packed to
``data.max_tokens``; HM-GDC: ``translate.window_sentences``, else ``data.max_sentences``, else
windows packed to ``data.max_tokens``), so the time per sentence stays flat. The sentence
Transformer is the reference. Models have random weights (no training: the cost of decoding does
not depend on what the weights learned, only on output lengths, which the length caps bound);
the input is one document of random 5-15-word sentences with no blank line.

    OMP_NUM_THREADS=1 python benchmarks/long_documents.py --threads 1 --sizes 100 1000 10000
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from synthetic import placeholder_codec, random_model

from onmt_doc.data.vocab import EOS_ID, EOS_SENT_ID
from onmt_doc.translate.translator import Translator

WORDS = 200
LAYERS = {"layers": 2, "heads": 4, "ff": 256}
MODELS = {
    "Transformer (sentence)": {
        "encoder": {"type": "transformer", **LAYERS},
        "decoder": {"type": "transformer", **LAYERS},
    },
    "HM-GDC (context)": {
        "encoder": {"type": "hierarchical", **LAYERS, "doc_layers": 1},
        "decoder": {"type": "doc_context", **LAYERS},
    },
    "G-Transformer (document)": {
        "encoder": {"type": "g_transformer", **LAYERS, "global_layers": 1},
        "decoder": {"type": "g_transformer", **LAYERS, "global_layers": 1},
    },
}


def make_translator(model_section: dict, beam: int, window_sentences: int = 0, end_bias: float = 0.0) -> Translator:
    """A random-weight d=64 model with the training defaults (data.max_tokens 512, max_sentences 0);
    ``end_bias`` raises the output bias of ``</s>``/``<eos>`` so that outputs end at a realistic
    length instead of running to the length cap."""
    codec = placeholder_codec(WORDS)
    model, cfg = random_model(
        {"d_model": 64, **model_section}, codec, translate={"beam": beam, "window_sentences": window_sentences}
    )
    with torch.no_grad():
        model.generator.bias[[EOS_SENT_ID, EOS_ID]] += end_bias
    return Translator(model, codec, cfg)


def document(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(WORDS)}" for _ in range(rng.randint(5, 15))) for _ in range(n)]


def seconds_per_sentence(translator: Translator, n: int) -> float:
    doc = document(n)
    start = time.perf_counter()
    out = translator.translate_documents([doc])
    elapsed = time.perf_counter() - start
    assert len(out[0]) == n and all(out[0]), "one non-empty output line per input line"
    return elapsed / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--end_bias", type=float, default=0.0, help="added to the </s>/<eos> output bias")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument(
        "--whole_document_up_to",
        type=int,
        default=1000,
        help="also time HM-GDC with the whole document as one window (the old behaviour) for sizes up to this",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [
        (name, make_translator(MODELS[name], args.beam, end_bias=args.end_bias), args.sizes) for name in args.models
    ]
    old = [n for n in args.sizes if n <= args.whole_document_up_to] if "HM-GDC (context)" in args.models else []
    print("| model | " + " | ".join(f"{n:,} sent./doc (ms/sent.)" for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for name, translator, sizes in rows:
        cells = [f"{1000 * seconds_per_sentence(translator, n):.2f}" for n in sizes]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    for n in old:  # whole document in one window: what translation did before windowing
        translator = make_translator(MODELS["HM-GDC (context)"], args.beam, window_sentences=n, end_bias=args.end_bias)
        print(
            f"| HM-GDC, whole document as one window (old), {n:,} sent. | "
            f"{1000 * seconds_per_sentence(translator, n):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
