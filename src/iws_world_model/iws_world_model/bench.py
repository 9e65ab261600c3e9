"""`iws bench step`: latency and throughput of one interactive step (dynamics + decode + joint head).

    iws bench step --model runs/push_t --json                 # trained checkpoint
    iws bench step --model config/models/push_t.yaml --json   # untrained weights, for sizing a config
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import networks
from .checkpoint import CheckpointError
from .config import ConfigError, load_config
from .world_model import WorldModel


def measure(world: WorldModel, batch: int, steps: int, warmup: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    k, s, j = world.config.window, world.image_size, world.joint_dim
    shape = (batch, k) if batch > 1 else (k,)
    images = rng.integers(0, 256, (*shape, s, s, 3), dtype=np.uint8)
    joints = rng.uniform(-1, 1, (*shape, j)).astype(np.float32)
    world.reset(images, joints, joints, seed=seed)
    actions = rng.uniform(-1, 1, (steps + warmup, *shape[:-1], j)).astype(np.float32)
    times = []
    for i in range(steps + warmup):
        start = time.perf_counter()
        world.step(actions[i])
        if i >= warmup:
            times.append(time.perf_counter() - start)
    ms = np.array(times) * 1000
    p50 = float(np.median(ms))
    return {"fps": round(1000.0 / p50 * batch, 2), "ms_p50": round(p50, 3), "ms_p95": round(float(np.percentile(ms, 95)), 3),
            "batch": batch, "steps": steps, "threads": torch.get_num_threads(), "decode_steps": world.decode_steps,
            "dynamics_steps": world.dynamics_steps, "streaming": world.streaming,
            "channels_last": world.channels_last, "fused_attention": networks.FUSED_ATTENTION_AT_INFERENCE,
            "image_size": s, "window": k,
            "parameters": world.network.parameter_counts()["total"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="iws bench step", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="checkpoint directory, or a config YAML for untrained weights")
    p.add_argument("--batch", type=int, default=1, help="parallel worlds (throughput = fps)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the cores this process may use)")
    p.add_argument("--decode-steps", type=int, choices=(1, 2, 3), default=None)
    p.add_argument("--dynamics-steps", type=int, choices=(1, 2, 3), default=None,
                   help="consistency jumps per predicted latent (default: the model's)")
    p.add_argument("--contiguous", action="store_true",
                   help="keep the weights contiguous (the baseline of the CPU's channels-last default)")
    p.add_argument("--fused-attention", action="store_true",
                   help="PyTorch's fused kernel for the temporal attention (the baseline of the explicit few-frame product)")
    p.add_argument("--full-window", action="store_true", help="recompute the window every step (no key/value cache)")
    p.add_argument("--joints", type=int, default=3, help="joint count for an untrained model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        p.error("--steps and --batch must be positive, --warmup non-negative")
    threads = args.threads or len(os.sched_getaffinity(0))
    networks.FUSED_ATTENTION_AT_INFERENCE = args.fused_attention
    torch.set_num_threads(threads)
    kwargs = {"decode_steps": args.decode_steps, "dynamics_steps": args.dynamics_steps, "streaming": False if args.full_window else None,
              "channels_last": False if args.contiguous else None}
    try:
        if Path(args.model).suffix in (".yaml", ".yml"):
            model_cfg, _ = load_config(args.model)
            world = WorldModel.untrained(model_cfg, args.joints, args.device, **kwargs)
        else:
            world = WorldModel.load(args.model, args.device, threads=threads, **kwargs)
    except (CheckpointError, ConfigError) as exc:
        print(f"iws bench step: {exc}", file=sys.stderr)
        return 2
    result = measure(world, args.batch, args.steps, args.warmup)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['fps']:.1f} frames/s  p50 {result['ms_p50']:.2f} ms  p95 {result['ms_p95']:.2f} ms  "
              f"(batch {args.batch}, {threads} threads, {world.dynamics_steps} dynamics + {world.decode_steps} decode step(s))")
    return 0
