"""Re-run a collected episode in the reference simulator: its seed, its recorded commands, and
optionally the object nudged by a few millimetres and degrees.

Open-loop evaluation asks a world model to follow 192 recorded commands from a few frames. How
well *can* anything do? The simulator that made the data, replaying the same commands from a
state known only as well as a camera knows it, is the floor: with the T nudged by 1 mm / 1 deg
at the last context frame its yaw is 13 deg off over 192 steps on average, copy-last's 47
(contact is sensitive, not chaotic). ``iws eval openloop --physics-nudge SIGMA`` scores that
replay as a reference row beside the model (docs/architecture.md, Evaluation).

No ROS here: the episode's seed is read from the bag's metadata.yaml that `iws collect` wrote.
"""
from __future__ import annotations

import math
from pathlib import Path

import mujoco
import numpy as np
import yaml

from iws_common.commands import CLOCK_START_NS, CommandRejected, JointCommandFollower

from .sim import ReferenceSim


class ReplayError(ValueError):
    """The episode cannot be replayed (not collected by `iws collect`, bag gone, other scene)."""


def collected_episode(source: str) -> tuple[int, str]:
    """(seed, task) of a dataset episode's ``source`` ("BAG_DIR#SEGMENT") written by `iws collect`."""
    bag, _, segment = source.rpartition("#")
    bag = Path(bag or source)
    metadata = bag / "metadata.yaml"
    if not metadata.is_file():
        raise ReplayError(f"{bag}: the source bag is gone (no metadata.yaml); the replay needs the bags the "
                          f"dataset was built from, at the path it recorded")
    info = yaml.safe_load(metadata.read_text()).get("rosbag2_bagfile_information", {})
    custom = info.get("custom_data") or {}
    if custom.get("collected_by") != "iws collect" or "seed" not in custom:
        raise ReplayError(f"{bag}: not written by `iws collect` (no seed in its custom data); only collected "
                          f"episodes can be replayed")
    if segment not in ("", "0"):
        raise ReplayError(f"{source}: segment {segment} of a bag; `iws collect` writes one episode per bag")
    return int(custom["seed"]), str(custom.get("task", ""))


def nudge_for(rng: np.random.Generator, sigma: float) -> np.ndarray:
    """(dx, dy, dyaw): normal with ``sigma`` millimetres on each axis and ``sigma`` degrees of yaw."""
    dx, dy, dyaw = rng.normal(0.0, sigma, 3)
    return np.array([dx * 1e-3, dy * 1e-3, math.radians(dyaw)])


def replay(sim: ReferenceSim, seed: int, commands: np.ndarray, nudge_at: int | None = None,
           nudge: np.ndarray | None = None, render_from: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frames ``render_from..len(commands)`` of episode ``seed``, their joint positions and the
    objects' true poses (frames, objects, 3). commands[i] produces frame i + 1, as recorded; the
    object's pose moves by ``nudge`` (dx, dy, dyaw; its velocity kept) right after frame
    ``nudge_at`` is rendered."""
    if sim.task_name != "push_t" and nudge is not None:
        raise ReplayError(f"nudging is defined for push_t's T only, not for task '{sim.task_name}'")
    sim.reset(seed)
    follower = JointCommandFollower(sim.profile.joints)
    follower.reset(sim.joint_positions())
    dt_ns = round(sim.profile.control_period_s * 1e9)  # the clock ticks as `iws collect` ticked it
    frames, joints, poses = [], [], []
    for frame in range(len(commands) + 1):
        if frame >= render_from:
            frames.append(sim.render())
            joints.append(sim.joint_positions())
            poses.append(sim.task.object_poses())
        if frame == nudge_at and nudge is not None:  # after the frame is seen: what its reader gets wrong
            body = sim.task.block
            sim.data.qpos[body.qpos_adr] = body.get(sim.data) + np.asarray(nudge, np.float64)
            mujoco.mj_forward(sim.model, sim.data)
        if frame == len(commands):
            break
        try:
            follower.set_position_command(np.asarray(commands[frame], np.float64))
        except CommandRejected:
            pass  # as when recorded: the previous target is kept
        sim.step(follower.step((CLOCK_START_NS + frame * dt_ns) * 1e-9, dt_ns * 1e-9))
    return np.stack(frames), np.stack(joints).astype(np.float32), np.stack(poses)
