"""SIGTERM / SIGINT during training: finish the step, save once, exit; a second signal exits at once.

A handler must not save by itself (it may run in the middle of a step or of a checkpoint write),
so it only records the signal; the training loop looks at the record between steps.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Optional

log = logging.getLogger("onmt_doc")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """Training stopped by a signal; ``exit_status`` is the shell's 128 + signal number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.exit_status = 128 + signum


class StopRequest:
    """Context manager: while active, SIGTERM/SIGINT set ``signum`` instead of killing the process."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # signal() works there only
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:  # the second signal: stop now, without saving
            self._restore()
            raise Interrupted(signum)
        self.signum = signum
        log.warning(
            "%s received: stopping after the current step with a checkpoint (send it again to "
            "stop at once, without saving)",
            signal.Signals(signum).name,
        )
