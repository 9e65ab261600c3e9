"""Joint commands as a ros2_control arm takes them, shared by every simulator backend.

The rules (docs/interfaces.md, "Command rules"):
- A position command (std_msgs/Float64MultiArray) must hold exactly one finite value per joint, in
  profile order; otherwise it is rejected and the previous target is kept. Finite values beyond a
  joint's limits are clamped to the limit (and counted).
- A trajectory (trajectory_msgs/JointTrajectory) must name each profile joint exactly once (any
  order, no unknown names), and its points must have finite positions of the right length and
  time_from_start that is non-negative and strictly increasing; otherwise it is rejected whole.
  An accepted trajectory replaces any running one and is followed by linear interpolation from
  the position at the time it arrived, like joint_trajectory_controller; positions are clamped.
- The target never moves faster than max_velocity: each control step limits the change.
This module imports neither ROS nor torch: nodes convert messages to plain sequences first.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Callable, Sequence

import numpy as np

from iws_common.profile import JointSpec

# The simulation clock (ns) at the first frame of an episode that `iws collect` records (not 0,
# which ROS reads as "no stamp"): the follower's ``now`` for control step k is
# CLOCK_START_NS + k * period, when recorded and replayed.
CLOCK_START_NS = 1_000_000_000


WAITING_FOR_COMMANDS = "waiting for commands"  # how a StepWorld refusal that only waits begins


# How long a lockstep client asks again for the commands it published before a step.
COMMAND_ARRIVAL_TIMEOUT_S = 10.0


def awaits_commands(step_response, commands_sent: int) -> bool:
    """A StepWorld refusal that only waits for commands still in flight (min_commands_since_reset):
    the client asks again. Any other refusal (paused, too many steps) is final."""
    return (not step_response.success and step_response.commands_since_reset < commands_sent
            and step_response.message.startswith(WAITING_FOR_COMMANDS))


class CommandsInFlight(TimeoutError):
    """The backend still lacked commands the client had published when the client gave up."""


def step_when_commands_arrive(ask: Callable[[], object], commands_sent: int,
                              timeout_s: float = COMMAND_ARRIVAL_TIMEOUT_S, poll_s: float = 0.0005):
    """The lockstep client's side of min_commands_since_reset, one loop for every client.

    ``ask()`` makes one StepWorld call (its request carrying ``commands_sent``) and returns the
    response. While the backend refuses only because commands are still in flight, ask again; return
    the first other response, a step or a final refusal, which the caller judges. A command and
    StepWorld travel on different channels, so on a loaded machine the command can come second.
    Raises CommandsInFlight after ``timeout_s``: a command lost on the way, or another publisher.
    """
    due = time.monotonic() + timeout_s
    while True:
        response = ask()
        if not awaits_commands(response, commands_sent):
            return response
        if time.monotonic() > due:
            raise CommandsInFlight(f"received {response.commands_since_reset} of the {commands_sent} commands "
                                   f"sent since the reset within {timeout_s:.0f} s")
        time.sleep(poll_s)


class CommandRejected(ValueError):
    """A command broke a rule; ``kind`` is a short stable label for rate-limited logging."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass
class _Trajectory:
    start_time: float
    times: np.ndarray  # (P+1,) from 0, first point is the position at arrival
    positions: np.ndarray  # (P+1, J)


class JointCommandFollower:
    """Holds the commanded joint target the way forward_position_controller and
    joint_trajectory_controller do, and turns it into a per-step target."""

    def __init__(self, joints: JointSpec):
        self.joints = joints
        self.lower = np.asarray(joints.lower, dtype=np.float64)
        self.upper = np.asarray(joints.upper, dtype=np.float64)
        self.max_velocity = np.asarray(joints.max_velocity, dtype=np.float64)
        self.target = np.asarray(joints.home, dtype=np.float64).copy()
        self.setpoint = self.target.copy()
        self._trajectory: _Trajectory | None = None
        self.rejected: Counter[str] = Counter()
        self.clamped = 0

    def reset(self, position: Sequence[float]) -> None:
        self.target = np.asarray(position, dtype=np.float64).copy()
        self.setpoint = self.target.copy()
        self._trajectory = None

    def _clamp(self, values: np.ndarray) -> np.ndarray:
        clamped = np.clip(values, self.lower, self.upper)
        if not np.array_equal(clamped, values):
            self.clamped += 1
        return clamped

    def _reject(self, kind: str, message: str):
        self.rejected[kind] += 1
        raise CommandRejected(kind, message)

    def set_position_command(self, data: Sequence[float]) -> np.ndarray:
        """Validate and hold a position command; returns the (clamped) target."""
        values = np.asarray(data, dtype=np.float64).reshape(-1)
        if values.size != self.joints.count:
            self._reject("wrong_length",
                         f"position command has {values.size} values, expected {self.joints.count} ({', '.join(self.joints.names)})")
        if not np.all(np.isfinite(values)):
            self._reject("non_finite", f"position command has NaN or inf: {values.tolist()}")
        self._trajectory = None
        self.target = self._clamp(values)
        return self.target

    def set_trajectory(self, joint_names: Sequence[str], times: Sequence[float],
                       positions: Sequence[Sequence[float]], now: float) -> None:
        """Validate and start following a trajectory from the current setpoint at sim time ``now``."""
        names = list(joint_names)
        unknown = [n for n in names if n not in self.joints.names]
        if unknown:
            self._reject("unknown_joint", f"trajectory names unknown joints {unknown}; expected {list(self.joints.names)}")
        if sorted(names) != sorted(self.joints.names):
            self._reject("joint_set", f"trajectory must name each joint exactly once; got {names}, expected {list(self.joints.names)}")
        if len(times) == 0:
            self._reject("empty", "trajectory has no points")
        t = np.asarray(times, dtype=np.float64)
        if not np.all(np.isfinite(t)) or np.any(t < 0):
            self._reject("bad_time", f"trajectory time_from_start must be finite and non-negative, got {t.tolist()}")
        if np.any(np.diff(t) <= 0):
            self._reject("time_order", f"trajectory time_from_start must strictly increase, got {t.tolist()}")
        order = [names.index(n) for n in self.joints.names]
        rows = []
        for i, point in enumerate(positions):
            p = np.asarray(point, dtype=np.float64).reshape(-1)
            if p.size != len(names):
                self._reject("wrong_length", f"trajectory point {i} has {p.size} positions, expected {len(names)}")
            if not np.all(np.isfinite(p)):
                self._reject("non_finite", f"trajectory point {i} has NaN or inf")
            rows.append(self._clamp(p[order]))
        if len(rows) != len(t):
            self._reject("wrong_length", f"trajectory has {len(t)} times but {len(rows)} points")
        start = self.setpoint.copy()
        if t[0] > 0:
            t = np.concatenate([[0.0], t])
            rows = [start] + rows
        self._trajectory = _Trajectory(start_time=float(now), times=t, positions=np.stack(rows))

    def step(self, now: float, dt: float) -> np.ndarray:
        """The joint setpoint for the control step at sim time ``now``: the held target (or the
        trajectory sample), approached no faster than max_velocity from the previous setpoint."""
        if self._trajectory is not None:
            traj = self._trajectory
            elapsed = now - traj.start_time
            if elapsed >= traj.times[-1]:
                desired = traj.positions[-1]
                self._trajectory = None
            else:
                desired = np.array([np.interp(elapsed, traj.times, traj.positions[:, j])
                                    for j in range(self.joints.count)])
            self.target = desired
        limit = self.max_velocity * dt
        self.setpoint = self.setpoint + np.clip(self.target - self.setpoint, -limit, limit)
        return self.setpoint.copy()
