"""Diffusion Policy (Chi et al., 2023), sized for a CPU: camera image and joint state in, a chunk of
future joint position commands out.

- Observation encoder: a small CNN with GroupNorm and a spatial softmax (keypoints) per frame of an
  ``obs_horizon`` window, concatenated with the normalised joint positions. With
  ``image_encoder: world_model`` the first layers are a world model's frozen encoder (its weights
  copied into the policy's checkpoint) and only a small head on its standardised latent is
  trained (two convs and an MLP over the flattened map). Measured on five training demos after
  1000 steps: shuffling the images across a batch left the spatial-softmax CNN's denoising error
  unchanged (it had not yet learnt to look), while this head's rose by 40 %. With
  ``image_encoder: pose`` the image is read by push_t's pixel pose estimator (the one the scorer
  and the pixel expert use, not learned) and an MLP embeds the T's pose relative to the goal:
  Diffusion Policy's low-dimensional Push-T variant, with the keypoints read from the image.
- Denoiser: a conditional 1-D UNet over the action chunk (``pred_horizon`` x joints), every residual
  block FiLM-modulated by the diffusion step embedding and the observation features.
- Noise schedules from ``diffusers``: DDPM (squared-cosine betas, epsilon prediction) for training,
  DDIM with few steps for inference.

The chunk is predicted relative to the current joint positions (``action_relative``): a command
differs from the joints by a few hundredths of a radian per step, small against the whole joint
range that absolute targets are scaled by. Joint positions and the (relative) action targets are
scaled to [-1, 1] by the training data's range, the targets per step of the chunk
(``action_range: step``): the next command is a few hundredths of a radian from the arm, the 16th
up to 1.5 rad when the expert circles the T, and one range for the whole chunk left the next
commands at a fortieth of the scale, where a sample's spread (0.07 rad at 16,000 steps, twice the
typical step) is larger than the command. No ROS here.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class PolicyCheckpointError(ValueError):
    """A policy checkpoint is missing, corrupt or does not match its config."""


@dataclasses.dataclass
class PolicyConfig:
    joints: int = 3
    image_size: int = 64
    obs_horizon: int = 2
    pred_horizon: int = 16
    action_horizon: int = 8  # commands executed from each predicted chunk before re-planning
    channels: tuple[int, ...] = (32, 64, 64)
    keypoints: int = 32
    feature_dim: int = 64
    unet_dims: tuple[int, ...] = (64, 128)
    step_embed_dim: int = 64
    kernel_size: int = 5
    train_timesteps: int = 100
    inference_steps: int = 10
    # Targets are commands minus the newest observed joint positions (False: absolute commands, as
    # every checkpoint from before this field predicted).
    action_relative: bool = True
    # "step": the targets' range per joint and step of the chunk (action_low/high are pred_horizon
    # lists of per-joint values); "joint": one range per joint over the whole chunk (every
    # checkpoint from before this field).
    action_range: str = "step"
    # "cnn": the image encoder is trained with the policy; "world_model": a world model's frozen
    # encoder (its ModelConfig in world_model_config) and a trained head on the latent; "pose": the
    # pixel pose estimator of push_t (for the camera of the robot profile ``robot``) and an MLP.
    image_encoder: str = "cnn"
    world_model_config: dict = dataclasses.field(default_factory=dict)
    robot: str = "reference_arm"
    # Normalisation: per-joint (low, high) of joint positions and of actions in the training data.
    joint_low: list[float] = dataclasses.field(default_factory=lambda: [-1.0] * 3)
    joint_high: list[float] = dataclasses.field(default_factory=lambda: [1.0] * 3)
    action_low: list = dataclasses.field(default_factory=lambda: [-1.0] * 3)  # of the targets (see action_range)
    action_high: list = dataclasses.field(default_factory=lambda: [1.0] * 3)
    joint_names: list[str] = dataclasses.field(default_factory=list)
    control_rate_hz: float = 10.0
    # Joints the policy never reads (the middle of their range stands in, in training and at run
    # time): inputs a backend does not reproduce, such as the reference arm's wrist twist under contact.
    masked_joints: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "PolicyConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise PolicyCheckpointError(f"unknown policy config keys {sorted(unknown)}")
        data = dict(data)
        data.setdefault("action_relative", False)  # checkpoints written before the field existed
        data.setdefault("action_range", "joint")
        for key in ("channels", "unet_dims"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)


class SpatialSoftmax(nn.Module):
    """Feature map (B, C, H, W) -> expected (x, y) of each of ``keypoints`` attention maps."""

    def __init__(self, channels: int, keypoints: int, height: int, width: int):
        super().__init__()
        self.project = nn.Conv2d(channels, keypoints, 1)
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
        self.register_buffer("grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attention = self.project(x).flatten(2).softmax(dim=-1)  # (B, K, HW)
        return (attention @ self.grid).flatten(1)  # (B, 2K)


class ImageEncoder(nn.Module):
    def __init__(self, config: PolicyConfig):
        super().__init__()
        layers, c_in, size = [], 3, config.image_size
        for c in config.channels:  # each halves the resolution: 64 -> 32 -> 16 -> 8
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1), nn.GroupNorm(8, c), nn.Mish()]
            c_in, size = c, (size + 1) // 2
        self.conv = nn.Sequential(*layers)
        self.keypoints = SpatialSoftmax(c_in, config.keypoints, size, size)
        self.out = nn.Sequential(nn.Linear(2 * config.keypoints, config.feature_dim), nn.Mish())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> features (B, feature_dim)."""
        x = images.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        return self.out(self.keypoints(self.conv(x)))


class LatentEncoder(nn.Module):
    """A world model's encoder, frozen, then a trained head (two convs, an MLP) on its standardised latent.

    Takes uint8 images (B, H, W, 3) or, to train fast, latents the frozen part already computed
    (float, channels last: (B, h, w, C))."""

    def __init__(self, config: PolicyConfig):
        super().__init__()
        from iws_world_model.config import ConfigError, model_config_from_dict
        from iws_world_model.networks import Encoder

        try:
            world = model_config_from_dict(config.world_model_config, "policy world_model_config")
        except ConfigError as exc:
            raise PolicyCheckpointError(str(exc)) from exc
        if world.image_size != config.image_size:
            raise PolicyCheckpointError(f"world-model encoder takes {world.image_size} px images, the policy "
                                        f"{config.image_size} px")
        self.pretrained = Encoder(world).requires_grad_(False)
        c, size = config.channels[-1], world.latent_size
        # The latent is mostly the static table: the head sees it standardised by the training
        # frames' per-pixel mean and per-channel spread, else the arm and object are a small ripple
        # on a constant (a spatial softmax on the raw latent kept uniform attention).
        self.register_buffer("latent_mean", torch.zeros(size, size, world.latent_channels))
        self.register_buffer("latent_std", torch.ones(world.latent_channels))
        self.image_size, self.downsample = world.image_size, world.image_size // size
        self.head = nn.Sequential(nn.Conv2d(world.latent_channels, c, 3, padding=1), nn.GroupNorm(8, c), nn.Mish(),
                                  nn.Conv2d(c, c // 2, 3, stride=2, padding=1), nn.GroupNorm(8, c // 2), nn.Mish())
        half = (size + 1) // 2
        self.out = nn.Sequential(nn.Flatten(), nn.Linear(c // 2 * half * half, 4 * config.feature_dim), nn.Mish(),
                                 nn.Linear(4 * config.feature_dim, config.feature_dim), nn.Mish())

    @torch.no_grad()
    def latents(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> the frozen encoder's latent, channels last (B, h, w, C)."""
        from iws_world_model.world_model import images_to_tensor  # the world model's own preprocessing

        x = images_to_tensor(images, self.image_size, images.device)
        return self.pretrained(x).permute(0, 2, 3, 1).contiguous()

    def set_statistics(self, latents: torch.Tensor) -> None:
        """Standardisation from the training frames' latents (N, h, w, C)."""
        latents = latents.float()
        self.latent_mean.copy_(latents.mean(0))
        self.latent_std.copy_((latents - self.latent_mean).flatten(0, 2).std(0).clamp(min=1e-4))

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        latents = self.latents(observations) if observations.dtype == torch.uint8 else observations.float()
        latents = (latents - self.latent_mean) / self.latent_std
        return self.out(self.head(latents.permute(0, 3, 1, 2)))


POSE_SCALE_M = 0.1  # the T's offset from the goal is embedded in units of 10 cm


class PoseEncoder(nn.Module):
    """push_t's pixel pose estimator, fixed, then a trained MLP on the T's pose relative to the goal.

    The policy sees the T as the pixel expert it imitates does, to a fraction of a pixel (at the
    same training budget it did not make the policies succeed more often than a learnt encoder:
    docs/results/policy_pose/README.md). Features
    per frame: the offset from the goal (x, y in units of ``POSE_SCALE_M``), cos and sin of the yaw
    relative to the goal's, and 1; all zero while the T is not found. Takes uint8 images
    (B, H, W, 3) or those features (float, (B, 5)) computed once for training."""

    FEATURES = 5

    def __init__(self, config: PolicyConfig):
        super().__init__()
        from iws_common.profile import load_profile
        from iws_reference_robot.perception import PushTPoseEstimator

        try:
            profile = load_profile(config.robot)
        except Exception as exc:  # a missing or malformed profile: name it, whatever the parser raised
            raise PolicyCheckpointError(f"the pose encoder's robot profile {config.robot!r}: {exc}") from exc
        self.estimator = PushTPoseEstimator(profile)
        self.out = nn.Sequential(nn.Linear(self.FEATURES, config.feature_dim), nn.Mish(),
                                 nn.Linear(config.feature_dim, config.feature_dim), nn.Mish())

    @torch.no_grad()
    def latents(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> pose features (B, 5) (the name matches ``LatentEncoder``'s)."""
        goal = self.estimator.goal
        rows = np.zeros((len(images), self.FEATURES), np.float32)
        for row, image in zip(rows, images.cpu().numpy()):
            estimate = self.estimator.estimate(image)
            if estimate.found:
                yaw = estimate.pose[2] - goal[2]
                row[:] = [*((estimate.pose[:2] - goal[:2]) / POSE_SCALE_M), math.cos(yaw), math.sin(yaw), 1.0]
        return torch.from_numpy(rows).to(images.device)

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        features = self.latents(observations) if observations.dtype == torch.uint8 else observations.float()
        return self.out(features)


ENCODERS = {"cnn": ImageEncoder, "world_model": LatentEncoder, "pose": PoseEncoder}


def step_embedding(steps: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=steps.device) / max(half - 1, 1))
    angles = steps.float()[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int):
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2), nn.GroupNorm(8, c_out), nn.Mish())

    def forward(self, x):
        return self.block(x)


class FiLMResidualBlock(nn.Module):
    """Two conv blocks; the condition scales and shifts the first one's output (FiLM)."""

    def __init__(self, c_in: int, c_out: int, cond_dim: int, kernel: int):
        super().__init__()
        self.first, self.second = ConvBlock(c_in, c_out, kernel), ConvBlock(c_out, c_out, kernel)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * c_out))
        self.skip = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x, cond):
        scale, shift = self.film(cond).unsqueeze(-1).chunk(2, dim=1)
        return self.second(self.first(x) * (1 + scale) + shift) + self.skip(x)


class ConditionalUnet1D(nn.Module):
    """Noisy action chunk (B, T, J), diffusion step (B,), condition (B, C) -> predicted noise."""

    def __init__(self, joints: int, cond_dim: int, dims: tuple[int, ...], step_dim: int, kernel: int):
        super().__init__()
        self.step_mlp = nn.Sequential(nn.Linear(step_dim, 4 * step_dim), nn.Mish(), nn.Linear(4 * step_dim, step_dim))
        self.step_dim = step_dim
        cond = cond_dim + step_dim
        widths = [joints, *dims]
        self.down = nn.ModuleList()
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            last = i == len(dims) - 1
            self.down.append(nn.ModuleList([FiLMResidualBlock(a, b, cond, kernel), FiLMResidualBlock(b, b, cond, kernel),
                                            nn.Identity() if last else nn.Conv1d(b, b, 3, stride=2, padding=1)]))
        self.mid = nn.ModuleList([FiLMResidualBlock(dims[-1], dims[-1], cond, kernel) for _ in range(2)])
        self.up = nn.ModuleList()
        for i, (a, b) in enumerate(reversed(list(zip(widths[1:-1], widths[2:])))):
            self.up.append(nn.ModuleList([FiLMResidualBlock(2 * b, a, cond, kernel), FiLMResidualBlock(a, a, cond, kernel),
                                          nn.ConvTranspose1d(a, a, 4, stride=2, padding=1)]))
        self.final = nn.Sequential(ConvBlock(dims[0], dims[0], kernel), nn.Conv1d(dims[0], joints, 1))

    def forward(self, actions, steps, cond):
        x = actions.transpose(1, 2)  # (B, J, T)
        c = torch.cat([self.step_mlp(step_embedding(steps, self.step_dim)), cond], dim=-1)
        skips = []
        for first, second, down in self.down:
            x = second(first(x, c), c)
            skips.append(x)
            x = down(x)
        for block in self.mid:
            x = block(x, c)
        for first, second, up in self.up:
            x = torch.cat([x, skips.pop()], dim=1)
            x = up(second(first(x, c), c))
        return self.final(x).transpose(1, 2)


class DiffusionPolicy(nn.Module):
    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.config = config
        if config.action_range not in ("step", "joint"):
            raise PolicyCheckpointError(f"action_range must be 'step' or 'joint', got {config.action_range!r}")
        if config.image_encoder not in ENCODERS:
            raise PolicyCheckpointError(f"image_encoder must be one of {sorted(ENCODERS)}, got {config.image_encoder!r}")
        self.encoder = ENCODERS[config.image_encoder](config)
        cond_dim = config.obs_horizon * (config.feature_dim + config.joints)
        self.unet = ConditionalUnet1D(config.joints, cond_dim, config.unet_dims, config.step_embed_dim, config.kernel_size)
        for name in ("joint_low", "joint_high", "action_low", "action_high"):
            self.register_buffer(name, torch.tensor(getattr(config, name), dtype=torch.float32), persistent=False)
        # Joints read at the middle of their range whatever they read (config.masked_joints, and at run
        # time PolicyRunner's mask_joints: an ablation, `iws evaluate --mask-joint`).
        self.register_buffer("masked_joints", self.joint_mask(config.masked_joints), persistent=False)
        self._train_scheduler = self._inference_scheduler = None

    def joint_mask(self, names) -> torch.Tensor:
        """Per joint, whether it is among ``names`` (a clear error for a name the policy lacks)."""
        unknown = set(names) - set(self.config.joint_names)
        if unknown:
            raise ValueError(f"cannot mask {sorted(unknown)}: the policy's joints are {self.config.joint_names}")
        return torch.tensor([n in names for n in self.config.joint_names] or [False] * self.config.joints)

    # -- normalisation ---------------------------------------------------------------------
    @staticmethod
    def _scale(x, low, high):
        return 2.0 * (x - low) / torch.clamp(high - low, min=1e-6) - 1.0

    @staticmethod
    def _unscale(x, low, high):
        return (x + 1.0) / 2.0 * torch.clamp(high - low, min=1e-6) + low

    def condition(self, images: torch.Tensor, joints: torch.Tensor) -> torch.Tensor:
        """images uint8 (B, To, H, W, 3) (or a LatentEncoder's latents), joints (B, To, J) -> (B, To * (F + J)).

        Joints are scaled by the demonstrations' range and not clamped. The reference arm's wrist,
        never commanded, twists by a fraction of a milliradian when the pusher meets the T, and
        real-demo policies act on that: read at the middle of its range instead, r64k won 1 of 30
        on the robot, not 12 (docs/results/policy_pose/README.md, "The wrist")."""
        b, to = images.shape[:2]
        features = self.encoder(images.reshape(b * to, *images.shape[2:])).reshape(b, to, -1)
        joints = self._scale(joints, self.joint_low, self.joint_high).masked_fill(self.masked_joints, 0.0)
        return torch.cat([features, joints], dim=-1).flatten(1)

    # -- schedulers (diffusers) ------------------------------------------------------------
    @property
    def train_scheduler(self):
        if self._train_scheduler is None:
            from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
            self._train_scheduler = DDPMScheduler(num_train_timesteps=self.config.train_timesteps,
                                                  beta_schedule="squaredcos_cap_v2", clip_sample=True,
                                                  prediction_type="epsilon")
        return self._train_scheduler

    @property
    def inference_scheduler(self):
        if self._inference_scheduler is None:
            from diffusers.schedulers.scheduling_ddim import DDIMScheduler
            self._inference_scheduler = DDIMScheduler(num_train_timesteps=self.config.train_timesteps,
                                                      beta_schedule="squaredcos_cap_v2", clip_sample=True,
                                                      prediction_type="epsilon")
        return self._inference_scheduler

    def targets(self, joints: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """What the denoiser models, unscaled: the commands, minus the newest joints if relative."""
        return actions - joints[:, -1:, :] if self.config.action_relative else actions

    def loss(self, images, joints, actions, generator=None) -> torch.Tensor:
        """Epsilon-prediction MSE on a batch: images (B, To, H, W, 3), joints (B, To, J), actions (B, Tp, J)."""
        cond = self.condition(images, joints)
        target = self._scale(self.targets(joints, actions), self.action_low, self.action_high)
        noise = torch.randn(target.shape, generator=generator, device=target.device)
        steps = torch.randint(0, self.config.train_timesteps, (target.shape[0],), generator=generator, device=target.device)
        noisy = self.train_scheduler.add_noise(target, noise, steps)
        return F.mse_loss(self.unet(noisy, steps, cond), noise)

    @torch.inference_mode()
    def predict(self, images, joints, generator=None) -> torch.Tensor:
        """A chunk of ``pred_horizon`` joint commands (B, Tp, J) from observations, by DDIM."""
        cond = self.condition(images, joints)
        scheduler = self.inference_scheduler
        scheduler.set_timesteps(self.config.inference_steps)
        x = torch.randn((cond.shape[0], self.config.pred_horizon, self.config.joints), generator=generator)
        for t in scheduler.timesteps:
            steps = torch.full((x.shape[0],), int(t), dtype=torch.long)
            x = scheduler.step(self.unet(x, steps, cond), t, x, generator=generator).prev_sample
        chunk = self._unscale(x.clamp(-1, 1), self.action_low, self.action_high)
        return chunk + joints[:, -1:, :].float() if self.config.action_relative else chunk


def save_policy(policy: DiffusionPolicy, directory: str | Path, extra: dict | None = None) -> Path:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}, str(tmp))
    tmp.replace(directory / WEIGHTS_FILE)
    (directory / CONFIG_FILE).write_text(json.dumps({"policy": policy.config.to_json(), **(extra or {})}, indent=2) + "\n")
    return directory


def load_policy(directory: str | Path) -> DiffusionPolicy:
    """A trained policy from a checkpoint directory, with a clear error for anything wrong."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise PolicyCheckpointError(f"{directory}: not a policy checkpoint (needs {CONFIG_FILE} and {WEIGHTS_FILE}; "
                                    "train one with `iws policy train`)")
    try:
        config = PolicyConfig.from_json(json.loads(config_path.read_text())["policy"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise PolicyCheckpointError(f"{config_path}: corrupt policy config: {exc}") from exc
    policy = DiffusionPolicy(config)
    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise PolicyCheckpointError(f"{weights_path}: corrupt weights: {exc}") from exc
    try:
        policy.load_state_dict(state)
    except RuntimeError as exc:
        raise PolicyCheckpointError(f"{weights_path}: does not match {config_path}: {str(exc)[:300]}") from exc
    return policy.eval()


class PolicyRunner:
    """Observation history in, one joint command per control step out: predicts a chunk, executes
    its first ``action_horizon`` commands, then re-plans (receding horizon).

    ``action_horizon`` is a run-time choice (Diffusion Policy's n_action_steps): None takes the
    checkpoint's; fewer commands per plan re-plan more often from fresher images. ``mask_joints``
    names joints the policy reads at the middle of their trained range whatever they read: an
    ablation that asks whether a policy acts on a joint."""

    def __init__(self, policy: DiffusionPolicy, seed: int = 0, action_horizon: int | None = None,
                 mask_joints: tuple[str, ...] = ()):
        self.policy = policy
        self.config = policy.config
        self.action_horizon = self.config.action_horizon if action_horizon is None else int(action_horizon)
        if not 1 <= self.action_horizon <= self.config.pred_horizon:
            raise ValueError(f"action horizon {action_horizon} outside 1..{self.config.pred_horizon} "
                             "(the policy's predicted chunk)")
        policy.masked_joints.copy_(policy.joint_mask({*self.config.masked_joints, *mask_joints}))
        self.joint_low, self.joint_high = np.asarray(self.config.joint_low), np.asarray(self.config.joint_high)
        self.generator = torch.Generator().manual_seed(seed)
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        """A new episode: no history, no plan; ``seed`` reseeds the sampler (the same episode again)."""
        if seed is not None:
            self.generator.manual_seed(seed)
        self.images: list[np.ndarray] = []
        self.joints: list[np.ndarray] = []
        self.plan: list[np.ndarray] = []
        self.frames = 0
        self.frames_outside = np.zeros(self.config.joints, dtype=np.int64)  # per joint: read outside its trained range

    def outside_training_range(self, joint_positions: np.ndarray) -> np.ndarray:
        """Per joint: whether this reading lies outside the range the policy was trained on."""
        return (joint_positions < self.joint_low) | (joint_positions > self.joint_high)

    def _resize(self, image: np.ndarray) -> np.ndarray:
        size = self.config.image_size
        if image.shape[:2] == (size, size):
            return image
        t = torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1)[None].float()
        t = F.interpolate(t, size=(size, size), mode="area")
        return t[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()

    def act(self, image: np.ndarray, joint_positions: np.ndarray) -> np.ndarray:
        self.images.append(self._resize(image))
        self.joints.append(np.asarray(joint_positions, dtype=np.float32))
        self.frames += 1
        self.frames_outside += self.outside_training_range(self.joints[-1])
        to = self.config.obs_horizon
        self.images, self.joints = self.images[-to:], self.joints[-to:]
        if not self.plan:
            images = np.stack([self.images[0]] * (to - len(self.images)) + self.images)
            joints = np.stack([self.joints[0]] * (to - len(self.joints)) + self.joints)
            chunk = self.policy.predict(torch.from_numpy(images)[None], torch.from_numpy(joints)[None],
                                        generator=self.generator)[0].numpy()
            # chunk[0] is the command for the current frame (actions[i] acts from frame i on).
            self.plan = list(chunk[: self.action_horizon])
        return self.plan.pop(0).astype(np.float64)
