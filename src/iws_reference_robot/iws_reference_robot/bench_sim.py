"""In-process speed check of the reference world (no ROS): step() + render() per second."""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from iws_common.profile import load_profile

from .experts import SmoothRandomMotion
from .sim import ReferenceSim


def bench_sim(task: str = "push_t", steps: int = 300, profile: str = "reference_arm") -> dict:
    """Steps/s of step()+render() under smooth random motion (so contacts happen), plus the split."""
    sim = ReferenceSim(load_profile(profile), task=task, seed=0)
    policy = SmoothRandomMotion(sim)
    policy.reset(np.random.default_rng(0))
    sim.render()  # the renderer's first frame includes context creation
    physics = render = 0.0
    try:
        for _ in range(steps):
            setpoint = policy.act(sim.task_state(), sim.joint_positions())
            t0 = time.perf_counter()
            sim.step(setpoint)
            t1 = time.perf_counter()
            sim.render()
            t2 = time.perf_counter()
            physics += t1 - t0
            render += t2 - t1
    finally:
        sim.close()
    total = physics + render
    cam = sim.profile.camera
    return {"task": task, "steps": steps, "image": f"{cam.width}x{cam.height}", "steps_per_s": steps / total,
            "physics_ms": 1000 * physics / steps, "render_ms": 1000 * render / steps, "substeps": sim.substeps}


if __name__ == "__main__":
    tasks = sys.argv[1:] or list(ReferenceSim.TASKS)
    for name in tasks:
        print(json.dumps(bench_sim(name)))
