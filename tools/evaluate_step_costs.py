"""Where one step of `iws evaluate` goes in this process: the policy's command and the referee's verdict.

The backend's own step (the world model's, `iws bench step`) runs in the other process. Run beside
nothing else:

    python3 tools/evaluate_step_costs.py runs/pose_real100_80k/step_064000 --action-horizon 2

Prints JSON: milliseconds per command of the policy (averaged over re-planning and executed steps)
and per frame of the pixel scorer, on distinct frames (the pose estimator caches a repeated frame).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", help="policy checkpoint directory, or 'expert'")
    parser.add_argument("--action-horizon", type=int, default=None)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--robot", default="reference_arm")
    args = parser.parse_args()

    import torch

    from iws_common.profile import load_profile
    from iws_policy.node import make_runner
    from iws_reference_robot.scoring import PixelScorer
    from iws_reference_robot.sim import ReferenceSim

    torch.set_num_threads(1)  # as iws evaluate: the backend has the other core
    profile = load_profile(args.robot)
    sim = ReferenceSim(profile, task="push_t", seed=40000)
    image, joints = sim.render(), sim.joint_positions()
    rng = np.random.default_rng(0)
    frames = [np.clip(image.astype(np.int16) + rng.integers(-2, 3, image.shape), 0, 255).astype(np.uint8)
              for _ in range(2 * args.frames)]
    scorer = PixelScorer(profile)
    started = time.perf_counter()
    for frame in frames[:args.frames]:
        scorer(frame)
    scorer_ms = (time.perf_counter() - started) / args.frames * 1e3
    runner = make_runner(args.policy, profile, seed=1, action_horizon=args.action_horizon)
    runner.act(frames[0], joints)  # warm-up
    started = time.perf_counter()
    for frame in frames[args.frames:]:
        runner.act(frame, joints)
    policy_ms = (time.perf_counter() - started) / args.frames * 1e3
    sim.close()
    print(json.dumps({"policy": args.policy, "action_horizon": getattr(runner, "action_horizon", None),
                      "policy_ms_per_command": round(policy_ms, 1), "scorer_ms_per_frame": round(scorer_ms, 1)}))


if __name__ == "__main__":
    main()
