"""The A/B command fan-out: one command stream drives every side of an A/B bringup.

Subscribes to the profile's command topics at the top level (``/forward_position_controller/commands``,
``/joint_trajectory_controller/joint_trajectory``) and republishes each message unchanged into
every namespace (``/real/...``, ``/sim/...``), so a policy or teleop written for one robot drives
the reference robot and the world model with the very same commands. Validation stays with the
backends (each applies iws_common.commands), so both see, and reject, the same input.
"""
from __future__ import annotations

import sys

from rclpy.exceptions import ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from iws_common import qos
from iws_common.profile import load_profile, normalize_namespace
from iws_common.run import run_node


class CommandFanout(Node):
    def __init__(self, **node_kwargs):
        super().__init__("command_fanout", **node_kwargs)
        self.declare_parameter("robot", "reference_arm")
        self.declare_parameter("namespaces", Parameter.Type.STRING_ARRAY)
        try:
            given = self.get_parameter("namespaces").value or []
        except ParameterUninitializedException:
            raise ValueError("parameter namespaces is required, e.g. -p namespaces:=[/real,/sim]") from None
        namespaces = [normalize_namespace(ns) for ns in given]
        if not namespaces or "" in namespaces or len(set(namespaces)) != len(namespaces):
            # The top level is the input: fanning out to it would feed every message back to itself.
            raise ValueError(f"parameter namespaces must list distinct, non-empty namespaces, got {namespaces}")
        profile = load_profile(self.get_parameter("robot").value)
        self.namespaces = namespaces
        self.forwarded = 0
        for kind, msg_type in (("position_command", Float64MultiArray), ("trajectory_command", JointTrajectory)):
            source = getattr(profile.topics, kind)
            targets = [self.create_publisher(msg_type, getattr(profile.namespaced(ns).topics, kind), qos.COMMAND)
                       for ns in namespaces]
            self.create_subscription(msg_type, source, self._forward_to(targets), qos.COMMAND)
        self.get_logger().info(f"command fan-out: {profile.topics.position_command} and "
                               f"{profile.topics.trajectory_command} -> {', '.join(namespaces)}")

    def _forward_to(self, publishers):
        def forward(msg) -> None:
            for publisher in publishers:
                publisher.publish(msg)
            self.forwarded += 1
        return forward


def main(args: list[str] | None = None) -> int:
    return run_node(CommandFanout, "command_fanout", args=args)


if __name__ == "__main__":
    sys.exit(main())
