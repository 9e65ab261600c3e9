"""`iws demo` (what `make demo` runs): drive a simulated arm through ROS, record a bag and a video.

Brings up the backend (the shipped world model when present, else the reference robot) in real
time on a private ROS domain, starts the recorder, drives the arm with the scripted push_t expert,
which sees only the camera image and joint states, for about 30 seconds, then writes an MP4 of
the recorded camera topic and prints the achieved rate, step latency and where the files are.
"""
from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

from iws_common.profile import default_model_dir, load_profile, repo_root


def default_backend() -> str:
    shipped = default_model_dir() / "model.safetensors"
    return "world_model" if shipped.is_file() else "reference"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iws demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("world_model", "reference"), default=None,
                        help="default: world_model if models/push_t is shipped, else reference")
    parser.add_argument("--model", help="world model checkpoint (default: the shipped models/push_t)")
    parser.add_argument("--robot", default="reference_arm")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="default: out/demo_<date-time>")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    backend = args.backend or default_backend()
    profile = load_profile(args.robot)
    out = (args.out or repo_root() / "out" / f"demo_{datetime.now():%Y%m%d_%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"iws demo: backend={backend} robot={profile.name} duration={args.seconds:.0f} s output={out}", flush=True)
    if backend == "reference" and args.backend is None:
        print("iws demo: no shipped world model (models/push_t); running the reference robot instead", flush=True)

    from iws_bringup.backends import get_backend, node_parameters, ros_arguments
    from iws_common import qos
    from iws_common.client import RosClient
    from iws_common.processes import NodeProcess, private_domain_id
    from iws_interfaces.msg import EpisodeEvent, WorldStatus
    from iws_reference_robot.expert_policy import ExpertPolicyNode

    domain = private_domain_id()
    spec = get_backend(backend)
    params = node_parameters(spec, profile.name, {"mode": "realtime", "seed": args.seed, "model": args.model,
                                                  "task": "push_t"})
    node = NodeProcess([sys.executable, "-m", spec.entry_point.split(":")[0]] + ros_arguments(params), domain,
                       out / f"{backend}.log")
    client = RosClient(domain, name="iws_demo")
    recorder = None
    policy = None
    try:
        status = client.collect(WorldStatus, profile.topics.world_status)
        client.wait_for(status, 1, timeout=120)  # the backend is up (loading a model takes a while)
        recorder = NodeProcess([sys.executable, "-m", "iws_bringup.cli", "record", "--robot", profile.name,
                                "--out", str(out / "bag")], domain, out / "recorder.log")
        time.sleep(3.0)  # recorder discovery: it matches QoS to the publishers it finds
        events = client.publisher(EpisodeEvent, profile.topics.episode_events, qos.EVENTS)
        policy = ExpertPolicyNode(profile, seed=args.seed, context=client.context)
        client.executor.add_node(policy)
        events.publish(EpisodeEvent(event=EpisodeEvent.START, episode_index=0, task="push_t"))
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            if not node.alive():
                raise RuntimeError(f"the {backend} node stopped; see {node.log_path}")
            time.sleep(0.5)
        estimate = policy.policy.last_estimate
        score = policy.policy.estimator.score(estimate.pose) if estimate is not None and estimate.found else 0.0
        events.publish(EpisodeEvent(event=EpisodeEvent.END, episode_index=0, task="push_t",
                                    success=bool(score >= 0.95), score=float(score)))
        time.sleep(1.0)
        final = status[-1]
        commands = policy.commands_sent
    finally:
        if policy is not None:
            client.executor.remove_node(policy)
            policy.destroy_node()
        client.close()
        if recorder is not None:
            recorder.stop()
        node.stop()

    video = out / "camera.mp4"
    frames = write_camera_video(out / "bag", profile, video)
    print(f"\nachieved rate {final.achieved_rate_hz:.1f} Hz (target {final.target_rate_hz:.1f} Hz), "
          f"step latency p50 {final.step_latency_ms_p50:.1f} ms / p95 {final.step_latency_ms_p95:.1f} ms, "
          f"{final.step_count} steps, {commands} expert commands, push_t score from pixels {score:.2f}")
    print(f"bag:   {out / 'bag'}\nvideo: {video} ({frames} frames)\nlogs:  {out}")
    return 0


def write_camera_video(bag: Path, profile, video: Path) -> int:
    """The recorded camera topic as an MP4, read back from the bag (which proves the bag is readable)."""
    from iws_common.image_conversion import image_to_numpy
    from iws_data.bags import BagReader
    from iws_data.video import write_mp4

    with BagReader(bag) as reader:
        def frames():
            for _, _, data in reader.messages([profile.topics.image]):
                yield image_to_numpy(reader.decode(data, "sensor_msgs/msg/Image"), want="rgb8")
        return write_mp4(frames(), video, fps=profile.camera.rate_hz, upscale=max(1, 384 // profile.camera.width))


if __name__ == "__main__":
    sys.exit(main())
