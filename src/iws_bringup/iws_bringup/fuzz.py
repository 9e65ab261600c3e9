"""`iws bench fuzz`: malformed input on every topic and service of both simulator backends.

    iws bench fuzz --json                      # 10,000 inputs per backend, seed 0
    iws bench fuzz --backends reference --inputs 2000 --seed 3

For each backend (the reference robot and the world model) two node processes are fuzzed in turn,
as a client in another process would: one in ``realtime`` (position commands, trajectories and
resets, while the camera rate is measured against a quiet baseline of the same node), one in
``lockstep`` (step storms with many calls in flight, pause toggled during steps, resets between
them). The inputs come from a seeded generator: NaN and inf, empty and huge arrays, wrong lengths,
wrong and duplicate joint names, unsorted and negative trajectory times, images with impossible
sizes and encodings, extreme seeds and step counts, and a share of valid ones, so that the node
has real work between the bad input.

A **crash** is a node process that died or a service call left unanswered for 30 s. The node's
log must name each kind of rejection, rate-limited: the result reports the most lines one kind
produced in one second.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

BACKENDS = ("reference", "world_model")
CALL_TIMEOUT_S = 30.0
# Share of each channel in one backend's inputs; topics in the realtime phase, services mostly lockstep.
SHARES = {"position_command": 0.35, "trajectory_command": 0.35, "reset": 0.1, "step": 0.12, "pause": 0.08}
# Resets while the realtime node runs, at most one per REALTIME_RESET_PERIOD_S; the rest (most) storm
# the lockstep node between steps.
REALTIME_RESET_PERIOD_S = 0.25


class FuzzError(RuntimeError):
    """The fuzzer itself could not run (a node never came up)."""


class InputGenerator:
    """Seeded malformed (and some valid) inputs for a robot profile; each comes with a kind label."""

    def __init__(self, profile, seed: int):
        self.profile = profile
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        joints = profile.joints
        self.names = list(joints.names)
        self.n = joints.count
        self.lower, self.upper = np.asarray(joints.lower), np.asarray(joints.upper)
        self.home = np.asarray(joints.home)

    def _valid_position(self) -> list[float]:
        return (self.home + self.np_rng.uniform(-0.2, 0.2, self.n)).clip(self.lower, self.upper).tolist()

    def _values(self) -> tuple[str, list[float]]:
        r = self.rng.random()
        if r < 0.15:
            return "valid", self._valid_position()
        if r < 0.3:
            values = self._valid_position()
            values[self.rng.randrange(self.n)] = self.rng.choice([math.nan, math.inf, -math.inf])
            return "non_finite", values
        if r < 0.4:
            return "beyond_limits", (self.np_rng.choice([-1, 1], self.n) * self.rng.choice([10.0, 1e6, 1e308])).tolist()
        if r < 0.5:
            return "empty", []
        if r < 0.8:
            size = self.rng.choice([1, self.n - 1, self.n + 1, 2 * self.n, 100])
            return "wrong_length", self.np_rng.normal(0, 1, max(size, 0)).tolist()
        if r < 0.995:
            return "subnormal_and_signed_zero", [self.rng.choice([5e-324, -0.0, 0.0, -5e-324]) for _ in range(self.n)]
        return "huge", np.zeros(self.rng.choice([100_000, 1_000_000])).tolist()

    def position_command(self):
        from std_msgs.msg import Float64MultiArray, MultiArrayDimension
        kind, values = self._values()
        msg = Float64MultiArray(data=values)
        if self.rng.random() < 0.1:  # a layout that contradicts the data: nodes read data only
            msg.layout.dim = [MultiArrayDimension(label="x", size=self.rng.randrange(2**32), stride=0)]
            msg.layout.data_offset = self.rng.randrange(2**32)
        return kind, msg

    def trajectory(self):
        from builtin_interfaces.msg import Duration
        from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint
        names = list(self.names)
        kind = "valid"
        r = self.rng.random()
        if r < 0.1:
            names[self.rng.randrange(self.n)] = "not_a_joint"
            kind = "unknown_joint"
        elif r < 0.2:
            names = names[:-1] + [names[0]]
            kind = "duplicate_joint"
        elif r < 0.25:
            names = []
            kind = "no_joints"
        elif r < 0.3:
            self.rng.shuffle(names)
            kind = "shuffled_joints"  # valid: any order
        count = self.rng.choice([0, 1, 2, 3, 5] * 20 + [10_000])
        times = sorted(self.rng.uniform(0.05, 3.0) for _ in range(count))
        t = self.rng.random()
        if count and t < 0.15:
            self.rng.shuffle(times)
            kind = "unsorted_times" if count > 1 else kind
        elif count and t < 0.3:
            times[0] = -self.rng.uniform(0.01, 5.0)
            kind = "negative_time"
        elif count > 1 and t < 0.4:
            times[1] = times[0]
            kind = "repeated_time"
        if count == 0:
            kind = "no_points"
        points = []
        for i, ts in enumerate(times):
            positions = self._valid_position()
            p = self.rng.random()
            if p < 0.05:
                positions[0] = math.nan
                kind = "non_finite"
            elif p < 0.1:
                positions = positions[:-1]
                kind = "wrong_length"
            sec = math.floor(ts)
            points.append(JointTrajectoryPoint(positions=positions, velocities=[math.inf] * self.rng.randrange(3),
                                               time_from_start=Duration(sec=sec, nanosec=int((ts - sec) * 1e9))))
        if count >= 10_000:
            kind = "huge"
        return kind, JointTrajectory(joint_names=names, points=points)

    def _image(self, width: int, height: int, encoding: str = "rgb8"):
        from sensor_msgs.msg import Image
        channels = {"rgb8": 3, "bgr8": 3, "mono8": 1}.get(encoding, 3)
        step = width * channels
        data = self.np_rng.integers(0, 256, step * height, dtype=np.uint8)
        return Image(width=width, height=height, encoding=encoding, step=step, data=data.tobytes())

    def _joint_state(self, names=None, positions=None):
        from sensor_msgs.msg import JointState
        return JointState(name=list(self.names if names is None else names),
                          position=self._valid_position() if positions is None else positions)

    def reset_request(self):
        from iws_interfaces.srv import ResetWorld
        request = ResetWorld.Request(seed=self.rng.choice([-1, 0, 7, 2**63 - 1, -2**63, self.rng.randrange(2**31)]),
                                     episode_index=self.rng.choice([0, 1, -1, 2**63 - 1, -2**63, self.rng.randrange(1000)]))
        r = self.rng.random()
        if r < 0.4:
            return "seed_and_index", request
        camera = self.profile.camera
        frames = self.rng.choice([1, 2, 4, 8])
        kind = "valid_window"
        images = [self._image(camera.width, camera.height) for _ in range(frames)]
        joints = [self._joint_state() for _ in range(frames)]
        if r < 0.5:
            joints = joints[:-1]
            kind = "count_mismatch"
        elif r < 0.55:
            images = [self._image(0, 0) for _ in range(frames)]
            kind = "empty_images"
        elif r < 0.6:
            images[0].encoding = self.rng.choice(["bayer_rggb8", "16UC1", "", "rgb8; DROP TABLE"])
            kind = "bad_encoding"
        elif r < 0.65:
            images[0].step = 1
            kind = "bad_step"
        elif r < 0.7:
            images[-1].data = images[-1].data[: len(images[-1].data) // 2]
            kind = "short_data"
        elif r < 0.73:
            images[0] = self._image(self.rng.choice([1, 7, 512]), self.rng.choice([1, 9, 512]))
            kind = "mixed_sizes"
        elif r < 0.78:
            joints[0] = self._joint_state(names=self.names[:-1] + ["not_a_joint"])
            kind = "wrong_joint_names"
        elif r < 0.83:
            joints[0] = self._joint_state(positions=[math.nan] * self.n)
            kind = "non_finite_joints"
        elif r < 0.86:
            joints[0] = self._joint_state(positions=[0.0] * (self.n + 2))
            kind = "wrong_joint_count"
        request.images, request.joint_states = images, joints
        return kind, request

    def step_request(self):
        from iws_interfaces.srv import StepWorld
        r = self.rng.random()
        if r < 0.35:
            return "zero", StepWorld.Request(num_steps=0)
        if r < 0.75:
            return "small", StepWorld.Request(num_steps=self.rng.choice([1, 1, 1, 2, 3]))
        return "too_many", StepWorld.Request(num_steps=self.rng.choice([1001, 65_536, 2**32 - 1]))

    def pause_request(self):
        from std_srvs.srv import SetBool
        pause = self.rng.random() < 0.5
        return ("pause" if pause else "unpause"), SetBool.Request(data=pause)


class CallTracker:
    """Service calls in flight: at most ``limit`` at once; a call unanswered for CALL_TIMEOUT_S is a hang."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_flight: list[tuple[object, float, str]] = []
        self.answered = Counter()
        self.refused = Counter()
        self.hangs: list[str] = []
        self.reset_stamps: set[int] = set()  # first_frame_stamp of each reset that succeeded

    def add(self, future, label: str) -> None:
        self.in_flight.append((future, time.monotonic(), label))

    def poll(self) -> None:
        now = time.monotonic()
        still = []
        for future, sent, label in self.in_flight:
            if future.done():
                result = future.result()
                self.answered[label] += 1
                if hasattr(result, "success") and not result.success:
                    self.refused[label] += 1
                elif hasattr(result, "first_frame_stamp"):
                    from iws_common.messages import stamp_ns
                    self.reset_stamps.add(stamp_ns(result.first_frame_stamp))
            elif now - sent > CALL_TIMEOUT_S:
                self.hangs.append(f"{label} unanswered after {CALL_TIMEOUT_S:.0f} s")
            else:
                still.append((future, sent, label))
        self.in_flight = still

    def wait_for_room(self, node_alive) -> None:
        while len(self.in_flight) >= self.limit and node_alive():
            self.poll()
            time.sleep(0.001)

    def drain(self, node_alive) -> None:
        while self.in_flight and node_alive():
            self.poll()
            time.sleep(0.005)
        if not node_alive():
            self.in_flight.clear()


class FuzzTarget:
    """One backend node in its own process, and this process as its client."""

    def __init__(self, backend: str, mode: str, params: dict, robot: str, log_dir: Path):
        from iws_bringup.backends import get_backend, node_parameters, ros_arguments
        from iws_common import qos
        from iws_common.client import RosClient
        from iws_common.processes import DomainLease, NodeProcess
        from iws_common.profile import load_profile
        from iws_interfaces.msg import WorldStatus
        from sensor_msgs.msg import Image

        self.profile = load_profile(robot)
        spec = get_backend(backend)
        node_params = node_parameters(spec, robot, {**params, "mode": mode})
        self.lease = DomainLease()  # a fuzz run starts a target per backend and mode: released in close()
        self.domain = self.lease.domain_id
        self.log_path = log_dir / f"{backend}_{mode}.log"
        self.node = NodeProcess([sys.executable, "-m", spec.entry_point.split(":")[0]] + ros_arguments(node_params),
                                self.domain, self.log_path)
        self.client = RosClient(self.domain, name=f"iws_fuzz_{backend}")
        self.image_arrivals: list[tuple[float, int]] = []  # (arrival, stamp) of frames with a new stamp
        self._last_stamp = None
        self.status: list = []
        topics = self.profile.topics
        self.client.node.create_subscription(Image, topics.image, self._on_image, qos.IMAGE_SUBSCRIBER)
        self.client.node.create_subscription(WorldStatus, topics.world_status, self.status.append, qos.STATE)

    def _on_image(self, msg) -> None:
        # A frame seen twice is not a new tick; a reset's own first frame (a stamp of its own) is
        # left out in image_rate.
        from iws_common.messages import stamp_ns
        stamp = stamp_ns(msg.header.stamp)
        if stamp != self._last_stamp:
            self._last_stamp = stamp
            self.image_arrivals.append((time.monotonic(), stamp))

    def alive(self) -> bool:
        return self.node.alive()

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.status:
            if not self.alive():
                raise FuzzError(f"{self.log_path.name}: node exited with {self.node.proc.returncode}:\n{self.node.output()[-2000:]}")
            if time.monotonic() > deadline:
                raise FuzzError(f"{self.log_path.name}: no WorldStatus within {timeout:.0f} s")
            time.sleep(0.1)

    def image_rate(self, t0: float, t1: float, reset_stamps=frozenset()) -> float:
        """Control ticks per second seen by this client in [t0, t1]; ``reset_stamps``: the first
        frames of resets, which are not ticks."""
        stamps = [t for t, stamp in list(self.image_arrivals) if t0 <= t <= t1 and stamp not in reset_stamps]
        return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) >= 2 else 0.0

    def close(self) -> int:
        self.client.close()
        code = self.node.stop()
        self.lease.release()
        return code


def rejection_log_stats(log_text: str) -> dict:
    """Lines per rejection kind, and the most lines any kind logged within one second."""
    per_kind_second: Counter = Counter()
    per_kind: Counter = Counter()
    pattern = re.compile(r"\[(?:ERROR|WARN)\] \[(\d+)\.\d+\] \[[^\]]+\]: rejected \(([^)]+)\)")
    for match in pattern.finditer(log_text):
        second, kind = int(match.group(1)), match.group(2)
        per_kind[kind] += 1
        per_kind_second[(kind, second)] += 1
    return {"lines_per_kind": dict(sorted(per_kind.items())),
            "max_lines_per_kind_per_s": max(per_kind_second.values(), default=0),
            "tracebacks": log_text.count("Traceback")}


def _publish_topics(target: FuzzTarget, gen: InputGenerator, counts: dict, rate: float, tracker: CallTracker,
                    resets: int, sent: Counter) -> None:
    """Position commands, trajectories and resets, interleaved, at ``rate`` inputs per second."""
    from iws_interfaces.srv import ResetWorld
    topics, services = target.profile.topics, target.profile.services
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory
    position = target.client.publisher(Float64MultiArray, topics.position_command)
    trajectory = target.client.publisher(JointTrajectory, topics.trajectory_command)
    reset = target.client.node.create_client(ResetWorld, services.reset)
    target.client.wait_for_subscribers(position)
    target.client.wait_for_subscribers(trajectory)
    if not reset.wait_for_service(timeout_sec=30):
        raise FuzzError(f"{services.reset} not available")
    plan = ["position_command"] * counts["position_command"] + ["trajectory_command"] * counts["trajectory_command"]
    gen.rng.shuffle(plan)
    start = last_reset = time.monotonic()
    for i, channel in enumerate(plan):
        if not target.alive():
            return
        if channel == "position_command":
            kind, msg = gen.position_command()
            position.publish(msg)
        else:
            kind, msg = gen.trajectory()
            trajectory.publish(msg)
        sent[f"{channel}:{kind}"] += 1
        if resets and time.monotonic() - last_reset >= REALTIME_RESET_PERIOD_S and len(tracker.in_flight) < tracker.limit:
            # Resets teleport a running world: paced here; the storms are in the lockstep phase.
            kind, request = gen.reset_request()
            tracker.add(reset.call_async(request), "reset")
            sent[f"reset:{kind}"] += 1
            resets -= 1
            last_reset = time.monotonic()
        tracker.poll()
        delay = start + (i + 1) / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    tracker.drain(target.alive)


def _storm_services(target: FuzzTarget, gen: InputGenerator, counts: dict, resets: int, tracker: CallTracker,
                    sent: Counter) -> None:
    """StepWorld, pause and reset calls with up to ``tracker.limit`` in flight, in random order."""
    from iws_interfaces.srv import ResetWorld, StepWorld
    from std_srvs.srv import SetBool
    services = target.profile.services
    clients = {"step": target.client.node.create_client(StepWorld, services.step),
               "pause": target.client.node.create_client(SetBool, services.pause),
               "reset": target.client.node.create_client(ResetWorld, services.reset)}
    for name, client in clients.items():
        if not client.wait_for_service(timeout_sec=30):
            raise FuzzError(f"{name} service not available")
    plan = ["step"] * counts["step"] + ["pause"] * counts["pause"] + ["reset"] * resets
    gen.rng.shuffle(plan)
    make = {"step": gen.step_request, "pause": gen.pause_request, "reset": gen.reset_request}
    for channel in plan:
        if not target.alive():
            return
        tracker.wait_for_room(target.alive)
        kind, request = make[channel]()
        tracker.add(clients[channel].call_async(request), channel)
        sent[f"{channel}:{kind}"] += 1
    tracker.drain(target.alive)
    # Leave it unpaused, and prove it still steps.
    for channel, request in (("pause", SetBool.Request(data=False)), ("step", StepWorld.Request(num_steps=1))):
        tracker.add(clients[channel].call_async(request), f"final_{channel}")
        tracker.drain(target.alive)


def realtime_resets_sent(sent: Counter) -> int:
    return sum(n for key, n in sent.items() if key.startswith("reset:"))


def fuzz_backend(backend: str, inputs: int, seed: int, robot: str, params: dict, rate: float,
                 baseline_s: float, log_dir: Path, progress=None) -> dict:
    counts = {channel: max(1, round(inputs * share)) for channel, share in SHARES.items()}
    topic_seconds = (counts["position_command"] + counts["trajectory_command"]) / rate
    realtime_resets = min(counts["reset"] // 2, int(topic_seconds / REALTIME_RESET_PERIOD_S))
    sent: Counter = Counter()
    result: dict = {"backend": backend}
    crashes, hangs = 0, []

    # Realtime: topics and resets while the camera keeps its rate.
    target = FuzzTarget(backend, "realtime", params, robot, log_dir)
    gen = InputGenerator(target.profile, seed)
    try:
        target.wait_ready()
        time.sleep(1.0)
        t0 = time.monotonic()
        time.sleep(baseline_s)
        t1 = time.monotonic()
        tracker = CallTracker(limit=4)
        if progress:
            print(f"iws bench fuzz: {backend} realtime: {counts['position_command'] + counts['trajectory_command'] + realtime_resets} "
                  f"inputs at {rate:g}/s", file=progress, flush=True)
        _publish_topics(target, gen, counts, rate, tracker, realtime_resets, sent)
        t2 = time.monotonic()
        time.sleep(1.0)  # the node is still up a moment later, and answers
        alive = target.alive() and target.image_rate(t2, time.monotonic()) > 0
        result["realtime"] = {"rate_hz_normal": target.image_rate(t0, t1),
                              "rate_hz_during": target.image_rate(t1, t2, tracker.reset_stamps),
                              "seconds": t2 - t1, "node_alive": alive, "answered": dict(tracker.answered),
                              "refused": dict(tracker.refused)}
        hangs += tracker.hangs
        crashes += 0 if alive else 1
    finally:
        code = target.close()
        result["realtime"] = {**result.get("realtime", {}), "exit_code": code,
                              **rejection_log_stats(target.node.log_path.read_text())}

    # Lockstep: step storms, pause during steps, resets between them.
    target = FuzzTarget(backend, "lockstep", params, robot, log_dir)
    gen = InputGenerator(target.profile, seed + 1)
    try:
        target.wait_ready()
        tracker = CallTracker(limit=8)
        if progress:
            print(f"iws bench fuzz: {backend} lockstep: {counts['step'] + counts['pause'] + counts['reset'] - realtime_resets_sent(sent)} "
                  "service calls, up to 8 in flight", file=progress, flush=True)
        t1 = time.monotonic()
        _storm_services(target, gen, counts, counts["reset"] - realtime_resets_sent(sent), tracker, sent)
        alive = target.alive() and tracker.answered["final_step"] == 1 and tracker.refused["final_step"] == 0
        result["lockstep"] = {"seconds": time.monotonic() - t1, "node_alive": alive, "answered": dict(tracker.answered),
                              "refused": dict(tracker.refused)}
        hangs += tracker.hangs
        crashes += 0 if alive else 1
    finally:
        code = target.close()
        result["lockstep"] = {**result.get("lockstep", {}), "exit_code": code,
                              **rejection_log_stats(target.node.log_path.read_text())}

    result["inputs"] = sum(sent.values())
    result["inputs_per_channel"] = dict(sorted(Counter(k.split(":")[0] for k in sent.elements()).items()))
    result["inputs_per_kind"] = dict(sorted(sent.items()))
    result["hangs"] = hangs
    result["crashes"] = crashes + len(hangs)
    return result


def bench_fuzz(backends=BACKENDS, inputs: int = 10_000, seed: int = 0, robot: str = "reference_arm",
               model: str | None = None, rate: float = 400.0, baseline_s: float = 5.0,
               log_dir: Path | None = None, progress=sys.stderr) -> dict:
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="iws_fuzz_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    per_backend = {}
    for i, backend in enumerate(backends):
        params = {"model": model} if backend == "world_model" and model else {}
        per_backend[backend] = fuzz_backend(backend, inputs, seed + 100 * i, robot, params, rate, baseline_s,
                                            log_dir, progress)
    ratios = {b: r["realtime"]["rate_hz_during"] / r["realtime"]["rate_hz_normal"]
              for b, r in per_backend.items() if r["realtime"].get("rate_hz_normal")}
    worst = min(ratios, key=ratios.get) if ratios else None
    result = {"inputs": sum(r["inputs"] for r in per_backend.values()),
              "crashes": sum(r["crashes"] for r in per_backend.values()),
              "rate_hz_during": per_backend[worst]["realtime"]["rate_hz_during"] if worst else 0.0,
              "rate_hz_normal": per_backend[worst]["realtime"]["rate_hz_normal"] if worst else 0.0,
              "rate_ratio_min": ratios[worst] if worst else 0.0,
              "max_log_lines_per_kind_per_s": max(max(r["realtime"]["max_lines_per_kind_per_s"],
                                                      r["lockstep"]["max_lines_per_kind_per_s"])
                                                  for r in per_backend.values()),
              "seed": seed, "logs": str(log_dir), "backends": per_backend}
    return _rounded(result)


def _rounded(value):
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws bench fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: reference,world_model")
    parser.add_argument("--inputs", type=int, default=10_000, help="inputs per backend, spread over every channel")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=400.0, help="topic inputs per second in the realtime phase")
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of quiet rate measurement first")
    parser.add_argument("--model", help="world model checkpoint (default: the shipped models/push_t)")
    parser.add_argument("--robot", default="reference_arm")
    parser.add_argument("--logs", type=Path, help="directory for the nodes' logs (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown or not backends:
        parser.error(f"--backends must name some of {BACKENDS}, got {args.backends}")
    if args.inputs < 20 or args.rate <= 0:
        parser.error("--inputs must be at least 20 and --rate positive")
    try:
        result = bench_fuzz(backends, args.inputs, args.seed, args.robot, args.model, args.rate, args.baseline,
                            args.logs, progress=None if args.json else sys.stderr)
    except FuzzError as exc:
        print(f"iws bench fuzz: {exc}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"{result['inputs']} inputs, {result['crashes']} crashes, camera rate during fuzzing "
              f"{result['rate_hz_during']} Hz of {result['rate_hz_normal']} Hz normal (worst backend), "
              f"at most {result['max_log_lines_per_kind_per_s']} log lines per rejection kind per second; logs in {result['logs']}")
    print(json.dumps(result))
    return 0 if result["crashes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
