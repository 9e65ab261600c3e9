"""Collect -> rosbag2 -> dataset, in-process: frame counts, alignment, resume, formats, and the
builder's handling of other robots' recordings (name order, encodings, events, gaps)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

from iws_common.image_conversion import convert_encoding, image_to_numpy, numpy_to_image
from iws_common.profile import load_profile
from iws_data.bags import BagReader, BagWriter
from iws_data.builder import build_dataset
from iws_data.collect import PARTIAL_DIR, collect, episode_name
from iws_data.dataset import Dataset
from iws_data.info import summarize, write_preview
from iws_interfaces.msg import EpisodeEvent

STEPS = 20
PROFILE = load_profile("reference_arm")
TOPICS = PROFILE.topics


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    out = tmp_path_factory.mktemp("collect") / "bags"
    results = collect(PROFILE, "push_t", out, episodes=2, steps=STEPS, seed=3, progress=False)
    return out, results


def read_episode_bag(path):
    """(command stamps, commands, joint stamps, joint positions, image stamps, images) via rclpy."""
    out = {"commands": [], "joints": [], "images": []}
    with BagReader(path) as bag:
        for topic, log_ns, data in bag.messages([TOPICS.position_command, TOPICS.joint_states, TOPICS.image]):
            if topic == TOPICS.position_command:
                out["commands"].append((log_ns, list(deserialize_message(bytes(data), Float64MultiArray).data)))
            elif topic == TOPICS.joint_states:
                msg = deserialize_message(bytes(data), JointState)
                stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
                assert stamp == log_ns
                out["joints"].append((stamp, list(msg.position)))
            else:
                msg = deserialize_message(bytes(data), Image)
                out["images"].append((msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec, image_to_numpy(msg)))
    return {k: sorted(v, key=lambda item: item[0]) for k, v in out.items()}


def test_collect_writes_complete_episode_bags(collected):
    out, results = collected
    assert [r.path.name for r in results] == [episode_name(0), episode_name(1)]
    assert not (out / PARTIAL_DIR).exists()
    recorded = read_episode_bag(out / episode_name(0))
    assert len(recorded["commands"]) == STEPS
    assert len(recorded["joints"]) == len(recorded["images"]) == STEPS + 1
    period = round(PROFILE.control_period_s * 1e9)
    # Lockstep timing: the command at step i carries the stamp of observation i.
    assert [s for s, _ in recorded["commands"]] == [s for s, _ in recorded["joints"][:-1]]
    assert np.all(np.diff([s for s, _ in recorded["joints"]]) == period)
    with BagReader(out / episode_name(0)) as bag:
        events = [deserialize_message(bytes(d), EpisodeEvent) for _, _, d in bag.messages([TOPICS.episode_events])]
        assert bag.count(TOPICS.camera_info) == STEPS + 1 and bag.count(TOPICS.task_state) == STEPS + 1
    assert [e.event for e in events] == [EpisodeEvent.START, EpisodeEvent.END]
    assert events[1].task == "push_t" and events[1].score == pytest.approx(results[0].score)


def test_dataset_aligns_actions_and_joints_with_the_bag(collected, tmp_path):
    out, results = collected
    dataset_dir, report = build_dataset([out], tmp_path / "ds", PROFILE, size=96, val_fraction=0.5, progress=False)
    dataset = Dataset(dataset_dir)
    assert len(dataset) == 2 * (STEPS + 1)
    assert [e.length for e in dataset.episodes] == [STEPS + 1, STEPS + 1]
    assert sorted(e.split for e in dataset.episodes) == ["train", "val"]
    assert report.dropped_frames == 0 and not report.gaps and not report.clock_jumps
    lower, upper = np.array(PROFILE.joints.lower), np.array(PROFILE.joints.upper)
    for episode, result in zip(dataset.episodes, results):
        data = dataset.episode(episode.index)
        recorded = read_episode_bag(result.path)
        commands = np.clip(np.array([c for _, c in recorded["commands"]]), lower, upper)
        # actions[i] is the command sent at step i; the last frame keeps the last command in force.
        np.testing.assert_allclose(data["actions"][:STEPS], commands, atol=1e-6)
        np.testing.assert_allclose(data["actions"][STEPS], commands[-1], atol=1e-6)
        np.testing.assert_allclose(data["joint_positions"], [q for _, q in recorded["joints"]], atol=1e-6)
        np.testing.assert_array_equal(data["images"], np.stack([im for _, im in recorded["images"]]))
        np.testing.assert_allclose(np.diff(data["timestamps"]), PROFILE.control_period_s, atol=1e-9)
        assert episode.success == result.success and episode.score == pytest.approx(result.score)
        # Joint positions follow the actions: where a command is far from the joints, they move toward it.
        q, a = data["joint_positions"], data["actions"]
        pull = a[:-1] - q[:-1]
        moved = q[1:] - q[:-1]
        far = np.abs(pull) > 0.05
        assert far.sum() > 5
        assert np.mean(np.sign(moved[far]) == np.sign(pull[far])) > 0.9


def test_collect_resumes_and_is_deterministic(collected, tmp_path):
    out, results = collected
    copy = tmp_path / "bags"
    shutil.copytree(out, copy)
    # A crashed run leaves episode 2 half written: it is redone, complete ones are skipped.
    (copy / PARTIAL_DIR / episode_name(2)).mkdir(parents=True)
    (copy / PARTIAL_DIR / episode_name(2) / "junk.mcap").write_bytes(b"\x89MCAP0\r\n")
    before = (copy / episode_name(0) / f"{episode_name(0)}.mcap").stat().st_mtime_ns
    redone = collect(PROFILE, "push_t", copy, episodes=3, steps=STEPS, seed=3, progress=False)
    assert [r.index for r in redone] == [2]
    assert (copy / episode_name(0) / f"{episode_name(0)}.mcap").stat().st_mtime_ns == before
    assert not (copy / PARTIAL_DIR).exists()
    # Episode 1 regenerated alone (start=1) is the same episode.
    alone = collect(PROFILE, "push_t", tmp_path / "alone", episodes=1, steps=STEPS, seed=3, progress=False, start=1)
    a, b = read_episode_bag(alone[0].path), read_episode_bag(out / episode_name(1))
    assert a["commands"] == b["commands"] and a["joints"] == b["joints"]


def test_sqlite3_bags_resize_info_and_preview(tmp_path):
    bags = tmp_path / "bags"
    collect(PROFILE, "push_t", bags, episodes=1, steps=8, seed=1, progress=False, storage="sqlite3",
            mix="random=1")
    assert list((bags / episode_name(0)).glob("*.db3"))
    full = Dataset(build_dataset([bags], tmp_path / "full", PROFILE, size=96, progress=False)[0])
    small = Dataset(build_dataset([bags / episode_name(0)], tmp_path / "small", PROFILE, size=48, progress=False)[0])
    assert small.images.shape == (9, 48, 48, 3)
    expected = full.images[:].astype(np.float64).reshape(9, 48, 2, 48, 2, 3).mean(axis=(2, 4))
    assert np.abs(small.images[:].astype(np.float64) - expected).max() <= 0.5 + 1e-9
    summary = summarize(full)
    assert summary["frames"] == 9 and summary["episodes"] == 1 and len(summary["image_mean"]) == 3
    video = write_preview(full, 0, tmp_path / "preview.mp4")
    import av
    with av.open(str(video)) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 9 and frames[0].width == 96 * 4


# -- recordings from other robots (drivers' own conventions) --------------------------------------
def stamp(ns):
    from builtin_interfaces.msg import Time
    return Time(sec=ns // 10**9, nanosec=ns % 10**9)


def write_synthetic_bag(path, n=12, encoding="rgb8", names=None, drop_images=(), events=None,
                        command_offset_ns=30_000_000, with_commands=True, storage="mcap"):
    """A robot's recording: images and joint states at the control rate (wall-clock stamps),
    commands received a little after each frame, optional episode events."""
    period = round(PROFILE.control_period_s * 1e9)
    t0 = 1_700_000_000 * 10**9
    names = names or list(PROFILE.joints.names)
    profile_names = list(PROFILE.joints.names)
    order = [profile_names.index(n) if n in profile_names else i for i, n in enumerate(names)]
    rng = np.random.default_rng(0)
    truth = {"images": [], "joints": [], "commands": []}
    with BagWriter(path, PROFILE, storage=storage) as bag:
        for k in range(n):
            t = t0 + k * period
            q = np.array([0.1 * k, -0.05 * k, 0.01 * k])
            rgb = rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)  # 4:3 camera: centre-cropped
            truth["images"].append(rgb)
            truth["joints"].append(q)
            if k not in drop_images:
                pixels = convert_encoding(rgb, "rgb8", encoding)
                bag.write(TOPICS.image, serialize_message(numpy_to_image(pixels, encoding, stamp=stamp(t + 2_000_000))), t + 5_000_000)
            js = JointState(name=names, position=q[order].tolist())
            js.header.stamp = stamp(t)
            bag.write(TOPICS.joint_states, serialize_message(js), t + 1_000_000)
            if with_commands:
                command = q + 0.2
                truth["commands"].append(command)
                bag.write(TOPICS.position_command, serialize_message(Float64MultiArray(data=command.tolist())), t + command_offset_ns)
        for event_step, kind in (events or []):
            msg = EpisodeEvent(event=kind, task="push_t", success=True, score=0.5)
            msg.header.stamp = stamp(t0 + event_step * period)
            bag.write(TOPICS.episode_events, serialize_message(msg), t0 + event_step * period)
    return truth


def test_builder_reorders_joint_names_converts_bgr_and_crops(tmp_path):
    names = list(reversed(PROFILE.joints.names))
    truth = write_synthetic_bag(tmp_path / "bag", encoding="bgr8", names=names)
    dataset = Dataset(build_dataset([tmp_path / "bag"], tmp_path / "ds", PROFILE, size=60, progress=False)[0])
    # Commands arrive 30 ms after the frame: at frame k the command in force is that of frame k-1,
    # so frame 0 (no command yet) is dropped.
    assert len(dataset) == 11
    np.testing.assert_allclose(dataset.joint_positions, np.array(truth["joints"][1:]), atol=1e-6)
    np.testing.assert_allclose(dataset.actions, np.array(truth["commands"][:-1]), atol=1e-6)
    centre = np.stack(truth["images"][1:])[:, :, 10:70]
    np.testing.assert_array_equal(dataset.images, centre)
    assert dataset.meta["report"]["frames_without_command"] == 1


def test_builder_episode_events_and_gaps(tmp_path):
    events = [(1, EpisodeEvent.START), (4, EpisodeEvent.END), (5, EpisodeEvent.START), (7, EpisodeEvent.DISCARD),
              (8, EpisodeEvent.START), (19, EpisodeEvent.END)]
    write_synthetic_bag(tmp_path / "bag", n=20, drop_images=(12, 13), events=events, command_offset_ns=0)
    dataset = Dataset(build_dataset([tmp_path / "bag"], tmp_path / "ds", PROFILE, progress=False)[0])
    # START..END windows hold the images stamped inside them (2 ms after the grid): 1..3 and 8..18.
    lengths = [e.length for e in dataset.episodes]
    report = dataset.meta["report"]
    assert report["discarded_episodes"] == 1
    assert report["dropped_frames"] == 2 and len(report["gaps"]) == 1 and report["gaps"][0]["missing_frames"] == 2
    assert lengths == [3, 11]
    assert all(e.success and e.score == 0.5 for e in dataset.episodes)
    second = dataset.episode(1)
    # The gap repeats the last image before it.
    np.testing.assert_array_equal(second["images"][12 - 8], second["images"][11 - 8])
    np.testing.assert_array_equal(second["images"][13 - 8], second["images"][11 - 8])


def test_dataset_writer_grows_past_its_capacity_estimate(tmp_path):
    from iws_data.dataset import DatasetWriter

    writer = DatasetWriter(tmp_path / "ds", (8, 8), ["a", "b"], capacity=3, meta={"control_rate_hz": 10.0})
    for k in range(3):
        n = 5
        writer.add_episode(np.full((n, 8, 8, 3), k, np.uint8), np.full((n, 2), k, np.float32),
                           np.full((n, 2), -k, np.float32), np.arange(n) * 0.1, split="train")
    writer.close()
    dataset = Dataset(tmp_path / "ds")
    assert len(dataset) == 15 and [e.start for e in dataset.episodes] == [0, 5, 10]
    assert dataset.images[12].max() == 2 and dataset.actions[7].tolist() == [-1, -1]
    assert not list((tmp_path / "ds").glob("*partial*"))
