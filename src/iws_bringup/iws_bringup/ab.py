"""`iws up ab`: the reference robot and the world model side by side, driven by the same commands.

Starts the nodes of the ``ab`` entry of config/bringup.yaml (the same plan ab.launch.py starts):
each side under its own namespace (/real, /sim) and the command fan-out, which republishes the
top-level command topics into both. Each node runs in its own process with its output in a log;
Ctrl-C (or SIGTERM) stops them all. The world model starts from its own shipped start windows, so
A/B compares behaviour under the same commands, not pixel-identical starts; `iws compare --sync`
resets /sim to /real's latest frames.
"""
from __future__ import annotations

import signal
import sys
import time
from datetime import datetime
from pathlib import Path

from iws_bringup.backends import NodeLaunch, ab_nodes, load_ab, ros_arguments
from iws_common.isolation import DISCOVERY_RANGE, simulator_domain
from iws_common.profile import RobotProfile, load_profile, repo_root

READY_TIMEOUT_S = 180.0  # loading a large model on a small CPU takes a while


def node_command(node: NodeLaunch) -> list[str]:
    return [sys.executable, "-m", node.backend.entry_point.split(":")[0]] + ros_arguments(node.parameters, node.namespace)


def describe(nodes: list[NodeLaunch], profile: RobotProfile) -> str:
    """Where each side's interface lives, for the user to point tools at."""
    lines = []
    sides = [n for n in nodes if n.label != "fanout"]
    for node in sides:
        p = profile.namespaced(node.namespace)
        lines.append(f"  {node.namespace:<6} {node.backend.name:<12} {p.topics.joint_states}  {p.topics.image}  "
                     f"step: {p.services.step}  reset: {p.services.reset}")
    lines.append(f"  commands {profile.topics.position_command} and {profile.topics.trajectory_command} "
                 f"-> {', '.join(n.namespace for n in sides)}")
    lines.append(f"  compare: iws compare --out ab.mp4 [--sync]    teleop: iws teleop --observe {sides[0].namespace}")
    return "\n".join(lines)


def wait_until_ready(nodes: list[NodeLaunch], processes: dict, profile: RobotProfile) -> bool:
    """Wait for each side's first WorldStatus; False (with the log named) if a node stops first."""
    from iws_common.client import RosClient
    from iws_interfaces.msg import WorldStatus

    client = RosClient(simulator_domain(profile), name="iws_up_ab")
    try:
        status = {n.label: client.collect(WorldStatus, profile.namespaced(n.namespace).topics.world_status)
                  for n in nodes if n.label != "fanout"}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for label, process in processes.items():
                if not process.alive():
                    print(f"iws up ab: {label} stopped during start-up; its log {process.log_path}:\n"
                          f"{process.output()[-2000:]}", file=sys.stderr)
                    return False
            if all(status.values()):
                for label, received in status.items():
                    s = received[-1]
                    print(f"iws up ab: {label} ready ({s.backend}, {s.model_id}, {s.mode})", flush=True)
                return True
            time.sleep(0.2)
        print(f"iws up ab: not every side reported WorldStatus within {READY_TIMEOUT_S:.0f} s; still running",
              file=sys.stderr)
        return True
    finally:
        client.close()


def run_ab(robot: str, overrides: dict, logs: Path | None = None) -> int:
    from iws_common.processes import NodeProcess, stop_all

    profile = load_profile(robot)
    nodes = ab_nodes(robot, overrides, load_ab())
    logs = (logs or repo_root() / "out" / f"ab_{datetime.now():%Y%m%d_%H%M%S}").resolve()
    logs.mkdir(parents=True, exist_ok=True)
    domain = simulator_domain(profile)  # `iws up` has set ROS_DOMAIN_ID (the profile's simulator domain)
    print(f"iws up ab: robot {profile.name}, ROS domain {domain}, logs in {logs}\n{describe(nodes, profile)}", flush=True)

    def stop_on_signal(signum, frame):
        raise KeyboardInterrupt
    # SIGINT explicitly too: a process started in the background by a non-interactive shell inherits
    # SIGINT as ignored, and Python then never raises KeyboardInterrupt.
    previous = {sig: signal.signal(sig, stop_on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    processes: dict[str, NodeProcess] = {}
    code = 0
    try:
        for node in nodes:
            processes[node.label] = NodeProcess(node_command(node), domain, logs / f"{node.label}.log",
                                                ROS_AUTOMATIC_DISCOVERY_RANGE=DISCOVERY_RANGE)
        if not wait_until_ready(nodes, processes, profile):
            return 1
        print("iws up ab: running; Ctrl-C stops every node", flush=True)
        while True:
            for label, process in processes.items():
                if not process.alive():
                    print(f"iws up ab: {label} stopped (exit {process.proc.returncode}); see {process.log_path}",
                          file=sys.stderr)
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\niws up ab: stopping", flush=True)
    finally:
        # The fan-out is signalled first (no commands into stopping nodes); all stop in parallel.
        for returned in stop_all([processes[label] for label in reversed(list(processes))]):
            if returned not in (0, -signal.SIGINT):
                code = 1
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code
