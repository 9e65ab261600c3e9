#!/usr/bin/env python3
"""How steady the T reads, frame to frame, in a pose-encoded demonstration file.

On the reference robot an untouched T does not move, so most frame-to-frame changes of its read
pose are zero; inside the world model the T jitters (see `iws eval rest`). A policy trained on
world-model demos learns the expert's answers to that jitter. For each file (from `iws policy train
--image-encoder pose --save-demos FILE.npz`) this reports the T's step between consecutive frames
(mm and degrees, where both frames found it), the arm's step and the command's offset from the arm:

    python3 tools/demo_pose_stats.py data/pose_real100.npz data/pose_wm100.npz

Prints JSON, one entry per file.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from iws_policy.diffusion import POSE_SCALE_M  # PoseEncoder's features: offset / POSE_SCALE_M, cos, sin, found


def pose_steps(features: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The T's step (mm, deg) between consecutive frames of each episode where both found it."""
    moves, turns = [], []
    for start, length in zip(starts, lengths):
        f = features[start:start + length].astype(np.float64)
        both = (f[1:, 4] > 0.5) & (f[:-1, 4] > 0.5)
        moves.append(np.linalg.norm(np.diff(f[:, :2], axis=0), axis=1)[both] * POSE_SCALE_M * 1000)
        yaw = np.arctan2(f[:, 3], f[:, 2])
        turns.append(np.degrees(np.abs(np.angle(np.exp(1j * np.diff(yaw)))))[both])
    return np.concatenate(moves), np.concatenate(turns)


def stats(path: str) -> dict:
    with np.load(path) as data:
        features, joints, actions = data["images"], data["joints"], data["actions"]
        starts, lengths = data["starts"], data["lengths"]
    if features.dtype == np.uint8 or features.ndim != 2 or features.shape[1] != 5:
        raise ValueError(f"{path}: not pose features (save them with --image-encoder pose --save-demos)")
    moves, turns = pose_steps(features, starts, lengths)
    arm_steps = np.concatenate([np.abs(np.diff(joints[s:s + n], axis=0)).mean(1) for s, n in zip(starts, lengths)])
    return {
        "demos": path, "episodes": int(len(lengths)), "frames": int(len(features)),
        "t_found": float(features[:, 4].mean()),
        "t_step_mm": {"median": float(np.median(moves)), "p90": float(np.percentile(moves, 90)),
                      "share_over_5mm": float((moves > 5).mean()), "share_zero": float((moves < 1e-3).mean())},
        "t_step_deg": {"median": float(np.median(turns)), "p90": float(np.percentile(turns, 90)),
                       "share_over_10deg": float((turns > 10).mean())},
        "arm_step_rad": float(arm_steps.mean()),
        "command_offset_rad": float(np.abs(actions - joints).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demos", nargs="+", help="pose-encoded demonstration files (.npz)")
    args = parser.parse_args(argv)
    try:
        print(json.dumps([stats(p) for p in args.demos], indent=1))
    except (OSError, ValueError, KeyError) as exc:
        print(f"demo_pose_stats: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
