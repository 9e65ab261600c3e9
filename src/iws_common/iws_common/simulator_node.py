"""What every simulator backend shares, so the reference robot and the world model cannot drift apart.

A backend is a node that serves a robot profile's interface: it holds the commanded joint target
the way ros2_control's controllers do (``JointCommandFollower``), keeps one integer-nanosecond
clock, publishes /clock and WorldStatus, logs each kind of rejected command at most once per
second, and serves ResetWorld, StepWorld and pause. Subclasses implement ``on_reset`` and ``run_steps``
(and whatever advances their world).
"""
from __future__ import annotations

import threading
import time

import numpy as np
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool
from trajectory_msgs.msg import JointTrajectory

from iws_common import qos
from iws_common.commands import WAITING_FOR_COMMANDS, CommandRejected, JointCommandFollower
from iws_common.isolation import check_domain, check_graph, foreign_endpoints
from iws_common.messages import time_msg
from iws_common.profile import load_profile
from iws_common.stats import StepTimer
from iws_common.throttle import KindThrottle
from iws_interfaces.msg import WorldStatus
from iws_interfaces.srv import ResetWorld, StepWorld

MODES = ("realtime", "lockstep")
# One StepWorld call holds the world until it returns; more steps are more calls.
MAX_STEPS_PER_CALL = 1000


class SimulatorNode(Node):
    backend = ""  # "reference" or "world_model", reported in WorldStatus

    def __init__(self, node_name: str, command_group=None):
        super().__init__(node_name)
        self.declare_parameter("robot", "reference_arm")
        self.declare_parameter("mode", "realtime")
        self.declare_parameter("seed", 0)
        # Prefixed to every profile name (/sim/joint_states), so A/B bringup can run two backends.
        self.declare_parameter("namespace", "")
        # Isolation overrides (docs/safety.md): both default to refusing.
        self.declare_parameter("allow_hardware_domain", False)
        self.declare_parameter("allow_foreign_nodes", False)
        # Seconds to watch the graph for a driver on this robot's topics before serving them.
        self.declare_parameter("graph_check_s", 2.0)
        self.profile = load_profile(self.get_parameter("robot").value).namespaced(self.get_parameter("namespace").value)
        self._check_isolation()
        self.mode = str(self.get_parameter("mode").value)
        if self.mode not in MODES:
            raise ValueError(f"parameter mode must be one of {MODES}, got '{self.mode}'")
        self.seed = int(self.get_parameter("seed").value)
        self.model_id = ""

        self.follower = JointCommandFollower(self.profile.joints)
        self.rejection_log = KindThrottle(period_s=1.0)
        self.dt = self.profile.control_period_s
        self.dt_ns = round(self.dt * 1e9)
        # The wall-clock tick rate reported in WorldStatus; a backend may tick faster or slower
        # than the profile's control rate (world model `rate_hz`), while sim time keeps `dt` per step.
        self.target_rate_hz = self.profile.control_rate_hz
        # One clock for every stamp, in integer nanoseconds (exact across millions of steps),
        # monotonic across resets; starts at wall time like a real robot's.
        self.clock_ns = int(time.time()) * 1_000_000_000
        self.step_count = 0
        # Position commands and trajectories received since the last reset, valid or not: a lockstep
        # client steps with StepWorld's min_commands_since_reset so that a step cannot overtake them.
        self.commands_since_reset = 0
        # The follower and the count: in the world model, commands arrive on executor threads while
        # its inference thread steps; a command lands wholly before or after a step's sample, never
        # halfway (a trajectory finishing in the step could otherwise overwrite a new command).
        self.command_lock = threading.Lock()
        self.paused = False
        self.timer_stats = StepTimer()

        topics = self.profile.topics
        self.pub_clock = self.create_publisher(Clock, topics.clock, qos.CLOCK)
        self.pub_status = self.create_publisher(WorldStatus, topics.world_status, qos.STATE)
        self.create_subscription(Float64MultiArray, topics.position_command, self.on_position_command,
                                 qos.COMMAND, callback_group=command_group)
        self.create_subscription(JointTrajectory, topics.trajectory_command, self.on_trajectory,
                                 qos.COMMAND, callback_group=command_group)

    def _check_isolation(self) -> None:
        """Refuse the hardware's domain and a graph where another node serves these topics, before
        this node creates a single publisher or subscription (iws_common.isolation)."""
        check_domain(self.profile, self.context.get_domain_id(), bool(self.get_parameter("allow_hardware_domain").value))
        found = check_graph(self, self.profile, float(self.get_parameter("graph_check_s").value),
                            bool(self.get_parameter("allow_foreign_nodes").value))
        for line in found:
            self.get_logger().warning(f"allow_foreign_nodes: starting beside {line}")
        # Keep watching: a driver started after this node is reported (it cannot be refused any
        # more), and so is a participant whose node name arrived only after the start-up check.
        self._graph_reported = set(found)
        self.create_timer(2.0, self._watch_graph)

    def _watch_graph(self) -> None:
        found = set(foreign_endpoints(self, self.profile))
        new = sorted(found - self._graph_reported)
        self._graph_reported = found  # one that leaves and comes back is reported again
        if new:
            allowed = bool(self.get_parameter("allow_foreign_nodes").value)
            log = self.get_logger().warning if allowed else self.get_logger().error
            log(f"another node now serves this robot's interface: {'; '.join(new)}. "
                "Is a real driver on this domain? Stop this simulator or that node")

    def create_world_services(self, callback_group=None) -> None:
        """ResetWorld, StepWorld and pause on the profile's names (after the subclass is ready)."""
        services = self.profile.services
        self.create_service(ResetWorld, services.reset, self._guarded_service("reset", self.on_reset),
                            callback_group=callback_group)
        self.create_service(StepWorld, services.step, self._guarded_service("step", self.on_step),
                            callback_group=callback_group)
        self.create_service(SetBool, services.pause, self._guarded_service("pause", self.on_pause),
                            callback_group=callback_group)

    def _guarded_service(self, name: str, handler):
        """A handler that answers success=False instead of raising: an exception in a callback
        would end the executor's spin, and with it the node, on a client's bad request."""
        def serve(request, response):
            try:
                return handler(request, response)
            except Exception as exc:  # noqa: BLE001 - the node must outlive any request
                response.success, response.message = False, f"{name} failed: {type(exc).__name__}: {exc}"
                self.log_refusal(f"{name}_error", response.message)
                return response
        return serve

    # -- commands ---------------------------------------------------------------------------
    def log_refusal(self, kind: str, message: str) -> None:
        """One line per kind of problem per second at most: a flood of bad input must not flood the log."""
        log_now, suppressed = self.rejection_log.should_log(kind)
        if log_now:
            more = f" (+{suppressed} more of this kind)" if suppressed else ""
            self.get_logger().error(f"rejected ({kind}): {message}{more}")

    def log_rejection(self, exc: CommandRejected) -> None:
        self.log_refusal(exc.kind, f"command: {exc}")

    def on_position_command(self, msg: Float64MultiArray) -> None:
        with self.command_lock:
            try:
                before = self.follower.clamped
                self.follower.set_position_command(msg.data)
                if self.follower.clamped != before and self.rejection_log.should_log("clamped")[0]:
                    self.get_logger().warning("position command beyond joint limits: clamped to the limits")
            except CommandRejected as exc:
                self.log_rejection(exc)
            except Exception as exc:  # noqa: BLE001 - no message may take the node down
                self.follower.rejected["invalid"] += 1
                self.log_refusal("invalid", f"position command: {type(exc).__name__}: {exc}")
            finally:  # counted once in force: a step that waits for it must not run before
                self.commands_since_reset += 1

    def on_trajectory(self, msg: JointTrajectory) -> None:
        with self.command_lock:
            try:
                times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
                self.follower.set_trajectory(msg.joint_names, times, [p.positions for p in msg.points],
                                             now=self.clock_ns * 1e-9)
            except CommandRejected as exc:
                self.log_rejection(exc)
            except Exception as exc:  # noqa: BLE001
                self.follower.rejected["invalid"] += 1
                self.log_refusal("invalid", f"trajectory: {type(exc).__name__}: {exc}")
            finally:
                self.commands_since_reset += 1

    def follow_commands(self) -> tuple[np.ndarray, np.ndarray]:
        """Advance the follower one period at the current clock. Returns the velocity-limited
        setpoint (what a position drive follows) and the target in force (a world model's action)."""
        with self.command_lock:
            setpoint = self.follower.step(self.clock_ns * 1e-9, self.dt).copy()
            return setpoint, self.follower.target.copy()

    def reset_follower(self, position) -> None:
        """Hold ``position``: a reset's start, forgetting any command or trajectory in force."""
        with self.command_lock:
            self.follower.reset(position)

    # -- status and services ----------------------------------------------------------------
    def begin_episode_after_reset(self) -> None:
        """A reset's first frame is a new frame: it takes the next period's stamp (with the last
        step's, a client waiting for the reset's stamp could take the old frame for the new one).
        The count of commands received starts again."""
        self.clock_ns += self.dt_ns
        with self.command_lock:
            self.commands_since_reset = 0

    def publish_clock(self):
        stamp = time_msg(self.clock_ns)
        self.pub_clock.publish(Clock(clock=stamp))
        return stamp

    def publish_status(self) -> None:
        status = WorldStatus(
            backend=self.backend, model_id=self.model_id, mode=self.mode,
            sim_time=time_msg(self.clock_ns), step_count=self.step_count,
            achieved_rate_hz=self.timer_stats.rate_hz(), target_rate_hz=self.target_rate_hz,
            step_latency_ms_p50=self.timer_stats.latency_ms(50), step_latency_ms_p95=self.timer_stats.latency_ms(95),
            paused=self.paused, rejected_commands=sum(self.follower.rejected.values()))
        status.header.stamp = time_msg(self.clock_ns)
        self.pub_status.publish(status)

    def step_refusal(self, num_steps: int, min_commands: int = 0) -> str:
        """Why a StepWorld call cannot run now ("" when it can); logged, rate-limited, by kind.
        Waiting for a client's commands is not logged: the client asks again until they arrive."""
        kind, message = "", ""
        if self.mode == "lockstep" and not self.paused and self.commands_since_reset < min_commands:
            return f"{WAITING_FOR_COMMANDS}: {self.commands_since_reset} of {min_commands} received since the reset"
        if self.mode != "lockstep":
            kind, message = "step_realtime", "StepWorld needs mode:=lockstep (this node runs in realtime)"
        elif self.paused:
            kind, message = "step_paused", "paused: unpause before stepping"
        elif num_steps > MAX_STEPS_PER_CALL:
            kind, message = "step_too_many", (f"num_steps {num_steps} exceeds {MAX_STEPS_PER_CALL} per call "
                                              "(a call blocks the world until it returns): call again instead")
        if kind:
            self.log_refusal(kind, message)
        return message

    def on_pause(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        self.paused = bool(request.data)
        response.success, response.message = True, "paused" if self.paused else "running"
        self.publish_status()
        return response

    def on_reset(self, request, response):
        raise NotImplementedError

    def on_step(self, request: StepWorld.Request, response: StepWorld.Response) -> StepWorld.Response:
        """Check the request, run the steps (``run_steps``), report the clock and counts either way."""
        received = self.commands_since_reset  # read before the check: a refusal then reports what it saw
        refusal = self.step_refusal(int(request.num_steps), int(request.min_commands_since_reset))
        if refusal:
            response.success, response.message = False, refusal
        else:
            stepped = self.run_steps(int(request.num_steps))
            response.success = stepped == request.num_steps
            response.message = f"stepped {stepped}" + ("" if response.success else " (paused during the call)")
            self.publish_status()
        response.sim_time = time_msg(self.clock_ns)
        response.step_count = self.step_count
        response.commands_since_reset = received
        return response

    def run_steps(self, num_steps: int) -> int:
        """Advance the world num_steps control periods now; return how many ran."""
        raise NotImplementedError
