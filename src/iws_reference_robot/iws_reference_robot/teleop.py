"""`iws teleop`: drive the arm's pusher in the table plane from a terminal and mark episodes.

The way the paper collects demonstrations inside the world model, and works the same against the
reference robot, an A/B pair (commands go to the top level, which the fan-out sends to both) or a
real arm. A raw terminal (termios, no GUI, fine over SSH):

    w/a/s/d or arrows  move the pusher target (+y is up in the top-down camera image)
    + / -              double / halve the step          h  back to the home position
    n                  start an episode (EpisodeEvent START)
    enter or y         save it (END)                    x  discard it (DISCARD)
    q or Ctrl-C        quit (an open episode is discarded)

Targets become joint position commands through the reference arm's inverse kinematics (a real
teleop knows its robot's kinematics), published at the profile's control rate; episode events go
to the profile's episode_events topic with latched QoS, where `iws record` writes them into the
bag and `iws dataset build` keeps saved episodes and drops discarded ones. ``TeleopKeys`` holds
the key -> action logic without a terminal, so tests and other front ends drive it directly.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import select
import sys
import threading
import time

import numpy as np

from iws_common.isolation import use_simulator_domain_by_default
from iws_common.profile import ProfileError, RobotProfile, load_profile, normalize_namespace

MOVES = {"w": (0.0, 1.0), "up": (0.0, 1.0), "s": (0.0, -1.0), "down": (0.0, -1.0),
         "a": (-1.0, 0.0), "left": (-1.0, 0.0), "d": (1.0, 0.0), "right": (1.0, 0.0)}
MIN_STEP, MAX_STEP = 0.001, 0.05  # metres per key press
START, END, DISCARD = "start", "end", "discard"  # iws_interfaces/EpisodeEvent START / END / DISCARD


@dataclasses.dataclass
class TeleopUpdate:
    """What one key did: a new joint command, an episode event, a line for the user, quit."""
    command: np.ndarray | None = None
    event: str | None = None
    episode_index: int = 0
    message: str = ""
    quit: bool = False


class TeleopKeys:
    """Keys -> pusher target -> joint command (inverse kinematics, within joint limits), and
    episode bookkeeping. No ROS and no terminal."""

    def __init__(self, kinematics, step: float = 0.01, task: str = ""):
        if not MIN_STEP <= step <= MAX_STEP:
            raise ValueError(f"step must be within [{MIN_STEP}, {MAX_STEP}] m, got {step}")
        self.kinematics = kinematics
        self.step = float(step)
        self.task = task
        self.home = np.asarray(kinematics.profile.joints.home, dtype=np.float64)
        self.target_xy: np.ndarray | None = None
        self.wrist = 0.0
        self.elbow_sign = 1
        self.recording = False
        self.episode_index = 0

    def start_from(self, joint_positions) -> np.ndarray:
        """Take the arm's current pose as the target (keeps its elbow branch and wrist)."""
        q = np.asarray(joint_positions, dtype=np.float64)
        self.wrist = float(q[2]) if q.size > 2 else 0.0
        self.elbow_sign = 1 if q[1] >= 0 else -1
        self.target_xy = self.kinematics.forward_kinematics(q)
        return self.command()

    def command(self) -> np.ndarray:
        """The joint target for the current pusher target; an unreachable target is moved to the
        closest reachable point, so the target never drifts beyond the arm's reach."""
        if self.target_xy is None:
            raise RuntimeError("call start_from(joint_positions) first")
        q = self.kinematics.inverse_kinematics(self.target_xy, wrist=self.wrist, elbow_sign=self.elbow_sign)
        self.target_xy = self.kinematics.forward_kinematics(q)
        return q

    def handle(self, key: str) -> TeleopUpdate:
        if key in MOVES:
            dx, dy = MOVES[key]
            self.target_xy = self.target_xy + self.step * np.array([dx, dy])
            q = self.command()
            return TeleopUpdate(command=q, message=f"target ({self.target_xy[0]:+.3f}, {self.target_xy[1]:+.3f}) m")
        if key in ("+", "="):
            self.step = min(self.step * 2, MAX_STEP)
            return TeleopUpdate(message=f"step {self.step * 1000:.1f} mm")
        if key in ("-", "_"):
            self.step = max(self.step / 2, MIN_STEP)
            return TeleopUpdate(message=f"step {self.step * 1000:.1f} mm")
        if key == "h":
            return TeleopUpdate(command=self.start_from(self.home), message="home")
        if key == "n":
            if self.recording:
                return TeleopUpdate(message=f"episode {self.episode_index} is already running (enter saves, x discards)")
            self.recording = True
            return TeleopUpdate(event=START, episode_index=self.episode_index, message=f"episode {self.episode_index} started")
        if key in ("enter", "y", "x"):
            if not self.recording:
                return TeleopUpdate(message="no episode running (n starts one)")
            event = DISCARD if key == "x" else END
            index, self.recording = self.episode_index, False
            self.episode_index += 1
            return TeleopUpdate(event=event, episode_index=index,
                                message=f"episode {index} {'discarded' if event == DISCARD else 'saved'}")
        if key in ("q", "ctrl-c"):
            if self.recording:
                self.recording = False
                return TeleopUpdate(event=DISCARD, episode_index=self.episode_index, quit=True,
                                    message=f"episode {self.episode_index} discarded; bye")
            return TeleopUpdate(quit=True, message="bye")
        return TeleopUpdate(message=f"unknown key {key!r} (w/a/s/d, arrows, +/-, h, n, enter/y, x, q)")


def make_teleop_node(profile: RobotProfile, step: float = 0.01, task: str = "", observe: str = "", **node_kwargs):
    """A TeleopNode (built lazily so that this module imports without rclpy)."""
    from rclpy.node import Node
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    from iws_common import qos
    from iws_interfaces.msg import EpisodeEvent, TaskState

    codes = {START: EpisodeEvent.START, END: EpisodeEvent.END, DISCARD: EpisodeEvent.DISCARD}

    class TeleopNode(Node):
        """Publishes the teleop's joint command at the control rate and its episode events.

        Joint states (and task state, to label saved episodes) are read from ``observe``'s
        namespace, e.g. /real in an A/B bringup; commands and events go to the top level.
        """

        def __init__(self):
            super().__init__("iws_teleop", **node_kwargs)
            from .sim import ReferenceSim

            self.kinematics = ReferenceSim(profile, task="push_t")  # kinematics only, never stepped
            self.keys = TeleopKeys(self.kinematics, step=step, task=task)
            self.lock = threading.Lock()
            self.joint_positions: np.ndarray | None = None
            self.last_stamp = None
            self.last_task_state = None
            self.current_command: np.ndarray | None = None
            self.commands_sent = 0
            observed = profile.namespaced(observe)
            self.joint_states_topic = observed.topics.joint_states
            self.pub_command = self.create_publisher(Float64MultiArray, profile.topics.position_command, qos.COMMAND)
            self.pub_events = self.create_publisher(EpisodeEvent, profile.topics.episode_events, qos.EVENTS)
            self.create_subscription(JointState, observed.topics.joint_states, self.on_joint_state, qos.STATE)
            self.create_subscription(TaskState, observed.topics.task_state, self.on_task_state, qos.STATE)
            self.create_timer(profile.control_period_s, self.publish_command)

        def on_joint_state(self, msg) -> None:
            by_name = dict(zip(msg.name, msg.position))
            if all(n in by_name for n in profile.joints.names):
                with self.lock:
                    self.joint_positions = np.array([by_name[n] for n in profile.joints.names])
                    self.last_stamp = msg.header.stamp

        def on_task_state(self, msg) -> None:
            self.last_task_state = msg

        def ready(self) -> bool:
            """True once a joint state was seen and the target starts from it."""
            with self.lock:
                if self.current_command is None and self.joint_positions is not None:
                    self.current_command = self.keys.start_from(self.joint_positions)
                return self.current_command is not None

        def publish_command(self) -> None:
            with self.lock:
                command = self.current_command
            if command is not None:
                self.pub_command.publish(Float64MultiArray(data=[float(v) for v in command]))
                self.commands_sent += 1

        def handle_key(self, key: str) -> TeleopUpdate:
            """Apply one key: a move is published at once (and then at the control rate)."""
            if not self.ready():
                return TeleopUpdate(message=f"waiting for {self.joint_states_topic}")
            with self.lock:
                update = self.keys.handle(key)
                if update.command is not None:
                    self.current_command = update.command
            if update.command is not None:
                self.publish_command()
            if update.event is not None:
                self.publish_event(update)
            return update

        def publish_event(self, update: TeleopUpdate) -> None:
            event = EpisodeEvent(event=codes[update.event], episode_index=update.episode_index, task=self.keys.task)
            with self.lock:
                if self.last_stamp is not None:
                    event.header.stamp = self.last_stamp  # the robot's clock, which the bag's frames carry
            if update.event == END:
                state = self.last_task_state  # ground truth labels the episode where a simulator offers it
                event.success = bool(state.success) if state is not None else False
                event.score = float(state.score) if state is not None else math.nan
                event.task = event.task or (state.task if state is not None else "")
            self.pub_events.publish(event)

        def destroy_node(self) -> None:
            self.kinematics.close()
            super().destroy_node()

    return TeleopNode()


# -- terminal -------------------------------------------------------------------------------

ESCAPES = {"\x1b[A": "up", "\x1b[B": "down", "\x1b[C": "right", "\x1b[D": "left"}


def read_key(fd: int, timeout: float) -> str | None:
    """One key from a raw terminal: arrows, enter and Ctrl-C by name, other keys as themselves."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return None
    char = os.read(fd, 1).decode(errors="ignore")
    if char == "\x1b":
        rest = ""
        while select.select([fd], [], [], 0.02)[0] and len(rest) < 2:
            rest += os.read(fd, 1).decode(errors="ignore")
        return ESCAPES.get(char + rest, "escape")
    if char in ("\r", "\n"):
        return "enter"
    if char == "\x03":
        return "ctrl-c"
    return char.lower()


def run_terminal(node, timeout_s: float = 20.0) -> int:
    import termios
    import tty

    fd = sys.stdin.fileno()
    if not os.isatty(fd):
        print("iws teleop: needs an interactive terminal (stdin is not a tty)", file=sys.stderr)
        return 2
    print(__doc__.split("\n\n")[2], flush=True)
    deadline = time.monotonic() + timeout_s
    while not node.ready():
        if time.monotonic() > deadline:
            print(f"iws teleop: no joint states within {timeout_s:.0f} s: is a backend running "
                  "(iws up reference / iws up ab with --observe /real)?", file=sys.stderr)
            return 1
        time.sleep(0.05)
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)  # keys arrive one by one, unechoed; output keeps its line endings
        attributes = termios.tcgetattr(fd)
        attributes[3] &= ~termios.ISIG  # Ctrl-C arrives as a key, so an open episode is discarded cleanly
        termios.tcsetattr(fd, termios.TCSADRAIN, attributes)
        print(f"ready: step {node.keys.step * 1000:.1f} mm, commands to {node.pub_command.topic_name}", flush=True)
        while True:
            key = read_key(fd, 0.1)
            if key is None:
                continue
            update = node.handle_key(key)
            state = "REC" if node.keys.recording else "   "
            print(f"\r\x1b[K[{state}] {update.message}", end="", flush=True)
            if update.quit:
                print()
                time.sleep(0.3)  # let the last event leave before the node goes
                return 0
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws teleop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--robot", default="reference_arm", help="robot profile name or YAML path")
    parser.add_argument("--step", type=float, default=0.01, help=f"metres per key press ({MIN_STEP}-{MAX_STEP})")
    parser.add_argument("--task", default="push_t", help="task name written into the episode events")
    parser.add_argument("--observe", default="",
                        help="namespace to read joint states from (A/B: /real); commands always go to the top level")
    args = parser.parse_args(argv)
    if not MIN_STEP <= args.step <= MAX_STEP:
        parser.error(f"--step must be within [{MIN_STEP}, {MAX_STEP}] m")
    try:
        profile = load_profile(args.robot)
        observe = normalize_namespace(args.observe)
    except ProfileError as exc:
        print(f"iws teleop: {exc}", file=sys.stderr)
        return 2
    if profile.joints.count != 3:
        print(f"iws teleop: the pusher kinematics are the reference arm's (3 joints); {profile.name} has "
              f"{profile.joints.count}", file=sys.stderr)
        return 2
    from iws_common.client import RosClient

    use_simulator_domain_by_default(profile, "iws teleop")
    client = RosClient(name="iws_teleop_client")
    node = make_teleop_node(profile, step=args.step, task=args.task, observe=observe, context=client.context)
    client.executor.add_node(node)
    try:
        return run_terminal(node)
    except KeyboardInterrupt:
        return 0
    finally:
        client.executor.remove_node(node)
        node.destroy_node()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
