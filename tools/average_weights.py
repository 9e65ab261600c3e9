#!/usr/bin/env python3
"""A world model whose weights are the mean of several (a uniform "model soup").

Fine-tunes from one set of weights often lie in one basin, where their mean can generalise better
than each (Wortsman et al. 2022); it is also what weight averaging along a run (EMA, which `iws
train` does not do) would give at its end. Tried on the T's yaw in stop 50
(docs/results/world_model_experiments.md, "Weights averaged"): no gain. The checkpoints must share
the architecture and the normalisation (they do when every one was trained with --init-weights from
the same model); the first one's config.json and start windows are copied:

    python3 tools/average_weights.py runs/soup models/push_t runs/ctrl_servo7
    iws eval openloop --model runs/soup --data data/push_t_dataset --episodes 47 --videos 0
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="new checkpoint directory")
    p.add_argument("models", type=Path, nargs="+", help="checkpoint directories to average (two or more)")
    args = p.parse_args(argv)
    if len(args.models) < 2:
        p.error("give at least two checkpoints")
    configs = [json.loads((m / "config.json").read_text()) for m in args.models]
    for model, config in zip(args.models[1:], configs[1:]):
        for part in ("model", "normalization"):
            if config[part] != configs[0][part]:
                sys.exit(f"{model}: its {part} differs from {args.models[0]}'s: the weights cannot be averaged")
    weights = [load_file(str(m / "model.safetensors")) for m in args.models]
    for model, w in zip(args.models[1:], weights[1:]):
        if w.keys() != weights[0].keys() or any(w[k].shape != weights[0][k].shape for k in w):
            sys.exit(f"{model}: its tensors differ from {args.models[0]}'s in names or shapes")
    mean = {k: (sum(w[k].double() for w in weights) / len(weights)).to(weights[0][k].dtype)
            if weights[0][k].is_floating_point() else weights[0][k] for k in weights[0]}
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(mean, str(args.out / "model.safetensors"))
    config = dict(configs[0], averaged_from=[str(m) for m in args.models])
    (args.out / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("start_windows.npz",):
        if (args.models[0] / name).exists():
            shutil.copy(args.models[0] / name, args.out / name)
    print(f"wrote {args.out}: the mean of {len(args.models)} checkpoints")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
