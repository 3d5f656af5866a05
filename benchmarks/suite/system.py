"""The systems a benchmark trains, and where the repository is: what the stages read of a spec.

Its own module below ``spec.py``, which reads the stage types (``stage_types.py``) to check each
stage's parameters: the stages import this, never the spec, so no import runs in a circle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class System:
    """A model as a user would train it: a config example and the overrides of this benchmark."""

    config: str  # path relative to the repository, e.g. config_examples/g_transformer.yaml
    overrides: dict = field(default_factory=dict)  # nested keys merged onto the config
    init_from: Optional[str] = None  # another system of the spec whose checkpoint starts this one
    documents: bool = False  # trained and tested on documents (False: sentence pairs)
    smoke: dict = field(default_factory=dict)  # overrides merged last under --smoke (toy shapes, few steps)
    name: str = ""
