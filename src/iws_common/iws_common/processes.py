"""Starting nodes in their own processes, on a chosen ROS domain, with their output in a log.

Used by `iws demo`, the benchmarks and the tests: every multi-process tool starts nodes the same way.
"""
from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import tempfile
from pathlib import Path


# A tool's own nodes run on one of these: away from the default 0 and the tests' 10..89, and below
# 102, above which Fast DDS ports can fall into Linux's ephemeral range.
PRIVATE_DOMAINS = range(90, 102)
LEASE_DIR = Path(tempfile.gettempdir()) / "iws-ros-domains"


class DomainLease:
    """A private ROS domain that no other iws tool on this machine holds while this lease is open.

    Two evaluations side by side on one machine once drew the same random domain, and one's client
    was answered by the other's world model. The lease is an exclusive ``flock`` on a file per
    domain, so the kernel releases it when the process ends, however it ends; node processes do not
    inherit it (``Popen`` closes the descriptor)."""

    def __init__(self):
        LEASE_DIR.mkdir(parents=True, exist_ok=True)
        for domain in random.sample(list(PRIVATE_DOMAINS), len(PRIVATE_DOMAINS)):
            lock = open(LEASE_DIR / f"{domain}.lock", "w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                continue
            self.domain_id, self._lock = domain, lock
            return
        raise RuntimeError(f"every private ROS domain ({PRIVATE_DOMAINS.start}..{PRIVATE_DOMAINS.stop - 1}) is held by "
                           f"another iws tool on this machine (locks in {LEASE_DIR}); wait for one to finish")

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> "DomainLease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


_process_leases: list[DomainLease] = []


def private_domain_id() -> int:
    """A private domain held until this process ends (tools that start their nodes once; a tool that
    starts them again and again takes a ``DomainLease`` and releases it)."""
    lease = DomainLease()
    _process_leases.append(lease)
    return lease.domain_id


def ros_env(domain_id: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               FASTDDS_BUILTIN_TRANSPORTS="LARGE_DATA", MUJOCO_GL=env.get("MUJOCO_GL", "egl"),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


class NodeProcess:
    """A node started in its own process; its output goes to a log file shown on failure."""

    def __init__(self, args: list[str], domain_id: int, log_path: Path, **env: str):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.expected_exit: tuple[int, ...] = ()
        self.proc = subprocess.Popen(args, env=ros_env(domain_id, **env), stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        """The process's output so far; also after stop() (a failed stop is reported with it)."""
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request_stop(self, sig=signal.SIGINT) -> None:
        """Signal the process without waiting, so that several nodes can shut down in parallel."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGINT, timeout: float = 10.0) -> int:
        """Signal, wait up to ``timeout``, then kill the process group; returns the exit code."""
        self.request_stop(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.log.close()
        return self.proc.returncode


def stop_all(processes: list[NodeProcess], timeout: float = 10.0) -> list[int]:
    """Stop several nodes at once, in the given order of signalling; their exit codes."""
    for process in processes:
        process.request_stop()
    return [process.stop(timeout=timeout) for process in processes]
