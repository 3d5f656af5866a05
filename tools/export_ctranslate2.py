#!/usr/bin/env python
"""``python tools/export_ctranslate2.py …`` runs ``onmt_doc_release …``;
the code is in ``onmt_doc/bin/release.py`` and ``onmt_doc/export/ctranslate2.py``.

Needs the package installed (``pip install -e '.[export]'``).
"""

from onmt_doc.bin.release import main

if __name__ == "__main__":
    raise SystemExit(main())
