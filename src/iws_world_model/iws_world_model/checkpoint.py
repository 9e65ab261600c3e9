"""A world-model checkpoint is a directory: ``model.safetensors`` (weights) + ``config.json``
(model config, action/joint normalisation, dataset info, training stats).

Loading checks everything it can and raises CheckpointError naming the file and the problem, so a
node or an eval fails at start with a sentence instead of a stack trace deep inside torch.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import ConfigError, ModelConfig, model_config_from_dict
from .networks import WorldModelNetwork

FORMAT = "iws-world-model/1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"
NORMALIZATION_KEYS = ("action_low", "action_high", "joint_mean", "joint_std")
# Model config keys that change how trained weights are run, not what they are.
INFERENCE_ONLY_KEYS = ("snap_threshold", "frozen_noise")


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, corrupt or does not match its config."""


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".partial")
    write(tmp)
    os.replace(tmp, path)


def save(directory: str | Path, network: WorldModelNetwork, normalization: dict, dataset: dict | None = None,
         training: dict | None = None) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in network.state_dict().items()}
    _atomic_write(directory / WEIGHTS, lambda p: save_file(state, str(p), metadata={"format": FORMAT}))
    meta = {"format": FORMAT, "model": dataclasses.asdict(network.config), "joint_dim": network.joint_dim,
            "normalization": normalization, "dataset": dataset or {}, "training": training or {},
            "parameters": network.parameter_counts()}
    _atomic_write(directory / CONFIG, lambda p: p.write_text(json.dumps(meta, indent=1)))
    return directory


def weights_digest(directory: str | Path) -> str:
    """Short SHA-256 of a checkpoint's weights: results computed with a model name the weights,
    not the path (models/push_t is replaced when a better default model is trained)."""
    import hashlib

    path = Path(directory) / WEIGHTS
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the weights ({exc.strerror or exc})") from exc


def model_identity(directory: str | Path) -> str:
    """The weights' digest, plus each inference-only setting of the config that is not its default
    (``abcd...+frozen_noise=decoder``): two results came from the same model when the same weights ran
    the same way. A model at the defaults is named by its digest alone, as before these keys."""
    digest = weights_digest(directory)
    model, default = read_meta(directory).get("model", {}), ModelConfig()
    changed = [f"{key}={model[key]}" for key in INFERENCE_ONLY_KEYS
               if key in model and model[key] != getattr(default, key)]
    return "+".join([digest, *changed])


def read_meta(directory: str | Path) -> dict:
    directory = Path(directory)
    path = directory / CONFIG
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such checkpoint directory")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (a checkpoint holds {WEIGHTS} and {CONFIG})")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: corrupt JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r}")
    for key in ("model", "joint_dim", "normalization"):
        if key not in meta:
            raise CheckpointError(f"{path}: missing key {key!r}")
    joint_dim = meta["joint_dim"]
    # joint_step_std: only in checkpoints since the servo joint head (which refuses to load without it)
    for key in NORMALIZATION_KEYS + tuple(k for k in ("joint_step_std",) if k in meta["normalization"]):
        values = meta["normalization"].get(key)
        if not isinstance(values, list) or len(values) != joint_dim:
            raise CheckpointError(f"{path}: normalization.{key} must be a list of {joint_dim} numbers, got {values!r}")
    return meta


def load(directory: str | Path, device: str | torch.device = "cpu") -> tuple[WorldModelNetwork, dict]:
    """The network (eval mode, on ``device``) and the checkpoint's config.json contents."""
    directory = Path(directory)
    meta = read_meta(directory)
    try:
        cfg: ModelConfig = model_config_from_dict(meta["model"], f"{directory / CONFIG}: model")
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights}: corrupt or truncated safetensors file ({exc})") from exc
    network = WorldModelNetwork(cfg, int(meta["joint_dim"]))
    expected = network.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
             if k in state and state[k].shape != v.shape]
    if missing or unexpected or wrong:
        parts = []
        if wrong:
            parts.append(f"{len(wrong)} tensor(s) of the wrong shape (file vs config), e.g. {wrong[:3]}")
        if missing:
            parts.append(f"{len(missing)} missing, e.g. {missing[:3]}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected, e.g. {unexpected[:3]}")
        raise CheckpointError(f"{weights}: weights do not match the model in {CONFIG}: " + "; ".join(parts))
    network.load_state_dict(state)
    return network.to(device).eval(), meta
