"""The interface conformance check, written against the robot profile only.

Any backend that claims to be a robot of a profile (reference robot, world model, a real driver
with iws' services) must pass it unchanged: same topic names and types, offered QoS that any
client can connect to, camera_info consistent with the image, joint names in profile order.
"""
from __future__ import annotations

import time

import numpy as np
from rclpy.qos import ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CameraInfo, Image, JointState

from iws_common import qos
from iws_common.image_conversion import image_to_numpy
from iws_common.profile import RobotProfile

EXPECTED_PUBLISHED = {
    "joint_states": "sensor_msgs/msg/JointState",
    "image": "sensor_msgs/msg/Image",
    "camera_info": "sensor_msgs/msg/CameraInfo",
    "clock": "rosgraph_msgs/msg/Clock",
    "world_status": "iws_interfaces/msg/WorldStatus",
}
EXPECTED_SUBSCRIBED = {
    "position_command": "std_msgs/msg/Float64MultiArray",
    "trajectory_command": "trajectory_msgs/msg/JointTrajectory",
}
EXPECTED_SERVICES = {
    "reset": "iws_interfaces/srv/ResetWorld",
    "step": "iws_interfaces/srv/StepWorld",
    "pause": "std_srvs/srv/SetBool",
}


def _wait_for_graph(node, predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.1)
    return predicate()


def check_interface(client, profile: RobotProfile, step=None) -> dict:
    """Assert the profile's interface; ``step()`` makes the backend publish (lockstep) if given.

    Returns the first image, camera_info and joint state for further checks by the caller.
    """
    node = client.node
    topics = profile.topics

    def graph_has_everything():
        published = dict(node.get_topic_names_and_types())
        services = dict(node.get_service_names_and_types())
        missing = [getattr(topics, k) for k, t in {**EXPECTED_PUBLISHED, **EXPECTED_SUBSCRIBED}.items()
                   if t not in published.get(getattr(topics, k), [])]
        missing += [getattr(profile.services, k) for k, t in EXPECTED_SERVICES.items()
                    if t not in services.get(getattr(profile.services, k), [])]
        # A topic can be in the graph through another node's publisher (A/B's fan-out): wait for
        # the backend's own subscriptions too.
        missing += [getattr(topics, k) for k in EXPECTED_SUBSCRIBED
                    if not node.get_subscriptions_info_by_topic(getattr(topics, k))]
        return not missing or None

    assert _wait_for_graph(node, graph_has_everything), (
        f"interface incomplete; graph topics: {node.get_topic_names_and_types()}, "
        f"services: {node.get_service_names_and_types()}")

    for key in EXPECTED_PUBLISHED:
        infos = node.get_publishers_info_by_topic(getattr(topics, key))
        assert infos, f"nobody publishes {getattr(topics, key)}"
        for info in infos:
            # RELIABLE offers serve both reliable and best-effort subscribers.
            assert info.qos_profile.reliability == ReliabilityPolicy.RELIABLE, (
                f"{getattr(topics, key)} offered {info.qos_profile.reliability}, expected RELIABLE")
    for key in EXPECTED_SUBSCRIBED:
        assert node.get_subscriptions_info_by_topic(getattr(topics, key)), f"nobody subscribes {getattr(topics, key)}"

    images = client.collect(Image, topics.image, qos.IMAGE_SUBSCRIBER)
    infos = client.collect(CameraInfo, topics.camera_info, qos.IMAGE_SUBSCRIBER)
    joints = client.collect(JointState, topics.joint_states, qos.STATE)
    clocks = client.collect(Clock, topics.clock, qos.CLOCK)
    deadline = time.monotonic() + 20.0
    while not (images and infos and joints and clocks) and time.monotonic() < deadline:
        if step is not None:
            step()
        time.sleep(0.2)
    assert images and infos and joints and clocks, (
        f"missing data: images={len(images)} camera_info={len(infos)} joint_states={len(joints)} clock={len(clocks)}")

    image, info, joint_state = images[-1], infos[-1], joints[-1]
    camera = profile.camera
    assert (image.width, image.height, image.encoding) == (camera.width, camera.height, camera.encoding)
    assert image.step >= image.width * (1 if camera.encoding == "mono8" else 3)
    assert image.header.frame_id == camera.frame_id
    pixels = image_to_numpy(image, want=None)
    assert pixels.shape[:2] == (camera.height, camera.width)
    assert (info.width, info.height) == (image.width, image.height), "camera_info size differs from the image"
    assert info.header.frame_id == image.header.frame_id
    np.testing.assert_allclose(info.k, camera.intrinsics_matrix(), rtol=1e-6)
    assert info.p[0] == info.k[0] and info.p[5] == info.k[4], "projection does not match intrinsics"
    assert list(joint_state.name) == list(profile.joints.names)
    assert len(joint_state.position) == profile.joints.count
    assert np.all(np.isfinite(joint_state.position))
    return {"image": image, "camera_info": info, "joint_state": joint_state}
