"""The world model as a ROS 2 robot: the reference robot's clients run against it unchanged."""
from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
from std_srvs.srv import SetBool

from conformance import check_interface
from iws_common.messages import stamp_ns
from iws_common.profile import load_profile
from iws_interfaces.srv import ResetWorld, StepWorld
from ros_harness import LockstepClient

PROFILE = load_profile("reference_arm")
S = PROFILE.services


@pytest.fixture
def world_model(start_backend, ros_client, tiny_world_model):
    node = start_backend("world_model", mode="lockstep", model=str(tiny_world_model), threads=1)
    client = LockstepClient(ros_client, PROFILE)
    client.node = node
    return client


def test_interface_conforms_to_profile(start_backend, ros_client, tiny_world_model):
    start_backend("world_model", mode="realtime", model=str(tiny_world_model), threads=1)
    first = check_interface(ros_client, PROFILE)
    # By default the image has the real camera's size, however small the model renders.
    assert (first["image"].width, first["image"].height) == (PROFILE.camera.width, PROFILE.camera.height)


def test_native_resolution_scales_camera_info(start_backend, ros_client, tiny_world_model):
    from sensor_msgs.msg import CameraInfo, Image

    from iws_common import qos
    start_backend("world_model", mode="realtime", model=str(tiny_world_model), threads=1, native_resolution=True)
    images = ros_client.wait_for(ros_client.collect(Image, PROFILE.topics.image, qos.IMAGE_SUBSCRIBER), 1)
    infos = ros_client.wait_for(ros_client.collect(CameraInfo, PROFILE.topics.camera_info, qos.IMAGE_SUBSCRIBER), 1)
    native = PROFILE.camera.scaled(images[-1].width, images[-1].height)
    assert images[-1].width < PROFILE.camera.width
    assert (infos[-1].width, infos[-1].height) == (images[-1].width, images[-1].height)
    np.testing.assert_allclose(infos[-1].k, native.intrinsics_matrix(), rtol=1e-6)


def test_lockstep_steps_exactly_n(world_model):
    world_model.step(1)
    time.sleep(0.5)
    before = len(world_model.images)
    first = world_model.client.call(StepWorld, S.step, StepWorld.Request(num_steps=1))
    response = world_model.step(6)
    time.sleep(1.0)
    assert len(world_model.images) - before == 7
    assert response.step_count - first.step_count == 6
    assert world_model.latest_joints().shape == (PROFILE.joints.count,)


def test_reset_restores_the_start_window(world_model):
    world_model.reset(0)
    start = world_model.latest_pixels()
    world_model.step(3)
    last_step_stamp = stamp_ns(world_model.images[-1].header.stamp)
    again = world_model.reset(0)
    assert again.success
    assert stamp_ns(again.first_frame_stamp) > last_step_stamp, "a reset's first frame needs a stamp of its own"
    assert np.array_equal(world_model.latest_pixels(), start), "reset must republish the start window's frame"


def test_a_supplied_window_and_seed_replay_the_same_rollout(world_model, tiny_world_model):
    """An evaluation resets to a window of the robot's frames with the episode's seed: the same
    seed must give the same rollout (a rerun reproduces it), another seed another sample."""
    from sensor_msgs.msg import JointState

    from iws_common.image_conversion import numpy_to_image
    from iws_world_model.start_windows import load_start_windows
    window = load_start_windows(tiny_world_model)
    names = list(PROFILE.joints.names)
    supplied = {"images": [numpy_to_image(image, "rgb8") for image in window["images"][0]],
                "joint_states": [JointState(name=names, position=[float(v) for v in q])
                                 for q in window["joint_positions"][0]]}

    def rollout(seed: int) -> np.ndarray:
        world_model.reset(seed, **supplied)
        world_model.step(4)
        return world_model.latest_pixels()

    first = rollout(5)
    assert np.array_equal(rollout(5), first), "the same window and seed gave another rollout"
    assert not np.array_equal(rollout(6), first), "another seed gave the same sample"


def test_bad_commands_are_rejected_and_the_node_keeps_running(world_model):
    world_model.send([float("nan"), 0.0, 0.0])
    world_model.send([0.1, 0.2])
    world_model.send(np.asarray(PROFILE.joints.upper) + 5.0)
    world_model.step(3)
    world_model.client.wait_for(world_model.status, 1)
    deadline = time.monotonic() + 5
    while world_model.status[-1].rejected_commands < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert world_model.status[-1].rejected_commands >= 2
    assert world_model.status[-1].backend == "world_model"
    log = world_model.node.output()
    assert "non_finite" in log and "wrong_length" in log
    assert np.all(np.isfinite(world_model.latest_joints()))


def test_reset_while_stepping(world_model):
    results = {}
    stepping = threading.Thread(target=lambda: results.setdefault(
        "step", world_model.client.call(StepWorld, S.step, StepWorld.Request(num_steps=40), timeout=120)))
    stepping.start()
    time.sleep(0.3)
    reset = world_model.client.call(ResetWorld, S.reset, ResetWorld.Request(seed=1, episode_index=1), timeout=60)
    stepping.join(120)
    assert reset.success, reset.message
    assert results["step"].success, results["step"].message
    world_model.step(2)
    assert world_model.node.alive()


def test_pause_blocks_stepping(world_model):
    assert world_model.client.call(SetBool, S.pause, SetBool.Request(data=True)).success
    response = world_model.client.call(StepWorld, S.step, StepWorld.Request(num_steps=2))
    assert not response.success and "pause" in response.message
    world_model.client.call(SetBool, S.pause, SetBool.Request(data=False))
    world_model.step(2)


def test_frozen_noise_parameter_overrides_the_model_config(start_backend, ros_client, tiny_world_model):
    """The operator picks what a reset freezes at launch; WorldStatus names the override."""
    from iws_interfaces.msg import WorldStatus
    node = start_backend("world_model", mode="lockstep", model=str(tiny_world_model), threads=1, frozen_noise="all")
    status = ros_client.wait_for(ros_client.collect(WorldStatus, PROFILE.topics.world_status), 1, timeout=60)[-1]
    assert status.model_id == f"{tiny_world_model.name}+frozen_noise=all"
    assert "frozen_noise=all" in node.output()

    bad = start_backend("world_model", mode="lockstep", model=str(tiny_world_model), frozen_noise="sometimes")
    bad.expected_exit = (1,)
    deadline = time.monotonic() + 60
    while bad.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not bad.alive()
    assert "world_model: cannot start:" in bad.output() and "frozen_noise" in bad.output(), bad.output()[-2000:]


@pytest.mark.parametrize("damage", ["missing", "truncated", "wrong_shapes"])
def test_bad_model_is_a_clear_startup_error(start_backend, tiny_world_model, tmp_path, damage):
    model = tmp_path / "model"
    if damage != "missing":
        shutil.copytree(tiny_world_model, model)
        weights = model / "model.safetensors"
        if damage == "truncated":
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        else:
            import json
            config = json.loads((model / "config.json").read_text())
            config["model"]["decoder_channels"] *= 2
            (model / "config.json").write_text(json.dumps(config))
    node = start_backend("world_model", mode="lockstep", model=str(model))
    node.expected_exit = (1,)
    deadline = time.monotonic() + 60
    while node.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not node.alive()
    output = node.output()
    assert "world_model: cannot start:" in output and str(model) in output, output[-2000:]
    assert "Traceback" not in output
