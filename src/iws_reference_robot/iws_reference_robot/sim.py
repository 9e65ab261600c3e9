"""ReferenceSim: the MuJoCo reference world behind the ROS node and data collection (no ROS here).

One control period = hold position setpoints for profile.control_period_s while physics substeps
run; render() draws the profile's top-down camera. Kinematics (FK/IK of the pusher, camera
projection) are analytic so that experts and tests need no extra MuJoCo calls.
"""
from __future__ import annotations

import math
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from iws_common.profile import RobotProfile  # noqa: E402

from . import scene  # noqa: E402
from .tasks import TaskState, make_task  # noqa: E402

# Joint 0 = 0 points link 1 along +y (the base body is turned by 90 degrees about z).
SHOULDER_OFFSET = math.pi / 2
# Objects are placed at least this far from the pusher's home position, so reset never overlaps.
HOME_KEEPOUT = scene.PUSHER_RADIUS + 0.015


class ReferenceSim:
    TASKS = ("push_t", "rope", "pile")

    def __init__(self, profile: RobotProfile, task: str = "push_t", seed: int = 0):
        if task not in self.TASKS:
            raise ValueError(f"unknown task '{task}', choose one of {self.TASKS}")
        self.profile = profile
        self.task_name = task
        self.task = make_task(task)
        xml = scene.build_scene_xml(profile, task_bodies=self.task.mjcf(), goal_marker=self.task.goal_mjcf())
        self.model = mujoco.MjModel.from_xml_string(xml)
        self.data = mujoco.MjData(self.model)
        self.task.bind(self.model, self.data)
        names = profile.joints.names
        self._qpos_adr = np.array([self.model.joint(n).qposadr[0] for n in names])
        self._dof_adr = np.array([self.model.joint(n).dofadr[0] for n in names])
        self._act_ids = np.array([self.model.actuator(f"{n}_servo").id for n in names])
        self.lower = np.array(profile.joints.lower)
        self.upper = np.array(profile.joints.upper)
        self.home = np.array(profile.joints.home)
        self.max_velocity = np.array(profile.joints.max_velocity)
        self._setpoint = self.home.copy()
        self.task.keepout = (self.forward_kinematics(self.home), HOME_KEEPOUT)
        self.substeps = max(1, round(profile.control_period_s / self.model.opt.timestep))
        self._camera_id = self.model.camera("top").id
        self._renderer: mujoco.Renderer | None = None
        self._next_seed = seed
        self.seed: int | None = None
        self.reset(seed)

    # -- episode ---------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """New initial state from seed (None: the next seed of an internal sequence)."""
        if seed is None:
            seed = self._next_seed
        self._next_seed = seed + 1
        self.seed = seed
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[self._qpos_adr] = self.home
        self.data.ctrl[self._act_ids] = self.home
        self._setpoint = self.home.copy()
        self.task.reset(np.random.default_rng(seed))
        mujoco.mj_forward(self.model, self.data)

    def step(self, joint_setpoint: np.ndarray) -> None:
        """Hold the position setpoints for one control period.

        The servo reference ramps from the previous setpoint to the new one within the period and
        moves at most max_velocity, like a drive's own interpolation: a jump in the command then
        cannot swing the arm through objects at unphysical speed (valid commands are unaffected).
        """
        setpoint = np.clip(np.asarray(joint_setpoint, dtype=np.float64).reshape(-1), self.lower, self.upper)
        start = self._setpoint
        max_step = self.max_velocity * self.profile.control_period_s
        target = start + np.clip(setpoint - start, -max_step, max_step)
        for k in range(1, self.substeps + 1):
            self.data.ctrl[self._act_ids] = start + (target - start) * (k / self.substeps)
            mujoco.mj_step(self.model, self.data)
        self._setpoint = target

    def render(self) -> np.ndarray:
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.profile.camera.height, self.profile.camera.width)
        self._renderer.update_scene(self.data, camera=self._camera_id)
        return self._renderer.render()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # -- state ---------------------------------------------------------------------------
    def joint_positions(self) -> np.ndarray:
        return self.data.qpos[self._qpos_adr].copy()

    def joint_velocities(self) -> np.ndarray:
        return self.data.qvel[self._dof_adr].copy()

    @property
    def time(self) -> float:
        return float(self.data.time)

    def task_state(self) -> TaskState:
        return self.task.state()

    def pusher_xy(self) -> np.ndarray:
        """Pusher position from the simulation itself (equals forward_kinematics(joint_positions()))."""
        return self.data.geom("pusher").xpos[:2].copy()

    # -- kinematics ----------------------------------------------------------------------
    def forward_kinematics(self, q) -> np.ndarray:
        """Pusher (x, y) in the table frame."""
        q = np.asarray(q, dtype=np.float64)
        a1 = q[0] + SHOULDER_OFFSET
        a2 = a1 + q[1]
        return np.array([scene.LINK1 * math.cos(a1) + scene.LINK2 * math.cos(a2),
                         scene.LINK1 * math.sin(a1) + scene.LINK2 * math.sin(a2)])

    @property
    def reach(self) -> tuple[float, float]:
        """Smallest and largest pusher distance from the base the joint limits allow."""
        l1, l2 = scene.LINK1, scene.LINK2
        q2 = min(abs(self.lower[1]), abs(self.upper[1]), math.pi)
        return math.sqrt(l1 * l1 + l2 * l2 + 2 * l1 * l2 * math.cos(q2)), l1 + l2

    def _ik_solution(self, xy, elbow_sign: float) -> np.ndarray:
        l1, l2 = scene.LINK1, scene.LINK2
        r_min, r_max = self.reach
        r = float(np.hypot(xy[0], xy[1]))
        direction = math.atan2(xy[1], xy[0]) if r > 1e-9 else SHOULDER_OFFSET
        r = min(max(r, r_min + 1e-9), r_max - 1e-9)
        c2 = (r * r - l1 * l1 - l2 * l2) / (2 * l1 * l2)
        q2 = math.copysign(math.acos(max(-1.0, min(1.0, c2))), elbow_sign)
        a1 = direction - math.atan2(l2 * math.sin(q2), l1 + l2 * math.cos(q2))
        q1 = (a1 - SHOULDER_OFFSET + math.pi) % (2 * math.pi) - math.pi
        return np.array([q1, q2])

    def inverse_kinematics(self, xy, wrist: float = 0.0, elbow_sign: int = +1) -> np.ndarray:
        """Joint positions putting the pusher at xy (closest reachable point if outside), within limits.

        The requested elbow branch is used when its shoulder angle is within limits, otherwise the
        other branch; if neither fits, the requested one is clipped.
        """
        xy = np.asarray(xy, dtype=np.float64)
        sign = 1.0 if elbow_sign >= 0 else -1.0
        chosen = None
        for s in (sign, -sign):
            q12 = self._ik_solution(xy, s)
            if self.lower[0] <= q12[0] <= self.upper[0]:
                chosen = q12
                break
        if chosen is None:
            chosen = self._ik_solution(xy, sign)
        q = np.array([chosen[0], chosen[1], wrist])
        return np.clip(q, self.lower, self.upper)

    def project_to_pixels(self, xyz) -> np.ndarray:
        """(u, v) pixel coordinates (pixel centres at integers) of table-frame points, shape (..., 2)."""
        p = np.asarray(xyz, dtype=np.float64)
        cam = self.profile.camera
        cx_w, cy_w = scene.CAMERA_CENTER
        depth = scene.CAMERA_HEIGHT - p[..., 2]
        u = cam.cx + cam.fy * (p[..., 0] - cx_w) / depth
        v = cam.cy - cam.fy * (p[..., 1] - cy_w) / depth
        return np.stack([u, v], axis=-1)


def start_window(sim: ReferenceSim, seed: int, frames: int) -> dict[str, np.ndarray]:
    """The reference robot's initial state for ``seed`` as a window of ``frames`` observations,
    the arm holding still: what a world model is reset to so that both backends start alike
    (matched initial conditions). Images at the camera resolution, oldest first."""
    sim.reset(seed)
    return hold_window(sim, frames)


def hold_window(sim: ReferenceSim, frames: int) -> dict[str, np.ndarray]:
    """``frames`` observations from the simulator's current state with the arm holding still (the
    first is the state itself), as ``start_window`` returns them."""
    hold = sim.joint_positions()
    images, joints = [], []
    for k in range(frames):
        if k:
            sim.step(hold)
        images.append(sim.render())
        joints.append(sim.joint_positions())
    return {"images": np.stack(images), "joint_positions": np.stack(joints).astype(np.float32),
            "actions": np.repeat(hold[None].astype(np.float32), frames, 0)}
