"""Scripted policies for play data and demos: joint setpoints from (task state, joint positions).

Every policy plans in pusher (x, y) space, moves at most max_step per control period (physically
plausible at 10 Hz) and maps the target to joints with the sim's IK, always on elbow branch +1: a
branch switch would swing the whole arm through the workspace.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .scene import PUSHER_RADIUS
from .tasks import T_BOXES, PushT, Rope, TaskState, distance_to_boxes, rot2, t_overlap, to_local, wrap_angle

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


class MemorylessPushTExpert(PushTExpert):
    """PushTExpert without the state it keeps to itself: the best contact is chosen afresh every
    step (no hysteresis) and no contact is given up on after being stuck, so its command is a
    function of the T's pose and the arm alone, what a policy observes. The stateful expert's next
    command is only half explained by those (docs/results/policy_pose/README.md)."""

    def act(self, task_state: TaskState, joint_positions: np.ndarray) -> np.ndarray:
        self.current = None
        self.banned[:] = 0
        self.history.clear()
        return super().act(task_state, joint_positions)


class WanderingPushTExpert(PushTExpert):
    """PushTExpert pushing the T to poses of its own instead of the goal, a new one each time it
    gets there: purposeful pushes that end anywhere, as play data. Written to test whether a world
    model redraws a pushed T on the goal because the expert's pushes always end there; added to
    push_t's play it did not weaken that pull (docs/results/world_model_experiments.md, "Pushes that
    end anywhere")."""

    REACHED = 0.9          # overlap with its target at which it picks the next one
    GOAL_CLEARANCE = 0.2   # targets overlap the task's goal less than this (as the start states)

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.target = self._new_target()

    def _new_target(self) -> np.ndarray:
        for _ in range(100):
            pose = np.array([self.rng.uniform(*PushT.INIT_X), self.rng.uniform(*PushT.INIT_Y),
                             self.rng.uniform(-np.pi, np.pi)])
            if t_overlap(pose, PushT.GOAL) < self.GOAL_CLEARANCE:
                break
        return pose

    def act(self, task_state: TaskState, joint_positions: np.ndarray) -> np.ndarray:
        pose = task_state.object_poses[0]
        if t_overlap(pose, self.target) >= self.REACHED:
            self.target = self._new_target()
            self.current = None
        score = t_overlap(pose, self.target)
        retargeted = dataclasses.replace(task_state, goal_pose=self.target.copy(), score=score,
                                         success=score >= self.REACHED)
        return super().act(retargeted, joint_positions)


# ----------------------------------------------------------------------------------------------
# rope and pile: choose a push, go around the objects to behind it, push, choose again

def _segment_distances(points: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """(N, K) distances from points (N, 2) to segments starts[k] -> ends[k] (K, 2)."""
    ab = ends - starts
    t = np.einsum("nkd,kd->nk", points[:, None, :] - starts[None], ab) / np.maximum(np.einsum("kd,kd->k", ab, ab), 1e-12)
    closest = starts[None] + np.clip(t, 0.0, 1.0)[..., None] * ab[None]
    return np.linalg.norm(points[:, None, :] - closest, axis=-1)


class Obstacles:
    """Objects as capsules in the table plane (segments with radii; a disc is a zero-length segment)."""

    def __init__(self, starts, ends, radii):
        self.starts = np.asarray(starts, dtype=np.float64).reshape(-1, 2)
        self.ends = np.asarray(ends, dtype=np.float64).reshape(-1, 2)
        self.radii = np.broadcast_to(np.asarray(radii, dtype=np.float64), (len(self.starts),))

    def clearance(self, points) -> np.ndarray:
        """Gap between each point and the nearest object surface (negative inside)."""
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        if len(self.starts) == 0:
            return np.full(len(points), np.inf)
        return (_segment_distances(points, self.starts, self.ends) - self.radii[None]).min(axis=1)

    def escape(self, point, gap: float) -> np.ndarray:
        """A point near `point` with at least `gap` clearance, straight away from the nearest object."""
        point = np.asarray(point, dtype=np.float64)
        for _ in range(4):
            current = float(self.clearance(point)[0])
            if current >= gap:
                break
            eps = 1e-4
            grad = np.array([self.clearance(point + [eps, 0])[0] - self.clearance(point - [eps, 0])[0],
                             self.clearance(point + [0, eps])[0] - self.clearance(point - [0, eps])[0]])
            norm = np.linalg.norm(grad)
            direction = grad / norm if norm > 1e-9 else np.array([0.0, -1.0])
            point = point + direction * (gap - current + 0.002)
        return point


class _PlannedPusher(Expert):
    """Push objects one at a time: choose a push (a point, a direction, a length), travel around the
    objects to just behind the point (planning a collision-free path through a roadmap), push, back
    off, choose again. Subclasses give the obstacles, the roadmap and the ranked pushes."""

    GAP = PUSHER_RADIUS + 0.004        # clearance the pusher keeps from objects while travelling
    STANDOFF = 0.008                    # pre-push gap between the pusher and the object it pushes
    ARRIVED = 0.004
    GRID = (np.linspace(-0.23, 0.23, 8), np.linspace(0.18, 0.42, 5))  # free-space roadmap nodes

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.mode = "choose"
        self.path: list[np.ndarray] = []
        self.push = None
        self.push_steps = 0
        self.travel_steps = 0
        self.banned: dict[int, int] = {}

    # -- to be provided ------------------------------------------------------------------
    def obstacles(self, task_state: TaskState) -> Obstacles:
        raise NotImplementedError

    def roadmap(self, task_state: TaskState) -> np.ndarray:
        """Extra roadmap nodes around the objects (the free-space grid is added)."""
        raise NotImplementedError

    def candidates(self, task_state: TaskState, pusher: np.ndarray) -> list[dict]:
        """Pushes, best first: dicts with index, pre (pusher start), direction, length."""
        raise NotImplementedError

    def push_setpoint(self, task_state: TaskState, pusher: np.ndarray):
        """Pusher target during a push, or None when the push is over."""
        raise NotImplementedError

    def done(self, task_state: TaskState) -> bool:
        return task_state.success and task_state.score >= 0.999

    # -- planning ------------------------------------------------------------------------
    def _reachable_exactly(self, points: np.ndarray) -> np.ndarray:
        return np.array([np.linalg.norm(self.reachable(p) - p) < 1e-3 for p in points], dtype=bool)

    def _clear_segments(self, start, ends: np.ndarray, obstacles: Obstacles) -> np.ndarray:
        """Whether the straight moves start -> ends[m] keep GAP from every object."""
        length = np.linalg.norm(ends - start, axis=1)
        samples = int(min(64, max(2, math.ceil(length.max() / 0.006) + 1)))
        t = np.linspace(0.0, 1.0, samples)
        points = start[None, None] + t[None, :, None] * (ends - start)[:, None, :]
        gaps = obstacles.clearance(points.reshape(-1, 2)).reshape(len(ends), samples)
        return gaps.min(axis=1) >= self.GAP - 1e-4

    def plan(self, start, goal, task_state: TaskState, obstacles: Obstacles) -> list[np.ndarray] | None:
        """Waypoints from start to goal keeping GAP from the objects (A* on a lazily checked roadmap)."""
        start, goal = np.asarray(start, dtype=np.float64), np.asarray(goal, dtype=np.float64)
        if self._clear_segments(start, goal[None], obstacles)[0]:
            return [goal]
        grid = np.stack(np.meshgrid(*self.GRID), -1).reshape(-1, 2)
        extra = np.concatenate([self.roadmap(task_state), grid])
        extra = extra[(obstacles.clearance(extra) >= self.GAP + 0.001) & self._reachable_exactly(extra)]
        nodes = np.concatenate([start[None], goal[None], extra])
        n = len(nodes)
        cost = np.full(n, np.inf)
        cost[0] = 0.0
        parent = np.full(n, -1)
        closed = np.zeros(n, dtype=bool)
        heuristic = np.linalg.norm(nodes - goal, axis=1)
        while True:
            open_ = np.flatnonzero(~closed & np.isfinite(cost))
            if len(open_) == 0:
                return None
            u = int(open_[np.argmin(cost[open_] + heuristic[open_])])
            if u == 1:
                break
            closed[u] = True
            others = np.flatnonzero(~closed)
            step = np.linalg.norm(nodes[others] - nodes[u], axis=1)
            better = cost[u] + step < cost[others]
            if not better.any():
                continue
            others, step = others[better], step[better]
            clear = self._clear_segments(nodes[u], nodes[others], obstacles)
            for v, d in zip(others[clear], step[clear]):
                cost[v] = cost[u] + d
                parent[v] = u
        path, v = [], 1
        while v > 0:
            path.append(nodes[v])
            v = parent[v]
        return path[::-1]

    # -- acting --------------------------------------------------------------------------
    def _start_push(self, task_state: TaskState, pusher: np.ndarray) -> bool:
        obstacles = self.obstacles(task_state)
        start = obstacles.escape(pusher, self.GAP + 0.001)
        for candidate in self.candidates(task_state, pusher)[:8]:
            path = self.plan(start, candidate["pre"], task_state, obstacles)
            if path is None:
                continue
            self.path = ([start] if np.linalg.norm(start - pusher) > self.ARRIVED else []) + path
            self.push = candidate
            self.mode = "travel"
            self.travel_steps = 0
            waypoints = np.array([pusher] + self.path)
            self.travel_limit = 10 + 1.5 * np.linalg.norm(np.diff(waypoints, axis=0), axis=1).sum() / self.max_step
            return True
        return False

    def act(self, task_state: TaskState, joint_positions: np.ndarray) -> np.ndarray:
        pusher = self.pusher(joint_positions)
        self.banned = {k: v - 1 for k, v in self.banned.items() if v > 1}
        if self.done(task_state):
            self.mode = "choose"
            return self.move_toward(pusher, joint_positions)
        if self.mode == "choose" and not self._start_push(task_state, pusher):
            # Nothing to push from here: back off from the objects and try again next time.
            return self.move_toward(self.obstacles(task_state).escape(pusher, self.GAP + 0.01), joint_positions)
        if self.mode == "travel":
            self.travel_steps += 1
            while self.path and np.linalg.norm(self.path[0] - pusher) < self.ARRIVED:
                self.path.pop(0)
            if self.travel_steps > self.travel_limit:  # blocked somewhere: choose again
                self.banned[self.push["index"]] = 20
                self.mode = "choose"
                return self.move_toward(pusher, joint_positions)
            if self.path:
                return self.move_toward(self.path[0], joint_positions)
            self.mode = "push"
            self.push_steps = 0
            self.push["start_pusher"] = pusher.copy()
        # push
        self.push_steps += 1
        target = self.push_setpoint(task_state, pusher)
        if target is None or self.push_steps > 30:
            self.mode = "choose"
            back = pusher - self.push["direction"] * 0.02
            return self.move_toward(back, joint_positions, max_step=min(self.max_step, 0.02))
        return self.move_toward(target, joint_positions, max_step=min(self.max_step, self.PUSH_SPEED))


class RopeExpert(_PlannedPusher):
    """Push the stretch of rope whose move best reduces its distance to the target curve.

    Rope nodes are matched in order to the target points (forward or reversed, whichever is
    closer). A push at node i moving it by delta moves node j by about w(i - j) * delta (w a
    Gaussian over the node index: the rope bends locally, friction holds the rest), so each node
    has a best push (least squares over the nodes it moves); the expert takes the push with the
    largest predicted reduction of the squared error per control step, approached from behind.
    """

    RADIUS = Rope.RADIUS
    SIGMA = 3.5           # nodes: how far along the rope a push spreads
    MAX_PUSH = 0.06
    MIN_PUSH = 0.005
    PUSH_SPEED = 0.015
    SIDE_SLIP = 0.3       # how much a push slanted to the rope moves it along itself (friction)

    def reset(self, rng: np.random.Generator) -> None:
        super().reset(rng)
        self.reversed = None

    def _nodes(self, task_state: TaskState) -> np.ndarray:
        return task_state.object_poses[:, :2]

    def obstacles(self, task_state: TaskState) -> Obstacles:
        nodes = self._nodes(task_state)
        return Obstacles(nodes[:-1], nodes[1:], self.RADIUS)

    def _normals(self, nodes: np.ndarray) -> np.ndarray:
        tangent = np.gradient(nodes, axis=0)
        tangent /= np.maximum(np.linalg.norm(tangent, axis=1, keepdims=True), 1e-9)
        return np.stack([-tangent[:, 1], tangent[:, 0]], -1), tangent

    def roadmap(self, task_state: TaskState) -> np.ndarray:
        nodes = self._nodes(task_state)
        normals, tangent = self._normals(nodes)
        offset = self.RADIUS + self.GAP + 0.006
        sides = np.concatenate([nodes[::2] + offset * normals[::2], nodes[::2] - offset * normals[::2]])
        angles = np.linspace(0, 2 * np.pi, 10, endpoint=False)
        ring = (offset + 0.004) * np.stack([np.cos(angles), np.sin(angles)], -1)
        return np.concatenate([sides, nodes[0] + ring, nodes[-1] + ring])

    def _targets(self, nodes: np.ndarray) -> np.ndarray:
        targets = np.asarray(self.sim.task.target_points, dtype=np.float64)
        if len(targets) != len(nodes):
            idx = np.linspace(0, len(targets) - 1, len(nodes))
            targets = np.stack([np.interp(idx, np.arange(len(targets)), targets[:, k]) for k in range(2)], -1)
        forward = np.linalg.norm(nodes - targets, axis=1).sum()
        backward = np.linalg.norm(nodes - targets[::-1], axis=1).sum()
        if self.reversed is None or (backward < 0.8 * forward if not self.reversed else forward < 0.8 * backward):
            self.reversed = bool(backward < forward)
        return targets[::-1] if self.reversed else targets

    def candidates(self, task_state: TaskState, pusher: np.ndarray) -> list[dict]:
        nodes = self._nodes(task_state)
        error = self._targets(nodes) - nodes
        n = len(nodes)
        idx = np.arange(n)
        w = np.exp(-0.5 * ((idx[:, None] - idx[None]) / self.SIGMA) ** 2)       # (push node, moved node)
        delta = (w @ error) / (w ** 2).sum(axis=1, keepdims=True)
        normals, tangent = self._normals(nodes)
        along_n = np.einsum("nd,nd->n", delta, normals)
        along_t = np.einsum("nd,nd->n", delta, tangent)
        slip = self.SIDE_SLIP * np.abs(along_n)
        delta = along_n[:, None] * normals + np.clip(along_t, -slip, slip)[:, None] * tangent
        length = np.linalg.norm(delta, axis=1)
        delta *= (np.minimum(length, self.MAX_PUSH) / np.maximum(length, 1e-9))[:, None]
        length = np.minimum(length, self.MAX_PUSH)
        base = (error ** 2).sum()
        gains = np.array([base - ((error - w[i][:, None] * delta[i]) ** 2).sum() for i in range(n)])
        obstacles = self.obstacles(task_state)
        result = []
        for i in idx:
            if length[i] < self.MIN_PUSH or gains[i] <= 0 or int(i) in self.banned:
                continue
            direction = delta[i] / length[i]
            pre = nodes[i] - direction * (PUSHER_RADIUS + self.RADIUS + self.STANDOFF)
            if obstacles.clearance(pre)[0] < self.GAP or np.linalg.norm(self.reachable(pre) - pre) > 1e-3:
                continue
            steps = np.linalg.norm(pre - pusher) / self.max_step + (length[i] + self.STANDOFF) / self.PUSH_SPEED + 2
            result.append(dict(index=int(i), pre=pre, direction=direction, length=float(length[i]),
                               start=nodes[i].copy(), value=gains[i] / steps))
        result.sort(key=lambda c: -c["value"])
        return result

    def push_setpoint(self, task_state: TaskState, pusher: np.ndarray):
        push = self.push
        node = self._nodes(task_state)[push["index"]]
        moved = float(np.dot(node - push["start"], push["direction"]))
        travelled = float(np.dot(pusher - push["start_pusher"], push["direction"]))
        if moved >= push["length"] - 0.002 or travelled >= push["length"] + self.STANDOFF + 0.01:
            return None
        return push["start_pusher"] + push["direction"] * (push["length"] + self.STANDOFF + 0.01)


class PileExpert(_PlannedPusher):
    """Push the object outside the goal that is cheapest to bring in toward the goal centre,
    approaching it from the far side around the other objects and steering to keep it in front."""

    RADIUS = 0.018         # object footprint (a cube's half diagonal)
    CONTACT = 0.0125       # pusher-face to object-centre distance when pushing a face
    PUSH_SPEED = 0.02
    INSIDE_MARGIN = 0.022  # push until this far inside the goal edge
    REPUSH_MARGIN = 0.004  # objects less deep inside than this are pushed in again

    def _positions(self, task_state: TaskState) -> np.ndarray:
        return task_state.object_poses[:, :2]

    def obstacles(self, task_state: TaskState) -> Obstacles:
        p = self._positions(task_state)
        return Obstacles(p, p, self.RADIUS)

    def roadmap(self, task_state: TaskState) -> np.ndarray:
        angles = np.linspace(0, 2 * np.pi, 8, endpoint=False)
        ring = (self.RADIUS + self.GAP + 0.008) * np.stack([np.cos(angles), np.sin(angles)], -1)
        return (self._positions(task_state)[:, None] + ring[None]).reshape(-1, 2)

    def candidates(self, task_state: TaskState, pusher: np.ndarray) -> list[dict]:
        positions = self._positions(task_state)
        centre = task_state.goal_pose[:2]
        radius = self.sim.task.GOAL_RADIUS
        obstacles = self.obstacles(task_state)
        result = []
        for i, p in enumerate(positions):
            offset = centre - p
            distance = float(np.linalg.norm(offset))
            if distance <= radius - self.REPUSH_MARGIN or i in self.banned:
                continue
            heading = math.atan2(offset[1], offset[0])
            # Straight at the centre, else slanted while the push line still crosses the goal well
            # inside (another object may sit where the pusher should start).
            slant_max = math.asin(min(1.0, (radius - self.INSIDE_MARGIN) / distance))
            for slant in (0.0, 0.3, -0.3, 0.6, -0.6):
                if abs(slant) > slant_max:
                    continue
                direction = np.array([math.cos(heading + slant), math.sin(heading + slant)])
                pre = p - direction * (PUSHER_RADIUS + self.RADIUS + self.STANDOFF)
                if obstacles.clearance(pre)[0] < self.GAP or np.linalg.norm(self.reachable(pre) - pre) > 1e-3:
                    continue
                cost = (np.linalg.norm(pre - pusher) / self.max_step
                        + (distance - radius + self.INSIDE_MARGIN) / self.PUSH_SPEED + 3 * abs(slant))
                aim = p + direction * max(distance * math.cos(slant), 0.0)  # nearest the centre on that line
                result.append(dict(index=i, pre=pre, direction=direction, aim=aim, value=-cost))
                break
        result.sort(key=lambda c: -c["value"])
        return result

    def push_setpoint(self, task_state: TaskState, pusher: np.ndarray):
        push = self.push
        obj = self._positions(task_state)[push["index"]]
        centre = task_state.goal_pose[:2]
        if np.linalg.norm(centre - obj) <= self.sim.task.GOAL_RADIUS - self.INSIDE_MARGIN:
            return None
        if np.linalg.norm(push["aim"] - obj) < 0.01:
            push["aim"] = centre
        offset = push["aim"] - obj
        distance = float(np.linalg.norm(offset))
        direction = offset / max(distance, 1e-9)
        rel = pusher - obj
        lateral = abs(float(rel[0] * direction[1] - rel[1] * direction[0]))
        if np.linalg.norm(rel) > PUSHER_RADIUS + self.RADIUS + self.STANDOFF + 0.01 or lateral > 0.014:
            return None  # lost it: choose again
        push["direction"] = direction
        # Steer: stay on the line from the goal through the object, one push step past contact.
        behind = obj - direction * (PUSHER_RADIUS + self.CONTACT)
        return behind + direction * min(self.PUSH_SPEED, distance)


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
    "push_t_memoryless": MemorylessPushTExpert,
    "push_t_wandering": WanderingPushTExpert,
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
