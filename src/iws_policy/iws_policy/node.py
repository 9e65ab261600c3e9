"""A policy as a ROS 2 node: camera image and joint states in, joint position commands out.

    iws up policy --checkpoint runs/policy_real          # a trained Diffusion Policy
    iws up policy --checkpoint expert                     # the scripted push_t expert on pixels

It subscribes to the robot profile's camera image (best effort, newest frame only) and joint states
and publishes on its position command topic, so it drives the reference robot, the world model or
a real arm without knowing which. After acting on an image it publishes that image's stamp on
``~/acted`` (std_msgs/Header), which lets a lockstep evaluator step the world exactly once per action.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def expert_command_noise(checkpoint: str) -> float | None:
    """The command noise of an expert spec ('expert' 0, 'expert:noise=0.2' 0.2 rad), None for a
    checkpoint directory."""
    name, _, option = checkpoint.partition(":")
    if name != "expert":
        return None
    if not option:
        return 0.0
    key, _, value = option.partition("=")
    try:
        noise = float(value) if key == "noise" else float("nan")
    except ValueError:
        noise = float("nan")
    if not (np.isfinite(noise) and noise >= 0):
        raise ValueError(f"policy '{checkpoint}': an expert spec is 'expert' or 'expert:noise=STD' with STD >= 0 (rad)")
    return noise


def make_runner(checkpoint: str, profile, seed: int = 0, action_horizon: int | None = None):
    """``act(image, joints) -> command or None`` for a checkpoint directory, or 'expert' (the pixel
    expert; 'expert:noise=STD' adds that much Gaussian noise to its commands) (``action_horizon``:
    commands executed per predicted chunk, None for the checkpoint's)."""
    noise = expert_command_noise(checkpoint)
    if noise is not None:
        from iws_reference_robot.pixel_expert import PushTExpertPolicy
        return PushTExpertPolicy(profile, seed=seed, command_noise=noise)
    from iws_policy.diffusion import PolicyRunner, load_policy
    policy = load_policy(checkpoint)
    if policy.config.joints != profile.joints.count:
        raise ValueError(f"policy {checkpoint} commands {policy.config.joints} joints, profile {profile.name} "
                         f"has {profile.joints.count}")
    if policy.config.joint_names and list(policy.config.joint_names) != list(profile.joints.names):
        raise ValueError(f"policy {checkpoint} was trained on joints {policy.config.joint_names}, "
                         f"profile {profile.name} names {list(profile.joints.names)}")
    return PolicyRunner(policy, seed=seed, action_horizon=action_horizon)


def make_policy_node(profile, checkpoint: str, seed: int = 0, context=None, action_horizon: int | None = None):
    from rclpy.node import Node
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64MultiArray, Header

    from iws_common import qos
    from iws_common.image_conversion import image_to_numpy

    class PolicyNode(Node):
        def __init__(self):
            super().__init__("policy", context=context)
            self.runner = make_runner(checkpoint, profile, seed, action_horizon)
            self.joint_positions = None
            self.commands_sent = 0
            topics = profile.topics
            self.pub_command = self.create_publisher(Float64MultiArray, topics.position_command, qos.COMMAND)
            self.pub_acted = self.create_publisher(Header, "~/acted", qos.STATE)
            self.create_subscription(JointState, topics.joint_states, self.on_joint_state, qos.STATE)
            self.create_subscription(Image, topics.image, self.on_image, qos.IMAGE_SUBSCRIBER)
            self.get_logger().info(f"policy up: {checkpoint} on {topics.image} -> {topics.position_command}")

        def on_joint_state(self, msg):
            by_name = dict(zip(msg.name, msg.position))
            if all(n in by_name for n in profile.joints.names):
                self.joint_positions = np.array([by_name[n] for n in profile.joints.names])

        def on_image(self, msg):
            if self.joint_positions is None:
                return
            command = self.runner.act(image_to_numpy(msg), self.joint_positions)
            if command is not None:
                self.pub_command.publish(Float64MultiArray(data=[float(v) for v in command]))
                self.commands_sent += 1
            self.pub_acted.publish(Header(stamp=msg.header.stamp, frame_id="acted" if command is not None else "held"))

    return PolicyNode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws up policy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True,
                        help="policy checkpoint directory, or 'expert' (the pixel expert; 'expert:noise=STD' a noisy one)")
    parser.add_argument("--robot", default="reference_arm")
    parser.add_argument("--namespace", default="", help="read and command a namespaced robot (A/B: /real or /sim)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--action-horizon", type=int, help="commands executed per predicted chunk (default: the checkpoint's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)

    from iws_common.isolation import use_simulator_domain_by_default
    from iws_common.profile import ProfileError, load_profile
    try:
        profile = load_profile(args.robot).namespaced(args.namespace)
    except ProfileError as exc:
        print(f"iws up policy: {exc}", file=sys.stderr)
        return 2
    use_simulator_domain_by_default(profile, "iws up policy")
    import rclpy
    import torch

    from iws_common.run import spin_until_shutdown

    torch.set_num_threads(args.threads)
    rclpy.init()
    try:
        node = make_policy_node(profile, args.checkpoint, args.seed, action_horizon=args.action_horizon)
    except Exception as exc:  # a missing or corrupt checkpoint: one line, exit 1
        print(f"iws up policy: cannot start: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 1
    try:
        spin_until_shutdown(lambda: rclpy.spin(node))
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
