"""Keeping a simulator away from real hardware (docs/safety.md, "Isolation").

The rules, applied to every simulator backend (the reference robot and the world model):

1. **Its own domain.** A simulator runs on the robot profile's ``simulator_ros_domain_id`` unless
   ``ROS_DOMAIN_ID`` says otherwise, and refuses to start on the profile's
   ``hardware_ros_domain_id`` unless ``allow_hardware_domain`` is set.
2. **Localhost only.** A simulator's DDS participant discovers on localhost only
   (``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``): nothing on another machine can discover it, so
   nothing there can receive its traffic or send it commands.
3. **Nobody else on its topics.** Before it creates a single publisher or subscription, the
   simulator watches the ROS graph for a moment. A node other than itself that publishes the
   profile's joint states or subscribes its command topics (a real driver, a bag player, another
   simulator) makes it refuse to start, naming that node, unless ``allow_foreign_nodes`` is set.
   The check sees exactly the participants the simulator could exchange messages with.

iws's own client tools (teleop, compare, recorder, ``iws up``) join the simulator's domain when
``ROS_DOMAIN_ID`` is unset (``use_simulator_domain_by_default``), so that a tool run from a fresh
shell talks to the simulator and never to the hardware; set ``ROS_DOMAIN_ID`` to use them with
hardware. This module imports no ROS, except where it is handed a node.
"""
from __future__ import annotations

import os
import sys
import time

from iws_common.profile import RobotProfile

DISCOVERY_RANGE = "LOCALHOST"


class IsolationError(RuntimeError):
    """A simulator would share a domain or topics with something that may be real hardware."""


def env_domain_id(env: dict | None = None) -> int | None:
    """ROS_DOMAIN_ID from the environment, or None when unset or empty."""
    value = (os.environ if env is None else env).get("ROS_DOMAIN_ID", "").strip()
    if not value:
        return None
    try:
        domain = int(value)
    except ValueError:
        raise IsolationError(f"ROS_DOMAIN_ID='{value}' is not an integer") from None
    if not 0 <= domain <= 232:
        raise IsolationError(f"ROS_DOMAIN_ID={domain} is outside 0..232")
    return domain


def simulator_domain(profile: RobotProfile, env: dict | None = None) -> int:
    """The domain a simulator of ``profile`` runs on: ROS_DOMAIN_ID if set, else the profile's."""
    domain = env_domain_id(env)
    return profile.simulator_ros_domain_id if domain is None else domain


def simulator_environment(profile: RobotProfile, env: dict | None = None) -> dict[str, str]:
    """The environment variables a simulator process (and a client of it) needs."""
    return {"ROS_DOMAIN_ID": str(simulator_domain(profile, env)), "ROS_AUTOMATIC_DISCOVERY_RANGE": DISCOVERY_RANGE}


def client_hint(profile: RobotProfile, env: dict | None = None) -> str:
    """One line telling the user how to point their own nodes at the simulator."""
    exports = " ".join(f"{k}={v}" for k, v in simulator_environment(profile, env).items())
    return f"clients of this simulator need: export {exports}   (or: eval $(iws env --robot {profile.name}))"


def use_simulator_domain_by_default(profile: RobotProfile, tool: str) -> None:
    """For iws's client tools: with ROS_DOMAIN_ID unset, join the simulator's domain on localhost
    (never the hardware's by accident), and say so on stderr."""
    if env_domain_id() is not None:
        return
    os.environ.update(simulator_environment(profile))
    print(f"{tool}: ROS_DOMAIN_ID is unset: using the simulator's domain {profile.simulator_ros_domain_id} "
          f"(localhost); set ROS_DOMAIN_ID={profile.hardware_ros_domain_id} to talk to the hardware",
          file=sys.stderr)


def check_domain(profile: RobotProfile, domain_id: int, allow_hardware_domain: bool = False) -> None:
    """Refuse the hardware's domain unless explicitly allowed."""
    if domain_id == profile.hardware_ros_domain_id and not allow_hardware_domain:
        raise IsolationError(
            f"refusing to start on ROS domain {domain_id}, the hardware's domain in profile {profile.name} "
            f"(hardware_ros_domain_id); use its simulator domain {profile.simulator_ros_domain_id} "
            f"(unset ROS_DOMAIN_ID) or pass allow_hardware_domain:=true (iws up --allow-hardware-domain) "
            "if you are sure no real robot listens there")


UNIDENTIFIED = "a participant not yet identified (its node name arrives later)"


def foreign_endpoints(node, profile: RobotProfile) -> list[str]:
    """Nodes other than ``node`` that publish the profile's joint states or subscribe its command
    topics, as readable lines ("/ur/controller_manager subscribes /forward_position_controller/commands")."""
    own = (node.get_name(), node.get_namespace())
    found = []

    def name(info) -> str:
        if not info.node_name or info.node_name == "_NODE_NAME_UNKNOWN_":
            return UNIDENTIFIED
        return f"{info.node_namespace.rstrip('/')}/{info.node_name}"

    topics = profile.topics
    for info in node.get_publishers_info_by_topic(topics.joint_states):
        if (info.node_name, info.node_namespace) != own:
            found.append(f"{name(info)} publishes {topics.joint_states}")
    for topic in (topics.position_command, topics.trajectory_command):
        for info in node.get_subscriptions_info_by_topic(topic):
            if (info.node_name, info.node_namespace) != own:
                found.append(f"{name(info)} subscribes {topic}")
    return sorted(set(found))


def check_graph(node, profile: RobotProfile, wait_s: float, allow_foreign_nodes: bool = False,
                poll_s: float = 0.1, name_wait_s: float = 3.0) -> list[str]:
    """Watch the graph for ``wait_s`` (discovery takes a moment) and refuse if a foreign endpoint
    shows up on the profile's topics; with ``allow_foreign_nodes`` return them instead. A
    participant whose node name has not arrived yet gets up to ``name_wait_s`` more, so that the
    refusal can say which node it is."""
    wait_s = max(0.0, wait_s)
    start = time.monotonic()
    deadline = start + wait_s
    found: set[str] = set()
    while True:
        now_found = foreign_endpoints(node, profile)
        if now_found and not found:
            deadline = min(deadline, time.monotonic() + 0.5)  # a moment more, to name all its endpoints
        found.update(now_found)
        now = time.monotonic()
        unnamed = any(line.startswith(UNIDENTIFIED) for line in now_found)
        if now >= deadline and not (unnamed and now < start + wait_s + name_wait_s):
            break
        time.sleep(poll_s)
    if not unnamed:  # every participant still there has its name now: the placeholders are stale
        found = {line for line in found if not line.startswith(UNIDENTIFIED)}
    if found and not allow_foreign_nodes:
        raise IsolationError(
            "refusing to start: another node already serves this robot's interface on ROS domain "
            f"{node.context.get_domain_id()}: {'; '.join(sorted(found))}. It may be a real driver. Stop it, use "
            "another namespace or domain, or pass allow_foreign_nodes:=true (iws up --allow-foreign-nodes)")
    return sorted(found)
