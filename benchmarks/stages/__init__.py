"""The stage types a spec can name; importing this package fills ``STAGES``."""

from benchmarks import peers  # noqa: F401  (benchmarks/peers registers its stages)
from benchmarks.stages import (  # noqa: F401  (registration)
    amp,
    data_scale,
    documents,
    environment,
    micro,
    operations,
    pytest_run,
    quality,
    speed,
    step_ops,
    train_speed,
)
from benchmarks.suite.stage import STAGES

__all__ = ["STAGES"]
