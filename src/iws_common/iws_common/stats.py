"""Rolling step latency and achieved rate, reported by every backend in WorldStatus."""
from __future__ import annotations

import time
from collections import deque

import numpy as np


class StepTimer:
    def __init__(self, window: int = 100):
        self.latencies: deque[float] = deque(maxlen=window)
        self.stamps: deque[float] = deque(maxlen=window)

    def record(self, started: float) -> None:
        """Record a step that began at ``started`` (time.perf_counter()) and ends now."""
        now = time.perf_counter()
        self.latencies.append(now - started)
        self.stamps.append(now)

    def rate_hz(self) -> float:
        """Steps per second over the window; 0 once no step has come for 2 s."""
        if len(self.stamps) < 2 or time.perf_counter() - self.stamps[-1] > 2.0:
            return 0.0
        return (len(self.stamps) - 1) / (self.stamps[-1] - self.stamps[0])

    def latency_ms(self, percentile: float) -> float:
        return float(np.percentile(self.latencies, percentile) * 1e3) if self.latencies else 0.0
