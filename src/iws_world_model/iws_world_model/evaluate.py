"""`iws eval openloop` and `iws eval longrun`: how faithful, and how stable, a world model is.

    iws eval openloop --model runs/push_t --data data/push_t_dataset [--baseline-mse runs/push_t_mse]
    iws eval longrun  --model runs/push_t --minutes 10 --rate 15

openloop (the paper's protocol): on held-out episodes, start from the first ``window`` real frames
(or the ``window`` before ``--first-frame``), replay the recorded actions open loop for ``horizon``
steps and compare every predicted frame with the real one at the model's resolution: PSNR, SSIM,
joint error and, for push_t, the T's pose as the pixel estimator sees it. Copy-last-frame (and
optionally an MSE-dynamics checkpoint) run on the same episodes, so every number has a reference.
With --physics-nudge the reference simulator itself replays the commands, its T nudged by a few mm
/ deg: the floor of what any model could reach.

longrun: a closed loop with the scripted pixel push_t expert for many minutes, to catch drift that
open-loop metrics miss: per simulated minute, how often the T is still found and whether frames
stay inside the pixel statistics of real data.

No ROS here. The long run lives in ``longrun.py`` and drives the model with the pixel expert of
``iws_reference_robot.pixel_expert`` (no ROS either), imported lazily as it pulls in MuJoCo.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from iws_data.dataset import Dataset, DatasetError, Episode

from . import metrics
from .checkpoint import CheckpointError
from .config import FROZEN_NOISE
from .world_model import WorldModel, images_to_tensor, tensor_to_images, upscale

DEFAULT_HORIZON = 192
POSE_TASK = "push_t"
MODEL, COPY_LAST, MSE, AUTOENCODER, ONE_STEP = "world_model", "copy_last", "mse_baseline", "autoencoder", "one_step"
PHYSICS = "physics_nudge_{:g}"  # one row per nudge size
REPLAY_TOLERANCE = 0.5  # mean |difference| in uint8 levels of a replayed context frame (float32 commands: ~0)
REST_MM, REST_DEG = 5.0, 5.0  # the real T within this of its last context pose is "at rest" (at_rest)
PUSHER_MIN_AREA = 0.5  # of the pusher's disc in pixels at the frame's size: fewer red pixels, not drawn


class EvalError(RuntimeError):
    """Evaluation cannot run as asked (no usable episodes, mismatched models, ...)."""


def resize(images: np.ndarray, size: int, chunk: int = 256) -> np.ndarray:
    """uint8 (M, H, W, 3) -> (M, size, size, 3), area-resized exactly as WorldModel resizes its inputs."""
    images = np.asarray(images)
    out = [tensor_to_images(images_to_tensor(images[i:i + chunk], size, "cpu")) for i in range(0, len(images), chunk)]
    return np.concatenate(out) if out else np.zeros((0, size, size, 3), np.uint8)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def progress_bar(total: int, desc: str, progress: bool, unit: str = "step"):
    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, dynamic_ncols=True, file=sys.stderr)


def load_robot_profile(name: str | None):
    """The robot profile a dataset or checkpoint names (reference_arm when it names none)."""
    from iws_common.profile import ProfileError, load_profile

    try:
        return load_profile(name or "reference_arm")
    except ProfileError as exc:
        raise EvalError(f"robot profile {name!r}: {exc}") from exc


def _pose_estimator(profile_name: str | None):
    """The push_t pixel estimator for the dataset's robot profile (numpy only)."""
    from iws_reference_robot.perception import PushTPoseEstimator

    profile = load_robot_profile(profile_name)
    return PushTPoseEstimator(profile), profile


# open loop ------------------------------------------------------------------------------------
@dataclasses.dataclass
class OpenLoopData:
    """N held-out episodes cut for an open-loop run of H steps after a K-frame context."""

    episodes: list[Episode]
    context_images: np.ndarray   # (N, K, Hc, Wc, 3) uint8, camera resolution (the model resizes)
    context_joints: np.ndarray   # (N, K, J)
    context_actions: np.ndarray  # (N, K, J)
    future_actions: np.ndarray   # (N, H, J): actions[K-1+h] produces frame K+h
    real_images: np.ndarray      # (N, H, S, S, 3) uint8, frames K..K+H-1 at model resolution
    real_joints: np.ndarray      # (N, H, J)
    valid: np.ndarray            # (N, H) bool: the episode has a real frame at this step
    last_image: np.ndarray       # (N, S, S, 3): context frame K-1 at model resolution (copy-last)
    last_joints: np.ndarray      # (N, J)
    first_frame: int             # the episode's index of the first predicted frame (K unless --first-frame)

    @property
    def horizon(self) -> int:
        return self.valid.shape[1]


def select_episodes(dataset: Dataset, split: str, count: int, first: int, horizon: int) -> list[Episode]:
    """Up to ``count`` episodes of ``split`` that allow at least one predicted step after the
    ``first`` frames; episodes long enough for the whole horizon come first, then the longest of
    the rest (index order in the end)."""
    episodes = dataset.split(split)
    if not episodes:
        raise EvalError(f"{dataset.root}: no '{split}' episodes (splits present: "
                        f"{sorted({e.split for e in dataset.episodes})})")
    usable = [e for e in episodes if e.length >= first + 1]
    if not usable:
        raise EvalError(f"{dataset.root}: no '{split}' episode is long enough for open loop: need at least "
                        f"{first + 1} frames (first predicted frame + 1; {first + horizon} for the full "
                        f"horizon), the longest has {max(e.length for e in episodes)}")
    full = [e for e in usable if e.length >= first + horizon]
    rest = sorted((e for e in usable if e.length < first + horizon), key=lambda e: -e.length)
    return sorted((full + rest)[:count], key=lambda e: e.index)


def load_open_loop_data(dataset: Dataset, window: int, horizon: int, count: int, size: int,
                        split: str = "val", first_frame: int | None = None) -> OpenLoopData:
    """The episodes cut for open loop: ``window`` context frames ending just before ``first_frame``
    (default: the window itself, the paper's protocol), then ``horizon`` frames to predict. A later
    first frame lets models of different windows predict the very same frames."""
    first = window if first_frame is None else first_frame
    if first < window:
        raise EvalError(f"first predicted frame {first}: the {window}-frame context needs it at {window} or later")
    episodes = select_episodes(dataset, split, count, first, horizon)
    h_eff = min(horizon, max(e.length for e in episodes) - first)
    n, j = len(episodes), len(dataset.joint_names)
    cam_h, cam_w = dataset.image_size
    ctx_images = np.zeros((n, window, cam_h, cam_w, 3), np.uint8)
    ctx_joints, ctx_actions = np.zeros((n, window, j), np.float32), np.zeros((n, window, j), np.float32)
    future = np.zeros((n, h_eff, j), np.float32)
    real_images = np.zeros((n, h_eff, size, size, 3), np.uint8)
    real_joints = np.zeros((n, h_eff, j), np.float32)
    valid = np.zeros((n, h_eff), bool)
    last_image = np.zeros((n, size, size, 3), np.uint8)
    for i, e in enumerate(episodes):
        steps = min(h_eff, e.length - first)
        frames = slice(e.start + first - window, e.start + first + steps)
        images = np.asarray(dataset.images[frames])
        joints = np.asarray(dataset.joint_positions[frames], np.float32)
        actions = np.asarray(dataset.actions[frames], np.float32)
        ctx_images[i], ctx_joints[i], ctx_actions[i] = images[:window], joints[:window], actions[:window]
        small = resize(images[window - 1:], size)
        last_image[i], real_images[i, :steps] = small[0], small[1:]
        real_joints[i, :steps] = joints[window:]
        future[i, :steps] = actions[window - 1:window - 1 + steps]
        future[i, steps:] = actions[-1]  # a short episode holds its last command (its steps are not scored)
        valid[i, :steps] = True
    return OpenLoopData(episodes, ctx_images, ctx_joints, ctx_actions, future, real_images, real_joints, valid,
                        last_image, ctx_joints[:, -1].copy(), first)


def rollout_open_loop(world: WorldModel, data: OpenLoopData, seed: int, desc: str = "rollout",
                      progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """All N episodes as parallel worlds: (N, H, S, S, 3) uint8 frames and (N, H, J) joints."""
    n, horizon = data.valid.shape
    world.reset(data.context_images, data.context_joints, data.context_actions, seed=seed)
    images = np.zeros((n, horizon, world.image_size, world.image_size, 3), np.uint8)
    joints = np.zeros((n, horizon, world.joint_dim), np.float32)
    with progress_bar(horizon, desc, progress) as bar:
        for h in range(horizon):
            images[:, h], joints[:, h] = world.step(data.future_actions[:, h])
            bar.update(1)
    return images, joints


def rollout_one_step(world: WorldModel, data: OpenLoopData, seed: int, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Teacher forcing: each frame predicted in one step from the *real* window before it and the
    recorded command, so that an error here is the dynamics' own, not one compounded over the rollout."""
    n, horizon = data.valid.shape
    k, size = data.context_images.shape[1], world.image_size
    context = resize(data.context_images.reshape(-1, *data.context_images.shape[2:]), size).reshape(n, k, size, size, 3)
    frames = np.concatenate([context, data.real_images], 1)                     # frame i of the episode cut
    joints = np.concatenate([data.context_joints, data.real_joints], 1)
    actions = np.concatenate([data.context_actions, data.future_actions[:, 1:]], 1)  # the command at frame i
    images = np.zeros((n, horizon, size, size, 3), np.uint8)
    out_joints = np.zeros((n, horizon, world.joint_dim), np.float32)
    with progress_bar(horizon, f"one step: {MODEL}", progress) as bar:
        for h in range(horizon):
            world.reset(frames[:, h:h + k], joints[:, h:h + k], actions[:, h:h + k], seed=seed)
            images[:, h], out_joints[:, h] = world.step(data.future_actions[:, h])
            bar.update(1)
    return images, out_joints


def copy_last(data: OpenLoopData) -> tuple[np.ndarray, np.ndarray]:
    """The copy-last-frame baseline: the last context frame and joint state, repeated."""
    horizon = data.horizon
    return (np.repeat(data.last_image[:, None], horizon, 1), np.repeat(data.last_joints[:, None], horizon, 1))


def autoencoded(world: WorldModel, data: OpenLoopData, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The autoencoder reference: every real frame reconstructed (no dynamics), its joints read from
    its own latent. Not a baseline but a ceiling: the error it shows is not the dynamics'."""
    n, horizon = data.valid.shape
    servo_state = None
    if world.servo:  # a servo joint head reads the real joints and commands before each frame
        k = data.context_joints.shape[1]
        joints = np.concatenate([data.context_joints, data.real_joints], 1)
        previous_commands = np.concatenate([data.context_actions[:, -2:-1], data.future_actions[:, :-1]], 1)
        servo_state = [x.reshape(n * horizon, -1) for x in (data.future_actions, previous_commands,
                                                             joints[:, k - 1:k - 1 + horizon], joints[:, k - 2:k - 2 + horizon])]
    images, joints = world.reconstruct(data.real_images.reshape(n * horizon, *data.real_images.shape[2:]),
                                       data.future_actions.reshape(n * horizon, -1), seed, servo_state=servo_state)
    return images.reshape(data.real_images.shape), joints.reshape(n, horizon, -1)


def physics_replay(dataset: Dataset, data: OpenLoopData, sigma: float, seed: int, size: int,
                   progress: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frames (N, H, S, S, 3), joints (N, H, J) and the T's true poses (N, H, 3) of the reference
    simulator replaying each episode's recorded commands from its collecting seed,
    the T nudged by ``sigma`` mm / deg (normal, drawn per episode from ``seed``) at the last context
    frame: the floor of any model that knows the state as well as a camera does. Needs the bags the
    dataset was built from (their seeds) and a scene that still reproduces them."""
    from iws_reference_robot.replay import ReplayError, collected_episode, nudge_for, replay
    from iws_reference_robot.sim import ReferenceSim

    n, horizon = data.valid.shape
    last = data.first_frame - 1  # the last context frame, where the T is nudged
    try:
        seeds = [collected_episode(e.source) for e in data.episodes]
    except ReplayError as exc:
        raise EvalError(f"--physics-nudge: {exc}") from exc
    if any(task != POSE_TASK for _, task in seeds):
        raise EvalError(f"--physics-nudge: only {POSE_TASK} episodes can be replayed with a nudge, "
                        f"these are {sorted({t for _, t in seeds})}")
    images = np.zeros((n, horizon, size, size, 3), np.uint8)
    joints = np.zeros((n, horizon, len(dataset.joint_names)), np.float32)
    truth = np.full((n, horizon, 3), np.nan)
    profile = load_robot_profile(dataset.meta.get("profile"))
    sim = ReferenceSim(profile, task=POSE_TASK)
    try:
        with progress_bar(n, f"physics replay (nudge {sigma:g} mm / deg)", progress, unit="episode") as bar:
            for i, (episode, (episode_seed, _)) in enumerate(zip(data.episodes, seeds)):
                steps = int(data.valid[i].sum())
                commands = np.asarray(dataset.actions[episode.start:episode.start + last + steps])
                nudge = nudge_for(np.random.default_rng([seed, episode.index]), sigma)
                frames, frame_joints, object_poses = replay(sim, episode_seed, commands, nudge_at=last,
                                                            nudge=nudge, render_from=last)
                seen = data.context_images[i, -1]
                gap = (np.abs(frames[0].astype(np.int16) - seen.astype(np.int16)).mean()
                       if frames[0].shape == seen.shape else float("inf"))
                if gap > REPLAY_TOLERANCE:
                    raise EvalError(f"--physics-nudge: replaying {episode.source} does not reproduce its frames "
                                    f"(mean gap {gap:.2f} levels at frame {last}): the scene or robot "
                                    f"profile changed since it was collected")
                images[i, :steps] = resize(frames[1:], size)
                joints[i, :steps] = frame_joints[1:]
                truth[i, :steps] = object_poses[1:, 0]
                bar.update(1)
    finally:
        sim.close()
    return images, joints, truth


def pose_gap(first: np.ndarray, second: np.ndarray, judged: np.ndarray) -> tuple[int, float | None, float | None, float | None]:
    """Frames judged (where both yaws are finite too), mean position gap (mm), mean and median yaw
    gap (deg) between two sets of T poses (..., 3); None where no frame is judged."""
    position, yaw = metrics.pose_errors(first, second)
    judged = judged & np.isfinite(yaw)
    if not judged.any():
        return 0, None, None, None
    return int(judged.sum()), float(position[judged].mean()), float(yaw[judged].mean()), float(np.median(yaw[judged]))


def estimator_error(poses: tuple[np.ndarray, np.ndarray], truth: np.ndarray, valid: np.ndarray) -> dict:
    """How far the pixel estimator reads the T from where the simulator has it: the precision of
    the pose metrics themselves at the model's resolution (found frames only)."""
    found, estimated = poses
    frames, position, yaw, yaw_median = pose_gap(estimated, truth, valid & found)
    return {"frames": frames, "t_position_error_mm": position, "t_yaw_error_deg": yaw, "t_yaw_error_deg_median": yaw_median}


def rollout_spread(first: np.ndarray, second: np.ndarray, first_poses: tuple | None, second_poses: tuple | None,
                   valid: np.ndarray) -> dict:
    """How far two rollouts of one model under the same commands but different noise seeds end up
    apart. A spread much smaller than the error to the real frames says the error is the model's
    bias (it predicts the same wrong thing every time), not its sampling."""
    fidelity = metrics.frame_fidelity(first, second)
    spread = {"psnr": float(fidelity["psnr"][valid].mean()), "ssim": float(fidelity["ssim"][valid].mean())}
    if first_poses is not None and second_poses is not None:
        frames, position, yaw, yaw_median = pose_gap(first_poses[1], second_poses[1], valid & first_poses[0] & second_poses[0])
        if frames:
            spread.update(t_position_mm=position, t_yaw_deg=yaw, t_yaw_deg_median=yaw_median)
    return spread


def frame_poses(estimator, images: np.ndarray, valid: np.ndarray, camera_hw: tuple[int, int],
                bar=None) -> tuple[np.ndarray, np.ndarray]:
    """T pose of each valid frame (N, H, S, S, 3), estimated at camera resolution (the frames are
    upscaled as the node publishes them); found (N, H) and poses (N, H, 3)."""
    found = np.zeros(valid.shape, bool)
    poses = np.full((*valid.shape, 3), np.nan)
    idx = np.nonzero(valid)
    if len(idx[0]):
        big = upscale(images[idx], *camera_hw)
        found[idx], poses[idx] = metrics.estimate_poses(estimator, big, bar)
    return found, poses


def pusher_min_pixels(estimator, height: int, width: int) -> int:
    """Red pixels a frame of this size must show for its pusher to count as drawn: PUSHER_MIN_AREA of
    the pusher's disc, at the pusher's top face (3 at 64x64, 8 at 96x96)."""
    from iws_reference_robot.perception import PUSHER_TOP_DROP
    from iws_reference_robot.scene import PUSHER_RADIUS

    corners = estimator.pixels_to_table(np.array([[0.0, 0.0], [1.0, 0.0]]), height, width, PUSHER_TOP_DROP)
    pixel = np.linalg.norm(corners[1] - corners[0])  # a pixel's width on the table at the pusher's top
    return max(1, int(PUSHER_MIN_AREA * np.pi * PUSHER_RADIUS ** 2 / pixel ** 2))


def frame_pushers(estimator, images: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each valid frame (N, H, S, S, 3) draws the pusher: the centroid of its red pixels,
    back-projected from the pusher's top face onto the table (metres). found (N, H) and xy (N, H, 2).
    Where the image's arm is (the joint head reports the joints it publishes, not the picture)."""
    from iws_reference_robot.perception import PUSHER_TOP_DROP, pusher_centroid

    height, width = images.shape[-3:-1]
    count, uv = np.zeros(valid.shape, np.int64), np.full((*valid.shape, 2), np.nan)
    for i in range(len(images)):  # an episode at a time: the masks of a whole report would take gigabytes
        count[i], uv[i] = pusher_centroid(images[i])
    found = valid & (count >= pusher_min_pixels(estimator, height, width))
    xy = np.full((*valid.shape, 2), np.nan)
    xy[found] = estimator.pixels_to_table(uv[found], height, width, PUSHER_TOP_DROP)
    return found, xy


def at_rest(real_poses: tuple, last_poses: tuple) -> np.ndarray:
    """(N, H) frames where the real T is found within REST_MM and REST_DEG of where it was in the last
    context frame: nothing has pushed it yet (or it was pushed back), so copy-last is right there and
    any yaw error a model makes on them is a turn it invented, not a push it got wrong."""
    (real_found, real_pose), (last_found, last_pose) = real_poses, last_poses
    position, yaw = metrics.pose_errors(real_pose, last_pose)
    with np.errstate(invalid="ignore"):
        return real_found & last_found & (position < REST_MM) & (yaw < REST_DEG)


def joint_response(joints: np.ndarray, data: OpenLoopData) -> list[dict]:
    """``metrics.arm_response`` of predicted (or real) joints (N, H, J) to the replayed commands, the
    context's last two frames before them."""
    seq = np.concatenate([data.context_joints[:, -2:], joints], 1)
    if data.context_joints.shape[1] < 2:  # a one-frame context: no step before the first
        seq = np.concatenate([data.context_joints[:, -1:], seq], 1)
    now, before = seq[:, 1:-1], seq[:, :-2]
    step, offset, last = seq[:, 2:] - now, data.future_actions - now, now - before
    return metrics.arm_response(step[data.valid], offset[data.valid], last[data.valid])


def score_open_loop(pred_images: np.ndarray, pred_joints: np.ndarray, data: OpenLoopData,
                    real_poses: tuple | None = None, pred_poses: tuple | None = None, bar=None,
                    rest: np.ndarray | None = None, pushers: tuple | None = None) -> dict:
    """Per-step curves (averaged over the episodes that reach the step) and their horizon means.
    ``rest`` (N, H), from ``at_rest``, splits the yaw error into frames where the real T has not
    moved since the context and frames where it has. ``pushers``: (real, predicted) ``frame_pushers``."""
    valid = data.valid
    fidelity = metrics.frame_fidelity(pred_images, data.real_images, progress=bar)
    # (N, H) values and the frames where each counts; per step they average over the episodes,
    # per episode over its steps (which episodes carry an error, and how unevenly).
    frames = {"psnr": (fidelity["psnr"], valid), "ssim": (fidelity["ssim"], valid),
              "joint_mae_rad": (metrics.joint_error(pred_joints, data.real_joints), valid)}
    if real_poses is not None and pred_poses is not None:
        (real_found, real_pose), (pred_found, pred_pose) = real_poses, pred_poses
        seen = valid & real_found  # only frames where the T is visible in the real frame are judged
        position, yaw = metrics.pose_errors(pred_pose, real_pose)
        frames["t_found_rate"] = (pred_found.astype(np.float64), seen)
        frames["t_position_error_mm"] = (position, seen & pred_found)
        frames["t_yaw_error_deg"] = (yaw, seen & pred_found)
        # A smeared T is misread as one of its other orientations (about 90, 120 or 180 deg off), not as
        # a T a little rotated: the share of frames past FLIP_DEG says how much of the mean is such flips.
        frames["t_yaw_flip_rate"] = ((yaw > metrics.FLIP_DEG).astype(np.float64), seen & pred_found & np.isfinite(yaw))
        # Position and yaw in one figure each, as the task sees a pose: how far the T's area moved
        # (ADD) and how much of the predicted T lies on the real one (push_t's overlap score).
        from iws_reference_robot.tasks import t_pose_gaps
        displacement, overlap = t_pose_gaps(pred_pose, real_pose)
        frames["t_displacement_mm"] = (1000.0 * displacement, seen & pred_found)
        frames["t_overlap"] = (overlap, seen & pred_found)
    if pushers is not None:  # is the arm drawn where the robot's was (pixels, not the joint head)?
        (real_found, real_xy), (pred_found, pred_xy) = pushers
        frames["pusher_error_mm"] = (1000.0 * np.linalg.norm(pred_xy - real_xy, axis=-1), real_found & pred_found)
        frames["pusher_found_rate"] = (pred_found.astype(np.float64), real_found)
    per_step = {k: metrics.masked_mean(v, m) for k, (v, m) in frames.items()}
    per_episode = {k: metrics.masked_mean(v, m, axis=1) for k, (v, m) in frames.items()}
    summary = {k: float(metrics.masked_mean(v, np.ones_like(v, bool))) for k, v in per_step.items()}
    summary["psnr_last_step"] = float(per_step["psnr"][-1])
    summary["arm_response"] = joint_response(pred_joints, data)  # against the real one in the report's "real"
    if "t_yaw_error_deg" in frames:  # the yaw error is heavy-tailed (a smeared T reads 90-180 deg off)
        yaw, counted = frames["t_yaw_error_deg"]
        judged = counted & np.isfinite(yaw)
        summary["t_yaw_error_deg_median"] = float(np.median(yaw[judged])) if judged.any() else float("nan")
        if rest is not None:
            summary["t_at_rest_rate"] = float(rest[judged].mean()) if judged.any() else float("nan")
            for key, where in (("t_yaw_error_deg_at_rest", judged & rest), ("t_yaw_error_deg_moved", judged & ~rest)):
                summary[key] = float(yaw[where].mean()) if where.any() else float("nan")
    return {"per_step": per_step, "per_episode": per_episode, "summary": summary}


def side_by_side(panels: list[np.ndarray], step: int, scale: int) -> np.ndarray:
    """One video frame: the model-resolution panels side by side, enlarged, the step number drawn."""
    from iws_data.info import draw_text

    big = [np.repeat(np.repeat(p, scale, 0), scale, 1) for p in panels]
    gap = np.full((big[0].shape[0], 2, 3), 255, np.uint8)
    frame = np.concatenate([x for p in big for x in (p, gap)][:-1], axis=1)
    draw_text(frame, str(step), 3, 3, scale=2)
    return frame


def openloop(model: str | Path, data: str | Path, episodes: int = 8, horizon: int = DEFAULT_HORIZON,
             baseline_mse: str | Path | None = None, out: str | Path | None = None, videos: int = 2,
             seed: int = 0, split: str = "val", pose: bool = True, device: str | None = None,
             progress: bool = True, dynamics_steps: int | None = None, autoencoder: bool = False,
             one_step: bool = False, history_level: int | None = None, reencode: bool = False,
             physics_nudge: tuple[float, ...] = (), seed_spread: bool = False,
             snap_threshold: float | None = None, start_history_level: int | None = None,
             first_frame: int | None = None, frozen_noise: str | None = None) -> dict:
    """Run the open-loop protocol; writes OUT/openloop.json and the videos, returns the report.
    ``dynamics_steps`` overrides the model's consistency jumps per step (not the MSE baseline's);
    ``autoencoder`` adds the reconstructed real frames as a reference row (the dynamics' ceiling);
    ``one_step`` adds the model's one-step predictions from real history (teacher forcing);
    ``history_level`` overrides the noise label of the model's history at inference;
    ``start_history_level`` labels the real start frames alone (default: as the rest of the history);
    ``snap_threshold`` overrides the model's (latent cells that barely move keep their value);
    ``physics_nudge`` adds, per size, the reference simulator's own replay, the T nudged by that many mm / deg;
    ``seed_spread`` rolls the model out again under seed + 1 and reports how far the two rollouts differ;
    ``first_frame`` starts the prediction at that frame of each episode instead of at the window;
    ``frozen_noise`` overrides the config's (what a world draws once per reset: ``WorldModel``)."""
    started = time.time()
    if horizon < 1 or episodes < 1:
        raise EvalError(f"horizon and episodes must be >= 1, got {horizon} and {episodes}")
    physics_nudge = tuple(float(sigma) for sigma in physics_nudge)
    if not all(0 <= sigma < float("inf") for sigma in physics_nudge) or len(set(physics_nudge)) < len(physics_nudge):
        raise EvalError(f"--physics-nudge takes distinct finite sizes >= 0 (mm and degrees), got {list(physics_nudge)}")
    device = device or default_device()
    try:
        world = WorldModel.load(model, device, dynamics_steps=dynamics_steps, history_level=history_level,
                               reencode=reencode, snap_threshold=snap_threshold, start_history_level=start_history_level,
                               frozen_noise=frozen_noise)
    except ValueError as exc:  # an override outside the config's rules
        raise EvalError(str(exc)) from exc
    dataset = Dataset(data)
    if dataset.joint_names and world.joint_names and dataset.joint_names != world.joint_names:
        raise EvalError(f"{data}: joints {dataset.joint_names} differ from the model's {world.joint_names}")
    worlds = {MODEL: world}
    if baseline_mse:
        mse = WorldModel.load(baseline_mse, device)
        if (mse.image_size, mse.config.window) != (world.image_size, world.config.window):
            raise EvalError(f"{baseline_mse}: image size {mse.image_size} / window {mse.config.window} differ from "
                            f"{model}'s {world.image_size} / {world.config.window}; open loop compares like with like")
        if mse.config.dynamics_objective != "mse":
            print(f"iws eval openloop: note: {baseline_mse} has dynamics_objective "
                  f"{mse.config.dynamics_objective!r}, not 'mse'", file=sys.stderr)
        worlds[MSE] = mse
    window, size = world.config.window, world.image_size
    cut = load_open_loop_data(dataset, window, horizon, episodes, size, split, first_frame)
    n, h_eff = cut.valid.shape

    predictions = {name: rollout_open_loop(w, cut, seed, f"open loop: {name}", progress) for name, w in worlds.items()}
    again = rollout_open_loop(world, cut, seed + 1, f"open loop: {MODEL}, seed {seed + 1}", progress) if seed_spread else None
    predictions[COPY_LAST] = copy_last(cut)
    order = [MODEL, COPY_LAST] + ([MSE] if MSE in worlds else [])
    if one_step:
        predictions[ONE_STEP] = rollout_one_step(world, cut, seed, progress)
        order.append(ONE_STEP)
    if autoencoder:
        predictions[AUTOENCODER] = autoencoded(world, cut, seed)
        order.append(AUTOENCODER)
    truths = {}  # the simulator's own T poses of the physics rows
    for sigma in physics_nudge:
        name = PHYSICS.format(sigma)
        images, joints, truths[name] = physics_replay(dataset, cut, sigma, seed, size, progress)
        predictions[name] = (images, joints)
        order.append(name)

    tasks = sorted({e.task for e in cut.episodes})
    poses, pushers, pose_note = {}, {}, None
    if not pose:
        pose_note = "disabled (--no-pose)"
    elif tasks != [POSE_TASK]:
        pose_note = f"only for {POSE_TASK} episodes; these are {tasks}"
    else:
        estimator, _ = _pose_estimator(dataset.meta.get("profile"))
        camera_hw = dataset.image_size
        estimated = [name for name in order if name != COPY_LAST]  # copy-last's pose is its last frame's
        count = int(cut.valid.sum()) * (1 + len(estimated) + (again is not None)) + n
        with progress_bar(count, "T pose estimation", progress, unit="frame") as bar:
            poses["real"] = frame_poses(estimator, cut.real_images, cut.valid, camera_hw, bar)
            for name in estimated:
                poses[name] = frame_poses(estimator, predictions[name][0], cut.valid, camera_hw, bar)
            found, pose_last = frame_poses(estimator, cut.last_image[:, None], np.ones((n, 1), bool), camera_hw, bar)
            poses[COPY_LAST] = (np.repeat(found, h_eff, 1), np.repeat(pose_last, h_eff, 1))
            if again is not None:
                poses["again"] = frame_poses(estimator, again[0], cut.valid, camera_hw, bar)
        pushers = {name: frame_pushers(estimator, predictions[name][0], cut.valid) for name in order if name != COPY_LAST}
        pushers["real"] = frame_pushers(estimator, cut.real_images, cut.valid)
        found, xy = frame_pushers(estimator, cut.last_image[:, None], np.ones((n, 1), bool))
        pushers[COPY_LAST] = (np.repeat(found, h_eff, 1) & cut.valid, np.repeat(xy, h_eff, 1))

    with progress_bar(n * h_eff * len(order), "PSNR and SSIM", progress, unit="frame") as bar:
        rest = at_rest(poses["real"], poses[COPY_LAST]) if poses else None
        results = {name: score_open_loop(*predictions[name], cut, poses.get("real"), poses.get(name), bar, rest,
                                         (pushers["real"], pushers[name]) if pushers else None)
                   for name in order}
    if again is not None:
        results[MODEL]["seed_spread"] = rollout_spread(predictions[MODEL][0], again[0], poses.get(MODEL),
                                                       poses.get("again"), cut.valid)
    for name, truth in truths.items():
        if name in poses:
            results[name]["estimator_vs_truth"] = estimator_error(poses[name], truth, cut.valid)
    out = Path(out) if out else Path(model) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    video_paths = []
    if videos > 0:
        from iws_data.video import write_mp4

        scale = max(1, 192 // size)
        for i in range(min(videos, n)):
            steps = int(cut.valid[i].sum())
            frames = (side_by_side([cut.real_images[i, h]] + [predictions[name][0][i, h] for name in order], h + 1, scale)
                      for h in range(steps))
            path = out / f"openloop_episode{cut.episodes[i].index:04d}.mp4"
            write_mp4(frames, path, dataset.control_rate_hz if dataset.meta.get("control_rate_hz") else 10.0)
            video_paths.append(str(path))

    report = {
        "protocol": {
            "model": str(model), "baseline_mse": str(baseline_mse) if baseline_mse else None, "dataset": str(data),
            "split": split, "episodes": [e.index for e in cut.episodes], "episode_lengths": [e.length for e in cut.episodes],
            "window": window, "first_frame": cut.first_frame, "image_size": size, "requested_horizon": horizon,
            "effective_horizon": h_eff,
            "episodes_per_step": cut.valid.sum(0), "seed": seed, "device": str(world.device),
            "psnr_cap_db": metrics.PSNR_CAP_DB, "decode_steps": world.decode_steps,
            "dynamics_steps": world.dynamics_steps,
            "history_level": world.history_level, "start_history_level": world.start_history_level,
            "reencode": world.reencode, "snap_threshold": world.snap_threshold, "frozen_noise": world.frozen_noise,
            "physics_nudge": list(physics_nudge),
            "seed_spread": seed + 1 if seed_spread else None,
            "pose_metrics": pose_note or "T pose by iws_reference_robot.perception on frames upscaled to the camera "
                                         "size; errors over frames where the T is found in both; the pusher's "
                                         "centroid (its red pixels at the model's size) on the table"},
        "models": results,
        "real": {"t_found_rate": metrics.masked_mean(poses["real"][0].astype(float), cut.valid) if "real" in poses else None,
                 "arm_response": joint_response(cut.real_joints, cut)},
        "videos": video_paths, "video_panels": ["real"] + order,
        "seconds": round(time.time() - started, 1),
    }
    report = metrics.jsonable(report)
    (out / "openloop.json").write_text(json.dumps(report, indent=1))
    return report


def _print_openloop(report: dict, out: Path) -> None:
    p = report["protocol"]
    print(f"open loop: {len(p['episodes'])} episode(s), horizon {p['effective_horizon']}"
          + (f" (asked {p['requested_horizon']})" if p["effective_horizon"] != p["requested_horizon"] else ""))
    for name, r in report["models"].items():
        s = r["summary"]
        fmt = lambda key, spec: "-" if s.get(key) is None else format(s[key], spec)
        print(f"  {name:16s} PSNR {fmt('psnr', '6.2f')} dB  SSIM {fmt('ssim', '.3f')}  joints {fmt('joint_mae_rad', '.4f')} rad"
              + (f"  T found {fmt('t_found_rate', '.2f')}  pos {fmt('t_position_error_mm', '.1f')} mm"
                 f"  yaw {fmt('t_yaw_error_deg', '.1f')} deg (median {fmt('t_yaw_error_deg_median', '.1f')},"
                 f" {fmt('t_yaw_flip_rate', '.0%')} over {metrics.FLIP_DEG:g})"
                 f"  area moved {fmt('t_displacement_mm', '.1f')} mm  overlap {fmt('t_overlap', '.2f')}"
                 if "t_found_rate" in s else ""))
        if s.get("pusher_error_mm") is not None:
            print(f"  {'':16s} pusher drawn {fmt('pusher_error_mm', '.1f')} mm from the real one "
                  f"(found in {fmt('pusher_found_rate', '.0%')} of frames)")
        if s.get("t_at_rest_rate") is not None:
            print(f"  {'':16s} yaw where the real T is at rest ({s['t_at_rest_rate']:.0%} of frames) "
                  f"{fmt('t_yaw_error_deg_at_rest', '.1f')} deg, where it moved {fmt('t_yaw_error_deg_moved', '.1f')} deg")
        spread = r.get("seed_spread")
        if spread:
            print(f"  {'':16s} against itself under seed {report['protocol']['seed_spread']}: PSNR {spread['psnr']:.2f} dB"
                  + (f"  pos {spread['t_position_mm']:.1f} mm  yaw {spread['t_yaw_deg']:.1f} deg"
                     f" (median {spread['t_yaw_deg_median']:.1f})" if "t_yaw_deg" in spread else ""))
        truth = r.get("estimator_vs_truth")
        if truth and truth["frames"]:
            print(f"  {'':16s} its frames read against the simulator's T: pos {truth['t_position_error_mm']:.1f} mm"
                  f"  yaw {truth['t_yaw_error_deg']:.1f} deg (median {truth['t_yaw_error_deg_median']:.1f})")
    print(f"wrote {out / 'openloop.json'}" + (f" and {len(report['videos'])} video(s)" if report["videos"] else ""))


def nudge_sizes(text: str) -> tuple[float, ...]:
    """--physics-nudge's comma-separated sizes (checked by ``openloop``)."""
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers (mm and degrees), got {text!r}") from None


def add_frozen_noise_argument(p: argparse.ArgumentParser) -> None:
    """`--frozen-noise`, as every evaluation that runs a world model takes it (``WorldModel``)."""
    p.add_argument("--frozen-noise", choices=FROZEN_NOISE, default=None,
                   help="draw once per reset instead of every step: nothing, the decoder's noise, or the dynamics' too "
                        "(default: the model config's frozen_noise)")


def add_inference_arguments(p: argparse.ArgumentParser) -> None:
    """The model config's inference switches a rollout may override (``WorldModel``): jumps, snap, noise."""
    p.add_argument("--dynamics-steps", type=int, choices=(1, 2, 3), default=None,
                   help="consistency jumps per predicted latent (default: the model's)")
    p.add_argument("--snap-threshold", type=float, default=None,
                   help="latent cells the dynamics moves less than this keep their value; 0 = off "
                        "(default: the model config's snap_threshold)")
    add_frozen_noise_argument(p)


def openloop_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="iws eval openloop", description="open-loop fidelity on held-out episodes "
                                "(PSNR, SSIM, joint error, push_t T pose) against copy-last-frame and an MSE baseline")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--data", required=True, help="cached dataset directory (its held-out split is used)")
    p.add_argument("--episodes", type=int, default=8, help="held-out episodes, rolled out as parallel worlds")
    p.add_argument("--horizon", type=int, default=DEFAULT_HORIZON, help="open-loop steps after the context window")
    p.add_argument("--baseline-mse", default=None, help="checkpoint trained with dynamics_objective: mse")
    p.add_argument("--out", default=None, help="output directory (default: MODEL/eval)")
    p.add_argument("--videos", type=int, default=2, help="side-by-side MP4s (real | model | copy-last [| mse] [| one-step] [| autoencoder] [| physics])")
    p.add_argument("--autoencoder", action="store_true",
                   help="also score the real frames reconstructed by the model's autoencoder: the ceiling of any dynamics")
    p.add_argument("--one-step", action="store_true",
                   help="also score one-step predictions from the real frames before each (teacher forcing): "
                        "the dynamics' own error, without compounding")
    p.add_argument("--physics-nudge", type=nudge_sizes, default=(), metavar="SIGMA[,SIGMA...]",
                   help="also score the reference simulator replaying the same commands from each episode's "
                        "collecting seed, the T nudged by SIGMA mm and SIGMA deg (normal) at the last context "
                        "frame: the floor of a model that knows the state as well as a camera (needs the bags); "
                        "one row per size, e.g. 0,2,5")
    p.add_argument("--seed-spread", action="store_true",
                   help="roll the model out again under seed + 1 and report how far the two rollouts differ "
                        "(small against the error to the real frames: the error is bias, not sampling)")
    p.add_argument("--split", default="val", help="dataset split to evaluate on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-pose", action="store_true", help="skip the push_t T-pose metrics")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--reencode", action="store_true",
                   help="feed the dynamics the encoder's latent of each rendered frame instead of its predicted latent")
    p.add_argument("--history-level", type=int, default=None,
                   help="noise level the history is labelled with at inference (default: the model config's history_level)")
    p.add_argument("--start-history-level", type=int, default=None,
                   help="noise level the real start frames alone are labelled with (default: as the history)")
    p.add_argument("--first-frame", type=int, default=None, metavar="F",
                   help="predict from frame F of each episode on, the window before it as context (default: "
                        "the window; a later F compares models of different windows on the same frames)")
    add_inference_arguments(p)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        report = openloop(args.model, args.data, args.episodes, args.horizon, args.baseline_mse, args.out, args.videos,
                          args.seed, args.split, not args.no_pose, args.device, dynamics_steps=args.dynamics_steps,
                          autoencoder=args.autoencoder, one_step=args.one_step, history_level=args.history_level,
                          reencode=args.reencode, snap_threshold=args.snap_threshold,
                          start_history_level=args.start_history_level, physics_nudge=args.physics_nudge,
                          seed_spread=args.seed_spread, first_frame=args.first_frame, frozen_noise=args.frozen_noise)
    except (EvalError, DatasetError, CheckpointError) as exc:
        print(f"iws eval openloop: error: {exc}", file=sys.stderr)
        return 2
    _print_openloop(report, Path(args.out) if args.out else Path(args.model) / "eval")
    return 0


def longrun_main(argv: list[str] | None = None) -> int:
    """`iws eval longrun` (see longrun.py)."""
    from .longrun import main

    return main(argv)
