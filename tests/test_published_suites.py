"""The field's published contrastive suites read from their own files (onmt_doc/evaluation/published_suites.py)
and scored under each suite's own accuracy rule.

The fixtures are written here in the layouts the suites' repositories publish, with made-up
sentences (none of the suites' text):

- ContraPro (github.com/ZurichNLP/ContraPro): ``contrapro.json`` as its keys are (the same layout as
  rbawden/Large-contrastive-pronoun-testset-EN-FR's UN-testset-enfr.json), and the four files
  ``conversion_scripts/json2text_and_context.pl --context N`` writes from the OpenSubtitles documents:
  ``contrapro.context.{en,de}`` with the N context lines once **per candidate** (oldest first, the
  document's line ``segment id - c`` of a Perl array whose element 0 is the string ``null``, so that
  negative lines wrap to the document's end), and ``contrapro.text.{en,de}``.
- Voita et al. (github.com/lena-voita/good-translation-wrong-in-context): ``consistency_testsets/NAME.json``
  (one line: a JSON array of ``{"dst": [...], "true_ind": i, "src": ..., "ctx_dist": d}``, four
  sentences joined by ``" _eos "``) and ``scoring_data/NAME.src`` / ``.dst`` (one line per candidate).
- Bawden et al. (github.com/rbawden/discourse-mt-test-sets): ``test-sets/anaphora.json`` and
  ``lexical-choice.json`` (one object of numbered blocks), and the ``NAME.current.*``/``NAME.prev.*``
  files ``scripts/json2rawtext.py`` writes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import module_cmd, run_cli, tiny_config

from onmt_doc.bin.evaluate import main as evaluate_main
from onmt_doc.errors import DataError, UserError
from onmt_doc.evaluation.contrastive import (
    Accuracy,
    ContextWindow,
    ablate,
    evaluate_suite,
    item_right,
    read_suite,
    score_suite,
)
from onmt_doc.evaluation.suite_files import ContrastiveItem, detect_format
from onmt_doc.models.checkpoint import load_model
from onmt_doc.translate.translator import Translator

EVALUATE = module_cmd("onmt_doc.bin.evaluate")
MAX_TOKENS_FOR_PART = 56  # data.max_tokens that holds a deixis group's last sentences with part of their context

# ------------------------------------------------------------------------------ ContraPro's layout
DOCS = {  # OpenSubtitles-like documents, one (English, German) pair per line, line 1 first
    "2001_1_a.de": [
        ("The lamp is broken .", "Die Lampe ist kaputt ."),
        ("Where did you buy it ?", "Wo hast du sie gekauft ?"),
        ("At the market .", "Auf dem Markt ."),
        ("The clock too ?", "Die Uhr auch ?"),
        ("No , it was a gift .", "Nein , sie war ein Geschenk ."),
    ],
    "2002_7_b.de": [
        ("It is cold .", "Es ist kalt ."),
        ("Close the window .", "Mach das Fenster zu ."),
        ("The garden is wet .", "Der Garten ist nass ."),
    ],
}


def _contrapro_items() -> list[dict]:
    """Three items in ContraPro's JSON keys: 3, 2 and 3 candidates; the last at a document's first line."""

    def err(contrastive: str, replacement: str) -> dict:
        return {"type": "pronominal coreference", "replacement": replacement, "contrastive": contrastive}

    def item(doc: str, seg: int, src_p: str, ref_p: str, ante: object, intra: object, errors: list) -> dict:
        en, de = DOCS[doc][seg - 1]
        return {
            "segment id": seg,
            "ante distance": ante,
            "errors": errors,
            "src pronoun": src_p,
            "ref pronoun": ref_p,
            "document id": doc,
            "src segment": en,
            "intrasegmental": intra,
            "ref segment": de,
        }

    return [
        item(
            "2001_1_a.de",
            2,
            "it",
            "sie",
            1,
            False,
            [err("Wo hast du ihn gekauft ?", "ihn"), err("Wo hast du es gekauft ?", "es")],
        ),
        item("2001_1_a.de", 5, "it", "sie", 5, None, [err("Nein , er war ein Geschenk .", "er")]),
        item(
            "2002_7_b.de",
            1,
            "It",
            "Es",
            0,
            True,
            [err("Er ist kalt .", "er"), err("Sie ist kalt .", "sie")],
        ),
    ]


def write_contrapro(d: Path, context: int = 1) -> dict[str, Path]:
    """contrapro.json (pretty-printed, as published) and what json2text_and_context.pl --context N writes."""
    items = _contrapro_items()
    (d / "contrapro.json").write_text(json.dumps(items, indent=2), encoding="utf-8")
    out = {k: [] for k in ("text.en", "text.de", "context.en", "context.de")}
    for it in items:
        src_doc = ["null"] + [en for en, _ in DOCS[it["document id"]]]  # the script's unshift
        trg_doc = ["null"] + [de for _, de in DOCS[it["document id"]]]
        line = it["segment id"]
        for target in [trg_doc[line]] + [e["contrastive"] for e in it["errors"]]:
            for c in range(context, 0, -1):  # the same block before every candidate
                out["context.en"].append(src_doc[line - c])  # negative: Perl's (and Python's) end of list
                out["context.de"].append(trg_doc[line - c])
            out["text.en"].append(src_doc[line])
            out["text.de"].append(target)
    paths = {k: d / f"contrapro.{k}" for k in out}
    for k, lines in out.items():
        paths[k].write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    paths["json"] = d / "contrapro.json"
    return paths


# ------------------------------------------------------------------------------ Voita et al.'s layout
def _eos(*sentences: str) -> str:
    return " _eos ".join(sentences)


VOITA_GROUPS = [
    {  # deixis-like: the candidates differ in their context translations, not only in the last sentence
        "dst": [
            _eos("Вы пришли .", "Да .", "Хорошо .", "Садитесь ."),
            _eos("Ты пришёл сюда .", "Да .", "Хорошо .", "Садитесь ."),
            _eos("Вы пришли .", "Да .", "Хорошо .", "Садись , пожалуйста , вот сюда на этот стул ."),
        ],
        "true_ind": 0,
        "src": _eos("You came .", "Yes .", "Good .", "Sit down ."),
        "ctx_dist": 3,
    },
    {  # ellipsis-like, with a contrastive candidate identical to the correct one
        "dst": [
            _eos("Он ест .", "Нет .", "Я не ем .", "А он ест ."),
            _eos("Он ест .", "Нет .", "Я не ем .", "А он пьёт воду , молоко и чай каждый день ."),
            _eos("Он ест .", "Нет .", "Я не ем .", "А он ест ."),
        ],
        "true_ind": 0,
        "src": _eos("He eats .", "No .", "I don 't eat .", "But he does ."),
        "ctx_dist": 1,
    },
    {  # the correct candidate listed second (the script allows any true_ind)
        "dst": [
            _eos("Где кот ?", "Там .", "Спит .", "Он спит весь день на диване у окна ."),
            _eos("Где кот ?", "Там .", "Спит .", "Кот спит ."),
        ],
        "true_ind": 1,
        "src": _eos("Where is the cat ?", "There .", "Asleep .", "The cat sleeps ."),
        "ctx_dist": 2,
    },
]


def write_voita(d: Path, groups: list[dict] = VOITA_GROUPS) -> dict[str, Path]:
    """consistency_testsets/NAME.json (one line, ASCII-escaped as published) and scoring_data/NAME.{src,dst}."""
    (d / "scoring_data").mkdir(exist_ok=True)
    paths = {"json": d / "ellipsis_vp.json", "src": d / "scoring_data/ellipsis_vp.src"}
    paths["dst"] = d / "scoring_data/ellipsis_vp.dst"
    paths["json"].write_text(json.dumps(groups), encoding="utf-8")
    paths["src"].write_text("".join(g["src"] + "\n" for g in groups for _ in g["dst"]), encoding="utf-8")
    paths["dst"].write_text("".join(x + "\n" for g in groups for x in g["dst"]), encoding="utf-8")
    return paths


# ------------------------------------------------------------------------------ Bawden et al.'s layout
ANAPHORA = {
    "2": {
        "inspired by": ["A made-up line .", "Another one ."],
        "src": ["The chairs are new .", "They are comfortable ."],
        "trg": [
            {
                "correct": ["Les chaises sont neuves .", "Elles sont confortables ."],
                "incorrect": ["Les chaises sont neuves .", "Ils sont confortables ."],
                "type": "f.pl",
            },
            {
                "semi-correct": ["Les sièges sont neufs .", "Ils sont confortables ."],
                "incorrect": ["Les sièges sont neufs .", "Elles sont confortables ."],
                "type": "m.pl",
            },
        ],
    },
    "10": {
        "inspired by": ["Some line .", "Some other line ."],
        "src": ["I lost my key .", "Did you find it ?"],
        "trg": [
            {
                "correct": ["J'ai perdu ma clé .", "Tu l'as trouvée ?"],
                "incorrect": ["J'ai perdu ma clé .", "Tu l'as trouvé ?"],
                "type": "f.sg",
            },
            {
                "correct": ["J'ai perdu mon badge .", "Tu l'as trouvé ?"],
                "incorrect": ["J'ai perdu mon badge .", "Tu l'as trouvée ?"],
                "type": "m.sg",
            },
        ],
    },
}
LEXICAL = {
    "1": {
        "inspired by": ["Line .", "Line ."],
        "type": "disambig",
        "examples": [
            {
                "src": ["The river rose .", "We sat on the bank ."],
                "trg": {
                    "correct": ["La rivière a monté .", "On s'est assis sur la rive ."],
                    "incorrect": ["La rivière a monté .", "On s'est assis sur la banque ."],
                },
            },
            {
                "src": ["I needed cash .", "We sat on the bank ."],
                "trg": {
                    "correct": ["Il me fallait du liquide .", "On s'est assis sur la banque ."],
                    "incorrect": ["Il me fallait du liquide .", "On s'est assis sur la rive ."],
                },
            },
        ],
    },
}


def write_bawden(d: Path, name: str, blocks: dict) -> dict[str, Path]:
    """test-sets/NAME.json (indented, as published) and what json2rawtext.py writes: per pair, the source
    twice, then the correct and the incorrect translation; the previous sentences likewise."""
    paths = {"json": d / f"{name}.json"}
    paths["json"].write_text(json.dumps(blocks, indent=2, ensure_ascii=False), encoding="utf-8")
    out = {k: [] for k in ("current.en", "prev.en", "current.fr", "prev.fr")}
    for key in sorted(blocks, key=int):
        block = blocks[key]
        pairs = (
            [(ex["src"], ex["trg"]["correct"], ex["trg"]["incorrect"]) for ex in block["examples"]]
            if "examples" in block
            else [(block["src"], t.get("correct", t.get("semi-correct")), t["incorrect"]) for t in block["trg"]]
        )
        for src, good, bad in pairs:
            for _ in range(2):
                out["current.en"].append(src[1])
                out["prev.en"].append(src[0])
            for trg in (good, bad):
                out["current.fr"].append(trg[1])
                out["prev.fr"].append(trg[0])
    for k, lines in out.items():
        paths[k] = d / f"{name}.{k}"
        paths[k].write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return paths


# ------------------------------------------------------------------------------ readers
def test_contrapro_reads_the_per_candidate_context_files_of_json2text_and_context(tmp_path):
    """json2text_and_context.pl writes the context before every candidate; each item gets its own
    (the old reader, one block per item, gave item 2 item 1's context and failed after the last item).
    The number of lines per candidate is inferred; ContraPro's categories are those of its evaluate.py."""
    f = write_contrapro(tmp_path, context=1)
    items = list(read_suite(str(f["json"]), "contrapro", str(f["context.en"]), str(f["context.de"]), 1))
    assert [len(i.candidates()) for i in items] == [3, 2, 3]
    assert [(i.ctx_src, i.ctx_tgt) for i in items] == [
        (["The lamp is broken ."], ["Die Lampe ist kaputt ."]),
        (["The clock too ?"], ["Die Uhr auch ?"]),
        ([], []),  # the document's first line: the script's placeholder "null" is no context
    ]
    assert items[0].correct == "Wo hast du sie gekauft ?" and items[0].contrastive[1] == "Wo hast du es gekauft ?"
    assert items[0].categories == {"src:ref pronoun": "it:sie", "ante distance": "1", "intrasegmental": "False"}
    assert items[1].categories["ante distance"] == ">3" and items[1].categories["intrasegmental"] == "None"
    assert items[2].categories["src:ref pronoun"] == "it:es" and items[0].document == "2001_1_a.de"
    # --context 2, inferred from the line counts; before the document's start: "null", then its last line
    (tmp_path / "c2").mkdir()
    f2 = write_contrapro(tmp_path / "c2", context=2)
    lines = f2["context.de"].read_text(encoding="utf-8").splitlines()
    assert lines[:2] == ["null", "Die Lampe ist kaputt ."] and lines[-2:] == ["Der Garten ist nass .", "null"]
    items = list(read_suite(str(f2["json"]), "contrapro", str(f2["context.en"]), str(f2["context.de"])))
    assert (items[0].ctx_src, items[0].ctx_tgt) == (["The lamp is broken ."], ["Die Lampe ist kaputt ."])
    assert items[1].ctx_tgt == ["Auf dem Markt .", "Die Uhr auch ?"] and items[2].ctx_src == []


def test_contrapro_text_files_replace_the_json_sentences(tmp_path):
    """contrapro.text.{en,de}, e.g. after the user's own preprocessing, are what is scored."""
    f = write_contrapro(tmp_path)
    for k in ("text.en", "text.de", "context.en", "context.de"):
        f[k].write_text(f[k].read_text(encoding="utf-8").lower(), encoding="utf-8")
    files = [str(f[k]) for k in ("context.en", "context.de")] + [None, str(f["text.en"]), str(f["text.de"])]
    items = list(read_suite(str(f["json"]), "contrapro", *files))
    assert items[0].src == "where did you buy it ?" and items[0].correct == "wo hast du sie gekauft ?"
    assert items[0].contrastive == ["wo hast du ihn gekauft ?", "wo hast du es gekauft ?"]
    assert items[1].ctx_src == ["the clock too ?"]


def test_contrapro_misaligned_files_are_one_line_errors_before_scoring(tmp_path):
    """Per-item context files, a truncated file (the script stops at a missing document) and lines
    shifted inside the files: refused when read, naming the file and the line."""
    f = write_contrapro(tmp_path)
    ctx = [str(f["context.en"]), str(f["context.de"])]
    lines = f["context.en"].read_text(encoding="utf-8").splitlines()
    per_item = tmp_path / "per_item.en"
    per_item.write_text("".join(lines[i] + "\n" for i in (0, 3, 5)), encoding="utf-8")
    (tmp_path / "per_item.de").write_text("a .\nb .\nc .\n", encoding="utf-8")
    with pytest.raises(DataError, match="per item, not per candidate"):
        read_suite(str(f["json"]), "contrapro", str(per_item), str(tmp_path / "per_item.de"), 1)
    short = tmp_path / "short.en"
    short.write_text("".join(x + "\n" for x in lines[:7]), encoding="utf-8")
    (tmp_path / "short.de").write_text("".join(x + "\n" for x in lines[:7]), encoding="utf-8")
    with pytest.raises(DataError, match="missing file"):
        read_suite(str(f["json"]), "contrapro", str(short), str(tmp_path / "short.de"))
    swapped = lines[:]
    swapped[4], swapped[5] = swapped[5], swapped[4]  # item 2's second candidate gets item 3's line
    f["context.en"].write_text("".join(x + "\n" for x in swapped), encoding="utf-8")
    items = read_suite(str(f["json"]), "contrapro", *ctx)
    assert next(items).ctx_src == ["The lamp is broken ."]
    with pytest.raises(DataError) as e:
        next(items)
    assert f"{f['context.en']}:5:" in str(e.value) and "item 2" in str(e.value) and "not aligned" in str(e.value)
    with pytest.raises(DataError, match="text.en: 7 lines"):
        f["text.en"].write_text("x\n" * 7, encoding="utf-8")
        read_suite(str(f["json"]), "contrapro", None, None, None, str(f["text.en"]), str(f["text.de"]))


def test_json_format_refuses_context_files_written_per_candidate(tmp_path):
    """ContraPro's JSON reads as -format json (auto) too, with context files per item; its
    per-candidate files are refused before any item is read (the old reader gave item 2 item 1's
    context and failed only after the last item)."""
    f = write_contrapro(tmp_path)
    assert detect_format(str(f["json"])) == "json"
    with pytest.raises(DataError, match="per candidate .* -format contrapro"):
        read_suite(str(f["json"]), "auto", str(f["context.en"]), str(f["context.de"]), 1)


def test_voita_groups_from_the_json(tmp_path):
    """Each group an item: the last sentence of each candidate, every candidate with its own context
    translation; true_ind picks the correct one (listed second here), ctx_dist is a category."""
    f = write_voita(tmp_path)
    assert detect_format(str(f["json"])) == "voita"
    deixis, ellipsis, cat = read_suite(str(f["json"]))
    assert deixis.src == "Sit down ." and deixis.ctx_src == ["You came .", "Yes .", "Good ."]
    assert deixis.correct == "Садитесь ." and deixis.contrastive[0] == "Садитесь ."
    assert deixis.candidate_ctx_tgt == [
        ["Вы пришли .", "Да .", "Хорошо ."],
        ["Ты пришёл сюда .", "Да .", "Хорошо ."],
        ["Вы пришли .", "Да .", "Хорошо ."],
    ]
    assert not deixis.has_duplicate() and ellipsis.has_duplicate()
    assert ellipsis.candidate_ctx_tgt is None and ellipsis.ctx_tgt == ["Он ест .", "Нет .", "Я не ем ."]
    assert (cat.correct, cat.correct_index) == ("Кот спит .", 1) and cat.contrastive[0].startswith("Он спит")
    assert [i.categories for i in (deixis, ellipsis, cat)] == [{"ctx_dist": "3"}, {"ctx_dist": "1"}, {"ctx_dist": "2"}]


def test_voita_scoring_data_lines_with_the_json_groups(tmp_path):
    """scoring_data/NAME.src/.dst (lower-cased, as their README suggests) give the text; the JSON the
    groups. Misaligned lines are refused: by count before reading, inside a group at its line."""
    f = write_voita(tmp_path)
    for k in ("src", "dst"):
        f[k].write_text(f[k].read_text(encoding="utf-8").lower(), encoding="utf-8")
    items = list(read_suite(str(f["json"]), "voita", text_src=str(f["src"]), text_tgt=str(f["dst"])))
    assert items[0].src == "sit down ." and items[2].correct == "кот спит ." and items[2].correct_index == 1
    assert items[0].candidate_ctx_tgt[1][0] == "ты пришёл сюда ."
    src_lines = f["src"].read_text(encoding="utf-8").splitlines()
    f["src"].write_text("".join(x + "\n" for x in src_lines[1:]), encoding="utf-8")
    with pytest.raises(DataError, match=r"ellipsis_vp.src: 7 lines, but .* needs 8"):
        read_suite(str(f["json"]), "voita", text_src=str(f["src"]), text_tgt=str(f["dst"]))
    src_lines[3], src_lines[6] = src_lines[6], src_lines[3]  # group 2's first line and group 3's
    f["src"].write_text("".join(x + "\n" for x in src_lines), encoding="utf-8")
    items = read_suite(str(f["json"]), "voita", text_src=str(f["src"]), text_tgt=str(f["dst"]))
    assert next(items).src == "sit down ."
    with pytest.raises(DataError, match=r"ellipsis_vp.src:5: the source line of candidate 2 of .*group 2"):
        next(items)
    with pytest.raises(UserError, match="_eos"):
        read_suite(str(f["json"]), "voita", str(f["src"]), str(f["dst"]))


@pytest.mark.parametrize(
    "group, message",
    [
        ({"dst": ["a _eos b", "a _eos c"], "src": "x _eos y"}, "missing 'true_ind'"),
        ({"dst": ["a _eos b", "a _eos c"], "src": "x _eos y", "true_ind": 2}, "'true_ind' must be"),
        ({"dst": ["a _eos b", "a _eos c _eos d"], "src": "x _eos y", "true_ind": 0}, "candidate 2: 3 sentences"),
        ({"dst": ["a _eos b"], "src": "x _eos y", "true_ind": 0}, "at least one contrastive"),
    ],
)
def test_voita_malformed_groups_name_file_line_and_group(tmp_path, group, message):
    path = tmp_path / "deixis_test.json"
    good = {"dst": ["a _eos b", "a _eos c"], "src": "x _eos y", "true_ind": 0}
    path.write_text("[\n" + json.dumps(good) + ",\n" + json.dumps(group) + "\n]", encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_suite(str(path), "voita")  # checked before the first item is read
    assert f"{path}:3 (group 2)" in str(e.value) and message in str(e.value) and "\n" not in str(e.value)


def test_bawden_anaphora_and_lexical_choice(tmp_path):
    """One item per (correct, incorrect) pair, blocks in numeric order (2 before 10), the previous
    sentences as context, each candidate with its own previous translation; categories as their
    evaluate.py splits them."""
    f = write_bawden(tmp_path, "anaphora", ANAPHORA)
    assert detect_format(str(f["json"])) == "bawden"
    items = list(read_suite(str(f["json"])))
    assert [i.block for i in items] == ["2", "2", "10", "10"]
    first, semi = items[0], items[1]
    assert (first.src, first.correct, first.contrastive) == (
        "They are comfortable .",
        "Elles sont confortables .",
        ["Ils sont confortables ."],
    )
    assert first.ctx_src == ["The chairs are new ."] and first.ctx_tgt == ["Les chaises sont neuves ."]
    assert semi.categories == {"type": "m.pl", "variant": "semi-correct"} and semi.correct == "Ils sont confortables ."
    lex = write_bawden(tmp_path, "lexical-choice", LEXICAL)
    # as docs/evaluation.md runs it, without -format: its blocks hold their sources inside "examples"
    # (issue 42: it was read as the generic json format and refused, "missing 'source'")
    assert detect_format(str(lex["json"])) == "bawden"
    assert [i.correct for i in read_suite(str(lex["json"]))] == [
        i.correct for i in read_suite(str(lex["json"]), "bawden")
    ]
    items = list(read_suite(str(lex["json"]), "bawden"))
    assert [(i.ctx_src, i.correct, i.categories) for i in items] == [
        (["The river rose ."], "On s'est assis sur la rive .", {"type": "disambig"}),
        (["I needed cash ."], "On s'est assis sur la banque .", {"type": "disambig"}),
    ]


def test_bawden_json2rawtext_files(tmp_path):
    """NAME.current.* as the text, NAME.prev.* as the context (one line per candidate): the same items;
    a shifted line is refused at its pair."""
    f = write_bawden(tmp_path, "anaphora", ANAPHORA)
    files = [str(f[k]) for k in ("prev.en", "prev.fr")] + [None] + [str(f[k]) for k in ("current.en", "current.fr")]
    from_json = list(read_suite(str(f["json"])))
    from_lines = list(read_suite(str(f["json"]), "bawden", *files))
    key = [(i.src, i.correct, i.contrastive, i.ctx_src, i.target_contexts(), i.categories) for i in from_json]
    assert [(i.src, i.correct, i.contrastive, i.ctx_src, i.target_contexts(), i.categories) for i in from_lines] == key
    lines = f["prev.en"].read_text(encoding="utf-8").splitlines()
    f["prev.en"].write_text("".join(x + "\n" for x in lines[1:] + lines[:1]), encoding="utf-8")
    with pytest.raises(DataError, match=r"anaphora.prev.en:4: .*block 2 pair 2.* not aligned"):
        list(read_suite(str(f["json"]), "bawden", *files))


# ------------------------------------------------------------------------------ rules
def test_strict_counts_a_tie_wrong_first_best_counts_it_right_when_the_correct_one_is_first():
    """Voita et al.: np.argmin(loss) == true_ind, np.argmin returning the first minimum."""
    assert not item_right([-1.0, -1.0, -3.0], 0, "strict")
    assert item_right([-1.0, -1.0, -3.0], 0, "first_best")
    assert not item_right([-1.0, -0.5], 0, "first_best")
    # correct listed second (true_ind 1): a tie with the candidate before it is wrong, after it right
    assert not item_right([-1.0, -1.0, -3.0], 1, "first_best")
    assert item_right([-1.0, -3.0, -1.0], 1, "first_best")
    assert item_right([-1.0, -2.0, -3.0], 1, "strict")


def test_accuracy_reports_every_rule_and_counts_duplicates():
    """A duplicate candidate ties: right under first_best only; both figures are reported."""
    plain = ContrastiveItem("a", "s", "good", ["bad"])
    dup = ContrastiveItem("b", "s", "good", ["bad", "good"])
    acc = Accuracy(rule="first_best")
    acc.add(plain, [-1.0, -2.0])
    acc.add(dup, [-1.0, -2.0, -1.0])
    s = acc.summary()
    assert (s["accuracy"], s["rule"], s["duplicates"]) == (100.0, "first_best", 1)
    assert s["rules"]["strict"] == {"accuracy": 50.0, "correct": 1, "total": 2}
    assert "block" not in s["rules"]


def test_bawden_headline_is_per_pair_the_block_figure_beside_it(tmp_path):
    """Their evaluate.py: 'Overall precision' counts each pair; blocks all right are its second figure."""
    items = list(read_suite(str(write_bawden(tmp_path, "anaphora", ANAPHORA)["json"])))
    scores = [[-1.0, -2.0], [-1.0, -1.0], [-1.0, -2.0], [-1.0, -3.0]]  # block 2: a tie in pair 2
    summaries = {}
    for rule in ("strict", "block"):
        acc = Accuracy(rule=rule)
        for item, sc in zip(items, scores):
            acc.add(item, sc)
        summaries[rule] = acc.summary()
    per_pair, per_block = summaries["strict"], summaries["block"]
    assert (per_pair["correct"], per_pair["total"]) == (3, 4)
    assert per_pair["rules"]["block"] == {"accuracy": 50.0, "correct": 1, "total": 2}
    assert (per_block["correct"], per_block["total"], per_block["accuracy"]) == (1, 2, 50.0)
    assert per_pair["categories"]["type"]["m.pl"] == {"accuracy": 0.0, "correct": 0, "total": 1}
    assert per_block["categories"] == {"variant": {"correct": {"accuracy": 100.0, "correct": 1, "total": 1}}}


# ------------------------------------------------------------------------------ scoring
@pytest.fixture(scope="module")
def doc_run(toy_dir, tmp_path_factory) -> Path:
    """A tiny G-Transformer trained a few steps: a model that reads target context (scores need not be good)."""
    from onmt_doc.config import config_from_dict
    from onmt_doc.train.trainer import train

    layers = {"type": "g_transformer", "layers": 1, "heads": 4, "ff": 64, "global_layers": 1}
    run = tmp_path_factory.mktemp("g_published")
    cfg = tiny_config(
        toy_dir,
        run,
        data={"max_tokens": 96},
        model={"d_model": 32, "encoder": layers, "decoder": {**layers, "global_cross_layers": 1}},
        train={"max_steps": 8, "batch_tokens": 512, "valid_every": 8, "save_every": 8},
    )
    train(config_from_dict(cfg))
    return run


def _translator(run: Path) -> Translator:
    model, cfg, codec = load_model(str(run / "checkpoints" / "last.pt"))
    return Translator(model, codec, cfg)


def test_each_candidate_is_scored_with_its_own_context(doc_run, tmp_path):
    """A deixis-style group: each candidate's score is -score's score of the document made of the
    source context with that candidate's own context translation; the duplicate ties exactly."""
    tr = _translator(doc_run)
    f = write_voita(tmp_path)
    items = list(read_suite(str(f["json"])))
    got = [s for _, scores in score_suite(tr, items) for s in scores]
    docs = []
    for g in VOITA_GROUPS:
        src = g["src"].split(" _eos ")
        order = [g["true_ind"]] + [j for j in range(len(g["dst"])) if j != g["true_ind"]]
        docs += [list(zip(src, g["dst"][j].split(" _eos "))) for j in order]
    exact = [float(d[-1]) for d in tr.score_items(docs, exact=True)]
    assert len(got) == len(exact) == 8
    assert max(abs(a - b) for a, b in zip(got, exact)) <= 1e-5
    assert got[0] != got[1]  # the same last sentence, another context translation: another score
    assert got[3] == got[5]  # the duplicate candidate: scored once
    tr.cfg.data.max_tokens = MAX_TOKENS_FOR_PART  # room for part of the context: every candidate gets as much
    contexts = ContextWindow(tr).contexts(items[0])
    assert len({len(c) for c in contexts}) == 1 and 0 < len(contexts[0]) < 3
    item, keep = items[0], len(contexts[0])
    for ctx, cand in zip(contexts, item.candidates()):
        encoded, _ = tr._encode([[*ctx, (item.src, cand)]], with_target=True)
        assert len(tr._instances(encoded)) == 1
    longer = [list(zip(item.ctx_src, t))[-keep - 1 :] for t in item.target_contexts()]
    encoded, _ = tr._encode([[*c, (item.src, cand)] for c, cand in zip(longer, item.candidates())], with_target=True)
    assert len(tr._instances(encoded)) > len(longer)  # one more sentence would not fit some candidate


def test_ablations_keep_the_rule_data(tmp_path):
    """remove drops every candidate's context; shuffle gives all candidates the donor's; the correct
    candidate's index and the block survive both."""
    items = list(read_suite(str(write_voita(tmp_path)["json"])))
    removed = list(ablate(items, "remove"))
    assert all(i.candidate_ctx_tgt is None and not i.ctx_src for i in removed)
    assert [i.correct_index for i in removed] == [0, 0, 1]
    shuffled = list(ablate(items, "shuffle", seed=3))
    assert all(i.candidate_ctx_tgt is None and i.ctx_src for i in shuffled)
    assert [i.correct_index for i in shuffled] == [0, 0, 1]


# ------------------------------------------------------------------------------ the command line
def _evaluate(run: Path, suite: Path, out: Path, *flags: str) -> dict:
    argv = ["-model", str(run / "checkpoints" / "last.pt"), "-suite", str(suite), "-json", str(out)]
    assert evaluate_main([*argv, *flags, "-threads", "1"]) == 0
    return json.loads(out.read_text(encoding="utf-8"))["contrastive"]


def test_cli_contrapro_as_published(trained_run, tmp_path):
    """The README's files as they are: contrapro.json with the per-candidate context files of
    json2text_and_context.pl (the old reader exited 1 after scoring every item)."""
    f = write_contrapro(tmp_path, context=2)
    res = _evaluate(
        trained_run, f["json"], tmp_path / "r.json", "-format", "contrapro", "-context_src", str(f["context.en"]),
        "-context_tgt", str(f["context.de"]), "-ablation", "none", "remove",
    )  # fmt: skip
    assert res["none"]["total"] == 3 and res["none"]["rule"] == "strict" and res["none"]["format"] == "contrapro"
    assert set(res["none"]["categories"]) == {"src:ref pronoun", "ante distance", "intrasegmental"}
    assert res["none"]["accuracy"] == res["remove"]["accuracy"]  # a sentence model


def test_cli_voita_default_rule_first_best_with_strict_beside_it_and_a_duplicate_warning(trained_run, tmp_path, capsys):
    """A sentence model ties the deixis-style group (same last sentences) and the duplicate: Voita et
    al.'s rule counts both right, strict wrong; both figures are in the results, and the duplicate
    group is warned about on stderr."""
    f = write_voita(tmp_path)
    res = _evaluate(trained_run, f["json"], tmp_path / "r.json")["none"]
    err = capsys.readouterr().err
    assert res["rule"] == "first_best" and res["duplicates"] == 1
    first, strict = res["rules"]["first_best"], res["rules"]["strict"]
    assert res["accuracy"] == first["accuracy"] and (first["correct"], strict["correct"]) == (3, 1)
    assert "1 of 3 items hold a contrastive candidate identical to the correct one" in err
    res = _evaluate(trained_run, f["json"], tmp_path / "s.json", "-rule", "strict")["none"]
    assert res["rule"] == "strict" and res["accuracy"] == strict["accuracy"]
    out = capsys.readouterr().out
    assert "rule" in out and "first_best" in out  # the other rule's row: it differs


def test_cli_bawden_per_pair_with_blocks_beside(trained_run, tmp_path):
    f = write_bawden(tmp_path, "anaphora", ANAPHORA)
    res = _evaluate(trained_run, f["json"], tmp_path / "r.json")["none"]
    assert (res["rule"], res["total"], res["rules"]["block"]["total"]) == ("strict", 4, 2)
    res = _evaluate(trained_run, f["json"], tmp_path / "b.json", "-rule", "block")["none"]
    assert (res["rule"], res["total"]) == ("block", 2)


def test_cli_mistakes_are_one_line_before_the_model_loads(trained_run, tmp_path):
    """A wrong rule, and context files that do not fit the suite: exit 1, one line, nothing scored."""
    f = write_contrapro(tmp_path)
    v = write_voita(tmp_path)
    (tmp_path / "c.en").write_text("x\n" * 4, encoding="utf-8")
    (tmp_path / "c.de").write_text("x\n" * 4, encoding="utf-8")
    ckpt = str(trained_run / "checkpoints" / "last.pt")
    cases = [
        (["-suite", str(v["json"]), "-rule", "block"], "-rule block needs"),
        (["-suite", str(f["json"]), "-format", "contrapro", "-context_src", str(tmp_path / "c.en"), "-context_tgt",
          str(tmp_path / "c.de")], "c.en: 4 lines"),
        (["-suite", str(f["json"]), "-context_src", str(f["context.en"]), "-context_tgt", str(f["context.de"])],
         "-format contrapro"),
        (["-suite", str(v["json"]), "-text_src", str(v["src"])], "go together"),
    ]  # fmt: skip
    for flags, message in cases:
        proc = run_cli(*EVALUATE, "-model", ckpt, *flags, "-threads", "1")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
        assert "scored" not in proc.stderr


def test_warning_goes_through_the_onmt_doc_logger(trained_run, tmp_path, warnings_of_onmt_doc):
    """evaluate_suite (the API) warns about duplicate candidates on the project's logger."""
    items = read_suite(str(write_voita(tmp_path)["json"]))
    res = evaluate_suite(_translator(trained_run), items, rule="first_best")
    assert res["duplicates"] == 1
    assert any(
        r.levelno == logging.WARNING and "identical to the correct one" in r.message
        for r in warnings_of_onmt_doc.records
    )
