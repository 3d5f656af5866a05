"""Build small random models and batches directly (no training, no files)."""

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
from onmt_doc.models.model import EncoderDecoder

N_WORDS = 40


def toy_codec() -> Codec:
    vocab = Vocab(list(SPECIALS) + [f"w{i}" for i in range(N_WORDS)])
    sw = Subword("none", "none")
    return Codec(sw, sw, vocab, vocab)


def random_model(model_section: dict, seed: int = 0, device=None) -> tuple[EncoderDecoder, Codec]:
    """A random model in eval mode, built on the CPU (the same weights for a seed on every device),
    then moved to ``device`` when one is given."""
    torch.manual_seed(seed)
    codec = toy_codec()
    cfg = config_from_dict({"model": {"d_model": 32, "dropout": 0.0, "attention_dropout": 0.0, **model_section}})
    model = build_model(cfg.model, codec).eval()
    return (model if device is None else model.to(device)), codec


def random_batch(sizes: list[tuple[int, int]], seed: int = 0, device=None) -> Batch:
    """Sentence examples with (src_len, tgt_len) word counts: uneven lengths give padding; on
    ``device`` when one is given."""
    rng = np.random.default_rng(seed)
    first = len(SPECIALS)
    examples = [
        Example(
            mark_sentence(rng.integers(first, first + N_WORDS, s)),
            mark_sentence(rng.integers(first, first + N_WORDS, t)),
            i,
            0,
            1,
        )
        for i, (s, t) in enumerate(sizes)
    ]
    batch = collate(examples, np.arange(len(examples)))
    return batch if device is None else batch.to(device)


def record_raw_hypotheses(translator) -> list:
    """Wrap ``translator``'s real search so every (source row, its hypotheses) pair it returns is
    kept, before the translator pads or merges anything; returns the list it fills."""
    search, raw = translator.search.search, []

    def recording_search(model, batch, **options):
        hyps = search(model, batch, **options)
        raw.extend(zip(batch.src.clone(), hyps))
        return hyps

    translator.search.search = recording_search
    return raw


def assert_forced_scores_keep_breaks(translator, toy_dir, out_path) -> None:
    """``-score`` of the toy references through ``translator``: one negative log-probability per
    sentence line, and a blank line exactly where the source has a document break."""
    with open(out_path, "w", encoding="utf-8") as out:
        translator.run_files(str(toy_dir / "test.src"), out, tgt=str(toy_dir / "test.tgt"), score=True)
    src = (toy_dir / "test.src").read_text(encoding="utf-8").split("\n")
    lines = out_path.read_text(encoding="utf-8").split("\n")
    assert [not line.strip() for line in lines] == [not line.strip() for line in src]
    assert all(float(line) < 0 for line in lines if line.strip())
