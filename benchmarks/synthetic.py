"""Random-weight models, placeholder vocabularies and random batches for the benchmarks that
measure speed or memory only (no training data, no files), and a forced-length beam decode.

Shared by the benchmark scripts (``from synthetic import ...``, this folder being first on
``sys.path`` when a script runs) so that none of them imports another benchmark or ``tests/``.
"""

from __future__ import annotations

import numpy as np
import torch

from onmt_doc.config import config_from_dict
from onmt_doc.contracts import Batch
from onmt_doc.data.batching import collate
from onmt_doc.data.codec import Codec
from onmt_doc.data.instances import Example, mark_sentence
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import SPECIALS, Vocab
from onmt_doc.models.builder import build_model

# the Multi30k benchmark Transformer (d_model 256, 3+3 layers, 4 heads, ff 1024)
BENCHMARK_SHAPE = {
    "d_model": 256,
    "encoder": {"layers": 3, "heads": 4, "ff": 1024},
    "decoder": {"type": "transformer", "layers": 3, "heads": 4, "ff": 1024},
}


def placeholder_codec(words: int) -> Codec:
    """A vocabulary of ``words`` placeholder words ``w0 w1 ...`` without subword splitting."""
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(words)])
    sw = Subword("none", "none")
    return Codec(sw, sw, vocab, vocab)


def benchmark_codec() -> Codec:
    """An 8k-entry vocabulary of placeholder words (the benchmark BPE's size; speed only)."""
    return placeholder_codec(8000)


def random_model(model_section: dict, codec: Codec, seed: int = 0, **config):
    """A model of ``model_section`` (d_model 32 and no dropout unless it says otherwise) with
    seeded random weights, in eval mode, and its config; ``config`` adds further config sections."""
    torch.manual_seed(seed)
    cfg = config_from_dict(
        {"model": {"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, **model_section}, **config}
    )
    return build_model(cfg.model, codec).eval(), cfg


def sized_batch(sizes: list[tuple[int, int]], words: int, seed: int = 0) -> Batch:
    """Sentence examples with (src_len, tgt_len) word counts of a ``words``-word placeholder
    vocabulary: uneven lengths give padding."""
    rng = np.random.default_rng(seed)
    first = len(SPECIALS)
    examples = [
        Example(
            mark_sentence(rng.integers(first, first + words, s)),
            mark_sentence(rng.integers(first, first + words, t)),
            i,
            0,
            1,
        )
        for i, (s, t) in enumerate(sizes)
    ]
    return collate(examples, np.arange(len(examples)))


def random_batch(batch_tokens: int, lengths: tuple[int, int] = (8, 20), seed: int = 0) -> Batch:
    """Random sentence pairs of Multi30k-like lengths (8–19 subwords) filling ``batch_tokens``
    as the trainer counts them (rows × longest marked sentence)."""
    rng = np.random.default_rng(seed)
    first = len(SPECIALS)
    examples, tokens = [], 0
    while tokens <= batch_tokens:
        src, tgt = (rng.integers(first, first + 8000, rng.integers(*lengths)) for _ in range(2))
        examples.append(Example(mark_sentence(src), mark_sentence(tgt), 0, 0, 1))
        tokens = len(examples) * max(max(len(e.src), len(e.tgt) + 1) for e in examples)
    return collate(examples[:-1])


@torch.no_grad()
def forced_long_decode(model, batch: Batch, steps: int) -> None:
    """A 4-beam decode that runs ``steps`` steps whatever the model predicts: generator, top-k and
    the within-sentence beam reordering of every step, as in beam search (times long outputs)."""
    k = 4
    n = batch.size
    state = model.init_state(model.encode(batch), batch).reorder(torch.arange(n).repeat_interleave(k))
    tokens = torch.full((n * k,), 1, dtype=torch.long)
    scores = torch.zeros(n, k)
    for _ in range(steps):
        lp, state = model.step(tokens, state)
        cand = (scores.view(-1, 1) + lp).view(n, -1)
        top, ids = cand.topk(k, dim=1)
        vocab = lp.size(-1)
        rows = (ids // vocab + torch.arange(n)[:, None] * k).view(-1)
        state = state.reorder(rows, same_sources=True)
        tokens, scores = (ids % vocab).view(-1).clamp(min=4), top
