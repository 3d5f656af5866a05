#!/usr/bin/env python
"""``python tools/average_checkpoints.py …`` runs ``onmt_doc_average_checkpoints …``;
the code is in ``onmt_doc/bin/average_checkpoints.py``.

Kept so the commands of older docs work; needs the package installed (``pip install -e .``).
"""

from onmt_doc.bin.average_checkpoints import main

if __name__ == "__main__":
    raise SystemExit(main())
