"""Helpers for tests that talk to real nodes in other processes over DDS.

Each test gets its own ROS_DOMAIN_ID so that tests never hear each other; nodes run as
subprocesses under that domain, and the test process joins the same domain as a client.
"""
from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path


import time

import numpy as np
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from iws_bringup.backends import get_backend, ros_arguments
from iws_common import qos
from iws_common.commands import step_when_commands_arrive
from iws_common.image_conversion import image_to_numpy
from iws_common.messages import stamp_ns
from iws_interfaces.msg import TaskState, WorldStatus
from iws_interfaces.srv import ResetWorld, StepWorld
from iws_common.client import RosClient  # noqa: F401  (re-exported for the tests)
from iws_common.processes import NodeProcess, ros_env  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
_domains = itertools.count(os.getpid() * 7)


def next_domain_id() -> int:
    """A domain per test (10..89), varied by process so that concurrent test runs rarely meet."""
    return 10 + next(_domains) % 80


def backend_args(backend: str, **params) -> list[str]:
    """The command line of a backend's node, from config/bringup.yaml like `iws up`."""
    module = get_backend(backend).entry_point.split(":")[0]
    return [sys.executable, "-m", module] + ros_arguments(params)


class LockstepClient:
    """A client of a lockstep backend, written against the profile only (so it runs unchanged
    against the reference robot and the world model), and the streams a test looks at."""

    def __init__(self, client, profile):
        self.client = client
        T, self.services = profile.topics, profile.services
        self.images = client.collect(Image, T.image, qos.IMAGE_LOSSLESS)
        self.joints = client.collect(JointState, T.joint_states)
        self.status = client.collect(WorldStatus, T.world_status)
        self.task_state = client.collect(TaskState, T.task_state)
        self.command = client.publisher(Float64MultiArray, T.position_command)
        self.trajectory = client.publisher(JointTrajectory, T.trajectory_command)
        client.wait_for_subscribers(self.command)
        client.wait_for_subscribers(self.trajectory)
        self.commands_sent = 0  # position commands sent by send() since the last reset()

    def step(self, n: int = 1) -> StepWorld.Response:
        """Step n periods once every command sent since the reset is in force (a command and
        StepWorld travel on different channels: ``min_commands_since_reset`` keeps the step from
        overtaking it; while one is in flight the backend refuses and the call is made again)."""
        before = len(self.images)
        request = StepWorld.Request(num_steps=n, min_commands_since_reset=self.commands_sent)
        response = step_when_commands_arrive(lambda: self.client.call(StepWorld, self.services.step, request),
                                             self.commands_sent)  # a step, or refused for good (paused)
        assert response.success, response.message
        self.client.wait_for(self.images, before + n, timeout=10)
        return response

    def reset(self, seed: int, **request) -> ResetWorld.Response:
        """Reset (``request``: more ResetWorld fields, e.g. a window's images and joint_states) and
        wait for the reset's own first frame and joint state (by stamp)."""
        response = self.client.call(ResetWorld, self.services.reset, ResetWorld.Request(seed=seed, **request), timeout=60)
        assert response.success, response.message
        self.commands_sent = 0
        stamp = stamp_ns(response.first_frame_stamp)
        deadline = time.monotonic() + 10
        while not (self.images and stamp_ns(self.images[-1].header.stamp) == stamp
                   and self.joints and stamp_ns(self.joints[-1].header.stamp) == stamp):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no image and joint state stamped {stamp} (the reset's first frame) within 10 s")
            time.sleep(0.01)
        return response

    def send(self, values, settle: float = 0.0) -> None:
        """Publish a command; the next ``step`` waits until the backend has it. ``settle``: seconds
        to wait after it, for another subscriber (a recorder) to receive it before the step's frame."""
        self.command.publish(Float64MultiArray(data=[float(v) for v in values]))
        self.commands_sent += 1
        time.sleep(settle)

    def step_until_at(self, target, atol: float = 0.05, max_steps: int = 60) -> int:
        """Step one at a time until the joints are within ``atol`` of ``target``; returns the steps
        taken. A command travels on another channel than StepWorld, so on a loaded machine it may
        arrive a few steps late: what is tested is that it arrives and is followed."""
        target = np.asarray(target, dtype=np.float64)
        for taken in range(1, max_steps + 1):
            self.step(1)
            if np.abs(self.latest_joints() - target).max() <= atol:
                return taken
        raise AssertionError(f"joints {self.latest_joints()} did not reach {target} within {max_steps} steps")

    def latest_pixels(self) -> np.ndarray:
        return image_to_numpy(self.images[-1]).astype(np.int16)

    def latest_joints(self) -> np.ndarray:
        return np.asarray(self.joints[-1].position)
