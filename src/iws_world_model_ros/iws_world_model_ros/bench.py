"""`iws bench node` and `iws bench soak`: the world model node as a robot, under a live policy loop.

    iws bench node --json                       # 30 s at 15 Hz on the shipped models/push_t
    iws bench soak --minutes 10 --json          # the same loop for 10 minutes, with the node's memory

The world model node runs in its own process in real time on a private domain (what `iws up
world_model` starts, with ``rate_hz`` = --rate). This process acts as a policy: it subscribes to the
camera image best effort with depth 1 (a live policy wants only the newest frame) and answers each
image at once with a position command, a small smooth sinusoid around the profile's home (always
valid). The **command-to-image latency** of a command is the arrival of the next image minus the
send time of that command: the closed policy loop a real deployment runs. At a rate the node keeps
it is about one tick period; more means dropped ticks or a slow transport.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from iws_common.profile import default_model_dir
from iws_common.stats import StepTimer


class BenchError(RuntimeError):
    """The node did not come up or died: the message holds the end of its log."""


def resolve_model(model: str | None) -> Path:
    """The checkpoint to serve: --model, else the shipped models/push_t, with a clear error if absent."""
    path = Path(model) if model else default_model_dir()
    if not (path / "config.json").is_file():
        what = "the shipped model" if model is None else "--model"
        raise BenchError(f"no world model checkpoint at {path} ({what}); pass --model DIR, a checkpoint "
                         f"directory written by `iws train` (model.safetensors + config.json)")
    return path


def rss_mb(pid: int) -> float:
    """Resident memory of a process from /proc/PID/status (VmRSS), in MiB; nan once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return float("nan")


class PolicyLoop:
    """The world model node in a subprocess, and a policy in this process answering every image.

    Latency samples go into a ``StepTimer`` (record(send time) at the next image's arrival), so its
    stamps are image arrivals and its latencies are command-to-image latencies; the measuring code
    swaps in fresh timers to cut windows (warm-up, minutes) without racing the callback.
    """

    AMPLITUDE_RAD = 0.05
    PERIOD_S = 5.0

    def __init__(self, model: Path, rate_hz: float, threads: int = 1, robot: str = "reference_arm",
                 log_dir: Path | None = None):
        from sensor_msgs.msg import Image
        from std_msgs.msg import Float64MultiArray

        from iws_bringup.backends import get_backend, node_parameters, ros_arguments
        from iws_common import qos
        from iws_common.client import RosClient
        from iws_common.processes import NodeProcess, private_domain_id
        from iws_common.profile import load_profile
        from iws_interfaces.msg import WorldStatus

        self.profile = load_profile(robot)
        self._msg_type = Float64MultiArray
        backend = get_backend("world_model")
        params = node_parameters(backend, robot, {"model": str(model), "mode": "realtime",
                                                  "rate_hz": float(rate_hz), "threads": int(threads)})
        domain = private_domain_id()
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="iws_bench_node_"))
        self.node = NodeProcess([sys.executable, "-m", backend.entry_point.split(":")[0]] + ros_arguments(params),
                                domain, log_dir / "world_model.log")
        # The node sends large frames over LARGE_DATA (iws_common.processes); the policy must match.
        os.environ.setdefault("FASTDDS_BUILTIN_TRANSPORTS", "LARGE_DATA")
        self.client = RosClient(domain, name="iws_bench_policy")
        self._lock = threading.Lock()
        self._timers: list[StepTimer] = []
        self._sent: float | None = None
        self._t0: float | None = None
        self.images = 0
        self.status: list[tuple[float, WorldStatus]] = []  # (arrival, message)
        topics = self.profile.topics
        self._command = self.client.publisher(Float64MultiArray, topics.position_command)
        self.client.node.create_subscription(WorldStatus, topics.world_status,
                                             lambda m: self.status.append((time.perf_counter(), m)), qos.STATE)
        self.client.node.create_subscription(Image, topics.image, self._on_image, qos.IMAGE_SUBSCRIBER)
        joints = self.profile.joints
        self._home, self._lower, self._upper = (np.asarray(v, dtype=np.float64)
                                                for v in (joints.home, joints.lower, joints.upper))
        self._phase = np.linspace(0.0, math.pi, joints.count)

    def _on_image(self, _msg) -> None:
        """The policy: an image arrives, the next command leaves at once."""
        now = time.perf_counter()
        with self._lock:
            self.images += 1
            if self._sent is not None:
                for timer in self._timers:
                    timer.record(self._sent)
            if self._t0 is None:
                self._t0 = now
            t = now - self._t0
            target = self._home + self.AMPLITUDE_RAD * np.sin(2 * math.pi * t / self.PERIOD_S + self._phase)
            self._command.publish(self._msg_type(data=np.clip(target, self._lower, self._upper).tolist()))
            self._sent = time.perf_counter()

    def start_window(self, *timers: StepTimer) -> None:
        """From now on, record latency samples into these timers only."""
        with self._lock:
            self._timers = list(timers)

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Until the first image arrives (the node loads torch and the model first)."""
        deadline = time.monotonic() + timeout
        while self.images == 0:
            if not self.node.alive():
                raise BenchError(f"world model node exited with {self.node.proc.returncode}:\n{self.node.output()[-2000:]}")
            if time.monotonic() > deadline:
                raise BenchError(f"no image from the world model node within {timeout:.0f} s:\n{self.node.output()[-2000:]}")
            time.sleep(0.05)

    def run_for(self, seconds: float) -> bool:
        """Let the loop run; False as soon as the node process has died."""
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            if not self.node.alive():
                return False
            time.sleep(min(0.2, max(0.0, deadline - time.perf_counter())))
        return self.node.alive()

    def node_stats(self, t0: float, t1: float) -> dict:
        """What the node reported in [t0, t1]: its tick rate and dropped ticks from the step count
        between the first and last WorldStatus, step time as the median of their rolling p50/p95."""
        window = [(t, m) for t, m in list(self.status) if t0 <= t <= t1]
        if not window:
            return {}
        (ta, a), (tb, b) = window[0], window[-1]
        target = float(b.target_rate_hz)
        out = {"target_rate_hz": target,
               "step_ms_p50": float(np.median([m.step_latency_ms_p50 for _, m in window])),
               "step_ms_p95": float(np.median([m.step_latency_ms_p95 for _, m in window]))}
        if tb - ta >= 1.0:
            steps = int(b.step_count - a.step_count)
            out["node_achieved_rate_hz"] = steps / (tb - ta)
            out["dropped_ticks"] = max(0, round(target * (tb - ta)) - steps)
        else:  # a window shorter than two status periods: the node's own rolling rate
            out["node_achieved_rate_hz"] = float(b.achieved_rate_hz)
        return out

    def error_lines(self) -> list[str]:
        return [line for line in self.node.output().splitlines() if "ERROR" in line or "Traceback" in line]

    def close(self) -> int:
        """Stop the client, then the node; the node's exit code (0 or -2 after SIGINT is clean)."""
        self.client.close()
        return self.node.stop()


def _latency(timer: StepTimer) -> dict:
    return {"latency_ms_p50": timer.latency_ms(50), "latency_ms_p95": timer.latency_ms(95)}


def _rate(timer: StepTimer) -> float:
    """Images per second at the policy over a window (arrivals, first to last)."""
    stamps = list(timer.stamps)
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) >= 2 else 0.0


def _rounded(result: dict) -> dict:
    def r(v):
        if isinstance(v, float):
            return round(v, 3) if math.isfinite(v) else None
        if isinstance(v, list):
            return [r(x) for x in v]
        if isinstance(v, dict):
            return {k: r(x) for k, x in v.items()}
        return v
    return r(result)


def bench_node(model: str | Path | None = None, rate_hz: float = 15.0, seconds: float = 30.0,
               threads: int = 2, warmup: float = 5.0, robot: str = "reference_arm") -> dict:
    """Achieved publish rate and command-to-image latency over ``seconds`` after ``warmup``."""
    path = resolve_model(None if model is None else str(model))
    loop = PolicyLoop(path, rate_hz, threads, robot)
    try:
        loop.wait_ready()
        if not loop.run_for(warmup):
            raise BenchError(f"world model node died during warm-up:\n{loop.node.output()[-2000:]}")
        timer = StepTimer(window=None)
        t0 = time.perf_counter()
        loop.start_window(timer)
        alive = loop.run_for(seconds)
        loop.start_window()
        t1 = time.perf_counter()
        if not alive:
            raise BenchError(f"world model node died during the measurement:\n{loop.node.output()[-2000:]}")
        result = {"model": str(path), "rate_hz": _rate(timer), "requested_rate_hz": float(rate_hz),
                  **_latency(timer), **loop.node_stats(t0, t1), "images": len(timer.stamps),
                  "seconds": t1 - t0, "warmup_s": warmup, "threads": threads,
                  "image_size": f"{loop.profile.camera.width}x{loop.profile.camera.height}"}
    finally:
        loop.close()
    return _rounded(result)


def bench_soak(model: str | Path | None = None, rate_hz: float = 15.0, minutes: float = 10.0,
               threads: int = 2, warmup: float = 5.0, sample_s: float = 5.0, robot: str = "reference_arm",
               progress=sys.stderr) -> dict:
    """The policy loop for ``minutes``: rate per minute, latency, the node's memory and errors."""
    path = resolve_model(None if model is None else str(model))
    loop = PolicyLoop(path, rate_hz, threads, robot)
    pid = loop.node.proc.pid  # the node's own process: the venv's bootstrapper re-execs in place
    per_minute, rss_per_minute, rss = [], [], []
    alive = True
    try:
        loop.wait_ready()
        if not loop.run_for(warmup):
            raise BenchError(f"world model node died during warm-up:\n{loop.node.output()[-2000:]}")
        total = StepTimer(window=None)
        t0 = time.perf_counter()
        rss.append((0.0, rss_mb(pid)))
        end = t0 + minutes * 60.0
        minute_index = 0
        while alive and time.perf_counter() < end - 1e-3:
            minute = StepTimer(window=None)
            loop.start_window(total, minute)
            minute_end = min(end, t0 + (minute_index + 1) * 60.0)
            while alive and time.perf_counter() < minute_end - 1e-3:
                alive = loop.run_for(min(sample_s, minute_end - time.perf_counter()))
                rss.append((time.perf_counter() - t0, rss_mb(pid)))
            loop.start_window(total)
            minute_index += 1
            per_minute.append(_rate(minute))
            rss_per_minute.append(rss[-1][1])
            if progress is not None:
                print(f"iws bench soak: minute {minute_index}/{math.ceil(minutes)}: {per_minute[-1]:.2f} Hz, "
                      f"latency p95 {minute.latency_ms(95):.1f} ms, node RSS {rss[-1][1]:.1f} MB"
                      + ("" if alive else ", node DIED"), file=progress, flush=True)
        loop.start_window()
        t1 = time.perf_counter()
        stats = loop.node_stats(t0, t1)
        errors = loop.error_lines()
    finally:
        exit_code = loop.close()
    measured = [mb for _, mb in rss if math.isfinite(mb)]
    result = {"model": str(path), "minutes": minutes, "requested_rate_hz": float(rate_hz),
              "rate_hz": _rate(total), "rate_hz_per_minute": per_minute,
              "rate_hz_min_minute": min(per_minute) if per_minute else 0.0,
              **_latency(total), **stats, "images": len(total.stamps), "seconds": t1 - t0,
              "rss_mb_start": rss[0][1], "rss_mb_end": measured[-1] if measured else float("nan"),
              "rss_mb_max": max(measured) if measured else float("nan"),
              "rss_mb_per_minute": rss_per_minute, "rss_samples": len(rss), "warmup_s": warmup, "threads": threads,
              "errors": {"count": len(errors), "lines": errors[:20], "node_alive_at_end": alive,
                         "node_exit_code": exit_code}}
    result["rss_growth_mb"] = result["rss_mb_end"] - result["rss_mb_start"]
    return _rounded(result)


def _common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint directory (default: the shipped models/push_t)")
    parser.add_argument("--rate", type=float, default=15.0,
                        help="node tick rate in Hz, its `rate_hz` parameter (0 = the profile's control rate)")
    parser.add_argument("--threads", type=int, default=1, help="the node's inference threads")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of the loop before measuring")
    parser.add_argument("--robot", default="reference_arm")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")


def node_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws bench node",
                                     description="rate and command-to-image latency of the world model node under a live policy")
    _common_args(parser)
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window after the warm-up")
    args = parser.parse_args(argv)
    try:
        result = bench_node(args.model, args.rate, args.seconds, args.threads, args.warmup, args.robot)
    except BenchError as exc:
        print(f"iws bench node: {exc}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"world model node at {result['requested_rate_hz']:g} Hz: {result['rate_hz']:.2f} images/s at the policy, "
              f"command-to-image latency p50 {result['latency_ms_p50']:.1f} ms p95 {result['latency_ms_p95']:.1f} ms, "
              f"step p50 {result.get('step_ms_p50', 0):.1f} ms")
    print(json.dumps(result))
    return 0


def soak_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws bench soak",
                                     description="the world model node under a live policy for minutes: rate, latency, memory, errors")
    _common_args(parser)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples of the node's RSS")
    args = parser.parse_args(argv)
    try:
        result = bench_soak(args.model, args.rate, args.minutes, args.threads, args.warmup, args.sample, args.robot)
    except BenchError as exc:
        print(f"iws bench soak: {exc}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"soak {args.minutes:g} min at {result['requested_rate_hz']:g} Hz: {result['rate_hz']:.2f} Hz "
              f"(worst minute {result['rate_hz_min_minute']:.2f}), latency p95 {result['latency_ms_p95']:.1f} ms, "
              f"RSS {result['rss_mb_start']} -> {result['rss_mb_end']} MB, {result['errors']['count']} error lines")
    print(json.dumps(result))
    ok = result["errors"]["node_alive_at_end"] and result["errors"]["count"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(node_main())
