"""The body of every node's ``main``: start, spin, and turn a start-up failure into one clear line."""
from __future__ import annotations

import sys

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor


def run_node(node_class, name: str, executor_class=SingleThreadedExecutor, args: list[str] | None = None,
             **executor_kwargs) -> int:
    """Start ``node_class`` and spin it; a bad parameter, profile or model is one line on stderr, exit 1."""
    rclpy.init(args=args)
    try:
        node = node_class()
    except Exception as exc:
        print(f"{name}: cannot start: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 1
    executor = executor_class(**executor_kwargs)
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0
