"""Per-kind log throttling: a flood of one kind of bad input logs one line per period, and a
different kind of problem is still reported at once (rclpy's throttle is per call site)."""
from __future__ import annotations

import time


class KindThrottle:
    def __init__(self, period_s: float = 1.0, clock=time.monotonic):
        self.period_s = period_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def should_log(self, kind: str) -> tuple[bool, int]:
        """(log now?, how many of this kind were suppressed since the last line)."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.period_s:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False, 0
        self._last[kind] = now
        return True, self._suppressed.pop(kind, 0)
