"""Metrics for `iws eval`: image fidelity (PSNR, SSIM), task fidelity (the T's pose from pixels) and
pixel statistics for drift detection. Numpy and torch only (no ROS), so notebooks can reuse them.

Images are uint8 (..., H, W, 3); fidelity is computed on [0, 1] floats with data range 1.0.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics.functional.image import peak_signal_noise_ratio

PSNR_CAP_DB = 100.0  # identical frames have infinite PSNR; JSON has no infinity, so it is capped


def to_unit(images: np.ndarray) -> torch.Tensor:
    """uint8 (M, H, W, 3) -> float64 (M, 3, H, W) in [0, 1] (float32 SSIM of identical frames is 0.9997)."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).double().div_(255.0)


def _gaussian_taps(sigma: float = 1.5, dtype=torch.float64) -> torch.Tensor:
    size = int(3.5 * sigma + 0.5) * 2 + 1  # 11 taps at sigma 1.5, as torchmetrics
    x = torch.arange(size, dtype=dtype) - (size - 1) / 2
    g = torch.exp(-(x / sigma) ** 2 / 2)
    return g / g.sum()


def ssim(pred: torch.Tensor, real: torch.Tensor, data_range: float = 1.0, k1: float = 0.01, k2: float = 0.03) -> torch.Tensor:
    """Per-image SSIM of (M, C, H, W) floats: torchmetrics' structural_similarity_index_measure
    (Gaussian window 11 x 11, sigma 1.5, reflect padding, mean over the whole map), but filtering
    with the separable 1-D window twice instead of the 11 x 11 one: the same numbers (the 2-D
    window is the outer product of the 1-D one), 5x less arithmetic. Open-loop evaluation spent
    most of its time here."""
    taps = _gaussian_taps(dtype=pred.dtype).to(pred.device)
    channels, pad = pred.shape[1], (len(taps) - 1) // 2
    rows, cols = taps.view(1, 1, -1, 1).repeat(channels, 1, 1, 1), taps.view(1, 1, 1, -1).repeat(channels, 1, 1, 1)

    def blur(x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (pad, pad, pad, pad), mode="reflect")
        return F.conv2d(F.conv2d(x, rows, groups=channels), cols, groups=channels)

    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    mu_p, mu_r = blur(pred), blur(real)
    var_p = (blur(pred * pred) - mu_p ** 2).clamp(min=0.0)
    var_r = (blur(real * real) - mu_r ** 2).clamp(min=0.0)
    cov = blur(pred * real) - mu_p * mu_r
    index = ((2 * mu_p * mu_r + c1) * (2 * cov + c2)) / ((mu_p ** 2 + mu_r ** 2 + c1) * (var_p + var_r + c2))
    return index.flatten(1).mean(1)


@torch.inference_mode()
def frame_fidelity(pred: np.ndarray, real: np.ndarray, chunk: int = 256, progress=None) -> dict[str, np.ndarray]:
    """Per-frame PSNR (dB, capped at PSNR_CAP_DB) and SSIM of ``pred`` against ``real`` (same shape);
    ``progress`` (a tqdm bar) advances by the frames scored."""
    pred, real = np.asarray(pred), np.asarray(real)
    if pred.shape != real.shape:
        raise ValueError(f"predicted frames {pred.shape} and real frames {real.shape} differ in shape")
    lead = pred.shape[:-3]
    pred, real = pred.reshape(-1, *pred.shape[-3:]), real.reshape(-1, *real.shape[-3:])
    psnr, structure = [], []
    for i in range(0, len(pred), chunk):
        p, r = to_unit(pred[i:i + chunk]), to_unit(real[i:i + chunk])
        psnr.append(peak_signal_noise_ratio(p, r, data_range=1.0, reduction="none", dim=(1, 2, 3)).clamp(max=PSNR_CAP_DB))
        structure.append(ssim(p, r))
        if progress is not None:
            progress.update(len(p))
    cat = lambda parts: (torch.cat(parts).numpy() if parts else np.zeros(0, np.float32)).reshape(lead)
    return {"psnr": cat(psnr), "ssim": cat(structure)}


def joint_error(pred: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Mean absolute joint error (radians) over the last axis."""
    return np.abs(np.asarray(pred, np.float64) - np.asarray(real, np.float64)).mean(-1)


def estimate_poses(estimator, images: np.ndarray, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """The T's pose in each frame (M, H, W, 3): found (M,) bool and poses (M, 3) (NaN where not found)."""
    found = np.zeros(len(images), dtype=bool)
    poses = np.full((len(images), 3), np.nan)
    for i, image in enumerate(images):
        estimate = estimator.estimate(image)
        found[i], poses[i] = estimate.found, estimate.pose
        if progress is not None:
            progress.update(1)
    return found, poses


def arm_response(step: np.ndarray, offset: np.ndarray, last_step: np.ndarray) -> list[dict]:
    """How each joint answers its command, from (M, J) samples: the least-squares gains of a joint's
    step on the command's offset from it and on its step before (the reference arm's servo: about 0.6
    and 0.16). A backend whose arm answers otherwise teaches a policy other commands."""
    rows = []
    for j in range(step.shape[1]):
        x = np.stack([offset[:, j], last_step[:, j], np.ones(len(step))], 1)
        coef, *_ = np.linalg.lstsq(x, step[:, j], rcond=None)
        residual, variance = step[:, j] - x @ coef, step[:, j].var()
        rows.append({"gain_command": float(coef[0]), "gain_last_step": float(coef[1]),
                     "r2": float(1 - residual.var() / variance) if variance > 0 else float("nan"),
                     "residual_rad": float(residual.std())})
    return rows


FLIP_DEG = 45.0  # a yaw error past this is a misread orientation (t_yaw_flip_rate), not a small rotation


def pose_errors(pred_poses: np.ndarray, real_poses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position error (mm) and yaw error (degrees, wrapped to [0, 180]); NaN where either pose is missing."""
    position = 1000.0 * np.linalg.norm(pred_poses[..., :2] - real_poses[..., :2], axis=-1)
    yaw = np.abs((pred_poses[..., 2] - real_poses[..., 2] + math.pi) % (2 * math.pi) - math.pi)
    return position, np.degrees(yaw)


def masked_mean(values: np.ndarray, mask: np.ndarray, axis: int = 0) -> np.ndarray:
    """Mean over ``axis`` of the entries where ``mask`` holds and the value is finite; NaN where none."""
    values = np.asarray(values, np.float64)
    keep = np.asarray(mask, bool) & np.isfinite(values)
    total = np.where(keep, values, 0.0).sum(axis)
    count = keep.sum(axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


# drift detection -------------------------------------------------------------------------------
STATISTICS = ("pixel_mean", "pixel_std", "pixel_tv")


def frame_statistics(images: np.ndarray) -> dict[str, np.ndarray]:
    """Per-frame pixel mean, standard deviation and total variation (mean absolute difference of
    neighbouring pixels), in [0, 1] units. Mean and std catch fading and blow-ups; total variation
    catches noise (high) and blur (low), which can keep mean and std in range."""
    x = np.asarray(images, np.float32) / 255.0
    flat = x.reshape(len(x), -1)
    tv = 0.5 * (np.abs(np.diff(x, axis=-2)).mean((-3, -2, -1)) + np.abs(np.diff(x, axis=-3)).mean((-3, -2, -1)))
    return {"pixel_mean": flat.mean(1), "pixel_std": flat.std(1), "pixel_tv": tv}


def reference_range(images: np.ndarray, low: float = 1.0, high: float = 99.0, margin: float = 0.25,
                    floor: float = 0.02) -> dict:
    """The in-distribution box of each per-frame statistic from real frames: percentiles low..high,
    widened by ``margin`` of their width (at least ``floor``) so that a handful of reference frames
    does not flag every healthy prediction."""
    def box(values: np.ndarray) -> list[float]:
        lo, hi = np.percentile(values, [low, high])
        pad = max(margin * (hi - lo), floor)
        return [float(lo - pad), float(hi + pad)]

    boxes = {key: box(values) for key, values in frame_statistics(images).items()}
    return {**boxes, "frames": int(len(images)), "percentiles": [low, high], "margin": margin, "floor": floor}


def in_distribution(statistics: dict[str, np.ndarray], reference: dict) -> np.ndarray:
    """Whether each frame's statistics all lie inside the reference boxes."""
    inside = np.ones(len(statistics[STATISTICS[0]]), bool)
    for key in STATISTICS:
        lo, hi = reference[key]
        inside &= (statistics[key] >= lo) & (statistics[key] <= hi)
    return inside


def jsonable(value, digits: int = 5):
    """numpy / float values -> plain JSON (NaN and infinity become null, floats rounded)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, digits) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), digits)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return round(float(value), digits) if math.isfinite(value) else None
    return value
