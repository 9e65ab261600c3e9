#!/usr/bin/env python3
"""Put the same frames of several evaluation videos in rows, one row per video, to compare what a
policy did on two backends from the same start (`iws evaluate --videos N` writes episode_NNN.mp4).

    python3 tools/episode_strip.py \
        docs/results/correlation_pose_frozen_decoder/world_model_f40k/episode_000.mp4 \
        docs/results/correlation_pose_frozen_decoder/reference_f40k/episode_000.mp4 \
        --steps 0,10,20,30,40,50,60,80,100,140,200 --size 96 \
        --out docs/results/correlation_pose_frozen_decoder/episode_000_strip.png
"""
from __future__ import annotations

import argparse
import sys

import av
import numpy as np
from PIL import Image


def read_frames(path: str) -> list[np.ndarray]:
    with av.open(path) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("videos", nargs="+", help="MP4 files, one row each, top to bottom")
    parser.add_argument("--steps", default="0,10,20,40,80,120,160,200", help="frame indices, comma-separated")
    parser.add_argument("--size", type=int, default=96, help="side of each frame in the figure (pixels)")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    rows = []
    for path in args.videos:
        frames = read_frames(path)
        if max(steps) >= len(frames):
            print(f"episode_strip: {path} has {len(frames)} frames; step {max(steps)} asked", file=sys.stderr)
            return 2
        tiles = [np.asarray(Image.fromarray(frames[s]).resize((args.size, args.size), Image.BILINEAR)) for s in steps]
        rows.append(np.concatenate(tiles, axis=1))
    Image.fromarray(np.concatenate(rows, axis=0)).save(args.out, optimize=True)
    print(f"episode_strip: {len(rows)} rows x {len(steps)} frames -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
