"""Stand-in data for ``--smoke``: the layout of ``../shared/data`` (docmt-en-de, multi30k-en-de,
news-sent-en-de, iwslt14-ted-de-en), filled with the project's own toy corpus, so every spec runs
end to end in CI without the real data sets (tests use data the project generates). A rehearsal on
the real files names them: ``--smoke --data ../shared/data``."""

from __future__ import annotations

import os

DOC_SETS = [f"docmt-en-de/{d}.{s}" for d in ("ted", "news", "europarl") for s in ("dev", "test")]
SENTENCE_SETS = [f"multi30k-en-de/{n}" for n in ("train", "valid", "test2016")] + ["news-sent-en-de/newstest2008-2013"]
SENTENCE_SETS += [f"iwslt14-ted-de-en/{n}" for n in ("dev2010", "tst2010", "tst2011", "tst2012")]


def make_smoke_data(folder: str, docs_per_file: int = 12) -> str:
    """Write (once) every file of the shared layout under ``folder`` from toy documents: document
    sets with blank lines between documents, sentence sets without; returns ``folder``."""
    from onmt_doc.toy.corpus import generate_documents

    if os.path.exists(os.path.join(folder, ".complete")):
        return folder
    for i, name in enumerate(DOC_SETS + SENTENCE_SETS):
        docs = generate_documents(docs_per_file, seed=100 + i, split="train")
        sides = {"en": [[" ".join(s.src) for s in d] for d in docs], "de": [[" ".join(s.tgt) for s in d] for d in docs]}
        if name.startswith("iwslt14"):  # de→en: the source side is German
            sides = {"de": sides["en"], "en": sides["de"]}
        for lang, side in sides.items():
            path = os.path.join(folder, f"{name}.{lang}")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            glue = "\n\n" if name in DOC_SETS else "\n"
            with open(path, "w", encoding="utf-8") as f:
                f.write(glue.join("\n".join(d) for d in side) + "\n")
    open(os.path.join(folder, ".complete"), "w").close()
    return folder
