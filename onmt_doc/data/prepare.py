"""Run-folder data preparation: learn subwords and vocabularies, load binarized instances.

The run folder (``log.dir``) holds ``subword.model`` (or ``src.subword`` and ``tgt.subword``) and
``vocab.txt`` (or ``vocab.src`` and ``vocab.tgt``); every checkpoint carries copies of them.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from itertools import islice
from typing import Iterator, Optional, Sequence

from onmt_doc.config import Config, CorpusConfig
from onmt_doc.data.cache import load_tokenized
from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import iter_lines, read_parallel
from onmt_doc.data.fields import FieldProvider, attach_fields
from onmt_doc.data.instances import Example, build_instances
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import Vocab
from onmt_doc.errors import ConfigError

log = logging.getLogger("onmt_doc")


def _paths(run_dir: str, shared: bool) -> dict[str, str]:
    if shared:
        subword, vocab = os.path.join(run_dir, "subword.model"), os.path.join(run_dir, "vocab.txt")
        return {"src_subword": subword, "tgt_subword": subword, "src_vocab": vocab, "tgt_vocab": vocab}
    return {
        "src_subword": os.path.join(run_dir, "src.subword"),
        "tgt_subword": os.path.join(run_dir, "tgt.subword"),
        "src_vocab": os.path.join(run_dir, "vocab.src"),
        "tgt_vocab": os.path.join(run_dir, "vocab.tgt"),
    }


def train_corpora(cfg: Config) -> list[CorpusConfig]:
    """The training corpora (names and ``documents`` resolved), each with both files present."""
    corpora = cfg.data.corpora("train")
    single = isinstance(cfg.data.train, CorpusConfig)
    for c in corpora:
        where = "data.train" if single else f"data.train.{c.name}"
        if not c.src or not c.tgt:
            raise ConfigError(f"{where}.src and {where}.tgt are required")
        for key, path in ((f"{where}.src", c.src), (f"{where}.tgt", c.tgt)):
            if not os.path.isfile(path):
                raise ConfigError(f"{key}: {path}: file not found")
    return corpora


def require_train_paths(cfg: Config) -> tuple[str, str]:
    """The files of a single training corpus (tools that read one file pair)."""
    corpora = train_corpora(cfg)
    if len(corpora) > 1:
        raise ConfigError(f"data.train has {len(corpora)} corpora; this command reads one: give its files")
    return corpora[0].src, corpora[0].tgt


def _nonblank(path: str, max_chars: int, limit: int) -> Iterator[str]:
    lines = (line for line in iter_lines(path, max_chars) if line)
    return islice(lines, limit) if limit else lines


def build_codec(cfg: Config, run_dir: str) -> Codec:
    """Learn the subword model(s) on the training files (of every corpus) and count the vocabularies."""
    corpora = train_corpora(cfg)
    v, max_chars = cfg.vocab, cfg.data.max_line_chars
    for c in corpora:  # validate alignment before the slow part
        read_parallel(c.src, c.tgt, c.documents, max_chars)

    def lines(side: str, limit: int) -> list[str]:
        return [line for c in corpora for line in _nonblank(getattr(c, side), max_chars, limit)]

    if v.shared:
        src_sw = tgt_sw = Subword.learn(
            v.subword, v.tokenizer, v.size, lines("src", v.sample_lines) + lines("tgt", v.sample_lines)
        )
    else:
        src_sw = Subword.learn(v.subword, v.tokenizer, v.size, lines("src", v.sample_lines))
        tgt_sw = Subword.learn(v.subword, v.tokenizer, v.size, lines("tgt", v.sample_lines))
    counts = {}
    for side, sw in (("src", src_sw), ("tgt", tgt_sw)):
        c: Counter = Counter()
        for toks in sw.tokenize_batch(lines(side, 0)):
            c.update(toks)
        counts[side] = c
    if v.shared:
        src_vocab = tgt_vocab = Vocab.build(counts["src"] + counts["tgt"], v.min_freq, v.max_size)
    else:
        src_vocab = Vocab.build(counts["src"], v.min_freq, v.max_size)
        tgt_vocab = Vocab.build(counts["tgt"], v.min_freq, v.max_size)
    codec = Codec(src_sw, tgt_sw, src_vocab, tgt_vocab)
    save_codec(codec, run_dir, v.shared)
    return codec


def save_codec(codec: Codec, run_dir: str, shared: bool) -> None:
    """Write the subword model(s) and vocabularies into the run folder, so a checkpoint's run is
    self-contained and translation needs nothing from the training machine."""
    os.makedirs(run_dir, exist_ok=True)
    p = _paths(run_dir, shared)
    codec.src_subword.save(p["src_subword"])
    codec.tgt_subword.save(p["tgt_subword"])
    codec.src_vocab.save(p["src_vocab"])
    codec.tgt_vocab.save(p["tgt_vocab"])


def load_codec(cfg: Config, run_dir: str) -> Optional[Codec]:
    """The run folder's codec, or None when onmt_doc_build_vocab has not been run there."""
    p = _paths(run_dir, cfg.vocab.shared)
    if not os.path.exists(p["src_vocab"]) or not os.path.exists(p["tgt_vocab"]):
        return None

    def subword(path: str) -> Subword:
        if cfg.vocab.subword == "none":
            return Subword("none", cfg.vocab.tokenizer, None)
        if not os.path.exists(path):
            raise ConfigError(f"{path}: subword model missing (run onmt_doc_build_vocab again)")
        with open(path, "rb") as f:
            return Subword(cfg.vocab.subword, cfg.vocab.tokenizer, f.read())

    src_sw = subword(p["src_subword"])
    tgt_sw = src_sw if cfg.vocab.shared else subword(p["tgt_subword"])
    return Codec(src_sw, tgt_sw, Vocab.load(p["src_vocab"]), Vocab.load(p["tgt_vocab"]))


def data_cache_dir(cfg: Config, run_dir: str) -> str:
    """Where binarized corpora (and what is cached with them, e.g. z*) live: data.cache_dir or <run>/cache."""
    return cfg.data.cache_dir or os.path.join(run_dir, "cache")


def load_examples(
    cfg: Config,
    codec: Codec,
    src: str,
    tgt: str,
    unit: str,
    run_dir: str,
    filter_long: bool = True,
    fields: Sequence[FieldProvider] = (),
    documents: Optional[bool] = None,
) -> tuple[list[Example], list]:
    """Instances of a parallel corpus for ``unit`` with the per-example ``fields`` (the ones losses
    ask for) attached, and its tokenized documents. ``documents``: the corpus' own flag
    (None = ``data.documents``); ``false`` makes each line a one-sentence document."""
    documents = cfg.data.documents if documents is None else documents
    docs, cached = load_tokenized(src, tgt, codec, documents, cfg.data.max_line_chars, data_cache_dir(cfg, run_dir))
    examples, dropped = build_instances(
        unit,
        docs,
        cfg.data.max_tokens,
        cfg.data.max_len if filter_long else 0,
        cfg.data.max_sentences,
        context_sentences=cfg.data.context_sentences,
        sentence_markup=cfg.data.sentence_markup,
    )
    n_sents = sum(len(d) for d in docs)
    log.info(
        "%s: %d documents, %d sentence pairs -> %d %s instances%s%s",
        src,
        len(docs),
        n_sents,
        len(examples),
        unit,
        " (binarized cache)" if cached else "",
        f"; {dropped} pairs dropped by data.max_len={cfg.data.max_len}" if dropped else "",
    )
    attach_fields(examples, docs, fields)
    return examples, docs
