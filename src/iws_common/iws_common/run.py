"""The body of every node's ``main``: start, spin, and turn a start-up failure into one clear line."""
from __future__ import annotations

import os
import sys

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor


def spin_until_shutdown(spin) -> None:
    """``spin()`` until Ctrl-C or SIGTERM. rclpy's signal handler invalidates the context at once, so
    a callback that was running (a policy's inference, a model step) fails on its next publish with
    RCLError 'context is invalid', and the executor's next take from a subscription can fail inside
    pybind11 with a bare RuntimeError ('Unable to convert call argument'; seen in CI once). Once the
    context is down either is the ordinary end, not a failure."""
    try:
        spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except RuntimeError:  # RCLError is one
        if rclpy.ok():
            raise


def peek_parameter(args: list[str] | None, name: str, default: str) -> str:
    """A ``-p name:=value`` from the command line, before rclpy parses it (the last one wins)."""
    value = default
    args = list(args if args is not None else sys.argv)
    for flag, item in zip(args, args[1:]):
        if flag in ("-p", "--param") and item.startswith(f"{name}:="):
            value = item.split(":=", 1)[1]
    return value


def isolate_simulator(args: list[str] | None) -> None:
    """Before rclpy starts a simulator: localhost-only discovery, and (ROS_DOMAIN_ID unset) the
    robot profile's simulator domain, so that a simulator never joins the hardware's by default.
    The node itself refuses the hardware domain and a graph with a driver in it (iws_common.isolation)."""
    from iws_common.isolation import DISCOVERY_RANGE, env_domain_id
    from iws_common.profile import load_profile

    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = DISCOVERY_RANGE
    if env_domain_id() is None:
        profile = load_profile(peek_parameter(args, "robot", "reference_arm"))
        os.environ["ROS_DOMAIN_ID"] = str(profile.simulator_ros_domain_id)


def run_node(node_class, name: str, executor_class=SingleThreadedExecutor, args: list[str] | None = None,
             simulator: bool = False, **executor_kwargs) -> int:
    """Start ``node_class`` and spin it; a bad parameter, profile or model, or a refusal to start
    beside hardware, is one line on stderr and exit 1."""
    if simulator:
        try:
            isolate_simulator(args)
        except Exception as exc:
            print(f"{name}: cannot start: {exc}", file=sys.stderr)
            return 1
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
        spin_until_shutdown(executor.spin)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0
