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

    def __init__(self, profile: RobotProfile, seed: int = 0):
        from .sim import ReferenceSim

        self.kinematics = ReferenceSim(profile, task="push_t", seed=seed)  # kinematics only, never stepped
        self.estimator = PushTPoseEstimator(profile)
        self.expert = PushTExpert(self.kinematics)
        self.expert.reset(np.random.default_rng(seed))
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
        return self.expert.act(state, np.asarray(joint_positions, dtype=np.float64))

    def close(self) -> None:
        self.kinematics.close()
