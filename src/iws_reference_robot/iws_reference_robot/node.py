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

from rclpy.executors import SingleThreadedExecutor
from sensor_msgs.msg import CameraInfo, Image, JointState

from iws_common import qos
from iws_common.run import run_node
from iws_common.simulator_node import SimulatorNode
from iws_interfaces.msg import TaskState
from iws_interfaces.srv import ResetWorld
from iws_reference_robot.observation import ObservationMessages


class ReferenceRobotNode(SimulatorNode):
    backend = "reference"

    def __init__(self):
        super().__init__("reference_robot")
        self.declare_parameter("task", "push_t")
        self.task = str(self.get_parameter("task").value)
        from iws_reference_robot.sim import ReferenceSim  # MuJoCo import kept out of module import
        if self.task not in ReferenceSim.TASKS:
            raise ValueError(f"parameter task must be one of {ReferenceSim.TASKS}, got '{self.task}'")
        self.model_id = f"mujoco:{self.task}"
        self.sim = ReferenceSim(self.profile, task=self.task, seed=self.seed)
        self.sim.reset(self.seed)
        self.reset_follower(self.sim.joint_positions())

        topics, camera = self.profile.topics, self.profile.camera
        self.observation = ObservationMessages(self.profile)
        self.publishers_by_topic = {
            topics.joint_states: self.create_publisher(JointState, topics.joint_states, qos.STATE),
            topics.image: self.create_publisher(Image, topics.image, qos.IMAGE),
            topics.camera_info: self.create_publisher(CameraInfo, topics.camera_info, qos.IMAGE),
            topics.task_state: self.create_publisher(TaskState, topics.task_state, qos.STATE),
        }
        self.create_world_services()
        if self.mode == "realtime":
            self.create_timer(self.dt, self.on_control_timer)
        self.create_timer(1.0, self.publish_status)
        self.publish_observation()
        self.get_logger().info(
            f"reference robot up: profile={self.profile.name} task={self.task} mode={self.mode} "
            f"joint_states={self.profile.topics.joint_states} "
            f"camera={camera.width}x{camera.height}@{camera.encoding} control={self.profile.control_rate_hz} Hz")

    # -- stepping ---------------------------------------------------------------------------
    def advance(self) -> None:
        """One control step: follow the command, run the physics, publish the new observation."""
        started = time.perf_counter()
        setpoint, _ = self.follow_commands()
        self.sim.step(setpoint)
        self.clock_ns += self.dt_ns
        self.step_count += 1
        self.publish_observation()
        self.timer_stats.record(started)

    def on_control_timer(self) -> None:
        if not self.paused:
            self.advance()

    def publish_observation(self):
        stamp = self.publish_clock()
        messages, _ = self.observation.fill(self.sim, stamp)
        for topic, msg in messages:
            self.publishers_by_topic[topic].publish(msg)
        return stamp

    # -- services ---------------------------------------------------------------------------
    def on_reset(self, request: ResetWorld.Request, response: ResetWorld.Response) -> ResetWorld.Response:
        seed = None if request.seed < 0 else int(request.seed)
        if len(request.images) or len(request.joint_states):
            response.success = False
            response.message = "the reference robot resets from a seed; image/joint-state windows are for the world model"
            self.log_refusal("reset", response.message)
            return response
        self.sim.reset(seed)
        self.reset_follower(self.sim.joint_positions())
        self.begin_episode_after_reset()
        response.first_frame_stamp = self.publish_observation()
        response.success = True
        response.message = f"reset task {self.task} with seed {'next' if seed is None else seed}"
        self.publish_status()
        return response

    def run_steps(self, num_steps: int) -> int:
        for _ in range(num_steps):
            self.advance()
        return num_steps

    def destroy_node(self) -> None:
        if hasattr(self, "sim"):  # absent when start-up was refused
            self.sim.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    return run_node(ReferenceRobotNode, "reference_robot", SingleThreadedExecutor, args, simulator=True)


if __name__ == "__main__":
    sys.exit(main())
