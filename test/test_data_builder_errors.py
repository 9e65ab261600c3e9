"""Broken inputs give one clear error naming the file (and the topic), from the API and the CLI."""
from __future__ import annotations

import shutil

import pytest
from rclpy.serialization import serialize_message
from sensor_msgs.msg import JointState

from iws_bringup.cli import main as iws
from iws_common.profile import load_profile
from iws_data.bags import BagError, BagWriter
from iws_data.builder import DatasetBuildError, build_dataset
from iws_data.collect import collect, episode_name
from test_data_pipeline import write_synthetic_bag

PROFILE = load_profile("reference_arm")
TOPICS = PROFILE.topics


@pytest.fixture(scope="module")
def good_bag(tmp_path_factory):
    out = tmp_path_factory.mktemp("good")
    collect(PROFILE, "push_t", out, episodes=1, steps=30, seed=0, progress=False)
    return out / episode_name(0)


def build_error(bag, tmp_path) -> BagError:
    with pytest.raises(BagError) as caught:
        build_dataset([bag], tmp_path / "ds", PROFILE, progress=False)
    assert not (tmp_path / "ds" / "meta.json").exists()
    assert not list((tmp_path / "ds").glob("*.partial")), "a failed build leaves partial arrays"
    return caught.value


def test_missing_command_topic(tmp_path):
    write_synthetic_bag(tmp_path / "bag", with_commands=False)
    error = build_error(tmp_path / "bag", tmp_path)
    assert isinstance(error, DatasetBuildError)
    assert str(tmp_path / "bag" / "bag.mcap") in str(error) and TOPICS.position_command in str(error)
    assert error.topic == TOPICS.position_command


def test_missing_image_topic(tmp_path):
    with BagWriter(tmp_path / "bag", PROFILE, kinds=["joint_states", "position_command"]) as bag:
        js = JointState(name=list(PROFILE.joints.names), position=[0.0, 0.0, 0.0])
        bag.write(TOPICS.joint_states, serialize_message(js), 10**9)
    error = build_error(tmp_path / "bag", tmp_path)
    assert "missing topic" in str(error) and TOPICS.image in str(error) and "bag.mcap" in str(error)


def test_empty_bag(tmp_path):
    BagWriter(tmp_path / "bag", PROFILE).close()
    error = build_error(tmp_path / "bag", tmp_path)
    assert "empty bag" in str(error) and str(tmp_path / "bag") in str(error) and TOPICS.image in str(error)


def test_truncated_mcap(good_bag, tmp_path):
    bag = tmp_path / "bag"
    shutil.copytree(good_bag, bag)
    mcap = bag / f"{good_bag.name}.mcap"
    data = mcap.read_bytes()
    mcap.write_bytes(data[: len(data) // 2])
    error = build_error(bag, tmp_path)
    assert "corrupt or truncated" in str(error) and str(mcap) in str(error)


def test_missing_metadata(good_bag, tmp_path):
    bag = tmp_path / "bag"
    shutil.copytree(good_bag, bag)
    (bag / "metadata.yaml").unlink()
    error = build_error(bag, tmp_path)
    assert "metadata.yaml" in str(error) and str(bag) in str(error)


def test_joint_names_not_in_profile(tmp_path):
    write_synthetic_bag(tmp_path / "bag", names=["joint_a", "joint_b", "joint_c"])
    error = build_error(tmp_path / "bag", tmp_path)
    assert TOPICS.joint_states in str(error) and "joint_a" in str(error) and "bag.mcap" in str(error)
    assert error.topic == TOPICS.joint_states


def test_cli_reports_error_and_exit_code(tmp_path, capsys):
    BagWriter(tmp_path / "bag", PROFILE).close()
    assert iws(["dataset", "build", str(tmp_path / "bag"), "--out", str(tmp_path / "ds"), "--no-progress"]) == 1
    assert "empty bag" in capsys.readouterr().err
    assert iws(["dataset", "info", str(tmp_path / "nothing")]) == 1


def test_cli_build_and_info(good_bag, tmp_path, capsys):
    assert iws(["dataset", "build", str(good_bag.parent), "--out", str(tmp_path / "ds"), "--no-progress"]) == 0
    assert "1 episodes, 31 frames" in capsys.readouterr().out
    assert iws(["dataset", "info", str(tmp_path / "ds")]) == 0
    assert "frames 31" in capsys.readouterr().out
    # Rebuilding over a dataset needs --overwrite.
    assert iws(["dataset", "build", str(good_bag), "--out", str(tmp_path / "ds"), "--no-progress"]) == 1
    assert iws(["dataset", "build", str(good_bag), "--out", str(tmp_path / "ds"), "--no-progress", "--overwrite"]) == 0


def test_skip_broken_keeps_the_good_bags(good_bag, tmp_path):
    shutil.copytree(good_bag, tmp_path / "bags" / "good")
    shutil.copytree(good_bag, tmp_path / "bags" / "broken")
    mcap = tmp_path / "bags" / "broken" / f"{good_bag.name}.mcap"
    mcap.write_bytes(mcap.read_bytes()[:1000])
    _, report = build_dataset([tmp_path / "bags"], tmp_path / "ds", PROFILE, progress=False, skip_broken=True)
    assert report.episodes == 1 and report.frames == 31
    assert len(report.skipped_bags) == 1 and str(mcap) in report.skipped_bags[0]
