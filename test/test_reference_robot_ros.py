"""The reference robot over ROS: a real node process, a real client, Fast DDS in between."""
from __future__ import annotations

import time

import numpy as np
import pytest
from builtin_interfaces.msg import Duration
from sensor_msgs.msg import Image
from std_srvs.srv import SetBool
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from conformance import check_interface
from ros_harness import LockstepClient
from iws_common import qos
from iws_common.image_conversion import image_to_numpy
from iws_common.messages import stamp_ns
from iws_common.profile import load_profile

from iws_interfaces.srv import StepWorld

PROFILE = load_profile("reference_arm")
T, S = PROFILE.topics, PROFILE.services


@pytest.fixture
def lockstep(start_reference, ros_client):
    node = start_reference(mode="lockstep", task="push_t", seed=3)
    robot = LockstepClient(ros_client, PROFILE)
    robot.client.call(StepWorld, S.step, StepWorld.Request(num_steps=1))
    robot.node = node
    return robot


def test_interface_conforms_to_profile(start_reference, ros_client):
    start_reference(mode="realtime", task="push_t")
    first = check_interface(ros_client, PROFILE)
    assert image_to_numpy(first["image"]).std() > 5, "the camera image is blank"


def test_realtime_mode_publishes_at_control_rate(start_reference, ros_client):
    start_reference(mode="realtime", task="push_t")
    images = ros_client.collect(Image, T.image, qos.IMAGE_SUBSCRIBER)
    ros_client.wait_for(images, 3, timeout=20)
    start, count = time.monotonic(), len(images)
    time.sleep(3.0)
    rate = (len(images) - count) / (time.monotonic() - start)
    assert 0.6 * PROFILE.control_rate_hz <= rate <= 1.3 * PROFILE.control_rate_hz, f"published at {rate:.1f} Hz"


def test_lockstep_steps_exactly_n(lockstep):
    time.sleep(0.5)
    images_before, joints_before = len(lockstep.images), len(lockstep.joints)
    first = lockstep.client.call(StepWorld, S.step, StepWorld.Request(num_steps=1))
    response = lockstep.step(7)
    time.sleep(1.0)  # nothing else may arrive: the world does not move between calls
    assert len(lockstep.images) - images_before == 8
    assert len(lockstep.joints) - joints_before == 8
    assert response.step_count - first.step_count == 7
    dt_ns = round(1e9 / PROFILE.control_rate_hz)
    assert stamp_ns(response.sim_time) - stamp_ns(first.sim_time) == 7 * dt_ns
    stamps = [stamp_ns(m.header.stamp) for m in lockstep.images[-8:]]
    assert np.all(np.diff(stamps) == dt_ns), "frames must be one control period apart"


def test_command_moves_joints_and_changes_image(lockstep):
    start_joints, start_pixels = lockstep.latest_joints(), lockstep.latest_pixels()
    target = np.asarray(PROFILE.joints.home) + np.array([0.6, -0.5, 0.8])
    lockstep.send(target)
    steps = lockstep.step_until_at(target)
    assert steps >= 3, "0.8 rad at 3 rad/s takes at least 3 control steps"
    moved = lockstep.latest_joints()
    assert np.abs(moved - start_joints).max() > 0.3
    assert np.abs(lockstep.latest_pixels() - start_pixels).mean() > 0.5, "the arm moved but the image did not change"


def test_trajectory_is_followed(lockstep):
    start = lockstep.latest_joints()
    goal = np.asarray(PROFILE.joints.home) + np.array([0.4, -0.3, 0.5])
    names = list(PROFILE.joints.names)
    order = [2, 0, 1]  # any joint order is accepted
    msg = JointTrajectory(joint_names=[names[i] for i in order])
    msg.points = [JointTrajectoryPoint(positions=[float(goal[i]) for i in order], time_from_start=Duration(sec=1))]
    lockstep.trajectory.publish(msg)
    for _ in range(30):  # the trajectory starts when it arrives
        lockstep.step(1)
        if np.abs(lockstep.latest_joints() - start).max() > 1e-4:
            break
    lockstep.step(4)
    halfway = lockstep.latest_joints()
    lockstep.step_until_at(goal, max_steps=15)
    progress = np.abs(halfway - start) / np.abs(goal - start)
    assert np.all((progress > 0.2) & (progress < 0.9)), f"not interpolated over 1 s: {progress}"


def test_reset_restores_initial_state(lockstep):
    first = lockstep.reset(11)
    pixels, joints = lockstep.latest_pixels(), lockstep.latest_joints()
    lockstep.send(np.asarray(PROFILE.joints.home) + 0.5)
    lockstep.step_until_at(np.asarray(PROFILE.joints.home) + 0.5)
    assert np.abs(lockstep.latest_joints() - joints).max() > 0.2
    last_step_stamp = stamp_ns(lockstep.images[-1].header.stamp)
    second = lockstep.reset(11)
    assert stamp_ns(first.first_frame_stamp) < last_step_stamp < stamp_ns(second.first_frame_stamp), \
        "the clock must not go back on reset, and a reset's first frame needs a stamp of its own"
    np.testing.assert_allclose(lockstep.latest_joints(), joints, atol=1e-9)
    assert np.array_equal(lockstep.latest_pixels(), pixels)
    lockstep.reset(12)
    assert not np.array_equal(lockstep.latest_pixels(), pixels), "another seed should give another scene"


def test_a_step_waits_for_the_commands_sent_before_it(lockstep):
    """min_commands_since_reset: a step that would overtake a command in flight refuses instead."""
    lockstep.reset(4)
    ask = StepWorld.Request(num_steps=1, min_commands_since_reset=1)
    early = lockstep.client.call(StepWorld, S.step, ask)
    assert not early.success and "waiting for commands" in early.message
    assert early.commands_since_reset == 0
    lockstep.send(np.asarray(PROFILE.joints.home) + 0.1)
    stepped = lockstep.step(1)  # asks with min_commands_since_reset=1 again while the command is in flight
    assert stepped.step_count == early.step_count + 1 and stepped.commands_since_reset == 1
    lockstep.reset(4)
    assert not lockstep.client.call(StepWorld, S.step, ask).success, "the count must start again at a reset"


def test_bad_commands_are_rejected_and_the_node_keeps_running(lockstep):
    home = np.asarray(PROFILE.joints.home)
    lockstep.send(home + 0.2)
    lockstep.step_until_at(home + 0.2, atol=1e-3)
    good = lockstep.latest_joints()
    lockstep.send([float("nan"), 0.0, 0.0])
    lockstep.send([float("inf"), 0.0, 0.0])
    lockstep.send([0.1, 0.2])
    lockstep.send([])
    names = list(PROFILE.joints.names)
    bad_name = JointTrajectory(joint_names=names[:-1] + ["not_a_joint"],
                               points=[JointTrajectoryPoint(positions=[0.0] * 3, time_from_start=Duration(sec=1))])
    backwards = JointTrajectory(joint_names=names, points=[
        JointTrajectoryPoint(positions=[0.0] * 3, time_from_start=Duration(sec=2)),
        JointTrajectoryPoint(positions=[0.1] * 3, time_from_start=Duration(sec=1))])
    lockstep.trajectory.publish(bad_name)
    lockstep.trajectory.publish(backwards)
    time.sleep(0.5)
    lockstep.step(10)
    np.testing.assert_allclose(lockstep.latest_joints(), good, atol=0.02)  # the last good target is held
    lockstep.client.wait_for(lockstep.status, 1)
    status = lockstep.status[-1]
    assert status.rejected_commands >= 6, f"rejections counted: {status.rejected_commands}"

    beyond = np.asarray(PROFILE.joints.upper) + 1.0
    lockstep.send(beyond)
    lockstep.step_until_at(PROFILE.joints.upper)
    assert lockstep.node.alive()
    log = lockstep.node.output()
    for kind in ("non_finite", "wrong_length", "unknown_joint", "time_order"):
        assert kind in log, f"no logged rejection of kind {kind}:\n{log[-2000:]}"


def test_pause_blocks_stepping(lockstep):
    paused = lockstep.client.call(SetBool, S.pause, SetBool.Request(data=True))
    assert paused.success
    response = lockstep.client.call(StepWorld, S.step, StepWorld.Request(num_steps=3))
    assert not response.success and "pause" in response.message
    lockstep.client.call(SetBool, S.pause, SetBool.Request(data=False))
    lockstep.step(3)


def test_task_state_is_ground_truth(lockstep):
    lockstep.step(2)
    lockstep.client.wait_for(lockstep.task_state, 1)
    state = lockstep.task_state[-1]
    assert state.task == "push_t"
    assert 0.0 <= state.score <= 1.0
    assert len(state.object_poses) % 3 == 0 and len(state.goal_pose) == 3


def test_bad_parameter_is_a_clear_startup_error(start_reference):
    node = start_reference(mode="lockstep", task="juggling")
    node.expected_exit = (1,)
    deadline = time.monotonic() + 30
    while node.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not node.alive()
    assert "task must be one of" in node.output()
