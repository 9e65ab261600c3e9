"""A stand-in for a real arm driver, started the ordinary way (no iws environment): it publishes
the profile's joint states and subscribes its command topics, like ros2_control's controllers.

    python test/hardware_standin.py PROFILE COUNT_FILE

Every command it receives is counted; the count is written to COUNT_FILE on every message and at
exit, so a test can tell whether anything meant for a simulator reached "the hardware".
"""
import signal
import sys
from pathlib import Path

import rclpy
from rclpy.executors import ExternalShutdownException
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from iws_common import qos
from iws_common.profile import load_profile


def main() -> int:
    profile, count_file = load_profile(sys.argv[1]), Path(sys.argv[2])
    rclpy.init()
    node = rclpy.create_node("controller_manager", namespace="/hardware_driver")
    received = [0]

    def on_command(_msg):
        received[0] += 1
        count_file.write_text(str(received[0]))

    topics = profile.topics
    node.create_subscription(Float64MultiArray, topics.position_command, on_command, qos.COMMAND)
    node.create_subscription(JointTrajectory, topics.trajectory_command, on_command, qos.COMMAND)
    publisher = node.create_publisher(JointState, topics.joint_states, qos.STATE)
    state = JointState(name=list(profile.joints.names), position=list(profile.joints.home))
    node.create_timer(0.1, lambda: publisher.publish(state))
    count_file.write_text("0")
    signal.signal(signal.SIGTERM, lambda *_: rclpy.try_shutdown())
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    count_file.write_text(str(received[0]))
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
