"""`iws policy train`: a Diffusion Policy from iws datasets (reference-robot, world-model or real demos).

    iws policy train --data data/demos_real_dataset --out runs/policy_real --steps 2000
    iws policy train --data A --data B --fraction 0.5 --fraction 0.5 --episodes 100 --out runs/mix
    iws policy train ... --resume

Samples (obs window, action chunk) pairs from every episode of the train split: frames t-1..t
(repeating the first frame at an episode start) and commands t..t+15 (repeating the last one at
its end). With several ``--data``, ``--episodes`` episodes are drawn from them in the given
``--fraction``s (the data-mix experiments); ``--successful-only`` keeps only the episodes that ended in success, as
demonstrations are curated (a scripted expert's failures are mostly an arm stuck at the workspace
edge, which a policy then learns too). Checkpoints (safetensors + config.json) every
``--save-every`` steps and at the end (``--snapshot-every`` keeps copies in ``OUT/step_NNNNNN``);
``--resume`` continues from ``OUT/train_state.pt``; SIGTERM or Ctrl-C saves the step it stops at
(exit 128 + the signal), so nothing is lost. Images get a random shift of up to ``--shift``
pixels, and the checkpoint holds an exponential moving average of the weights (``--ema``), as
Diffusion Policy trains: both matter most with few demonstrations and few epochs.

``--image-encoder pose`` reads each image with push_t's pixel pose estimator instead (no shift
augmentation then: a shifted image is a moved T), once per demonstration frame before training.

``--save-demos FILE.npz`` keeps the gathered (with ``--image-encoder``, encoded) demonstrations and
``--data FILE.npz`` trains from them: another seed, or a GPU machine that should not get the images
(1 kB of latent per frame against 12 kB of pixels). ``--device auto`` takes a CUDA GPU if there is one.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

from iws_common.stopping import StopRequested, StopSignals
from iws_policy.diffusion import CONFIG_FILE, PolicyConfig, save_policy
from iws_world_model.train import lr_factor

STATE_FILE = "train_state.pt"


def with_margin(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A range widened by 2 % on each side, so that the data's extremes are not the scale's ends."""
    pad = 0.02 * (high - low + 1e-3)
    return low - pad, high + pad


def demo_episodes(dataset, successful_only: bool = False) -> list:
    """A dataset's train episodes that may serve as demonstrations (``successful_only``: those that
    ended in success)."""
    return [e for e in dataset.split("train") if e.success or not successful_only]


class DemoSet:
    """Demonstration frames gathered into memory at the policy's image size."""

    def __init__(self, sources: list[tuple[str, int]], config: PolicyConfig, seed: int = 0,
                 successful_only: bool = False):
        import torch
        import torch.nn.functional as F

        from iws_data.dataset import Dataset

        rng = np.random.default_rng(seed)
        images, joints, actions, starts, lengths, used = [], [], [], [], [], []
        offset, joint_names, rate = 0, None, None
        for path, count in sources:
            dataset = Dataset(path)
            if joint_names is None:
                joint_names, rate = dataset.joint_names, dataset.control_rate_hz
            elif dataset.joint_names != joint_names:
                raise ValueError(f"{path}: joints {dataset.joint_names} differ from {joint_names}")
            episodes = demo_episodes(dataset, successful_only)
            if count > len(episodes):
                kind = "successful episodes" if successful_only else "episodes"
                raise ValueError(f"{path}: {count} episodes requested, its train split has {len(episodes)} {kind}")
            chosen = sorted(rng.choice(len(episodes), size=count, replace=False)) if count < len(episodes) else range(len(episodes))
            for i in chosen:
                e = episodes[i]
                frames = torch.from_numpy(np.array(dataset.images[e.start:e.stop])).permute(0, 3, 1, 2).float()
                if frames.shape[-1] != config.image_size:
                    frames = F.interpolate(frames, size=(config.image_size, config.image_size), mode="area")
                images.append(frames.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy())
                joints.append(np.asarray(dataset.joint_positions[e.start:e.stop], np.float32))
                actions.append(np.asarray(dataset.actions[e.start:e.stop], np.float32))
                starts.append(offset)
                lengths.append(e.length)
                offset += e.length
            used.append({"data": str(path), "episodes": len(chosen), "successful_only": successful_only})
        if not images:
            raise ValueError("no training episodes")
        self.images, self.joints = np.concatenate(images), np.concatenate(joints)
        self.actions = np.concatenate(actions)
        self.starts, self.lengths = np.asarray(starts), np.asarray(lengths)
        self.joint_names, self.control_rate_hz, self.used = joint_names, rate, used
        self.index = frame_index(self.lengths)

    CACHE_FORMAT = "iws-policy-demos/1"

    def save(self, path: str | Path, encoder_from: str | Path | None = None) -> None:
        """The demonstrations as one .npz (``--save-demos``); encoded ones name the world model whose
        encoder made the latents (or the pose estimator), so that they are not mixed with another's."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {"format": self.CACHE_FORMAT, "used": self.used, "joint_names": list(self.joint_names),
                  "control_rate_hz": self.control_rate_hz,
                  "encoder_digest": encoder_digest(encoder_from) if self.encoded and encoder_from else None}
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, header=np.array(json.dumps(header)), images=self.images, joints=self.joints,
                 actions=self.actions, starts=self.starts, lengths=self.lengths)
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path, encoder_from: str | Path | None = None) -> "DemoSet":
        """Demonstrations saved by ``save``; encoded ones only with the same encoder."""
        try:
            with np.load(path) as data:
                header = json.loads(str(data["header"]))
                arrays = {k: data[k] for k in ("images", "joints", "actions", "starts", "lengths")}
        except (OSError, ValueError, KeyError) as exc:  # a JSONDecodeError is a ValueError
            raise ValueError(f"{path}: not a demonstration file written by --save-demos ({exc})") from exc
        if header.get("format") != cls.CACHE_FORMAT:
            raise ValueError(f"{path}: format {header.get('format')!r}, expected {cls.CACHE_FORMAT!r}")
        if arrays["images"].dtype != np.uint8:  # latents, not pixels
            digest = encoder_digest(encoder_from) if encoder_from else None
            if digest != header["encoder_digest"]:
                made_by = ("the pose estimator" if header["encoder_digest"] == POSE_ENCODER
                           else f"the world-model encoder with weights {header['encoder_digest']}")
                raise ValueError(f"{path} holds features of {made_by}; pass the same --image-encoder "
                                 f"(got {digest or 'none'})")
        demos = cls.__new__(cls)
        demos.images, demos.joints, demos.actions = arrays["images"], arrays["joints"], arrays["actions"]
        demos.starts, demos.lengths = arrays["starts"], arrays["lengths"]
        demos.joint_names, demos.control_rate_hz = header["joint_names"], header["control_rate_hz"]
        demos.used = [dict(u, demos_file=str(path)) for u in header["used"]]
        demos.index = frame_index(demos.lengths)
        return demos

    @property
    def encoded(self) -> bool:
        return self.images.dtype != np.uint8

    def batch(self, rng: np.random.Generator, size: int, config: PolicyConfig):
        import torch

        picks = self.index[rng.integers(0, len(self.index), size)]
        obs_offsets = np.arange(-config.obs_horizon + 1, 1)
        act_offsets = np.arange(config.pred_horizon)
        start, length = self.starts[picks[:, 0]], self.lengths[picks[:, 0]]
        obs = start[:, None] + np.clip(picks[:, 1:2] + obs_offsets[None], 0, length[:, None] - 1)
        act = start[:, None] + np.clip(picks[:, 1:2] + act_offsets[None], 0, length[:, None] - 1)
        return (torch.from_numpy(self.images[obs]), torch.from_numpy(self.joints[obs]),
                torch.from_numpy(self.actions[act]))

    def encode(self, encoder, chunk: int = 256, progress: bool = False) -> None:
        """Replace the images by a frozen encoder's output (``latents`` of a ``LatentEncoder`` or a
        ``PoseEncoder``), computed once: training then runs only the policy's own layers."""
        import torch
        from tqdm import tqdm

        latents = [encoder.latents(torch.from_numpy(self.images[i:i + chunk])).to(torch.float16).numpy()
                   for i in tqdm(range(0, len(self.images), chunk), desc="encode", unit="chunk", disable=not progress)]
        self.images = np.concatenate(latents)

    def target_range(self, config: PolicyConfig) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of the denoiser's targets over every frame of the set, per joint and chunk
        offset (pred_horizon, joints) with ``action_range: step``, else per joint over all offsets:
        the commands, or with ``action_relative`` the commands minus the frame's joint positions."""
        start, length = self.starts[self.index[:, 0]], self.lengths[self.index[:, 0]]
        t = self.index[:, 1]
        low, high = [], []
        for k in range(config.pred_horizon):
            target = self.actions[start + np.minimum(t + k, length - 1)]
            if config.action_relative:
                target = target - self.joints[start + t]
            low.append(target.min(0))
            high.append(target.max(0))
        low, high = np.stack(low), np.stack(high)
        return (low, high) if config.action_range == "step" else (low.min(0), high.max(0))


def frame_index(lengths) -> np.ndarray:
    """(episode, t) for every frame of episodes of these lengths, stored back to back."""
    return np.concatenate([np.stack([np.full(n, k), np.arange(n)], 1) for k, n in enumerate(lengths)])


def random_shift(images, pad: int, rng: np.random.Generator):
    """Shift each sample's frames (B, To, H, W, C) by up to ``pad`` pixels (edge-replicated), the same
    shift for all frames of a sample: Diffusion Policy's random-crop augmentation for small data.
    Images or channels-last latents, on any device; the dtype is kept. One gather for the batch (a
    slice per sample costs a kernel launch each on a GPU)."""
    import torch
    import torch.nn.functional as F

    if pad <= 0:
        return images
    b, to, h, w, c = images.shape
    x = images.permute(0, 1, 4, 2, 3).reshape(b, to * c, h, w).float()
    x = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    dx, dy = (torch.from_numpy(v).to(x.device) for v in rng.integers(0, 2 * pad + 1, size=(2, b)))
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
    x = x[torch.arange(b, device=x.device)[:, None, None, None], torch.arange(to * c, device=x.device)[None, :, None, None],
          rows, cols]
    return x.reshape(b, to, c, h, w).permute(0, 1, 3, 4, 2).to(images.dtype)


def training_device(name: str = "auto"):
    """``auto``: the first CUDA GPU when there is one, else the CPU."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA GPU visible to torch")
    return device


def learning_rate(step: int, steps: int, peak: float, warmup: float = 0.05) -> float:
    """Linear warm-up over the first ``warmup`` share of the steps, then cosine decay to 0 at ``steps``
    (a function of the step, so a resumed run may ask for more steps than the first one did)."""
    return peak * lr_factor(int(warmup * steps), steps, 0.0)(step)


POSE_ENCODER = "pose"  # --image-encoder's value for push_t's pixel pose estimator


def encoder_digest(image_encoder: str | Path) -> str:
    """What names the features of saved demonstrations: the world model's weights, or the estimator."""
    from iws_world_model.checkpoint import weights_digest
    return POSE_ENCODER if str(image_encoder) == POSE_ENCODER else weights_digest(image_encoder)


def world_model_encoder(checkpoint: str | Path) -> tuple[dict, dict]:
    """A world model checkpoint's encoder weights and model config (for ``--image-encoder``)."""
    from iws_world_model.checkpoint import CheckpointError, load
    try:
        network, meta = load(checkpoint)
    except CheckpointError as exc:
        raise ValueError(f"--image-encoder: {exc}") from exc
    return network.encoder.state_dict(), meta["model"]


def ema_decay(step: int, ceiling: float) -> float:
    """Warm-up of the averaging (Diffusion Policy's EMA): early weights are forgotten quickly."""
    return min(ceiling, (1.0 + step) / (10.0 + step))


def train(sources: list[tuple[str, int]], out: Path, steps: int = 2000, batch: int = 32, lr: float = 3e-4,
          seed: int = 0, save_every: int = 500, resume: bool = False, config: PolicyConfig | None = None,
          progress: bool = True, snapshot_every: int = 0, shift: int = 4, ema: float = 0.999,
          image_encoder: str | Path | None = None, successful_only: bool = False, device: str = "auto",
          demos_file: str | Path | None = None, save_demos: str | Path | None = None,
          mask_joints: tuple[str, ...] = ()) -> dict:
    """Train a policy on ``sources`` ((dataset, episodes) pairs), or on ``demos_file`` (``--save-demos``)."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(seed)
    out = Path(out)
    device = training_device(device)
    config = config or PolicyConfig()
    encoder_weights = None
    if str(image_encoder) == POSE_ENCODER:
        config.image_encoder, shift = POSE_ENCODER, 0
    elif image_encoder is not None:
        encoder_weights, config.world_model_config = world_model_encoder(image_encoder)
        config.image_encoder, config.image_size = "world_model", int(config.world_model_config["image_size"])
    if demos_file is not None:
        demos = DemoSet.load(demos_file, image_encoder)
        if demos.encoded and image_encoder is None:
            raise ValueError(f"{demos_file} holds encoded images: pass the --image-encoder that encoded them")
    else:
        demos = DemoSet(sources, config, seed, successful_only)
    config.joints = demos.joints.shape[1]
    config.joint_names, config.control_rate_hz = list(demos.joint_names), demos.control_rate_hz
    config.masked_joints = sorted(mask_joints)
    config.joint_low, config.joint_high = (v.tolist() for v in with_margin(demos.joints.min(0), demos.joints.max(0)))
    config.action_low, config.action_high = (v.tolist() for v in with_margin(*demos.target_range(config)))
    if resume and (out / STATE_FILE).is_file() and (out / CONFIG_FILE).is_file():
        earlier = json.loads((out / CONFIG_FILE).read_text())["policy"]
        if earlier.get("masked_joints", []) != config.masked_joints:
            raise ValueError(f"--resume: {out} was trained masking {earlier.get('masked_joints', [])}, not "
                             f"{config.masked_joints}: pass the same --mask-joint")
        for key in ("joint_low", "joint_high", "action_low", "action_high"):
            setattr(config, key, earlier[key])  # the scales the weights were trained with, not today's rule's

    from iws_policy.diffusion import DiffusionPolicy
    policy = DiffusionPolicy(config)
    if encoder_weights is not None:
        policy.encoder.pretrained.load_state_dict(encoder_weights)
        if not demos.encoded:
            demos.encode(policy.encoder)
        policy.encoder.set_statistics(torch.from_numpy(demos.images))
    elif config.image_encoder == POSE_ENCODER and not demos.encoded:
        demos.encode(policy.encoder, progress=progress)
    if save_demos is not None:
        demos.save(save_demos, image_encoder)
    policy.to(device)
    averaged = copy.deepcopy(policy).requires_grad_(False)  # what checkpoints hold
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=1e-6)
    averaged_params, params = list(averaged.parameters()), list(policy.parameters())
    rng = np.random.default_rng(seed)
    step, losses, started = 0, [], time.perf_counter()
    earlier_seconds = 0.0  # training time of the runs this one resumes, so that train_seconds is the whole run's
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / STATE_FILE
    if resume and state_path.is_file():
        state = torch.load(state_path, weights_only=False, map_location=device)
        try:
            policy.load_state_dict(state["model"])
        except RuntimeError as exc:
            raise ValueError(f"--resume: {state_path} was trained with other options (e.g. --image-encoder); "
                             f"pass the same ones ({str(exc)[:200]})") from exc
        averaged.load_state_dict(state.get("ema", state["model"]))
        optimizer.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["rng"]
        step, losses = state["step"], state["losses"]
        earlier_seconds = state.get("train_seconds", 0.0)  # states from before it was kept: unknown, 0

    def train_seconds() -> float:
        return earlier_seconds + time.perf_counter() - started

    def checkpoint():
        flush_losses()
        extra = {"trained_steps": step, "batch": batch, "device": device.type, "lr": lr, "seed": seed, "shift_px": shift, "ema": ema,
                 "image_encoder_from": str(image_encoder) if image_encoder else None,
                 "data": demos.used,
                 "frames": int(len(demos.index)), "train_seconds": train_seconds(),
                 "final_loss": float(np.mean(losses[-50:])) if losses else None}
        save_policy(averaged, out, extra)
        tmp = out / (STATE_FILE + ".tmp")
        torch.save({"model": policy.state_dict(), "ema": averaged.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng.bit_generator.state, "step": step, "losses": losses,
                    "train_seconds": train_seconds()}, tmp)
        tmp.replace(state_path)

    pending = []  # losses still on the device: reading each one would wait for the GPU every step

    def flush_losses():
        if pending:
            losses.extend(torch.stack(pending).float().cpu().tolist())
            pending.clear()

    policy.train()
    with tqdm(total=steps, initial=step, desc="policy", disable=not progress, dynamic_ncols=True) as bar, \
            StopSignals() as stop:
        while step < steps:
            images, joints, actions = (t.to(device, non_blocking=True) for t in demos.batch(rng, batch, config))
            images = random_shift(images, shift // getattr(policy.encoder, "downsample", 1), rng)
            loss = policy.loss(images, joints, actions)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, steps, lr)
            optimizer.step()
            with torch.no_grad():
                decay = ema_decay(step, ema)
                torch._foreach_mul_(averaged_params, decay)
                torch._foreach_add_(averaged_params, params, alpha=1.0 - decay)
            pending.append(loss.detach())
            step += 1
            bar.update(1)
            if step % 10 == 0:
                flush_losses()
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
            if step % save_every == 0 or step == steps or stop.signum is not None:
                checkpoint()
            if stop.signum is not None and step < steps:
                raise StopRequested(stop.signum, step)
            if snapshot_every and step % snapshot_every == 0:
                save_policy(averaged, out / f"step_{step:06d}", {"trained_steps": step, "data": demos.used, "seed": seed,
                                                                 "batch": batch, "device": device.type,
                                                                 "train_seconds": train_seconds()})
    flush_losses()
    return {"out": str(out), "steps": step, "frames": int(len(demos.index)), "data": demos.used,
            "loss_first_50": float(np.mean(losses[:50])), "loss_last_50": float(np.mean(losses[-50:])),
            "seconds": time.perf_counter() - started, "device": device.type}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws policy train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", action="append", required=True,
                        help="dataset directory (repeat to mix), or a .npz of demonstrations from --save-demos")
    parser.add_argument("--fraction", action="append", type=float, help="share of --episodes per --data (mixes)")
    parser.add_argument("--episodes", type=int, help="episodes in all (default: every train episode)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shift", type=int, default=4, help="random-shift augmentation of the images, pixels (0: off)")
    parser.add_argument("--image-encoder", metavar="WORLD_MODEL|pose",
                        help="see through this world model's frozen encoder (e.g. models/push_t) instead of training a "
                             "CNN; 'pose': read the T's pose with push_t's pixel pose estimator")
    parser.add_argument("--successful-only", action="store_true",
                        help="train on the episodes that ended in success only (as demonstrations are curated)")
    parser.add_argument("--ema", type=float, default=0.999, help="weight averaging decay (0: checkpoints hold the raw weights)")
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--snapshot-every", type=int, default=0,
                        help="also keep the policy every N steps in OUT/step_NNNNNN (policies at training stages)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="auto", help="auto (a CUDA GPU if there is one), cpu, cuda or cuda:N")
    parser.add_argument("--save-demos", type=Path, metavar="FILE.npz",
                        help="also write the gathered (encoded) demonstrations here, to train again from them with --data")
    parser.add_argument("--mask-joint", action="append", default=[], metavar="NAME",
                        help="never read this joint (the middle of its range stands in): for an input a backend does "
                             "not reproduce, such as the reference arm's wrist twist under contact; repeatable")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    if args.save_demos is not None and args.save_demos.suffix != ".npz":
        parser.error("--save-demos: name a .npz file (--data recognises demonstrations by that suffix)")
    demos_file = next((Path(d) for d in args.data if d.endswith(".npz")), None)
    if demos_file is not None and (len(args.data) > 1 or args.fraction or args.episodes is not None or args.successful_only):
        parser.error("--data FILE.npz holds chosen demonstrations already: give it alone, without --fraction, "
                     "--episodes or --successful-only")
    fractions = args.fraction or [1.0 / len(args.data)] * len(args.data)
    if len(fractions) != len(args.data) or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        parser.error("give one non-negative --fraction per --data")
    if args.steps < 1 or args.batch < 1 or args.shift < 0 or not 0 <= args.ema < 1:
        parser.error("--steps and --batch must be positive, --shift non-negative, --ema in [0, 1)")
    from iws_data.dataset import Dataset, DatasetError
    try:
        if demos_file is not None:
            counts = [1]
        elif args.episodes is None:
            counts = [len(demo_episodes(Dataset(d), args.successful_only)) for d in args.data]
        else:
            total = sum(fractions)
            counts = [round(args.episodes * f / total) for f in fractions]
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        if sum(counts) == 0:
            raise ValueError("no " + ("successful " if args.successful_only else "") + "episodes in the train split of "
                             + ", ".join(args.data))
        result = train([(d, c) for d, c in zip(args.data, counts) if c > 0], args.out, args.steps, args.batch, args.lr,
                       args.seed, args.save_every, args.resume, snapshot_every=args.snapshot_every,
                       shift=args.shift, ema=args.ema, image_encoder=args.image_encoder,
                       successful_only=args.successful_only, device=args.device,
                       demos_file=demos_file, save_demos=args.save_demos, mask_joints=tuple(args.mask_joint))
    except (DatasetError, ValueError) as exc:
        print(f"iws policy train: error: {exc}", file=sys.stderr)
        return 1
    except StopRequested as stop:
        print(f"\niws policy train: stopped by {stop.signal_name} after {stop}, saved in {args.out}: continue with "
              "the same command plus --resume", file=sys.stderr)
        return stop.exit_status
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
