"""Image resampling for the dataset: centre crop to square and area (box-filter) resize, numpy only."""
from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=32)
def area_weights(source: int, target: int) -> np.ndarray:
    """(target, source) matrix whose rows average the source pixels each target pixel covers,
    with fractional overlap at the edges: OpenCV's INTER_AREA for any scale factor."""
    weights = np.zeros((target, source), dtype=np.float32)
    scale = source / target
    for i in range(target):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(int(np.floor(lo)), min(int(np.ceil(hi)), source)):
            weights[i, j] = min(hi, j + 1) - max(lo, j)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights


def centre_crop_square(images: np.ndarray) -> np.ndarray:
    """Crop (N, H, W, C) or (H, W, C) to the central square of side min(H, W)."""
    h, w = images.shape[-3], images.shape[-2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return images[..., top:top + side, left:left + side, :]


def crop_and_resize(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, H, W, C) -> uint8 (N, size, size, C): centre crop to square, then area resize."""
    return resize_area(centre_crop_square(images), size, size)


def resize_area(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 (N, H, W, C) -> uint8 (N, height, width, C) by area (box-filter) resampling."""
    if images.shape[1:3] == (height, width):
        return np.ascontiguousarray(images)
    rows = np.einsum("oh,nhwc->nowc", area_weights(images.shape[1], height), images.astype(np.float32), optimize=True)
    resized = np.einsum("pw,nowc->nopc", area_weights(images.shape[2], width), rows, optimize=True)
    return np.clip(np.rint(resized), 0, 255).astype(np.uint8)
