"""A/B: the reference robot and the world model side by side, driven by the same commands.

    ros2 launch iws_bringup ab.launch.py
    ros2 launch iws_bringup ab.launch.py model:=/path/to/checkpoint mode:=lockstep task:=push_t

Each side serves the robot profile under its namespace (/real/joint_states, /sim/joint_states, ...);
the command fan-out republishes the top-level command topics into both, so one policy or teleop
drives both. Reads the `ab` entry of config/bringup.yaml through iws_bringup.backends, exactly
like `iws up ab`.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from iws_bringup.backends import ab_nodes, load_ab
from iws_common.isolation import simulator_environment
from iws_common.profile import load_profile

ARGUMENTS = {
    "robot": ("reference_arm", "robot profile name or YAML path"),
    "task": ("", "reference robot task: push_t, rope or pile (empty: bringup default)"),
    "mode": ("", "realtime | lockstep for both sides (empty: bringup default)"),
    "seed": ("", "initial-state seed (empty: bringup default)"),
    "model": ("", "world model checkpoint directory (empty: the shipped models/push_t)"),
}


def _start(context):
    value = {name: LaunchConfiguration(name).perform(context) for name in ARGUMENTS}
    overrides = {key: value[key] or None for key in ("task", "mode", "model")}
    overrides["seed"] = int(value["seed"]) if value["seed"] else None
    # Every node on the simulator's domain, localhost only (docs/safety.md), like `iws up ab`.
    env = simulator_environment(load_profile(value["robot"]))
    return [Node(package=node.backend.package, executable=node.backend.executable, namespace=node.namespace or None,
                 parameters=[node.parameters], additional_env=env, output="screen")
            for node in ab_nodes(value["robot"], overrides, load_ab())]


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text)
         for name, (default, text) in ARGUMENTS.items()]
        + [OpaqueFunction(function=_start)])
