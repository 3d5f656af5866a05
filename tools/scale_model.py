#!/usr/bin/env python
"""``python tools/scale_model.py …`` runs ``onmt_doc_scale_model …``;
the code is in ``onmt_doc/bin/scale_model.py``.

Kept so the commands of older docs work; needs the package installed (``pip install -e .``).
"""

from onmt_doc.bin.scale_model import main

if __name__ == "__main__":
    raise SystemExit(main())
