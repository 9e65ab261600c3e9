"""The four networks of the world model: encoder, consistency decoder, latent dynamics, joint head.

Shapes (B batch, F frames, L latent channels, h = w = image_size / 4):
  Encoder     image (B, 3, H, W) in [-1, 1]        -> latent (B, L, h, w), unit L2 norm per pixel
  Decoder     x_t (B, 3, H, W), t, s, latent        -> v (B, 3, H, W)
  Dynamics    latents (B, F, L, h, w), t, s (B, F), actions (B, F, A) -> v (B, F, L, h, w)
  JointHead   latent (B, L, h, w)                   -> normalised joint positions (B, J)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(8 if channels % 8 == 0 else 1, channels)


def conv3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1)


def zero_init(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        nn.init.zeros_(p)
    return module


def normalize_latent(z: torch.Tensor, dim: int = -3) -> torch.Tensor:
    """Each per-pixel latent vector to unit length: the latent's only regulariser (no KL, no VQ)."""
    return z / z.norm(dim=dim, keepdim=True).clamp(min=1e-6)


def sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = t.float()[..., None] * freqs
    return torch.cat([angles.sin(), angles.cos()], -1)


class NoiseEmbedding(nn.Module):
    """Sinusoidal features of t and s through one shared MLP, concatenated (2 * dim)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.mlp(sinusoid(t, self.dim)), self.mlp(sinusoid(s, self.dim))], -1)


class ResBlock(nn.Module):
    """GroupNorm -> SiLU -> conv -> FiLM(emb) -> SiLU -> conv, plus skip; the second conv starts at zero."""

    def __init__(self, cin: int, cout: int, emb_dim: int):
        super().__init__()
        self.norm1, self.conv1 = group_norm(cin), conv3(cin, cout)
        self.film = nn.Linear(emb_dim, 2 * cout)
        self.norm2, self.conv2 = group_norm(cout), zero_init(conv3(cout, cout))
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        scale, shift = self.film(emb)[:, :, None, None].chunk(2, 1)
        h = self.conv2(F.silu(self.norm2(h) * (1 + scale) + shift))
        return self.skip(x) + h


class SpatialAttention(nn.Module):
    """Full self-attention over the pixels of one image (used at low resolution only)."""

    def __init__(self, channels: int, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm = group_norm(channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.out = zero_init(nn.Conv2d(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).transpose(-1, -2).unbind(1)
        y = F.scaled_dot_product_attention(q, k, v)  # (b, heads, hw, d)
        return x + self.out(y.transpose(-1, -2).reshape(b, c, h, w))


class Encoder(nn.Module):
    """Plain CNN: conv, then per stage [SiLU, conv, SiLU, stride-2 conv], then 1x1 to the latent channels."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        widths = cfg.encoder_channels
        layers: list[nn.Module] = [conv3(3, widths[0])]
        cin = widths[0]
        for cout in widths:
            layers += [nn.SiLU(), conv3(cin, cin), nn.SiLU(), conv3(cin, cout, stride=2)]
            cin = cout
        layers += [nn.SiLU(), nn.Conv2d(cin, cfg.latent_channels, 1)]
        self.net = nn.Sequential(*layers)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return normalize_latent(self.net(image))


class Decoder(nn.Module):
    """Consistency decoder: a small U-Net on the noisy image, conditioned on the latent.

    The latent enters cheaply: nearest-upsampled and concatenated to the input, and added through
    a 1x1 projection at every level (a light stand-in for the paper's ControlNet branch)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        base, mult, nb, lat = cfg.decoder_channels, cfg.decoder_mult, cfg.decoder_blocks, cfg.latent_channels
        emb_dim = 2 * cfg.embed_dim
        self.noise_embedding = NoiseEmbedding(cfg.embed_dim)
        self.stem = conv3(3 + lat, base)
        widths = [base * m for m in mult]
        self.inject = nn.ModuleList(nn.Conv2d(lat, w, 1) for w in [base] + widths[:-1])
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        cin = base
        for i, w in enumerate(widths):
            self.down.append(nn.ModuleList(ResBlock(cin if j == 0 else w, w, emb_dim) for j in range(nb)))
            cin = w
            if i < len(widths) - 1:
                self.downsample.append(conv3(w, w, stride=2))
        self.mid1 = ResBlock(cin, cin, emb_dim)
        self.mid_attention = SpatialAttention(cin) if cfg.decoder_attention else None
        self.mid2 = ResBlock(cin, cin, emb_dim)
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i in reversed(range(len(widths))):
            w = widths[i]
            self.up.append(nn.ModuleList(ResBlock(cin + w if j == 0 else w, w, emb_dim) for j in range(nb)))
            cin = w
            if i > 0:
                self.upsample.append(conv3(w, widths[i - 1]))
                cin = widths[i - 1]
        self.out_norm = group_norm(cin)
        self.out = zero_init(conv3(cin, 3))

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, s: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        emb = self.noise_embedding(t, s)
        size = x_t.shape[-2:]
        h = self.stem(torch.cat([x_t, F.interpolate(latent, size=size, mode="nearest")], 1))
        skips = []
        for i, blocks in enumerate(self.down):
            h = h + self.inject[i](F.interpolate(latent, size=h.shape[-2:], mode="nearest"))
            for block in blocks:
                h = block(h, emb)
            skips.append(h)
            if i < len(self.downsample):
                h = self.downsample[i](h)
        h = self.mid1(h, emb)
        if self.mid_attention is not None:
            h = self.mid_attention(h)
        h = self.mid2(h, emb)
        for i, blocks in enumerate(self.up):
            h = torch.cat([h, skips.pop()], 1)
            for block in blocks:
                h = block(h, emb)
            if i < len(self.upsample):
                h = self.upsample[i](F.interpolate(h, scale_factor=2, mode="nearest"))
        return self.out(F.silu(self.out_norm(h)))


FUSED_ATTENTION_AT_INFERENCE = False  # True: the baseline of `attend_few` (`iws bench step --fused-attention`)


def attend_few(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention over a handful of frames. Training keeps PyTorch's fused kernel (faster with
    gradients); inference, where a streaming step asks 1-2 queries against at most window + 2 keys
    for each of the 256 latent pixels, spells it out: on the CPU the fused kernel took 2.6 ms for
    such a call at 24 channels per head against 0.46 ms for the explicit product (docs/benchmarks.md).
    On a GPU the fused kernel is the faster one (H200: 100 against 64 interactive steps per second)."""
    if torch.is_grad_enabled() or FUSED_ATTENTION_AT_INFERENCE or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + mask
    return scores.softmax(-1) @ v


class TemporalAttention(nn.Module):
    """Causal attention across frames at each pixel; frame i sees frames i-window..i.

    A learned bias per head and frame distance replaces positional encodings, so a sliding key/value
    cache gives exactly the same result as recomputing the whole sequence."""

    def __init__(self, channels: int, heads: int, window: int):
        super().__init__()
        self.heads, self.window = heads, window
        self.norm = group_norm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.out = zero_init(nn.Linear(channels, channels))
        self.distance_bias = nn.Parameter(torch.zeros(heads, window + 1))

    def forward(self, x: torch.Tensor, frames: int, cache: dict | None = None, commit: int = 0) -> torch.Tensor:
        """x: (B*F, C, h, w) holding F consecutive new frames per sequence. With a cache, the first
        ``commit`` new frames' keys/values are appended to it (the last ``window`` kept)."""
        bf, c, h, w = x.shape
        b, d = bf // frames, c // self.heads
        tokens = self.norm(x).reshape(b, frames, c, h * w).permute(0, 3, 1, 2).reshape(b * h * w, frames, c)
        q, k, v = self.qkv(tokens).reshape(b * h * w, frames, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        past = 0
        if cache is not None and "k" in cache:
            past = cache["k"].shape[2]
            k_all, v_all = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
        else:
            k_all, v_all = k, v
        if cache is not None and commit:
            cache["k"] = k_all[:, :, : past + commit][:, :, -self.window:]
            cache["v"] = v_all[:, :, : past + commit][:, :, -self.window:]
        query_pos = torch.arange(past, past + frames, device=x.device)[:, None]
        key_pos = torch.arange(past + frames, device=x.device)[None, :]
        distance = query_pos - key_pos
        allowed = (distance >= 0) & (distance <= self.window)
        bias = self.distance_bias[:, distance.clamp(0, self.window)].masked_fill(~allowed, float("-inf"))
        y = attend_few(q, k_all, v_all, bias.unsqueeze(0))
        y = self.out(y.transpose(1, 2).reshape(b * h * w, frames, c))
        y = y.reshape(b, h * w, frames, c).permute(0, 2, 3, 1).reshape(bf, c, h, w)
        return x + y


class ActionKeypoints(nn.Module):
    """The command drawn as a few learnt points on the dynamics' grid, each at sub-cell precision.

    Why: contact is decided within millimetres and a 16x16 latent cell is about 40 mm of push_t's
    table. The learnt action map (an MLP that paints the whole grid) spreads its command-dependent
    part over about half of the shipped model's cells. An MLP from the command to K (x, y) points
    has only the arm's smooth kinematics to learn, and each point is drawn as a Gaussian bump with
    its offset from every cell's centre, so a millimetre's change of the command changes the map.
    The points are kept on the grid (tanh), where the bumps always pass a gradient back."""

    SIGMA_CELLS = 1.0

    def __init__(self, action_dim: int, hidden: int, points: int, side: int):
        super().__init__()
        self.side, self.count = side, points
        self.place = nn.Sequential(nn.Linear(action_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                   nn.Linear(hidden, 2 * points))
        self.register_buffer("centres", torch.arange(side, dtype=torch.float32) + 0.5, persistent=False)

    @property
    def channels(self) -> int:
        return 3 * self.count

    def points(self, actions: torch.Tensor) -> torch.Tensor:
        """(N, K, 2): each point's (x, y) in cells, 0..side."""
        xy = self.place(actions).reshape(actions.shape[0], self.count, 2)
        return self.side * (torch.tanh(xy) + 1) / 2

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        """(N, 3K, side, side): per point its bump, and the bump times the point's x and y offset."""
        xy = self.points(actions)
        dx = xy[..., 0, None, None] - self.centres               # (N, K, 1, side): offset along a row
        dy = xy[..., 1, None, None] - self.centres[:, None]      # (N, K, side, 1): offset along a column
        bump = torch.exp(-(dx ** 2 + dy ** 2) / (2 * self.SIGMA_CELLS ** 2))
        return torch.cat([bump, bump * dx, bump * dy], 1)


class Dynamics(nn.Module):
    """Latent dynamics: per-frame res blocks at latent resolution (no resampling), each followed by
    causal temporal attention; noise levels (t, s) and the frame's action drive FiLM in every block.

    FiLM scales channels everywhere alike, so it cannot say *where* the commanded arm is. With
    ``action_map_channels`` > 0 an MLP also paints the action as a learned latent-resolution map that
    is added to the stem: the arm's place follows the command instead of drifting with the history.
    ``action_keypoints`` > 0 adds the command drawn as learnt points (ActionKeypoints) the same way.

    With ``dynamics_patch`` p > 1 each p x p block of latent cells is one token (pixel unshuffle in,
    pixel shuffle out): a finer latent, which draws a small object over more cells, at the step
    cost of the coarser one.
    """

    def __init__(self, cfg: ModelConfig, action_dim: int):
        super().__init__()
        self.window, self.patch = cfg.window, cfg.dynamics_patch
        lat, widths = cfg.latent_channels * cfg.dynamics_patch ** 2, cfg.dynamics_channels
        emb_dim = 2 * cfg.embed_dim + cfg.embed_dim
        self.noise_embedding = NoiseEmbedding(cfg.embed_dim)
        self.action_embedding = nn.Sequential(
            nn.Linear(action_dim, cfg.embed_dim), nn.SiLU(), nn.Linear(cfg.embed_dim, cfg.action_hidden), nn.SiLU(),
            nn.Linear(cfg.action_hidden, cfg.embed_dim))
        self.stem = conv3(lat, widths[0])
        self.action_map = None
        if cfg.action_map_channels:
            side, c = cfg.latent_size // cfg.dynamics_patch, cfg.action_map_channels
            self.action_map = nn.Sequential(
                nn.Linear(action_dim, cfg.action_hidden), nn.SiLU(), nn.Linear(cfg.action_hidden, cfg.action_hidden),
                nn.SiLU(), nn.Linear(cfg.action_hidden, c * side * side), nn.Unflatten(1, (c, side, side)))
            self.action_stem = zero_init(conv3(c, widths[0]))  # zero: adding it leaves a trained model unchanged
        self.action_points = None
        if cfg.action_keypoints:
            self.action_points = ActionKeypoints(action_dim, cfg.action_hidden, cfg.action_keypoints,
                                                 cfg.latent_size // cfg.dynamics_patch)
            self.points_stem = zero_init(conv3(self.action_points.channels, widths[0]))
        self.blocks, self.attention = nn.ModuleList(), nn.ModuleList()
        cin = widths[0]
        for w in widths:
            self.blocks.append(ResBlock(cin, w, emb_dim))
            self.attention.append(TemporalAttention(w, cfg.dynamics_heads, cfg.window))
            cin = w
        self.spatial = SpatialAttention(cin, cfg.dynamics_heads) if cfg.dynamics_spatial_attention else None
        self.out_norm = group_norm(cin + widths[0])
        # dynamics_skip "gated": one more output channel, the logit of the gate on the newest history
        # latent (world_model.next_latent_estimate); zero-initialised, the gate starts half open.
        self.out = zero_init(conv3(cin + widths[0], (cfg.latent_channels + (cfg.dynamics_skip == "gated"))
                                   * cfg.dynamics_patch ** 2))

    def new_cache(self) -> list[dict]:
        return [{} for _ in self.attention]

    def forward(self, latents: torch.Tensor, t: torch.Tensor, s: torch.Tensor, actions: torch.Tensor,
                cache: list[dict] | None = None, commit: int = 0, last_only: bool = False) -> torch.Tensor:
        """``last_only`` returns the newest frame only (b, 1, ...): training supervises just that
        frame, and the layers after the last temporal attention need not run on the others."""
        b, f = latents.shape[:2]
        emb = torch.cat([self.noise_embedding(t.flatten(), s.flatten()), self.action_embedding(actions.flatten(0, 1))], -1)
        emb = F.silu(emb)
        first = self.stem(F.pixel_unshuffle(latents.flatten(0, 1), self.patch) if self.patch > 1 else latents.flatten(0, 1))
        if self.action_map is not None:
            first = first + self.action_stem(self.action_map(actions.flatten(0, 1)))
        if self.action_points is not None:
            first = first + self.points_stem(self.action_points(actions.flatten(0, 1)))
        h = first
        for i, (block, attention) in enumerate(zip(self.blocks, self.attention)):
            h = attention(block(h, emb), f, None if cache is None else cache[i], commit)
        if last_only:
            h, first, f = h.reshape(b, f, *h.shape[1:])[:, -1], first.reshape(b, f, *first.shape[1:])[:, -1], 1
        if self.spatial is not None:
            h = self.spatial(h)
        h = self.out(F.silu(self.out_norm(torch.cat([h, first], 1))))
        if self.patch > 1:
            h = F.pixel_shuffle(h, self.patch)
        return h.reshape(b, f, *h.shape[1:])


class LatentCritic(nn.Module):
    """Patch critic for the dynamics' adversarial term (training only, never in a checkpoint): it
    reads a previous latent and a next latent side by side and scores each 2x2 patch of cells
    real (positive) or predicted (negative).

    The why: the one-jump dynamics regresses the next latent's mean, and where it is unsure it
    draws the average of the outcomes: push_t's T becomes a three-armed blob from the first step
    (docs/results/world_model_experiments.md). A critic that knows what a real successor looks like
    penalises the average and leaves a committed, sharp outcome to the latent loss to place."""

    # A step changes few cells by little (a predicted latent is ~0.01 RMS off the real one): the
    # critic reads the change from the previous latent magnified, or it starts blind to it.
    CHANGE_SCALE = 10.0

    def __init__(self, latent_channels: int, width: int = 64):
        super().__init__()
        act = lambda: nn.LeakyReLU(0.2)
        self.net = nn.Sequential(
            conv3(2 * latent_channels, width), act(), conv3(width, width), act(),
            conv3(width, 2 * width, stride=2), act(), nn.Conv2d(2 * width, 1, 1))

    def forward(self, previous: torch.Tensor, following: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([previous, self.CHANGE_SCALE * (following - previous)], 1))


def servo_features(command: torch.Tensor, previous_command: torch.Tensor, previous_joints: torch.Tensor,
                   joints_before: torch.Tensor, step_scale: torch.Tensor) -> torch.Tensor:
    """What a position-controlled drive's next step depends on, per joint (..., J, 3), each in units
    of the joint's typical step: how far the command leads the joints, the joints' last step (their
    momentum), and how much the command changed (a command that arrives during a control period acts
    on part of it). On the reference arm a linear fit on these explains 96-99.5 % of each joint's
    step (docs/architecture.md, the servo joint head)."""
    return torch.stack([command - previous_joints, previous_joints - joints_before,
                        command - previous_command], -1) / step_scale[..., None]


class JointHead(nn.Module):
    """Joint positions (normalised) read off one latent: two stride-2 convs and an MLP. With
    ``joint_head_action`` the command that produced the frame enters the MLP too: a position-
    controlled arm sits close to its last command, and the image says where contact holds it back.

    With ``joint_head_servo`` the head predicts the joints' step since the last frame instead, in units
    of the typical step: a per-joint linear servo on ``servo_features`` plus the MLP's correction
    (zero at first), which also reads the latent. An absolute reading scaled by the joint's whole
    range (6 rad for push_t's wrist) cannot hold an uncommanded joint at its millirad; a step can."""

    def __init__(self, cfg: ModelConfig, joint_dim: int):
        super().__init__()
        self.servo = cfg.joint_head_servo
        self.action_in = zero_init(nn.Linear(joint_dim, cfg.joint_head_hidden)) if cfg.joint_head_action else None
        c = cfg.joint_head_channels
        side = max(cfg.latent_size // 4, 1)
        layers = [conv3(cfg.latent_channels, c, stride=2), nn.SiLU(), conv3(c, c, stride=2), nn.SiLU(),
                  nn.AdaptiveAvgPool2d(side), nn.Flatten(), nn.Linear(c * side * side, cfg.joint_head_hidden), nn.SiLU()]
        if self.servo:  # the step has its own output layer: an absolute head's output never loads into it
            self.net = nn.Sequential(*layers)
            self.state_in = nn.Linear(3 * joint_dim, cfg.joint_head_hidden)
            self.step_out = zero_init(nn.Linear(cfg.joint_head_hidden, joint_dim))
            # Per joint: gain on the command's lead, on the last step, on the command's change. Started
            # near the reference arm's fit so that the small learning rate need not walk them there.
            self.servo_gains = nn.Parameter(torch.tensor([0.5, 0.25, 0.0]).repeat(joint_dim, 1))
        else:
            self.net = nn.Sequential(*layers, nn.Linear(cfg.joint_head_hidden, joint_dim))

    def forward(self, latent: torch.Tensor, action: torch.Tensor | None = None,
                servo: torch.Tensor | None = None) -> torch.Tensor:
        """``action``: the normalised command that produced each latent's frame (needed when the
        head was built with ``joint_head_action``); ``servo``: the frame's ``servo_features`` (needed
        by a servo head, whose answer is then the normalised step, not the position)."""
        if self.action_in is None:
            return self.net(latent)
        if action is None:
            raise ValueError("this joint head reads the producing command: pass action")
        if self.servo and servo is None:
            raise ValueError("this joint head predicts a step from the last joints: pass servo features")
        # The command (and a servo head's features) join at the MLP's hidden layer, before its activation.
        *features, activation = self.net if self.servo else self.net[:-1]
        hidden = latent
        for layer in features:
            hidden = layer(hidden)
        hidden = hidden + self.action_in(action)
        if not self.servo:
            return self.net[-1](activation(hidden))
        hidden = activation(hidden + self.state_in(servo.flatten(-2)))
        return (servo * self.servo_gains).sum(-1) + self.step_out(hidden)


class WorldModelNetwork(nn.Module):
    """All weights of one world model, so that one state dict is one checkpoint."""

    def __init__(self, cfg: ModelConfig, joint_dim: int):
        super().__init__()
        self.config, self.joint_dim = cfg, joint_dim
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.dynamics = Dynamics(cfg, joint_dim)
        self.joint_head = JointHead(cfg, joint_dim)

    def parameter_counts(self) -> dict[str, int]:
        counts = {name: sum(p.numel() for p in m.parameters())
                  for name, m in (("encoder", self.encoder), ("decoder", self.decoder),
                                  ("dynamics", self.dynamics), ("joint_head", self.joint_head))}
        counts["total"] = sum(counts.values())
        return counts
