"""The three reference tasks, one per object family: rigid (push_t), deformable (rope), pile.

Objects move only in the table plane (slide x, slide y, hinge z joints). For the rigid objects,
Coulomb-like resistance on those joints (frictionloss) stands in for table friction, so objects stop
when the pusher lets go, as in quasi-static tabletop pushing. The rope, a chain whose segments need
friction each, rests on the table with real contacts instead (see Rope). Each task builds its MJCF
fragment, resets its objects from a random generator and scores itself from ground truth.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .scene import CAMERA_CENTER, HIDDEN_GROUP, NO_CONTACT, OBJECT_CONTACT, RGBA, ROPE_CONTACT, TABLE_CONTACT

GOAL_Z = 0.0005
# Where objects are put at reset (inside the reach annulus and well inside the camera view).
WORKSPACE_X = (-0.2, 0.2)
WORKSPACE_Y = (0.2, 0.41)


@dataclasses.dataclass
class TaskState:
    task: str
    score: float
    success: bool
    object_poses: np.ndarray  # (K, 3) x, y, yaw in the table frame
    goal_pose: np.ndarray     # (3,) x, y, yaw in the table frame


def wrap_angle(a):
    return (np.asarray(a) + np.pi) % (2 * np.pi) - np.pi


def rot2(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s], [s, c]])


def to_world(points: np.ndarray, pose) -> np.ndarray:
    """Points (N,2) in a body frame -> table frame, pose = (x, y, yaw)."""
    return points @ rot2(pose[2]).T + np.asarray(pose[:2])


def to_local(points: np.ndarray, pose) -> np.ndarray:
    return (np.asarray(points) - np.asarray(pose[:2])) @ rot2(pose[2])


def planar_joints_xml(prefix: str, frictionloss: float, rot_frictionloss: float, damping: float) -> str:
    return (f'<joint name="{prefix}_x" type="slide" axis="1 0 0" frictionloss="{frictionloss}" damping="{damping}"/>'
            f'<joint name="{prefix}_y" type="slide" axis="0 1 0" frictionloss="{frictionloss}" damping="{damping}"/>'
            f'<joint name="{prefix}_yaw" type="hinge" axis="0 0 1" frictionloss="{rot_frictionloss}" damping="{damping * 0.01}"/>')


class PlanarBody:
    """qpos/qvel access to a body carried by slide x, slide y, hinge z joints."""

    def __init__(self, model, prefix: str):
        self.qpos_adr = np.array([model.joint(f"{prefix}_{a}").qposadr[0] for a in ("x", "y", "yaw")])
        self.dof_adr = np.array([model.joint(f"{prefix}_{a}").dofadr[0] for a in ("x", "y", "yaw")])

    def get(self, data) -> np.ndarray:
        return data.qpos[self.qpos_adr].copy()

    def set(self, data, pose) -> None:
        data.qpos[self.qpos_adr] = pose
        data.qvel[self.dof_adr] = 0.0


class Task:
    name = ""
    success_threshold = 1.0
    keepout: tuple[np.ndarray, float] | None = None  # (xy, radius) objects must not cover at reset

    def clear_of_keepout(self, points: np.ndarray, margin: float = 0.0) -> bool:
        if self.keepout is None:
            return True
        xy, radius = self.keepout
        return bool(np.min(np.linalg.norm(np.asarray(points) - xy, axis=-1)) > radius + margin)

    def mjcf(self) -> str:
        raise NotImplementedError

    def goal_mjcf(self) -> str:
        raise NotImplementedError

    def bind(self, model, data) -> None:
        self.model, self.data = model, data
        self.goal_mocap = model.body("goal").mocapid[0]

    def set_goal_pose(self, pose) -> None:
        self.goal_pose = np.asarray(pose, dtype=np.float64)
        self.data.mocap_pos[self.goal_mocap] = [pose[0], pose[1], GOAL_Z]
        self.data.mocap_quat[self.goal_mocap] = [math.cos(pose[2] / 2), 0, 0, math.sin(pose[2] / 2)]

    def reset(self, rng: np.random.Generator) -> None:
        raise NotImplementedError

    def object_poses(self) -> np.ndarray:
        raise NotImplementedError

    def score(self) -> float:
        raise NotImplementedError

    def state(self) -> TaskState:
        score = float(self.score())
        return TaskState(task=self.name, score=score, success=score >= self.success_threshold,
                         object_poses=self.object_poses(), goal_pose=self.goal_pose.copy())


# ----------------------------------------------------------------------------------------------
# push_t

T_UNIT = 0.03
# The T in its own frame, origin at its centre of mass: (centre x, centre y, half x, half y).
_BAR = (0.0, 0.5 * T_UNIT, 2.0 * T_UNIT, 0.5 * T_UNIT)
_STEM = (0.0, -1.5 * T_UNIT, 0.5 * T_UNIT, 1.5 * T_UNIT)
_COM_Y = (_BAR[1] * 4 + _STEM[1] * 3) / 7.0
T_BOXES = np.array([(b[0], b[1] - _COM_Y, b[2], b[3]) for b in (_BAR, _STEM)])
T_AREA = float(sum(4 * b[2] * b[3] for b in T_BOXES))
T_RASTER_STEP = 0.0015


def _box_corners(box, pose) -> list[tuple[float, float]]:
    """The corners (counter-clockwise) of one local-frame box (cx, cy, hx, hy) placed at ``pose``."""
    cx, cy, hx, hy = box
    c, s = math.cos(pose[2]), math.sin(pose[2])
    return [(pose[0] + c * x - s * y, pose[1] + s * x + c * y)
            for x, y in ((cx - hx, cy - hy), (cx + hx, cy - hy), (cx + hx, cy + hy), (cx - hx, cy + hy))]


def _clipped_area(subject: list, clip: list) -> float:
    """Area of the intersection of two convex counter-clockwise polygons (Sutherland-Hodgman)."""
    polygon = subject
    for i in range(len(clip)):
        (ax, ay), (bx, by) = clip[i], clip[(i + 1) % len(clip)]
        side = lambda p: (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax)  # >= 0: inside (left of a->b)
        kept = []
        for j in range(len(polygon)):
            p, q = polygon[j], polygon[(j + 1) % len(polygon)]
            sp, sq = side(p), side(q)
            if sp >= 0:
                kept.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                kept.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        polygon = kept
        if not polygon:
            return 0.0
    return 0.5 * abs(sum(polygon[k][0] * polygon[k - 1][1] - polygon[k - 1][0] * polygon[k][1] for k in range(len(polygon))))


def t_overlap(pose, goal) -> float:
    """The push_t score: the fraction of the T's area at ``pose`` inside the T at ``goal``, exact.

    (A raster of 1.5 mm cells read it before 2026-12-06; near the goal, where the cells line up
    with the goal's edges, it read in steps of about 0.03: 0.944 for a T whose area overlap was
    0.962, which made true successes failures.) The two boxes of a T do not overlap, so the overlap
    is the sum of the four box-box intersections."""
    if not (np.all(np.isfinite(pose)) and np.all(np.isfinite(goal))):
        return float("nan")
    area = sum(_clipped_area(_box_corners(a, pose), _box_corners(b, goal)) for a in T_BOXES for b in T_BOXES)
    return float(round(area / T_AREA, 12))  # the T on itself reads 1.0, not 1 - 6e-16


def _raster_boxes(boxes: np.ndarray, step: float) -> np.ndarray:
    """Cell centres covering the union of axis-aligned boxes (the boxes here do not overlap)."""
    pts = []
    for cx, cy, hx, hy in boxes:
        nx, ny = max(1, round(2 * hx / step)), max(1, round(2 * hy / step))
        xs = cx - hx + (np.arange(nx) + 0.5) * (2 * hx / nx)
        ys = cy - hy + (np.arange(ny) + 0.5) * (2 * hy / ny)
        pts.append(np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2))
    return np.concatenate(pts)


def inside_boxes(points: np.ndarray, boxes: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """Which local-frame points lie inside any box (grown by margin)."""
    d = np.abs(points[:, None, :] - boxes[None, :, :2]) - boxes[None, :, 2:] - margin
    return np.any(np.all(d <= 0, axis=-1), axis=1)


def t_pose_gaps(poses: np.ndarray, references: np.ndarray, chunk: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """How far apart T poses (..., 3) are from reference poses as the task sees them, in one
    figure each: the mean displacement (m) of the T's area between the two poses (ADD, the usual
    rigid-pose error: a turn counts by how far it moves the T's material, so position and yaw add
    up), and the push_t overlap of the T at ``poses`` with the T at ``references`` (``PushT.overlap``,
    the task's own success measure). NaN where either pose is."""
    poses, references = np.broadcast_arrays(np.asarray(poses, np.float64), np.asarray(references, np.float64))
    shape = poses.shape[:-1]
    a, b = poses.reshape(-1, 3), references.reshape(-1, 3)
    ok = np.isfinite(a).all(1) & np.isfinite(b).all(1)
    displacement, overlap = np.full(len(a), np.nan), np.full(len(a), np.nan)
    x, y = _raster_boxes(T_BOXES, T_RASTER_STEP).T

    def placed(pose: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The T's area (F, points) at poses (F, 3): ``to_world`` over a batch of poses."""
        c, s = np.cos(pose[:, 2:]), np.sin(pose[:, 2:])
        return c * x - s * y + pose[:, :1], s * x + c * y + pose[:, 1:2]

    rows = np.flatnonzero(ok)
    for start in range(0, len(rows), chunk):
        idx = rows[start:start + chunk]
        (ax, ay), (bx, by) = placed(a[idx]), placed(b[idx])
        displacement[idx] = np.hypot(ax - bx, ay - by).mean(1)
        overlap[idx] = [t_overlap(a[i], b[i]) for i in idx]
    return displacement.reshape(shape), overlap.reshape(shape)


def distance_to_boxes(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Distance from local-frame points to the union of boxes (0 inside)."""
    d = np.abs(points[:, None, :] - boxes[None, :, :2]) - boxes[None, :, 2:]
    outside = np.linalg.norm(np.maximum(d, 0), axis=-1)
    return outside.min(axis=1)


class PushT(Task):
    """Push a T-shaped block onto a fixed goal pose; score = overlap area / T area."""

    name = "push_t"
    success_threshold = 0.95
    GOAL = np.array([0.0, 0.31, math.pi / 4])
    INIT_X = (-0.1, 0.1)
    INIT_Y = (0.28, 0.33)
    HEIGHT = 0.03

    def __init__(self):
        self._raster = _raster_boxes(T_BOXES, T_RASTER_STEP)

    def _geoms(self, rgba: str, z: float, hz: float, contact: str, extra: str = "") -> str:
        return "".join(
            f'<geom type="box" size="{hx:.6g} {hy:.6g} {hz:.6g}" pos="{cx:.6g} {cy:.6g} {z:.6g}" rgba="{rgba}" {contact} {extra}/>'
            for cx, cy, hx, hy in T_BOXES)

    def mjcf(self) -> str:
        h = self.HEIGHT / 2
        geoms = self._geoms(RGBA["object"], h, h, OBJECT_CONTACT, 'mass="0.075" friction="0.4 0.005 0.0001"')
        return f'<body name="tblock" pos="0 0 0">{planar_joints_xml("tblock", 0.3, 0.009, 0.5)}{geoms}</body>'

    def goal_mjcf(self) -> str:
        return f'<body name="goal" mocap="true">{self._geoms(RGBA["goal"], 0.0, 0.0005, NO_CONTACT)}</body>'

    def bind(self, model, data) -> None:
        super().bind(model, data)
        self.block = PlanarBody(model, "tblock")

    def reset(self, rng: np.random.Generator) -> None:
        self.set_goal_pose(self.GOAL)
        for _ in range(100):
            pose = np.array([rng.uniform(*self.INIT_X), rng.uniform(*self.INIT_Y), rng.uniform(-np.pi, np.pi)])
            if self._raster_overlap(pose, self.GOAL) < 0.2 and self.clear_of_keepout(to_world(self._raster, pose)):
                break
        self.block.set(self.data, pose)

    def pose(self) -> np.ndarray:
        p = self.block.get(self.data)
        p[2] = wrap_angle(p[2])
        return p

    def object_poses(self) -> np.ndarray:
        return self.pose()[None, :]

    def overlap(self, pose, goal) -> float:
        """Fraction of the T's area at pose that lies inside the T at goal (``t_overlap``)."""
        return t_overlap(pose, goal)

    def _raster_overlap(self, pose, goal) -> float:
        """The overlap as counted in 1.5 mm cells before 2026-12-06, kept for one job only: the reset's
        "not already near the goal" filter, so that every seed still starts where it did when the
        datasets and reports were made (the exact overlap would accept other first draws)."""
        return float(inside_boxes(to_local(to_world(self._raster, pose), goal), T_BOXES).mean())

    def score(self) -> float:
        return self.overlap(self.pose(), self.goal_pose)


# ----------------------------------------------------------------------------------------------
# rope

class Rope(Task):
    """Lay a rope (chain of capsules with bending springs) along a target arc; score = coverage.

    The rope lies on the table with real contacts: gravity presses every capsule onto a hidden
    table plane and each capsule's contact friction holds it in place, so a push bends the rope
    where the pusher is while the rest stays put. The chain stays in the table plane: its root
    slides in x, y, z and turns about z, the bending joints turn about z (the root's z slide gives
    every segment's contact its normal force).
    """

    name = "rope"
    success_threshold = 0.8
    SEGMENTS = 24
    SEG_LEN = 0.0125
    RADIUS = 0.0075
    TOLERANCE = 0.02
    TARGET_POINTS = 25
    MARKERS = 13
    MASS = 0.004            # kg per segment
    FRICTION = 0.5          # capsule-table sliding friction
    BEND_STIFFNESS = 0.002  # N m / rad per joint
    BEND_DAMPING = 0.0004
    BEND_LIMIT = 1.0        # rad per joint
    # Soft contacts let a rope held only by friction creep under its own bending springs (about a
    # millimetre in 10 s); a few no-slip iterations make its static friction hold exactly.
    NOSLIP_ITERATIONS = 5

    @property
    def length(self) -> float:
        return self.SEGMENTS * self.SEG_LEN

    def mjcf(self) -> str:
        L, r = self.SEG_LEN, self.RADIUS
        geom = (f'<geom type="capsule" fromto="0 0 {r} {L} 0 {r}" size="{r}" rgba="{RGBA["rope"]}" mass="{self.MASS}" '
                f'friction="{self.FRICTION} 0.005 0.0001" solimp="0.99 0.995 0.001" {ROPE_CONTACT}/>')
        xml = ""
        for i in reversed(range(self.SEGMENTS)):
            if i == 0:
                joint = ('<joint name="rope_root_x" type="slide" axis="1 0 0"/>'
                         '<joint name="rope_root_y" type="slide" axis="0 1 0"/>'
                         '<joint name="rope_root_z" type="slide" axis="0 0 1"/>'
                         '<joint name="rope_root_yaw" type="hinge" axis="0 0 1"/>')
            else:
                joint = (f'<joint name="rope_j{i}" type="hinge" axis="0 0 1" stiffness="{self.BEND_STIFFNESS}" '
                         f'damping="{self.BEND_DAMPING}" range="-{self.BEND_LIMIT} {self.BEND_LIMIT}" limited="true"/>')
            pos = "0 0 0" if i == 0 else f"{L} 0 0"
            xml = f'<body name="rope_{i}" pos="{pos}">{joint}{geom}{xml}</body>'
        table = (f'<geom name="rope_table" type="plane" size="0.5 0.5 0.01" pos="{CAMERA_CENTER[0]} {CAMERA_CENTER[1]} 0" '
                 f'group="{HIDDEN_GROUP}" friction="{self.FRICTION} 0.005 0.0001" {TABLE_CONTACT}/>')
        return table + xml

    def goal_mjcf(self) -> str:
        geoms = "".join(f'<geom name="rope_goal_{i}" type="cylinder" size="0.008 0.0005" pos="{0.01 * (i + 1):.3g} 0.001 0" rgba="{RGBA["goal"]}" {NO_CONTACT}/>'
                        for i in range(self.MARKERS))
        return f'<body name="goal" mocap="true">{geoms}</body>'

    def bind(self, model, data) -> None:
        super().bind(model, data)
        model.opt.noslip_iterations = self.NOSLIP_ITERATIONS
        self.root = PlanarBody(model, "rope_root")
        self.root_z_qpos = model.joint("rope_root_z").qposadr[0]
        self.root_z_dof = model.joint("rope_root_z").dofadr[0]
        self.bend_qpos = np.array([model.joint(f"rope_j{i}").qposadr[0] for i in range(1, self.SEGMENTS)])
        self.bend_dof = np.array([model.joint(f"rope_j{i}").dofadr[0] for i in range(1, self.SEGMENTS)])
        self.body_ids = np.array([model.body(f"rope_{i}").id for i in range(self.SEGMENTS)])
        self.marker_ids = np.array([model.geom(f"rope_goal_{i}").id for i in range(self.MARKERS)])

    @staticmethod
    def arc_points(curvature: float, length: float, n: int) -> np.ndarray:
        """n points along an arc through the origin, tangent to +x there, centred on arc length."""
        s = np.linspace(-length / 2, length / 2, n)
        if abs(curvature) < 1e-6:
            return np.stack([s, np.zeros_like(s)], -1)
        return np.stack([np.sin(curvature * s) / curvature, (1 - np.cos(curvature * s)) / curvature], -1)

    @staticmethod
    def _in_workspace(points: np.ndarray, margin: float) -> bool:
        return bool(np.all((points[:, 0] > WORKSPACE_X[0] + margin) & (points[:, 0] < WORKSPACE_X[1] - margin)
                           & (points[:, 1] > WORKSPACE_Y[0] + margin) & (points[:, 1] < WORKSPACE_Y[1] - margin)))

    def _random_arc_pose(self, rng):
        curvature = rng.uniform(-7.0, 7.0) if rng.random() < 0.8 else 0.0
        pose = np.array([rng.uniform(-0.08, 0.08), rng.uniform(0.27, 0.34), rng.uniform(-np.pi, np.pi)])
        return curvature, pose

    def reset(self, rng: np.random.Generator) -> None:
        for _ in range(200):
            curvature, pose = self._random_arc_pose(rng)
            target = to_world(self.arc_points(curvature, self.length, self.TARGET_POINTS), pose)
            if self._in_workspace(target, 0.02):
                break
        self.curvature = curvature
        self.target_points = target
        self.set_goal_pose(pose)
        local = self.arc_points(curvature, self.length, self.MARKERS)
        for gid, (x, y) in zip(self.marker_ids, local):
            self.model.geom_pos[gid] = [x, y, 0.0]
        margin = 0.02
        bend = np.zeros(self.SEGMENTS - 1)  # fallback: straight, centred (never needed in practice)
        root = np.array([-self.length / 2, 0.3, 0.0])
        for _ in range(200):
            # A random shape and heading, then a random shift among those that keep it in the workspace.
            bend = rng.uniform(-7.0, 7.0) * self.SEG_LEN + rng.normal(0, 0.05, self.SEGMENTS - 1)
            bend = np.clip(bend, -0.5, 0.5)
            yaw = rng.uniform(-np.pi, np.pi)
            shape = self._chain_nodes(np.array([0.0, 0.0, yaw]), bend)
            low = np.array([WORKSPACE_X[0], WORKSPACE_Y[0]]) + margin + 1e-4 - shape.min(axis=0)
            high = np.array([WORKSPACE_X[1], WORKSPACE_Y[1]]) - margin - 1e-4 - shape.max(axis=0)
            if np.any(high < low):
                continue
            shift = rng.uniform(low, high)
            root = np.array([shift[0], shift[1], yaw])
            nodes = shape + shift
            if self._coverage(nodes) < 0.4 and self.clear_of_keepout(nodes, self.RADIUS):
                break
        self.root.set(self.data, root)
        self.data.qpos[self.root_z_qpos] = 0.0  # resting on the table
        self.data.qvel[self.root_z_dof] = 0.0
        self.data.qpos[self.bend_qpos] = bend
        self.data.qvel[self.bend_dof] = 0.0

    def _chain_nodes(self, root, bend) -> np.ndarray:
        yaw = root[2] + np.concatenate([[0.0], np.cumsum(bend)])
        steps = self.SEG_LEN * np.stack([np.cos(yaw), np.sin(yaw)], -1)
        return np.concatenate([root[None, :2], root[:2] + np.cumsum(steps, 0)])

    def nodes(self) -> np.ndarray:
        """(SEGMENTS+1, 2) rope node positions (segment ends) in the table frame."""
        xpos = self.data.xpos[self.body_ids, :2]
        xmat = self.data.xmat[self.body_ids[-1]].reshape(3, 3)
        end = xpos[-1] + self.SEG_LEN * xmat[:2, 0]
        return np.concatenate([xpos, end[None]])

    def object_poses(self) -> np.ndarray:
        nodes = self.nodes()
        d = np.diff(nodes, axis=0)
        yaw = np.arctan2(d[:, 1], d[:, 0])
        return np.concatenate([nodes, np.append(yaw, yaw[-1])[:, None]], axis=1)

    def _coverage(self, nodes: np.ndarray) -> float:
        dense = np.concatenate([nodes, 0.5 * (nodes[1:] + nodes[:-1])])
        dist = np.linalg.norm(self.target_points[:, None] - dense[None], axis=-1).min(axis=1)
        return float(np.mean(dist <= self.TOLERANCE))

    def score(self) -> float:
        return self._coverage(self.nodes())


# ----------------------------------------------------------------------------------------------
# pile

class Pile(Task):
    """Gather a scatter of small cubes and cylinders into a circular goal region."""

    name = "pile"
    success_threshold = 0.9
    COUNT = 10
    HALF = 0.0125
    GOAL_RADIUS = 0.06

    def mjcf(self) -> str:
        xml = []
        h = self.HALF
        for i in range(self.COUNT):
            if i % 2 == 0:
                geom = f'<geom type="box" size="{h} {h} {h}" pos="0 0 {h}" rgba="{RGBA["object"]}"'
            else:
                geom = f'<geom type="cylinder" size="{h} {h}" pos="0 0 {h}" rgba="{RGBA["object_alt"]}"'
            geom += f' mass="0.02" friction="0.4 0.005 0.0001" {OBJECT_CONTACT}/>'
            xml.append(f'<body name="pile_{i}">{planar_joints_xml(f"pile_{i}", 0.08, 0.001, 0.15)}{geom}</body>')
        return "".join(xml)

    def goal_mjcf(self) -> str:
        return (f'<body name="goal" mocap="true"><geom type="cylinder" size="{self.GOAL_RADIUS} 0.0005" '
                f'rgba="{RGBA["goal"]}" {NO_CONTACT}/></body>')

    def bind(self, model, data) -> None:
        super().bind(model, data)
        self.bodies = [PlanarBody(model, f"pile_{i}") for i in range(self.COUNT)]

    def reset(self, rng: np.random.Generator) -> None:
        goal = np.array([rng.uniform(-0.07, 0.07), rng.uniform(0.28, 0.33), 0.0])
        self.set_goal_pose(goal)
        placed: list[np.ndarray] = []
        while len(placed) < self.COUNT:
            p = np.array([rng.uniform(-0.17, 0.17), rng.uniform(0.22, 0.39)])
            if np.linalg.norm(p - goal[:2]) < self.GOAL_RADIUS + 0.02 or not self.clear_of_keepout(p, 2 * self.HALF):
                continue
            if all(np.linalg.norm(p - q) > 4 * self.HALF for q in placed):
                placed.append(p)
        for body, p in zip(self.bodies, placed):
            body.set(self.data, [p[0], p[1], rng.uniform(-np.pi, np.pi)])

    def object_poses(self) -> np.ndarray:
        poses = np.array([b.get(self.data) for b in self.bodies])
        poses[:, 2] = wrap_angle(poses[:, 2])
        return poses

    def inside(self) -> np.ndarray:
        poses = self.object_poses()
        return np.linalg.norm(poses[:, :2] - self.goal_pose[:2], axis=1) <= self.GOAL_RADIUS

    def score(self) -> float:
        return float(self.inside().mean())


TASK_CLASSES = {cls.name: cls for cls in (PushT, Rope, Pile)}


def make_task(name: str) -> Task:
    if name not in TASK_CLASSES:
        raise ValueError(f"unknown task '{name}', choose one of {sorted(TASK_CLASSES)}")
    return TASK_CLASSES[name]()
