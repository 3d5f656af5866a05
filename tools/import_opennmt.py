#!/usr/bin/env python
"""``python tools/import_opennmt.py …`` runs ``onmt_doc_import_opennmt …``;
the code is in ``onmt_doc/bin/import_opennmt.py`` and ``onmt_doc/convert/opennmt.py``.
"""

from onmt_doc.bin.import_opennmt import main

if __name__ == "__main__":
    raise SystemExit(main())
