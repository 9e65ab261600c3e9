"""`iws record`: write a robot profile's topics to a rosbag2 bag (MCAP), for any backend.

Subscriptions are raw (the CDR bytes go to the bag untouched, no deserialisation). Images are
subscribed best effort, which connects to reliable and best-effort publishers alike; everything
else reliable; all with deep queues; episode events with transient-local durability so that events published just
before the recorder started are not lost. Log time is the robot's clock: the latest /clock value
once one has been seen (simulators, lockstep), else wall time, so a bag from a sim in lockstep
lines up with the header stamps. "Latest" is by the time each message was *published* (the DDS
source timestamp; the reception time where a middleware gives none), not by when it arrived or when
its callback ran: a command and the /clock come from two publishers with no order between them on
the way here, so a loaded recorder may receive the tick's /clock after a command sent in answer to
that tick (one period early by arrival), or run the command's callback after the next /clock's (one
period late by callback). A command published after the tick's /clock is causally after it, and
its source timestamp says so (same host, or hosts with clocks synchronised well inside a period).
A message published after the newest /clock received so far waits (at most HOLD_S) until a /clock
published after it arrives: only then is the tick in force at its publication known.

SIGINT and SIGTERM stop the recorder: it drains what is already queued, closes the bag (index and
metadata.yaml) and exits 0, so every message received before the signal is in the bag.

Faults: the bag is flushed to disk every FLUSH_INTERVAL_S (0.5 s, also while no messages arrive),
so a SIGKILL or crash loses at most the last 0.5 s (1 s with a /clock: HOLD_S); `iws bag repair`
recovers the rest. A failed write (disk full, file size limit, I/O error) stops the recording with
one error line naming the file and the messages written, closes the bag if the disk allows (else
points to `iws bag repair`) and exits 1.
"""
from __future__ import annotations

import argparse
import bisect
import signal
import sys
import threading
import time
from pathlib import Path

from iws_data.bags import DEFAULT_STORAGE, STORAGES, STREAMS, BagError, BagWriteError, BagWriter, profile_streams

DEFAULT_KINDS = ["image", "camera_info", "joint_states", "position_command", "trajectory_command",
                 "task_state", "episode_events"]


# A recorder must not drop what it is late for: deeper queues than the live presets (whose image
# depth of 1 keeps only the newest frame and lost frames in testing when two arrived together).
IMAGE_QUEUE = 100
QUEUE = 1000


def recorder_qos(preset, depth: int):
    """The preset's reliability and durability with a recorder's queue depth."""
    from rclpy.qos import QoSProfile

    return QoSProfile(history=preset.history, depth=depth, reliability=preset.reliability, durability=preset.durability)


class Recorder:
    """An rclpy node that writes raw messages of the chosen streams to a BagWriter."""

    def __init__(self, profile, out: Path, kinds: list[str], storage: str = DEFAULT_STORAGE,
                 clock: str = "auto", node_name: str = "iws_recorder", discovery_wait_s: float = 2.0):
        import rclpy
        from rclpy.node import Node
        from rosgraph_msgs.msg import Clock

        from iws_common import qos

        self.profile = profile
        self.bag = BagWriter(out, profile, kinds, storage=storage,
                             custom_data={"recorded_by": "iws record", "profile": profile.name})
        self.node = Node(node_name)
        self.lock = threading.Lock()
        self.clock_mode = clock
        self.sim_time_ns: int | None = None
        # /clock values by publication time (ns, see publication_ns), to stamp headerless messages
        # with the clock that was in force when they were sent.
        self.clock_published_ns: list[int] = []
        self.clock_values_ns: list[int] = []
        # Messages published after the newest /clock received: (published ns, arrival monotonic s, topic, data).
        self.held: list[tuple[int, float, str, bytes]] = []
        self.received = 0
        self.error: BagWriteError | None = None
        presets = {"IMAGE": recorder_qos(qos.IMAGE_SUBSCRIBER, IMAGE_QUEUE), "STATE": recorder_qos(qos.STATE, QUEUE),
                   "COMMAND": recorder_qos(qos.COMMAND, QUEUE), "EVENTS": recorder_qos(qos.EVENTS, QUEUE)}
        streams = profile_streams(profile, kinds)
        image_topics = [topic for topic, _, preset in streams.values() if preset == "IMAGE"]
        self._wait_for_publishers(image_topics, discovery_wait_s)
        for kind, (topic, msgtype, preset) in streams.items():
            message_class = _message_class(msgtype)
            profile_qos = presets[preset]
            if preset == "IMAGE" and self._all_publishers_reliable(topic):
                # Like rosbag2: match what is offered. Reliable publishers get a reliable (lossless)
                # subscription; best-effort ones, or none yet, a best-effort one that connects to any.
                profile_qos = recorder_qos(qos.IMAGE_LOSSLESS, IMAGE_QUEUE)
            self.node.create_subscription(message_class, topic, self._writer_for(topic), profile_qos, raw=True)
        if clock == "auto":
            self.node.create_subscription(Clock, profile.topics.clock, self._on_clock, qos.CLOCK)
        self._rclpy = rclpy

    def _wait_for_publishers(self, topics: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while topics and time.monotonic() < deadline:
            if all(self.node.get_publishers_info_by_topic(t) for t in topics):
                return
            time.sleep(0.05)

    def _all_publishers_reliable(self, topic: str) -> bool:
        from rclpy.qos import ReliabilityPolicy

        infos = self.node.get_publishers_info_by_topic(topic)
        return bool(infos) and all(i.qos_profile.reliability == ReliabilityPolicy.RELIABLE for i in infos)

    CLOCK_HISTORY = 100_000  # /clock values kept for stamping (hours at 15 Hz)
    HOLD_S = 0.5  # longest wait for the /clock that follows a message (then: the newest known)

    def _on_clock(self, msg, info) -> None:  # two parameters: rclpy then passes the MessageInfo
        value = msg.clock.sec * 1_000_000_000 + msg.clock.nanosec
        published = publication_ns(info)
        with self.lock:
            self.sim_time_ns = value
            if published > 0 and (not self.clock_published_ns or published >= self.clock_published_ns[-1]):
                self.clock_published_ns.append(published)
                self.clock_values_ns.append(value)
                if len(self.clock_published_ns) > 2 * self.CLOCK_HISTORY:
                    del self.clock_published_ns[:self.CLOCK_HISTORY], self.clock_values_ns[:self.CLOCK_HISTORY]
                self._write_held(lambda message_published, _: message_published <= published)

    def log_time_ns(self, published_ns: int = 0) -> int:
        """The robot's clock when a message was published (``published_ns``: see publication_ns;
        0, or before the first /clock: the clock now), else wall time."""
        if published_ns > 0 and self.clock_published_ns:
            index = bisect.bisect_right(self.clock_published_ns, published_ns) - 1
            if index >= 0:
                return self.clock_values_ns[index]
        return self.sim_time_ns if self.sim_time_ns is not None else time.time_ns()

    def _writer_for(self, topic: str):
        def write(data: bytes, info) -> None:
            published = publication_ns(info)
            with self.lock:
                if not self.bag.closed:
                    self.received += 1
                    if published > 0 and self.clock_published_ns and published > self.clock_published_ns[-1]:
                        self.held.append((published, time.monotonic(), topic, data))
                    else:
                        self._write(topic, data, self.log_time_ns(published))
        return write

    def _write(self, topic: str, data: bytes, log_time_ns: int) -> None:
        try:
            self.bag.write(topic, data, log_time_ns)
        except BagWriteError as exc:
            self.error = exc

    def _write_held(self, ready) -> None:
        """Writes the held messages for which ``ready(published_ns, arrived_s)`` holds (lock held)."""
        if not self.held or self.bag.closed:
            return
        keep = []
        for published, arrived, topic, data in self.held:
            if ready(published, arrived):
                self._write(topic, data, self.log_time_ns(published))
            else:
                keep.append((published, arrived, topic, data))
        self.held = keep

    def flush_if_due(self) -> None:
        """The flush timer: writes messages held longer than HOLD_S (no /clock came after them: the
        robot is paused or between lockstep steps) and pushes the last messages to disk even when no
        more arrive."""
        with self.lock:
            if not self.bag.closed:
                oldest = time.monotonic() - self.HOLD_S
                self._write_held(lambda _, arrived: arrived <= oldest)
                try:
                    self.bag.flush_if_due()
                except BagWriteError as exc:
                    self.error = exc

    def close(self) -> Path:
        with self.lock:
            self._write_held(lambda *_: True)
            try:
                return self.bag.close()
            except BagWriteError as exc:
                self.error = exc
                return self.bag.path


def publication_ns(info) -> int:
    """When the writer published a message (ns since the epoch): the DDS source timestamp, else
    the middleware's reception time, else 0 (no MessageInfo)."""
    if not info:
        return 0
    return int(info.get("source_timestamp", 0) or 0) or int(info.get("received_timestamp", 0) or 0)


def _message_class(msgtype: str):
    """'pkg/msg/Name' -> the rclpy message class."""
    import importlib

    package, _, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{package}.msg"), name)


def record(profile, out: Path, kinds: list[str], storage: str = DEFAULT_STORAGE, clock: str = "auto",
           duration_s: float | None = None) -> int:
    """Record until SIGINT/SIGTERM (or ``duration_s``); returns the number of messages written."""
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    recorder = None
    try:
        recorder = Recorder(profile, out, kinds, storage=storage, clock=clock)
        executor = SingleThreadedExecutor()
        executor.add_node(recorder.node)
        print(f"iws record: recording {len(recorder.bag.connections)} topics of profile '{profile.name}' to {out} "
              f"(Ctrl-C to stop)", flush=True)
        deadline = None if duration_s is None else time.monotonic() + duration_s
        last_status = time.monotonic()
        try:
            while not stop.is_set() and recorder.error is None and (deadline is None or time.monotonic() < deadline):
                executor.spin_once(timeout_sec=0.05)
                recorder.flush_if_due()
                if time.monotonic() - last_status > 10.0:
                    last_status = time.monotonic()
                    print(f"iws record: {recorder.received} messages", flush=True)
            # Drain callbacks already ready, so nothing that arrived before the signal is dropped.
            for _ in range(1000 if recorder.error is None else 0):
                before = recorder.received
                executor.spin_once(timeout_sec=0.01)
                if recorder.received == before:
                    break
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        path = recorder.close()
        if recorder.error is not None:
            raise recorder.error
        counts = ", ".join(f"{topic}: {n}" for topic, n in recorder.bag.counts.items() if n)
        print(f"iws record: wrote {recorder.bag.message_count} messages to {path} ({counts or 'none'})", flush=True)
        return recorder.bag.message_count
    finally:
        if recorder is not None and not recorder.bag.closed:
            recorder.close()
        if recorder is not None:
            recorder.node.destroy_node()
        rclpy.try_shutdown()
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws record", description=__doc__.split("\n")[0])
    parser.add_argument("--robot", default="reference_arm", help="robot profile name or YAML path")
    parser.add_argument("--out", required=True, help="bag directory to create (must not exist)")
    parser.add_argument("--topics", nargs="+", default=DEFAULT_KINDS, metavar="KIND",
                        help=f"streams to record, by kind (default: all of {DEFAULT_KINDS})")
    parser.add_argument("--storage", default=DEFAULT_STORAGE, choices=sorted(STORAGES))
    parser.add_argument("--clock", default="auto", choices=["auto", "wall"],
                        help="bag log time: auto = the profile's /clock once published, else wall time")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    args = parser.parse_args(argv)

    from iws_common.isolation import use_simulator_domain_by_default
    from iws_common.profile import ProfileError, load_profile

    kinds = []
    for item in args.topics:  # accept kinds (image) or the profile's topic names (/camera/...)
        kinds.extend(k for k in item.split(",") if k)
    try:
        profile = load_profile(args.robot)
        use_simulator_domain_by_default(profile, "iws record")
        by_topic = {getattr(profile.topics, k): k for k in STREAMS}
        kinds = [by_topic.get(k, k) for k in kinds]
        record(profile, Path(args.out), kinds, storage=args.storage, clock=args.clock, duration_s=args.duration)
    except (BagError, ProfileError) as exc:
        print(f"iws record: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
