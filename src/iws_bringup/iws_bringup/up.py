"""`iws up BACKEND`: start a backend on a robot profile's topics without `ros2 launch`.

Reads the same config/bringup.yaml as robot.launch.py and runs the backend's node in this
process, so `iws up reference --task push_t` and
`ros2 launch iws_bringup robot.launch.py backend:=reference task:=push_t` start the same node.
`iws up ab` starts the A/B pair of the same YAML (see iws_bringup.ab), like ab.launch.py.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from iws_bringup.backends import BringupError, get_backend, load_ab, load_backends, node_parameters, ros_arguments
from iws_common.isolation import DISCOVERY_RANGE, IsolationError, client_hint, simulator_environment
from iws_common.profile import ProfileError, load_profile, normalize_namespace
from iws_world_model.config import FROZEN_NOISE  # plain Python: no torch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iws up", description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", help=f"one of {sorted(load_backends())}, or ab (reference under /real and "
                                        "world_model under /sim, driven by the same top-level commands), "
                                        "or policy (`iws up policy --checkpoint CKPT`)")
    parser.add_argument("--robot", default="reference_arm", help="robot profile name or YAML path")
    parser.add_argument("--task", help="reference robot task: push_t, rope or pile")
    parser.add_argument("--mode", choices=("realtime", "lockstep"), help="timing mode")
    parser.add_argument("--seed", type=int, help="initial-state seed")
    parser.add_argument("--model", help="world model checkpoint directory (default: the shipped models/push_t)")
    parser.add_argument("--threads", type=int, help="world model inference threads (default: bringup.yaml's)")
    parser.add_argument("--frozen-noise", choices=FROZEN_NOISE,
                        help="world model: what a reset draws once instead of every step (default: the model's own)")
    parser.add_argument("--namespace", help="prefix every profile topic and service, e.g. /sim (not with ab)")
    parser.add_argument("--allow-hardware-domain", action="store_true", default=None,
                        help="start even on the profile's hardware ROS domain (docs/safety.md)")
    parser.add_argument("--allow-foreign-nodes", action="store_true", default=None,
                        help="start even when another node (a driver?) serves this robot's topics")
    parser.add_argument("--logs", type=Path, help="ab: directory for the nodes' logs (default: out/ab_<date-time>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["policy"]:  # a client, not a backend: `iws up policy --checkpoint CKPT`
        from iws_policy.node import main as policy_main
        return policy_main(argv[1:])
    args = build_parser().parse_args(argv)
    overrides = {"task": args.task, "mode": args.mode, "seed": args.seed, "model": args.model, "threads": args.threads,
                 "frozen_noise": args.frozen_noise,
                 "allow_hardware_domain": args.allow_hardware_domain, "allow_foreign_nodes": args.allow_foreign_nodes}
    try:
        profile = load_profile(args.robot)  # fail here, with the profile's own message, before any node starts
        if args.backend != "real":
            # The simulator's own domain (unless ROS_DOMAIN_ID says otherwise), localhost only.
            os.environ.update(simulator_environment(profile))
            print(f"iws up: ROS domain {os.environ['ROS_DOMAIN_ID']}, discovery {DISCOVERY_RANGE}; "
                  f"{client_hint(profile)}", flush=True)
        if args.backend == "ab":
            if args.namespace:
                raise BringupError("--namespace is for one backend; ab takes its namespaces from config/bringup.yaml")
            from iws_bringup.ab import run_ab
            load_ab()  # a broken ab entry fails here, before anything starts
            return run_ab(args.robot, overrides, args.logs)
        backend = get_backend(args.backend)
        overrides["namespace"] = normalize_namespace(args.namespace) if args.namespace else None
    except (BringupError, ProfileError, IsolationError) as exc:
        print(f"iws up: {exc}", file=sys.stderr)
        return 2
    if not backend.starts_a_node:
        print(f"iws up {backend.name}: {backend.description}. Nothing to start.")
        return 0
    params = node_parameters(backend, args.robot, overrides)
    module_name, func_name = backend.entry_point.split(":")
    entry = getattr(importlib.import_module(module_name), func_name)
    return int(entry(["iws_up"] + ros_arguments(params)) or 0)


def env_main(argv: list[str] | None = None) -> int:
    """`iws env`: the exports that put a shell's own nodes (a policy, rviz, ros2 topic) on the
    simulator's domain, localhost only: ``eval $(iws env)``."""
    parser = argparse.ArgumentParser(prog="iws env", description=env_main.__doc__.split("\n\n")[0])
    parser.add_argument("--robot", default="reference_arm", help="robot profile name or YAML path")
    parser.add_argument("--hardware", action="store_true", help="the hardware's domain instead (network discovery)")
    args = parser.parse_args(argv)
    try:
        profile = load_profile(args.robot)
        if args.hardware:
            print(f"export ROS_DOMAIN_ID={profile.hardware_ros_domain_id}; unset ROS_AUTOMATIC_DISCOVERY_RANGE")
        else:
            print("export " + " ".join(f"{k}={v}" for k, v in simulator_environment(profile, env={}).items()))
    except (ProfileError, IsolationError) as exc:
        print(f"iws env: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
