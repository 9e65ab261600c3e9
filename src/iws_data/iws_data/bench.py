"""`iws bench collect` and `iws bench dataset`: frames/s of the data pipeline at the profile's size.

collect: in-process lockstep collection of a few episodes into a temp dir, timed end to end
(simulator construction, physics, rendering, serialization, bag writing). Bar: >= 100 frames/s.
dataset: building a dataset from such bags (reading, decoding, alignment, resize, writing).
Bar: >= 1000 frames/s.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

COLLECT_BAR = 100.0
DATASET_BAR = 1000.0


def _parser(prog: str, episodes: int, steps: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--robot", default="reference_arm")
    parser.add_argument("--task", default="push_t")
    parser.add_argument("--episodes", type=int, default=episodes)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def bench_collect(robot: str, task: str, episodes: int, steps: int, out: Path) -> dict:
    from iws_data.collect import collect

    started = time.perf_counter()
    results = collect(robot, task, out, episodes, steps, seed=0, progress=False)
    elapsed = time.perf_counter() - started
    frames = sum(r.steps + 1 for r in results)
    return {"frames_per_s": frames / elapsed, "frames": frames, "episodes": len(results), "seconds": elapsed,
            "bar_frames_per_s": COLLECT_BAR}


def bench_dataset(robot: str, bags: Path, out: Path) -> dict:
    from iws_data.builder import build_dataset

    started = time.perf_counter()
    _, report = build_dataset([bags], out, robot, progress=False)
    elapsed = time.perf_counter() - started
    return {"frames_per_s": report.frames / elapsed, "frames": report.frames, "episodes": report.episodes,
            "seconds": elapsed, "bar_frames_per_s": DATASET_BAR}


def _emit(result: dict, as_json: bool, what: str) -> int:
    if as_json:
        print(json.dumps(result))
    else:
        verdict = "meets" if result["frames_per_s"] >= result["bar_frames_per_s"] else "BELOW"
        print(f"{what}: {result['frames_per_s']:.0f} frames/s ({result['frames']} frames in {result['seconds']:.2f} s); "
              f"{verdict} the bar of {result['bar_frames_per_s']:.0f}")
    return 0


def collect_main(argv: list[str] | None = None) -> int:
    args = _parser("iws bench collect", episodes=4, steps=100).parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="iws_bench_collect_") as tmp:
        result = bench_collect(args.robot, args.task, args.episodes, args.steps, Path(tmp) / "bags")
    return _emit(result, args.json, "iws bench collect")


def dataset_main(argv: list[str] | None = None) -> int:
    args = _parser("iws bench dataset", episodes=10, steps=100).parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="iws_bench_dataset_") as tmp:
        bags = Path(tmp) / "bags"
        bench_collect(args.robot, args.task, args.episodes, args.steps, bags)
        result = bench_dataset(args.robot, bags, Path(tmp) / "dataset")
    return _emit(result, args.json, "iws bench dataset")


if __name__ == "__main__":
    sys.exit(collect_main())
