"""Keyboard teleop: keys -> pusher moves -> joint targets within limits, and episode events that
the recorder and the dataset builder honour (a saved episode is kept, a discarded one is not)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from iws_common.messages import stamp_ns
from iws_common.processes import NodeProcess
from iws_common.profile import load_profile
from iws_reference_robot.teleop import DISCARD, END, START, TeleopKeys, make_teleop_node, read_key
from ros_harness import LockstepClient

PROFILE = load_profile("reference_arm")


@pytest.fixture(scope="module")
def kinematics():
    from iws_reference_robot.sim import ReferenceSim

    sim = ReferenceSim(PROFILE, task="push_t")
    yield sim
    sim.close()


def test_keys_move_the_pusher_within_reach_and_joint_limits(kinematics):
    keys = TeleopKeys(kinematics, step=0.02)
    start = kinematics.forward_kinematics(keys.start_from(PROFILE.joints.home))
    for key, direction in (("w", (0, 1)), ("up", (0, 1)), ("d", (1, 0)), ("right", (1, 0)), ("s", (0, -1)),
                           ("down", (0, -1)), ("a", (-1, 0)), ("left", (-1, 0))):
        before = keys.target_xy.copy()
        update = keys.handle(key)
        np.testing.assert_allclose(kinematics.forward_kinematics(update.command), before + 0.02 * np.array(direction), atol=1e-6)
    np.testing.assert_allclose(keys.target_xy, start, atol=1e-6)
    assert keys.handle("+").message == "step 40.0 mm" and keys.handle("-").message == "step 20.0 mm"
    for _ in range(10):
        keys.handle("-")
    assert keys.step == 0.001
    lower, upper = np.array(PROFILE.joints.lower), np.array(PROFILE.joints.upper)
    r_min, r_max = kinematics.reach
    keys.step = 0.05
    for key in ["w"] * 30 + ["a"] * 30 + ["s"] * 30 + ["d"] * 30:  # far past the reach in every direction
        q = keys.handle(key).command
        assert np.all(q >= lower) and np.all(q <= upper)
        assert r_min - 1e-6 <= np.hypot(*keys.target_xy) <= r_max + 1e-6, "the target stays reachable"
        np.testing.assert_allclose(kinematics.forward_kinematics(q), keys.target_xy, atol=1e-9)
    np.testing.assert_allclose(keys.handle("h").command, PROFILE.joints.home, atol=1e-6)
    assert "unknown key" in keys.handle("z").message
    with pytest.raises(ValueError, match="step"):
        TeleopKeys(kinematics, step=1.0)


def test_keys_start_save_and_discard_episodes(kinematics):
    keys = TeleopKeys(kinematics)
    keys.start_from(PROFILE.joints.home)
    assert keys.handle("enter").event is None, "nothing to save before a start"
    first = keys.handle("n")
    assert (first.event, first.episode_index) == (START, 0) and keys.handle("n").event is None
    assert (keys.handle("enter").event, keys.episode_index) == (END, 1)
    assert keys.handle("x").event is None
    keys.handle("n")
    assert (keys.handle("y").event, keys.episode_index) == (END, 2)
    keys.handle("n")
    discarded = keys.handle("x")
    assert (discarded.event, discarded.episode_index) == (DISCARD, 2)
    keys.handle("n")
    quit_ = keys.handle("q")
    assert quit_.quit and quit_.event == DISCARD, "quitting discards the open episode"
    assert keys.handle("ctrl-c").quit and keys.handle("ctrl-c").event is None


def test_terminal_keys_are_decoded():
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"\x1b[A\x1b[D\rW\x03+")
        assert [read_key(read_fd, 0.5) for _ in range(6)] == ["up", "left", "enter", "w", "ctrl-c", "+"]
        assert read_key(read_fd, 0.01) is None
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_saved_episode_reaches_the_dataset_and_the_discarded_one_does_not(start_reference, ros_client, domain_id, tmp_path):
    from iws_data.builder import build_dataset
    from iws_data.dataset import Dataset

    start_reference(mode="lockstep", task="push_t")
    arm = LockstepClient(ros_client, PROFILE)
    recorder = NodeProcess([sys.executable, "-m", "iws_bringup.cli", "record", "--robot", PROFILE.name,
                            "--out", str(tmp_path / "bag")], domain_id, tmp_path / "recorder.log")
    teleop = make_teleop_node(PROFILE, step=0.02, task="push_t", context=ros_client.context)
    ros_client.executor.add_node(teleop)

    def press(key: str):
        """Apply a key once the teleop has seen the newest joint state (its stamp marks events)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                teleop.last_stamp is not None and stamp_ns(teleop.last_stamp) == stamp_ns(arm.joints[-1].header.stamp)):
            time.sleep(0.02)
        update = teleop.handle_key(key)
        time.sleep(0.3)  # the command travels on another channel than StepWorld
        return update

    try:
        deadline = time.monotonic() + 30
        while len(ros_client.node.get_subscriptions_info_by_topic(PROFILE.topics.image)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the recorder subscribes (next to the test's own client)
        time.sleep(1.0)
        # Lockstep publishes only when stepped: the recorder must see /clock (its log time) and
        # the teleop a joint state before the episode starts.
        for _ in range(50):
            arm.step(1)
            time.sleep(0.2)
            if teleop.ready() and len(arm.images) >= 3:
                break
        assert teleop.ready(), "the teleop starts from the arm's joint state"
        np.testing.assert_allclose(teleop.current_command, arm.latest_joints(), atol=1e-3)
        ros_client.wait_for_subscribers(teleop.pub_command, count=2)  # the robot and the recorder
        ros_client.wait_for_subscribers(teleop.pub_events, count=1)
        time.sleep(0.5)
        assert press("n").event == START
        for key in ("d", "d", "w"):
            assert press(key).command is not None
            arm.step(2)
        saved_command = teleop.current_command.copy()
        assert press("enter").event == END
        arm.step(1)  # a command sent before the next step would count as in force at END's frame
        assert press("n").event == START
        press("a")
        arm.step(3)
        assert press("x").event == DISCARD
        arm.step(1)
        time.sleep(1.0)
    finally:
        ros_client.executor.remove_node(teleop)
        teleop.destroy_node()
        assert recorder.stop() == 0, recorder.output()

    dataset = Dataset(build_dataset([tmp_path / "bag"], tmp_path / "dataset", PROFILE, val_fraction=0.0,
                                    progress=False)[0])
    assert len(dataset.episodes) == 1 and dataset.meta["report"]["discarded_episodes"] == 1
    episode = dataset.episode(0)
    assert dataset.episodes[0].task == "push_t"
    assert len(episode["images"]) == 7, "START..END spans the frame at START and the 6 stepped after it"
    np.testing.assert_allclose(episode["actions"][-1], saved_command, atol=1e-6)
    np.testing.assert_allclose(episode["joint_positions"][-1], saved_command, atol=0.02)

