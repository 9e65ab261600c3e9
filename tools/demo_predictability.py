#!/usr/bin/env python3
"""How much of a demonstrator's next command its observations explain.

Behaviour cloning can only learn what the observation determines. This fits a plain MLP (MSE, no
diffusion) from each frame's observation to the next command's offset from the arm, on the first
90 % of the episodes of a pose-encoded demonstration file (`iws policy train --image-encoder pose
--save-demos FILE.npz`), and reports the error on the rest against holding still, with the T's
pose features, without them, and without the arm's velocity:

    python3 tools/demo_predictability.py data/pose_real100.npz --steps 4000

A demonstrator whose command depends on state it keeps to itself (which contact it chose, which it
gave up on) leaves an error no encoder removes. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from iws_policy.train import frame_index

from demo_pose_stats import load_pose_demos


def regression_error(inputs: torch.Tensor, targets: torch.Tensor, train: np.ndarray, held_out: np.ndarray,
                     steps: int, seed: int) -> tuple[float, float]:
    """Mean norm of the MLP's error (rad) on the train and held-out frames."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    mean, std = inputs[train].mean(0), inputs[train].std(0) + 1e-3
    x = (inputs - mean) / std
    width = 256
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], width), torch.nn.Mish(), torch.nn.Linear(width, width),
                              torch.nn.Mish(), torch.nn.Linear(width, width), torch.nn.Mish(),
                              torch.nn.Linear(width, targets.shape[1]))
    optimizer = torch.optim.AdamW(net.parameters(), 1e-3)
    rows = np.nonzero(train)[0]
    for _ in range(steps):
        batch = torch.from_numpy(rng.choice(rows, 256))
        loss = ((net(x[batch]) - targets[batch]) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return tuple(float((net(x[m]) - targets[m]).norm(dim=-1).mean()) for m in (train, held_out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demos", help="a .npz from iws policy train --image-encoder pose --save-demos")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        demos = load_pose_demos(args.demos)
    except (OSError, ValueError) as exc:
        print(f"demo_predictability: error: {exc}", file=sys.stderr)
        return 1
    features, joints, actions = demos.images.astype(np.float32), demos.joints, demos.actions
    starts, lengths = demos.starts, demos.lengths
    episode, t = frame_index(lengths).T  # the policy's own (episode, t) of every frame
    frames = starts[episode] + t
    previous = frames - (t > 0)  # an episode's first frame is its own previous one
    held_out = episode >= int(0.9 * len(lengths))
    train = ~held_out
    pose, arm, velocity = features[frames], joints[frames], joints[frames] - joints[previous]
    targets = torch.from_numpy(actions[frames] - joints[frames])
    result = {"demos": args.demos, "episodes": int(len(lengths)), "frames": int(len(frames)), "steps": args.steps,
              "hold_still_error_rad": float(targets[held_out].norm(dim=-1).mean())}
    for name, parts in (("pose_arm_velocity", (pose, arm, velocity)), ("arm_velocity", (arm, velocity)),
                        ("pose_arm", (pose, arm))):
        train_error, held_out_error = regression_error(torch.from_numpy(np.concatenate(parts, 1)), targets, train,
                                                       held_out, args.steps, args.seed)
        result[name] = {"train_error_rad": train_error, "held_out_error_rad": held_out_error}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
