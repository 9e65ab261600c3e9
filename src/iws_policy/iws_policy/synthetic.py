"""`iws collect --backend world_model`: demonstrations collected inside the world model, as rosbag2.

The paper's way to make training data without the robot: a demonstrator acts in the learned
simulator and its episodes are recorded. Here the demonstrator is the scripted push_t expert acting
on the world model's own images (the T's pose estimated from pixels, ``PushTExpertPolicy``) and its
predicted joint states; the world model runs in this process, in lockstep, through the same
``JointCommandFollower`` as its ROS node, and every message written is the one the node publishes
(joint states, camera image at the camera's resolution, camera_info, the command in force, episode
events). Episode k starts from the reference robot's initial state for seed ``seed + k`` (a window
of frames rendered by the MuJoCo scene, the arm holding still), so synthetic and real demos start
from the same distribution. Success in the END event comes from the pixel scorer. Bags are
written under ``OUT/.partial`` and moved into place when complete: reruns resume.

    iws collect --backend world_model --episodes 100 --out data/demos_wm [--model models/push_t]

``--backend reference`` (the default) is `iws collect` of iws_data (the reference robot, in-process).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")


def collect_world_model(profile, model: str | Path, out: str | Path, episodes: int, steps: int, seed: int = 0,
                        progress: bool = True, start: int = 0, threads: int | None = None) -> list[dict]:
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64MultiArray
    from tqdm import tqdm

    from iws_common.commands import CLOCK_START_NS, CommandRejected, JointCommandFollower
    from iws_common.image_conversion import numpy_to_image
    from iws_common.messages import camera_info_msg, time_msg
    from iws_data.bags import BagWriter
    from iws_data.collect import PARTIAL_DIR, drop_empty_partial_dir, episode_name, is_complete
    from iws_interfaces.msg import EpisodeEvent
    from iws_reference_robot.pixel_expert import PushTExpertPolicy
    from iws_reference_robot.scoring import PixelScorer
    from iws_reference_robot.sim import ReferenceSim, start_window
    from iws_world_model.world_model import WorldModel, upscale

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    world = WorldModel.load(model, threads=threads, max_command_step=profile.max_joint_step())
    if world.joint_dim != profile.joints.count:
        raise ValueError(f"model {model} predicts {world.joint_dim} joints, profile {profile.name} has {profile.joints.count}")
    camera, topics = profile.camera, profile.topics
    scene = ReferenceSim(profile, task="push_t", seed=seed)  # initial states only, never driven by the expert
    scorer = PixelScorer(profile)
    follower = JointCommandFollower(profile.joints)
    dt_ns = round(profile.control_period_s * 1e9)
    js, image_msg, command = JointState(name=list(profile.joints.names)), Image(), Float64MultiArray()
    info = camera_info_msg(camera, camera.frame_id)
    todo = [i for i in range(start, start + episodes) if not is_complete(out / episode_name(i))]
    results = []

    def write_observation(bag, image, joints, previous, stamp_ns):
        stamp = time_msg(stamp_ns)
        js.header.stamp = stamp
        js.position = joints.tolist()
        js.velocity = ((joints - previous) / (dt_ns * 1e-9)).tolist() if previous is not None else [0.0] * len(joints)
        numpy_to_image(image, "rgb8", msg=image_msg, stamp=stamp, frame_id=camera.frame_id)
        info.header.stamp = stamp
        for topic, msg in ((topics.joint_states, js), (topics.image, image_msg), (topics.camera_info, info)):
            bag.write(topic, serialize_message(msg), stamp_ns)

    def write_event(bag, event, index, stamp_ns, success=False, score=float("nan")):
        msg = EpisodeEvent(event=event, episode_index=index, task="push_t", success=bool(success), score=float(score))
        msg.header.stamp = time_msg(stamp_ns)
        msg.header.frame_id = profile.base_frame
        bag.write(topics.episode_events, serialize_message(msg), stamp_ns)

    try:
        for index in tqdm(todo, desc="collect world_model", disable=not progress, dynamic_ncols=True):
            episode_seed = seed + index
            window = start_window(scene, episode_seed, world.config.window)
            world.reset(window["images"], window["joint_positions"], window["actions"], seed=episode_seed)
            follower.reset(window["actions"][-1])
            expert = PushTExpertPolicy(profile, seed=episode_seed)
            partial, final = out / PARTIAL_DIR / episode_name(index), out / episode_name(index)
            shutil.rmtree(partial, ignore_errors=True)
            partial.parent.mkdir(parents=True, exist_ok=True)
            custom = {"task": "push_t", "policy": "expert_on_world_model", "seed": episode_seed, "episode_index": index,
                      "steps": steps, "model": str(model), "collected_by": "iws collect --backend world_model"}
            bag = BagWriter(partial, profile, ["image", "camera_info", "joint_states", "position_command", "episode_events"],
                            flush_interval_s=None, custom_data=custom)
            try:
                clock_ns = CLOCK_START_NS
                image, joints, previous = window["images"][-1], window["joint_positions"][-1].astype(np.float64), None
                write_event(bag, EpisodeEvent.START, index, clock_ns)
                write_observation(bag, image, joints, previous, clock_ns)
                for _ in range(steps):
                    action = expert.act(image, joints)
                    if action is not None:
                        try:
                            follower.set_position_command(action)
                        except CommandRejected:
                            pass
                    command.data = follower.target.tolist()
                    bag.write(topics.position_command, serialize_message(command), clock_ns)
                    follower.step(clock_ns * 1e-9, dt_ns * 1e-9)
                    predicted, predicted_joints = world.step(follower.target.copy())
                    clock_ns += dt_ns
                    previous, joints = joints, predicted_joints.astype(np.float64)
                    image = upscale(predicted, camera.height, camera.width)
                    write_observation(bag, image, joints, previous, clock_ns)
                final_score = scorer(image)
                write_event(bag, EpisodeEvent.END, index, clock_ns, final_score.success, final_score.score)
                bag.close()
            except BaseException:
                bag.abort()
                shutil.rmtree(partial, ignore_errors=True)
                raise
            finally:
                expert.close()
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            results.append({"index": index, "seed": episode_seed, "success": bool(final_score.success),
                            "score": float(final_score.score)})
    finally:
        scene.close()
        drop_empty_partial_dir(out)
    return results


def collect_main(argv: list[str] | None = None) -> int:
    """`iws collect`: --backend reference (iws_data.collect) or world_model (this module)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    backend = "reference"
    if "--backend" in argv:
        i = argv.index("--backend")
        backend = argv[i + 1] if i + 1 < len(argv) else ""
        del argv[i:i + 2]
    if backend == "reference":
        from iws_data.collect import main
        return main(argv)
    if backend != "world_model":
        print(f"iws collect: --backend must be reference or world_model, got '{backend}'", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="iws collect --backend world_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", help="world model checkpoint (default: the shipped models/push_t)")
    parser.add_argument("--robot", default="reference_arm")
    parser.add_argument("--seed", type=int, default=0, help="episode k starts from the reference robot's state for seed + k")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--task", default="push_t", help="only push_t (the pixel expert's task)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.task != "push_t":
        parser.error("the world-model demonstrator is the push_t pixel expert: --task push_t")
    if args.episodes < 0 or args.steps < 1:
        parser.error("--episodes must be >= 0 and --steps >= 1")
    from iws_common.profile import ProfileError, default_model_dir, load_profile
    from iws_world_model.checkpoint import CheckpointError
    model = args.model or str(default_model_dir())
    try:
        started = time.perf_counter()
        results = collect_world_model(load_profile(args.robot), model, args.out, args.episodes, args.steps, args.seed,
                                      not args.no_progress, args.start, args.threads)
    except (ProfileError, CheckpointError, ValueError) as exc:
        print(f"iws collect: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("iws collect: interrupted; complete episodes are kept, rerun to resume", file=sys.stderr)
        return 130
    if results:
        elapsed = time.perf_counter() - started
        print(f"iws collect: wrote {len(results)} world-model episodes to {args.out} in {elapsed:.1f} s; "
              f"pixel success rate {np.mean([r['success'] for r in results]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(collect_main())
