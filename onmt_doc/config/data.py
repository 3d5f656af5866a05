"""The ``data:`` and ``vocab:`` sections: which files a run reads and how they become subwords.

``data.train`` / ``data.valid`` take one corpus or several (a mapping of named corpora, or a list):
:func:`load_corpora`, the fields' ``load`` hook, reads every shape into :class:`CorpusConfig` objects,
and :meth:`DataConfig.corpora` hands the data layer one resolved list whatever the shape. The unit
check of ``sentence_markup`` asks the model section for its unit (``ModelConfig.resolved_unit``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from onmt_doc.config.options import RootConfig, SectionLoader, join_path, option, validate_tree
from onmt_doc.errors import ConfigError


@dataclass
class CorpusConfig:
    """One parallel corpus: its files and how it is sampled among several (``data.train``)."""

    src: Optional[str] = option(None, "source file")
    tgt: Optional[str] = option(None, "target file, line-aligned with `src`")
    documents: Optional[bool] = option(
        None,
        "this corpus' own `data.documents` (`null` = `data.documents`); `false` makes every line a "
        "one-sentence document, so sentence-level data can train a document model",
    )
    weight: int = option(
        1,
        "several training corpora: examples drawn from this corpus per round (OpenNMT-py's `weight`); see "
        "[data.md](data.md#several-corpora). No effect with one corpus or on validation sets",
        minimum=1,
    )
    name: Optional[str] = option(
        None,
        "the corpus' tag in logs, TensorBoard (`valid/<name>/*`) and `train.best_on`; in the mapping form the "
        "key is the name; `null` in a list = `corpus_<i>` (1-based); one corpus: `train` / `valid`",
    )


def load_corpora(loader: SectionLoader, data: Any, path: str) -> Union[CorpusConfig, dict[str, CorpusConfig]]:
    """``data.train`` / ``data.valid``: one corpus ``{src, tgt}`` (as always), or several: a mapping
    ``{name: {src, tgt, weight, documents}}`` (OpenNMT-py's ``data:`` shape) or a list of corpora
    with optional ``name``. Several corpora load as a name -> CorpusConfig dict, in file order."""
    if isinstance(data, list):
        items = [(join_path(path, i), item, f"corpus_{i + 1}") for i, item in enumerate(data)]
    elif isinstance(data, dict) and any(isinstance(v, dict) for v in data.values()):
        items = [(join_path(path, key), item, str(key)) for key, item in data.items()]
        for where, item, _ in items:
            if not isinstance(item, dict):
                loader.fail(
                    where,
                    f"expected a corpus mapping {{src, tgt, ...}}, got {item!r} (the keys of one corpus "
                    f"cannot be mixed with named corpora)",
                )
    else:
        return loader.dataclass(CorpusConfig, data, path)
    if not items:
        loader.fail(path, "expected at least one corpus")
    corpora: dict[str, CorpusConfig] = {}
    for where, item, default_name in items:
        corpus = loader.dataclass(CorpusConfig, item, where)
        if isinstance(data, dict) and corpus.name not in (None, default_name):
            loader.fail(join_path(where, "name"), f"'{corpus.name}' differs from the corpus' key '{default_name}'")
        name = corpus.name or default_name
        if name in corpora:
            loader.fail(join_path(where, "name"), f"duplicate corpus name '{name}'")
        corpus.name = name
        corpora[name] = corpus
    return corpora


@dataclass
class DataConfig:
    """``data:`` files and how they become instances."""

    train: CorpusConfig = option(
        help="training files; both required by training. Several corpora: a mapping of named corpora, or a "
        "list, each with its own `src`, `tgt`, `documents`, `weight` (see [data.md](data.md#several-corpora))",
        factory=CorpusConfig,
        load=load_corpora,
    )
    valid: CorpusConfig = option(
        help="validation files; both or neither. Without them: no validation, no `best.pt`, no early stopping. "
        "Several sets: the same shapes as `train`, each reported on its own (`train.best_on` picks the one "
        "for `best.pt` and early stopping)",
        factory=CorpusConfig,
        load=load_corpora,
    )
    documents: bool = option(
        True,
        "blank lines separate documents; `false` = every line stands alone (blank "
        "lines are then skipped in training and kept in translation output)",
    )
    max_tokens: int = option(
        512,
        "budget of a document instance, per side, in subword tokens with markup; used by `document`-unit models only",
        minimum=1,
    )
    max_sentences: int = option(
        0,
        "`context`-unit models (HM-GDC): documents are cut into windows of at most "
        "this many sentences, each window one instance whose sentences are batch rows "
        "sharing its context (0 = whole documents)",
        minimum=0,
    )
    context_sentences: int = option(
        1,
        "concatenation units (`model.unit: k_to_1` / `k_to_k`): k, the previous sentences of the same document "
        "given as context (fewer at a document's start); see [models/concatenation.md](models/concatenation.md)",
        minimum=1,
    )
    max_len: int = option(
        0,
        "drop training sentence pairs with a side longer than this many subwords; the count is logged (0 = keep all)",
        minimum=0,
    )
    max_line_chars: int = option(
        20000,
        "a longer line is an error, a sign of a broken file (0 = no limit); "
        "`onmt_doc_translate -max_line_chars` overrides the checkpoint's value",
        minimum=0,
    )
    cache_dir: Optional[str] = option(None, "binarized data cache; `null` = `<log.dir>/cache`")
    workers: int = option(
        0,
        "processes that tokenize while the vocabulary is counted and a corpus is binarized (0 = min(4, CPU "
        "cores); at most 8 per core); the vocabulary and the cache are the same bytes whatever the number; see "
        "[data.md](data.md#binarization-streamed-on-every-core)",
        minimum=0,
    )
    sentence_markup: bool = option(
        True,
        "wrap each sentence in onmt_doc's markup (source `<s> … </s>`, target `<bos> <s> … </s> <eos>`); "
        "`false` = the bare sequences other toolkits use (source `w1 … wn`, target `<bos> w1 … wn <eos>`), "
        "as `onmt_doc_import_opennmt` writes it; `sentence` unit only (every other unit needs the markup)",
    )

    def corpora(self, split: Literal["train", "valid"]) -> list[CorpusConfig]:
        """The corpora of ``data.train`` or ``data.valid`` with their name and ``documents`` resolved
        (copies); a single ``valid`` without files is no set at all."""
        value = getattr(self, split)
        if isinstance(value, CorpusConfig):
            if split == "valid" and not value.src and not value.tgt:
                return []
            value = {value.name or split: value}
        return [
            dataclasses.replace(c, name=name, documents=self.documents if c.documents is None else c.documents)
            for name, c in value.items()
        ]

    def validate(self, path: str, root: RootConfig) -> None:
        """Each corpus of several holds its own keys' minimums (the loader checks one corpus itself);
        a validation set with one file of two is a mistake, not "no validation"; sentences without
        markup only for the sentence unit (the others find their sentences by it)."""
        for split in ("train", "valid"):
            value = getattr(self, split)
            if isinstance(value, dict):
                for name, corpus in value.items():
                    validate_tree(corpus, f"{path}.{split}.{name}", root)
                    if split == "valid" and not (corpus.src and corpus.tgt):
                        raise ConfigError(f"{path}.valid.{name}: needs both src and tgt")
        if isinstance(self.valid, CorpusConfig) and bool(self.valid.src) != bool(self.valid.tgt):
            raise ConfigError(f"{path}.valid: needs both src and tgt (or neither)")
        if not self.sentence_markup:  # documents, windows and concatenations are cut by their <s> … </s>
            unit = root.model.resolved_unit()
            if unit != "sentence":
                raise ConfigError(f"{path}.sentence_markup: false is for the sentence unit only, not {unit}")


@dataclass
class VocabConfig:
    """``vocab:`` the subword model and vocabularies ``onmt_doc_build_vocab`` learns."""

    subword: Literal["bpe", "sentencepiece", "none"] = option("bpe", "subword model")
    size: int = option(8000, "BPE merges, or SentencePiece pieces (at most 10,000,000)", minimum=1, maximum=10_000_000)
    shared: bool = option(True, "one subword model and one vocabulary for both sides")
    min_freq: int = option(1, "vocabulary entries seen fewer times are dropped", minimum=0)
    max_size: int = option(
        0,
        "cap on vocabulary entries, specials included (0 = no cap; at most 10,000,000)",
        minimum=0,
        maximum=10_000_000,
    )
    tokenizer: Literal["aggressive", "conservative", "space", "char", "none"] = option(
        "aggressive",
        "pyonmttok pre-tokenization mode (with joiners; `none` = split on spaces, no joiners); "
        "ignored by SentencePiece",
    )
    sample_lines: int = option(
        1_000_000,
        "learn the subword model on a sample of this many non-blank lines per side, drawn uniformly over "
        "all the training files (seeded: the same files give the same sample; 0 = every line); the "
        "vocabulary counts every line",
        minimum=0,
    )
