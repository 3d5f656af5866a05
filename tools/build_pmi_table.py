#!/usr/bin/env python
"""``python tools/build_pmi_table.py …`` runs ``onmt_doc_build_pmi_table …``;
the code is in ``onmt_doc/bin/build_pmi_table.py``.

Kept so the commands of older docs work; needs the package installed (``pip install -e .``).
"""

from onmt_doc.bin.build_pmi_table import main

if __name__ == "__main__":
    raise SystemExit(main())
