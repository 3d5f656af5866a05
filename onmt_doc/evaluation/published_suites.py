"""The field's published contrastive suites, read from the files their repositories publish (or
their own scripts write), with no hand conversion. docs/evaluation.md ("Published suites") gives
each suite's steps from its repository to a number.

- ``contrapro`` (Müller et al., 2018; github.com/ZurichNLP/ContraPro): ``contrapro.json`` (a JSON
  array of items: ``src segment``, ``ref segment``, ``errors`` (list of ``{"contrastive": …}``),
  ``document id``, ``segment id``, ``src pronoun``, ``ref pronoun``, ``ante distance``,
  ``intrasegmental``) and, optionally, the files ``conversion_scripts/json2text_and_context.pl``
  writes: ``contrapro.context.{en,de}`` with ``--context N`` lines **per candidate** (the correct
  one, then each error, in the JSON's order; oldest line first; the same N lines for each candidate
  of an item) and ``contrapro.text.{en,de}`` (one line per candidate: the source, repeated; the
  reference from the document, then each contrastive). N is inferred from the line counts. Lines
  that the script takes from before the document's first sentence (``"null"``, its array's
  placeholder, and, further back, Perl's negative indices: the document's last lines) are dropped:
  the README says there is no context there.
- ``voita`` (Voita et al., 2019; github.com/lena-voita/good-translation-wrong-in-context):
  ``consistency_testsets/{deixis_test,deixis_dev,lex_cohesion_test,lex_cohesion_dev,ellipsis_vp,
  ellipsis_infl}.json``, a JSON array of groups ``{"src": …, "dst": [candidates…], "true_ind": i,
  "ctx_dist": d}``; each string is four sentences joined by ``" _eos "`` (three context sentences,
  then the current one), and each candidate has its own target context (deixis varies it).
  Optionally ``scoring_data/NAME.src`` / ``.dst`` (one line per candidate, the groups' lines in the
  JSON's order) replace the JSON's text; the JSON still gives the groups and ``true_ind`` (the
  ``.src`` lines cannot tell consecutive groups apart: they may share a source).
- ``bawden`` (Bawden et al., 2018; github.com/rbawden/discourse-mt-test-sets):
  ``test-sets/anaphora.json`` (blocks ``{"src": [previous, current], "trg": [{"correct" or
  "semi-correct": [previous, current], "incorrect": [previous, current], "type": "m.sg"…}, …]}``)
  and ``test-sets/lexical-choice.json`` / ``cohesion.json`` (blocks ``{"type": "repet"…,
  "examples": [{"src": [previous, current], "trg": {"correct": [...], "incorrect": [...]}}, …]}``),
  one JSON object keyed by block number; evaluate.py takes the blocks in numeric order. Each
  (correct, incorrect) pair is an item; its block is kept for the block rule. Optionally the files
  ``scripts/json2rawtext.py`` writes (and the repository holds): ``NAME.current.{en,fr}`` (one line
  per candidate, the correct one first) and ``NAME.prev.{en,fr}`` (one context line per candidate).

Every reader checks, before the first item is scored, that the line files hold one line (or N) per
candidate of the JSON, and at each item that the lines of its candidates agree where the
publishing script writes the same line for each (the source, the context); a mistake is one line
naming the file and the line or item.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator, Optional

from onmt_doc.errors import DataError, UserError
from onmt_doc.evaluation.suite_files import (
    ContrastiveItem,
    _check_item,
    _json_item,
    _json_objects,
    _open,
    count_lines,
    log,
)

EOS = re.compile(r"(?<!\S)_eos(?!\S)")  # Voita et al.'s sentence separator, a token of its own
_warned: set[str] = set()  # one warning per message and process (a suite is read once per ablation)


def read(
    fmt: str,
    path: str,
    context_src: Optional[str] = None,
    context_tgt: Optional[str] = None,
    context_lines: Optional[int] = None,
    text_src: Optional[str] = None,
    text_tgt: Optional[str] = None,
) -> Iterator[ContrastiveItem]:
    """The items of a published suite of format ``fmt`` (``contrapro``, ``voita``, ``bawden``) and
    the line files that go with it; misaligned files are refused here, before any item is read."""
    if context_lines is not None and context_lines < 1:
        raise UserError(f"-context_lines must be at least 1 (got {context_lines})")
    if fmt == "contrapro":
        return contrapro(path, context_src, context_tgt, context_lines, text_src, text_tgt)
    if fmt == "voita":
        if context_src or context_lines is not None:
            raise UserError(
                "Voita et al.'s suites carry their context in each line (sentences joined by ' _eos '): "
                "no -context_src/-context_tgt/-context_lines"
            )
        return voita(path, text_src, text_tgt)
    if fmt == "bawden":
        return bawden(path, context_src, context_tgt, context_lines, text_src, text_tgt)
    raise UserError(f"unknown published suite format {fmt!r} (contrapro, voita or bawden)")


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


class _LineFile:
    """A per-candidate line file read along a suite: the next lines, with file and line in errors."""

    def __init__(self, path: str, suite: str, stack: contextlib.ExitStack) -> None:
        self.path, self.suite = path, suite
        self.f = stack.enter_context(_open(path))

    @property
    def line(self) -> int:
        """The number of the last line taken."""
        return self.f.number

    def take(self, n: int, where: str) -> list[str]:
        """The next ``n`` lines (without line ends); the file ending first is an error."""
        out = []
        for _ in range(n):
            line = self.f.readline()
            if not line:
                raise DataError(f"{self.path}: ends at line {self.f.number}, before the lines of {where}")
            out.append(line.rstrip("\r\n"))
        return out

    def check_end(self) -> None:
        """The file must end with the suite's last candidate."""
        if self.f.readline():
            raise DataError(f"{self.path}:{self.f.number}: more lines than {self.suite} has candidates")


def _check_lines(path: str, suite: str, expected: int, what: str) -> None:
    lines = count_lines(path)
    if lines != expected:
        raise DataError(f"{path}: {lines} lines, but {suite} needs {expected} ({what})")


def _take_same(f: _LineFile, k: int, n: int, where: str, what: str) -> list[str]:
    """The next ``k`` blocks of ``n`` lines, one per candidate, which the publishing script writes
    identically (the source, the context): blocks that differ mean the file is misaligned."""
    blocks = [f.take(n, where) for _ in range(k)]
    first = f.line - k * n + 1
    for j, block in enumerate(blocks[1:], 1):
        if block != blocks[0]:
            raise DataError(
                f"{f.path}:{first + j * n}: {what} of candidate {j + 1} of {where} differs from candidate 1's "
                f"(line {first}): {f.path} is not aligned with {f.suite}"
            )
    return blocks[0]


# ---------------------------------------------------------------------------------- ContraPro
def contrapro(
    path: str,
    context_src: Optional[str] = None,
    context_tgt: Optional[str] = None,
    context_lines: Optional[int] = None,
    text_src: Optional[str] = None,
    text_tgt: Optional[str] = None,
) -> Iterator[ContrastiveItem]:
    """ContraPro's items (the module docstring), with the context and text files of
    json2text_and_context.pl; ``context_lines`` (its ``--context``) is inferred when None."""
    items = candidates = 0
    for line, obj in _json_objects(path):
        items += 1
        candidates += len(_contrapro_item(obj, f"{path}:{line} (item {items})").candidates())
    if not items:
        raise DataError(f"{path}: the suite has no items")
    n = _context_per_candidate(path, context_src, context_tgt, context_lines, items, candidates) if context_src else 0
    if text_src:
        for f in (text_src, text_tgt):
            _check_lines(f, path, candidates, f"one line per candidate of its {items} items, as contrapro.text.*")
    return _contrapro_items(path, context_src, context_tgt, n, text_src, text_tgt)


def _context_per_candidate(
    path: str, context_src: str, context_tgt: str, n: Optional[int], items: int, candidates: int
) -> int:
    """The context lines per candidate: ``n``, or inferred; the files must hold that many per candidate."""
    lines, other = count_lines(context_src), count_lines(context_tgt)
    if lines != other:
        raise DataError(f"{context_src} and {context_tgt}: {lines} and {other} lines; a suite's context files align")
    script = "json2text_and_context.pl writes its --context N lines once per candidate"
    if n is None:
        if lines == 0 or lines % candidates:
            raise DataError(
                f"{context_src}: {lines} lines, not a multiple of the {candidates} candidates of {path} ({items} "
                f"items): {script} (and stops at the first document it cannot find, saying 'missing file')"
            )
        return lines // candidates
    if lines != n * candidates:
        per_item = f" = {n} per item, not per candidate" if lines == n * items else ""
        raise DataError(
            f"{context_src}: {lines} lines{per_item}, but the {candidates} candidates of {path} with -context_lines "
            f"{n} need {n * candidates}: {script} (per-item context files go with -format json)"
        )
    return n


def _contrapro_item(obj: object, where: str) -> ContrastiveItem:
    """An item of ContraPro's JSON, with the categories its evaluate.py reports: ``src:ref pronoun``
    (both lower-cased), ``ante distance`` (``>3`` beyond 3) and ``intrasegmental``."""
    item = _json_item(obj, where)
    assert isinstance(obj, dict)
    cats = {}
    if "src pronoun" in obj and "ref pronoun" in obj:
        cats["src:ref pronoun"] = f"{str(obj['src pronoun']).lower()}:{str(obj['ref pronoun']).lower()}"
    distance = obj.get("ante distance")
    if distance is not None:
        far = isinstance(distance, (int, float)) and not isinstance(distance, bool) and distance > 3
        cats["ante distance"] = ">3" if far else str(distance)
    if "intrasegmental" in obj:
        cats["intrasegmental"] = str(obj["intrasegmental"])  # True, False or None, as evaluate.py prints them
    item.categories = cats
    return item


def _contrapro_items(
    path: str,
    context_src: Optional[str],
    context_tgt: Optional[str],
    n: int,
    text_src: Optional[str],
    text_tgt: Optional[str],
) -> Iterator[ContrastiveItem]:
    cut = 0
    with contextlib.ExitStack() as stack:
        ctx = [_LineFile(f, path, stack) for f in (context_src, context_tgt)] if context_src else []
        text = [_LineFile(f, path, stack) for f in (text_src, text_tgt)] if text_src else []
        for number, (line, obj) in enumerate(_json_objects(path), 1):
            where = f"{path}:{line} (item {number})"
            item = _contrapro_item(obj, where)
            k = len(item.candidates())
            if text:
                item.src = _take_same(text[0], k, 1, where, "the source line")[0]
                targets = text[1].take(k, where)
                item.correct, item.contrastive = targets[0], targets[1:]
            if ctx:
                src_lines, tgt_lines = (_take_same(f, k, n, where, f"the {n} context lines") for f in ctx)
                cut += _before_document(obj, src_lines, tgt_lines)
                item.ctx_src, item.ctx_tgt = src_lines, tgt_lines
            yield _check_item(item)
        for f in ctx + text:
            f.check_end()
    if cut:
        _warn_once(
            f"{path}: {cut} items have context lines from before their document's start, dropped "
            f"(json2text_and_context.pl writes its placeholder 'null' there, further back the document's last lines)"
        )


def _before_document(obj: dict, src: list[str], tgt: list[str]) -> int:
    """Blank the context lines json2text_and_context.pl took from before the document's first
    sentence (line ``segment id - c`` for the c-th line back, oldest first; document lines count
    from 1: line 0 is its placeholder ``null``, negative lines are the document's last ones).
    Returns 1 if it blanked any. (Bawden's EN-FR extractor counts from 0 and writes blank lines.)"""
    segment = obj.get("segment id")
    if not isinstance(segment, int) or isinstance(segment, bool):
        return 0
    blanked = 0
    for i in range(len(src)):
        back = segment - (len(src) - i)
        if back < 0 or (back == 0 and src[i] == "null" and tgt[i] == "null"):
            blanked |= bool(src[i] or tgt[i])
            src[i] = tgt[i] = ""
    return blanked


# ---------------------------------------------------------------------------------- Voita et al.
def voita(path: str, text_src: Optional[str] = None, text_tgt: Optional[str] = None) -> Iterator[ContrastiveItem]:
    """Voita et al.'s groups (the module docstring), from the JSON or from the scoring_data lines."""
    groups = candidates = 0
    for line, obj in _json_objects(path):
        groups += 1
        candidates += len(_voita_group(obj, f"{path}:{line} (group {groups})")[1])
        if not text_src:
            _voita_item(obj, f"{path}:{line} (group {groups})")
    if not groups:
        raise DataError(f"{path}: the suite has no groups")
    if text_src:
        for f in (text_src, text_tgt):
            _check_lines(f, path, candidates, f"one line per candidate of its {groups} groups, as scoring_data/*")
    return _voita_items(path, text_src, text_tgt)


def _voita_group(obj: object, where: str) -> tuple[str, list[str], int, dict[str, str]]:
    """(source, candidates, true_ind, categories) of one group, checked."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("src", "dst", "true_ind"):
        if key not in obj:
            raise DataError(f"{where}: missing '{key}'")
    src, dst, true = obj["src"], obj["dst"], obj["true_ind"]
    if not isinstance(src, str) or not isinstance(dst, list) or not all(isinstance(d, str) for d in dst):
        raise DataError(f"{where}: 'src' must be a string and 'dst' a list of strings")
    if len(dst) < 2:
        raise DataError(f"{where}: 'dst' needs the correct candidate and at least one contrastive one")
    if not isinstance(true, int) or isinstance(true, bool) or not 0 <= true < len(dst):
        raise DataError(f"{where}: 'true_ind' must be the index of a 'dst' candidate (0 to {len(dst) - 1})")
    cats = {"ctx_dist": str(obj["ctx_dist"])} if obj.get("ctx_dist") is not None else {}
    return src, dst, true, cats


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in EOS.split(text)]


def _voita_item(
    obj: object, where: str, src: Optional[str] = None, dst: Optional[list[str]] = None, dst_at: str = ""
) -> ContrastiveItem:
    """One group as an item: the context is every sentence but the last, each candidate's own;
    ``src``/``dst`` replace the JSON's text (``dst_at``: "FILE:LINE" of dst's first line)."""
    json_src, json_dst, true, cats = _voita_group(obj, where)
    src, dst = src if src is not None else json_src, dst if dst is not None else json_dst
    source = _sentences(src)
    targets = [_sentences(d) for d in dst]
    for j, t in enumerate(targets):
        if len(t) != len(source):
            file, _, line = dst_at.rpartition(":")
            at = f"{file}:{int(line) + j}" if dst_at else f"{where} candidate {j + 1}"
            raise DataError(f"{at}: {len(t)} sentences (joined by ' _eos ') but the source has {len(source)}")
    order = [true] + [j for j in range(len(dst)) if j != true]
    return ContrastiveItem(
        where,
        source[-1],
        targets[true][-1],
        [targets[j][-1] for j in order[1:]],
        source[:-1],
        targets[true][:-1],
        cats,
        candidate_ctx_tgt=[targets[j][:-1] for j in order],
        correct_index=true,
    )


def _voita_items(path: str, text_src: Optional[str], text_tgt: Optional[str]) -> Iterator[ContrastiveItem]:
    with contextlib.ExitStack() as stack:
        text = [_LineFile(f, path, stack) for f in (text_src, text_tgt)] if text_src else []
        for number, (line, obj) in enumerate(_json_objects(path), 1):
            where = f"{path}:{line} (group {number})"
            if not text:
                yield _check_item(_voita_item(obj, where))
                continue
            k = len(_voita_group(obj, where)[1])
            source = _take_same(text[0], k, 1, where, "the source line")[0]
            targets = text[1].take(k, where)
            item = _voita_item(obj, where, source, targets, f"{text[1].path}:{text[1].line - k + 1}")
            yield _check_item(item)
        for f in text:
            f.check_end()


# ---------------------------------------------------------------------------------- Bawden et al.
def bawden(
    path: str,
    context_src: Optional[str] = None,
    context_tgt: Optional[str] = None,
    context_lines: Optional[int] = None,
    text_src: Optional[str] = None,
    text_tgt: Optional[str] = None,
) -> Iterator[ContrastiveItem]:
    """Bawden et al.'s pairs (the module docstring), blocks in numeric order, with the line files
    of json2rawtext.py (``.current`` as text, ``.prev`` as context) when given."""
    values = list(_json_objects(path))
    if len(values) != 1 or not isinstance(values[0][1], dict) or not values[0][1]:
        raise DataError(
            f"{path}: expected one JSON object of numbered example blocks (Bawden et al.'s anaphora.json, "
            f"lexical-choice.json)"
        )
    blocks = values[0][1]
    for key in blocks:
        if not key.strip().isdigit():
            raise DataError(f"{path}: block {key!r} is not numbered (evaluate.py takes the blocks in numeric order)")
    items = [item for key in sorted(blocks, key=int) for item in _bawden_block(path, key, blocks[key])]
    n = 1 if context_lines is None else context_lines
    if context_src:
        for f in (context_src, context_tgt):
            _check_lines(f, path, n * 2 * len(items), f"{n} per candidate of its {len(items)} pairs, as NAME.prev.*")
    if text_src:
        for f in (text_src, text_tgt):
            _check_lines(
                f, path, 2 * len(items), f"one line per candidate of its {len(items)} pairs, as NAME.current.*"
            )
    return _bawden_items(path, items, context_src, context_tgt, n, text_src, text_tgt)


def _pair(value: object, where: str, key: str) -> list[str]:
    if not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, str) for v in value):
        raise DataError(f"{where}: '{key}' must be [previous sentence, current sentence]")
    return value


def _bawden_block(path: str, key: str, block: object) -> list[ContrastiveItem]:
    where = f"{path} block {key}"
    if not isinstance(block, dict):
        raise DataError(f"{where}: expected a JSON object")
    items = []
    if "examples" in block:  # lexical choice / cohesion: each example its own source, one pair
        kind = block.get("type")
        examples = block["examples"]
        if not isinstance(examples, list) or not examples:
            raise DataError(f"{where}: 'examples' must be a non-empty list")
        for j, ex in enumerate(examples, 1):
            at = f"{where} example {j}"
            if not isinstance(ex, dict) or not isinstance(ex.get("trg"), dict):
                raise DataError(f"{at}: expected {{'src': [...], 'trg': {{'correct': [...], 'incorrect': [...]}}}}")
            src = _pair(ex.get("src"), at, "src")
            good, bad = (
                _pair(ex["trg"].get("correct"), at, "correct"),
                _pair(ex["trg"].get("incorrect"), at, "incorrect"),
            )
            cats = {"type": str(kind)} if kind is not None else {}
            items.append(_bawden_item(at, key, src, good, bad, cats))
    elif "trg" in block:  # anaphora: one source, pairs of target contexts
        src = _pair(block.get("src"), where, "src")
        if not isinstance(block["trg"], list) or not block["trg"]:
            raise DataError(f"{where}: 'trg' must be a non-empty list of pairs")
        for j, t in enumerate(block["trg"], 1):
            at = f"{where} pair {j}"
            if not isinstance(t, dict):
                raise DataError(f"{at}: expected an object with 'correct' (or 'semi-correct') and 'incorrect'")
            variant = "correct" if "correct" in t else "semi-correct"  # as evaluate.py tells them apart
            good, bad = _pair(t.get(variant), at, variant), _pair(t.get("incorrect"), at, "incorrect")
            cats = {"type": str(t["type"])} if t.get("type") is not None else {}
            items.append(_bawden_item(at, key, src, good, bad, {**cats, "variant": variant}))
    else:
        raise DataError(f"{where}: expected 'trg' (anaphora) or 'examples' (lexical choice)")
    return items


def _bawden_item(
    where: str, block: str, src: list[str], good: list[str], bad: list[str], cats: dict[str, str]
) -> ContrastiveItem:
    return ContrastiveItem(
        where,
        src[1],
        good[1],
        [bad[1]],
        [src[0]],
        [good[0]],
        cats,
        candidate_ctx_tgt=[[good[0]], [bad[0]]],
        block=block,
    )


def _bawden_items(
    path: str,
    items: list[ContrastiveItem],
    context_src: Optional[str],
    context_tgt: Optional[str],
    n: int,
    text_src: Optional[str],
    text_tgt: Optional[str],
) -> Iterator[ContrastiveItem]:
    with contextlib.ExitStack() as stack:
        ctx = [_LineFile(f, path, stack) for f in (context_src, context_tgt)] if context_src else []
        text = [_LineFile(f, path, stack) for f in (text_src, text_tgt)] if text_src else []
        for item in items:
            if text:
                item.src = _take_same(text[0], 2, 1, item.where, "the source line")[0]
                targets = text[1].take(2, item.where)
                item.correct, item.contrastive = targets[0], targets[1:]
            if ctx:
                item.ctx_src = _take_same(ctx[0], 2, n, item.where, f"the {n} source context lines")
                item.candidate_ctx_tgt = [ctx[1].take(n, item.where) for _ in range(2)]
                item.ctx_tgt = item.candidate_ctx_tgt[0]
            yield _check_item(item)
        for f in ctx + text:
            f.check_end()
