"""The scripted push_t expert as a ROS policy node that sees only what a real policy sees.

It subscribes to the profile's camera image and joint states, estimates the T's pose from the
pixels (``perception.PushTPoseEstimator``), and publishes joint position commands. It never reads
simulator ground truth, so it drives the reference robot, the world model and a real arm alike.
"""
from __future__ import annotations

import threading

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

from iws_common import qos
from iws_common.image_conversion import image_to_numpy
from iws_common.profile import RobotProfile

from .pixel_expert import PushTExpertPolicy


class ExpertPolicyNode(Node):
    """Acts once per received image, on the latest joint state."""

    def __init__(self, profile: RobotProfile, seed: int = 0, name: str = "push_t_expert_policy", **node_kwargs):
        super().__init__(name, **node_kwargs)
        self.profile = profile
        self.policy = PushTExpertPolicy(profile, seed)
        self.joint_positions: np.ndarray | None = None
        self.commands_sent = 0
        self.lock = threading.Lock()
        self.publisher = self.create_publisher(Float64MultiArray, profile.topics.position_command, qos.COMMAND)
        self.create_subscription(JointState, profile.topics.joint_states, self.on_joint_state, qos.STATE)
        self.create_subscription(Image, profile.topics.image, self.on_image, qos.IMAGE_SUBSCRIBER)

    def on_joint_state(self, msg: JointState) -> None:
        by_name = dict(zip(msg.name, msg.position))
        if all(n in by_name for n in self.profile.joints.names):
            self.joint_positions = np.array([by_name[n] for n in self.profile.joints.names])

    def on_image(self, msg: Image) -> None:
        if self.joint_positions is None:
            return
        with self.lock:
            command = self.policy.act(image_to_numpy(msg), self.joint_positions)
        if command is not None:
            self.publisher.publish(Float64MultiArray(data=[float(v) for v in command]))
            self.commands_sent += 1

    def destroy_node(self) -> None:
        self.policy.close()
        super().destroy_node()
