"""Stopping a long job between two of its steps, on SIGTERM or Ctrl-C.

`kill` (SIGTERM), a job scheduler or systemd, and Ctrl-C all mean "stop and keep my work". A
trainer that dies wherever the signal finds it loses everything since its last periodic
checkpoint; with these helpers it finishes the step it is in, saves that step and exits with
128 + the signal number, so that ``--resume`` loses nothing.
"""
from __future__ import annotations

import signal
import threading


class StopRequested(Exception):
    """A stop signal arrived and the job saved its work up to ``step``."""

    def __init__(self, signum: int, step: int, where: str = ""):
        super().__init__(f"{where}step {step}")
        self.signum, self.step, self.where = signum, step, where

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class StopSignals:
    """While active (``with StopSignals() as stop:``), the first SIGTERM or SIGINT only sets
    ``stop.signum``: the job's loop checks it after each step. A second SIGINT raises
    KeyboardInterrupt as usual. Installed also where the shell started the job with SIGINT ignored
    (``cmd &``), so ``kill -INT`` stops it too. Outside the main thread it does nothing (signal
    handlers live there only) and ``signum`` stays None."""

    WATCHED = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._on_signal) for s in self.WATCHED}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}

    def _on_signal(self, signum, _frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
