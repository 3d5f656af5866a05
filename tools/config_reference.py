#!/usr/bin/env python
"""Regenerate the key tables of docs/config.md from the config dataclasses' help metadata.

python tools/config_reference.py           # rewrite docs/config.md's generated tables
python tools/config_reference.py --check   # exit 1 when they are out of date
"""

from __future__ import annotations

import sys

from onmt_doc.config_reference import main

if __name__ == "__main__":
    sys.exit(main())
