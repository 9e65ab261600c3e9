"""Model and training configuration: dataclasses loaded from `config/models/*.yaml`.

A YAML file has two sections, ``model`` and ``train``; unknown keys and bad values fail early with
the file and key named, so a typo never silently trains the wrong model.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml


# What a world draws once per reset instead of every step (WorldModel): nothing, the decoder's
# noise, or the decoder's and the dynamics' target.
FROZEN_NOISE = ("none", "decoder", "all")


class ConfigError(ValueError):
    """A model/training configuration is missing, malformed or inconsistent."""


@dataclasses.dataclass
class ModelConfig:
    image_size: int = 64                    # model resolution (square); camera frames are area-resized to it
    latent_channels: int = 4
    encoder_channels: list[int] = dataclasses.field(default_factory=lambda: [32, 64])  # one stride-2 stage each
    decoder_channels: int = 16              # U-Net base width
    decoder_mult: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 2])
    decoder_blocks: int = 1                 # res blocks per level
    decoder_attention: bool = True          # self-attention in the U-Net middle
    decode_steps: int = 1                   # consistency jumps at inference (1-3)
    dynamics_steps: int = 1                 # dynamics calls per next latent (1: the paper's one jump; 2-3 re-noise between)
    dynamics_channels: list[int] = dataclasses.field(default_factory=lambda: [64, 64, 64])  # one block each
    dynamics_heads: int = 4
    dynamics_spatial_attention: bool = False  # one per-frame spatial attention after the last block
    dynamics_objective: str = "consistency"   # "consistency" or "mse" (the deterministic baseline)
    dynamics_skip: str = "none"             # "last": next latent = newest history latent + output; "gated": + a per-cell gate on it
    dynamics_patch: int = 1                 # >1: the dynamics runs on p x p patches of the latent (a finer latent at the same cost)
    window: int = 4                         # K: history frames the newest frame attends to
    embed_dim: int = 64                     # noise-level and action embedding width
    action_hidden: int = 128
    action_map_channels: int = 0            # >0: the action also enters as a spatial map of this many channels
    action_keypoints: int = 0               # >0: the action also places this many learnt points, drawn at sub-cell precision
    history_level: int = 15                 # noise label of (clean) history frames at inference
    history_noise_max: int = 99             # training noises history at t = s in 1..this
    snap_threshold: float = 0.0             # inference: a latent cell that, with its neighbours, moves less than this keeps its value (0: off)
    frozen_noise: str = "none"              # inference: "decoder" / "all": one noise draw per world and reset for the decoder / also the dynamics
    joint_head_channels: int = 32
    joint_head_hidden: int = 128
    joint_head_action: bool = False         # the joint head also reads the command that produced the frame
    joint_head_servo: bool = False          # the joint head predicts the step from the last joints, as the arm's drive moves (needs joint_head_action)
    timesteps: int = 1000
    streaming: bool = True                  # key/value cache; False recomputes the window every step (paper)

    @property
    def latent_size(self) -> int:
        return self.image_size // 2 ** len(self.encoder_channels)

    def validate(self, where: str = "model") -> None:
        def bad(key: str, why: str):
            raise ConfigError(f"{where}.{key}: {why}")
        for key in ("image_size", "latent_channels", "decoder_channels", "decoder_blocks", "window",
                    "embed_dim", "action_hidden", "joint_head_channels", "joint_head_hidden", "dynamics_heads"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                bad(key, f"must be a positive integer, got {getattr(self, key)!r}")
        for key in ("encoder_channels", "decoder_mult", "dynamics_channels"):
            value = getattr(self, key)
            if not isinstance(value, list) or not value or not all(isinstance(v, int) and v > 0 for v in value):
                bad(key, f"must be a non-empty list of positive integers, got {value!r}")
        if not isinstance(self.action_map_channels, int) or self.action_map_channels < 0:
            bad("action_map_channels", f"must be 0 (off) or a positive integer, got {self.action_map_channels!r}")
        if isinstance(self.action_keypoints, bool) or not isinstance(self.action_keypoints, int) or self.action_keypoints < 0:
            bad("action_keypoints", f"must be 0 (off) or a positive integer, got {self.action_keypoints!r}")
        down = 2 ** max(len(self.encoder_channels), len(self.decoder_mult) - 1)
        if self.image_size % down:
            bad("image_size", f"{self.image_size} must be divisible by {down} (encoder and decoder downsampling)")
        for key, widths in (("decoder_channels", [self.decoder_channels * m for m in self.decoder_mult]),
                            ("dynamics_channels", self.dynamics_channels), ("encoder_channels", self.encoder_channels)):
            if any(w % 8 for w in widths):
                bad(key, f"widths {widths} must be multiples of 8 (GroupNorm)")
        if any(c % self.dynamics_heads for c in self.dynamics_channels):
            bad("dynamics_heads", f"{self.dynamics_heads} must divide every dynamics width {self.dynamics_channels}")
        if self.decode_steps not in (1, 2, 3):
            bad("decode_steps", f"must be 1, 2 or 3, got {self.decode_steps!r}")
        if not isinstance(self.dynamics_patch, int) or self.dynamics_patch < 1 or self.latent_size % self.dynamics_patch:
            bad("dynamics_patch", f"must be a positive integer dividing the latent size {self.latent_size}, "
                                  f"got {self.dynamics_patch!r}")
        if self.dynamics_steps not in (1, 2, 3):
            bad("dynamics_steps", f"must be 1, 2 or 3, got {self.dynamics_steps!r}")
        if self.dynamics_objective not in ("consistency", "mse"):
            bad("dynamics_objective", f"must be 'consistency' or 'mse', got {self.dynamics_objective!r}")
        if self.dynamics_skip not in ("none", "last", "gated"):
            bad("dynamics_skip", f"must be 'none', 'last' or 'gated', got {self.dynamics_skip!r}")
        if self.dynamics_objective == "mse" and self.dynamics_steps != 1:
            bad("dynamics_steps", "the deterministic (mse) dynamics predicts in one call; dynamics_steps must be 1")
        if self.joint_head_servo and not self.joint_head_action:
            bad("joint_head_servo", "the servo joint head reads the command that produced the frame: set joint_head_action")
        if self.joint_head_servo and self.window < 2:
            bad("joint_head_servo", "the servo joint head learns from the two frames before each: window must be >= 2")
        if self.timesteps != 1000:
            bad("timesteps", "only the T=1000 schedule of the method is supported")
        if not 1 <= self.history_noise_max < self.timesteps:
            bad("history_noise_max", f"history noise levels must lie in 1..{self.timesteps - 1}, got {self.history_noise_max}")
        if not 0 <= self.history_level < self.timesteps:
            bad("history_level", f"the history's noise label must lie in 0..{self.timesteps - 1}, got {self.history_level}")
        if (isinstance(self.snap_threshold, bool) or not isinstance(self.snap_threshold, (int, float))
                or not 0 <= self.snap_threshold < 2):
            bad("snap_threshold", f"must be a number in [0, 2) (0: off; latent cells are unit vectors), "
                                  f"got {self.snap_threshold!r}")
        if self.frozen_noise not in FROZEN_NOISE:
            bad("frozen_noise", f"must be one of {', '.join(FROZEN_NOISE)}, got {self.frozen_noise!r}")


@dataclasses.dataclass
class StageConfig:
    steps: int = 1000
    lr: float = 2e-4
    batch_size: int = 16
    warmup: int = 100
    final_lr_fraction: float = 1.0  # after warmup, cosine decay to lr * this (1.0 keeps lr constant)


@dataclasses.dataclass
class TrainConfig:
    seed: int = 0
    stage1: StageConfig = dataclasses.field(default_factory=StageConfig)  # encoder + decoder
    stage2: StageConfig = dataclasses.field(default_factory=StageConfig)  # dynamics + joint head
    stage3: StageConfig = dataclasses.field(default_factory=lambda: StageConfig(lr=2e-5))  # decoder fine-tune
    # dynamics (+ joint head) once more, on deep chains of its own predictions: plain stage-2 steps
    # first and chains last buy more in the same time than either alone (docs/architecture.md,
    # self-forcing). 0 steps: no stage 4.
    stage4: StageConfig = dataclasses.field(default_factory=lambda: StageConfig(steps=0, lr=1e-4))
    # the joint head alone over a trained model (everything else frozen): a new joint head for a
    # model whose dynamics is already trained. 0 steps: no stage 5 in --stage all.
    stage5: StageConfig = dataclasses.field(default_factory=lambda: StageConfig(steps=0, lr=1e-3))
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    terminal_fraction: float = 0.5   # stage 1: share of the batch trained on the inference jumps
    dynamics_jump_fraction: float = 0.0  # stage 2: share of the batch whose target starts at 333/499/666, not 999
    dynamics_jump_levels: str = "inference"  # where that share starts: "inference" (333/499/666) or "uniform" (1..998: a denoiser at every level)
    self_forcing_fraction: float = 0.0   # stage 2 (consistency dynamics): share of the batch whose newest history frames are its own predictions
    self_forcing_frames: int = 2         # how many chained one-jump predictions precede the target; beyond window - 1 the windows grow and the whole history is the model's own
    self_forcing_min_frames: int = 0     # > 0: each batch draws that count uniformly from this..self_forcing_frames (0: always self_forcing_frames)
    stage4_self_forcing_fraction: float = 0.5  # stage 4's self_forcing_fraction (stage 4 is stage 2 with these three)
    stage4_self_forcing_frames: int = 16       # its chain depth: windows of this + 2 frames
    stage4_self_forcing_min_frames: int = 1    # its depth drawn per batch from this..stage4_self_forcing_frames
    dynamics_distance: str = "l2"    # stage 2: "l2" regresses the next latent's mean, "l1" its per-element median (no superposition of outcomes)
    motion_oversample: float = 1.0   # stage 2: windows whose target frame moves the task's object are drawn this many times as often
    motion_task: str = "push_t"      # whose object mask says what moved (iws_reference_robot.perception.OBJECT_MASKS)
    motion_min_pixels: int = 6       # object-mask pixels (at the dataset's image size) that must change from the last history frame
    goal_undersample: float = 1.0    # stage 2: windows whose target frame shows the goal covered (the task done) are drawn this fraction as often
    goal_covered_fraction: float = 0.8  # covered: at most 1 - this of the goal's pixels (its 99th-percentile count in the data) visible
    object_loss_weight: float = 0.0  # stage 2: latent cells on the task's object (where it is in the target or was in the last history frame) weigh 1 + this in the dynamics loss
    dynamics_pixel_weight: float = 0.0  # stages 2 and 4: + this x the pixel MSE of the predicted latent decoded (frozen decoder) against the real frame
    # stages 2 and 4: + a critic's verdict on the predicted latent (a patch critic trained beside the
    # dynamics to tell real next latents from predicted ones, both after the real previous latent),
    # scaled to this fraction of the latent loss's gradient at the dynamics' output layer. 0: off.
    dynamics_adversarial_weight: float = 0.0
    critic_lr: float = 4e-4
    critic_warmup: int = 200  # critic steps before its verdict reaches the dynamics (a fresh critic's pull is noise)
    stage3_latent_noise: float = 0.02
    stage3_predicted_fraction: float = 0.0  # stage 3: share of the batch decoded from the dynamics' own prediction of the frame, not the encoder's latent
    stage3_chain_frames: int = 4            # that prediction ends a chain of 1..this many own predictions (drawn per batch)
    joint_loss_weight: float = 1.0
    joint_latent_noise: float = 0.02  # the joint head must read predicted (imperfect) latents
    cache_latents: bool = True       # stage 2: encode every frame once before the stage (encoder is frozen)
    checkpoint_every: int = 500
    log_every: int = 10
    num_workers: int = 0

    def validate(self, where: str = "train") -> None:
        for name in ("stage1", "stage2", "stage3", "stage4", "stage5"):
            stage = getattr(self, name)
            for key in ("steps", "batch_size"):
                if not isinstance(getattr(stage, key), int) or getattr(stage, key) < (0 if key == "steps" else 1):
                    raise ConfigError(f"{where}.{name}.{key}: bad value {getattr(stage, key)!r}")
            if not stage.lr > 0:
                raise ConfigError(f"{where}.{name}.lr: must be positive, got {stage.lr!r}")
            if not 0 < stage.final_lr_fraction <= 1:
                raise ConfigError(f"{where}.{name}.final_lr_fraction: must lie in (0, 1], got {stage.final_lr_fraction!r}")
        for key in ("terminal_fraction", "dynamics_jump_fraction", "self_forcing_fraction", "stage4_self_forcing_fraction",
                    "stage3_predicted_fraction"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"{where}.{key}: must lie in [0, 1], got {getattr(self, key)!r}")
        for key, choices in (("dynamics_jump_levels", ("inference", "uniform")), ("dynamics_distance", ("l2", "l1"))):
            if getattr(self, key) not in choices:
                raise ConfigError(f"{where}.{key}: must be {' or '.join(map(repr, choices))}, got {getattr(self, key)!r}")
        if not self.motion_oversample >= 1:
            raise ConfigError(f"{where}.motion_oversample: must be >= 1 (1: off), got {self.motion_oversample!r}")
        if not self.dynamics_pixel_weight >= 0:
            raise ConfigError(f"{where}.dynamics_pixel_weight: must be >= 0 (0: off), got {self.dynamics_pixel_weight!r}")
        if not self.dynamics_adversarial_weight >= 0:
            raise ConfigError(f"{where}.dynamics_adversarial_weight: must be >= 0 (0: off), got {self.dynamics_adversarial_weight!r}")
        if not isinstance(self.critic_warmup, int) or self.critic_warmup < 0:
            raise ConfigError(f"{where}.critic_warmup: must be an integer >= 0, got {self.critic_warmup!r}")
        if not self.critic_lr > 0:
            raise ConfigError(f"{where}.critic_lr: must be positive, got {self.critic_lr!r}")
        if not self.object_loss_weight >= 0:
            raise ConfigError(f"{where}.object_loss_weight: must be >= 0 (0: off), got {self.object_loss_weight!r}")
        for key in ("goal_undersample", "goal_covered_fraction"):
            if not 0 < getattr(self, key) <= 1:
                raise ConfigError(f"{where}.{key}: must lie in (0, 1] (goal_undersample 1: off), got {getattr(self, key)!r}")
        if self.motion_min_pixels < 1:
            raise ConfigError(f"{where}.motion_min_pixels: must be >= 1, got {self.motion_min_pixels!r}")
        for prefix in ("", "stage4_"):
            frames, least = getattr(self, f"{prefix}self_forcing_frames"), getattr(self, f"{prefix}self_forcing_min_frames")
            if frames < 0:
                raise ConfigError(f"{where}.{prefix}self_forcing_frames: must be >= 0, got {frames!r}")
            if not 0 <= least <= frames:
                raise ConfigError(f"{where}.{prefix}self_forcing_min_frames: must lie in [0, {prefix}self_forcing_frames = "
                                  f"{frames}] (0: always {prefix}self_forcing_frames), got {least!r}")
        if self.stage3_chain_frames < 1:
            raise ConfigError(f"{where}.stage3_chain_frames: must be >= 1, got {self.stage3_chain_frames!r}")
        if self.checkpoint_every < 1 or self.log_every < 1:
            raise ConfigError(f"{where}: checkpoint_every and log_every must be >= 1")

    def for_stage(self, stage: int) -> tuple[int, "TrainConfig"]:
        """The objective a stage trains and the settings it trains it with: stage 4 is stage 2's
        objective with stage 4's self-forcing (so ``--stage 4 --init-weights A`` is exactly stage 2
        of a config whose self-forcing keys hold stage 4's, started from A)."""
        if stage != 4:
            return stage, self
        return 2, dataclasses.replace(self, self_forcing_fraction=self.stage4_self_forcing_fraction,
                                      self_forcing_frames=self.stage4_self_forcing_frames,
                                      self_forcing_min_frames=self.stage4_self_forcing_min_frames)


def _build(cls, data: Any, where: str):
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    kwargs = {}
    for key, value in data.items():
        default = getattr(cls(), key)
        if isinstance(default, StageConfig):  # keys left out keep this stage's defaults (stage 3's rate is lower)
            given = _build(StageConfig, value, f"{where}.{key}")
            value = dataclasses.replace(default, **{k: getattr(given, k) for k in (value or {})})
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}.{key}: expected true/false, got {value!r}")
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
            value = float(value)
        elif isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
        kwargs[key] = value
    return cls(**kwargs)


def model_config_from_dict(data: dict, where: str = "model") -> ModelConfig:
    cfg = _build(ModelConfig, data, where)
    cfg.validate(where)
    return cfg


def _merged(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``, mapping by mapping (a stage's keys one by one)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The file's mapping, on top of the file its ``base:`` names (relative to it), if any: a
    variant of a recipe states only what it changes."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file" + (f" (the base of {seen[-1]})" if seen else ""))
    if path.resolve() in seen:
        raise ConfigError(f"{path}: its base: chain comes back to itself ({' -> '.join(map(str, seen))})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with 'model' and 'train'")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base: expected a file name, got {base!r}")
    return _merged(_read_yaml(path.parent / base, seen + (path.resolve(),)), data)


def load_config(path: str | Path) -> tuple[ModelConfig, TrainConfig]:
    """Read a YAML file with ``model:`` and ``train:`` sections (and optionally ``base:``, another
    config file these sections override key by key)."""
    path = Path(path)
    data = _read_yaml(path)
    unknown = sorted(set(data) - {"model", "train", "description"})
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {unknown}; expected 'model', 'train' and 'base'")
    model = model_config_from_dict(data.get("model"), f"{path}: model")
    train = _build(TrainConfig, data.get("train"), f"{path}: train")
    train.validate(f"{path}: train")
    return model, train
