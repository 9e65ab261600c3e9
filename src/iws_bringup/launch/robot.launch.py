"""Start a backend on a robot profile's topics (for machines with a ROS 2 distro and `ros2 launch`).

    ros2 launch iws_bringup robot.launch.py backend:=reference robot:=reference_arm task:=push_t
    ros2 launch iws_bringup robot.launch.py backend:=world_model model:=/path/to/checkpoint
    ros2 launch iws_bringup robot.launch.py backend:=real        # starts nothing: the driver serves

Reads config/bringup.yaml through iws_bringup.backends, exactly like `iws up`.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from iws_bringup.backends import get_backend, node_parameters
from iws_common.isolation import simulator_environment
from iws_common.profile import load_profile

ARGUMENTS = {
    "backend": ("reference", "reference | world_model | real (see config/bringup.yaml)"),
    "robot": ("reference_arm", "robot profile name or YAML path"),
    "task": ("", "reference robot task: push_t, rope or pile (empty: bringup default)"),
    "mode": ("", "realtime | lockstep (empty: bringup default)"),
    "seed": ("", "initial-state seed (empty: bringup default)"),
    "model": ("", "world model checkpoint directory (empty: the shipped models/push_t)"),
    "frozen_noise": ("", "world model: none | decoder | all, what a reset draws once (empty: the model's own)"),
    "namespace": ("", "prefix for every profile topic and service, e.g. /sim (empty: none)"),
    "allow_hardware_domain": ("", "true: start even on the profile's hardware domain (docs/safety.md)"),
    "allow_foreign_nodes": ("", "true: start even beside another node on this robot's topics"),
}


def _start(context):
    value = {name: LaunchConfiguration(name).perform(context) for name in ARGUMENTS}
    backend = get_backend(value["backend"])
    if not backend.starts_a_node:
        return [LogInfo(msg=f"backend {backend.name}: {backend.description}; nothing started")]
    overrides = {key: value[key] or None for key in ("task", "mode", "model", "frozen_noise", "namespace")}
    for key in ("allow_hardware_domain", "allow_foreign_nodes"):
        overrides[key] = value[key].lower() == "true" if value[key] else None
    overrides["seed"] = int(value["seed"]) if value["seed"] else None
    params = node_parameters(backend, value["robot"], overrides)
    # The simulator's domain (ROS_DOMAIN_ID, else the profile's simulator domain), localhost only.
    env = simulator_environment(load_profile(value["robot"]))
    return [Node(package=backend.package, executable=backend.executable, parameters=[params],
                 additional_env=env, output="screen")]


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text)
         for name, (default, text) in ARGUMENTS.items()]
        + [OpaqueFunction(function=_start)])
