#!/usr/bin/env python3
"""How steady the T reads, frame to frame, in a pose-encoded demonstration file.

On the reference robot an untouched T does not move, so most frame-to-frame changes of its read
pose are zero; inside the world model the T jitters (see `iws eval rest`). A policy trained on
world-model demos learns the expert's answers to that jitter. For each file (from `iws policy train
--image-encoder pose --save-demos FILE.npz`) this reports the T's step between consecutive frames
(mm and degrees, where both frames found it), the arm's step and the command's offset from the arm,
each joint's span, and how each joint answers a command: the least-squares gains of its next step on
the command's offset from it and on its last step (the reference arm's servo: about 0.6 and 0.16;
a backend whose arm answers otherwise teaches a policy other commands):

    python3 tools/demo_pose_stats.py data/pose_real100.npz data/pose_wm100.npz

Prints JSON, one entry per file.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from iws_policy.diffusion import POSE_SCALE_M  # PoseEncoder's features: offset / POSE_SCALE_M, cos, sin, found
from iws_policy.train import POSE_ENCODER, DemoSet, frame_index
from iws_world_model import metrics


def load_pose_demos(path: str) -> DemoSet:
    """A --save-demos file whose features the pose estimator made (DemoSet.load refuses other encoders')."""
    demos = DemoSet.load(path, POSE_ENCODER)
    if not demos.encoded:
        raise ValueError(f"{path}: holds images, not pose features (save them with --image-encoder pose --save-demos)")
    return demos


def stats(path: str) -> dict:
    demos = load_pose_demos(path)
    features, joints = demos.images.astype(np.float64), demos.joints
    episode, t = frame_index(demos.lengths).T
    now = (demos.starts[episode] + t)[t > 0]  # every frame with a previous one in its episode
    before = now - 1
    both = (features[now, 4] > 0.5) & (features[before, 4] > 0.5)  # the T found in both frames
    moves = np.linalg.norm(features[now, :2] - features[before, :2], axis=1)[both] * POSE_SCALE_M * 1000
    yaw = np.arctan2(features[:, 3], features[:, 2])
    turns = np.degrees(np.abs(np.angle(np.exp(1j * (yaw[now] - yaw[before])))))[both]
    return {
        "demos": path, "episodes": int(len(demos.lengths)), "frames": int(len(features)),
        "t_found": float(features[:, 4].mean()),
        "t_step_mm": {"median": float(np.median(moves)), "p90": float(np.percentile(moves, 90)),
                      "share_over_5mm": float((moves > 5).mean()), "share_zero": float((moves < 1e-3).mean())},
        "t_step_deg": {"median": float(np.median(turns)), "p90": float(np.percentile(turns, 90)),
                       "share_over_10deg": float((turns > 10).mean())},
        "arm_step_rad": float(np.abs(joints[now] - joints[before]).mean()),
        "command_offset_rad": float(np.abs(demos.actions - joints).mean()),
        "joint_span_rad": [float(x) for x in joints.max(0) - joints.min(0)],
        "arm_response": arm_response(demos),
    }


def arm_response(demos: DemoSet) -> list[dict]:
    """Per joint, ``iws_world_model.metrics.arm_response`` over every frame with a step before and after."""
    joints, actions = demos.joints.astype(np.float64), demos.actions.astype(np.float64)
    episode, t = frame_index(demos.lengths).T
    frames = demos.starts[episode] + t
    now = frames[(t > 0) & (t < demos.lengths[episode] - 1)]
    return metrics.arm_response(joints[now + 1] - joints[now], actions[now] - joints[now], joints[now] - joints[now - 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demos", nargs="+", help="pose-encoded demonstration files (.npz)")
    args = parser.parse_args(argv)
    try:
        print(json.dumps([stats(p) for p in args.demos], indent=1))
    except (OSError, ValueError) as exc:  # DemoSet.load turns a bad file into a ValueError
        print(f"demo_pose_stats: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
