"""`iws train`: train a world model from a cached dataset, in three stages, resumable.

    iws train --config config/models/push_t.yaml --data data/push_t --out runs/push_t
    iws train ... --resume                 # continue from OUT/train_state.pt
    torchrun --nproc_per_node 4 -m iws_world_model.train ...   # DDP

OUT holds the usable checkpoint (model.safetensors + config.json, rewritten every checkpoint),
train_state.pt (optimizer, step, RNG) and tb/ (TensorBoard).

SIGTERM (kill, a job scheduler, systemd) or Ctrl-C stops after the current step with a checkpoint
of that step, so --resume loses nothing; a second Ctrl-C stops at once (the last periodic
checkpoint stays). Exit status 128 + the signal number.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, WeightedRandomSampler
from tqdm import tqdm

from iws_common.stopping import StopRequested, StopSignals
from iws_data.dataset import Dataset, DatasetError

from . import checkpoint, start_windows
from .config import ConfigError, ModelConfig, TrainConfig, load_config
from .networks import WorldModelNetwork
from .objectives import StageObjective

STATE = "train_state.pt"


class WindowData(torch.utils.data.Dataset):
    """Windows of ``length`` consecutive frames of one episode; each frame carries the action that
    produced it (the previous frame's command; an episode's first frame carries its own)."""

    def __init__(self, dataset: Dataset, length: int, split: str = "train", latents: torch.Tensor | None = None,
                 object_cells: torch.Tensor | None = None, last_image: bool = False):
        """``latents``: every frame already encoded (stage 2); windows then carry latents, not images,
        and with ``last_image`` the last frame's image too (the target of stage 3 on predicted latents
        and of the dynamics' pixel term).
        ``object_cells``: every frame's object mask at latent resolution; windows then carry it too."""
        self.dataset, self.length, self.latents, self.object_cells = dataset, length, latents, object_cells
        self.last_image = last_image
        self.starts = dataset.windows(length, split)
        first = np.zeros(len(dataset), dtype=bool)
        first[[e.start for e in dataset.episodes]] = True
        self.producing_action = np.arange(len(dataset)) - 1 + first

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        frames = slice(int(self.starts[i]), int(self.starts[i]) + self.length)
        d = self.dataset
        pixels = {"images": torch.from_numpy(np.array(d.images[frames]))} if self.latents is None else \
            {"latents": self.latents[frames]}
        if self.latents is not None and self.last_image:
            pixels["images"] = torch.from_numpy(np.array(d.images[frames.stop - 1:frames.stop]))
        if self.object_cells is not None:
            pixels["object_cells"] = self.object_cells[frames]
        return {**pixels,
                "actions": torch.from_numpy(np.array(d.actions[self.producing_action[frames]])),
                "joints": torch.from_numpy(np.array(d.joint_positions[frames]))}


def lr_factor(warmup: int, steps: int, final: float):
    """Linear warmup, then cosine from 1 to ``final`` at the stage's last step (final = 1: constant)."""
    warmup = max(warmup, 1)

    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        progress = min(1.0, (i - warmup) / max(steps - warmup, 1))
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def normalization_from(dataset: Dataset) -> dict:
    """Action range (for [-1, 1]), joint mean/std and the joints' typical step (the std of one
    frame's change, a servo joint head's unit) over the training episodes."""
    train = dataset.split("train")
    frames = np.concatenate([np.arange(e.start, e.stop) for e in train])
    actions, joints = np.asarray(dataset.actions[frames]), np.asarray(dataset.joint_positions[frames])
    low, high = actions.min(0), actions.max(0)
    pad = np.maximum(1e-3 - (high - low), 0) / 2  # a constant joint still gets a finite range
    steps = np.concatenate([np.diff(np.asarray(dataset.joint_positions[e.start:e.stop]), axis=0) for e in train])
    return {"action_low": (low - pad).tolist(), "action_high": (high + pad).tolist(),
            "joint_mean": joints.mean(0).tolist(), "joint_std": np.maximum(joints.std(0), 1e-3).tolist(),
            "joint_step_std": np.maximum(steps.std(0), 1e-4).tolist(), "joint_names": dataset.joint_names}


def dataset_info(dataset: Dataset) -> dict:
    return {"path": str(dataset.root.resolve()), "frames": len(dataset), "episodes": len(dataset.episodes),
            "image_size": list(dataset.image_size), "control_rate_hz": dataset.meta.get("control_rate_hz"),
            "profile": dataset.meta.get("profile")}


def object_mask_pass(images, task: str, latent_size: int | None = None, chunk: int = 4096,
                     quiet: bool = False) -> tuple[np.ndarray, torch.Tensor | None]:
    """One pass of the task's object mask over every frame: per frame, how many mask pixels changed
    against the previous frame (chunks overlap by one frame; the change across an episode boundary
    is never used), and with ``latent_size`` the mask pooled to the latent grid (a cell is the
    object's if any of its pixels is), (N, L, L) bool."""
    from iws_reference_robot.perception import OBJECT_MASKS  # no ROS; pulled in only when asked for
    if task not in OBJECT_MASKS:
        raise ConfigError(f"train.motion_task: no object mask for '{task}' (known: {sorted(OBJECT_MASKS)})")
    object_mask = OBJECT_MASKS[task]
    changed = np.zeros(len(images), dtype=np.int64)
    cells = torch.zeros((len(images), latent_size, latent_size), dtype=torch.bool) if latent_size else None
    for i in tqdm(range(0, len(images), chunk), desc="object masks", unit="chunk", disable=quiet,
                  dynamic_ncols=True, file=sys.stderr):
        first = max(i - 1, 0)
        masks = object_mask(np.asarray(images[first:i + chunk]))
        changed[first + 1:first + len(masks)] = (masks[1:] ^ masks[:-1]).reshape(len(masks) - 1, -1).sum(1)
        if cells is not None:
            own = torch.from_numpy(masks[i - first:]).float()[:, None]
            cells[i:i + chunk] = torch.nn.functional.adaptive_max_pool2d(own, latent_size)[:, 0] > 0
    return changed, cells


def motion_weights(data: WindowData, cfg: TrainConfig, changed: np.ndarray | None = None,
                   quiet: bool = False) -> np.ndarray:
    """A sampling weight per window: ``cfg.motion_oversample`` where the task's object changes at
    least ``motion_min_pixels`` mask pixels from the last history frame to the target (a push in
    contact, or the pusher passing over it), else 1. Contacts are a minority of the frames (about a
    fifth in push_t) and where the open loop goes wrong (docs/architecture.md). ``changed``: the
    per-frame counts of ``object_mask_pass``, if it already ran."""
    if changed is None:
        changed, _ = object_mask_pass(data.dataset.images, cfg.motion_task, quiet=quiet)
    target = np.asarray(data.starts) + data.length - 1
    return np.where(changed[target] >= cfg.motion_min_pixels, cfg.motion_oversample, 1.0)


def goal_cover_pass(images, task: str, chunk: int = 4096, quiet: bool = False) -> np.ndarray:
    """Per frame, how many of the task's goal pixels are visible (few: the object covers the goal)."""
    from iws_reference_robot.perception import GOAL_MASKS  # no ROS; pulled in only when asked for
    if task not in GOAL_MASKS:
        raise ConfigError(f"train.motion_task: no goal mask for '{task}' (known: {sorted(GOAL_MASKS)})")
    visible = np.zeros(len(images), dtype=np.int64)
    for i in tqdm(range(0, len(images), chunk), desc="goal masks", unit="chunk", disable=quiet,
                  dynamic_ncols=True, file=sys.stderr):
        frames = np.asarray(images[i:i + chunk])
        visible[i:i + len(frames)] = GOAL_MASKS[task](frames).reshape(len(frames), -1).sum(1)
    return visible


def goal_weights(data: WindowData, cfg: TrainConfig, visible: np.ndarray) -> np.ndarray:
    """A sampling factor per window: ``cfg.goal_undersample`` where the target frame shows the goal
    covered, else 1. In push_t the T sits on its goal in about a sixth of the frames (the expert's
    episodes end there), the one pose the data holds that often; a dynamics unsure of a pushed T
    was seen to redraw it on the goal, so that every policy wins in the model (docs/architecture.md)."""
    full = float(np.percentile(visible, 99))
    if full <= 0:
        raise ConfigError(f"train.goal_undersample: the {cfg.motion_task} goal is visible in none of the frames")
    covered = visible <= (1 - cfg.goal_covered_fraction) * full
    target = np.asarray(data.starts) + data.length - 1
    return np.where(covered[target], cfg.goal_undersample, 1.0)


def batches(data: WindowData, batch_size: int, seed: int, rank: int, world: int, workers: int, device,
            weights: np.ndarray | None = None):
    """Endless shuffled batches; epochs reshuffle (DistributedSampler shards across ranks). With
    ``weights``, each epoch draws len(data) windows with replacement in proportion to them (every
    rank its own draw)."""
    epoch = 0
    while True:
        if weights is not None:
            generator = torch.Generator().manual_seed(seed * 100003 + epoch + 7919 * rank)
            sampler = WeightedRandomSampler(torch.as_tensor(weights, dtype=torch.double), len(data) // world,
                                            replacement=True, generator=generator)
        elif world > 1:
            sampler = DistributedSampler(data, world, rank, shuffle=True, seed=seed, drop_last=True)
            sampler.set_epoch(epoch)
        else:
            sampler = RandomSampler(data, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
        loader = DataLoader(data, batch_size=batch_size, sampler=sampler, num_workers=workers,
                            drop_last=len(data) >= batch_size * world, pin_memory=device.type == "cuda")
        for batch in loader:
            yield {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        epoch += 1


def widened_distance_biases(theirs: dict, own: dict) -> dict:
    """A warm start onto a longer window: each temporal attention's learned bias per frame distance
    keeps its trained values, and the new, farther distances start at the farthest trained one, so
    the extra frames are attended to as the oldest frame was. Everything else is returned as is."""
    widened = dict(theirs)
    for name, bias in theirs.items():
        if not name.endswith("distance_bias") or name not in own:
            continue
        target = own[name]
        if bias.shape[:-1] == target.shape[:-1] and bias.shape[-1] < target.shape[-1]:
            extra = bias[..., -1:].expand(*bias.shape[:-1], target.shape[-1] - bias.shape[-1])
            widened[name] = torch.cat([bias, extra], -1)
    return widened


class Trainer:
    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, dataset: Dataset, out: Path, device,
                 rank: int = 0, world: int = 1):
        self.model_cfg, self.train_cfg, self.dataset, self.out = model_cfg, train_cfg, dataset, out
        self.device, self.rank, self.world = device, rank, world
        self.network = WorldModelNetwork(model_cfg, len(dataset.joint_names)).to(device)
        self.normalization = normalization_from(dataset)
        self.completed: list[int] = []
        self.stats: dict = {}      # per stage: steps, loss_first, loss_last, seconds (goes into config.json)
        self.losses: dict = {}     # per stage: loss history (train_state.pt only)
        self.warm_start: dict | None = None  # --init-weights: where the later stages started from
        self.stop = StopSignals()  # main() activates it; its signum ends a stage early, saved
        self._cache: dict = {}     # per process: the dataset's latents and object masks (stages 2 and 4)
        self.writer = None
        if rank == 0:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(out / "tb"))

    # checkpoints --------------------------------------------------------------------------------
    def load_weights(self, directory: Path) -> None:
        network, meta = checkpoint.load(directory, self.device)
        # Compare parsed configs: a checkpoint written before a config key existed has its default.
        if dataclasses.asdict(network.config) != dataclasses.asdict(self.model_cfg):
            raise checkpoint.CheckpointError(f"{directory / checkpoint.CONFIG}: model differs from the --config model")
        self.network.load_state_dict(network.state_dict())
        self.normalization = self._normalization_of(meta)
        self.stats = meta.get("training", {}).get("stages", {})
        self.completed = list(meta.get("training", {}).get("completed", []))

    def _normalization_of(self, meta: dict) -> dict:
        """A checkpoint's normalisation, kept as it is (its weights were trained with it), plus the
        joints' typical step from this dataset where a servo joint head needs it and the checkpoint
        predates it."""
        normalization = dict(meta["normalization"])
        if self.model_cfg.joint_head_servo and "joint_step_std" not in normalization:
            normalization["joint_step_std"] = normalization_from(self.dataset)["joint_step_std"]
        return normalization

    def load_autoencoder(self, directory: Path, everything: bool = False) -> None:
        """Encoder and decoder from another checkpoint, everything else fresh: a baseline dynamics
        (e.g. plain MSE) of equal size trained over the very same autoencoder. ``everything`` also
        takes every other weight whose name and shape the --config model shares (a warm start after
        adding a zero-initialised module); the rest keeps its initialisation."""
        network, meta = checkpoint.load(directory, self.device)
        for name in ("encoder", "decoder"):
            try:
                getattr(self.network, name).load_state_dict(getattr(network, name).state_dict())
            except RuntimeError as exc:
                raise checkpoint.CheckpointError(f"{directory}: its {name} does not fit the --config model: {exc}") from exc
        if everything:
            own = self.network.state_dict()
            theirs = widened_distance_biases(network.state_dict(), own)  # a longer --config window
            shared = {k: v for k, v in theirs.items() if k in own and own[k].shape == v.shape}
            self.network.load_state_dict(shared, strict=False)
            fresh = sorted({k.rsplit(".", 1)[0] for k in own if k not in shared})
            self.warm_start = {"from": str(directory), "fresh": fresh,
                               "its_stages": meta.get("training", {}).get("stages", {})}
            if self.rank == 0:
                print(f"iws train: {len(shared)}/{len(own)} tensors from {directory}; fresh: {', '.join(fresh) or 'none'}",
                      file=sys.stderr)
        self.normalization = self._normalization_of(meta)
        training = meta.get("training", {})
        # The decoder's stage-3 fine-tune (if it had one) comes along with it; with ``everything``,
        # every stage CKPT completed does (a stage the plan runs again is then recorded anew).
        self.completed = [1] + ([3] if 3 in training.get("completed", []) else [])
        if everything:
            self.completed = list(training.get("completed", [])) or self.completed
        self.stats = {str(s): {**training.get("stages", {}).get(str(s), {}), "from": str(directory)} for s in self.completed}

    def save(self, stage: int, step: int, optimizer, scheduler, objective) -> None:
        if self.rank != 0:
            return
        training = {"completed": self.completed, "stages": self.stats, "current": {"stage": stage, "step": step}}
        if self.warm_start:
            training["warm_start"] = self.warm_start
        checkpoint.save(self.out, self.network, self.normalization, dataset_info(self.dataset), training)
        if not (self.out / start_windows.FILENAME).exists():  # so a shipped model starts without its dataset
            windows = start_windows.windows_from_dataset(self.dataset, self.model_cfg.window, count=8)
            start_windows.save_start_windows(self.out, windows)
        state = {"stage": stage, "step": step, "completed": self.completed, "stats": self.stats, "losses": self.losses,
                 "warm_start": self.warm_start,
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "objective": objective.extra_state(),
                 "torch_rng": torch.get_rng_state(), "normalization": self.normalization}
        torch.save(state, self.out / (STATE + ".partial"))
        os.replace(self.out / (STATE + ".partial"), self.out / STATE)

    # one stage ----------------------------------------------------------------------------------
    def run_stage(self, stage: int, steps: int, resume_state: dict | None = None) -> None:
        scfg = getattr(self.train_cfg, f"stage{stage}")
        trains, cfg = self.train_cfg.for_stage(stage)  # stage 4: stage 2's objective on deeper chains
        objective = StageObjective(self.network, trains, cfg, self.normalization).to(self.device)
        optimizer = torch.optim.AdamW(objective.trainable_parameters(), lr=scfg.lr,
                                      weight_decay=self.train_cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(scfg.warmup, steps, scfg.final_lr_fraction))
        start = 0
        if resume_state is not None and resume_state["stage"] == stage:
            optimizer.load_state_dict(resume_state["optimizer"])
            scheduler.load_state_dict(resume_state["scheduler"])
            objective.load_extra_state(resume_state.get("objective", {}))
            start = resume_state["step"]
        model = objective
        if self.world > 1 and objective.critic is not None:
            raise ConfigError("train.dynamics_adversarial_weight: the critic steps inside the objective, which "
                              "DistributedDataParallel cannot wrap; train it in one process")
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(objective, device_ids=ids)
        length = StageObjective.window_length(self.model_cfg, cfg, trains)
        weights = motion = object_cells = goal_factor = None
        oversample, weigh_cells = cfg.motion_oversample > 1, cfg.object_loss_weight > 0
        windows = WindowData(self.dataset, length, "train") if trains == 2 else None  # what the weights index
        if trains == 2 and (oversample or weigh_cells):  # before encoding: a bad task fails fast
            changed, object_cells = self.object_masks()
            if oversample:
                weights = motion = motion_weights(windows, cfg, changed)
        if trains == 2 and cfg.goal_undersample < 1:
            goal_factor = goal_weights(windows, cfg, self.goal_visible())
            weights = goal_factor if weights is None else weights * goal_factor
        # Windows of several frames are the dynamics' (stage 2, or stage 3 on its predictions): latents.
        latents = self.dataset_latents() if length > 1 and cfg.cache_latents else None
        data = WindowData(self.dataset, length, "train", latents, object_cells,
                          last_image=trains == 3 or (trains == 2 and cfg.dynamics_pixel_weight > 0))
        if len(data) == 0:
            raise DatasetError(f"{self.dataset.root}: no training window of {length} frames for stage {stage}")
        if goal_factor is not None and self.rank == 0:
            print(f"stage 2: {float(np.mean(goal_factor < 1)):.1%} of the windows end with the goal covered; drawn "
                  f"{cfg.goal_undersample:g}x as often, they make "
                  f"{float(weights[goal_factor < 1].sum() / weights.sum()):.1%} of the batches", file=sys.stderr)
        if motion is not None and self.rank == 0:
            moving = float(np.mean(motion > 1))
            print(f"stage 2: {moving:.1%} of the windows move the {self.train_cfg.motion_task} object; drawn "
                  f"{self.train_cfg.motion_oversample:g}x as often, they make "
                  f"{float(weights[motion > 1].sum() / weights.sum()):.1%} of the batches", file=sys.stderr)
        stream = batches(data, scfg.batch_size, self.train_cfg.seed + start, self.rank, self.world,
                         self.train_cfg.num_workers, self.device, weights)
        if start == 0:  # a fresh (or repeated) stage starts fresh statistics
            self.stats.pop(str(stage), None)
            self.losses[str(stage)] = {}
        losses = self.losses.setdefault(str(stage), {})
        # What the steps were, beside what they did: a checkpoint says how it was trained.
        self.stats.setdefault(str(stage), {}).update(batch_size=scfg.batch_size * self.world, peak_lr=scfg.lr,
                                                     device=self.device.type)
        began = time.time()
        bar = tqdm(range(start, steps), initial=start, total=steps, desc=f"stage {stage}", disable=self.rank != 0,
                   dynamic_ncols=True, file=sys.stderr)
        objective.train()
        for step in bar:
            terms = model(next(stream))
            optimizer.zero_grad(set_to_none=True)
            terms["loss"].backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(objective.trainable_parameters(), self.train_cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            loss = float(terms["loss"].detach())
            if not math.isfinite(loss):
                raise FloatingPointError(f"stage {stage} step {step}: loss is {loss}")
            for k, v in terms.items():
                losses.setdefault(k, []).append(float(v.detach()))
            if self.rank == 0 and (step % self.train_cfg.log_every == 0 or step == steps - 1):
                bar.set_postfix({k: f"{float(v.detach()):.3g}" for k, v in terms.items()})
                for k, v in terms.items():
                    self.writer.add_scalar(f"stage{stage}/{k}", float(v.detach()), step)
                self.writer.add_scalar(f"stage{stage}/grad_norm", float(grad_norm), step)
                self.writer.add_scalar(f"stage{stage}/lr", scheduler.get_last_lr()[0], step)
            done = step + 1
            if self.stop.signum is not None and done < steps:
                bar.close()
                self._summarise(stage, done, began)
                self.save(stage, done, optimizer, scheduler, objective)
                raise StopRequested(self.stop.signum, done, where=f"stage {stage} ")
            if done < steps and done % self.train_cfg.checkpoint_every == 0:
                self._summarise(stage, done, began)
                began = time.time()
                self.save(stage, done, optimizer, scheduler, objective)
        bar.close()
        if steps > start:
            self._summarise(stage, steps, began)
        if stage not in self.completed:
            self.completed.append(stage)
        self.save(stage, steps, optimizer, scheduler, objective)

    def object_masks(self):
        """object_mask_pass once per process: stages 2 and 4 draw from the same frames (and share
        motion_task and object_loss_weight: stage 4 changes only the self-forcing keys)."""
        if "object_masks" not in self._cache:
            weigh_cells = self.train_cfg.object_loss_weight > 0
            self._cache["object_masks"] = object_mask_pass(self.dataset.images, self.train_cfg.motion_task,
                                                           self.model_cfg.latent_size if weigh_cells else None,
                                                           quiet=self.rank != 0)
        return self._cache["object_masks"]

    def goal_visible(self) -> np.ndarray:
        """goal_cover_pass once per process: stages 2 and 4 draw from the same frames."""
        if "goal_visible" not in self._cache:
            self._cache["goal_visible"] = goal_cover_pass(self.dataset.images, self.train_cfg.motion_task,
                                                          quiet=self.rank != 0)
        return self._cache["goal_visible"]

    def dataset_latents(self) -> torch.Tensor:
        """Every frame's latent, encoded once per process: stage 1 is over by then and stages 3
        and 4 leave the encoder as it is, so stage 4 reuses what stage 2 encoded."""
        if "latents" not in self._cache:
            self._cache["latents"] = self.encode_dataset()
        return self._cache["latents"]

    @torch.no_grad()
    def encode_dataset(self, chunk: int = 256) -> torch.Tensor:
        """Every frame through the (frozen) encoder once, on the CPU side: stage 2 then skips the
        image pipeline and the encoder on every step (about a quarter of a step on the CPU)."""
        from .world_model import images_to_tensor
        cfg, n = self.model_cfg, len(self.dataset)
        latents = torch.empty((n, cfg.latent_channels, cfg.latent_size, cfg.latent_size))
        for i in tqdm(range(0, n, chunk), desc="encoding frames", unit="chunk", disable=self.rank != 0,
                      dynamic_ncols=True, file=sys.stderr):
            x = images_to_tensor(self.dataset.images[i:i + chunk], cfg.image_size, self.device)
            latents[i:i + chunk] = self.network.encoder(x).cpu()
        return latents

    def _summarise(self, stage: int, done: int, began: float) -> None:
        """First/last ten-step means of every loss term, for config.json and the tests."""
        stats = self.stats.setdefault(str(stage), {})
        for term, history in self.losses[str(stage)].items():
            if f"{term}_first" not in stats or stats.get("steps", 0) < 10:
                stats[f"{term}_first"] = float(np.mean(history[:10]))
            stats[f"{term}_last"] = float(np.mean(history[-10:]))
            del history[10:-1000]  # the first ten and the last thousand are enough to judge progress
        stats.update(steps=done, seconds=round(stats.get("seconds", 0.0) + time.time() - began, 1))


def training_device(name: str | None) -> torch.device:
    """--device, or the GPU if there is one; a bare "cuda" is this process's GPU (torchrun's
    LOCAL_RANK), since torch.cuda.set_device needs an index."""
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def all_stages(train_cfg: TrainConfig) -> list[int]:
    """What --stage all runs: 1, 2, 3, then 4 where the config gives it steps; a stage 3 that
    decodes the dynamics' own predictions (stage3_predicted_fraction) runs after stage 4, over the
    dynamics it will render; 5 (the joint head alone) last where the config gives it steps."""
    plan = [1, 2, 3] if train_cfg.stage4.steps == 0 else \
        [1, 2, 4, 3] if train_cfg.stage3_predicted_fraction > 0 else [1, 2, 3, 4]
    return plan + [5] if train_cfg.stage5.steps > 0 else plan


def stage_plan(text: str):
    """--stage: "all", or stages in training order ("2", "2,4")."""
    if text == "all":
        return text
    try:
        plan = [int(part) for part in text.split(",")]
    except ValueError:
        plan = []
    if not plan or any(stage not in (1, 2, 3, 4, 5) for stage in plan) or plan != sorted(set(plan)):
        raise argparse.ArgumentTypeError(f"expected all, or stages 1-5 in order like 2 or 2,4; got {text!r}")
    return plan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="iws train", description="train a world model from a cached dataset")
    p.add_argument("--config", required=True, help="config/models/NAME.yaml")
    p.add_argument("--data", required=True, help="cached dataset directory (iws dataset build)")
    p.add_argument("--out", required=True, help="run directory, e.g. runs/NAME")
    p.add_argument("--stage", default="all", type=stage_plan,
                   help="all: 1, 2, 3, then 4 where the config gives it steps (4: the dynamics again on deep "
                        "self-forcing chains; 3 after 4 where stage 3 decodes the dynamics' predictions); one "
                        "stage, or several in order, e.g. 2,4 (the dynamics stages over an --init-autoencoder); "
                        "5: the joint head alone (e.g. a servo joint head for a trained model, --init-weights)")
    p.add_argument("--steps", type=int, default=None, help="override the steps of each selected stage")
    p.add_argument("--batch-size", type=int, default=None,
                   help="override the batch size of each selected stage (a GPU takes far more than the CPU's 16)")
    p.add_argument("--lr", type=float, default=None,
                   help="override the peak learning rate of each selected stage (e.g. lower for a warm start)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=None, help="override train.seed")
    init = p.add_mutually_exclusive_group()
    init.add_argument("--init-autoencoder", default=None, metavar="CKPT",
                      help="take encoder and decoder from CKPT and train the selected later stages fresh "
                           "(a baseline of equal size over the same autoencoder)")
    init.add_argument("--init-weights", default=None, metavar="CKPT",
                      help="like --init-autoencoder, but start the later stages from CKPT's weights too, "
                           "wherever the --config model shares a weight's name and shape (warm start); with "
                           "stage 1 in the plan every stage starts from CKPT (a new task on the same robot)")
    args = p.parse_args(argv)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = training_device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model_cfg, train_cfg = load_config(args.config)
        if args.seed is not None:
            train_cfg.seed = args.seed
        dataset = Dataset(args.data)
        out = Path(args.out)
        plan = all_stages(train_cfg) if args.stage == "all" else args.stage
        overrides = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr}
        for key, value in overrides.items():
            if value is not None:
                for stage in plan:
                    setattr(getattr(train_cfg, f"stage{stage}"), key, value)
        # The config's own rules judge the overrides too (--steps 0 stays a warm start that only
        # converts the checkpoint; --batch-size 0 and --lr 0 are refused), before anything is written.
        train_cfg.validate(f"{args.config}: train with --steps/--batch-size/--lr")
        torch.manual_seed(train_cfg.seed + rank)
        np.random.seed(train_cfg.seed + rank)
        out.mkdir(parents=True, exist_ok=True)
        trainer = Trainer(model_cfg, train_cfg, dataset, out, device, rank, world)
        resume_state = None
        if args.resume:
            if not (out / STATE).is_file():
                raise checkpoint.CheckpointError(f"{out / STATE}: nothing to resume from")
            trainer.load_weights(out)
            resume_state = torch.load(out / STATE, map_location="cpu", weights_only=False)
            trainer.completed, trainer.stats = resume_state["completed"], resume_state["stats"]
            trainer.losses = resume_state["losses"]
            trainer.warm_start = resume_state.get("warm_start")
            torch.set_rng_state(resume_state["torch_rng"])
        elif args.init_autoencoder or args.init_weights:
            if plan[0] == 1 and args.init_autoencoder:
                raise checkpoint.CheckpointError("--init-autoencoder keeps CKPT's autoencoder, which stage 1 would "
                                                 "retrain: pass --stage 2 (or 3), or --init-weights to fine-tune it")
            trainer.load_autoencoder(Path(args.init_autoencoder or args.init_weights), everything=bool(args.init_weights))
            # Every stage again from CKPT's weights: a new task on the same robot and camera. The action
            # and joint normalisation stays CKPT's (the robot's workspace; rope and pile span push_t's).
            if plan[0] == 1:
                trainer.completed, trainer.stats = [], {}
        elif plan[0] == 1 and (out / checkpoint.WEIGHTS).exists():
            raise checkpoint.CheckpointError(f"{out}: already holds a checkpoint; pass --resume, "
                                             "--stage 2/3 to train later stages on it, or choose a new --out")
        elif plan[0] > 1:
            trainer.load_weights(out)  # stages 2 and 3 build on the autoencoder of stage 1
        if rank == 0:
            counts = trainer.network.parameter_counts()
            print(f"iws train: {device}, {world} process(es), {counts['total'] / 1e6:.2f} M parameters "
                  f"({', '.join(f'{k} {v / 1e6:.2f} M' for k, v in counts.items() if k != 'total')}), "
                  f"{len(dataset)} frames", file=sys.stderr)
        with trainer.stop:
            for stage in plan:
                steps = getattr(train_cfg, f"stage{stage}").steps
                state = resume_state if resume_state is not None and resume_state["stage"] == stage else None
                if args.resume and stage in trainer.completed and (state is None or state["step"] >= steps):
                    continue  # finished before the interruption
                trainer.run_stage(stage, steps, state)
        if rank == 0:
            trainer.writer.close()
            print(f"iws train: checkpoint in {out}", file=sys.stderr)
    except (ConfigError, DatasetError, checkpoint.CheckpointError) as exc:
        print(f"iws train: {exc}", file=sys.stderr)
        return 2
    except StopRequested as stop:
        if trainer.writer is not None:
            trainer.writer.close()  # the TensorBoard events up to the saved step
        print(f"\niws train: stopped by {stop.signal_name} after {stop}, saved in {args.out}: continue with the "
              "same command plus --resume", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:
        print(f"\niws train: interrupted; {args.out} keeps its last periodic checkpoint: continue with the "
              "same command plus --resume", file=sys.stderr)
        return 130
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
