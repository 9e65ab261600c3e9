"""The one session API over a trained world model; the ROS node, eval and benchmarks all use it.

    world = WorldModel.load("runs/push_t", device="cpu", threads=2)
    world.reset(images, joint_positions, actions, seed=0)   # (K,H,W,3) uint8, (K,J), (K,J)
    image, joints = world.step(action)                      # (S,S,3) uint8, (J,) float

``actions[i]`` follows the dataset: the command in force at frame i, applied from frame i to i+1.
``step(a)`` is the frame that command ``a`` produces from the latest frame. Leading batch
dimension (N worlds) on every argument gives N parallel worlds with the same calls.
"""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import checkpoint
from .config import ModelConfig
from .consistency import Schedule, decode_times, gaussian_noise, sample
from .networks import WorldModelNetwork, normalize_latent, servo_features

FROZEN_SEED_SALT = 0x5EED_F0_2E  # frozen noise draws from the reset's seed, apart from the per-step draws


def images_to_tensor(images: np.ndarray | torch.Tensor, size: int, device) -> torch.Tensor:
    """uint8 (..., H, W, 3) -> float (..., 3, size, size) in [-1, 1], area-resized."""
    if not isinstance(images, torch.Tensor):
        images = np.asarray(images)
        images = torch.from_numpy(images if images.flags.writeable else images.copy())
    x = images.to(device)
    lead = x.shape[:-3]
    x = x.reshape(-1, *x.shape[-3:]).permute(0, 3, 1, 2).float().div_(127.5).sub_(1)
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="area")
    return x.reshape(*lead, 3, size, size)


def tensor_to_images(x: torch.Tensor) -> np.ndarray:
    """float (..., 3, H, W) in [-1, 1] -> uint8 (..., H, W, 3)."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(-3, -1).cpu().numpy()


def upscale(image: np.ndarray, height: int, width: int | None = None) -> np.ndarray:
    """Model-resolution uint8 image(s) (..., h, w, 3) -> camera resolution, bilinear."""
    x = torch.from_numpy(np.ascontiguousarray(image))
    lead = x.shape[:-3]
    x = x.reshape(-1, *x.shape[-3:]).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(height, width or height), mode="bilinear", align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).reshape(*lead, height, width or height, 3).numpy()


def next_latent_estimate(config: ModelConfig, schedule: Schedule, x_t: torch.Tensor | None, t: torch.Tensor | None,
                         output: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The dynamics' estimate of the clean next latent from its ``output``: x0 from v at level t (or
    the output itself for the deterministic baseline), plus, by ``dynamics_skip``, the newest history
    latent ``last`` ("last") or ``last`` times a per-cell gate in (0, 1) that the network's extra
    output channel sets ("gated"). With a skip the network need not redraw what nothing touches: an
    untouched cell can stay an exact copy instead of being rebuilt from attention over the history
    each step; the gate lets it redraw where the copy is wrong (the arm, which follows the command).
    Training, self-forcing and inference all go through here."""
    gate = None
    if config.dynamics_skip == "gated":
        output, gate = output[:, :-1], torch.sigmoid(output[:, -1:])
    x0 = output if config.dynamics_objective == "mse" else schedule.x0_from_v(x_t, t, output)
    if config.dynamics_skip == "none":
        return x0
    return x0 + (last if gate is None else gate * last)


class WorldModel:
    def __init__(self, network: WorldModelNetwork, normalization: dict, meta: dict | None = None,
                 device: str | torch.device = "cpu", decode_steps: int | None = None, streaming: bool | None = None,
                 max_command_step=None, dynamics_steps: int | None = None, channels_last: bool | None = None,
                 history_level: int | None = None, reencode: bool = False, snap_threshold: float | None = None,
                 start_history_level: int | None = None, frozen_noise: str | None = None):
        self.device = torch.device(device)
        self.network = network.to(self.device).eval()
        # On the CPU, oneDNN convolutions run faster on channels-last weights: the push_t model steps
        # about 28 % more often per second at batch 1 (docs/benchmarks.md); the numbers agree to float
        # rounding. None: on for the CPU. (The layout changes ``network`` in place, as .to(device) does.)
        self.channels_last = self.device.type == "cpu" if channels_last is None else channels_last
        if self.channels_last:
            self.network.to(memory_format=torch.channels_last)
        self.config: ModelConfig = network.config
        self.meta = meta or {}
        self.schedule = Schedule(self.config.timesteps)
        f = lambda key: torch.tensor(normalization[key], dtype=torch.float32, device=self.device)
        self.action_low, self.action_high = f("action_low"), f("action_high")
        self.joint_mean, self.joint_std = f("joint_mean"), f("joint_std")
        self.servo = self.config.joint_head_servo
        if self.servo and "joint_step_std" not in normalization:
            raise checkpoint.CheckpointError("this model's servo joint head needs normalization.joint_step_std")
        self.joint_step_std = f("joint_step_std") if self.servo else None
        # A servo joint head's state (N, J) each: the joints before the current ones and the
        # command that produced the current frame (set by reset, advanced by step).
        self._joints_before = self._producing_command = None
        self.joint_names = list(normalization.get("joint_names", []))
        self.decode_steps = decode_steps or self.config.decode_steps
        self.dynamics_steps = dynamics_steps or self.config.dynamics_steps
        # The noise level the history is labelled with at inference (training noised it at 1..99):
        # an inference-time choice, so an evaluation may sweep it without retraining.
        self.history_level = self.config.history_level if history_level is None else history_level
        # The label of the observed start frames only (None: ``history_level``, as for the model's own
        # frames). Real frames carry none of the rollout's errors that the history noise stands for.
        self.start_history_level = self.history_level if start_history_level is None else start_history_level
        # A latent cell the dynamics moves less than this (L2 over its channels) keeps its previous
        # value exactly (``_snap``); also an inference-time choice.
        self.snap_threshold = self.config.snap_threshold if snap_threshold is None else snap_threshold
        # "decoder": draw each world's decoder noise once per reset and render every step from it,
        # so a scene that does not change is drawn the same way twice and what the arm leaves alone
        # does not flicker; "all": the dynamics' target too, which makes a world deterministic given
        # its commands (and able to settle in a fixed point: docs/architecture.md, frozen_noise).
        self.frozen_noise = self.config.frozen_noise if frozen_noise is None else frozen_noise
        self._frozen_target = self._frozen_decode = None
        # The overrides meet the config's own rules (ConfigError is a ValueError).
        for level in {self.history_level, self.start_history_level}:
            dataclasses.replace(self.config, dynamics_steps=self.dynamics_steps, history_level=level,
                                snap_threshold=self.snap_threshold, frozen_noise=self.frozen_noise).validate("WorldModel")
        self.streaming = self.config.streaming if streaming is None else streaming
        # Feed the dynamics the encoder's latent of each frame it rendered instead of the latent it
        # predicted: the history is then always a latent of an image, as in training.
        self.reencode = reencode
        # Per joint, the farthest a command may lead the arm's joints in one step (the drive's velocity
        # limit times the control period; None: commands pass unchanged). A real drive cannot follow
        # faster, and the model saw few larger leads: a Diffusion Policy's command jumps past them made
        # it lose the T within 1-3 s, limited it kept it through 150 steps (docs/results/README.md).
        self.max_command_step = None if max_command_step is None else np.asarray(max_command_step, np.float32)
        self._batched = False
        self._generator = torch.Generator(self.device)
        self.latent: torch.Tensor | None = None

    # construction ---------------------------------------------------------------------------
    @classmethod
    def load(cls, ckpt_dir: str | Path, device: str = "cpu", threads: int | None = None, **kwargs) -> "WorldModel":
        if threads:
            torch.set_num_threads(threads)
        network, meta = checkpoint.load(ckpt_dir, device)
        return cls(network, meta["normalization"], meta, device, **kwargs)

    @classmethod
    def untrained(cls, cfg: ModelConfig, joint_dim: int, device: str = "cpu", seed: int = 0, **kwargs) -> "WorldModel":
        """Random weights and unit normalisation: for timing and tests."""
        torch.manual_seed(seed)
        norm = {"action_low": [-1.0] * joint_dim, "action_high": [1.0] * joint_dim,
                "joint_mean": [0.0] * joint_dim, "joint_std": [1.0] * joint_dim, "joint_step_std": [0.05] * joint_dim}
        return cls(WorldModelNetwork(cfg, joint_dim), norm, {}, device, **kwargs)

    @property
    def image_size(self) -> int:
        return self.config.image_size

    @property
    def joint_dim(self) -> int:
        return self.network.joint_dim

    # normalisation ----------------------------------------------------------------------------
    def normalize_actions(self, actions) -> torch.Tensor:
        a = torch.from_numpy(np.array(actions, dtype=np.float32)).to(self.device)  # a copy: inputs may be read-only mmaps
        return (2 * (a - self.action_low) / (self.action_high - self.action_low) - 1).clamp(-1, 1)

    def joints_from_latent(self, latent: torch.Tensor, action: torch.Tensor, servo_state=None) -> torch.Tensor:
        """``action``: the normalised command that produced the latent's frame. A servo joint head
        also needs ``servo_state``: (command that produced the frame, the one before it, the joints
        of the frame before, the joints before those), each (N, J) as recorded; it answers with the
        frame before's joints plus its predicted step."""
        if not self.servo:
            return self.network.joint_head(latent, action) * self.joint_std + self.joint_mean
        if servo_state is None:
            raise ValueError("a servo joint head reads the joints before the frame: pass servo_state")
        command, previous_command, previous_joints, joints_before = servo_state
        servo = servo_features(command, previous_command, previous_joints, joints_before, self.joint_step_std)
        return previous_joints + self.network.joint_head(latent, action, servo) * self.joint_step_std

    # building blocks eval can reuse -----------------------------------------------------------
    @torch.inference_mode()
    def encode(self, images) -> torch.Tensor:
        """uint8 (..., H, W, 3) -> latents (..., L, h, w)."""
        x = images_to_tensor(images, self.image_size, self.device)
        return self.network.encoder(x.reshape(-1, *x.shape[-3:])).reshape(*x.shape[:-3], *self._latent_shape)

    @torch.inference_mode()
    def decode(self, latent: torch.Tensor, steps: int | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """latents (N, L, h, w) -> images (N, 3, S, S) in [-1, 1]; ``noise`` (N, 3, S, S): the start
        of the decoder's jump (default: fresh from the session's generator)."""
        if noise is None:
            noise = self._decoder_noise(latent.shape[0], self._generator)
        times = decode_times(steps or self.decode_steps, self.config.timesteps)
        return sample(lambda x, t, s: self.network.decoder(x, t, s, latent), noise, times, self.schedule)

    @torch.inference_mode()
    def reconstruct(self, images, actions, seed: int = 0, chunk: int = 256,
                    servo_state=None) -> tuple[np.ndarray, np.ndarray]:
        """Real frames (N, S, S, 3) uint8 through encoder and decoder, and their joints read by the
        joint head with the (N, J) commands that produced them: what the model could show with perfect
        dynamics (the autoencoder's ceiling in an evaluation). A servo joint head needs ``servo_state``
        (see ``joints_from_latent``) of the real frames before each, four (N, J) arrays. Reseeds the
        session's noise generator."""
        self._generator.manual_seed(seed)
        images, actions = np.asarray(images), np.asarray(actions, np.float32)
        if self.servo and servo_state is None:
            raise ValueError("a servo joint head reads the joints before each frame: pass servo_state")
        out_images, out_joints = [], []
        for i in range(0, len(images), chunk):
            latent = self.encode(images[i:i + chunk])
            out_images.append(tensor_to_images(self.decode(latent)))
            state = None if servo_state is None else \
                [torch.from_numpy(np.asarray(x[i:i + chunk], np.float32)).to(self.device) for x in servo_state]
            out_joints.append(self.joints_from_latent(latent, self.normalize_actions(actions[i:i + chunk]), state).cpu().numpy())
        return np.concatenate(out_images), np.concatenate(out_joints)

    def _decoder_noise(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return gaussian_noise((n, 3, self.image_size, self.image_size), self.device, generator)

    @property
    def _latent_shape(self) -> tuple[int, int, int]:
        side = self.config.latent_size
        return (self.config.latent_channels, side, side)

    def _history_label(self, start: bool = False) -> int:
        if self.config.dynamics_objective != "consistency":
            return 0
        return self.start_history_level if start else self.history_level

    def _labels(self, n: int, frames: int, level: int) -> torch.Tensor:
        return torch.full((n, frames), level, dtype=torch.long, device=self.device)

    def _predict(self, frames: torch.Tensor, actions: torch.Tensor, t: torch.Tensor, commit: int,
                 last: torch.Tensor) -> torch.Tensor:
        """Run the dynamics on ``frames`` whose last one is the target (pure noise at t = T-1); returns
        the new latent (N, L, h, w); ``last`` is the newest history latent (``dynamics_skip``'s base).
        With ``dynamics_steps`` > 1 each answer is re-noised to the next level of ``decode_times`` (a
        DDIM step) and the target asked again; the first call commits ``commit`` frames to the cache,
        later ones re-run the target frame alone against it."""
        s = t.clone()
        s[:, -1] = 0
        cache = self._cache if self.streaming else None
        if self.config.dynamics_objective == "mse":
            v = self.network.dynamics(frames, t, s, actions, cache, commit)[:, -1]
            return self._snap(normalize_latent(next_latent_estimate(self.config, self.schedule, None, None, v, last)), last)
        times = decode_times(self.dynamics_steps, self.config.timesteps)
        x = frames[:, -1]
        for k, (level, following) in enumerate(zip(times, times[1:])):
            if k:
                if self.streaming:
                    frames, actions, t, s, commit = x[:, None], actions[:, -1:], t[:, -1:].clone(), s[:, -1:], 0
                else:
                    frames, t = torch.cat([frames[:, :-1], x[:, None]], 1), t.clone()
                t[:, -1] = level
            v = self.network.dynamics(frames, t, s, actions, cache, commit)[:, -1]
            x0_hat = next_latent_estimate(self.config, self.schedule, x, t[:, -1], v, last)
            x = x0_hat if following == 0 else self.schedule.renoise(x, t[:, -1], torch.full_like(t[:, -1], following), x0_hat)
        return self._snap(normalize_latent(x), last)

    def _snap(self, latent: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Keep ``last`` in every cell where neither it nor a neighbour moved ``snap_threshold`` or more.

        The dynamics rebuilds every cell each step, and its small errors on an object nothing touches
        compound: push_t's T melts into a three-armed blob that reads as another orientation. Where
        the dynamics itself predicts (almost) no change the exact copy is the better answer, and it
        is fed back, so a still object stays as sharp as the frame it was encoded from. The one-cell
        margin around what moves keeps an object from being drawn half copied, half moved."""
        if not self.snap_threshold:
            return latent
        moved = ((latent - last).norm(dim=-3, keepdim=True) >= self.snap_threshold).float()
        near_moved = F.max_pool2d(moved, 3, stride=1, padding=1) > 0
        return torch.where(near_moved, latent, last)

    def _target_frame(self, n: int) -> torch.Tensor:
        shape = (n, 1, *self._latent_shape)
        if self.config.dynamics_objective == "mse":
            return torch.zeros(shape, device=self.device)
        if self._frozen_target is not None:
            return self._frozen_target.clone()
        return gaussian_noise(shape, self.device, self._generator)

    # the session ------------------------------------------------------------------------------
    @torch.inference_mode()
    def reset(self, images, joint_positions, actions, seed: int | None = None) -> None:
        """Start (N) rollout(s) from K observed frames; K >= 1, usually the config's window."""
        images = np.asarray(images)
        self._batched = images.ndim == 5
        if images.ndim not in (4, 5) or images.shape[-1] != 3:
            raise ValueError(f"images must be (K,H,W,3) or (N,K,H,W,3) uint8, got {images.shape}")
        if not self._batched:
            images, joint_positions, actions = images[None], np.asarray(joint_positions)[None], np.asarray(actions)[None]
        n, k = images.shape[:2]
        joint_positions, actions = np.asarray(joint_positions, np.float32), np.asarray(actions, np.float32)
        if joint_positions.shape != (n, k, self.joint_dim) or actions.shape != (n, k, self.joint_dim):
            raise ValueError(f"joint_positions and actions must be {(n, k, self.joint_dim)[1 - self._batched:]}, "
                             f"got {joint_positions.shape[1 - self._batched:]} and {actions.shape[1 - self._batched:]}")
        seed = random.randrange(2**63) if seed is None else seed
        self._generator.manual_seed(seed)
        self._frozen_target = self._frozen_decode = None
        if self.frozen_noise != "none":  # a generator of their own: the per-step draws stay as without
            frozen = torch.Generator(self.device).manual_seed(seed ^ FROZEN_SEED_SALT)
            self._frozen_decode = self._decoder_noise(n, frozen)
            if self.frozen_noise == "all" and self.config.dynamics_objective != "mse":
                self._frozen_target = gaussian_noise((n, 1, *self._latent_shape), self.device, frozen)
        latents = self.encode(images)                                     # (N, K, L, h, w)
        a = self.normalize_actions(actions)
        leading = torch.cat([a[:, :1], a[:, :-1]], 1)                     # frame i was produced by a[i-1]
        self.joint_positions = torch.from_numpy(joint_positions[:, -1].copy()).to(self.device)
        if self.servo:  # with one frame there is no step to read: the arm starts still, its command where it is
            before = -2 if k >= 2 else -1
            self._joints_before = torch.from_numpy(joint_positions[:, before].copy()).to(self.device)
            self._producing_command = torch.from_numpy((actions if k >= 2 else joint_positions)[:, before].copy()).to(self.device)
        self.latent = latents[:, -1]
        window = self.config.window
        if self.streaming:
            self._cache = self.network.dynamics.new_cache()
            start = self._labels(n, k, self._history_label(start=True))
            self.network.dynamics(latents, start, start, leading, self._cache, commit=k)
            self._pending = None
        else:
            self._history, self._history_actions = latents[:, -window:], leading[:, -window:]
            self._history_levels = self._labels(n, self._history.shape[1], self._history_label(start=True))

    def limit_command(self, action):
        """The command moved to within ``max_command_step`` of the current joints, as a drive limits it."""
        if self.max_command_step is None:
            return action
        joints = self.joint_positions.cpu().numpy()
        joints = joints if self._batched else joints[0]
        return joints + np.clip(np.asarray(action, np.float32) - joints, -self.max_command_step, self.max_command_step)

    @torch.inference_mode()
    def step(self, action):
        """Advance every world by one control step; returns (image uint8, joints float32)."""
        if self.latent is None:
            raise RuntimeError("call reset() before step()")
        command = self.limit_command(action)
        a = self.normalize_actions(command)
        a = a if self._batched else a[None]
        n = a.shape[0]
        target = self._target_frame(n)
        top = self.config.timesteps - 1
        hist = self._history_label()
        if self.streaming:
            if self._pending is None:
                frames, actions, t, commit = target, a[:, None], self._labels(n, 1, top), 0
            else:
                frames = torch.cat([self._pending[:, None], target], 1)
                actions = torch.stack([self._pending_action, a], 1)
                t = torch.cat([self._labels(n, 1, hist), self._labels(n, 1, top)], 1)
                commit = 1
            latent = self._predict(frames, actions, t, commit, self.latent)
            self._pending, self._pending_action = latent, a
        else:
            frames = torch.cat([self._history, target], 1)
            actions = torch.cat([self._history_actions, a[:, None]], 1)
            t = torch.cat([self._history_levels, self._labels(n, 1, top)], 1)
            latent = self._predict(frames, actions, t, 0, self.latent)
            window = self.config.window
            self._history = torch.cat([self._history, latent[:, None]], 1)[:, -window:]
            self._history_levels = torch.cat([self._history_levels, self._labels(n, 1, hist)], 1)[:, -window:]
            self._history_actions = torch.cat([self._history_actions, a[:, None]], 1)[:, -window:]
        image = tensor_to_images(self.decode(latent, noise=self._frozen_decode))
        if self.reencode:
            latent = self.encode(image)
            if self.streaming:
                self._pending = latent
            else:
                self._history[:, -1] = latent
        self.latent = latent
        servo_state = None
        if self.servo:  # the joints' step reads the command in force and the joints before
            command = torch.from_numpy(np.array(command, np.float32)).to(self.device).reshape(a.shape)
            servo_state = (command, self._producing_command, self.joint_positions, self._joints_before)
            self._joints_before, self._producing_command = self.joint_positions, command
        joints = self.joints_from_latent(latent, a, servo_state).cpu().numpy()
        self.joint_positions = torch.as_tensor(joints, device=self.device)
        return (image, joints) if self._batched else (image[0], joints[0])
