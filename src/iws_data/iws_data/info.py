"""`iws dataset info` (a summary to check a dataset before training) and `iws dataset preview`
(an MP4 of one episode with the frame index and actions drawn on it, to eyeball the alignment)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from iws_data.dataset import Dataset, DatasetError
from iws_data.video import write_mp4

IMAGE_STAT_SAMPLES = 2000


def summarize(dataset: Dataset) -> dict:
    episodes = dataset.episodes
    lengths = np.array([e.length for e in episodes])
    rate = dataset.control_rate_hz
    # Image statistics from an even sample of frames: exact enough and instant on big datasets.
    sample = np.linspace(0, len(dataset) - 1, min(len(dataset), IMAGE_STAT_SAMPLES)).astype(int) if len(dataset) else []
    pixels = np.asarray(dataset.images[sample], dtype=np.float64) / 255.0 if len(sample) else np.zeros((0, 1, 1, 3))
    scores = np.array([e.score for e in episodes], dtype=np.float64)

    def ranges(array: np.ndarray) -> dict:
        names = dataset.joint_names
        if not len(array):
            return {}
        lo, hi = np.asarray(array.min(axis=0)), np.asarray(array.max(axis=0))
        return {n: [float(a), float(b)] for n, a, b in zip(names, lo, hi)}

    tasks: dict[str, int] = {}
    for e in episodes:
        tasks[e.task or "?"] = tasks.get(e.task or "?", 0) + 1
    return {
        "path": str(dataset.root),
        "profile": dataset.meta.get("profile"),
        "episodes": len(episodes),
        "frames": len(dataset),
        "duration_s": float(len(dataset) / rate),
        "control_rate_hz": rate,
        "image_size": list(dataset.image_size),
        "episode_length": {"min": int(lengths.min()), "mean": float(lengths.mean()), "max": int(lengths.max())} if len(lengths) else {},
        "tasks": tasks,
        "success_rate": float(np.mean([e.success for e in episodes])) if episodes else float("nan"),
        "mean_score": float(np.nanmean(scores)) if np.isfinite(scores).any() else float("nan"),
        "action_range": ranges(dataset.actions),
        "joint_range": ranges(dataset.joint_positions),
        "image_mean": pixels.mean(axis=(0, 1, 2)).tolist() if len(sample) else [],
        "image_std": pixels.std(axis=(0, 1, 2)).tolist() if len(sample) else [],
        "splits": {name: {"episodes": len(dataset.split(name)), "frames": int(sum(e.length for e in dataset.split(name)))}
                   for name in ("train", "val")},
        "report": {k: v for k, v in dataset.meta.get("report", {}).items() if not isinstance(v, list)},
    }


def format_summary(s: dict) -> str:
    lines = [
        f"dataset {s['path']} (profile {s['profile']})",
        f"  episodes {s['episodes']}  frames {s['frames']}  duration {s['duration_s']:.1f} s at {s['control_rate_hz']:g} Hz  "
        f"images {s['image_size'][0]}x{s['image_size'][1]}",
        f"  episode length min/mean/max {s['episode_length'].get('min')}/{s['episode_length'].get('mean', 0):.1f}/{s['episode_length'].get('max')}",
        f"  tasks {s['tasks']}  success rate {s['success_rate']:.2f}  mean score {s['mean_score']:.3f}",
        f"  train {s['splits']['train']['episodes']} episodes / {s['splits']['train']['frames']} frames, "
        f"val {s['splits']['val']['episodes']} episodes / {s['splits']['val']['frames']} frames",
        "  image mean " + " ".join(f"{v:.3f}" for v in s["image_mean"]) + "  std " + " ".join(f"{v:.3f}" for v in s["image_std"]),
        "  joint            action range              joint position range",
    ]
    for name in s["action_range"]:
        a, j = s["action_range"][name], s["joint_range"][name]
        lines.append(f"  {name:<16} [{a[0]:+.3f}, {a[1]:+.3f}]        [{j[0]:+.3f}, {j[1]:+.3f}]")
    if s["report"]:
        lines.append("  build report " + ", ".join(f"{k}={v}" for k, v in s["report"].items()))
    return "\n".join(lines)


def info_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws dataset info", description="summarise a cached dataset")
    parser.add_argument("dataset")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        summary = summarize(Dataset(args.dataset))
    except DatasetError as exc:
        print(f"iws dataset info: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 0


# -- preview ------------------------------------------------------------------------------------
# 3x5 bitmap digits (and '-', '.'), enough to print numbers without a font library.
GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "-": "000000111000000", ".": "000000000000010",
    "+": "000010111010000", " ": "000000000000000",
}


def draw_text(image: np.ndarray, text: str, x: int, y: int, scale: int = 2, color=(255, 255, 255)) -> None:
    """Draw digits in place with a dark backing box, so they read on any background."""
    h, w = image.shape[:2]
    width = len(text) * 4 * scale
    image[max(y - 1, 0):min(y + 5 * scale + 1, h), max(x - scale, 0):min(x + width, w)] //= 3
    for i, char in enumerate(text):
        glyph = np.array([int(c) for c in GLYPHS.get(char, GLYPHS[" "])], dtype=bool).reshape(5, 3)
        mask = np.kron(glyph, np.ones((scale, scale), dtype=bool))
        x0 = x + i * 4 * scale
        region = image[y:y + mask.shape[0], x0:x0 + mask.shape[1]]
        region[mask[:region.shape[0], :region.shape[1]]] = color


def draw_bars(image: np.ndarray, values: np.ndarray, lower: np.ndarray, upper: np.ndarray, top: int, height: int) -> None:
    """One horizontal bar per joint in rows top..top+height; the white tick is the middle of the joint range."""
    w = image.shape[1]
    colors = [(230, 60, 60), (60, 200, 60), (80, 120, 255), (230, 200, 40), (200, 80, 220), (40, 200, 200)]
    bar_h = max(height // max(len(values), 1) - 2, 2)
    for j, value in enumerate(values):
        y0 = top + j * (bar_h + 2)
        image[y0:y0 + bar_h, :] = 40
        frac = float(np.clip((value - lower[j]) / max(upper[j] - lower[j], 1e-9), 0, 1))
        centre, end = w // 2, int(round(frac * (w - 1)))
        a, b = sorted((centre, end))
        image[y0:y0 + bar_h, a:b + 1] = colors[j % len(colors)]
        image[y0:y0 + bar_h, centre] = 255


def render_preview_frame(image: np.ndarray, index: int, action: np.ndarray, lower, upper, upscale: int) -> np.ndarray:
    big = np.kron(image, np.ones((upscale, upscale, 1), dtype=np.uint8))
    bars_height = 10 * len(action) + 4
    panel = np.zeros((big.shape[0] + bars_height + 14 * len(action) + 4, big.shape[1], 3), dtype=np.uint8)
    panel[:big.shape[0]] = big
    draw_text(panel, str(index), 4, 4, scale=3)
    draw_bars(panel, action, np.asarray(lower), np.asarray(upper), big.shape[0] + 2, bars_height - 2)
    text_top = big.shape[0] + bars_height + 4
    for j, value in enumerate(action):
        draw_text(panel, f"{value:+.3f}", 4, text_top + 14 * j, scale=2)
    # H.264 with yuv420p needs even sizes.
    return panel[: panel.shape[0] // 2 * 2, : panel.shape[1] // 2 * 2]


def write_preview(dataset: Dataset, episode: int, out: Path, upscale: int = 4, fps: float | None = None) -> Path:
    from iws_common.profile import load_profile

    if not 0 <= episode < len(dataset.episodes):
        raise DatasetError(f"{dataset.root}: episode {episode} out of range (0..{len(dataset.episodes) - 1})")
    data = dataset.episode(episode)
    actions = data["actions"]
    try:
        joints = load_profile(dataset.meta.get("profile", "reference_arm")).joints
        lower, upper = joints.lower, joints.upper
    except Exception:  # a dataset from an unknown profile: scale bars to the data
        lower, upper = actions.min(axis=0) - 1e-3, actions.max(axis=0) + 1e-3
    frames = (render_preview_frame(np.asarray(data["images"][i]), i, actions[i], lower, upper, upscale)
              for i in range(len(actions)))
    write_mp4(frames, out, fps or dataset.control_rate_hz)
    return out


def preview_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws dataset preview", description="MP4 of one episode with actions overlaid")
    parser.add_argument("dataset")
    parser.add_argument("--episode", type=int, default=0)
    parser.add_argument("--out", required=True, help="output .mp4")
    parser.add_argument("--upscale", type=int, default=4)
    parser.add_argument("--fps", type=float, default=None, help="playback rate (default: the control rate)")
    args = parser.parse_args(argv)
    try:
        out = write_preview(Dataset(args.dataset), args.episode, Path(args.out), upscale=args.upscale, fps=args.fps)
    except DatasetError as exc:
        print(f"iws dataset preview: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
