#!/usr/bin/env python
"""``python tools/import_marian.py …`` runs ``onmt_doc_import_marian …``;
the code is in ``onmt_doc/bin/import_marian.py`` and ``onmt_doc/convert/marian.py``.
"""

from onmt_doc.bin.import_marian import main

if __name__ == "__main__":
    raise SystemExit(main())
