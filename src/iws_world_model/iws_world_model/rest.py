"""`iws eval rest`: does the model leave an untouched T where it is?

    iws eval rest --model models/push_t [--starts 16] [--near-goal 16] [--steps 100]

The plainest thing a simulator must get right: while the arm holds still, nothing moves. From the
reference robot's start states (the matched initial conditions of `iws evaluate`: the arm at home,
the T somewhere on the table) and from states with the T placed just off the goal, the model rolls
the hold command for ``steps`` steps. The T's pose, read from each frame by the pixel estimator, is
compared with the pose the estimator reads from the last real context frame (both read as open
loop reads them: at the model's resolution, upscaled to the camera's); the physics, run the same
way, is the floor. A model that cannot keep a T still cannot keep its yaw over an open loop
(issue 4) nor tell a careful policy from a careless one (issue 6).

No ROS. The start states come from the MuJoCo reference robot (imported lazily, as in longrun);
push_t models only (the pose estimator reads the T).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import metrics
from .checkpoint import CheckpointError
from .config import ConfigError
from .evaluate import EvalError, add_frozen_noise_argument, default_device, load_robot_profile, progress_bar, resize
from .world_model import WorldModel, upscale

NEAR_GOAL_OVERLAP = (0.6, 0.9)  # T placed this far off the goal: near success, not at it
NEAR_GOAL_OFFSET_M = (0.008, 0.02)
NEAR_GOAL_TURN_DEG = (4.0, 15.0)
FLIP_DEG = metrics.FLIP_DEG
STILL = (0.1, 0.1)  # mm, degrees: a frame-to-frame step under both is a T at rest


def upscale_all(images: np.ndarray, height: int, width: int) -> np.ndarray:
    return np.stack([upscale(image, height, width) for image in images])


def near_goal_pose(rng: np.random.Generator, goal: np.ndarray) -> np.ndarray:
    """A T pose 8-20 mm and 4-15 degrees off ``goal`` whose overlap with it is 0.6-0.9."""
    from iws_reference_robot.tasks import t_overlap

    for _ in range(1000):
        angle, radius = rng.uniform(0, 2 * np.pi), rng.uniform(*NEAR_GOAL_OFFSET_M)
        turn = np.deg2rad(rng.uniform(*NEAR_GOAL_TURN_DEG)) * rng.choice([-1.0, 1.0])
        pose = goal + np.array([radius * np.cos(angle), radius * np.sin(angle), turn])
        if NEAR_GOAL_OVERLAP[0] < t_overlap(pose, goal) < NEAR_GOAL_OVERLAP[1]:
            return pose
    raise RuntimeError("no near-goal pose found")  # cannot happen for push_t's T and goal


def rest_starts(profile, seed: int, starts: int, near_goal: int, window: int, steps: int) -> dict:
    """Context windows (arm holding still at home) for ``starts`` reference start states (seeds
    seed, seed+1, ...) and ``near_goal`` states with the T moved just off the goal (seeds after
    those); with each, the simulator's T pose at the last context frame and after ``steps`` more
    held steps (the physics' own drift)."""
    import mujoco

    from iws_reference_robot.sim import ReferenceSim, hold_window
    from iws_reference_robot.tasks import PushT

    sim = ReferenceSim(profile, task="push_t", seed=seed)
    rng = np.random.default_rng(seed)
    images, joints, actions, first, last, kinds = [], [], [], [], [], []
    try:
        for k in range(starts + near_goal):
            sim.reset(seed + k)
            if k >= starts:
                sim.task.block.set(sim.data, near_goal_pose(rng, PushT.GOAL))
                mujoco.mj_forward(sim.model, sim.data)
            context = hold_window(sim, window)
            first.append(sim.task.pose())
            for _ in range(steps):
                sim.step(context["actions"][-1])
            last.append(sim.task.pose())
            images.append(context["images"])
            joints.append(context["joint_positions"])
            actions.append(context["actions"])
            kinds.append("start" if k < starts else "near_goal")
    finally:
        sim.close()
    return {"images": np.stack(images), "joint_positions": np.stack(joints), "actions": np.stack(actions),
            "true_first": np.stack(first), "true_last": np.stack(last), "kinds": np.array(kinds)}


def _summary(found: np.ndarray, poses: np.ndarray, reference: np.ndarray, goal: np.ndarray) -> dict:
    """Drift of the read poses (N, 3) from the reference poses (N, 3) over the worlds where both exist."""
    from iws_reference_robot.tasks import t_overlap

    position, yaw = metrics.pose_errors(poses, reference)
    ok = found & np.isfinite(position)
    mean = lambda v: float(np.mean(v[ok])) if ok.any() else None
    median = lambda v: float(np.median(v[ok])) if ok.any() else None
    self_overlap = np.array([t_overlap(p, r) if f else np.nan for p, r, f in zip(poses, reference, ok)])
    goal_overlap = np.array([t_overlap(p, goal) if f else np.nan for p, f in zip(poses, ok)])
    return {"t_found_rate": float(found.mean()), "position_drift_mm": mean(position),
            "position_drift_mm_median": median(position), "yaw_drift_deg": mean(yaw),
            "yaw_drift_deg_median": median(yaw), "yaw_flip_rate": mean(yaw > FLIP_DEG),
            "overlap_with_start": mean(self_overlap), "overlap_with_goal": mean(goal_overlap)}


def _frame_to_frame(poses: np.ndarray) -> dict:
    """How the read T moves between consecutive frames (poses (steps, N, 3), NaN where not found):
    median step and the share of steps under ``STILL`` mm and degrees. On the robot an untouched T's
    frames are identical and every step is still; a model whose T flickers gives its policies and its
    scripted expert a T that never rests."""
    position, yaw = metrics.pose_errors(poses[1:].reshape(-1, 3), poses[:-1].reshape(-1, 3))
    ok = np.isfinite(position)
    if not ok.any():
        return {"steps": 0, "position_mm_median": None, "yaw_deg_median": None, "still_rate": None}
    still = (position[ok] < STILL[0]) & (yaw[ok] < STILL[1])
    return {"steps": int(ok.sum()), "position_mm_median": float(np.median(position[ok])),
            "yaw_deg_median": float(np.median(yaw[ok])), "still_rate": float(still.mean())}


def rest(model: str | Path, starts: int = 16, near_goal: int = 16, steps: int = 100, seed: int = 90000,
         checkpoints: tuple[int, ...] = (1, 10, 25, 50, 100), out: str | Path | None = None,
         device: str | None = None, progress: bool = True, frozen_noise: str | None = None) -> dict:
    """The report: per kind of start and per checkpoint step, how far the model moved the T.
    ``frozen_noise`` overrides the config's (what a world draws once per reset: ``WorldModel``)."""
    from iws_reference_robot.perception import PushTPoseEstimator
    from iws_reference_robot.tasks import PushT, t_overlap

    if starts < 0 or near_goal < 0 or starts + near_goal == 0:
        raise EvalError(f"need at least one start (--starts {starts}, --near-goal {near_goal})")
    if steps < 1:
        raise EvalError(f"--steps must be >= 1, got {steps}")
    checkpoints = tuple(sorted({c for c in checkpoints if 1 <= c <= steps} | {steps}))
    began = time.time()
    try:
        world = WorldModel.load(model, device or default_device(), frozen_noise=frozen_noise)
    except ConfigError as exc:
        raise EvalError(str(exc)) from exc
    meta_dataset = world.meta.get("dataset", {})
    profile = load_robot_profile(meta_dataset.get("profile"))
    if profile.joints.count != world.joint_dim:
        raise EvalError(f"profile {profile.name} has {profile.joints.count} joints, the model predicts {world.joint_dim}")
    cam_h, cam_w = profile.camera.height, profile.camera.width
    estimator = PushTPoseEstimator(profile)
    context = rest_starts(profile, seed, starts, near_goal, world.config.window, steps)
    n = len(context["kinds"])
    last_real = upscale_all(resize(context["images"][:, -1], world.image_size), cam_h, cam_w)  # as the model's
    real = [estimator.estimate(image) for image in last_real]
    real_found = np.array([e.found for e in real])
    real_pose = np.stack([e.pose if e.found else np.full(3, np.nan) for e in real])
    if not real_found.any():
        raise EvalError("the pose estimator finds no T in the reference robot's frames (push_t models only)")

    world.reset(context["images"], context["joint_positions"], context["actions"], seed=seed)
    hold = context["actions"][:, -1]
    every = np.full((steps, n, 3), np.nan)  # the pose read from every frame (NaN: not found)
    with progress_bar(steps, "at rest", progress) as bar:
        for step in range(steps):
            small, _ = world.step(hold)
            for i in range(n):
                estimate = estimator.estimate(upscale(small[i], cam_h, cam_w))
                if estimate.found:
                    every[step, i] = estimate.pose
            bar.update(1)
    poses = every[[step - 1 for step in checkpoints]]
    found = np.isfinite(poses[..., 0]) & real_found

    goal = PushT.GOAL
    report = {"protocol": {"model": str(model), "starts": starts, "near_goal": near_goal, "steps": steps,
                           "seed": seed, "checkpoints": list(checkpoints), "window": world.config.window,
                           "frozen_noise": world.frozen_noise,
                           "profile": profile.name, "device": str(world.device),
                           "near_goal_placement": {"overlap": list(NEAR_GOAL_OVERLAP), "offset_m": list(NEAR_GOAL_OFFSET_M),
                                                   "turn_deg": list(NEAR_GOAL_TURN_DEG)},
                           "reference": "the pose read from the last real context frame; 'physics' is the simulator's "
                                        "own T after the same held steps against its T at the last context frame"},
               "kinds": {}}
    for kind in ("start", "near_goal"):
        rows = context["kinds"] == kind
        if not rows.any():
            continue
        physics = _summary(np.ones(rows.sum(), bool), context["true_last"][rows], context["true_first"][rows], goal)
        report["kinds"][kind] = {
            "worlds": int(rows.sum()),
            "true_overlap_with_goal": float(np.mean([t_overlap(p, goal) for p in context["true_first"][rows]])),
            "physics_after_steps": physics,
            "model": {str(step): _summary(found[c, rows], poses[c, rows], real_pose[rows], goal)
                      for c, step in enumerate(checkpoints)},
            "model_frame_to_frame": _frame_to_frame(every[:, rows])}
    report["seconds"] = round(time.time() - began, 1)
    report = metrics.jsonable(report)
    out = Path(out) if out else Path(model) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    (out / "rest.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="iws eval rest", description="does the model keep an untouched T where it is? "
                                "The arm holds still; the T's drift read from the model's frames")
    p.add_argument("--model", required=True, help="checkpoint directory (a push_t model)")
    p.add_argument("--starts", type=int, default=16, help="reference start states (seeds SEED, SEED+1, ...)")
    p.add_argument("--near-goal", type=int, default=16, help="states with the T placed just off the goal")
    p.add_argument("--steps", type=int, default=100, help="held steps the model rolls")
    p.add_argument("--seed", type=int, default=90000)
    p.add_argument("--out", default=None, help="output directory (default: MODEL/eval)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_frozen_noise_argument(p)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        report = rest(args.model, args.starts, args.near_goal, args.steps, args.seed, out=args.out,
                      device=args.device, progress=not args.no_progress, frozen_noise=args.frozen_noise)
    except (EvalError, CheckpointError) as exc:
        print(f"iws eval rest: error: {exc}", file=sys.stderr)
        return 2
    for kind, row in report["kinds"].items():
        physics = row["physics_after_steps"]
        print(f"{kind} ({row['worlds']} worlds, true overlap with the goal {row['true_overlap_with_goal']:.2f}; "
              f"physics after {args.steps} steps: {physics['position_drift_mm']:.1f} mm, {physics['yaw_drift_deg']:.1f} deg)")
        flicker = row["model_frame_to_frame"]
        if flicker["steps"]:
            print(f"  frame to frame: T step {flicker['position_mm_median']:.2f} mm, {flicker['yaw_deg_median']:.2f} deg "
                  f"(medians), still in {flicker['still_rate']:.2f} of {flicker['steps']} steps (the robot: all)")
        for step, m in row["model"].items():
            fmt = lambda v, spec: "-" if v is None else format(v, spec)
            print(f"  step {step:>4}: T found {m['t_found_rate']:.2f}  drift {fmt(m['position_drift_mm'], '.1f')} mm "
                  f"(median {fmt(m['position_drift_mm_median'], '.1f')})  yaw {fmt(m['yaw_drift_deg'], '.1f')} deg "
                  f"(median {fmt(m['yaw_drift_deg_median'], '.1f')}, flipped {fmt(m['yaw_flip_rate'], '.2f')})  "
                  f"overlap with start {fmt(m['overlap_with_start'], '.2f')}, with goal {fmt(m['overlap_with_goal'], '.2f')}")
    print(f"wrote {Path(args.out) if args.out else Path(args.model) / 'eval'}/rest.json")
    return 0
