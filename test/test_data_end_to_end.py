"""Reference robot -> `iws record` -> rosbag2 -> `iws dataset build`, all over ROS.

The same path a real robot's data takes: a lockstep reference robot in its own process, the
recorder in another, and this process as the policy sending commands and stepping. The dataset
must hold exactly the frames of the episode, each with the command that was in force.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from iws_common import qos
from iws_common.processes import NodeProcess
from iws_common.profile import load_profile
from iws_data.bags import BagReader
from iws_data.builder import build_dataset
from iws_data.dataset import Dataset
from iws_interfaces.msg import EpisodeEvent
from ros_harness import LockstepClient

PROFILE = load_profile("reference_arm")
STEPS = 25


def test_reference_robot_to_bag_to_dataset(start_reference, ros_client, domain_id, tmp_path):
    start_reference(mode="lockstep", task="push_t", seed=5)
    robot = LockstepClient(ros_client, PROFILE)
    robot.step(1)  # the robot is up
    recorder = NodeProcess([sys.executable, "-m", "iws_bringup.cli", "record", "--robot", PROFILE.name,
                            "--out", str(tmp_path / "bag")], domain_id, tmp_path / "recorder.log")
    deadline = time.monotonic() + 30
    while "recording" not in recorder.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # the recorder's subscriptions match the publishers
    events = ros_client.publisher(EpisodeEvent, PROFILE.topics.episode_events, qos.EVENTS)
    home = np.asarray(PROFILE.joints.home)
    robot.reset(5)
    events.publish(EpisodeEvent(event=EpisodeEvent.START, episode_index=0, task="push_t"))
    time.sleep(0.3)
    commands = [home + np.array([0.03 * i, -0.02 * i, 0.05 * i]) for i in range(STEPS)]
    for command in commands:
        robot.send(command, settle=0.15)
        # No pause after the step: the next command may reach the recorder before this step's
        # /clock does (two publishers, no order between them); the recorder stamps it by when it
        # was published (a CI run beside two evaluations once saw command 4 stamped at frame 3).
        robot.step(1)
    events.publish(EpisodeEvent(event=EpisodeEvent.END, episode_index=0, task="push_t", success=False, score=0.0))
    time.sleep(1.0)
    assert recorder.stop() == 0, recorder.output()

    with BagReader(tmp_path / "bag") as bag:
        assert bag.count(PROFILE.topics.position_command) == STEPS
        assert bag.count(PROFILE.topics.episode_events) == 2
    dataset_dir, report = build_dataset([tmp_path / "bag"], tmp_path / "dataset", size=96, val_fraction=0.0,
                                        progress=False)
    dataset = Dataset(dataset_dir)
    assert len(dataset.episodes) == 1
    # The frame published by the reset plus one per step, each with the command in force.
    assert len(dataset) == STEPS + 1, f"{len(dataset)} frames; report: {report.summary()}"
    np.testing.assert_allclose(dataset.actions[:STEPS], np.array(commands), atol=1e-6)
    np.testing.assert_allclose(dataset.actions[STEPS], commands[-1], atol=1e-6)
    # The arm follows the commands it was given.
    assert np.abs(dataset.joint_positions[-1] - commands[-1]).max() < 0.1
    stamps = np.asarray(dataset.timestamps)
    np.testing.assert_allclose(np.diff(stamps), PROFILE.control_period_s, atol=1e-6)
