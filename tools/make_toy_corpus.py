#!/usr/bin/env python
"""``python tools/make_toy_corpus.py …`` runs ``onmt_doc_make_toy_corpus …``;
the code is in ``onmt_doc/bin/make_toy_corpus.py``.

Kept so the commands of older docs work; needs the package installed (``pip install -e .``).
"""

from onmt_doc.bin.make_toy_corpus import main

if __name__ == "__main__":
    raise SystemExit(main())
