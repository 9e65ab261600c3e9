"""The loss of each training stage, as one nn.Module so that DDP can wrap it.

  1  encoder + decoder on reconstruction (consistency loss, uniform (t, s) mixed with inference jumps)
  2  dynamics (+ joint head), autoencoder frozen: the next latent from K noisy-history latents (with
     self-forcing, the newest of them the model's own predictions for part of the batch)
  3  decoder fine-tuned on slightly noisy latents, on the inference jumps only (optionally, for part
     of the batch, on the dynamics' own predicted latents)
(stage 4 trains stage 2's objective again with its own, deeper self-forcing: TrainConfig.for_stage)
  5  the joint head alone, everything else frozen (a new joint head for a trained model)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig, TrainConfig
from .consistency import Schedule, consistency_loss, intermediate_levels, noise_like, sample_jump_times, sample_uniform_times
from .networks import LatentCritic, WorldModelNetwork, normalize_latent, servo_features
from .world_model import images_to_tensor, next_latent_estimate

TRAINED = {1: ("encoder", "decoder"), 2: ("dynamics", "joint_head"), 3: ("decoder",), 5: ("joint_head",)}


class StageObjective(nn.Module):
    def __init__(self, network: WorldModelNetwork, stage: int, train: TrainConfig, normalization: dict):
        super().__init__()
        self.network, self.stage, self.train_cfg = network, stage, train
        self.schedule = Schedule(network.config.timesteps)
        if network.config.joint_head_servo and "joint_step_std" not in normalization:
            raise ValueError("a servo joint head needs normalization.joint_step_std (train.normalization_from)")
        # joint_step_std: only a servo joint head reads it (and checkpoints from before it lack it)
        for key in ("action_low", "action_high", "joint_mean", "joint_std") + \
                (("joint_step_std",) if network.config.joint_head_servo else ()):
            self.register_buffer(key, torch.tensor(normalization[key], dtype=torch.float32), persistent=False)
        for name in ("encoder", "decoder", "dynamics", "joint_head"):
            getattr(network, name).requires_grad_(name in TRAINED[stage])
        # The dynamics' adversarial term: a critic of its own, trained in step with it (one hinge step
        # per batch, in _adversarial). Not part of the network: a checkpoint holds none; train_state.pt does.
        self.critic = self.critic_optimizer = None
        if stage == 2 and train.dynamics_adversarial_weight > 0:
            self.critic = LatentCritic(network.config.latent_channels)
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=train.critic_lr, betas=(0.5, 0.9))

    def extra_state(self) -> dict:
        """What a resumed stage needs besides the network and its optimizer: the critic, if any."""
        if self.critic is None:
            return {}
        return {"critic": self.critic.state_dict(), "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        if self.critic is not None and state.get("critic"):
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for name in TRAINED[self.stage] for p in getattr(self.network, name).parameters()]

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        return {1: self.autoencoder_loss, 2: self.dynamics_loss, 3: self.decoder_finetune_loss,
                5: self.joint_head_loss}[self.stage](batch)

    def _actions(self, batch) -> torch.Tensor:
        """The batch's commands mapped to [-1, 1] by the dataset's action range."""
        return (2 * (batch["actions"].float() - self.action_low) / (self.action_high - self.action_low) - 1).clamp(-1, 1)

    def _images(self, batch) -> torch.Tensor:
        return images_to_tensor(batch["images"], self.network.config.image_size, self.action_low.device)

    def _decoder_loss(self, image, latent, t, s, w_t=None, w_s=None):
        return consistency_loss(lambda x, tt, ss: self.network.decoder(x, tt, ss, torch.cat([latent, latent])),
                                image, t, s, self.schedule, w_t, w_s)

    def autoencoder_loss(self, batch) -> dict[str, torch.Tensor]:
        image = self._images(batch).flatten(0, 1)
        latent = self.network.encoder(image)
        n, dev, T = image.shape[0], image.device, self.schedule.timesteps
        jumps = int(round(n * self.train_cfg.terminal_fraction))
        t_u, s_u = sample_uniform_times(n - jumps, T, dev)
        t_j, s_j = sample_jump_times(jumps, (1, 2, 3), T, dev)
        t, s = torch.cat([t_u, t_j]), torch.cat([s_u, s_j])
        # min(SNR,5)/(SNR+1) for the uniform draws (the paper's stage 1); 1 for the inference jumps,
        # whose SNR weight would be ~0 at t = 999.
        is_jump = torch.arange(n, device=dev) >= n - jumps
        w_t = torch.where(is_jump, 1.0, self.schedule.snr_weight(t))
        w_s = torch.where(is_jump, 1.0, self.schedule.snr_weight(s))
        return {"loss": self._decoder_loss(image, latent, t, s, w_t, w_s)}

    def decoder_finetune_loss(self, batch) -> dict[str, torch.Tensor]:
        """The decoder on the inference jumps from the latents it will be given: the encoder's plus
        a little noise (the paper), and, for ``stage3_predicted_fraction`` of the batch, the
        dynamics' own prediction of the frame at the end of a chain of 1..``stage3_chain_frames``
        of them. A rollout's latents are the dynamics' predictions, which differ from the encoder's
        in ways the paper's small noise does not cover: push_t_curriculum's open loop gains 0.4 dB
        from it (docs/architecture.md, stage3_predicted_fraction)."""
        train = self.train_cfg
        if "latents" in batch:  # windows of cached latents with the last frame's image
            image, latents = self._images(batch)[:, -1], batch["latents"].float()
        else:
            images = self._images(batch)
            image = images[:, -1]
            with torch.no_grad():
                latents = self.network.encoder(images.flatten(0, 1)).reshape(*images.shape[:2], *self._latent_shape())
        with torch.no_grad():  # randn by shape: the same draws whatever memory layout the encoder gave
            real = latents[:, -1]
            latent = normalize_latent(real + train.stage3_latent_noise * torch.randn(real.shape, device=real.device))
            share = int(round(image.shape[0] * train.stage3_predicted_fraction))
            if share:
                depth = int(torch.randint(1, train.stage3_chain_frames + 1, ()))
                own = self._own_chain(latents, self._actions(batch), share, depth)
                latent = torch.cat([own[:share, -1], latent[share:]])
        t, s = sample_jump_times(image.shape[0], (1, 2, 3), self.schedule.timesteps, image.device)
        return {"loss": self._decoder_loss(image, latent, t, s)}

    def _latents(self, batch) -> torch.Tensor:
        if "latents" in batch:  # encoded once before the stage (the encoder is frozen here)
            return batch["latents"].float()
        image = self._images(batch)                               # (B, F, 3, S, S)
        with torch.no_grad():
            return self.network.encoder(image.flatten(0, 1)).reshape(*image.shape[:2], *self._latent_shape())

    def _joint_loss(self, latents, actions, commands, joints) -> torch.Tensor:
        """The joint head on every frame of the windows (a servo head: on every frame with two
        before it, from the real joints before it). ``actions`` normalised, ``commands`` and ``joints``
        as recorded; the loss is in units of the joint's spread (a servo head: of its typical step)."""
        noisy = normalize_latent(latents + self.train_cfg.joint_latent_noise * torch.randn_like(latents))
        if not self.network.config.joint_head_servo:
            target = (joints - self.joint_mean) / self.joint_std
            return F.mse_loss(self.network.joint_head(noisy.flatten(0, 1), actions.flatten(0, 1)), target.flatten(0, 1))
        servo = servo_features(commands[:, 2:], commands[:, 1:-1], joints[:, 1:-1], joints[:, :-2], self.joint_step_std)
        target = (joints[:, 2:] - joints[:, 1:-1]) / self.joint_step_std
        step = self.network.joint_head(noisy[:, 2:].flatten(0, 1), actions[:, 2:].flatten(0, 1), servo.flatten(0, 1))
        return F.mse_loss(step, target.flatten(0, 1))

    def joint_head_loss(self, batch) -> dict[str, torch.Tensor]:
        joint = self._joint_loss(self._latents(batch), self._actions(batch), batch["actions"].float(), batch["joints"].float())
        return {"loss": joint, "joint": joint.detach()}

    def dynamics_loss(self, batch) -> dict[str, torch.Tensor]:
        cfg = self.network.config
        latents = self._latents(batch)
        actions = self._actions(batch)
        commands = batch["actions"].float()
        joints = batch["joints"].float()
        if cfg.dynamics_objective == "consistency":  # windows longer than K + 1 only feed the self-forced chain
            history = self._self_forced(latents[:, :-1], actions)
        else:
            history = latents[:, -cfg.window - 1:-1]
        # dynamics_skip's base is the newest history frame before the history noise: the model's own
        # prediction where self-forced (so the change learnt corrects its errors), else the real frame.
        # A noised base would have the network reproduce that noise through attention to cancel it.
        base = history[:, -1]
        # The trained step: K history frames and the target, whatever the window length.
        latents, actions, commands, joints = (x[:, -cfg.window - 1:] for x in (latents, actions, commands, joints))
        target = latents[:, -1]
        b, f = latents.shape[:2]
        top = self.schedule.timesteps - 1
        if cfg.dynamics_objective == "consistency":
            # History noise t = s in 1..99: the model learns to tolerate its own rollout errors.
            level = torch.randint(1, cfg.history_noise_max + 1, (b, f - 1), device=latents.device)
            history = self.schedule.add_noise(history, level, noise_like(history))
            # The target jumps 999 -> 0 (one-step inference). A share of the batch instead starts the
            # target at the intermediate levels of 2- and 3-step inference (499; 666, 333) and regresses
            # x0 from there too (or, with dynamics_jump_levels: uniform, at any level in 1..998):
            # inference re-noises its first answer to that level (DDIM) and asks again, meant to
            # resolve a contact's outcome that the one jump averages.
            t_target = torch.full((b,), top, device=latents.device)
            jumps = int(round(b * self.train_cfg.dynamics_jump_fraction))
            if jumps and self.train_cfg.dynamics_jump_levels == "uniform":
                t_target[b - jumps:] = torch.randint(1, top, (jumps,), device=latents.device)
            elif jumps:
                levels = torch.tensor(intermediate_levels(self.schedule.timesteps), device=latents.device)
                t_target[b - jumps:] = levels[torch.randint(0, len(levels), (jumps,), device=latents.device)]
            x_t = self.schedule.add_noise(target, t_target, noise_like(target))
            t = torch.cat([level, t_target[:, None]], 1)
            s = torch.cat([level, torch.zeros_like(t_target)[:, None]], 1)
        else:  # deterministic baseline: same network, plain regression, no noise anywhere
            x_t = torch.zeros_like(target)
            t = torch.zeros((b, f), dtype=torch.long, device=latents.device)
            t[:, -1] = top
            s = torch.zeros_like(t)
        v = self.network.dynamics(torch.cat([history, x_t[:, None]], 1), t, s, actions, last_only=True)[:, -1]
        prediction = next_latent_estimate(cfg, self.schedule, x_t, t[:, -1], v, base)
        error = prediction - target
        squared = error.pow(2)
        per_sample = squared.flatten(1).mean(1)
        # l1: where a push has several outcomes the per-element median keeps the likelier one in each
        # cell instead of blending them; "dynamics" is logged as the squared error either way.
        distance = squared if self.train_cfg.dynamics_distance == "l2" else error.abs()
        if self.train_cfg.object_loss_weight > 0:
            trained = self._object_weighted(distance, batch)
        else:
            trained = distance.flatten(1).mean(1)
        dynamics = trained.mean()
        terms = {}
        if self.critic is not None:  # latents[:, -2] is the real previous frame, whatever the history was
            adversarial, terms["critic"] = self._adversarial(latents[:, -2], target, normalize_latent(prediction))
            terms["adversarial"] = adversarial
            if self.critic_steps() > self.train_cfg.critic_warmup:
                dynamics = dynamics + self._adversarial_scale(dynamics, adversarial) * adversarial
        if self.train_cfg.dynamics_pixel_weight > 0:
            terms["pixels"] = self._decoded_error(normalize_latent(prediction), batch)
            dynamics = dynamics + self.train_cfg.dynamics_pixel_weight * terms["pixels"]
        joint = self._joint_loss(latents, actions, commands, joints)
        # "dynamics" stays the one-jump error (comparable across runs); "loss" trains every jump.
        one_jump = t[:, -1] == top
        return {"loss": dynamics + self.train_cfg.joint_loss_weight * joint,
                "dynamics": (per_sample[one_jump] if one_jump.any() else per_sample).mean().detach(), "joint": joint.detach(),
                **{k: v.detach() for k, v in terms.items()}}

    def critic_steps(self) -> int:
        """Steps the critic has taken, resumed runs included (its optimizer counts them)."""
        state = self.critic_optimizer.state.get(next(self.critic.parameters()), {})
        return int(state.get("step", 0))

    def _adversarial(self, previous: torch.Tensor, target: torch.Tensor, predicted: torch.Tensor):
        """One hinge step of the critic on this batch (when training), then the dynamics' term: minus
        the critic's mean score of its prediction. Returns (term, the critic's loss)."""
        critic_loss = torch.zeros((), device=target.device)
        if self.training and torch.is_grad_enabled():
            real, fake = self.critic(previous, target), self.critic(previous, predicted.detach())
            critic_loss = F.relu(1 - real).mean() + F.relu(1 + fake).mean()
            self.critic_optimizer.zero_grad(set_to_none=True)
            critic_loss.backward()
            self.critic_optimizer.step()
        return -self.critic(previous, predicted).mean(), critic_loss.detach()

    def _adversarial_scale(self, latent_loss: torch.Tensor, adversarial: torch.Tensor) -> torch.Tensor:
        """``dynamics_adversarial_weight`` times the ratio of the two terms' gradient norms at the
        dynamics' output layer (VQGAN's adaptive weight): the critic's pull stays that fraction of
        the latent loss's however the two scales drift."""
        if not torch.is_grad_enabled():
            return torch.zeros((), device=latent_loss.device)
        layer = self.network.dynamics.out.weight
        latent_grad = torch.autograd.grad(latent_loss, layer, retain_graph=True)[0].norm()
        critic_grad = torch.autograd.grad(adversarial, layer, retain_graph=True)[0].norm()
        return self.train_cfg.dynamics_adversarial_weight * (latent_grad / (critic_grad + 1e-8)).clamp(max=1e4).detach()

    def _decoded_error(self, latent: torch.Tensor, batch: dict) -> torch.Tensor:
        """Pixel MSE of ``latent`` rendered as a rollout renders it (the frozen decoder's one jump
        from noise) against the real frame, the gradient reaching the dynamics through the decoder.
        A latent error small in L2 can still turn the decoded T into a three-armed blob (the decoder
        is sensitive along some latent directions and not others); this term weighs latent errors
        by what they do to the picture."""
        if "images" not in batch:
            raise KeyError("train.dynamics_pixel_weight > 0 needs the target frame's image in the batch "
                           "(WindowData last_image)")
        # the target alone, whatever the window carries
        image = images_to_tensor(batch["images"][:, -1], self.network.config.image_size, self.action_low.device)
        noise = noise_like(image)
        t = torch.full((image.shape[0],), self.schedule.timesteps - 1, dtype=torch.long, device=image.device)
        x0 = self.schedule.x0_from_v(noise, t, self.network.decoder(noise, t, torch.zeros_like(t), latent))
        return (x0 - image).pow(2).mean()

    def _object_weighted(self, distance: torch.Tensor, batch: dict) -> torch.Tensor:
        """Per-sample weighted mean of ``distance`` (B, C, L, L): the latent cells the task's object
        covers in the target or in the last history frame, grown by one cell, weigh
        1 + ``object_loss_weight``. In push_t the T covers 4 % of the cells, a minority of the
        terms of an unweighted mean, while its blurred shape in a rollout (a three-armed blob whose
        yaw the estimator reads about 120 degrees off) is where the open loop fails."""
        if "object_cells" not in batch:
            raise KeyError("train.object_loss_weight > 0 needs the batch's object_cells (WindowData object_cells)")
        cells = batch["object_cells"][:, -2:].any(1).float()[:, None]          # (B, 1, L, L)
        cells = F.max_pool2d(cells, 3, stride=1, padding=1)
        weight = 1 + self.train_cfg.object_loss_weight * cells
        return (distance * weight).flatten(1).sum(1) / (weight.flatten(1).sum(1) * distance.shape[1])

    @torch.no_grad()
    def _self_forced(self, history: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The newest K frames of ``history`` (B, F-1, ...), of which, for the first
        ``self_forcing_fraction`` of the batch, the newest ``n`` are the model's own chained one-jump
        predictions, made as a rollout makes them (history labelled ``history_level``, target from
        pure noise); n is ``self_forcing_frames``, or drawn per batch from ``self_forcing_min_frames``
        up. From n >= K on the whole history is the model's own, n steps deep into a rollout (the
        window then carries n + 2 frames). The target stays the real next frame: the model learns to
        answer from its own imperfect past, which the history noise only imitates. The chain starts
        from real frames; the rest of the batch is untouched."""
        train = self.train_cfg
        share = int(round(history.shape[0] * train.self_forcing_fraction))
        frames = self.chain_depth(self.network.config, train)
        if train.self_forcing_min_frames and frames > train.self_forcing_min_frames:
            frames = int(torch.randint(train.self_forcing_min_frames, frames + 1, ()))
        return self._own_chain(history, actions, share, frames)[:, -self.network.config.window:]

    @torch.no_grad()
    def _own_chain(self, latents: torch.Tensor, actions: torch.Tensor, share: int, frames: int) -> torch.Tensor:
        """``latents`` (B, L, ...) with, for the first ``share`` of the batch, the newest ``frames``
        replaced by the model's own chained one-jump predictions, each from the (partly own) frames
        before it and the frame's producing command, started from real frames.

        Like streaming inference, each prediction runs only the frames it has not seen, over the
        dynamics' key/value cache (the same numbers as recomputing the window, fewer passes)."""
        cfg = self.network.config
        length, k = latents.shape[1], cfg.window
        first = max(1, length - frames)
        if share == 0 or first >= length:
            return latents
        top, dev = self.schedule.timesteps - 1, latents.device
        own = latents[:share].clone()
        cache = self.network.dynamics.new_cache()
        unseen = min(first, k)  # the real frames the cache has not taken in (the first prediction sees K of them)
        for j in range(first, length):
            noise = noise_like(own[:, j])
            t = torch.full((share, unseen + 1), cfg.history_level, dtype=torch.long, device=dev)
            t[:, -1] = top
            s = t.clone()
            s[:, -1] = 0
            context = torch.cat([own[:, j - unseen:j], noise[:, None]], 1)
            v = self.network.dynamics(context, t, s, actions[:share, j - unseen:j + 1], cache=cache, commit=unseen,
                                      last_only=True)[:, -1]
            own[:, j] = normalize_latent(next_latent_estimate(cfg, self.schedule, noise, t[:, -1], v, own[:, j - 1]))
            unseen = 1
        return torch.cat([own, latents[share:]])

    @staticmethod
    def chain_depth(model: ModelConfig, train: TrainConfig) -> int:
        """The deepest self-forced chain stage 2 rolls: 0 where it rolls none (no share of the batch,
        or the deterministic baseline, which has no noise levels to label its own history with)."""
        active = train.self_forcing_fraction > 0 and model.dynamics_objective == "consistency"
        return train.self_forcing_frames if active else 0

    @classmethod
    def window_length(cls, model: ModelConfig, train: TrainConfig, stage: int = 2) -> int:
        """Frames per window of the objective ``stage`` trains. 2: K history frames and the target,
        or more when the self-forced chain is deeper than the history (it needs one real frame to
        start from). 3 on predicted latents: K real frames and the deepest chain of own predictions
        ending on the target. 5 with a servo joint head: the frame and the two before it. Otherwise
        the frame alone."""
        if stage == 2:
            return max(model.window, cls.chain_depth(model, train) + 1) + 1
        if stage == 3 and train.stage3_predicted_fraction > 0:
            return model.window + train.stage3_chain_frames
        if stage == 5 and model.joint_head_servo:
            return 3  # the frame and the two before it
        return 1

    def _latent_shape(self):
        cfg = self.network.config
        return (cfg.latent_channels, cfg.latent_size, cfg.latent_size)
