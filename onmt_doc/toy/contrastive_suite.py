"""A contrastive suite for the toy corpus's test documents (onmt_doc.toy.corpus).

Each context-dependent pronoun of the test split is one item: the correct target sentence and, as
contrastive candidates, the same sentence with the pronoun of each other gender in the same slot
(``er``→``sie``/``es``, ``ihn``→``sie``/``es``…). The context is every preceding sentence of the
document (reference translations on the target side). Categories: ``ante distance`` (always 1 in
the toy corpus, whose rule refers to the previous sentence: kept so the suite has ContraPro's
shape), ``ref pronoun`` and ``context sentences`` (how many preceding sentences there are).
Written in both formats: ``test.contrastive.json`` and ``test.contrastive.tsv``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from onmt_doc.evaluation.suite_files import CONTEXT_SEP
from onmt_doc.outputs import output_file, write_text
from onmt_doc.toy.corpus import PRONOUN_FORMS, ToySentence, generate_documents

TSV_HEADER = [
    "ante distance",
    "ref pronoun",
    "context sentences",
    "context_src",
    "context_tgt",
    "source",
    "correct",
    "contrastive",
]


def toy_items(docs: list[list[ToySentence]], split: str = "test") -> Iterator[dict]:
    """ContraPro-style objects, one per context-dependent pronoun, in document order."""
    for d, doc in enumerate(docs):
        for i, sent in enumerate(doc):
            for index, form in sent.context_words:
                slot = "nom" if index == 0 else "acc"
                gender = doc[i - 1].subject.gender  # the toy rule: previous sentence's subject
                wrong = []
                for g, other in PRONOUN_FORMS[slot].items():
                    if g != gender:
                        tgt = list(sent.tgt)
                        tgt[index] = other
                        wrong.append({"contrastive": " ".join(tgt), "replacement": other})
                yield {
                    "document id": f"{split}-{d}",
                    "segment id": i + 1,
                    "ante distance": 1,
                    "ref pronoun": form,
                    "src pronoun": "it",
                    "category": {"context sentences": str(i)},
                    "src segment": " ".join(sent.src),
                    "ref segment": " ".join(sent.tgt),
                    "errors": wrong,
                    "context_src": [" ".join(s.src) for s in doc[:i]],
                    "context_tgt": [" ".join(s.tgt) for s in doc[:i]],
                }


def write_toy_suite(out_dir: str | Path, seed: int = 1, test_docs: int = 145) -> int:
    """Write the suite of the test split ``write_corpus(out_dir, seed, test_docs=…)`` writes;
    returns the number of items."""
    out = Path(out_dir)
    items = list(toy_items(generate_documents(test_docs, seed=seed, split="test")))
    json_text = "[\n" + ",\n".join(json.dumps(item, ensure_ascii=False) for item in items) + "\n]\n"
    write_text(out / "test.contrastive.json", json_text, flag="")
    with output_file(out / "test.contrastive.tsv", flag="") as f:
        f.write("#" + "\t".join(TSV_HEADER) + "\n")
        for it in items:
            row = [
                str(it["ante distance"]),
                it["ref pronoun"],
                it["category"]["context sentences"],
                CONTEXT_SEP.join(it["context_src"]),
                CONTEXT_SEP.join(it["context_tgt"]),
                it["src segment"],
                it["ref segment"],
                *(e["contrastive"] for e in it["errors"]),
            ]
            f.write("\t".join(row) + "\n")
    return len(items)
