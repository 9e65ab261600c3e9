#!/usr/bin/env python3
"""Draw a world model's first open-loop steps beside what it had to match, one block per episode:
rows real / autoencoded / one step from the real frames before it / open loop, cropped to a corner.

The figure behind "A critic on the predicted latent" (docs/results/world_model_experiments.md): it
shows where the T turns into the three-armed blob, the autoencoder or the dynamics, and whether the
blob needs the rollout's own history (the one-step row has none of it).

    python3 tools/first_steps_figure.py --model models/push_t_curriculum --data data/push_t_dataset \
        --episodes 1,10 --steps 12 --crop 4,4,40 --out docs/results/world_model/first_steps_y.png
"""
from __future__ import annotations

import argparse

import numpy as np
from PIL import Image

from iws_data.dataset import Dataset
from iws_world_model import evaluate
from iws_world_model.world_model import WorldModel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--episodes", default="1,10", help="indices among the first 16 held-out episodes")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--crop", default="4,4,40", help="top,left,side in model pixels")
    p.add_argument("--scale", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    top, left, side = (int(v) for v in args.crop.split(","))
    world = WorldModel.load(args.model, "cpu", threads=1)
    data = evaluate.load_open_loop_data(Dataset(args.data), world.config.window, args.steps, 16, world.image_size)
    loop, _ = evaluate.rollout_open_loop(world, data, 0, progress=False)
    one, _ = evaluate.rollout_one_step(world, data, 0, progress=False)
    auto, _ = evaluate.autoencoded(world, data, 0)
    rows = []
    for e in (int(v) for v in args.episodes.split(",")):
        for frames in (data.real_images, auto, one, loop):
            rows.append(np.concatenate(list(frames[e, :, top:top + side, left:left + side]), 1))
        rows.append(np.full((3, rows[-1].shape[1], 3), 255, np.uint8))
    image = Image.fromarray(np.concatenate(rows[:-1], 0))
    image.resize((image.width * args.scale, image.height * args.scale), Image.NEAREST).save(args.out, optimize=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
