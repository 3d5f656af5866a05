#!/usr/bin/env python
"""``python tools/gate_analysis.py …`` runs ``onmt_doc_gate_analysis …``;
the code is in ``onmt_doc/bin/gate_analysis.py``.

Kept so the commands of older docs work; needs the package installed (``pip install -e .``).
"""

from onmt_doc.bin.gate_analysis import main

if __name__ == "__main__":
    raise SystemExit(main())
