#!/usr/bin/env python3
"""Where a world model's learnt action keypoints land: each point against push_t's pusher.

`action_keypoints` (docs/architecture.md) lets the dynamics draw the command as a few points on its
latent grid, placed by an MLP that nobody tells where the arm is. If the dynamics found the points
useful for contact, one of them should follow the pusher. For frames of held-out episodes this fits
each point's (x, y) to the pusher's centroid in the frame its command produced (red pixels,
`perception.pusher_mask`) by least squares (affine), and prints the residual in latent cells and the
share of the pusher's variance explained. An affine fit of the raw command (joint positions) is the
baseline: the arm's kinematics are not linear in its joints.

    python3 tools/action_keypoints.py runs/keypoints_cur data/push_t_dataset --frames 4000
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from iws_data.dataset import Dataset
from iws_reference_robot.perception import pusher_centroid
from iws_world_model.evaluate import _pose_estimator, pusher_min_pixels
from iws_world_model.world_model import WorldModel


def affine_fit(features: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """Residual RMS (target units, both axes together) and explained variance of target ~ features."""
    design = np.concatenate([features, np.ones((len(features), 1))], 1)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    residual = target - design @ coef
    rms = float(np.sqrt((residual ** 2).sum(1).mean()))
    explained = 1 - float((residual ** 2).sum() / ((target - target.mean(0)) ** 2).sum())
    return rms, explained


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="checkpoint directory trained with action_keypoints > 0")
    p.add_argument("data", help="push_t dataset directory (its val episodes are read)")
    p.add_argument("--frames", type=int, default=4000, help="frames drawn from the val episodes")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    world = WorldModel.load(args.model)
    drawer = world.network.dynamics.action_points
    if drawer is None:
        sys.exit(f"{args.model}: trained without action_keypoints; nothing to locate")
    data = Dataset(args.data)
    episodes = data.split("val") or data.episodes
    rng = np.random.default_rng(args.seed)
    frames = np.array(sorted({int(e.start + rng.integers(0, e.length - 1))
                              for e in rng.choice(episodes, args.frames)}))  # command at i, its frame at i + 1
    images = np.asarray(data.images[frames + 1])
    count, centroid = pusher_centroid(images)
    seen = count >= pusher_min_pixels(_pose_estimator(data.meta.get("profile"))[0], *images.shape[1:3])  # as openloop
    centroid = centroid[seen]
    side = drawer.side
    pusher = (centroid + 0.5) / images.shape[2] * side  # in latent cells, as the points
    commands = np.asarray(data.actions[frames])[seen]
    with torch.no_grad():
        points = drawer.points(world.normalize_actions(commands)).numpy()
    report = {"model": str(args.model), "frames": int(seen.sum()), "latent_side": side,
              "pusher_spread_cells": float(np.sqrt(((pusher - pusher.mean(0)) ** 2).sum(1).mean()))}
    rms, explained = affine_fit(commands, pusher)
    report["command_affine"] = {"residual_cells": rms, "explained": explained}
    report["points"] = []
    for k in range(points.shape[1]):
        rms, explained = affine_fit(points[:, k], pusher)
        report["points"].append({"residual_cells": rms, "explained": explained,
                                 "spread_cells": float(np.sqrt(((points[:, k] - points[:, k].mean(0)) ** 2).sum(1).mean()))})
    rms, explained = affine_fit(points.reshape(len(points), -1), pusher)
    report["all_points_affine"] = {"residual_cells": rms, "explained": explained}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
