"""SIGTERM / SIGINT during training: finish the step, save once, exit; a second signal exits at once.

A handler must not save by itself (it may run in the middle of a step or of a checkpoint write),
so it only records the signal; the training loop looks at the record between steps.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Optional

log = logging.getLogger("onmt_doc")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """Training stopped by a signal; ``exit_status`` is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        """``signum``: the signal that stopped training; the message is its name (``SIGTERM``)."""
        super().__init__(signal.Signals(signum).name)
        self.exit_status = 128 + signum


class StopRequest:
    """Context manager: while active, SIGTERM/SIGINT set ``signum`` instead of killing the process."""

    def __init__(self) -> None:
        """No handlers are installed until the ``with`` block is entered."""
        self.signum: Optional[int] = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        """Whether a first signal arrived: the loop saves and stops after the current step."""
        return self.signum is not None

    def __enter__(self) -> "StopRequest":
        """Install the handlers (main thread only: ``signal.signal`` works nowhere else)."""
        if threading.current_thread() is threading.main_thread():  # signal() works there only
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the previous handlers; exceptions propagate."""
        self._restore()

    def _restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.signum is not None:  # the second signal: stop now, without saving
            self._restore()
            raise Interrupted(signum)
        self.signum = signum
        log.warning(
            "%s received: stopping after the current step with a checkpoint (send it again to "
            "stop at once, without saving)",
            signal.Signals(signum).name,
        )
