"""The scripted push_t expert acting on pixels: camera image and joint positions in, command out.

No ROS here, so the ROS policy node, evaluation and tests share it. The T's pose comes from the
image (``perception.PushTPoseEstimator``), never from simulator ground truth; the arm's kinematics
(for inverse kinematics) come from the reference scene's model, as a real policy knows its robot's.
"""
from __future__ import annotations

import numpy as np

from iws_common.profile import RobotProfile

from .experts import PushTExpert
from .perception import PushTPoseEstimator
from .tasks import TaskState


class PushTExpertPolicy:
    """Image + joint positions -> joint command; no ROS, so tests and evaluation can call it."""

    def __init__(self, profile: RobotProfile, seed: int = 0, command_noise: float = 0.0, speed: float = 1.0):
        """Two ways to make it worse, each a family of experts whose success spans a range, for judging
        a simulator as an evaluator of policies: ``command_noise``, the std (rad) of Gaussian noise
        added to every joint of every command, drawn from ``seed`` (the same seed gives the same noise
        on either backend); ``speed``, the fraction of the expert's largest pusher step per command
        that it may take (a slower expert may run out of episode)."""
        from .sim import ReferenceSim

        if not (np.isfinite(command_noise) and command_noise >= 0):
            raise ValueError(f"command_noise must be a finite number >= 0 (rad), got {command_noise!r}")
        if not (np.isfinite(speed) and 0 < speed <= 1):
            raise ValueError(f"speed must be in (0, 1] (a fraction of the expert's step), got {speed!r}")
        self.kinematics = ReferenceSim(profile, task="push_t", seed=seed)  # kinematics only, never stepped
        self.estimator = PushTPoseEstimator(profile)
        self.expert = PushTExpert(self.kinematics)
        self.expert.max_step *= speed
        self.command_noise = float(command_noise)
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        """A new episode (the runner interface of ``iws_policy``): ``seed`` reseeds the expert and its
        command noise, so the episode is the one a fresh expert with that seed would play."""
        seed = self.seed if seed is None else int(seed)
        self.seed = seed
        self.expert.reset(np.random.default_rng(seed))
        self.noise_rng = np.random.default_rng([seed, 1])
        self.last_estimate = None

    def act(self, image: np.ndarray, joint_positions: np.ndarray) -> np.ndarray | None:
        """The next joint command, or None while the T is not visible (the caller holds position)."""
        estimate = self.estimator.estimate(image)
        self.last_estimate = estimate
        if not estimate.found:
            return None
        score = self.estimator.score(estimate.pose)
        state = TaskState(task="push_t", score=score, success=score >= 0.95,
                          object_poses=estimate.pose[None, :], goal_pose=self.estimator.goal.copy())
        command = self.expert.act(state, np.asarray(joint_positions, dtype=np.float64))
        if self.command_noise:
            command = command + self.noise_rng.normal(0.0, self.command_noise, np.shape(command))
        return command

    def close(self) -> None:
        self.kinematics.close()


def drive_pixel_expert(sim, profile: RobotProfile, seed: int, steps: int, command_noise: float = 0.0,
                       speed: float = 1.0):
    """The pixel expert driving the in-process reference sim from ``seed`` (no ROS): yields each
    frame with the simulator's task state before acting on it, so callers can judge the frames
    against ground truth (the scorer's validation, tests)."""
    from iws_common.commands import JointCommandFollower

    sim.reset(seed)
    follower = JointCommandFollower(profile.joints)
    follower.reset(sim.joint_positions())
    policy = PushTExpertPolicy(profile, seed=seed, command_noise=command_noise, speed=speed)
    dt = profile.control_period_s
    try:
        for step in range(steps):
            image = sim.render()
            yield image, sim.task_state()
            command = policy.act(image, sim.joint_positions())
            if command is not None:
                follower.set_position_command(command)
            sim.step(follower.step(step * dt, dt))
    finally:
        policy.close()
