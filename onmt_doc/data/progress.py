"""A progress line for long data passes (checking alignment, counting tokens, binarizing).

``what: N of T lines (R lines/s, ETA S s)`` on the log every :data:`PROGRESS_SECONDS`, and a last
line with the total time; a pass shorter than that logs nothing.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("onmt_doc")

PROGRESS_SECONDS = 10.0


class Progress:
    """``what: N lines (R lines/s, ETA …)`` on the log every PROGRESS_SECONDS of a long pass."""

    def __init__(self, what: str, total: int = 0) -> None:
        self.what, self.total, self.n = what, total, 0
        self.start = self.last = time.time()

    def advance(self, n: int) -> None:
        """Count ``n`` more lines; log if it is time."""
        self.n += n
        now = time.time()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            rate = self.n / max(now - self.start, 1e-9)
            eta = f", ETA {(self.total - self.n) / rate:.0f} s" if self.total > self.n else ""
            of = f" of {self.total:,}" if self.total else ""
            log.info("%s: %s%s lines (%s lines/s%s)", self.what, f"{self.n:,}", of, f"{rate:,.0f}", eta)

    def done(self) -> None:
        """A last line for a pass that logged along the way."""
        if self.last > self.start:
            log.info("%s: %s lines in %.0f s", self.what, f"{self.n:,}", time.time() - self.start)
