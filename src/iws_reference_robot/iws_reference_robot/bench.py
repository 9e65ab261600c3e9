"""`iws bench reference`: lockstep steps per second of the reference robot over ROS.

Starts the reference robot node in its own process in lockstep mode on a private domain, calls
StepWorld for N steps from this process while receiving every image, and reports steps/s
including physics, render, serialisation and publish. In the same run it measures the bare
simulator (step + render, no ROS) as the baseline, so the ROS overhead is a ratio on one machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def bench_sim_only(task: str, steps: int, robot: str) -> float:
    os.environ.setdefault("MUJOCO_GL", "egl")
    import numpy as np

    from iws_common.profile import load_profile
    from iws_reference_robot.sim import ReferenceSim

    profile = load_profile(robot)
    sim = ReferenceSim(profile, task=task, seed=0)
    sim.reset(0)
    home = np.asarray(profile.joints.home)
    for i in range(10):
        sim.step(home)
        sim.render()
    start = time.perf_counter()
    for i in range(steps):
        sim.step(home + 0.3 * np.sin(i / 10.0))
        sim.render()
    elapsed = time.perf_counter() - start
    sim.close()
    return steps / elapsed


def bench_lockstep_ros(task: str, steps: int, robot: str) -> dict:
    from sensor_msgs.msg import Image

    from iws_bringup.backends import ros_arguments
    from iws_common import qos
    from iws_common.client import RosClient
    from iws_common.processes import NodeProcess, private_domain_id
    from iws_common.profile import load_profile
    from iws_interfaces.srv import StepWorld

    profile = load_profile(robot)
    domain = private_domain_id()
    log = Path(tempfile.mkdtemp(prefix="iws_bench_")) / "reference_robot.log"
    node = NodeProcess([sys.executable, "-m", "iws_reference_robot.node"]
                       + ros_arguments({"robot": robot, "task": task, "mode": "lockstep"}), domain, log)
    client = RosClient(domain, name="iws_bench_reference")
    try:
        images = client.collect(Image, profile.topics.image, qos.IMAGE_LOSSLESS)
        client.call(StepWorld, profile.services.step, StepWorld.Request(num_steps=20), timeout=60)  # warm-up
        client.wait_for(images, 10)
        time.sleep(0.5)
        before = len(images)
        start = time.perf_counter()
        response = client.call(StepWorld, profile.services.step, StepWorld.Request(num_steps=steps), timeout=600)
        elapsed = time.perf_counter() - start
        if not response.success:
            raise RuntimeError(f"StepWorld failed: {response.message}")
        client.wait_for(images, before + steps, timeout=10)
        received = len(images) - before
    finally:
        client.close()
        node.stop()
    return {"steps_per_s": steps / elapsed, "images_received": received,
            "image_size": f"{profile.camera.width}x{profile.camera.height}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws bench reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="push_t")
    parser.add_argument("--robot", default="reference_arm")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args(argv)
    result = {"task": args.task, "steps": args.steps}
    result["sim_only_steps_per_s"] = bench_sim_only(args.task, args.steps, args.robot)
    result.update(bench_lockstep_ros(args.task, args.steps, args.robot))
    result["ros_fraction_of_sim_only"] = result["steps_per_s"] / result["sim_only_steps_per_s"]
    result = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
    if not args.json:
        print(f"reference robot, {args.task}, lockstep over ROS: {result['steps_per_s']:.1f} steps/s "
              f"(bare simulator {result['sim_only_steps_per_s']:.1f} steps/s)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
