"""The reference robot as a ROS 2 node: the interface of a ros2_control arm with a RealSense camera.

A thin adapter over ``ReferenceSim``: it validates commands with the shared
``JointCommandFollower`` rules, steps the physics at the profile's control rate (``realtime``) or
only on StepWorld calls (``lockstep``), and publishes joint states, the camera image and
camera_info, /clock, ground-truth task state and WorldStatus on the profile's names.

All callbacks run on one executor thread, so a reset or command can never interleave with a step.
"""
from __future__ import annotations

import sys
import time

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CameraInfo, Image, JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool
from trajectory_msgs.msg import JointTrajectory

from iws_common import qos
from iws_common.commands import CommandRejected, JointCommandFollower
from iws_common.messages import time_msg
from iws_common.profile import load_profile
from iws_common.stats import StepTimer
from iws_common.throttle import KindThrottle
from iws_interfaces.msg import TaskState, WorldStatus
from iws_interfaces.srv import ResetWorld, StepWorld
from iws_reference_robot.observation import ObservationMessages

MODES = ("realtime", "lockstep")


class ReferenceRobotNode(Node):
    def __init__(self):
        super().__init__("reference_robot")
        self.declare_parameter("robot", "reference_arm")
        self.declare_parameter("task", "push_t")
        self.declare_parameter("mode", "realtime")
        self.declare_parameter("seed", 0)
        # Prefixed to every profile name (/real/joint_states), so A/B bringup can run two backends.
        self.declare_parameter("namespace", "")
        self.profile = load_profile(self.get_parameter("robot").value).namespaced(self.get_parameter("namespace").value)
        self.task = str(self.get_parameter("task").value)
        self.mode = str(self.get_parameter("mode").value)
        if self.mode not in MODES:
            raise ValueError(f"parameter mode must be one of {MODES}, got '{self.mode}'")

        from iws_reference_robot.sim import ReferenceSim  # MuJoCo import kept out of module import
        if self.task not in ReferenceSim.TASKS:
            raise ValueError(f"parameter task must be one of {ReferenceSim.TASKS}, got '{self.task}'")
        self.sim = ReferenceSim(self.profile, task=self.task, seed=int(self.get_parameter("seed").value))
        self.sim.reset(int(self.get_parameter("seed").value))
        self.follower = JointCommandFollower(self.profile.joints)
        self.follower.reset(self.sim.joint_positions())
        self.rejection_log = KindThrottle(period_s=1.0)
        self.dt = self.profile.control_period_s
        self.dt_ns = round(self.dt * 1e9)
        # One clock for every stamp, in integer nanoseconds (exact across millions of steps),
        # monotonic across resets; starts at wall time like a real robot's.
        self.clock_ns = int(time.time()) * 1_000_000_000
        self.step_count = 0
        self.paused = False
        self.timer_stats = StepTimer()

        topics, camera = self.profile.topics, self.profile.camera
        self.observation = ObservationMessages(self.profile)
        self.publishers_by_topic = {
            topics.joint_states: self.create_publisher(JointState, topics.joint_states, qos.STATE),
            topics.image: self.create_publisher(Image, topics.image, qos.IMAGE),
            topics.camera_info: self.create_publisher(CameraInfo, topics.camera_info, qos.IMAGE),
            topics.task_state: self.create_publisher(TaskState, topics.task_state, qos.STATE),
        }
        self.pub_clock = self.create_publisher(Clock, topics.clock, qos.CLOCK)
        self.pub_status = self.create_publisher(WorldStatus, topics.world_status, qos.STATE)
        self.create_subscription(Float64MultiArray, topics.position_command, self.on_position_command, qos.COMMAND)
        self.create_subscription(JointTrajectory, topics.trajectory_command, self.on_trajectory, qos.COMMAND)
        self.create_service(ResetWorld, self.profile.services.reset, self.on_reset)
        self.create_service(StepWorld, self.profile.services.step, self.on_step)
        self.create_service(SetBool, self.profile.services.pause, self.on_pause)

        if self.mode == "realtime":
            self.create_timer(self.dt, self.on_control_timer)
        self.create_timer(1.0, self.publish_status)
        self.publish_observation()
        self.get_logger().info(
            f"reference robot up: profile={self.profile.name} task={self.task} mode={self.mode} "
            f"joint_states={self.profile.topics.joint_states} "
            f"camera={camera.width}x{camera.height}@{camera.encoding} control={self.profile.control_rate_hz} Hz")

    # -- commands ---------------------------------------------------------------------------
    def _log_rejection(self, exc: CommandRejected) -> None:
        # One line per kind of problem per second at most: a flood of bad input must not flood the log.
        log_now, suppressed = self.rejection_log.should_log(exc.kind)
        if log_now:
            more = f" (+{suppressed} more of this kind)" if suppressed else ""
            self.get_logger().error(f"rejected command ({exc.kind}): {exc}{more}")

    def on_position_command(self, msg: Float64MultiArray) -> None:
        try:
            before = self.follower.clamped
            self.follower.set_position_command(msg.data)
            if self.follower.clamped != before and self.rejection_log.should_log("clamped")[0]:
                self.get_logger().warning("position command beyond joint limits: clamped to the limits")
        except CommandRejected as exc:
            self._log_rejection(exc)

    def on_trajectory(self, msg: JointTrajectory) -> None:
        try:
            times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
            self.follower.set_trajectory(msg.joint_names, times, [p.positions for p in msg.points], now=self.clock_ns * 1e-9)
        except CommandRejected as exc:
            self._log_rejection(exc)

    # -- stepping ---------------------------------------------------------------------------
    def advance(self) -> None:
        """One control step: follow the command, run the physics, publish the new observation."""
        started = time.perf_counter()
        setpoint = self.follower.step(self.clock_ns * 1e-9, self.dt)
        self.sim.step(setpoint)
        self.clock_ns += self.dt_ns
        self.step_count += 1
        self.publish_observation()
        self.timer_stats.record(started)

    def on_control_timer(self) -> None:
        if not self.paused:
            self.advance()

    def publish_observation(self):
        stamp = time_msg(self.clock_ns)
        self.pub_clock.publish(Clock(clock=stamp))
        messages, _ = self.observation.fill(self.sim, stamp)
        for topic, msg in messages:
            self.publishers_by_topic[topic].publish(msg)
        return stamp

    def publish_status(self) -> None:
        status = WorldStatus(
            backend="reference", model_id=f"mujoco:{self.task}", mode=self.mode,
            sim_time=time_msg(self.clock_ns), step_count=self.step_count,
            achieved_rate_hz=self.timer_stats.rate_hz(), target_rate_hz=self.profile.control_rate_hz,
            step_latency_ms_p50=self.timer_stats.latency_ms(50), step_latency_ms_p95=self.timer_stats.latency_ms(95),
            paused=self.paused, rejected_commands=sum(self.follower.rejected.values()))
        status.header.stamp = time_msg(self.clock_ns)
        self.pub_status.publish(status)

    # -- services ---------------------------------------------------------------------------
    def on_reset(self, request: ResetWorld.Request, response: ResetWorld.Response) -> ResetWorld.Response:
        seed = None if request.seed < 0 else int(request.seed)
        if len(request.images) or len(request.joint_states):
            response.success = False
            response.message = "the reference robot resets from a seed; image/joint-state windows are for the world model"
            return response
        self.sim.reset(seed)
        self.follower.reset(self.sim.joint_positions())
        response.first_frame_stamp = self.publish_observation()
        response.success = True
        response.message = f"reset task {self.task} with seed {'next' if seed is None else seed}"
        self.publish_status()
        return response

    def on_step(self, request: StepWorld.Request, response: StepWorld.Response) -> StepWorld.Response:
        if self.mode != "lockstep":
            response.success, response.message = False, "StepWorld needs mode:=lockstep (this node runs in realtime)"
        elif self.paused:
            response.success, response.message = False, "paused: unpause before stepping"
        else:
            for _ in range(int(request.num_steps)):
                self.advance()
            response.success, response.message = True, f"stepped {request.num_steps}"
            self.publish_status()
        response.sim_time = time_msg(self.clock_ns)
        response.step_count = self.step_count
        return response

    def on_pause(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        self.paused = bool(request.data)
        response.success, response.message = True, "paused" if self.paused else "running"
        self.publish_status()
        return response

    def destroy_node(self) -> None:
        self.sim.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    rclpy.init(args=args)
    try:
        node = ReferenceRobotNode()
    except Exception as exc:  # a bad parameter or profile: one clear line, not a traceback
        print(f"reference_robot: cannot start: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
