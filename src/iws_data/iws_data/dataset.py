"""The cached dataset layout that the dataset builder writes and training reads.

One directory, memory-mapped numpy arrays aligned frame by frame at the control rate, episodes
stored back to back::

    DIR/meta.json               format, profile, joint names, rate, image size, episodes, report
    DIR/images.npy              uint8   (N, H, W, 3)  RGB
    DIR/joint_positions.npy     float32 (N, J)        measured joint positions at the frame
    DIR/actions.npy             float32 (N, J)        joint position command in force at the frame
    DIR/timestamps.npy          float64 (N,)          frame stamp, seconds (sim or wall time)

Frame i of an episode is the observation at step i; ``actions[i]`` is the command applied from
frame i to frame i+1. Numpy only: training imports this without ROS.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Iterator

import numpy as np

FORMAT = "iws-dataset/1"
ARRAYS = ("images", "joint_positions", "actions", "timestamps")


class DatasetError(ValueError):
    """A dataset directory is missing, incomplete or inconsistent."""


@dataclasses.dataclass(frozen=True)
class Episode:
    index: int
    start: int
    length: int
    split: str  # "train" or "val"
    task: str = ""
    success: bool = False
    score: float = float("nan")
    source: str = ""  # bag path (and episode within it) the frames came from

    @property
    def stop(self) -> int:
        return self.start + self.length


class Dataset:
    """Read-only view of a cached dataset; arrays are memory-mapped, so opening is instant."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        meta_path = self.root / "meta.json"
        if not meta_path.is_file():
            raise DatasetError(f"{self.root}: not a dataset (no meta.json); build one with `iws dataset build`")
        try:
            self.meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{meta_path}: corrupt JSON: {exc}") from exc
        if self.meta.get("format") != FORMAT:
            raise DatasetError(f"{meta_path}: format {self.meta.get('format')!r}, expected {FORMAT!r}")
        self.episodes = [Episode(**e) for e in self.meta["episodes"]]
        arrays = {}
        for name in ARRAYS:
            path = self.root / f"{name}.npy"
            if not path.is_file():
                raise DatasetError(f"{self.root}: missing {path.name}")
            try:
                arrays[name] = np.load(path, mmap_mode="r")
            except ValueError as exc:
                raise DatasetError(f"{path}: unreadable or truncated: {exc}") from exc
        self.images = arrays["images"]
        self.joint_positions = arrays["joint_positions"]
        self.actions = arrays["actions"]
        self.timestamps = arrays["timestamps"]
        n = len(self.images)
        if any(len(a) != n for a in arrays.values()):
            raise DatasetError(f"{self.root}: arrays have different lengths {[len(a) for a in arrays.values()]}")
        if self.episodes and self.episodes[-1].stop != n:
            raise DatasetError(f"{self.root}: episodes cover {self.episodes[-1].stop} frames, arrays hold {n}")

    @property
    def joint_names(self) -> list[str]:
        return list(self.meta["joint_names"])

    @property
    def image_size(self) -> tuple[int, int]:
        return tuple(self.images.shape[1:3])

    @property
    def control_rate_hz(self) -> float:
        return float(self.meta["control_rate_hz"])

    def __len__(self) -> int:
        return len(self.images)

    def split(self, name: str) -> list[Episode]:
        return [e for e in self.episodes if e.split == name]

    def windows(self, length: int, split: str = "train") -> np.ndarray:
        """Start indices of every window of ``length`` consecutive frames inside one episode."""
        starts = [np.arange(e.start, e.stop - length + 1) for e in self.split(split) if e.length >= length]
        return np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)

    def episode(self, index: int) -> dict[str, np.ndarray]:
        e = self.episodes[index]
        return {name: getattr(self, name)[e.start:e.stop] for name in ARRAYS}


class DatasetWriter:
    """Appends episodes to a new dataset directory; ``close()`` writes meta.json last, so an
    interrupted build never leaves a directory that opens as complete."""

    def __init__(self, root: str | Path, image_size: tuple[int, int], joint_names: list[str],
                 capacity: int, meta: dict | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "meta.json").unlink(missing_ok=True)
        h, w = image_size
        j = len(joint_names)
        open_map = np.lib.format.open_memmap
        self._arrays = {
            "images": open_map(self.root / "images.npy.partial", "w+", np.uint8, (capacity, h, w, 3)),
            "joint_positions": open_map(self.root / "joint_positions.npy.partial", "w+", np.float32, (capacity, j)),
            "actions": open_map(self.root / "actions.npy.partial", "w+", np.float32, (capacity, j)),
            "timestamps": open_map(self.root / "timestamps.npy.partial", "w+", np.float64, (capacity,)),
        }
        self.meta = {"format": FORMAT, "joint_names": list(joint_names), "image_size": [h, w], **(meta or {})}
        self.episodes: list[Episode] = []
        self.size = 0

    def add_episode(self, images: np.ndarray, joint_positions: np.ndarray, actions: np.ndarray,
                    timestamps: np.ndarray, split: str, **info) -> Episode:
        n = len(images)
        if not (len(joint_positions) == len(actions) == len(timestamps) == n):
            raise DatasetError("episode arrays must have equal lengths")
        if self.size + n > len(self._arrays["images"]):
            self._grow(max(2 * len(self._arrays["images"]), self.size + n))
        s = slice(self.size, self.size + n)
        self._arrays["images"][s] = images
        self._arrays["joint_positions"][s] = joint_positions
        self._arrays["actions"][s] = actions
        self._arrays["timestamps"][s] = timestamps
        episode = Episode(index=len(self.episodes), start=self.size, length=n, split=split, **info)
        self.episodes.append(episode)
        self.size += n
        return episode

    def _grow(self, capacity: int) -> None:
        """Reallocate the partial arrays with room for ``capacity`` frames (capacity is an estimate)."""
        for name, array in list(self._arrays.items()):
            partial = self.root / f"{name}.npy.partial"
            old_path = self.root / f"{name}.npy.partial-old"
            array.flush()
            del array
            self._arrays.pop(name)
            partial.rename(old_path)
            old = np.load(old_path, mmap_mode="r")
            new = np.lib.format.open_memmap(partial, "w+", old.dtype, (capacity, *old.shape[1:]))
            for start in range(0, self.size, 4096):
                stop = min(start + 4096, self.size)
                new[start:stop] = old[start:stop]
            del old
            old_path.unlink()
            self._arrays[name] = new

    def abort(self) -> None:
        """Delete the partial arrays (a failed build leaves no half-written dataset)."""
        for name in list(self._arrays):
            del self._arrays[name]
            (self.root / f"{name}.npy.partial").unlink(missing_ok=True)

    def close(self, **extra_meta) -> Path:
        """Trim the arrays to what was written, rename them into place, then write meta.json."""
        for name, array in self._arrays.items():
            array.flush()
            final = np.lib.format.open_memmap(self.root / f"{name}.npy", "w+", array.dtype, (self.size, *array.shape[1:]))
            for start in range(0, self.size, 4096):
                final[start:start + 4096] = array[start:min(start + 4096, self.size)]
            final.flush()
            del final
            (self.root / f"{name}.npy.partial").unlink()
        self._arrays = {}
        meta = {**self.meta, **extra_meta, "num_frames": self.size,
                "episodes": [dataclasses.asdict(e) for e in self.episodes]}
        tmp = self.root / "meta.json.partial"
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.rename(self.root / "meta.json")
        return self.root


def iter_episode_windows(dataset: Dataset, length: int, split: str = "train") -> Iterator[slice]:
    for start in dataset.windows(length, split):
        yield slice(int(start), int(start) + length)
