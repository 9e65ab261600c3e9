"""`iws up BACKEND`: start a backend on a robot profile's topics without `ros2 launch`.

Reads the same config/bringup.yaml as robot.launch.py and runs the backend's node in this
process, so `iws up reference --task push_t` and
`ros2 launch iws_bringup robot.launch.py backend:=reference task:=push_t` start the same node.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from iws_bringup.backends import BringupError, get_backend, load_backends, node_parameters, ros_arguments
from iws_common.profile import ProfileError, load_profile


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iws up", description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", help=f"one of {sorted(load_backends())}")
    parser.add_argument("--robot", default="reference_arm", help="robot profile name or YAML path")
    parser.add_argument("--task", help="reference robot task: push_t, rope or pile")
    parser.add_argument("--mode", choices=("realtime", "lockstep"), help="timing mode")
    parser.add_argument("--seed", type=int, help="initial-state seed")
    parser.add_argument("--model", help="world model checkpoint directory (default: the shipped models/push_t)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        backend = get_backend(args.backend)
        load_profile(args.robot)  # fail here, with the profile's own message, before any node starts
    except (BringupError, ProfileError) as exc:
        print(f"iws up: {exc}", file=sys.stderr)
        return 2
    if not backend.starts_a_node:
        print(f"iws up {backend.name}: {backend.description}. Nothing to start.")
        return 0
    params = node_parameters(backend, args.robot, {"task": args.task, "mode": args.mode, "seed": args.seed, "model": args.model})
    module_name, func_name = backend.entry_point.split(":")
    entry = getattr(importlib.import_module(module_name), func_name)
    return int(entry(["iws_up"] + ros_arguments(params)) or 0)


if __name__ == "__main__":
    sys.exit(main())
