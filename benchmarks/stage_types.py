"""Every stage type a spec can name: importing this module fills ``STAGES`` (the stage modules and the
peers register themselves). It sits above ``stages/`` and ``peers/``, which import each other's
helpers but never this, so no import runs in a circle."""

from benchmarks import peers  # noqa: F401  (registration: peer_opennmt)
from benchmarks.peers import export, gpu_decoding  # noqa: F401  (registration: ctranslate2, decode_vs_ctranslate2)
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
