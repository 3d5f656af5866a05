"""Converting checkpoints of other toolkits into onmt_doc checkpoints (OpenNMT-py 3.x, Marian /
OPUS-MT), and what every importer checks of the weights it reads."""

from __future__ import annotations

from typing import Mapping

import torch

from onmt_doc.errors import UserError


def check_finite(tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """Refuse weights holding NaN or an infinity (a damaged file, or a diverged training): imported
    as they are, every translation would be garbage or the first fine-tuning step NaN."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise UserError(f"{source}: tensor {name} holds {bad} NaN or infinite values; not importable (a damaged "
                            f"or diverged model)")  # fmt: skip
