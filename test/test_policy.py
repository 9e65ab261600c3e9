"""Policies from the world model: the pixel scorer, Diffusion Policy training and checkpoints,
synthetic demonstrations collected inside a (tiny, real) world model, and evaluation through ROS
on both backends from matched initial states."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from sensor_msgs.msg import JointState

from iws_common.profile import load_profile
from iws_policy.diffusion import (DiffusionPolicy, PolicyCheckpointError, PolicyConfig, PolicyRunner, load_policy,
                                  save_policy)
from iws_policy.evaluate import AS_READ, evaluate, wilson_interval
from iws_reference_robot.scoring import PixelScorer
from iws_reference_robot.sim import ReferenceSim, start_window
from iws_reference_robot.tasks import PushT
from process_harness import sigterm_once_running
from ros_harness import NodeProcess

PROFILE = load_profile("reference_arm")


@pytest.fixture(scope="module")
def sim():
    s = ReferenceSim(PROFILE, task="push_t", seed=0)
    yield s
    s.close()


def test_pixel_scorer_follows_the_true_overlap(sim):
    scorer = PixelScorer(PROFILE)
    sim.reset(3)
    goal = PushT.GOAL.copy()
    errors = []
    for offset in ([0, 0, 0], [0.004, 0, 0.02], [0.02, -0.01, 0.3], [0.06, 0.0, 1.0], [-0.08, 0.02, -2.0]):
        sim.task.block.set(sim.data, goal + np.asarray(offset))
        sim.step(sim.joint_positions())  # settle and render the new pose
        truth, pixel = sim.task_state(), scorer(sim.render())
        assert pixel.found
        errors.append(abs(truth.score - pixel.score))
        assert pixel.success == truth.success, (offset, truth.score, pixel.score)
    assert np.mean(errors) < 0.05, errors
    assert not scorer(np.zeros((96, 96, 3), np.uint8)).found


def test_scorer_validation_command_judges_frames_and_whole_episodes(tmp_path):
    out = tmp_path / "scorer.json"
    run = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "eval", "scorer", "--episodes", "2", "--min-steps", "20",
                          "--max-steps", "30", "--expert-episodes", "2", "--expert-seed", "60004", "--expert-steps", "40",
                          "--json", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["pixel_threshold"] == 0.95 and result["final_frame"]["n"] == 2
    episodes = result["expert_episodes"]
    assert episodes["n"] == 2 and [e["seed"] for e in episodes["episodes"]] == [60004, 60005]
    assert [e["command_noise"] for e in episodes["episodes"]] == [0.0, 0.01]
    assert all(abs(e["pixel_best"] - e["truth_best"]) < 0.05 for e in episodes["episodes"])
    bad = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "eval", "scorer", "--expert-episodes", "-1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--expert-episodes" in bad.stderr


def test_start_window_holds_the_arm_and_is_seeded(sim):
    a, b = start_window(sim, 42, 4), start_window(sim, 42, 4)
    assert a["images"].shape == (4, PROFILE.camera.height, PROFILE.camera.width, 3)
    np.testing.assert_array_equal(a["images"], b["images"])
    np.testing.assert_allclose(a["joint_positions"][0], a["joint_positions"][-1], atol=1e-3)
    assert not np.array_equal(start_window(sim, 43, 1)["images"][0], a["images"][0])


def test_success_stops_counting_once_the_object_is_lost():
    from iws_policy.evaluate import best_score_before_loss
    scores = [0.1, 0.5, 0.0, 0.0, 0.0, 0.97, 0.2]
    assert best_score_before_loss(scores, [True, True, False, False, True, True, True], lost_frames=3) == (0.97, None)
    assert best_score_before_loss(scores, [True, True, False, False, False, True, True], lost_frames=3) == (0.5, 2)
    assert best_score_before_loss(scores, [False] * 7, lost_frames=3) == (0.0, 0)


def test_wilson_interval():
    low, high = wilson_interval(8, 10)
    assert 0.44 < low < 0.5 and 0.94 < high < 0.97
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_policy_shapes_save_load_and_corrupt_checkpoints(tmp_path):
    config = PolicyConfig(joint_names=list(PROFILE.joints.names))
    policy = DiffusionPolicy(config).eval()
    images = torch.randint(0, 255, (2, config.obs_horizon, 64, 64, 3), dtype=torch.uint8)
    joints = torch.zeros(2, config.obs_horizon, 3)
    chunk = policy.predict(images, joints, generator=torch.Generator().manual_seed(0))
    assert chunk.shape == (2, config.pred_horizon, 3) and chunk.dtype == torch.float32
    low, high = torch.tensor(config.action_low), torch.tensor(config.action_high)
    assert torch.all(chunk >= low - 1e-5) and torch.all(chunk <= high + 1e-5)
    save_policy(policy, tmp_path / "p")
    again = load_policy(tmp_path / "p")
    torch.testing.assert_close(again.predict(images, joints, generator=torch.Generator().manual_seed(0)), chunk)
    runner = PolicyRunner(again)
    commands = [runner.act(np.zeros((96, 96, 3), np.uint8), np.zeros(3)) for _ in range(config.action_horizon + 1)]
    assert all(c.shape == (3,) and np.all(np.isfinite(c)) for c in commands)
    plans = []
    predict = again.predict
    again.predict = lambda *a, **k: plans.append(1) or predict(*a, **k)
    runner = PolicyRunner(again, action_horizon=2)  # a run-time choice: re-plan every 2 commands
    for _ in range(5):
        runner.act(np.zeros((96, 96, 3), np.uint8), np.zeros(3))
    assert len(plans) == 3
    for bad in (0, config.pred_horizon + 1):
        with pytest.raises(ValueError, match="action horizon"):
            PolicyRunner(again, action_horizon=bad)

    (tmp_path / "p" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(PolicyCheckpointError, match="corrupt weights"):
        load_policy(tmp_path / "p")
    with pytest.raises(PolicyCheckpointError, match="not a policy checkpoint"):
        load_policy(tmp_path / "missing")


def test_relative_chunks_are_offsets_from_the_newest_joints_and_old_checkpoints_stay_absolute():
    policy = DiffusionPolicy(PolicyConfig(joint_names=list(PROFILE.joints.names))).eval()
    joints = torch.tensor([[[0.0, 0.0, 0.0], [0.5, -1.0, 0.2]]])
    actions = torch.tensor([[[0.6, -0.9, 0.2]] * policy.config.pred_horizon])
    torch.testing.assert_close(policy.targets(joints, actions)[0, 0], torch.tensor([0.1, 0.1, 0.0]))
    images = torch.zeros((1, 2, 64, 64, 3), dtype=torch.uint8)
    relative = policy.predict(images, joints, generator=torch.Generator().manual_seed(0))
    policy.config.action_relative = False
    absolute = policy.predict(images, joints, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(relative - absolute, joints[:, -1:].expand_as(relative))  # offsets from the arm
    old = {**PolicyConfig().to_json()}
    del old["action_relative"], old["action_range"]
    assert PolicyConfig.from_json(old).action_relative is False and PolicyConfig.from_json(old).action_range == "joint"

    # Per-step ranges: each offset of the chunk is scaled by its own range (pred_horizon x joints).
    config = PolicyConfig(joint_names=list(PROFILE.joints.names), action_low=[[-0.05] * 3] * 16,
                          action_high=[[0.05 * (k + 1)] * 3 for k in range(16)])
    policy = DiffusionPolicy(config).eval()
    chunk = policy.predict(images, joints, generator=torch.Generator().manual_seed(0)) - joints[:, -1:]
    low, high = torch.tensor(config.action_low), torch.tensor(config.action_high)
    assert torch.all(chunk[0] >= low - 1e-5) and torch.all(chunk[0] <= high + 1e-5)
    assert chunk[0, 0].abs().max() <= 0.05 + 1e-5  # the next command stays within its own, narrow range
    with pytest.raises(PolicyCheckpointError, match="action_range"):
        DiffusionPolicy(PolicyConfig(action_range="chunk"))


def test_masked_joints_read_the_middle_of_their_range_and_readings_outside_it_are_counted():
    """Joints are scaled, not clamped (contact twists the robot's wrist, and real-demo policies act
    on it); ``mask_joints`` reads one at its middle whatever it reads."""
    config = PolicyConfig(joint_names=list(PROFILE.joints.names), joint_low=[-2.0, 0.0, -0.001],
                          joint_high=[0.5, 2.5, 0.001])
    policy = DiffusionPolicy(config).eval()
    images = torch.zeros((1, config.obs_horizon, 64, 64, 3), dtype=torch.uint8)
    condition = lambda *joints: policy.condition(images, torch.tensor([[joints] * config.obs_horizon]))
    assert not torch.allclose(condition(0.7, 1.0, 0.0), condition(0.5, 1.0, 0.0))  # beyond the range: still read
    assert not torch.allclose(condition(0.0, 1.0, 0.002), condition(0.0, 1.0, 0.0))
    runner = PolicyRunner(policy, mask_joints=("wrist_joint",))
    for wrist in (-0.01, 0.0009, 0.3):
        torch.testing.assert_close(condition(0.0, 1.0, wrist), condition(0.0, 1.0, 0.0))
    for wrist in (0.0, -0.01, 0.0005, 0.02):
        runner.act(np.zeros((64, 64, 3), np.uint8), np.array([-1.0, 1.0, wrist]))
    assert runner.frames == 4 and runner.frames_outside.tolist() == [0, 0, 2]
    runner.reset()
    assert runner.frames == 0 and runner.frames_outside.tolist() == [0, 0, 0]
    PolicyRunner(policy)  # unmasked again
    assert not torch.allclose(condition(0.0, 1.0, 0.3), condition(0.0, 1.0, 0.0))
    with pytest.raises(ValueError, match="cannot mask"):
        PolicyRunner(policy, mask_joints=("gripper",))
    # trained masking a joint: the checkpoint keeps it masked, whatever the runner is told
    import dataclasses
    trained_blind = DiffusionPolicy(dataclasses.replace(config, masked_joints=["wrist_joint"])).eval()
    assert trained_blind.masked_joints.tolist() == [False, False, True]
    PolicyRunner(trained_blind)
    assert trained_blind.masked_joints.tolist() == [False, False, True]
    assert PolicyConfig.from_json({k: v for k, v in config.to_json().items() if k != "masked_joints"}).masked_joints == []


def test_target_range_and_random_shift():
    from iws_policy.train import DemoSet, random_shift
    demos = DemoSet.__new__(DemoSet)
    demos.joints = np.array([[0.0], [1.0], [2.0]], np.float32)
    demos.actions = np.array([[1.0], [2.0], [2.5]], np.float32)
    demos.starts, demos.lengths = np.array([0]), np.array([3])
    demos.index = np.array([[0, 0], [0, 1], [0, 2]])
    config = PolicyConfig(joints=1, pred_horizon=2, action_range="joint")
    low, high = demos.target_range(config)  # targets: 1-0, 2-0, 2-1, 2.5-1, 2.5-2, 2.5-2
    assert low[0] == pytest.approx(0.5) and high[0] == pytest.approx(2.0)
    config.action_range = "step"  # the next command's offsets (1, 1, 0.5), the one after it's (2, 1.5, 0.5)
    low, high = demos.target_range(config)
    np.testing.assert_allclose(low, [[0.5], [0.5]])
    np.testing.assert_allclose(high, [[1.0], [2.0]])
    config.action_range = "joint"
    config.action_relative = False
    assert tuple(demos.target_range(config)) == (pytest.approx([1.0]), pytest.approx([2.5]))

    images = torch.randint(0, 255, (3, 2, 16, 16, 3), dtype=torch.uint8)
    assert torch.equal(random_shift(images, 0, np.random.default_rng(0)), images)
    shifted = random_shift(images, 3, np.random.default_rng(0))
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8 and not torch.equal(shifted, images)
    for sample in range(3):  # both frames of a sample moved alike: find the shift of frame 0, check frame 1
        matches = [(dy, dx) for dy in range(-3, 4) for dx in range(-3, 4)
                   if torch.equal(shifted[sample, 0, 3:13, 3:13], images[sample, 0, 3 + dy:13 + dy, 3 + dx:13 + dx])]
        assert len(matches) == 1
        dy, dx = matches[0]
        assert torch.equal(shifted[sample, 1, 3:13, 3:13], images[sample, 1, 3 + dy:13 + dy, 3 + dx:13 + dx])


def test_training_device_choice():
    from iws_policy.train import training_device
    assert training_device("cpu").type == "cpu"
    assert training_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            training_device("cuda")


@pytest.fixture(scope="module")
def tiny_policy(tiny_world_model, tmp_path_factory):
    """A Diffusion Policy trained briefly on the tiny world model's dataset; its loss must fall."""
    out = tmp_path_factory.mktemp("policy") / "policy"
    dataset = tiny_world_model.parent / "dataset"
    result = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "policy", "train", "--data", str(dataset),
                             "--out", str(out), "--steps", "60", "--batch", "8", "--save-every", "30", "--threads", "2"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["loss_last_50"] < summary["loss_first_50"], summary
    assert (out / "model.safetensors").is_file() and (out / "train_state.pt").is_file()
    return out


def test_policy_training_resumes(tiny_policy, tiny_world_model, tmp_path):
    import shutil
    config = json.loads((tiny_policy / "config.json").read_text())
    assert config["trained_steps"] == 60 and config["policy"]["joint_names"] == list(PROFILE.joints.names)
    resumed = tmp_path / "resumed"
    shutil.copytree(tiny_policy, resumed)
    marked = {**config, "policy": {**config["policy"], "joint_low": [v - 0.125 for v in config["policy"]["joint_low"]]}}
    (resumed / "config.json").write_text(json.dumps(marked))  # the scales the weights were trained with
    result = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "policy", "train", "--data",
                             str(tiny_world_model.parent / "dataset"), "--out", str(resumed), "--steps", "70",
                             "--batch", "8", "--resume", "--threads", "2"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed_config = json.loads((resumed / "config.json").read_text())
    assert resumed_config["trained_steps"] == 70
    assert "60/70" in result.stderr, "training did not continue from step 60"
    assert resumed_config["policy"]["joint_low"] == marked["policy"]["joint_low"], "a resumed run rescaled its inputs"
    blind = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "policy", "train", "--data",
                            str(tiny_world_model.parent / "dataset"), "--out", str(resumed), "--steps", "80",
                            "--batch", "8", "--resume", "--mask-joint", "wrist_joint"], capture_output=True, text=True, timeout=600)
    assert blind.returncode == 1 and "pass the same --mask-joint" in blind.stderr, blind.stderr[-2000:]
    # the training time is the whole run's, not the last invocation's (reports quote it as a run's compute)
    assert resumed_config["train_seconds"] > config["train_seconds"] > 0


def test_policy_training_stops_on_sigterm_with_the_current_step_saved(tiny_world_model, tmp_path):
    import signal
    out, log = tmp_path / "stopped", tmp_path / "train.log"
    status = sigterm_once_running([sys.executable, "-m", "iws_bringup.cli", "policy", "train", "--data",
                                   str(tiny_world_model.parent / "dataset"), "--out", str(out), "--steps", "100000",
                                   "--save-every", "100000", "--batch", "8", "--threads", "1"], log, "policy:")
    assert status == 128 + signal.SIGTERM, log.read_text()[-2000:]
    saved = torch.load(out / "train_state.pt", weights_only=False)["step"]
    assert saved > 0 and json.loads((out / "config.json").read_text())["trained_steps"] == saved
    assert f"stopped by SIGTERM after step {saved}," in log.read_text()


def test_policy_sees_through_a_frozen_world_model_encoder(tiny_world_model, tmp_path):
    from safetensors.torch import load_file
    dataset, out = tiny_world_model.parent / "dataset", tmp_path / "latent_policy"
    train = lambda *extra: subprocess.run([sys.executable, "-m", "iws_bringup.cli", "policy", "train", "--data", str(dataset),
                                           "--out", str(out), "--steps", "12", "--batch", "4", "--threads", "2", *extra],
                                          capture_output=True, text=True, timeout=600)
    result = train("--image-encoder", str(tiny_world_model))
    assert result.returncode == 0, result.stderr[-3000:]
    policy = load_policy(out)
    assert policy.config.image_encoder == "world_model" and policy.config.image_size == 32
    world = load_file(str(tiny_world_model / "model.safetensors"))
    for name, weight in policy.encoder.pretrained.state_dict().items():
        torch.testing.assert_close(weight, world["encoder." + name])  # copied in, and not trained
    assert policy.encoder.latent_mean.abs().sum() > 0 and not torch.allclose(policy.encoder.latent_std, torch.ones(4))
    command = PolicyRunner(policy).act(np.zeros((96, 96, 3), np.uint8), np.zeros(3))
    assert command.shape == (3,) and np.all(np.isfinite(command))

    mismatched = train("--resume", "--steps", "14")  # the run used --image-encoder; without it the weights differ
    assert mismatched.returncode == 1 and "--image-encoder" in mismatched.stderr and "Traceback" not in mismatched.stderr
    broken = train("--image-encoder", str(tmp_path / "no_such_model"))
    assert broken.returncode == 1 and "--image-encoder" in broken.stderr and "Traceback" not in broken.stderr


def test_encoded_demonstrations_train_again_from_their_file(tiny_world_model, tmp_path):
    """--save-demos keeps the latents; --data FILE.npz trains from them alone (no dataset, no images),
    with the same world-model encoder only."""
    from iws_policy.train import DemoSet
    dataset, demos_file = tiny_world_model.parent / "dataset", tmp_path / "demos.npz"

    def train(data, out, *extra):
        return subprocess.run([sys.executable, "-m", "iws_bringup.cli", "policy", "train", "--data", str(data),
                               "--out", str(tmp_path / out), "--steps", "4", "--batch", "4", "--threads", "2",
                               "--device", "cpu", *extra], capture_output=True, text=True, timeout=600)

    first = train(dataset, "from_dataset", "--image-encoder", str(tiny_world_model), "--save-demos", str(demos_file))
    assert first.returncode == 0, first.stderr[-3000:]
    saved = DemoSet.load(demos_file, tiny_world_model)
    assert saved.encoded and saved.images.dtype == np.float16 and saved.images.shape[1:] == (8, 8, 4)
    assert saved.images.shape[0] == saved.joints.shape[0] == saved.lengths.sum()

    again = train(demos_file, "from_file", "--image-encoder", str(tiny_world_model))
    assert again.returncode == 0, again.stderr[-3000:]
    config = json.loads((tmp_path / "from_file" / "config.json").read_text())
    assert config["data"][0]["demos_file"] == str(demos_file) and config["device"] == "cpu"
    first_policy, second_policy = load_policy(tmp_path / "from_dataset"), load_policy(tmp_path / "from_file")
    torch.testing.assert_close(first_policy.encoder.latent_mean, second_policy.encoder.latent_mean)
    assert first_policy.config.action_low == second_policy.config.action_low

    no_encoder = train(demos_file, "no_encoder")
    assert no_encoder.returncode == 1 and "--image-encoder" in no_encoder.stderr and "Traceback" not in no_encoder.stderr
    mixed = train(demos_file, "mixed", "--image-encoder", str(tiny_world_model), "--episodes", "2")
    assert mixed.returncode == 2 and "alone" in mixed.stderr
    demos_file.with_name("broken.npz").write_bytes(b"not a zip")
    broken = train(demos_file.with_name("broken.npz"), "broken", "--image-encoder", str(tiny_world_model))
    assert broken.returncode == 1 and "--save-demos" in broken.stderr and "Traceback" not in broken.stderr


def test_pose_encoder_reads_the_t_relative_to_the_goal_and_trains_from_saved_features(sim, tiny_world_model, tmp_path):
    """``--image-encoder pose``: the pixel pose estimator reads the T from the policy's 64 px image
    (the offset from the goal in 10 cm units, the relative yaw as cos/sin, a found flag), the
    features are computed once, saved with --save-demos and only trained from with the same encoder."""
    from iws_policy.diffusion import PoseEncoder
    from iws_policy.train import DemoSet
    encoder = PoseEncoder(PolicyConfig())
    goal = PushT.GOAL.copy()
    sim.reset(3)
    offset = np.array([0.03, -0.02, 0.4])
    sim.task.block.set(sim.data, goal + offset)
    sim.step(sim.joint_positions())
    image = PolicyRunner(DiffusionPolicy(PolicyConfig(image_encoder="pose")))._resize(sim.render())
    features = encoder.latents(torch.from_numpy(np.stack([image, np.zeros_like(image)]))).numpy()
    np.testing.assert_allclose(features[0, :2], offset[:2] / 0.1, atol=0.05)  # within 5 mm, half a pixel at 64 px
    np.testing.assert_allclose(features[0, 2:], [math.cos(0.4), math.sin(0.4), 1.0], atol=0.05)
    assert features[1].tolist() == [0.0] * 5  # no T in a black frame

    dataset, demos_file = tiny_world_model.parent / "dataset", tmp_path / "poses.npz"

    def train(data, out, *extra):
        return subprocess.run([sys.executable, "-m", "iws_bringup.cli", "policy", "train", "--data", str(data),
                               "--out", str(tmp_path / out), "--steps", "4", "--batch", "4", "--threads", "2",
                               "--device", "cpu", *extra], capture_output=True, text=True, timeout=600)

    first = train(dataset, "from_dataset", "--image-encoder", "pose", "--save-demos", str(demos_file))
    assert first.returncode == 0, first.stderr[-3000:]
    saved = DemoSet.load(demos_file, "pose")
    assert saved.encoded and saved.images.shape == (saved.lengths.sum(), 5)
    assert saved.images[:, 4].min() == 1.0  # the T is found in every frame of the reference robot's episodes
    policy = load_policy(tmp_path / "from_dataset")
    assert policy.config.image_encoder == "pose" and json.loads((tmp_path / "from_dataset" / "config.json").read_text())["shift_px"] == 0
    command = PolicyRunner(policy).act(sim.render(), sim.joint_positions())
    assert command.shape == (3,) and np.all(np.isfinite(command))

    again = train(demos_file, "from_file", "--image-encoder", "pose")
    assert again.returncode == 0, again.stderr[-3000:]
    other = train(demos_file, "other_encoder", "--image-encoder", str(tiny_world_model))
    assert other.returncode == 1 and "pose estimator" in other.stderr and "Traceback" not in other.stderr


def test_successful_only_keeps_the_episodes_that_ended_in_success(tiny_world_model, tmp_path):
    import shutil
    from iws_policy.train import DemoSet
    dataset = tmp_path / "dataset"
    shutil.copytree(tiny_world_model.parent / "dataset", dataset)
    meta = json.loads((dataset / "meta.json").read_text())
    train_episodes = [e for e in meta["episodes"] if e["split"] == "train"]
    for e in meta["episodes"]:
        e["success"] = False
    train_episodes[1]["success"] = True
    (dataset / "meta.json").write_text(json.dumps(meta))
    config = PolicyConfig(image_size=32)
    demos = DemoSet([(str(dataset), 1)], config, successful_only=True)
    assert demos.lengths.tolist() == [train_episodes[1]["length"]]
    assert demos.used == [{"data": str(dataset), "episodes": 1, "successful_only": True}]
    with pytest.raises(ValueError, match="1 successful episodes"):
        DemoSet([(str(dataset), 2)], config, successful_only=True)

    train_episodes[1]["success"] = False
    (dataset / "meta.json").write_text(json.dumps(meta))
    result = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "policy", "train", "--data", str(dataset),
                             "--out", str(tmp_path / "out"), "--steps", "2", "--successful-only"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "no successful episodes" in result.stderr and "Traceback" not in result.stderr


def test_synthetic_demos_inside_the_world_model_build_a_dataset(tiny_world_model, tmp_path):
    bags = tmp_path / "demos_wm"
    run = lambda: subprocess.run([sys.executable, "-m", "iws_bringup.cli", "collect", "--backend", "world_model",
                                  "--model", str(tiny_world_model), "--episodes", "2", "--steps", "6",
                                  "--out", str(bags), "--no-progress"], capture_output=True, text=True, timeout=300)
    first = run()
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in bags.iterdir()) == ["episode_000000", "episode_000001"]
    assert "all 2" in run().stdout or run().returncode == 0  # a rerun resumes (nothing to do)
    from iws_data.builder import build_dataset
    from iws_data.dataset import Dataset
    dataset, _ = build_dataset([bags], tmp_path / "dataset", size=64, val_fraction=0.0, progress=False)
    ds = Dataset(dataset)
    assert len(ds.episodes) == 2 and all(e.length == 7 for e in ds.episodes)
    assert np.all(np.isfinite(ds.actions[:])) and ds.images.shape[1:] == (64, 64, 3)


@pytest.mark.parametrize("player", ["checkpoint", "noisy_expert"])
def test_policy_rollouts_on_the_reference_robot_are_recorded_as_play_data(player, request, tmp_path):
    """`iws collect --policy CKPT|expert[:noise=STD]`: the policy drives the reference robot from its
    camera image; each episode is reseeded from its own seed, so episode 1 collected alone is the
    same episode."""
    import yaml

    from iws_data.builder import build_dataset
    from iws_data.dataset import Dataset

    tiny_policy = request.getfixturevalue("tiny_policy") if player == "checkpoint" else "expert:noise=0.02"

    def run(out, *extra):
        return subprocess.run([sys.executable, "-m", "iws_bringup.cli", "collect", "--policy", str(tiny_policy),
                               "--episodes", "2", "--steps", "6", "--seed", "11", "--out", str(out), "--no-progress",
                               *extra], capture_output=True, text=True, timeout=300)

    both = run(tmp_path / "both")
    assert both.returncode == 0, both.stderr[-3000:]
    assert "policies {'policy': 2}" in both.stdout
    metadata = yaml.safe_load((tmp_path / "both" / "episode_000001" / "metadata.yaml").read_text())
    custom = metadata["rosbag2_bagfile_information"]["custom_data"]
    assert custom["policy"] == "policy" and custom["policy_checkpoint"] == str(tiny_policy)
    alone = run(tmp_path / "alone", "--start", "1")
    assert alone.returncode == 0, alone.stderr[-3000:]
    datasets = [Dataset(build_dataset([tmp_path / name / "episode_000001"], tmp_path / f"{name}_ds", size=32,
                                      val_fraction=0.0, progress=False)[0]) for name in ("both", "alone")]
    first, again = (np.asarray(d.actions[:]) for d in datasets)
    assert first.shape == (7, PROFILE.joints.count) and np.all(np.isfinite(first))
    np.testing.assert_array_equal(first, again)
    assert np.abs(first[1:] - first[0]).max() > 1e-6, "the policy never changed its command"
    if player == "noisy_expert":  # the pixel expert without noise is named as in iws evaluate
        plain = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "collect", "--policy", "expert", "--episodes",
                                "1", "--steps", "3", "--out", str(tmp_path / "plain"), "--no-progress"],
                               capture_output=True, text=True, timeout=300)
        assert plain.returncode == 0 and "policies {'policy': 1}" in plain.stdout, plain.stderr[-3000:]
        return
    missing = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "collect", "--mix", "policy=1", "--episodes", "1",
                              "--out", str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "--policy CKPT" in missing.stderr


@pytest.mark.parametrize("backend", ["reference", "world_model"])
def test_evaluate_through_ros_from_matched_starts(backend, tiny_policy, tiny_world_model, tmp_path):
    result = evaluate(str(tiny_policy), backend, episodes=2, steps=8, seed=77, model=str(tiny_world_model),
                      videos=1, out=tmp_path, progress=False)
    assert result["episodes"] == 2 and 0.0 <= result["success_rate"] <= 1.0
    assert result["ci95"][0] <= result["success_rate"] <= result["ci95"][1]
    assert [r["seed"] for r in result["per_episode"]] == [77, 78]
    assert all(math.isfinite(r["pixel_best_score"]) for r in result["per_episode"])
    for row in result["per_episode"]:  # every frame's score is kept, so other verdict rules can be replayed
        assert len(row["pixel_scores"]) == 9 and max(row["pixel_scores"]) == pytest.approx(row["pixel_best_score_any_frame"], abs=1e-4)
        assert backend == "world_model" or len(row["truth_scores"]) >= 5
        assert len(row["joints_outside_range"]) == 3 and all(0.0 <= x <= 1.0 for x in row["joints_outside_range"])
    assert result["joint_inputs"] == AS_READ and len(result["joints_outside_range"]) == 3
    assert (tmp_path / "episode_000.mp4").stat().st_size > 0
    assert json.loads((tmp_path / "evaluation.json").read_text())["backend"] == backend
    if backend == "reference":
        assert result["scorer_agreement"] is not None


@pytest.mark.parametrize("backend", ["reference", "world_model"])
def test_a_rerun_replays_the_evaluation_frame_for_frame(backend, tiny_policy, tiny_world_model, tmp_path, monkeypatch):
    """The world model's noise follows the episode's seed and no step overtakes the command sent
    before it, so the same evaluation run twice sees the same frames on either backend."""
    import iws_data.video
    runs = []
    monkeypatch.setattr(iws_data.video, "write_mp4", lambda frames, path, **kw: runs.append(np.stack(frames)))
    for name in ("first", "again"):
        evaluate(str(tiny_policy), backend, episodes=1, steps=8, seed=77, model=str(tiny_world_model),
                 videos=1, out=tmp_path / name, progress=False)
    assert len(runs) == 2 and runs[0].shape[0] == 9
    assert np.array_equal(runs[0], runs[1]), [int(np.abs(a.astype(int) - b).max()) for a, b in zip(*runs)]


def test_evaluation_continues_where_a_failed_run_stopped(tiny_policy, tmp_path, monkeypatch):
    first = evaluate(str(tiny_policy), "reference", episodes=2, steps=6, seed=91, out=tmp_path, progress=False)
    progress = tmp_path / "episodes.jsonl"
    lines = progress.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["evaluation"]["seed"] == 91
    fits = first["per_episode"][0]["pixel_fits"]  # the robot draws a sharp T: its silhouette fits
    assert len(fits) == 7 and float(np.median(fits)) > 0.8, fits
    # as a run killed during its second episode leaves it: one episode done, the next one cut off mid-line
    progress.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:40])
    resumed = evaluate(str(tiny_policy), "reference", episodes=3, steps=6, seed=91, out=tmp_path, progress=False)
    assert resumed["resumed_episodes"] == 1 and resumed["episodes"] == 3
    assert [r["seed"] for r in resumed["per_episode"]] == [91, 92, 93]
    assert resumed["per_episode"][0] == first["per_episode"][0]  # kept, not run again
    assert resumed["per_episode"][1]["pixel_scores"] == first["per_episode"][1]["pixel_scores"]  # lockstep: same episode
    assert len(progress.read_text().splitlines()) == 4
    fewer = evaluate(str(tiny_policy), "reference", episodes=2, steps=6, seed=91, out=tmp_path, progress=False)
    assert fewer["resumed_episodes"] == 2 and fewer["per_episode"] == resumed["per_episode"][:2]
    assert len(progress.read_text().splitlines()) == 4  # the third episode stays in the file
    import iws_policy.evaluate as evaluate_module

    def no_backend(*args, **kwargs):
        raise AssertionError("a backend was started with every episode already done")
    monkeypatch.setattr(evaluate_module, "BackendSession", no_backend)
    again = evaluate(str(tiny_policy), "reference", episodes=3, steps=6, seed=91, out=tmp_path, progress=False)
    assert again["resumed_episodes"] == 3 and again["per_episode"] == resumed["per_episode"]
    assert again["policy_weights"] == json.loads(lines[0])["evaluation"]["policy_weights"] is not None
    monkeypatch.undo()
    other = evaluate(str(tiny_policy), "reference", episodes=1, steps=6, seed=500, out=tmp_path, progress=False)
    assert other["resumed_episodes"] == 0 and other["per_episode"][0]["seed"] == 500  # another evaluation's file is replaced
    masked = evaluate(str(tiny_policy), "reference", episodes=1, steps=6, seed=500, out=tmp_path, progress=False,
                      mask_joints=("wrist_joint",))
    assert masked["resumed_episodes"] == 0 and masked["joint_inputs"].endswith("wrist_joint")  # an ablation is its own run


def test_experiment_runs_evaluations_side_by_side(tiny_policy, tmp_path):
    """`iws experiment datamix --jobs 2`: two `iws evaluate` processes at once, the report from their results,
    and a rerun that finds both on disk starts none."""
    command = [sys.executable, "-m", "iws_bringup.cli", "experiment", "datamix", "--policy", f"a={tiny_policy}",
               "--policy", f"b={tiny_policy}", "--wm-fraction", "a=0", "--wm-fraction", "b=1", "--episodes", "1",
               "--steps", "4", "--seed", "7", "--jobs", "2", "--out", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("evaluating ") == 2, result.stderr[-3000:]
    for name in ("a", "b"):
        evaluation = json.loads((tmp_path / f"reference_{name}" / "evaluation.json").read_text())
        assert evaluation["episodes"] == 1 and evaluation["per_episode"][0]["seed"] == 7
        assert (tmp_path / f"reference_{name}" / "evaluate.log").is_file()
    report = json.loads((tmp_path / "datamix.json").read_text())
    assert [row["name"] for row in report["policies"]] == ["a", "b"]
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "evaluating " not in again.stderr, again.stderr[-3000:]


def test_policy_node_drives_a_backend_it_does_not_know(tiny_policy, domain_id, start_backend, ros_client, tmp_path):
    start_backend("reference", mode="realtime")
    joints = ros_client.collect(JointState, PROFILE.topics.joint_states)
    policy = NodeProcess([sys.executable, "-m", "iws_bringup.cli", "up", "policy", "--checkpoint", str(tiny_policy)],
                         domain_id, tmp_path / "policy.log")
    try:
        ros_client.wait_for(joints, 1, timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "policy up" not in policy.output():
            assert policy.alive(), policy.output()[-2000:]
            time.sleep(0.2)
        start = np.asarray(joints[-1].position)
        time.sleep(4.0)
        moved = np.abs(np.asarray(joints[-1].position) - start).max()
        assert moved > 1e-3, f"the arm did not move under the policy:\n{policy.output()[-2000:]}"
    finally:
        assert policy.stop() in (0, -2), policy.output()[-2000:]


def test_experiment_reports_from_cached_evaluations(tmp_path, monkeypatch):
    """The reports' statistics and plots, from evaluations already on disk (as a rerun resumes)."""
    from iws_policy.evaluate import LOST_FRAMES, model_weights
    from iws_policy.experiments import correlation, datamix, mmrv, pearson
    from iws_reference_robot.scoring import scorer_identity

    assert mmrv([0.1, 0.5, 0.9], [0.2, 0.4, 0.8]) == 0.0 and mmrv([0.9, 0.5, 0.1], [0.2, 0.4, 0.8]) > 0.5
    assert pearson([0, 1, 2], [0, 2, 4]) == pytest.approx(1.0) and math.isnan(pearson([1, 1], [0, 1]))
    rates = {"a": (0.8, 0.7), "b": (0.4, 0.5), "c": (0.1, 0.0)}
    for name, (real, sim) in rates.items():
        for backend, rate in (("reference", real), ("world_model", sim)):
            d = tmp_path / "corr" / f"{backend}_{name}"
            d.mkdir(parents=True)
            weights = model_weights(None) if backend == "world_model" else None
            (d / "evaluation.json").write_text(json.dumps({"policy": f"/ckpt/{name}", "episodes": 4, "steps": 9, "seed": 1, "lost_frames_rule": LOST_FRAMES,
                                                           "model_weights": weights, "scorer": scorer_identity(),
                                                           "success_rate": rate,
                                                           "ci95": [0, 1], "seconds": 1.0, "truth_success_rate": rate,
                                                           "per_episode": [{"pixel_best_score": rate / 2}]}))
    result = correlation({n: f"/ckpt/{n}" for n in rates}, tmp_path / "corr", 4, 9, 1, None)
    assert result["policies"][0]["episode_agreement"]["episodes"] == 0  # no per-episode verdicts: nothing to pair
    assert result["pearson_r"] > 0.9 and result["mmrv"] == 0.0 and result["pearson_r_coverage"] > 0.9
    assert result["pearson_r_reference_truth"] > 0.9 and "ground truth" in (tmp_path / "corr" / "README.md").read_text()
    assert not result["bar_met"], "the bar needs at least 8 policies"
    assert result["pearson_r_bootstrap"]["draws"] == 0, "no per-episode verdicts: nothing to resample"
    assert (tmp_path / "corr" / "correlation.png").stat().st_size > 0 and "Pearson r" in (tmp_path / "corr" / "README.md").read_text()
    import shutil
    shutil.copytree(tmp_path / "corr", tmp_path / "mix")

    # Episode by episode: equal rates, verdicts that agree no more than chance.
    from iws_policy.experiments import episode_agreement
    episode = lambda seed, success, score: {"seed": seed, "success": success, "pixel_best_score": score}
    robot = {"per_episode": [episode(s, s % 2 == 0, 0.9 if s % 2 == 0 else 0.3) for s in range(8)]}
    same = {"per_episode": list(reversed(robot["per_episode"]))}  # paired by seed, not by position
    crossed = {"per_episode": [episode(s, s < 4, 0.9 if s < 4 else 0.3) for s in range(8)]}
    assert episode_agreement(robot, same) == {"episodes": 8, "agreement": 1.0, "kappa": 1.0, "coverage_r": pytest.approx(1.0),
                                              "both": 4, "robot_only": 0, "world_model_only": 0, "neither": 4}
    crossed_agreement = episode_agreement(robot, crossed)
    assert crossed_agreement["agreement"] == 0.5 and crossed_agreement["kappa"] == pytest.approx(0.0)
    assert (crossed_agreement["both"], crossed_agreement["robot_only"], crossed_agreement["world_model_only"]) == (2, 2, 2)
    constant = episode_agreement(robot, {"per_episode": [episode(s, True, 1.0) for s in range(8)]})
    assert constant["kappa"] == pytest.approx(0.0) and math.isnan(constant["coverage_r"])  # a side that always wins
    everywhere = {"per_episode": [episode(s, True, 1.0) for s in range(8)]}
    assert math.isnan(episode_agreement(everywhere, everywhere)["kappa"])  # both constant: chance is everything

    # How sure r is: the matched start states resampled, the same draw for every policy and backend.
    from iws_policy.experiments import bootstrap_pearson, verdicts_by_seed
    def family(rates, flip=0):
        """Per policy, 20 episodes whose robot verdicts win that share; the model's are the robot's with
        ``flip`` of them turned over, at other start states per policy."""
        out = []
        for k, rate in enumerate(rates):
            wins = [s < rate * 20 for s in range(20)]
            model = [w != ((s + 7 * k) % 20 < flip) for s, w in enumerate(wins)]
            out.append(verdicts_by_seed({"per_episode": [episode(s, w, 0.0) for s, w in enumerate(wins)]},
                                        {"per_episode": [episode(s, m, 0.0) for s, m in enumerate(model)]}))
        return out
    exact = bootstrap_pearson(family([0.9, 0.6, 0.3, 0.1]))
    assert exact["episodes"] == 20 and exact["ci95"] == pytest.approx([1.0, 1.0]) and exact["share_at_bar"] == 1.0
    noisy = bootstrap_pearson(family([0.9, 0.6, 0.3, 0.1], flip=6))
    assert noisy["ci95"][0] < noisy["ci95"][1] < 1.0 and noisy["share_at_bar"] < exact["share_at_bar"]
    assert bootstrap_pearson(family([0.5]))["draws"] == 0  # one policy: no r to resample
    for name, (real, sim) in rates.items():  # the report resamples the verdicts its evaluations carry
        for backend, rate in (("reference", real), ("world_model", sim)):
            d = tmp_path / "corr_episodes" / f"{backend}_{name}"
            d.mkdir(parents=True)
            verdicts = [episode(1 + e, e < rate * 10, 0.5) for e in range(10)]
            (d / "evaluation.json").write_text(json.dumps({
                "policy": f"/ckpt/{name}", "episodes": 10, "steps": 9, "seed": 1, "lost_frames_rule": LOST_FRAMES,
                "model_weights": model_weights(None) if backend == "world_model" else None, "scorer": scorer_identity(),
                "success_rate": rate, "ci95": [0, 1], "seconds": 1.0, "per_episode": verdicts}))
    resampled = correlation({n: f"/ckpt/{n}" for n in rates}, tmp_path / "corr_episodes", 10, 9, 1, None)
    assert resampled["pearson_r_bootstrap"]["episodes"] == 10 and resampled["policies"][0]["verdicts"][0] == [1, 1, 1]
    assert "Resampling the 10 matched start states" in (tmp_path / "corr_episodes" / "README.md").read_text()
    mix = datamix({"a": "/ckpt/a", "c": "/ckpt/c"}, {"a": 0.0, "c": 1.0}, tmp_path / "mix", 4, 9, 1)
    assert mix["wm_over_real"] == pytest.approx(0.1 / 0.8) and not mix["bar_met"]
    assert mix["wm_over_real_coverage"] == pytest.approx(0.1 / 0.8)
    assert (tmp_path / "mix" / "datamix.png").is_file()

    import iws_policy.evaluate as evaluate_module
    from iws_policy.experiments import evaluation
    reruns = []
    monkeypatch.setattr(evaluate_module, "evaluate", lambda *a, **k: reruns.append(k["action_horizon"]) or {})
    evaluation("/ckpt/a", "reference", tmp_path / "mix" / "reference_a", 4, 9, 1, None)  # cached, the checkpoint's horizon
    evaluation("/ckpt/a", "reference", tmp_path / "mix" / "reference_a", 4, 9, 1, None, action_horizon=2)
    evaluation("/ckpt/other", "reference", tmp_path / "mix" / "reference_a", 4, 9, 1, None)
    assert reruns == [2, None], "an evaluation with another action horizon or checkpoint is not the cached one"
    shipped = Path(evaluate_module.default_model_dir())
    other_model, other_noise = tmp_path / "other_model", tmp_path / "other_noise"
    for model in (other_model, other_noise):
        model.mkdir()
        shutil.copy(shipped / "config.json", model / "config.json")
    (other_model / "model.safetensors").write_bytes(b"other weights")
    shutil.copy(shipped / "model.safetensors", other_noise / "model.safetensors")
    meta = json.loads((other_noise / "config.json").read_text())
    meta["model"]["frozen_noise"] = "all" if meta["model"].get("frozen_noise") != "all" else "none"
    (other_noise / "config.json").write_text(json.dumps(meta))
    evaluation("/ckpt/a", "world_model", tmp_path / "mix" / "world_model_a", 4, 9, 1, None)  # cached: the same weights
    evaluation("/ckpt/a", "world_model", tmp_path / "mix" / "world_model_a", 4, 9, 1, str(other_model))
    assert reruns == [2, None, None], "an evaluation in another world model is not the cached one"
    evaluation("/ckpt/a", "world_model", tmp_path / "mix" / "world_model_a", 4, 9, 1, str(other_noise))
    assert reruns == [2, None, None, None], "the same weights sampled another way are not the cached model"
    cached = tmp_path / "mix" / "reference_a" / "evaluation.json"
    judged_before = {**json.loads(cached.read_text()), "scorer": scorer_identity(0.92)}
    cached.write_text(json.dumps(judged_before))
    evaluation("/ckpt/a", "reference", tmp_path / "mix" / "reference_a", 4, 9, 1, None)
    assert reruns == [2, None, None, None, None], "an evaluation judged by another pixel scorer is not the cached one"
    cached.write_text(json.dumps({**judged_before, "scorer": scorer_identity(), "policy_weights": "other digest"}))
    evaluation("/ckpt/a", "reference", tmp_path / "mix" / "reference_a", 4, 9, 1, None)
    assert reruns == [2, None, None, None, None, None], "a checkpoint retrained at the same path is not the cached one"
