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
import dataclasses
import sys

import numpy as np


@dataclasses.dataclass(frozen=True)
class ExpertSpec:
    """The pixel expert as a policy, optionally made worse: ``noise`` (rad) of Gaussian noise on
    every joint of every command, ``speed`` the fraction of its largest pusher step per command. Two
    families of worse experts whose success spans a range, for judging a simulator as an evaluator
    of policies: noise differs from the expert by random millimetres, speed by visible slowness."""
    noise: float = 0.0
    speed: float = 1.0


EXPERT_SPEC_HELP = "'expert[:noise=STD][,speed=FRACTION]'"


def parse_expert_spec(checkpoint: str) -> ExpertSpec | None:
    """'expert' -> ExpertSpec(), 'expert:noise=0.02,speed=0.5' -> its options; None for a checkpoint
    directory. A malformed spec is a ValueError naming the accepted form."""
    name, _, options = checkpoint.partition(":")
    if name != "expert":
        return None
    values: dict[str, float] = {}
    for option in options.split(",") if options else ():
        key, _, text = option.partition("=")
        try:
            value = float(text) if key in ("noise", "speed") and key not in values else float("nan")
        except ValueError:
            value = float("nan")
        if not (np.isfinite(value) and (value >= 0 if key == "noise" else 0 < value <= 1)):
            raise ValueError(f"policy '{checkpoint}': an expert spec is {EXPERT_SPEC_HELP}, STD >= 0 (rad), "
                             "0 < FRACTION <= 1, each option at most once")
        values[key] = value
    return ExpertSpec(**values)


def make_runner(checkpoint: str, profile, seed: int = 0, action_horizon: int | None = None,
                mask_joints: tuple[str, ...] = ()):
    """``act(image, joints) -> command or None`` for a checkpoint directory, or an expert spec (the
    pixel expert, ``ExpertSpec``) (``action_horizon``: commands executed per predicted chunk, None
    for the checkpoint's; ``mask_joints``: joints a learnt policy reads at the middle of its range)."""
    spec = parse_expert_spec(checkpoint)
    if spec is not None:
        from iws_reference_robot.pixel_expert import PushTExpertPolicy
        if mask_joints:
            raise ValueError("--mask-joint applies to a learnt policy, not the pixel expert")
        return PushTExpertPolicy(profile, seed=seed, command_noise=spec.noise, speed=spec.speed)
    from iws_policy.diffusion import PolicyRunner, load_policy
    policy = load_policy(checkpoint)
    if policy.config.joints != profile.joints.count:
        raise ValueError(f"policy {checkpoint} commands {policy.config.joints} joints, profile {profile.name} "
                         f"has {profile.joints.count}")
    if policy.config.joint_names and list(policy.config.joint_names) != list(profile.joints.names):
        raise ValueError(f"policy {checkpoint} was trained on joints {policy.config.joint_names}, "
                         f"profile {profile.name} names {list(profile.joints.names)}")
    return PolicyRunner(policy, seed=seed, action_horizon=action_horizon, mask_joints=tuple(mask_joints))


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
                        help="policy checkpoint directory, or " + EXPERT_SPEC_HELP + " (the pixel expert, optionally noised or slowed)")
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
