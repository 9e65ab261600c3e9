"""Helpers for tests that drive a command-line tool in its own process (no ROS imported)."""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path


def wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"'{text}' not seen in {log.name} within {timeout} s:\n{log.read_text()[-3000:]}")


def sigterm_once_running(command: list[str], log: Path, progress: str, ignore_sigint: bool = False) -> int:
    """Start ``command`` (stderr to ``log``), wait for ``progress`` in its log and 2 s more, send
    SIGTERM and return the exit status. ``ignore_sigint`` starts it as a shell starts ``cmd &``."""
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=preexec)
        try:
            wait_for_line(log, progress, process, 120)
            time.sleep(2.0)  # some steps
            process.send_signal(signal.SIGTERM)
            return process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
