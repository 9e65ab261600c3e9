#!/usr/bin/env python3
"""How sure an experiment b report's r is, from the evaluations already in its directory.

`iws experiment correlation` writes the interval into reports made since stop 50; this reads the
episodes of an older report's `reference_NAME/evaluation.json` and `world_model_NAME/evaluation.json`
(as they are, whichever checkpoints made them) and resamples the matched start states
(`iws_policy.experiments.bootstrap_pearson`):

    python3 tools/correlation_interval.py docs/results/correlation_pose docs/results/correlation_expert_family_decoder

Prints JSON, one entry per directory: the policies, r, its 95 % interval and the share of draws at r >= 0.9.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from iws_policy.experiments import bootstrap_pearson, pearson, verdicts_by_seed


def interval(directory: Path) -> dict:
    verdicts, robot, model, names = [], [], [], []
    for reference in sorted(directory.glob("reference_*/evaluation.json")):
        name = reference.parent.name[len("reference_"):]
        world_model = directory / f"world_model_{name}" / "evaluation.json"
        if not world_model.is_file():
            continue
        real, sim = json.loads(reference.read_text()), json.loads(world_model.read_text())
        names.append(name)
        robot.append(real["success_rate"])
        model.append(sim["success_rate"])
        verdicts.append(verdicts_by_seed(real, sim))
    r = pearson(model, robot)
    return {"directory": str(directory), "policies": names, "pearson_r": r if math.isfinite(r) else None,
            "bootstrap": bootstrap_pearson(verdicts)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("directories", type=Path, nargs="+", help="experiment b output directories")
    args = p.parse_args(argv)
    print(json.dumps([interval(d) for d in args.directories], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
