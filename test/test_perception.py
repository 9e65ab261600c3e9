"""The T's pose from pixels agrees with simulator ground truth, and the expert can act on it."""
from __future__ import annotations

import math

import numpy as np
import pytest

from iws_common.profile import load_profile
from iws_reference_robot.experts import make_expert
from iws_reference_robot.perception import PushTPoseEstimator
from iws_reference_robot.sim import ReferenceSim

PROFILE = load_profile("reference_arm")


@pytest.fixture(scope="module")
def sim():
    sim = ReferenceSim(PROFILE, task="push_t", seed=0)
    yield sim
    sim.close()


def angle_error(a: float, b: float) -> float:
    return abs((a - b + math.pi) % (2 * math.pi) - math.pi)


def test_pose_from_pixels_matches_ground_truth(sim):
    estimator = PushTPoseEstimator(PROFILE)
    position_errors, yaw_errors = [], []
    for seed in range(8):
        sim.reset(seed)
        expert = make_expert("push_t", sim)
        expert.reset(np.random.default_rng(seed))
        for step in range(30):
            sim.step(expert.act(sim.task_state(), sim.joint_positions()))
            if step % 10 == 9:
                estimate = estimator.estimate(sim.render())
                truth = sim.task_state().object_poses[0]
                assert estimate.found
                position_errors.append(np.linalg.norm(estimate.pose[:2] - truth[:2]))
                yaw_errors.append(angle_error(estimate.pose[2], truth[2]))
    # One pixel is about 7 mm on the table at 96x96.
    assert np.median(position_errors) < 0.003 and max(position_errors) < 0.01
    assert np.degrees(np.median(yaw_errors)) < 2.0 and np.degrees(max(yaw_errors)) < 6.0


def test_pose_from_smaller_images(sim):
    """World-model frames are smaller than the camera's: the estimate rescales the intrinsics."""
    import torch
    import torch.nn.functional as F

    estimator = PushTPoseEstimator(PROFILE)
    sim.reset(3)
    image = sim.render()
    small = F.interpolate(torch.from_numpy(image).permute(2, 0, 1)[None].float(), size=(64, 64), mode="area")
    small = small[0].permute(1, 2, 0).round().to(torch.uint8).numpy()
    estimate = estimator.estimate(small)
    truth = sim.task_state().object_poses[0]
    assert estimate.found
    assert np.linalg.norm(estimate.pose[:2] - truth[:2]) < 0.01
    assert np.degrees(angle_error(estimate.pose[2], truth[2])) < 8.0


def test_no_t_in_view_is_not_found():
    estimate = PushTPoseEstimator(PROFILE).estimate(np.full((96, 96, 3), 200, np.uint8))
    assert not estimate.found and np.all(np.isnan(estimate.pose))


def test_score_from_pixels_matches_ground_truth_score(sim):
    estimator = PushTPoseEstimator(PROFILE)
    sim.reset(0)
    sim.task.block.set(sim.data, sim.task.GOAL)  # the T exactly at its goal
    import mujoco
    mujoco.mj_forward(sim.model, sim.data)
    estimate = estimator.estimate(sim.render())
    assert sim.task_state().score > 0.99
    assert estimator.score(estimate.pose) > 0.9
