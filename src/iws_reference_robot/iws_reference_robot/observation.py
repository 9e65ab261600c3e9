"""The reference robot's observation messages, built in one place.

The ROS node publishes them and in-process data collection serialises them into bags, so a bag
written either way holds identical messages (same fields, frames and stamps).
"""
from __future__ import annotations

import numpy as np
from sensor_msgs.msg import Image, JointState

from iws_common.image_conversion import convert_encoding, numpy_to_image
from iws_common.messages import camera_info_msg
from iws_common.profile import RobotProfile
from iws_interfaces.msg import TaskState


class ObservationMessages:
    """Joint states, camera image, camera_info and task state, allocated once, refilled per step."""

    def __init__(self, profile: RobotProfile):
        self.profile = profile
        self.joint_states = JointState(name=list(profile.joints.names))
        self.image = Image()
        self.camera_info = camera_info_msg(profile.camera, profile.camera.frame_id)
        self.task_state = TaskState()
        self.task_state.header.frame_id = profile.base_frame

    def fill(self, sim, stamp):
        """Refill from ``sim`` at ``stamp``; returns ([(topic, message)...], ground-truth task state)."""
        topics, camera = self.profile.topics, self.profile.camera
        js = self.joint_states
        js.header.stamp = stamp
        js.position = sim.joint_positions().tolist()
        js.velocity = sim.joint_velocities().tolist()
        pixels = sim.render()
        if camera.encoding != "rgb8":
            pixels = convert_encoding(pixels, "rgb8", camera.encoding)
        numpy_to_image(pixels, camera.encoding, msg=self.image, stamp=stamp, frame_id=camera.frame_id)
        self.camera_info.header.stamp = stamp
        state = sim.task_state()
        ts = self.task_state
        ts.header.stamp = stamp
        ts.task, ts.score, ts.success = state.task, float(state.score), bool(state.success)
        ts.object_poses = np.asarray(state.object_poses, dtype=np.float64).ravel().tolist()
        ts.goal_pose = np.asarray(state.goal_pose, dtype=np.float64).ravel().tolist()
        messages = [(topics.joint_states, js), (topics.image, self.image),
                    (topics.camera_info, self.camera_info), (topics.task_state, ts)]
        return messages, state
