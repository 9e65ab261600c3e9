"""Start windows: the K observed frames a rollout begins from, shipped beside a checkpoint.

A world model cannot invent its first frames: a session starts from a window of real frames
(images, joint positions, actions). ``start_windows.npz`` in the checkpoint directory holds a few
windows from the held-out episodes of the training data, so a shipped model runs with no dataset.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

FILENAME = "start_windows.npz"


class StartWindowError(ValueError):
    """No usable start window: missing file, wrong shapes, or an episode that is too short."""


def windows_from_dataset(dataset, length: int, count: int = 8, split: str = "val") -> dict[str, np.ndarray]:
    """The first ``length`` frames of up to ``count`` episodes of ``split`` (train if split is empty)."""
    episodes = [e for e in (dataset.split(split) or dataset.split("train")) if e.length >= length][:count]
    if not episodes:
        raise StartWindowError(f"{dataset.root}: no episode with at least {length} frames")
    take = lambda array: np.stack([np.asarray(array[e.start:e.start + length]) for e in episodes])
    return {"images": take(dataset.images), "joint_positions": take(dataset.joint_positions).astype(np.float32),
            "actions": take(dataset.actions).astype(np.float32)}


def save_start_windows(checkpoint_dir: str | Path, windows: dict[str, np.ndarray]) -> Path:
    path = Path(checkpoint_dir) / FILENAME
    np.savez_compressed(path, **windows)
    return path


def load_start_windows(checkpoint_dir: str | Path) -> dict[str, np.ndarray]:
    path = Path(checkpoint_dir) / FILENAME
    if not path.is_file():
        raise StartWindowError(f"{path}: missing; give the node a dataset (param start_dataset) or "
                               f"save windows with iws_world_model.start_windows.save_start_windows")
    try:
        with np.load(path) as data:
            windows = {key: data[key] for key in ("images", "joint_positions", "actions")}
    except (KeyError, ValueError, OSError) as exc:
        raise StartWindowError(f"{path}: unreadable: {exc}") from exc
    n, k = windows["images"].shape[:2]
    if windows["images"].ndim != 5 or windows["joint_positions"].shape[:2] != (n, k) or windows["actions"].shape[:2] != (n, k):
        raise StartWindowError(f"{path}: inconsistent shapes {[v.shape for v in windows.values()]}")
    return windows
