"""Run-folder data preparation: learn subwords and vocabularies, load binarized instances.

The run folder (``log.dir``) holds ``subword.model`` (or ``src.subword`` and ``tgt.subword``) and
``vocab.txt`` (or ``vocab.src`` and ``vocab.tgt``); every checkpoint carries copies of them.
``vocab.sha256`` (``sha256sum`` format) records the digest of each of those files as written, and
:func:`load_codec` checks them against it: a changed vocabulary would give the run's checkpoints
other tokens for their ids.

Functions take the sections they read (``DataConfig``, ``VocabConfig``) and paths, never the whole
``Config``: the data layer has no business with training or model keys, and a caller (a tool, a
test) can prepare data without building a full config.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import time
from collections import Counter
from itertools import islice
from typing import Iterable, Iterator, Optional, Sequence

from onmt_doc.config.data import CorpusConfig, DataConfig, VocabConfig
from onmt_doc.data.cache import load_mapped
from onmt_doc.data.codec import Codec
from onmt_doc.data.corpus import iter_lines, iter_parallel
from onmt_doc.data.example_fields import FieldProvider, field_values
from onmt_doc.data.instances import UnitOptions
from onmt_doc.data.mapped import MappedCorpus, MappedExamples
from onmt_doc.data.progress import Progress
from onmt_doc.data.tokenizer import Subword
from onmt_doc.data.vocab import Vocab
from onmt_doc.data.workers import check_workers, default_workers, ordered_map
from onmt_doc.errors import ConfigError, UserError
from onmt_doc.outputs import Input, input_problem, make_folders, open_input, read_input_bytes, write_bytes

log = logging.getLogger("onmt_doc")


MANIFEST = "vocab.sha256"  # the digests of the codec files as save_codec wrote them
VOCAB_BYTES = 1 << 30  # the largest vocabulary read (10M entries are a few hundred MB)
SUBWORD_BYTES = 256 << 20  # the largest subword model read (real ones are a few MB)


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


def train_corpora(data: DataConfig) -> list[CorpusConfig]:
    """The training corpora (names and ``documents`` resolved), each with both files present."""
    corpora = data.corpora("train")
    single = isinstance(data.train, CorpusConfig)
    for c in corpora:
        where = "data.train" if single else f"data.train.{c.name}"
        if not c.src or not c.tgt:
            raise ConfigError(f"{where}.src and {where}.tgt are required")
    check_corpus_files(data)
    return corpora


def check_corpus_files(data: DataConfig) -> None:
    """Every training and validation file is a readable regular file: checked before any slow work,
    so a misspelt validation file is not found only after the subword model is learned. A device or
    a pipe is refused: training reads its corpora several times (the cache key hashes them first)."""
    for split in ("train", "valid"):
        single = isinstance(getattr(data, split), CorpusConfig)
        for c in data.corpora(split):
            where = f"data.{split}" if single else f"data.{split}.{c.name}"
            for side in ("src", "tgt"):
                path = getattr(c, side)
                problem = input_problem(path) if path else None
                if path and not problem and not os.path.isfile(path):
                    problem = "is not a regular file (a device or a pipe); training reads its corpora more than once"
                if problem:
                    raise ConfigError(f"{where}.{side}: {path}: {problem}")


def require_train_paths(data: DataConfig) -> tuple[str, str]:
    """The files of a single training corpus (tools that read one file pair)."""
    corpora = train_corpora(data)
    if len(corpora) > 1:
        raise ConfigError(f"data.train has {len(corpora)} corpora; this command reads one: give its files")
    return corpora[0].src, corpora[0].tgt


SAMPLE_SEED = 1  # the subword sample is a function of the files alone, not of train.seed
COUNT_CHUNK = 10_000  # lines tokenized at a time while counting the vocabulary


def _nonblank(paths: Sequence[str], max_chars: int) -> Iterator[str]:
    return (line for path in paths for line in iter_lines(path, max_chars) if line)


def sample_lines(lines: Iterable[str], limit: int, seed: int = SAMPLE_SEED) -> list[str]:
    """Every line when there are at most ``limit`` (0: no limit), else a uniform sample of ``limit``
    lines drawn with ``seed`` (reservoir sampling, Vitter's algorithm R), in their order in the
    input: spread over the whole corpus, not its head, in memory bounded by ``limit``."""
    if not limit:
        return list(lines)
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        if i < limit:
            reservoir.append((i, line))
        else:
            j = rng.randrange(i + 1)
            if j < limit:
                reservoir[j] = (i, line)
    return [line for _, line in sorted(reservoir)]


def _count(subword: Subword, lines: list[str]) -> tuple[int, Counter]:
    """A chunk's line count and token counts."""
    counts: Counter = Counter()
    for toks in subword.tokenize_batch(lines):
        counts.update(toks)
    return len(lines), counts


def count_tokens(subword: Subword, lines: Iterable[str], what: str, total: int = 0, workers: int = 1) -> Counter:
    """Token counts of ``lines`` under ``subword``, tokenized in chunks of COUNT_CHUNK lines by
    ``workers`` processes (:func:`ordered_map`), so that memory holds a few chunks and the counts, not
    the corpus; merged in the chunks' order, so the counts (in first-seen order) are one process's
    whatever the number of workers; a progress line every ``progress.PROGRESS_SECONDS``."""
    counts: Counter = Counter()
    progress = Progress(what, total)
    it = iter(lines)
    chunks = iter(lambda: (list(islice(it, COUNT_CHUNK)),), ([],))
    for n, part in ordered_map(_count, subword, Subword.from_dict, subword.to_dict(), chunks, workers):
        counts.update(part)
        progress.advance(n)
    progress.done()
    return counts


def _aligned_lines(corpora: Sequence[CorpusConfig], max_chars: int) -> int:
    """Check every corpus's alignment (streamed: errors name the file and line) and count its
    non-blank lines per side, before the slow part."""
    progress = Progress("checking alignment")
    for c in corpora:
        for doc in iter_parallel(c.src, c.tgt, c.documents, max_chars):
            progress.advance(len(doc) if doc else 0)
    progress.done()
    return progress.n


def build_codec(data: DataConfig, vocab: VocabConfig, run_dir: str, force: bool = False) -> Codec:
    """Learn the subword model(s) on a bounded sample of the training files (of every corpus:
    ``vocab.sample_lines`` per side), count the vocabularies over every line, streamed on
    ``data.workers`` processes, and save
    them in ``run_dir`` (:func:`save_codec`: ``force`` replaces those of a run with checkpoints).
    Memory: the sample and the counts, not the corpus."""
    corpora = train_corpora(data)
    check_workers(data.workers)  # before the minutes of learning the subword model
    inputs = [(f"data.train.{c.name}.{side}", getattr(c, side)) for c in corpora for side in ("src", "tgt")]
    max_chars = data.max_line_chars
    total = _aligned_lines(corpora, max_chars)

    def lines(side: str) -> Iterator[str]:
        return _nonblank([getattr(c, side) for c in corpora], max_chars)

    def sample(side: str) -> list[str]:
        return sample_lines(lines(side), vocab.sample_lines)

    if vocab.shared:
        src_sw = tgt_sw = Subword.learn(vocab.subword, vocab.tokenizer, vocab.size, sample("src") + sample("tgt"))
    else:
        src_sw = Subword.learn(vocab.subword, vocab.tokenizer, vocab.size, sample("src"))
        tgt_sw = Subword.learn(vocab.subword, vocab.tokenizer, vocab.size, sample("tgt"))
    workers = data.workers or default_workers()
    counts = {
        side: count_tokens(sw, lines(side), f"counting {side} tokens", total, workers)
        for side, sw in (("src", src_sw), ("tgt", tgt_sw))
    }
    if vocab.shared:
        src_vocab = tgt_vocab = Vocab.build(counts["src"] + counts["tgt"], vocab.min_freq, vocab.max_size)
    else:
        src_vocab = Vocab.build(counts["src"], vocab.min_freq, vocab.max_size)
        tgt_vocab = Vocab.build(counts["tgt"], vocab.min_freq, vocab.max_size)
    codec = Codec(src_sw, tgt_sw, src_vocab, tgt_vocab)
    save_codec(codec, run_dir, vocab.shared, inputs, force)
    return codec


def codec_files(run_dir: str, shared: bool) -> list[tuple[str, str]]:
    """The run folder's subword model and vocabulary files that exist (``shared``: ``vocab.shared``),
    as (what, path) inputs of a command (so that no output of it may land on them)."""
    p = {**_paths(run_dir, shared), "vocab digests": os.path.join(run_dir, MANIFEST)}
    return [(f"run folder's {key}", path) for key, path in p.items() if os.path.exists(path)]


def run_checkpoints(run_dir: str) -> list[str]:
    """The checkpoints of a run folder (``checkpoints/*.pt``), sorted by name."""
    folder = os.path.join(run_dir, "checkpoints")
    return sorted(e.path for e in os.scandir(folder) if e.name.endswith(".pt")) if os.path.isdir(folder) else []


def save_codec(
    codec: Codec, run_dir: str, shared: bool, inputs: Sequence[Input] = (), force: bool = False
) -> list[str]:
    """Write the subword model(s) and vocabularies into the run folder, so a checkpoint's run is
    self-contained and translation needs nothing from the training machine. Call with the run
    folder locked. A file that would change in a run that has checkpoints is refused unless
    ``force``, which first keeps the old file as ``<name>.backup-<time>`` (returned): the
    checkpoints' token ids mean the old vocabulary's tokens."""
    make_folders(run_dir, "log.dir")
    p = _paths(run_dir, shared)
    new = {
        "src_subword": codec.src_subword.model,
        "tgt_subword": codec.tgt_subword.model,
        "src_vocab": codec.src_vocab.text().encode("utf-8"),
        "tgt_vocab": codec.tgt_vocab.text().encode("utf-8"),
    }
    changed = {key: p[key] for key, data in new.items() if data is not None and _differs(p[key], data)}
    backups: list[str] = []
    if changed and any(os.path.exists(path) for path in changed.values()):
        backups = _guard_replacement(run_dir, sorted(set(changed.values())), force)
    for path, key in {path: key for key, path in changed.items()}.items():
        write_bytes(path, new[key], inputs, flag="")
    digests = {os.path.basename(p[key]): hashlib.sha256(data).hexdigest() for key, data in new.items() if data}
    manifest = "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items())).encode()
    if _differs(os.path.join(run_dir, MANIFEST), manifest):
        write_bytes(os.path.join(run_dir, MANIFEST), manifest, inputs, flag="")
    return backups


def verify_codec_files(run_dir: str) -> None:
    """Check the codec files of a run folder against the digests ``save_codec`` recorded
    (``vocab.sha256``; a run written before it has none, and is not checked): a vocabulary or
    subword model changed since would silently give the run's checkpoints and cache other tokens."""
    manifest = os.path.join(run_dir, MANIFEST)
    if not os.path.isfile(manifest):
        return
    for number, line in enumerate(read_input_bytes(manifest, limit=1 << 16).decode("utf-8", "replace").splitlines(), 1):
        digest, _, name = line.partition("  ")
        path = os.path.join(run_dir, name)
        if len(digest) != 64 or not name or os.sep in name:
            raise UserError(f"{manifest}:{number}: not a '<sha256>  <file name>' line; rebuild the vocabulary")
        if not os.path.isfile(path):
            continue  # a file the run no longer has: load_codec says what is missing
        h = hashlib.sha256()
        with open_input(path) as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        if h.hexdigest() != digest:
            raise UserError(
                f"{path}: changed since it was written (its sha256 differs from {MANIFEST}); the run's checkpoints "
                f"and cache use the vocabulary it held: run onmt_doc_build_vocab again (-force if the run has "
                f"checkpoints), or delete {MANIFEST} to use the file as it is now"
            )


def _differs(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() != data
    except FileNotFoundError:
        return True


def _guard_replacement(run_dir: str, paths: list[str], force: bool) -> list[str]:
    """Refuse to replace the vocabulary of a run with checkpoints unless ``force``; with it, back
    the old files up first."""
    existing = [path for path in paths if os.path.exists(path)]
    ckpts = run_checkpoints(run_dir)
    if not existing or not ckpts:
        return []
    if not force:
        raise UserError(
            f"{run_dir} has {len(ckpts)} checkpoint(s) trained with its current vocabulary; replacing "
            f"{', '.join(os.path.basename(x) for x in existing)} would make them unusable for this run. Use "
            f"another log.dir, or add -force (the old files are kept as <name>.backup-<time>)"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backups = []
    manifest = os.path.join(run_dir, MANIFEST)  # their digests go with them: the backups stay checkable
    for path in existing + ([manifest] if os.path.exists(manifest) else []):
        backup = f"{path}.backup-{stamp}"
        shutil.copy2(path, backup)
        backups.append(backup)
        log.warning("%s: replaced; the old file is kept as %s", path, backup)
    return backups


def load_codec(vocab: VocabConfig, run_dir: str) -> Optional[Codec]:
    """The run folder's codec (read as ``vocab`` says), or None when onmt_doc_build_vocab has not been run there."""
    p = _paths(run_dir, vocab.shared)
    if not os.path.exists(p["src_vocab"]) or not os.path.exists(p["tgt_vocab"]):
        return None

    verify_codec_files(run_dir)

    def subword(path: str) -> Subword:
        if vocab.subword == "none":
            return Subword("none", vocab.tokenizer, None)
        if not os.path.exists(path):
            raise ConfigError(f"{path}: subword model missing (run onmt_doc_build_vocab again)")
        return Subword(
            vocab.subword, vocab.tokenizer, read_input_bytes(path, limit=SUBWORD_BYTES, what="subword model")
        )

    src_sw = subword(p["src_subword"])
    tgt_sw = src_sw if vocab.shared else subword(p["tgt_subword"])
    return Codec(src_sw, tgt_sw, Vocab.load(p["src_vocab"]), Vocab.load(p["tgt_vocab"]))


def data_cache_dir(data: DataConfig, run_dir: str) -> str:
    """Where binarized corpora (and what is cached with them, e.g. z*) live: data.cache_dir or <run>/cache."""
    return data.cache_dir or os.path.join(run_dir, "cache")


def binarize_corpora(data: DataConfig, codec: Codec, run_dir: str) -> None:
    """Binarize every training and validation corpus missing from the cache (what one process does
    before the others of a distributed run map the caches it wrote)."""
    cache_dir = data_cache_dir(data, run_dir)
    for split in ("train", "valid"):
        for c in data.corpora(split):
            if c.src and c.tgt:
                load_mapped(c.src, c.tgt, codec, bool(c.documents), data.max_line_chars, cache_dir, data.workers)


def load_examples(
    data: DataConfig,
    codec: Codec,
    src: str,
    tgt: str,
    unit: str,
    run_dir: str,
    filter_long: bool = True,
    fields: Sequence[FieldProvider] = (),
    documents: Optional[bool] = None,
) -> tuple[MappedExamples, MappedCorpus]:
    """Instances of a parallel corpus for ``unit`` with the per-example ``fields`` (the ones losses
    ask for), and its memory-mapped binarized corpus. ``documents``: the corpus' own flag
    (None = ``data.documents``); ``false`` makes each line a one-sentence document.

    The instances are index arrays over the mapped corpus (:class:`MappedExamples`, for every
    registered unit: the unit states them), the fields arrays beside its target ids (cached in its
    folder); an Example or a batch is read from them when asked for."""
    documents = data.documents if documents is None else documents
    cache_dir = data_cache_dir(data, run_dir)
    corpus, cached = load_mapped(src, tgt, codec, documents, data.max_line_chars, cache_dir, data.workers)
    options = UnitOptions(
        data.max_tokens,
        data.max_len if filter_long else 0,
        data.max_sentences,
        context_sentences=data.context_sentences,
        sentence_markup=data.sentence_markup,
    )
    examples = MappedExamples(corpus, unit, options, field_values(fields, corpus))
    dropped = examples.dropped
    log.info(
        "%s: %d documents, %d sentence pairs -> %d %s instances%s%s",
        src,
        corpus.n_docs,
        corpus.n_sents,
        len(examples),
        unit,
        " (binarized cache)" if cached else "",
        f"; {dropped} pairs dropped by data.max_len={data.max_len}" if dropped else "",
    )
    return examples, corpus
