"""`iws eval longrun`: closed-loop stability over many simulated minutes.

    iws eval longrun --model runs/push_t --minutes 10 [--data data/push_t_dataset]

Open-loop metrics cannot see drift that builds up when a policy reacts to the model's own frames.
Here the scripted pixel push_t expert drives the model from a shipped start window; per simulated
minute the report says how often the T is still found and whether frames stay inside the pixel
statistics of real data. No ROS is used; the pixel expert (iws_reference_robot.pixel_expert) pulls
in MuJoCo for its kinematics, so it is imported lazily inside ``longrun``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from iws_data.dataset import Dataset, DatasetError

from . import metrics
from .checkpoint import CheckpointError
from .config import ConfigError
from .evaluate import EvalError, add_inference_arguments, progress_bar, default_device, load_robot_profile, resize
from .start_windows import StartWindowError, load_start_windows
from .world_model import WorldModel, upscale


def reference_frames(model: str | Path, size: int, data: str | Path | None, samples: int = 2000) -> tuple[np.ndarray, str]:
    """Real frames at model resolution that define 'in distribution': evenly spaced dataset frames
    if a dataset is given, else the checkpoint's start windows."""
    if data:
        dataset = Dataset(data)
        index = np.unique(np.linspace(0, len(dataset) - 1, min(samples, len(dataset))).astype(np.int64))
        return resize(np.asarray(dataset.images[index]), size), f"dataset {data} ({len(index)} frames)"
    windows = load_start_windows(model)["images"]
    return resize(windows.reshape(-1, *windows.shape[-3:]), size), f"start windows ({windows.shape[0]}x{windows.shape[1]} frames)"


def longrun(model: str | Path, minutes: float = 10.0, rate: float | None = None, out: str | Path | None = None, seed: int = 0,
            data: str | Path | None = None, start_window: int = 0, video_every: int | None = None,
            margin: float = 0.25, min_fraction: float = 0.95, device: str | None = None, progress: bool = True,
            dynamics_steps: int | None = None, snap_threshold: float | None = None,
            frozen_noise: str | None = None) -> dict:
    """Closed loop: the pixel push_t expert drives the model from its own (upscaled) frames.

    The expert's command goes through the same JointCommandFollower as the ROS node (clamping,
    velocity limit); while the T is not found the last command is held."""
    from iws_common.commands import CommandRejected, JointCommandFollower
    from iws_data.info import draw_text
    from iws_data.video import write_mp4
    from iws_reference_robot.pixel_expert import PushTExpertPolicy

    started = time.time()
    try:
        world = WorldModel.load(model, device or default_device(), dynamics_steps=dynamics_steps,
                                snap_threshold=snap_threshold, frozen_noise=frozen_noise)
    except ConfigError as exc:  # an override outside the config's rules
        raise EvalError(str(exc)) from exc
    meta_dataset = world.meta.get("dataset", {})
    profile = load_robot_profile(meta_dataset.get("profile"))
    rate = rate or meta_dataset.get("control_rate_hz") or profile.control_rate_hz  # one model step = one data period
    if minutes <= 0 or rate <= 0:
        raise EvalError(f"minutes and rate must be positive, got {minutes} and {rate}")
    steps = max(1, int(round(minutes * 60 * rate)))
    per_minute = max(1, int(round(60 * rate)))
    video_every = video_every or max(1, steps // 900)
    windows = load_start_windows(model)
    if not 0 <= start_window < len(windows["images"]):
        raise EvalError(f"{model}: start window {start_window} out of range (0..{len(windows['images']) - 1})")
    if profile.joints.count != world.joint_dim:
        raise EvalError(f"profile {profile.name} has {profile.joints.count} joints, the model predicts {world.joint_dim}")
    cam_h, cam_w = meta_dataset.get("image_size") or (profile.camera.height, profile.camera.width)
    frames, source = reference_frames(model, world.image_size, data)
    reference = {**metrics.reference_range(frames, margin=margin), "source": source}

    policy = PushTExpertPolicy(profile, seed)
    follower = JointCommandFollower(profile.joints)
    images, joints, actions = (windows[k][start_window] for k in ("images", "joint_positions", "actions"))
    world.reset(images, joints, actions, seed=seed)
    follower.reset(actions[-1])
    image = np.asarray(images[-1])
    if image.shape[:2] != (cam_h, cam_w):
        image = upscale(resize(image[None], world.image_size)[0], cam_h, cam_w)
    position = np.asarray(joints[-1], np.float64)

    found = np.zeros(steps, bool)
    score = np.full(steps, np.nan)  # push_t overlap of the estimated T with the goal, where found
    finite = np.ones(steps, bool)
    stats = {key: np.zeros(steps) for key in metrics.STATISTICS}
    step_ms, policy_ms = np.zeros(steps), np.zeros(steps)
    video, rejected, done = [], 0, 0
    try:
        with progress_bar(steps, "long run", progress) as bar:
            for i in range(steps):
                t0 = time.perf_counter()
                command = policy.act(image, position)
                t1 = time.perf_counter()
                estimate = policy.last_estimate
                found[i] = estimate.found
                if estimate.found:
                    score[i] = policy.estimator.score(estimate.pose)
                if command is not None:
                    try:
                        follower.set_position_command(command)
                    except CommandRejected:
                        rejected += 1  # as the node: the previous target is kept
                follower.step(i / rate, 1.0 / rate)
                small, predicted = world.step(follower.target.copy())
                t2 = time.perf_counter()
                step_ms[i], policy_ms[i] = 1000 * (t2 - t1), 1000 * (t1 - t0)
                finite[i] = bool(np.isfinite(predicted).all() and torch.isfinite(world.latent).all())
                for key, value in metrics.frame_statistics(small[None]).items():
                    stats[key][i] = value[0]
                image = upscale(small, cam_h, cam_w)
                position = predicted.astype(np.float64)
                if i % video_every == 0:
                    frame = image.copy()
                    draw_text(frame, str(i), 2, 2, scale=1)
                    video.append(frame)
                done = i + 1
                bar.update(1)
                if not finite[i]:
                    break  # a diverged world cannot be driven further; the report says where
    finally:
        policy.close()

    inside = metrics.in_distribution({k: v[:done] for k, v in stats.items()}, reference)
    minutes_report = []
    for m, start in enumerate(range(0, done, per_minute)):
        s = slice(start, min(start + per_minute, done))
        summary = lambda v: {"mean": float(v[s].mean()), "min": float(v[s].min()), "max": float(v[s].max())}
        minutes_report.append({
            "minute": m, "steps": s.stop - s.start, "t_found_rate": float(found[s].mean()),
            "t_score_mean": metrics.masked_mean(score[s], found[s]),
            **{key: summary(values) for key, values in stats.items()},
            "in_distribution_fraction": float(inside[s.start:s.stop].mean()),
            "nonfinite_steps": int((~finite[s]).sum()),
            "step_ms": {"mean": float(step_ms[s].mean()), "p95": float(np.percentile(step_ms[s], 95))},
            "policy_ms_mean": float(policy_ms[s].mean())})
    healthy = done == steps and all(m["in_distribution_fraction"] >= min_fraction and m["nonfinite_steps"] == 0
                                    for m in minutes_report)
    out = Path(out) if out else Path(model) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    video_path = out / "longrun.mp4"
    if video:
        write_mp4(video, video_path, rate, upscale=max(1, 288 // max(cam_h, cam_w)))
    report = metrics.jsonable({
        "protocol": {"model": str(model), "minutes": minutes, "rate_hz": rate, "steps": steps, "steps_run": done,
                     "seed": seed, "start_window": start_window, "policy": "push_t pixel expert (holds its last "
                     "command while the T is not found)", "profile": profile.name, "camera_size": [cam_h, cam_w],
                     "image_size": world.image_size, "dynamics_steps": world.dynamics_steps,
                     "snap_threshold": world.snap_threshold, "frozen_noise": world.frozen_noise, "device": str(world.device),
                     "min_in_distribution_fraction": min_fraction},
        "reference": reference,
        "minutes": minutes_report,
        "in_distribution_all_minutes": healthy,
        "diverged_at_step": None if finite[:done].all() else int(np.argmin(finite[:done])),
        "rejected_commands": rejected,
        "overall": {"t_found_rate": float(found[:done].mean()), "t_score_mean": metrics.masked_mean(score[:done], found[:done]),
                    "in_distribution_fraction": float(inside.mean()),
                    "step_ms_mean": float(step_ms[:done].mean()), "policy_ms_mean": float(policy_ms[:done].mean())},
        "video": str(video_path) if video else None, "video_every": video_every,
        "seconds": round(time.time() - started, 1),
    })
    (out / "longrun.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="iws eval longrun", description="closed-loop long-horizon stability: the pixel "
                                "push_t expert drives the model; per simulated minute, T found rate and drift")
    p.add_argument("--model", required=True, help="checkpoint directory (with start_windows.npz)")
    p.add_argument("--minutes", type=float, default=10.0, help="simulated minutes")
    p.add_argument("--rate", type=float, default=None, help="model steps per simulated second, Hz "
                   "(default: the control rate of the model's training data, so that a minute is a real minute)")
    p.add_argument("--out", default=None, help="output directory (default: MODEL/eval)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="dataset for the reference pixel statistics (default: start windows)")
    p.add_argument("--start-window", type=int, default=0, help="which shipped start window to begin from")
    p.add_argument("--video-every", type=int, default=None, help="keep every Nth frame for the MP4 (default: <= 900 frames)")
    p.add_argument("--margin", type=float, default=0.25, help="widen the reference box by this share of its width")
    p.add_argument("--min-fraction", type=float, default=0.95, help="in-distribution share each minute must reach")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_inference_arguments(p)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        report = longrun(args.model, args.minutes, args.rate, args.out, args.seed, args.data, args.start_window,
                         args.video_every, args.margin, args.min_fraction, args.device,
                         dynamics_steps=args.dynamics_steps, snap_threshold=args.snap_threshold,
                         frozen_noise=args.frozen_noise)
    except (EvalError, DatasetError, CheckpointError, StartWindowError) as exc:
        print(f"iws eval longrun: error: {exc}", file=sys.stderr)
        return 2
    for m in report["minutes"]:
        score = "-" if m["t_score_mean"] is None else f"{m['t_score_mean']:.2f}"
        print(f"  minute {m['minute']:3d}: T found {m['t_found_rate']:.2f}  score {score}  in distribution "
              f"{m['in_distribution_fraction']:.2f}  pixel mean {m['pixel_mean']['mean']:.3f}  "
              f"std {m['pixel_std']['mean']:.3f}  tv {m['pixel_tv']['mean']:.3f}  step {m['step_ms']['mean']:.1f} ms")
    print(f"in distribution all minutes: {report['in_distribution_all_minutes']}; "
          f"wrote {Path(args.out) if args.out else Path(args.model) / 'eval'}/longrun.json")
    return 0
