"""`iws collect`: play data for the reference robot as rosbag2 episodes, in-process for speed.

The simulator runs in this process (no DDS), but every message is the one the ROS node would
publish, built the same way and serialized with rclpy, and the command goes through the same
JointCommandFollower, so these bags are interchangeable with bags recorded from the node in
lockstep. Per control step, like the node: the command (stamp t), then one physics step, then at
t + dt joint_states, image, camera_info and task_state, all stamped t + dt. Bag log time = stamp.

One bag per episode, ``OUT/episode_000123/``, written under ``OUT/.partial/`` and moved into place
when closed: a rerun skips complete episodes and redoes a partial one. Episode k uses seed
``seed + k`` for both the initial state and the policy, so any episode can be regenerated alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from iws_common.commands import CLOCK_START_NS  # noqa: E402
from iws_common.profile import ProfileError, RobotProfile, load_profile  # noqa: E402
from iws_data.bags import DEFAULT_STORAGE, STORAGES, BagError, BagWriter  # noqa: E402

# ROS message types only (no node, no DDS): bags hold exactly what the ROS node publishes.
from iws_common.messages import time_msg  # noqa: E402
from iws_interfaces.msg import EpisodeEvent  # noqa: E402
from std_msgs.msg import Float64MultiArray  # noqa: E402

PARTIAL_DIR = ".partial"
DEFAULT_MIX = "expert=0.4,random=0.3,contact=0.3"
RECORDED_KINDS = ["image", "camera_info", "joint_states", "position_command", "task_state", "episode_events"]


def episode_name(index: int) -> str:
    return f"episode_{index:06d}"


def is_complete(bag: Path) -> bool:
    return (bag / "metadata.yaml").is_file()


def drop_empty_partial_dir(out: Path) -> None:
    """Episodes are written under OUT/.partial and moved out when closed; once none is left
    half-written, the folder goes too (one left behind holds what an interrupted run was writing)."""
    partial_root = out / PARTIAL_DIR
    if partial_root.is_dir() and not any(partial_root.iterdir()):
        partial_root.rmdir()


def parse_mix(text: str) -> dict[str, float]:
    """'expert=0.4,random=0.3,contact=0.3' -> normalised weights."""
    mix = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        name = name.strip()
        if name not in POLICIES:
            raise ValueError(f"unknown policy '{name}' in --mix (choose from {sorted(POLICIES)})")
        try:
            mix[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"--mix weight for '{name}' must be a number, got '{weight}'") from None
        if mix[name] < 0:
            raise ValueError(f"--mix weight for '{name}' must be >= 0")
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("--mix weights must not all be zero")
    return {k: v / total for k, v in mix.items()}


# --mix names -> iws_reference_robot.experts names ("expert" is the task's own scripted expert;
# "policy" is the trained policy given by --policy; "memoryless" push_t's expert without hysteresis;
# "wandering" push_t's expert pushing the T to random poses instead of the goal).
POLICIES = {"expert": None, "random": "smooth_random", "contact": "contact_seeking", "policy": None,
            "memoryless": "push_t_memoryless", "wandering": "push_t_wandering"}
TASK_ONLY = {"memoryless": "push_t", "wandering": "push_t"}  # --mix names that exist for one task


class CheckpointPlayer:
    """A trained Diffusion Policy (an `iws policy train` checkpoint), or the pixel expert ('expert',
    'expert:noise=STD,speed=FRACTION'), as a source of play data.

    It acts on the camera image that the bag records, as it would through ROS. Rollouts of the
    policies you mean to evaluate are the contacts a world model must get right before it can judge
    them: scripted play alone never pushes the object the way a learned policy does."""

    def __init__(self, checkpoint: str | Path, profile: RobotProfile, sim, action_horizon: int | None = None):
        from iws_policy.node import make_runner

        self.sim = sim
        self.runner = make_runner(str(checkpoint), profile, action_horizon=action_horizon)

    def reset(self, rng: np.random.Generator) -> None:
        self.runner.reset(seed=int(rng.integers(2**31)))  # from the episode's seed: it regenerates alone
        self.last_command = None

    def act(self, task_state, joint_positions: np.ndarray) -> np.ndarray:
        """The policy's command; where it gives none (the pixel expert while the T is out of view)
        the previous command stays in force, as the ROS node publishes nothing then."""
        command = self.runner.act(self.sim.render(), joint_positions)
        if command is not None:
            self.last_command = np.asarray(command, np.float64)
        elif self.last_command is None:
            self.last_command = np.asarray(joint_positions, np.float64)
        return self.last_command


def make_policy(kind: str, task: str, sim):
    """A fresh policy (no state carried between episodes, so any episode regenerates alone)."""
    from iws_reference_robot.experts import make_expert

    if TASK_ONLY.get(kind, task) != task:
        raise ValueError(f"--mix {kind} is {TASK_ONLY[kind]}'s expert only, not {task}'s")
    return make_expert(task if kind == "expert" else POLICIES[kind], sim)


@dataclasses.dataclass
class EpisodeResult:
    index: int
    policy: str
    seed: int
    steps: int
    success: bool
    score: float
    path: Path


class Collector:
    """Runs episodes of one task in one ReferenceSim and writes each to its own bag."""

    def __init__(self, profile: RobotProfile, task: str, out: Path, steps: int, seed: int = 0,
                 mix: dict[str, float] | None = None, storage: str = DEFAULT_STORAGE,
                 policy: str | Path | None = None, action_horizon: int | None = None):
        from iws_common.commands import JointCommandFollower
        from iws_reference_robot.sim import ReferenceSim

        self.profile = profile
        self.task = task
        self.out = Path(out)
        self.steps = steps
        self.seed = seed
        self.mix = mix or parse_mix(DEFAULT_MIX)
        self.storage = storage
        self.sim = ReferenceSim(profile, task=task, seed=seed)
        self.follower = JointCommandFollower(profile.joints)
        from iws_reference_robot.observation import ObservationMessages

        self.observation = ObservationMessages(profile)
        self.command_msg = Float64MultiArray()
        self.dt_ns = round(profile.control_period_s * 1e9)
        self.policy_checkpoint = str(policy) if policy is not None else None
        self.player = None
        if self.mix.get("policy", 0) > 0:
            if policy is None:
                raise ValueError("--mix names 'policy': pass the checkpoint with --policy CKPT")
            self.player = CheckpointPlayer(policy, profile, self.sim, action_horizon)

    def policy_for(self, index: int) -> tuple[str, object, np.random.Generator]:
        rng = np.random.default_rng(self.seed + index)
        kinds = sorted(self.mix)
        kind = kinds[int(rng.choice(len(kinds), p=[self.mix[k] for k in kinds]))]
        return kind, self.player if kind == "policy" else make_policy(kind, self.task, self.sim), rng

    def _write_observation(self, bag: BagWriter, stamp_ns: int):
        from rclpy.serialization import serialize_message

        messages, state = self.observation.fill(self.sim, time_msg(stamp_ns))
        for topic, msg in messages:
            bag.write(topic, serialize_message(msg), stamp_ns)
        return state

    def _write_event(self, bag: BagWriter, event: int, index: int, stamp_ns: int, success=False, score=float("nan")) -> None:
        from rclpy.serialization import serialize_message

        msg = EpisodeEvent(event=event, episode_index=index, task=self.task,
                                         success=bool(success), score=float(score))
        msg.header.stamp = time_msg(stamp_ns)
        msg.header.frame_id = self.profile.base_frame
        bag.write(self.profile.topics.episode_events, serialize_message(msg), stamp_ns)

    def run_episode(self, index: int) -> EpisodeResult:
        """Write episode ``index`` to OUT/episode_NNNNNN (atomically)."""
        from rclpy.serialization import serialize_message

        from iws_common.commands import CommandRejected

        final = self.out / episode_name(index)
        partial = self.out / PARTIAL_DIR / episode_name(index)
        if partial.exists():
            shutil.rmtree(partial)
        partial.parent.mkdir(parents=True, exist_ok=True)
        kind, policy, rng = self.policy_for(index)
        seed = self.seed + index
        self.sim.reset(seed)
        self.follower.reset(self.sim.joint_positions())
        policy.reset(rng)
        dt = self.dt_ns * 1e-9
        topics = self.profile.topics
        custom = {"task": self.task, "policy": kind, "seed": seed, "episode_index": index, "steps": self.steps,
                  "collected_by": "iws collect"}
        if kind == "policy":
            custom["policy_checkpoint"] = self.policy_checkpoint
        bag = BagWriter(partial, self.profile, RECORDED_KINDS, storage=self.storage, flush_interval_s=None, custom_data=custom)
        try:
            clock_ns = CLOCK_START_NS
            self._write_event(bag, EpisodeEvent.START, index, clock_ns)
            state = self._write_observation(bag, clock_ns)
            command_msg = self.command_msg
            for _ in range(self.steps):
                command = np.asarray(policy.act(state, self.sim.joint_positions()), dtype=np.float64).reshape(-1)
                command_msg.data = command.tolist()
                bag.write(topics.position_command, serialize_message(command_msg), clock_ns)
                try:
                    self.follower.set_position_command(command_msg.data)
                except CommandRejected:
                    pass  # as the node: the previous target is kept
                self.sim.step(self.follower.step(clock_ns * 1e-9, dt))
                clock_ns += self.dt_ns
                state = self._write_observation(bag, clock_ns)
            self._write_event(bag, EpisodeEvent.END, index, clock_ns, state.success, state.score)
            bag.close()
        except BaseException:
            bag.abort()
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        return EpisodeResult(index, kind, seed, self.steps, bool(state.success), float(state.score), final)

    def close(self) -> None:
        self.sim.close()


def collect(profile: RobotProfile | str, task: str, out: str | Path, episodes: int, steps: int, seed: int = 0,
            mix: dict[str, float] | str | None = None, storage: str = DEFAULT_STORAGE, progress: bool = True,
            start: int = 0, policy: str | Path | None = None, action_horizon: int | None = None) -> list[EpisodeResult]:
    """Collect episodes ``start .. start+episodes-1`` into OUT, skipping complete ones."""
    from tqdm import tqdm

    if isinstance(profile, str):
        profile = load_profile(profile)
    if isinstance(mix, str):
        mix = parse_mix(mix)
    if episodes < 0 or steps < 1:
        raise ValueError("--episodes must be >= 0 and --steps >= 1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [i for i in range(start, start + episodes) if not is_complete(out / episode_name(i))]
    skipped = episodes - len(todo)
    results: list[EpisodeResult] = []
    if not todo:
        if progress:
            print(f"iws collect: all {episodes} episodes in {out} are complete")
        return results
    collector = Collector(profile, task, out, steps, seed=seed, mix=mix, storage=storage, policy=policy,
                          action_horizon=action_horizon)
    try:
        with tqdm(total=len(todo), unit="ep", desc=f"collect {task}", disable=not progress, dynamic_ncols=True) as bar:
            if skipped:
                bar.write(f"iws collect: {skipped} complete episodes already in {out}, skipping them")
            for index in todo:
                result = collector.run_episode(index)
                results.append(result)
                bar.update(1)
                bar.set_postfix(success=f"{np.mean([r.success for r in results]):.2f}",
                                frames_per_s=f"{bar.n * (steps + 1) / max(bar.format_dict['elapsed'], 1e-9):.0f}")
    finally:
        collector.close()
        drop_empty_partial_dir(out)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws collect", description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="push_t", help="push_t, rope or pile")
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--steps", type=int, default=200, help="control steps per episode (frames = steps + 1)")
    parser.add_argument("--out", required=True, help="directory of episode bags (created; reruns resume)")
    parser.add_argument("--robot", default="reference_arm", help="robot profile name or YAML path")
    parser.add_argument("--seed", type=int, default=0, help="episode k uses seed + k")
    parser.add_argument("--start", type=int, default=0, help="index of the first episode (to split work across processes)")
    parser.add_argument("--mix", default=None,
                        help=f"policy weights (default {DEFAULT_MIX}; policy=1 when --policy is given)")
    parser.add_argument("--policy", default=None, metavar="CKPT",
                        help="a trained policy (iws policy train), or 'expert[:noise=STD][,speed=FRACTION]' (the "
                             "pixel expert, as in iws evaluate, optionally noised or slowed), acting on the camera "
                             "image: rollouts of the policies you will evaluate, as world-model training data "
                             "(--mix expert=1 is the task's scripted expert, which reads the simulator's state)")
    parser.add_argument("--action-horizon", type=int, default=None,
                        help="with --policy: commands executed per predicted chunk (default: the checkpoint's)")
    parser.add_argument("--storage", default=DEFAULT_STORAGE, choices=sorted(STORAGES))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        started = time.perf_counter()
        mix = args.mix or ("policy=1" if args.policy else DEFAULT_MIX)
        if args.policy and "policy" not in parse_mix(mix):
            raise ValueError(f"--policy is given but --mix '{mix}' never runs it (add policy=W)")
        results = collect(args.robot, args.task, args.out, args.episodes, args.steps, seed=args.seed, mix=mix,
                          storage=args.storage, progress=not args.no_progress, start=args.start, policy=args.policy,
                          action_horizon=args.action_horizon)
    except (BagError, ProfileError, ValueError) as exc:
        print(f"iws collect: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("iws collect: interrupted; complete episodes are kept, rerun to resume", file=sys.stderr)
        return 130
    if results:
        elapsed = time.perf_counter() - started
        frames = sum(r.steps + 1 for r in results)
        by_policy = {k: sum(r.policy == k for r in results) for k in sorted({r.policy for r in results})}
        print(f"iws collect: wrote {len(results)} episodes ({frames} frames) to {args.out} in {elapsed:.1f} s "
              f"({frames / elapsed:.0f} frames/s); policies {by_policy}; "
              f"success rate {np.mean([r.success for r in results]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
