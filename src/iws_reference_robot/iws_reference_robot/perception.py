"""Task state from camera pixels alone: the T's pose in push_t.

Policies, the demo's expert and evaluation must not read simulator ground truth, and the world
model has none; so they estimate what they need from the image, with one function that treats
reference-robot and world-model frames alike (any image size: the profile's camera is rescaled).

The T is found by colour, its pixels are back-projected onto the plane of its top face, and its
pose is the one whose silhouette best matches them (a coarse search over yaw at the centroid, then
a local refinement), scored by intersection over union.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from iws_common.profile import RobotProfile

from . import scene
from .tasks import T_BOXES, PushT, _raster_boxes, to_world


@dataclasses.dataclass(frozen=True)
class PoseEstimate:
    found: bool
    pose: np.ndarray  # (x, y, yaw) in the table frame; NaN when not found
    fit: float  # intersection over union of the silhouette at ``pose`` with the segmented pixels
    pixels: int  # how many pixels were segmented as the T


def t_block_mask(image: np.ndarray) -> np.ndarray:
    """Pixels of the blue T (rgb8). The table is grey-beige, the goal green, the pusher red,
    the arm dark grey: blue dominance separates the T from all of them."""
    rgb = image.astype(np.int16)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return (b > 110) & (b - r > 60) & (b - g > 25)


# The movable object of each task, as a pixel mask: what world-model training watches for contact
# (iws_world_model.train, motion_oversample).
OBJECT_MASKS = {"push_t": t_block_mask}


class PushTPoseEstimator:
    MIN_PIXELS_FRACTION = 0.25  # of the T's expected area in pixels; fewer means "not found"

    def __init__(self, profile: RobotProfile, yaw_step_deg: float = 3.0):
        self.profile = profile
        self.depth = scene.CAMERA_HEIGHT - PushT.HEIGHT  # the camera sees the T's top face
        self.raster = _raster_boxes(T_BOXES, 0.004)
        self.yaws = np.deg2rad(np.arange(0.0, 360.0, yaw_step_deg))
        self.goal = PushT.GOAL.copy()
        self._scorer = PushT()

    def _camera(self, height: int, width: int):
        camera = self.profile.camera
        return camera if (camera.width, camera.height) == (width, height) else camera.scaled(width, height)

    def pixels_to_table(self, uv: np.ndarray, height: int, width: int) -> np.ndarray:
        cam = self._camera(height, width)
        cx_w, cy_w = scene.CAMERA_CENTER
        x = cx_w + (uv[:, 0] - cam.cx) * self.depth / cam.fx
        y = cy_w - (uv[:, 1] - cam.cy) * self.depth / cam.fy
        return np.stack([x, y], axis=-1)

    def table_to_pixels(self, xy: np.ndarray, height: int, width: int) -> np.ndarray:
        cam = self._camera(height, width)
        cx_w, cy_w = scene.CAMERA_CENTER
        u = cam.cx + (xy[..., 0] - cx_w) * cam.fx / self.depth
        v = cam.cy - (xy[..., 1] - cy_w) * cam.fy / self.depth
        return np.stack([u, v], axis=-1)

    def _fit(self, poses: np.ndarray, points: np.ndarray, mask: np.ndarray, pixel_m: float) -> np.ndarray:
        """IoU-like fit of each candidate pose (P, 3) to the segmented points (N, 2)."""
        h, w = mask.shape
        c, s = np.cos(poses[:, 2]), np.sin(poses[:, 2])
        d = points[None, :, :] - poses[:, None, :2]
        local = np.stack([c[:, None] * d[..., 0] + s[:, None] * d[..., 1],
                          -s[:, None] * d[..., 0] + c[:, None] * d[..., 1]], axis=-1)  # (P, N, 2)
        gap = np.abs(local[:, :, None, :] - T_BOXES[None, None, :, :2]) - T_BOXES[None, None, :, 2:] - 0.5 * pixel_m
        precision = np.any(np.all(gap <= 0, axis=-1), axis=-1).mean(axis=1)
        world = np.stack([c[:, None] * self.raster[None, :, 0] - s[:, None] * self.raster[None, :, 1],
                          s[:, None] * self.raster[None, :, 0] + c[:, None] * self.raster[None, :, 1]], axis=-1)
        world = world + poses[:, None, :2]
        uv = np.rint(self.table_to_pixels(world, h, w)).astype(np.int64)
        valid = (uv[..., 0] >= 0) & (uv[..., 0] < w) & (uv[..., 1] >= 0) & (uv[..., 1] < h)
        hit = np.zeros(valid.shape, dtype=bool)
        hit[valid] = mask[uv[..., 1][valid], uv[..., 0][valid]]
        recall = hit.mean(axis=1)
        return precision * recall / np.maximum(precision + recall - precision * recall, 1e-9)

    def estimate(self, image: np.ndarray) -> PoseEstimate:
        """The T's pose from one rgb8 image (H, W, 3) of any size."""
        h, w = image.shape[:2]
        mask = t_block_mask(image)
        v, u = np.nonzero(mask)
        cam = self._camera(h, w)
        pixel_m = self.depth / cam.fx
        expected = float(sum(4 * b[2] * b[3] for b in T_BOXES)) / pixel_m**2
        if len(u) < self.MIN_PIXELS_FRACTION * expected:
            return PoseEstimate(False, np.full(3, np.nan), 0.0, int(len(u)))
        points = self.pixels_to_table(np.stack([u, v], axis=-1).astype(np.float64), h, w)
        centroid = points.mean(axis=0)
        coarse = np.column_stack([np.repeat(centroid[None], len(self.yaws), 0), self.yaws])
        fits = self._fit(coarse, points, mask, pixel_m)
        best = coarse[int(np.argmax(fits))]
        for step_xy, step_yaw in ((pixel_m, math.radians(2.0)), (pixel_m / 3, math.radians(0.7))):
            offsets = np.array([(dx, dy, da) for dx in (-1, 0, 1) for dy in (-1, 0, 1) for da in (-1, 0, 1)], float)
            for _ in range(6):
                candidates = best + offsets * np.array([step_xy, step_xy, step_yaw])
                fits = self._fit(candidates, points, mask, pixel_m)
                index = int(np.argmax(fits))
                if index == 13:  # the centre (no move) is best
                    break
                best = candidates[index]
        best_fit = float(self._fit(best[None], points, mask, pixel_m)[0])
        pose = np.array([best[0], best[1], (best[2] + math.pi) % (2 * math.pi) - math.pi])
        return PoseEstimate(True, pose, best_fit, int(len(u)))

    def score(self, pose: np.ndarray) -> float:
        """The push_t task score (T/goal overlap) of an estimated pose."""
        return self._scorer.overlap(pose, self.goal)


def silhouette_points(pose: np.ndarray) -> np.ndarray:
    """Table-frame points covering the T at ``pose`` (for drawing and tests)."""
    return to_world(_raster_boxes(T_BOXES, 0.004), pose)

