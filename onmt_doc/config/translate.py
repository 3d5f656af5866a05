"""The ``translate:`` section: search and batching for ``onmt_doc_translate``, validation BLEU and
the Python API.

It is also built in code (``TranslateConfig(beam=...)`` by the API and the search) where no loader
has seen it, so its ``validate`` checks the keys' bounds itself and accepts ``root=None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from onmt_doc.config.options import MAX_BEAM, RootConfig, check_bounds, option
from onmt_doc.errors import ConfigError

# translate.read_every's bound: finished rows ride along for at most this many steps
MAX_READ_EVERY = 64


@dataclass
class TranslateConfig:
    """``translate:`` search and batching for ``onmt_doc_translate``, validation BLEU and the API."""

    beam: int = option(
        5,
        f"beam size (1 = greedy); at most {MAX_BEAM} (each sentence searches `2 × beam` candidates over the "
        "vocabulary at every step); flag `-beam`",
        minimum=1,
        maximum=MAX_BEAM,
    )
    n_best: int = option(
        1,
        "hypotheses per output line, tab-separated, for every model (see "
        f"[getting_started.md](getting_started.md#translation)); at least 1, at most `beam` (sampling: at most "
        f"{MAX_BEAM}); flag `-n_best`",
        minimum=1,
        maximum=MAX_BEAM,
    )
    length_penalty: float = option(
        1.0,
        "GNMT α: scores are divided by `((5 + length) / 6)^α`, length counting "
        "`<eos>`; 0 = none, at least 0; flag `-length_penalty`",
        minimum=0,
    )
    length_penalty_type: Literal["gnmt", "avg", "none"] = option(
        "gnmt",
        "what a finished hypothesis' log-probability is divided by: `gnmt` = `((5 + length) / 6)^α` with "
        "α = `length_penalty`, `avg` = its length (OpenNMT-py's `avg`: mean log-probability per token; ignores "
        "`length_penalty`), `none` = 1; flag `-length_penalty_type`",
    )
    max_len_ratio: float = option(
        1.5,
        "output length cap = ratio × source length (in tokens, markup included) + `max_len_add`; greater than 0; "
        "flag `-max_len_ratio`",
        above=0,
    )
    max_len_add: int = option(10, "constant part of the cap (at least 0)", minimum=0)
    max_length: int = option(
        250,
        "absolute output cap per sentence in subword tokens, whatever the ratio "
        "(OpenNMT-py caps at 250, CTranslate2 at 256); at least 1; flag `-max_length`",
        minimum=1,
    )
    max_input_tokens: int = option(
        200,
        "a source line longer than this many subwords is split at a word "
        "boundary (the last one in the second half of each piece, else at the limit) "
        "into pieces translated on their own and joined with a space; the final line "
        "counts them. Bounds the quadratic cost of one line; at least 1; `-score` does "
        "not split; flag `-max_input_tokens`",
        minimum=1,
    )
    force_context_prefix: bool = option(
        False,
        "`k_to_k` unit: translate a document sentence by sentence, forcing the model's own translations of the "
        "k previous sentences as the target prefix and generating only the last sentence; `false` = decode all "
        "k+1 sentences and keep the last; flag `-force_context_prefix`",
    )
    window_sentences: int = option(
        0,
        "`context` unit (HM-GDC): sentences per translation window; 0 = "
        "`data.max_sentences`, or, when that is 0 too, windows packed to "
        "`data.max_tokens` tokens, so a long document is never one window (time per "
        "sentence stays flat); flag `-window_sentences`",
        minimum=0,
    )
    batch_tokens: int = option(
        4096,
        "padded source tokens per translation batch (`context` windows: the sum of their rows' lengths); flag "
        "`-batch_tokens`",
        minimum=1,
    )
    batch_sentences: int = option(
        0,
        "cap on batch rows: sentences (for the `document` unit: document "
        "instances); 0 = no cap, at least 0; flag `-batch_size`",
        minimum=0,
    )
    buffer_sentences: int = option(
        2000,
        "read whole documents until at least this many sentences are buffered, "
        "then translate them in length-sorted batches",
        minimum=1,
    )
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32",
        "compute type of the weights while translating (`onmt_doc_translate -dtype`); bfloat16 is much "
        "faster on GPUs and on CPUs with AMX, at a small cost in exactness; beam scores stay float32",
    )
    ensemble_average: Literal["log_prob", "prob"] = option(
        "log_prob",
        "several models (`-model A.pt B.pt`): `log_prob` = mean of the members' log-probabilities (OpenNMT-py's "
        "default), `prob` = log of the mean probability (fairseq, OpenNMT-py's `avg_raw_probs`); flag "
        "`-ensemble_average`",
    )
    strategy: Literal["beam", "sampling"] = option(
        "beam",
        "`beam` = beam search (greedy for `beam: 1`); `sampling` = each output token drawn from the model's "
        "distribution (back-translation), shaped by `temperature`, `top_k`, `top_p`; `n_best` = independent "
        "samples per line, best score first (`beam` is then unused); flag `-strategy`",
    )
    temperature: float = option(
        1.0,
        "sampling: the log-probabilities are divided by this before drawing (< 1 sharper, > 1 flatter); "
        "greater than 0; reported scores stay the untempered model log-probabilities; flag `-temperature`",
        above=0,
    )
    top_k: int = option(
        0, "sampling: draw among the k most probable tokens only; 0 = the whole vocabulary; flag `-top_k`", minimum=0
    )
    top_p: float = option(
        1.0,
        "sampling (nucleus): draw among the most probable tokens whose probabilities (after `temperature` and "
        "`top_k`) sum to at least p; in (0, 1], 1 = no cut; flag `-top_p`",
        above=0,
        maximum=1,
    )
    seed: int = option(
        1,
        "sampling: seed of the search's own random generator, so a run repeats exactly (with the same batches) "
        "and torch's global generator is left alone; flag `-seed`",
    )
    read_every: int = option(
        0,
        "beam search: steps between the search's reads of the device (did a hypothesis end, a sentence "
        "finish, may the beam narrow); between reads finished sentences stay in the batch, masked, so the "
        "output is the same and a GPU queues steps ahead instead of waiting for each; 0 = per device: 1 on a "
        "CPU (dropping finished rows at once is what pays there), 8 on a GPU; sampling reads every step; at "
        f"most {MAX_READ_EVERY}; flag `-read_every`",
        minimum=0,
        maximum=MAX_READ_EVERY,
    )
    compile: Literal["off", "on", "auto"] = option(
        "off",
        "compile the model's decoding step with `torch.compile` (dynamic shapes: one compilation serves every "
        "batch, beam width and step; the first batches pay a compilation of a minute or more): `auto` = on "
        "CUDA only; fewer, fused kernels per step where a step is launch-bound (a GPU). The sentence "
        "Transformer's step is one graph; the document decoders' host plans cut theirs; flag `-compile`",
    )

    def validate(self, path: str, root: Optional[RootConfig]) -> None:
        """The n best hypotheses come from the beam, so there are at most beam of them (samples are
        independent: up to MAX_BEAM). The search calls this on sections built in code, which no
        loader has seen, so the keys' bounds are checked here too (``root`` is then None)."""
        check_bounds(self, path)
        if self.strategy == "beam" and self.n_best > self.beam:
            raise ConfigError(f"{path}.n_best ({self.n_best}) cannot exceed {path}.beam ({self.beam})")
        if self.strategy == "sampling" and self.read_every > 1:
            raise ConfigError(
                f"{path}.read_every ({self.read_every}) is for beam search: sampling reads the device every step"
            )
