"""The world model as a ROS 2 robot: the arm's topics, served from a trained checkpoint.

A thin adapter over ``iws_world_model.WorldModel``. Commands are validated and followed by the same
``JointCommandFollower`` as the reference robot; the command in force at each control step is the
model's action. Inference runs on a dedicated thread, never on the executor's callback thread:
in ``realtime`` it ticks at the profile's control rate and drops ticks it cannot keep (stale frames
are never queued; the achieved rate goes to WorldStatus); in ``lockstep`` StepWorld hands N steps
to the same thread and waits for them. One lock guards the model, so a reset during a step waits
for that step to end.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time

import numpy as np
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.executors import MultiThreadedExecutor
from sensor_msgs.msg import CameraInfo, Image, JointState

from iws_common import qos
from iws_common.image_conversion import convert_encoding, image_to_numpy, numpy_to_image
from iws_common.messages import camera_info_msg
from iws_common.profile import default_model_dir
from iws_common.run import run_node
from iws_common.simulator_node import SimulatorNode
from iws_interfaces.srv import ResetWorld


GIL_SWITCH_INTERVAL_S = 1e-4


class WorldModelNode(SimulatorNode):
    backend = "world_model"

    def __init__(self):
        commands = MutuallyExclusiveCallbackGroup()
        super().__init__("world_model", command_group=commands)
        self.declare_parameter("model", "")
        self.declare_parameter("start_dataset", "")
        self.declare_parameter("native_resolution", False)
        self.declare_parameter("threads", 1)
        self.declare_parameter("decode_steps", 0)
        self.declare_parameter("dynamics_steps", 0)  # 0 = the model's own
        # What a reset draws once instead of every step ("" = the model's own config: none|decoder|all).
        self.declare_parameter("frozen_noise", "")
        # Real-time tick rate; 0 = the profile's control rate. Each step still advances sim time by one
        # control period (what the model was trained on): the override measures capacity, e.g. at 15 Hz.
        # Dynamically typed so that `-p rate_hz:=15` (an integer on the command line) is accepted too.
        self.declare_parameter("rate_hz", 0.0, ParameterDescriptor(dynamic_typing=True))
        rate_hz = self.get_parameter("rate_hz").value
        if not isinstance(rate_hz, (int, float)) or isinstance(rate_hz, bool) or not (0.0 <= rate_hz < float("inf")):
            raise ValueError(f"parameter rate_hz must be >= 0 (0 = the profile's control rate), got {rate_hz}")
        if rate_hz > 0:
            self.target_rate_hz = float(rate_hz)
        self.tick_period = 1.0 / self.target_rate_hz
        self.model_path = str(self.get_parameter("model").value) or str(default_model_dir())

        # torch and the model load here, so a bad profile or mode fails before the slow part.
        import torch

        from iws_world_model.start_windows import load_start_windows, windows_from_dataset
        from iws_world_model.world_model import WorldModel, upscale
        threads = int(self.get_parameter("threads").value)
        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        decode_steps = int(self.get_parameter("decode_steps").value) or None
        dynamics_steps = int(self.get_parameter("dynamics_steps").value) or None
        frozen_noise = str(self.get_parameter("frozen_noise").value) or None  # checked by WorldModel's config
        self.world = WorldModel.load(self.model_path, threads=threads, decode_steps=decode_steps,
                                     dynamics_steps=dynamics_steps, frozen_noise=frozen_noise,
                                     max_command_step=self.profile.max_joint_step())
        self._upscale = upscale
        if self.world.joint_dim != self.profile.joints.count:
            raise ValueError(f"model {self.model_path} predicts {self.world.joint_dim} joints, "
                             f"profile {self.profile.name} has {self.profile.joints.count}")
        dataset_path = str(self.get_parameter("start_dataset").value)
        if dataset_path:
            from iws_data.dataset import Dataset
            self.windows = windows_from_dataset(Dataset(dataset_path), self.world.config.window, count=64)
        else:
            self.windows = load_start_windows(self.model_path)
        self.model_id = os.path.basename(os.path.normpath(self.model_path))
        if frozen_noise is not None and frozen_noise != self.world.config.frozen_noise:
            self.model_id += f"+frozen_noise={frozen_noise}"  # as checkpoint.model_identity names an override

        camera = self.profile.camera
        self.native = bool(self.get_parameter("native_resolution").value)
        size = self.world.image_size
        self.camera = camera.scaled(size, size) if self.native else camera
        self.dropped_ticks = 0
        self.world_lock = threading.Lock()  # the model, the follower's stepping and the clock
        self.last_joints = None

        topics = self.profile.topics
        self.pub_joint_states = self.create_publisher(JointState, topics.joint_states, qos.STATE)
        self.pub_image = self.create_publisher(Image, topics.image, qos.IMAGE)
        self.pub_camera_info = self.create_publisher(CameraInfo, topics.camera_info, qos.IMAGE)
        # StepWorld waits on the inference thread: a reentrant group lets reset, pause and status go on.
        self.create_world_services(callback_group=ReentrantCallbackGroup())
        self.create_timer(1.0, self.publish_status, callback_group=MutuallyExclusiveCallbackGroup())

        self.image_msg = Image()
        self.camera_info = camera_info_msg(self.camera, self.camera.frame_id)
        self.joint_state_msg = JointState(name=list(self.profile.joints.names))

        with self.world_lock:
            self._reset_to_window(0, self.seed)
            self.publish_observation(self._last_image, self._last_joints)
        self._requests: queue.Queue = queue.Queue()
        self._running = True
        self._worker = threading.Thread(target=self._inference_loop, name="world_model_inference", daemon=True)
        self._worker.start()
        self.get_logger().info(
            f"world model up: model={self.model_path} profile={self.profile.name} mode={self.mode} "
            f"joint_states={self.profile.topics.joint_states} "
            f"model image {size}x{size} -> published {self.camera.width}x{self.camera.height} "
            f"control={self.profile.control_rate_hz} Hz tick={self.target_rate_hz:g} Hz threads={threads} "
            f"frozen_noise={self.world.frozen_noise}")

    # -- state ------------------------------------------------------------------------------
    def _reset_to_window(self, index: int, seed: int | None) -> None:
        """Start from start window ``index`` (mod the number shipped). Caller holds world_lock."""
        w = self.windows
        i = index % len(w["images"])
        self._start_from(w["images"][i], w["joint_positions"][i], w["actions"][i], seed)

    def _start_from(self, images, joints, actions, seed) -> None:
        self.world.reset(images, joints, actions, seed=seed)
        self.reset_follower(actions[-1])
        self._last_image = self._camera_image(np.asarray(images[-1]))
        self._last_joints = np.asarray(joints[-1], dtype=np.float64)
        self.last_joints = None

    def _camera_image(self, image: np.ndarray) -> np.ndarray:
        h, w = self.camera.height, self.camera.width
        if image.shape[:2] != (h, w):
            image = self._upscale(image, h, w)
        if self.camera.encoding != "rgb8":
            image = convert_encoding(image, "rgb8", self.camera.encoding)
        return image

    # -- stepping ---------------------------------------------------------------------------
    def advance(self, release_at: float | None = None) -> None:
        """One control step: the command in force is the action; predict, then publish, in realtime
        not before ``release_at`` (time.monotonic()), so that frames leave at a steady rate."""
        started = time.perf_counter()
        with self.world_lock:
            _, action = self.follow_commands()  # the target in force (a running trajectory sampled)
            image, joints = self.world.step(action)
            self.clock_ns += self.dt_ns
            self.step_count += 1
            self._last_image, self._last_joints = self._camera_image(image), joints.astype(np.float64)
            self.timer_stats.record(started)  # compute time: what the lead below is sized from
            if release_at is not None:
                wait = release_at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            self.publish_observation(self._last_image, self._last_joints)

    def _compute_lead(self) -> float:
        """How long before a frame's release its step starts: the recent p95 step time with a
        margin, at most 80 % of a tick. The command in force at that moment drives the frame."""
        if len(self.timer_stats.latencies) < 10:
            return 0.5 * self.tick_period
        return min(0.8 * self.tick_period, 1.25 * self.timer_stats.latency_ms(95) * 1e-3 + 0.003)

    def _inference_loop(self) -> None:
        """Run the world until shutdown; an unexpected error in one step is logged, never fatal."""
        while self._running and rclpy.ok(context=self.context):
            try:
                self._run_ticks()
            except Exception as exc:  # noqa: BLE001 - a dead inference thread would be a silent robot
                if not (self._running and rclpy.ok(context=self.context)):
                    return  # shutting down: the publishers' context is gone
                self.log_refusal("step_error", f"world model step failed: {type(exc).__name__}: {exc}")
                time.sleep(0.01)

    def _run_ticks(self) -> None:
        # Realtime: frame k is released at next_release; its step starts a lead earlier (a camera's
        # exposure and transfer, in effect), so releases are periodic even though steps vary.
        next_release = time.monotonic() + self.tick_period
        while self._running and rclpy.ok(context=self.context):
            if self.mode == "lockstep":
                try:
                    request = self._requests.get(timeout=0.2)
                except queue.Empty:
                    continue
                num_steps, done = request
                try:
                    for _ in range(num_steps):
                        if self.paused:
                            break
                        self.advance()
                finally:
                    done.set()
                continue
            lead = self._compute_lead()
            now = time.monotonic()
            if now < next_release - lead:
                time.sleep(min(next_release - lead - now, 0.05))
                continue
            if not self.paused:
                self.advance(release_at=next_release)
            next_release += self.tick_period
            late = time.monotonic() - (next_release - lead)
            if late >= self.tick_period:
                # A whole period behind: drop the missed ticks instead of queueing stale frames. Less
                # than a period late, the next step starts at once and the schedule catches up.
                missed = int(late // self.tick_period)
                self.dropped_ticks += missed
                next_release += missed * self.tick_period
                if self.rejection_log.should_log("overrun")[0]:
                    self.get_logger().warning(
                        f"cannot keep {self.target_rate_hz:.1f} Hz: achieved "
                        f"{self.timer_stats.rate_hz():.1f} Hz, step p50 {self.timer_stats.latency_ms(50):.1f} ms")

    def publish_observation(self, image: np.ndarray, joints: np.ndarray):
        stamp = self.publish_clock()
        js = self.joint_state_msg
        js.header.stamp = stamp
        js.position = joints.tolist()
        velocity = (joints - self.last_joints) / self.dt if self.last_joints is not None else np.zeros_like(joints)
        js.velocity = velocity.tolist()
        self.last_joints = joints
        self.pub_joint_states.publish(js)
        numpy_to_image(image, self.camera.encoding, msg=self.image_msg, stamp=stamp, frame_id=self.camera.frame_id)
        self.pub_image.publish(self.image_msg)
        self.camera_info.header.stamp = stamp
        self.pub_camera_info.publish(self.camera_info)
        return stamp

    # -- services ---------------------------------------------------------------------------
    def on_reset(self, request: ResetWorld.Request, response: ResetWorld.Response) -> ResetWorld.Response:
        try:
            # The seed (< 0: a fresh one) fixes the model's noise, so an evaluation's rerun replays it.
            seed = None if request.seed < 0 else int(request.seed)
            with self.world_lock:
                if len(request.images):
                    self._reset_to_supplied(request, seed)
                    response.message = (f"reset to a supplied window of {len(request.images)} frames, "
                                        f"seed {'fresh' if seed is None else seed}")
                else:
                    self._reset_to_window(int(request.episode_index), seed)
                    response.message = f"reset to start window {request.episode_index % len(self.windows['images'])}"
                self.begin_episode_after_reset()
                response.first_frame_stamp = self.publish_observation(self._last_image, self._last_joints)
            response.success = True
        except Exception as exc:  # noqa: BLE001 - a bad window is the client's problem, never the node's
            response.success, response.message = False, f"reset refused: {type(exc).__name__}: {exc}"
            self.log_refusal("reset", response.message)
        self.publish_status()
        return response

    def _reset_to_supplied(self, request: ResetWorld.Request, seed: int | None) -> None:
        if len(request.joint_states) != len(request.images):
            raise ValueError(f"{len(request.images)} images but {len(request.joint_states)} joint states")
        names = list(self.profile.joints.names)
        images, joints = [], []
        for image_msg, joint_msg in zip(request.images, request.joint_states):
            images.append(image_to_numpy(image_msg))
            if sorted(joint_msg.name) != sorted(names):
                raise ValueError(f"joint state names {list(joint_msg.name)} do not match the profile {names}")
            by_name = dict(zip(joint_msg.name, joint_msg.position))
            joints.append([by_name[n] for n in names])
        images = np.stack(images)
        joints = np.asarray(joints, dtype=np.float32)
        if not np.all(np.isfinite(joints)):
            raise ValueError("joint states hold NaN or inf")
        # The commands that produced a supplied window are unknown: hold the observed positions.
        self._start_from(images, joints, joints.copy(), seed)

    def run_steps(self, num_steps: int) -> int:
        """On the inference thread, which owns the model; a pause during the call stops it early."""
        done = threading.Event()
        before = self.step_count
        self._requests.put((num_steps, done))
        done.wait()
        return self.step_count - before

    def destroy_node(self) -> None:
        self._running = False
        worker = getattr(self, "_worker", None)  # absent when start-up failed
        if worker is not None:
            worker.join(5)
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    # The inference thread runs many short torch calls, each taking the GIL back; with Python's default
    # 5 ms switch interval a busy executor thread (a command flood) made each of them wait, and the
    # step rate collapsed from 10 Hz to 1.2 Hz under 400 commands/s. 0.1 ms keeps the rate (iws bench fuzz).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    return run_node(WorldModelNode, "world_model", MultiThreadedExecutor, args, simulator=True, num_threads=2)


if __name__ == "__main__":
    sys.exit(main())
