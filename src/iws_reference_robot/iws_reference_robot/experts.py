"""Scripted policies for play data and demos: joint setpoints from (task state, joint positions).

Every policy plans in pusher (x, y) space, moves at most max_step per control period (physically
plausible at 10 Hz) and maps the target to joints with the sim's IK, always on elbow branch +1: a
branch switch would swing the whole arm through the workspace.
"""
from __future__ import annotations

import math

import numpy as np

from .scene import PUSHER_RADIUS
from .tasks import T_BOXES, Rope, TaskState, distance_to_boxes, rot2, to_local, wrap_angle

# Where the pusher may go: reachable on elbow branch +1 and fully in the camera view.
PUSHER_X = (-0.25, 0.25)
PUSHER_Y = (0.16, 0.44)
SAFE_POINT = np.array([0.0, 0.3])


class Expert:
    """Common plumbing: workspace clipping, step limiting and IK."""

    def __init__(self, sim, max_step: float = 0.03):
        self.sim = sim
        self.max_step = max_step
        self.rng = np.random.default_rng(0)
        self.wrist = 0.0

    def reset(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def act(self, task_state: TaskState, joint_positions: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def pusher(self, joint_positions) -> np.ndarray:
        return self.sim.forward_kinematics(joint_positions)

    def reachable(self, xy) -> np.ndarray:
        """The closest point to xy (roughly) that the pusher reaches on elbow branch +1."""
        p = np.clip(np.asarray(xy, dtype=np.float64), [PUSHER_X[0], PUSHER_Y[0]], [PUSHER_X[1], PUSHER_Y[1]])
        r_min, r_max = self.sim.reach
        r = np.linalg.norm(p)
        p = p * np.clip(r, r_min + 0.01, r_max - 0.01) / max(r, 1e-9)
        for _ in range(20):
            q12 = self.sim._ik_solution(p, +1.0)
            if self.sim.lower[0] <= q12[0] <= self.sim.upper[0]:
                return p
            p = p + 0.2 * (SAFE_POINT - p)
        return SAFE_POINT.copy()

    def move_toward(self, target_xy, joint_positions, max_step: float | None = None) -> np.ndarray:
        current = self.pusher(joint_positions)
        delta = self.reachable(target_xy) - current
        limit = self.max_step if max_step is None else max_step
        norm = np.linalg.norm(delta)
        if norm > limit:
            delta *= limit / norm
        goal = self.reachable(current + delta)
        return self.sim.inverse_kinematics(goal, wrist=self.wrist, elbow_sign=+1)


# ----------------------------------------------------------------------------------------------
# push_t

def _t_contact_candidates(spacing: float = 0.004) -> tuple[np.ndarray, np.ndarray]:
    """Points on the T's outline (COM frame) and their outward normals, away from corners."""
    (bx, by, bhx, bhy), (sx, sy, shx, shy) = T_BOXES
    top, bar_low, stem_low = by + bhy, by - bhy, sy - shy
    r = PUSHER_RADIUS
    edges = [  # (start, end, outward normal)
        ((-bhx, top), (bhx, top), (0, 1)),
        ((-bhx, bar_low), (-bhx, top), (-1, 0)),
        ((bhx, bar_low), (bhx, top), (1, 0)),
        ((-bhx, bar_low), (-shx - r, bar_low), (0, -1)),
        ((shx + r, bar_low), (bhx, bar_low), (0, -1)),
        ((-shx, stem_low), (-shx, bar_low - r), (-1, 0)),
        ((shx, stem_low), (shx, bar_low - r), (1, 0)),
        ((-shx, stem_low), (shx, stem_low), (0, -1)),
    ]
    points, normals = [], []
    for a, b, n in edges:
        a, b = np.array(a), np.array(b)
        length = np.linalg.norm(b - a)
        margin = 0.003
        if length <= 2 * margin:
            continue
        count = max(2, int(round((length - 2 * margin) / spacing)) + 1)
        for t in np.linspace(margin / length, 1 - margin / length, count):
            points.append(a + t * (b - a))
            normals.append(n)
    return np.array(points), np.array(normals, dtype=np.float64)


class PushTExpert(Expert):
    """Pick the T outline point whose push best reduces the pose error, go around, push, repeat.

    A push at a contact point along the inward normal is predicted (quasi-static, ellipsoidal
    limit surface) to move the block along the normal and turn it by the push's torque; the
    expert scores every candidate by the alignment of that motion with the remaining error.
    """

    ROT_WEIGHT = 0.05      # metres per radian of yaw error (roughly how much overlap a turn costs)
    ROT_RADIUS = 0.035     # limit-surface radius: torque/force ratio of the block's table friction
    CLEARANCE = PUSHER_RADIUS + 0.006
    DONE_SCORE = 0.97

    def __init__(self, sim, max_step: float = 0.03):
        super().__init__(sim, max_step)
        self.points, self.normals = _t_contact_candidates()
        corners = np.concatenate([[b[:2] + [sx * b[2], sy * b[3]] for sx in (-1, 1) for sy in (-1, 1)] for b in T_BOXES])
        self.circle_radius = float(np.linalg.norm(corners, axis=1).max()) + PUSHER_RADIUS + 0.012
        self.current = None

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.current = None
        self.banned = np.zeros(len(self.points), dtype=int)
        self.history: list[np.ndarray] = []

    def _error(self, pose, goal) -> np.ndarray:
        return np.array([goal[0] - pose[0], goal[1] - pose[1], self.ROT_WEIGHT * wrap_angle(goal[2] - pose[2])])

    def _scores(self, pose, error) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        R = rot2(pose[2])
        contacts = self.points @ R.T + pose[:2]
        push_dirs = -(self.normals @ R.T)
        arm = contacts - pose[:2]
        torque = arm[:, 0] * push_dirs[:, 1] - arm[:, 1] * push_dirs[:, 0]
        motion = np.concatenate([push_dirs, (self.ROT_WEIGHT * torque / self.ROT_RADIUS ** 2)[:, None]], axis=1)
        motion /= np.linalg.norm(motion, axis=1, keepdims=True)
        scores = motion @ (error / max(np.linalg.norm(error), 1e-9))
        # Contacts the pusher cannot get behind are useless.
        behind = contacts - push_dirs * (PUSHER_RADIUS + 0.01)
        reach_gap = np.array([np.linalg.norm(self.reachable(b) - b) for b in behind])
        scores = scores - 10.0 * reach_gap
        return scores, contacts, push_dirs

    def _segment_clear(self, a, b, pose) -> bool:
        samples = a + np.linspace(0, 1, 12)[:, None] * (b - a)
        return bool(distance_to_boxes(to_local(samples, pose), T_BOXES).min() >= self.CLEARANCE - 1e-4)

    def act(self, task_state: TaskState, joint_positions: np.ndarray) -> np.ndarray:
        pose, goal = task_state.object_poses[0], task_state.goal_pose
        pusher = self.pusher(joint_positions)
        if task_state.score >= self.DONE_SCORE:
            self.current = None
            return self.move_toward(pusher, joint_positions)
        error = self._error(pose, goal)
        scores, contacts, push_dirs = self._scores(pose, error)
        scores[self.banned > 0] -= 2.0
        self.banned = np.maximum(self.banned - 1, 0)
        best = int(np.argmax(scores))
        if self.current is None or scores[self.current] < max(scores[best] - 0.15, 0.3):
            self.current = best
        # Stuck (pusher blocked by the workspace edge, or pushing without effect): try another contact.
        self.history.append(np.concatenate([pusher, pose]))
        if len(self.history) > 6:
            self.history.pop(0)
            if np.ptp(np.array(self.history), axis=0).max() < 0.002:
                self.banned[max(0, self.current - 3):self.current + 4] = 15
                self.current = None
                self.history.clear()
                return self.move_toward(pusher, joint_positions)
        i = self.current
        contact, push_dir = contacts[i], push_dirs[i]
        touching = contact - push_dir * PUSHER_RADIUS
        pre_contact = contact - push_dir * (PUSHER_RADIUS + 0.006)
        along = float(np.dot(pusher - touching, push_dir))
        lateral = float(np.linalg.norm((pusher - touching) - along * push_dir))
        if lateral < 0.006 and along > -0.012:
            # In contact (or just behind it): push on, further for larger remaining error.
            progress = max(float(np.dot(error, np.concatenate([push_dir, [0.0]]))), 0.0) + abs(error[2])
            depth = float(np.clip(0.6 * progress, 0.003, self.max_step))
            return self.move_toward(touching + push_dir * depth, joint_positions)
        return self.move_toward(self._approach_waypoint(pusher, pre_contact, contact, push_dir, pose), joint_positions)

    def _approach_waypoint(self, pusher, pre_contact, contact, push_dir, pose) -> np.ndarray:
        """Go straight when the way is clear, else out along the contact normal, else around the block."""
        if self._segment_clear(pusher, pre_contact, pose):
            return pre_contact
        outside = contact - push_dir * (self.circle_radius * 0.8)
        if self._segment_clear(pusher, outside, pose):
            return outside
        centre = pose[:2]
        offset = pusher - centre
        angle = math.atan2(offset[1], offset[0])
        target_angle = math.atan2(*(outside - centre)[::-1])
        turn = float(wrap_angle(target_angle - angle))
        step_angle = self.max_step / self.circle_radius
        for direction in (turn, turn - math.copysign(2 * math.pi, turn)):  # the short way, else the long way
            new_angle = angle + float(np.clip(direction, -step_angle, step_angle))
            waypoint = centre + self.circle_radius * np.array([math.cos(new_angle), math.sin(new_angle)])
            if np.linalg.norm(self.reachable(waypoint) - waypoint) < 0.005:
                return waypoint
        return waypoint


# ----------------------------------------------------------------------------------------------
# rope and pile: push one point at a time toward where it should be

class _PointPusher(Expert):
    """Choose an object point and a destination, get behind it, push it there, choose again."""

    OBJECT_RADIUS = 0.012
    PUSH_STEPS = 12

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.chosen = None
        self.steps_left = 0

    def choose(self, task_state: TaskState) -> list[tuple[int, np.ndarray]]:
        """(object index, destination) candidates, best first."""
        raise NotImplementedError

    def _choose_clear(self, task_state: TaskState, pusher) -> tuple[int, np.ndarray] | None:
        """The best candidate the pusher can get behind without crossing other objects."""
        candidates = self.choose(task_state)
        points = task_state.object_poses[:, :2]
        reachable = []
        for index, destination in candidates:
            point = points[index]
            direction = (destination - point) / max(np.linalg.norm(destination - point), 1e-9)
            behind = point - direction * (PUSHER_RADIUS + self.OBJECT_RADIUS + 0.004)
            far_behind = self.reachable(behind - direction * 0.03)
            if np.linalg.norm(far_behind - (behind - direction * 0.03)) > 0.005:
                continue
            reachable.append((index, destination))
            path = np.concatenate([pusher + np.linspace(0, 1, 10)[:, None] * (far_behind - pusher),
                                   far_behind + np.linspace(0, 1, 5)[:, None] * (behind - far_behind)])
            gaps = np.linalg.norm(path[:, None] - points[None], axis=-1).min(axis=1)
            if gaps.min() > PUSHER_RADIUS + self.OBJECT_RADIUS + 0.002:
                return index, destination
        return reachable[int(self.rng.integers(len(reachable)))] if reachable else None

    def point(self, task_state: TaskState, index: int) -> np.ndarray:
        return task_state.object_poses[index, :2]

    def act(self, task_state: TaskState, joint_positions: np.ndarray) -> np.ndarray:
        pusher = self.pusher(joint_positions)
        if self.chosen is None or self.steps_left <= 0:
            self.chosen = self._choose_clear(task_state, pusher)
            self.steps_left = 3 * self.PUSH_STEPS
            self.pushing = False
        if self.chosen is None:
            return self.move_toward(pusher, joint_positions)
        index, destination = self.chosen
        point = self.point(task_state, index)
        offset = destination - point
        distance = float(np.linalg.norm(offset))
        if distance < 0.008:
            self.chosen = None
            return self.move_toward(pusher, joint_positions)
        direction = offset / distance
        behind = point - direction * (PUSHER_RADIUS + self.OBJECT_RADIUS + 0.004)
        self.steps_left -= 1
        if not self.pushing:
            far_behind = behind - direction * 0.03
            gap = pusher - behind
            if np.linalg.norm(gap) < 0.01:
                self.pushing = True
            elif np.dot(gap, direction) > -0.01 and np.linalg.norm(gap) > 0.02:
                return self.move_toward(far_behind, joint_positions)  # come from behind, not through it
            else:
                return self.move_toward(behind, joint_positions)
        if np.linalg.norm(pusher - behind) > 0.03:  # lost the object: choose again
            self.chosen = None
        return self.move_toward(destination - direction * (PUSHER_RADIUS + 0.004), joint_positions,
                                max_step=min(self.max_step, 0.02))


class RopeExpert(_PointPusher):
    """Push the rope node farthest from its place on the target curve toward it."""

    OBJECT_RADIUS = Rope.RADIUS

    def choose(self, task_state: TaskState):
        nodes = task_state.object_poses[:, :2]
        targets = self.sim.task.target_points
        if len(targets) != len(nodes):
            idx = np.linspace(0, len(targets) - 1, len(nodes))
            targets = np.stack([np.interp(idx, np.arange(len(targets)), targets[:, k]) for k in range(2)], -1)
        forward = np.linalg.norm(nodes - targets, axis=1)
        backward = np.linalg.norm(nodes - targets[::-1], axis=1)
        if backward.sum() < forward.sum():
            targets, forward = targets[::-1], backward
        order = [i for i in np.argsort(-forward) if forward[i] > 0.01]
        return [(int(i), targets[i]) for i in order]


class PileExpert(_PointPusher):
    """Sweep the object outside the goal region that is closest to it into the region."""

    def choose(self, task_state: TaskState):
        poses = task_state.object_poses[:, :2]
        centre = task_state.goal_pose[:2]
        radius = self.sim.task.GOAL_RADIUS
        distance = np.linalg.norm(poses - centre, axis=1)
        outside = np.flatnonzero(distance > radius - 0.01)
        candidates = []
        for i in outside[np.argsort(distance[outside])]:
            toward = centre - poses[i]
            candidates.append((int(i), centre - toward / np.linalg.norm(toward) * (radius * 0.4)))
        return candidates


# ----------------------------------------------------------------------------------------------
# play data

class SmoothRandomMotion(Expert):
    """Smooth random pusher motion: drift toward random workspace targets with a low-pass velocity."""

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.target = None
        self.velocity = np.zeros(2)
        self.wrist = 0.0
        self.wrist_rate = 0.0

    def _new_target(self) -> np.ndarray:
        return self.reachable([self.rng.uniform(*PUSHER_X), self.rng.uniform(*PUSHER_Y)])

    def act(self, task_state: TaskState, joint_positions: np.ndarray) -> np.ndarray:
        pusher = self.pusher(joint_positions)
        if self.target is None or np.linalg.norm(self.target - pusher) < 0.02 or self.rng.random() < 0.02:
            self.target = self._new_target()
        pull = self.target - pusher
        pull *= min(1.0, self.max_step / max(np.linalg.norm(pull), 1e-9))
        self.velocity = 0.7 * self.velocity + 0.3 * (pull + self.rng.normal(0, 0.008, 2))
        self.wrist_rate = 0.8 * self.wrist_rate + 0.2 * self.rng.normal(0, 0.3)
        self.wrist = float(np.clip(self.wrist + self.wrist_rate, self.sim.lower[2], self.sim.upper[2]))
        return self.move_toward(pusher + self.velocity, joint_positions)


class ContactSeeking(Expert):
    """Move toward and through a randomly chosen object (or rope node), with noise."""

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.index = None
        self.through = None
        self.steps = 0

    def act(self, task_state: TaskState, joint_positions: np.ndarray) -> np.ndarray:
        pusher = self.pusher(joint_positions)
        objects = task_state.object_poses[:, :2]
        if self.index is None or self.index >= len(objects) or self.steps <= 0:
            self.index = int(self.rng.integers(len(objects)))
            self.through = None
            self.steps = int(self.rng.integers(15, 35))
        self.steps -= 1
        obj = objects[self.index]
        if self.through is None:
            offset = obj - pusher
            if np.linalg.norm(offset) < PUSHER_RADIUS + 0.02:
                direction = offset / max(np.linalg.norm(offset), 1e-9)
                self.through = obj + direction * self.rng.uniform(0.03, 0.08)
            target = obj
        else:
            target = self.through
            if np.linalg.norm(target - pusher) < 0.01:
                self.steps = 0
        return self.move_toward(target + self.rng.normal(0, 0.01, 2), joint_positions)


EXPERTS = {
    "push_t": PushTExpert,
    "rope": RopeExpert,
    "pile": PileExpert,
    "smooth_random": SmoothRandomMotion,
    "contact_seeking": ContactSeeking,
}


def make_expert(name: str, sim, **kwargs) -> Expert:
    """An expert by name: a task name gives that task's scripted expert."""
    if name not in EXPERTS:
        raise ValueError(f"unknown expert '{name}', choose one of {sorted(EXPERTS)}")
    return EXPERTS[name](sim, **kwargs)
