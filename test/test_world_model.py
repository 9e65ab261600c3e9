"""The world model's ML core on a tiny config and a tiny synthetic dataset (a square the action moves)."""
from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from iws_data.dataset import Dataset, DatasetWriter
from iws_world_model import bench, checkpoint, train
from iws_world_model.checkpoint import CheckpointError
from iws_world_model.config import ConfigError, load_config
from iws_world_model.consistency import Schedule, decode_times, noise_like
from iws_world_model.networks import WorldModelNetwork, normalize_latent
from iws_world_model.world_model import WorldModel, upscale
from process_harness import sigterm_once_running

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "config/models/tiny.yaml"
CAMERA = 48  # camera resolution of the synthetic dataset; the tiny model runs at 32


# Normalisation ranges for hand-built two-joint objectives and worlds (no dataset behind them).
TWO_JOINT_NORMALIZATION = {"action_low": [0.0, 0.0], "action_high": [1.0, 1.0], "joint_mean": [0.5, 0.5], "joint_std": [0.2, 0.2]}


def make_dataset(root: Path, episodes: int = 4, length: int = 24, seed: int = 0, block_moves: tuple[int, ...] = ()) -> Path:
    """A red square on a dark table; the action is the square's target position, reached 70% per step.
    With ``block_moves``, a blue block (push_t's T colour) also sits in a corner and shifts 3 px right
    at each of those frames."""
    rng = np.random.default_rng(seed)
    writer = DatasetWriter(root, (CAMERA, CAMERA), ["x_joint", "y_joint"], episodes * length,
                           meta={"control_rate_hz": 10.0, "profile": "synthetic"})
    for e in range(episodes):
        pos = rng.uniform(0.2, 0.8, 2)
        images, joints, actions = [], [], []
        for _ in range(length):
            action = np.clip(pos + rng.normal(0, 0.08, 2), 0.1, 0.9)
            image = np.full((CAMERA, CAMERA, 3), 30, np.uint8)
            cx, cy = (pos * CAMERA).astype(int)
            image[max(cy - 5, 0):cy + 5, max(cx - 5, 0):cx + 5] = (230, 60, 40)
            if block_moves:
                shift = 3 * sum(len(images) >= k for k in block_moves)
                image[2:8, 2 + shift:8 + shift] = (40, 60, 200)
            images.append(image), joints.append(pos.copy()), actions.append(action)
            pos = pos + 0.7 * (action - pos)
        writer.add_episode(np.stack(images), np.array(joints, np.float32), np.array(actions, np.float32),
                           np.arange(length) / 10.0, "val" if e == episodes - 1 else "train")
    return writer.close()


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "square")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, dataset_dir) -> Path:
    """All three stages of the tiny config (40 + 40 + 10 steps, a few seconds)."""
    out = tmp_path_factory.mktemp("runs") / "tiny"
    assert train.main(["--config", str(TINY), "--data", str(dataset_dir), "--out", str(out), "--device", "cpu"]) == 0
    return out


def episode_start(dataset_dir: Path, k: int):
    ep = Dataset(dataset_dir).episode(0)
    return ep["images"][:k], ep["joint_positions"][:k], ep["actions"][:k], ep["actions"][k - 1:]


def rollout(world: WorldModel, dataset_dir: Path, seed: int, steps: int = 4):
    images, joints, actions, future = episode_start(dataset_dir, world.config.window)
    world.reset(images, joints, actions, seed=seed)
    return [world.step(a) for a in future[:steps]]


# training --------------------------------------------------------------------------------------
def test_training_writes_checkpoint_and_losses_fall(run_dir):
    meta = json.loads((run_dir / "config.json").read_text())
    stages = meta["training"]["stages"]
    assert meta["training"]["completed"] == [1, 2, 3]
    assert stages["1"]["steps"] == 40 and stages["2"]["steps"] == 40
    assert stages["1"]["loss_last"] < 0.8 * stages["1"]["loss_first"], stages["1"]
    assert stages["2"]["dynamics_last"] < 0.5 * stages["2"]["dynamics_first"], stages["2"]
    norm = meta["normalization"]
    assert norm["joint_names"] == ["x_joint", "y_joint"]
    assert all(lo < hi for lo, hi in zip(norm["action_low"], norm["action_high"]))
    assert meta["dataset"]["image_size"] == [CAMERA, CAMERA]
    assert any((run_dir / "tb").iterdir())
    with np.load(run_dir / "start_windows.npz") as windows:
        assert windows["images"].shape[1:] == (3, CAMERA, CAMERA, 3)  # K = window frames at camera size


def test_resume_continues_from_saved_step(tmp_path, dataset_dir, monkeypatch):
    out = tmp_path / "run"
    args = ["--config", str(TINY), "--data", str(dataset_dir), "--out", str(out), "--stage", "1", "--device", "cpu"]
    calls = {"n": 0}
    original = train.StageObjective.forward

    def interrupted(self, batch):
        calls["n"] += 1
        if calls["n"] > 25:  # after the checkpoint at step 20
            raise KeyboardInterrupt
        return original(self, batch)

    monkeypatch.setattr(train.StageObjective, "forward", interrupted)
    assert train.main(args + ["--steps", "30"]) == 130  # Ctrl-C: a message, no traceback
    state = torch.load(out / train.STATE, weights_only=False)
    assert state["stage"] == 1 and state["step"] == 20
    monkeypatch.setattr(train.StageObjective, "forward", original)
    assert train.main(args + ["--steps", "30"]) == 2  # refuses to overwrite without --resume
    calls["n"] = 0
    monkeypatch.setattr(train.StageObjective, "forward", lambda self, b: (calls.__setitem__("n", calls["n"] + 1), original(self, b))[1])
    assert train.main(args + ["--steps", "30", "--resume"]) == 0
    assert calls["n"] == 10  # only the remaining steps ran
    state = torch.load(out / train.STATE, weights_only=False)
    assert state["step"] == 30 and state["completed"] == [1]
    assert state["optimizer"]["state"][0]["step"] == 30
    assert json.loads((out / "config.json").read_text())["training"]["stages"]["1"]["steps"] == 30


def test_sigterm_saves_the_current_step_and_resume_loses_nothing(tmp_path, dataset_dir):
    """`kill` (SIGTERM) of a background training process: it ends the step it is in, saves that
    step (not the last periodic checkpoint), exits 143, and --resume takes over from there."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "iws_world_model.train", "--config", str(TINY), "--data", str(dataset_dir),
            "--out", str(out), "--stage", "1", "--device", "cpu", "--threads", "1"]
    log = tmp_path / "train.log"
    # Started with SIGINT ignored, as a shell starts `cmd &`: SIGTERM must work regardless.
    status = sigterm_once_running(args + ["--steps", "100000"], log, "stage 1:", ignore_sigint=True)
    assert status == 128 + signal.SIGTERM, log.read_text()[-2000:]
    state = torch.load(out / train.STATE, weights_only=False)
    saved = state["step"]
    assert state["stage"] == 1 and saved > 0
    assert f"stopped by SIGTERM after stage 1 step {saved}," in log.read_text()
    assert json.loads((out / "config.json").read_text())["training"]["current"]["step"] == saved
    assert train.main(["--config", str(TINY), "--data", str(dataset_dir), "--out", str(out), "--stage", "1",
                       "--device", "cpu", "--steps", str(saved + 3), "--resume"]) == 0
    state = torch.load(out / train.STATE, weights_only=False)
    assert state["step"] == saved + 3 and state["optimizer"]["state"][0]["step"] == saved + 3


def test_learning_rate_override(tmp_path, dataset_dir):
    """--lr sets the peak rate of the stages it trains (a warm start usually wants a lower one)."""
    out = tmp_path / "run"
    args = ["--config", str(TINY), "--data", str(dataset_dir), "--out", str(out), "--stage", "1", "--device", "cpu",
            "--steps", "3"]
    assert train.main(args + ["--lr", "0"]) == 2 and not out.exists()
    assert train.main(args + ["--lr", "1e-5"]) == 0
    state = torch.load(out / train.STATE, weights_only=False)
    assert state["optimizer"]["param_groups"][0]["initial_lr"] == pytest.approx(1e-5)


def train_tiny_variant(tmp_path: Path, dataset_dir: Path, name: str, old: str, new: str, steps: int) -> WorldModel:
    """The tiny config with one line replaced, trained ``steps`` per stage into tmp_path/name and loaded."""
    text = TINY.read_text().replace(old, new)
    assert text != TINY.read_text(), f"{old!r} is not in {TINY.name}"
    config = tmp_path / f"tiny_{name}.yaml"
    config.write_text(text)
    out = tmp_path / name
    assert train.main(["--config", str(config), "--data", str(dataset_dir), "--out", str(out), "--steps", str(steps),
                       "--device", "cpu"]) == 0
    return WorldModel.load(out)


def test_mse_baseline_trains_and_rolls_out(tmp_path, dataset_dir):
    world = train_tiny_variant(tmp_path, dataset_dir, "mse", "decode_steps: 1", "decode_steps: 1\n  dynamics_objective: mse", 5)
    assert world.config.dynamics_objective == "mse"
    a, b = rollout(world, dataset_dir, seed=1), rollout(world, dataset_dir, seed=2)
    assert a[0][0].shape == (32, 32, 3)
    np.testing.assert_array_equal(a[-1][1], b[-1][1])  # deterministic dynamics: the seed moves nothing


def test_baseline_over_the_same_autoencoder(tmp_path, dataset_dir, run_dir):
    text = TINY.read_text().replace("decode_steps: 1", "decode_steps: 1\n  dynamics_objective: mse")
    cfg = tmp_path / "tiny_mse.yaml"
    cfg.write_text(text)
    out = tmp_path / "mse"
    assert train.main(["--config", str(cfg), "--data", str(dataset_dir), "--out", str(out), "--stage", "2",
                       "--steps", "3", "--init-autoencoder", str(run_dir), "--device", "cpu"]) == 0
    baseline, source = WorldModel.load(out).network, WorldModel.load(run_dir).network
    for name in ("encoder", "decoder"):
        for a, b in zip(getattr(baseline, name).state_dict().values(), getattr(source, name).state_dict().values()):
            assert torch.equal(a, b), f"the baseline's {name} must be the source's"
    dynamics = zip(baseline.dynamics.state_dict().values(), source.dynamics.state_dict().values())
    assert not all(torch.equal(a, b) for a, b in dynamics), "the baseline's dynamics is trained afresh"
    completed = json.loads((out / checkpoint.CONFIG).read_text())["training"]["completed"]
    assert sorted(completed) == [1, 2, 3]  # the source decoder's stage-3 fine-tune is part of what it took
    assert train.main(["--config", str(cfg), "--data", str(dataset_dir), "--out", str(tmp_path / "x"),
                       "--init-autoencoder", str(run_dir)]) == 2  # stage 1 would overwrite the autoencoder


def test_warm_start_adds_the_action_map_without_changing_the_model(tmp_path, dataset_dir):
    """--init-weights: a trained model without the spatial action map and command-reading joint head
    grows both, zero-initialised, so the warm-started model first predicts exactly what it did."""
    plain = tmp_path / "plain.yaml"
    plain.write_text(TINY.read_text().replace("action_map_channels: 2", "action_map_channels: 0")
                     .replace("joint_head_action: true", "joint_head_action: false"))
    source, grown = tmp_path / "source", tmp_path / "grown"
    assert train.main(["--config", str(plain), "--data", str(dataset_dir), "--out", str(source), "--steps", "3",
                       "--device", "cpu"]) == 0
    assert train.main(["--config", str(TINY), "--data", str(dataset_dir), "--out", str(grown), "--stage", "2",
                       "--steps", "0", "--init-weights", str(source), "--device", "cpu"]) == 0
    old, new = WorldModel.load(source), WorldModel.load(grown)
    assert old.network.dynamics.action_map is None and new.network.dynamics.action_map is not None
    (image_old, joints_old), (image_new, joints_new) = rollout(old, dataset_dir, 5)[-1], rollout(new, dataset_dir, 5)[-1]
    np.testing.assert_array_equal(image_old, image_new)
    np.testing.assert_allclose(joints_old, joints_new, atol=1e-6)
    warm = json.loads((grown / checkpoint.CONFIG).read_text())["training"]["warm_start"]
    assert warm["from"] == str(source) and "dynamics.action_stem" in warm["fresh"] and "joint_head.action_in" in warm["fresh"]
    with pytest.raises(SystemExit):  # one or the other
        train.main(["--config", str(TINY), "--data", str(dataset_dir), "--out", str(tmp_path / "x"), "--stage", "2",
                    "--init-weights", str(source), "--init-autoencoder", str(source)])


def test_warm_start_onto_a_longer_window_keeps_the_trained_distance_biases(tmp_path, dataset_dir, run_dir):
    """--init-weights from a 3-frame history onto a 5-frame one: every tensor is taken, each temporal
    attention's bias per frame distance keeps its trained values, the new distances start at the
    farthest trained one, and the longer model rolls out from 5 real frames."""
    longer = tmp_path / "window5.yaml"
    longer.write_text(TINY.read_text().replace("window: 3", "window: 5"))
    out = tmp_path / "window5"
    assert train.main(["--config", str(longer), "--data", str(dataset_dir), "--out", str(out), "--stage", "2",
                       "--steps", "0", "--init-weights", str(run_dir), "--device", "cpu"]) == 0
    old, new = WorldModel.load(run_dir), WorldModel.load(out)
    assert (old.config.window, new.config.window) == (3, 5)
    assert json.loads((out / checkpoint.CONFIG).read_text())["training"]["warm_start"]["fresh"] == []
    for before, after in zip(old.network.dynamics.attention, new.network.dynamics.attention):
        assert after.distance_bias.shape == (before.distance_bias.shape[0], 6)
        torch.testing.assert_close(after.distance_bias[:, :4], before.distance_bias)
        torch.testing.assert_close(after.distance_bias[:, 4:], before.distance_bias[:, -1:].expand(-1, 2))
    assert any(a.distance_bias.abs().sum() > 0 for a in old.network.dynamics.attention), "trained biases to keep"
    with np.load(out / "start_windows.npz") as windows:
        assert windows["images"].shape[1] == 5  # a node starts the longer model from 5 real frames
    frames = rollout(new, dataset_dir, 4)
    assert len(frames) == 4 and all(np.isfinite(joints).all() for _, joints in frames)


def self_forcing_setup(tmp_path, dataset_dir, run_dir, extra: str):
    """The trained tiny network under a stage-2 objective configured by ``extra`` (train keys), and a
    batch of 16 windows of the length that config asks for: (objective, config path, latents, actions)."""
    cfg_path = tmp_path / "tiny_self_forcing.yaml"
    cfg_path.write_text(TINY.read_text().replace("checkpoint_every: 20", "checkpoint_every: 20\n" + extra))
    model_cfg, train_cfg = load_config(cfg_path)
    network, meta = checkpoint.load(run_dir)
    objective = train.StageObjective(network, 2, train_cfg, meta["normalization"])
    data = train.WindowData(Dataset(dataset_dir), train.StageObjective.window_length(model_cfg, train_cfg))
    batch = torch.utils.data.default_collate([data[i] for i in range(16)])
    with torch.no_grad():
        latents = network.encoder(objective._images(batch).flatten(0, 1)).reshape(16, -1, *objective._latent_shape())
    return objective, cfg_path, latents, objective._actions(batch)


def chained_by_recomputing(objective, history, actions, first: int, share: int = 8) -> torch.Tensor:
    """The definition of self-forcing without the key/value cache: from frame ``first`` on, every
    prediction recomputes the whole sequence before it (causal attention, each frame the window
    before it), which the cache reproduces as streaming inference uses it."""
    network, cfg = objective.network, objective.network.config
    own, top = history[:share].clone(), objective.schedule.timesteps - 1
    for j in range(first, history.shape[1]):
        noise = noise_like(own[:, j])
        t = torch.full((share, j + 1), cfg.history_level, dtype=torch.long)
        t[:, -1] = top
        s = t.clone()
        s[:, -1] = 0
        with torch.no_grad():
            v = network.dynamics(torch.cat([own[:, :j], noise[:, None]], 1), t, s, actions[:share, :j + 1], last_only=True)
        own[:, j] = normalize_latent(objective.schedule.x0_from_v(noise, t[:, -1], v[:, -1]))
    return own


def test_self_forcing_feeds_the_models_own_predictions_as_history(tmp_path, dataset_dir, run_dir):
    """self_forcing_fraction replaces the newest history frames of that share of a stage-2 batch by
    the model's own chained predictions (close to the real latents, not equal), leaves the oldest
    frame and the rest of the batch real, and trains to a finite loss."""
    objective, cfg_path, latents, actions = self_forcing_setup(
        tmp_path, dataset_dir, run_dir, "  self_forcing_fraction: 0.5\n  self_forcing_frames: 2")
    history = latents[:, :-1]
    k = history.shape[1]
    assert k == objective.network.config.window  # a chain within the window: windows of K + 1 frames
    torch.manual_seed(0)
    forced = objective._self_forced(history, actions)
    assert torch.equal(forced[8:], history[8:]) and torch.equal(forced[:, :k - 2], history[:, :k - 2])
    own_error = (forced[:8, k - 2:] - history[:8, k - 2:]).pow(2).mean()
    unrelated = (history[:8, k - 2:] - history[8:, k - 2:]).pow(2).mean()  # other windows' latents
    assert 0 < own_error < unrelated, (own_error, unrelated)
    torch.manual_seed(0)
    assert torch.equal(objective._self_forced(history, actions), forced)  # seeded: reproducible
    torch.manual_seed(0)
    torch.testing.assert_close(forced[:8], chained_by_recomputing(objective, history, actions, k - 2),
                               atol=1e-5, rtol=1e-4)

    out = tmp_path / "self_forced"
    assert train.main(["--config", str(cfg_path), "--data", str(dataset_dir), "--out", str(out), "--stage", "2",
                       "--steps", "20", "--init-weights", str(run_dir), "--device", "cpu"]) == 0
    stats = json.loads((out / checkpoint.CONFIG).read_text())["training"]["stages"]["2"]
    assert np.isfinite(stats["dynamics_last"]) and np.isfinite(stats["loss_last"])


def test_self_forcing_deeper_than_the_window_trains_on_a_wholly_own_history(tmp_path, dataset_dir, run_dir):
    """A chain deeper than the history (5 own steps, window 3) lengthens the windows to 7 frames; the
    trained step sees the newest K frames, all of them the model's own predictions for the forced
    share, each made over the frames before it as a rollout makes it; with a minimum, the depth
    varies from batch to batch."""
    objective, cfg_path, latents, actions = self_forcing_setup(
        tmp_path, dataset_dir, run_dir, "  self_forcing_fraction: 0.5\n  self_forcing_frames: 5")
    k = objective.network.config.window
    assert latents.shape[1] == 5 + 2  # one real frame to start from, five own, the target
    history = latents[:, :-1]
    torch.manual_seed(0)
    forced = objective._self_forced(history, actions)
    assert forced.shape == (16, k, *history.shape[2:])
    assert torch.equal(forced[8:], history[8:, -k:])  # the unforced share: its real newest K frames
    own_error = (forced[:8] - history[:8, -k:]).pow(2).flatten(2).mean(2)
    assert (own_error > 0).all()  # every frame the trained step sees is predicted
    torch.manual_seed(0)
    torch.testing.assert_close(forced[:8], chained_by_recomputing(objective, history, actions, 1)[:, -k:],
                               atol=1e-5, rtol=1e-4)

    # Drawn depth 2..5: a depth of 2 keeps one real frame among the K, deeper ones none.
    objective.train_cfg = dataclasses.replace(objective.train_cfg, self_forcing_min_frames=2)
    torch.manual_seed(1)
    real_kept = {int(sum(torch.equal(f[:8, i], history[:8, -k + i]) for i in range(k)))
                 for f in (objective._self_forced(history, actions) for _ in range(30))}
    assert real_kept == {0, 1}, real_kept

    out = tmp_path / "deep"
    assert train.main(["--config", str(cfg_path), "--data", str(dataset_dir), "--out", str(out), "--stage", "2",
                       "--steps", "10", "--init-weights", str(run_dir), "--device", "cpu"]) == 0
    stats = json.loads((out / checkpoint.CONFIG).read_text())["training"]["stages"]["2"]
    assert np.isfinite(stats["dynamics_last"]) and np.isfinite(stats["loss_last"])


def test_stage4_is_stage2_again_on_deeper_chains(tmp_path, dataset_dir, run_dir, monkeypatch):
    """Stage 4 trains the dynamics once more with its own self-forcing keys: from the same weights
    it gives exactly what stage 2 gives under a config whose self-forcing keys hold stage 4's (the
    two-command recipe it replaces), and `--stage all` runs it last, over the latents stage 2 encoded."""
    chains = ("  stage4: {steps: 6, lr: 1.0e-3, batch_size: 8, warmup: 2, final_lr_fraction: 0.1}\n"
              "  stage4_self_forcing_fraction: 0.5\n  stage4_self_forcing_frames: 4\n  stage4_self_forcing_min_frames: 1\n")
    as_stage2 = ("  stage2: {steps: 6, lr: 1.0e-3, batch_size: 8, warmup: 2, final_lr_fraction: 0.1}\n"
                 "  self_forcing_fraction: 0.5\n  self_forcing_frames: 4\n  self_forcing_min_frames: 1\n")
    base = TINY.read_text()
    with_stage4 = tmp_path / "tiny_stage4.yaml"
    with_stage4.write_text(base + chains)
    stage2_alike = tmp_path / "tiny_chains.yaml"
    stage2_alike.write_text(base.replace("  stage2: {steps: 40, lr: 2.0e-3, batch_size: 8, warmup: 5}\n", "") + as_stage2)
    common = ["--data", str(dataset_dir), "--init-weights", str(run_dir), "--device", "cpu"]
    assert train.main(["--config", str(with_stage4), "--out", str(tmp_path / "s4"), "--stage", "4"] + common) == 0
    assert train.main(["--config", str(stage2_alike), "--out", str(tmp_path / "s2"), "--stage", "2"] + common) == 0
    four, two = (load_file(str(tmp_path / name / checkpoint.WEIGHTS)) for name in ("s4", "s2"))
    before = load_file(str(run_dir / checkpoint.WEIGHTS))
    assert any(not torch.equal(four[k], before[k]) for k in four if k.startswith("dynamics."))
    assert all(torch.equal(four[k], before[k]) for k in four if k.startswith(("encoder.", "decoder.")))
    assert four.keys() == two.keys() and all(torch.equal(four[k], two[k]) for k in four)
    meta = json.loads((tmp_path / "s4" / checkpoint.CONFIG).read_text())["training"]
    assert meta["completed"] == [1, 2, 3, 4] and meta["stages"]["4"]["steps"] == 6

    # The dynamics stages alone over another run's autoencoder, in one process, at another batch size.
    both = tmp_path / "s24"
    assert train.main(["--config", str(with_stage4), "--out", str(both), "--stage", "2,4", "--steps", "4",
                       "--batch-size", "4", "--data", str(dataset_dir), "--init-autoencoder", str(run_dir),
                       "--device", "cpu"]) == 0
    meta = json.loads((both / checkpoint.CONFIG).read_text())["training"]
    assert meta["completed"] == [1, 3, 2, 4]
    assert all(meta["stages"][k]["steps"] == 4 and meta["stages"][k]["batch_size"] == 4 for k in ("2", "4"))
    for bad in ("4,2", "2,2", "6", "two"):
        with pytest.raises(SystemExit):
            train.main(["--config", str(with_stage4), "--out", str(both), "--stage", bad, "--data", str(dataset_dir)])

    encoded = []
    encode = train.Trainer.encode_dataset
    monkeypatch.setattr(train.Trainer, "encode_dataset", lambda self, **kw: encoded.append(1) or encode(self, **kw))
    out = tmp_path / "all"
    assert train.main(["--config", str(with_stage4), "--data", str(dataset_dir), "--out", str(out), "--device", "cpu"]) == 0
    meta = json.loads((out / checkpoint.CONFIG).read_text())["training"]
    assert meta["completed"] == [1, 2, 3, 4] and meta["stages"]["4"]["steps"] == 6
    assert np.isfinite(meta["stages"]["4"]["dynamics_last"])
    assert len(encoded) == 1  # stage 4 reused stage 2's latents


def test_stage3_decodes_the_dynamics_own_predictions(tmp_path, dataset_dir, run_dir, monkeypatch):
    """stage3_predicted_fraction: that share of a stage-3 batch conditions the decoder on the
    dynamics' own prediction of the target frame (the end of a chain of 1..stage3_chain_frames of
    them, as a rollout makes them), the rest on the encoder's latent plus a little noise; the run
    trains the decoder alone, over latents encoded once, and the same step from images agrees."""
    cfg_path = tmp_path / "tiny_predicted.yaml"
    cfg_path.write_text(TINY.read_text() + "  stage3_predicted_fraction: 0.5\n  stage3_chain_frames: 3\n")
    model_cfg, train_cfg = load_config(cfg_path)
    k = model_cfg.window
    assert train.StageObjective.window_length(model_cfg, train_cfg, 3) == k + 3
    assert train.StageObjective.window_length(*load_config(TINY), 3) == 1  # off: the paper's stage 3, one frame
    trainer = train.Trainer(model_cfg, train_cfg, Dataset(dataset_dir), tmp_path / "unused", torch.device("cpu"))
    trainer.load_weights(run_dir)
    objective = train.StageObjective(trainer.network, 3, train_cfg, trainer.normalization)
    cached = train.WindowData(Dataset(dataset_dir), k + 3, latents=trainer.encode_dataset(), last_image=True)
    batch = torch.utils.data.default_collate([cached[i] for i in range(8)])
    assert batch["latents"].shape[1] == k + 3 and batch["images"].shape[1] == 1  # the target's image alone

    decoded = []
    monkeypatch.setattr(objective, "_decoder_loss", lambda image, latent, t, s: decoded.append((image, latent)) or
                        train.StageObjective._decoder_loss(objective, image, latent, t, s))
    for source in (batch, torch.utils.data.default_collate(
            [train.WindowData(Dataset(dataset_dir), k + 3)[i] for i in range(8)])):  # from images: encoded here
        torch.manual_seed(5)
        objective(source)
    (image, latent), (image_again, latent_again) = decoded
    torch.testing.assert_close(latent_again, latent, atol=1e-5, rtol=1e-4)
    assert torch.equal(image, image_again) and image.shape[0] == 8
    real = batch["latents"][:, -1]
    torch.manual_seed(5)
    torch.randn(real.shape)  # the encoder latents' noise, drawn first
    depth = int(torch.randint(1, 4, ()))
    own = objective._own_chain(batch["latents"], objective._actions(batch), 4, depth)[:4, -1]
    torch.testing.assert_close(latent[:4], own, atol=1e-5, rtol=1e-4)
    predicted_gap = (latent[:4] - real[:4]).pow(2).mean()
    noise_gap = (latent[4:] - real[4:]).pow(2).mean()
    unrelated = (real[:4] - real[4:]).pow(2).mean()
    assert 0 < noise_gap < predicted_gap < unrelated, (noise_gap, predicted_gap, unrelated)

    encoded = []
    encode = train.Trainer.encode_dataset
    monkeypatch.setattr(train.Trainer, "encode_dataset", lambda self, **kw: encoded.append(1) or encode(self, **kw))
    out = tmp_path / "predicted"
    assert train.main(["--config", str(cfg_path), "--data", str(dataset_dir), "--out", str(out), "--stage", "3",
                       "--steps", "6", "--init-weights", str(run_dir), "--device", "cpu"]) == 0
    after, before = load_file(str(out / checkpoint.WEIGHTS)), load_file(str(run_dir / checkpoint.WEIGHTS))
    assert any(not torch.equal(after[name], before[name]) for name in after if name.startswith("decoder."))
    assert all(torch.equal(after[name], before[name]) for name in after if not name.startswith("decoder."))
    assert len(encoded) == 1
    stats = json.loads((out / checkpoint.CONFIG).read_text())["training"]["stages"]["3"]
    assert stats["steps"] == 6 and np.isfinite(stats["loss_last"])
    # --stage all renders the final dynamics: stage 3 runs after stage 4 when it decodes predictions.
    _, with_stage4 = load_config(cfg_path)
    with_stage4.stage4.steps = 5
    assert train.all_stages(with_stage4) == [1, 2, 4, 3]
    assert train.all_stages(load_config(TINY)[1]) == [1, 2, 3]
    assert train.all_stages(dataclasses.replace(with_stage4, stage3_predicted_fraction=0.0)) == [1, 2, 3, 4]


def test_dynamics_pixel_weight_trains_the_dynamics_through_the_frozen_decoder(tmp_path, dataset_dir, run_dir):
    """dynamics_pixel_weight adds the pixel error of the predicted latent as a rollout renders it
    (one decoder jump from noise) against the real frame: its gradient reaches the dynamics through
    the decoder, which stays as it was; windows of cached latents then carry the target's image."""
    objective, cfg_path, latents, actions = self_forcing_setup(tmp_path, dataset_dir, run_dir, "  dynamics_pixel_weight: 1.0")
    data = train.WindowData(Dataset(dataset_dir), objective.network.config.window + 1, last_image=True,
                            latents=latents.new_zeros(len(Dataset(dataset_dir)), *latents.shape[2:]))
    assert data[0]["images"].shape[0] == 1
    batch = torch.utils.data.default_collate([train.WindowData(Dataset(dataset_dir), latents.shape[1])[i] for i in range(16)])
    prediction = latents[:, -1].clone().requires_grad_(True)
    error = objective._decoded_error(normalize_latent(prediction), batch)
    error.backward()
    assert error > 0 and prediction.grad.abs().sum() > 0
    assert all(p.grad is None for p in objective.network.decoder.parameters())
    with pytest.raises(KeyError, match="last_image"):
        objective._decoded_error(latents[:, -1], {"latents": latents})

    out = tmp_path / "pixels"
    assert train.main(["--config", str(cfg_path), "--data", str(dataset_dir), "--out", str(out), "--stage", "2",
                       "--steps", "6", "--init-weights", str(run_dir), "--device", "cpu"]) == 0
    after, before = load_file(str(out / checkpoint.WEIGHTS)), load_file(str(run_dir / checkpoint.WEIGHTS))
    assert all(torch.equal(after[name], before[name]) for name in after if name.startswith(("encoder.", "decoder.")))
    assert any(not torch.equal(after[name], before[name]) for name in after if name.startswith("dynamics."))
    stats = json.loads((out / checkpoint.CONFIG).read_text())["training"]["stages"]["2"]
    assert np.isfinite(stats["pixels_last"]) and stats["pixels_last"] > 0


def test_adversarial_term_trains_a_critic_beside_the_dynamics(tmp_path, dataset_dir, run_dir):
    """dynamics_adversarial_weight: a patch critic learns in step with the dynamics (one hinge step per
    batch); after critic_warmup steps alone its pull on the dynamics is that fraction of the latent
    loss's gradient at the output layer; it is no part of the checkpoint, and --resume takes it up
    where it stopped."""
    extra = "  dynamics_adversarial_weight: 0.5\n  critic_warmup: 2"
    objective, cfg_path, _, _ = self_forcing_setup(tmp_path, dataset_dir, run_dir, extra)
    assert objective.critic is not None
    assert not {id(p) for p in objective.critic.parameters()} & {id(p) for p in objective.trainable_parameters()}
    data = train.WindowData(Dataset(dataset_dir), objective.network.config.window + 1)
    batch = torch.utils.data.default_collate([data[i] for i in range(16)])
    before = [p.detach().clone() for p in objective.critic.parameters()]
    objective.train()
    terms = objective(batch)
    assert terms["critic"] > 0 and torch.isfinite(terms["adversarial"])
    assert any(not torch.equal(a, b) for a, b in zip(before, objective.critic.parameters()))  # the critic stepped
    layer = objective.network.dynamics.out.weight
    plain = train.StageObjective(objective.network, 2, dataclasses.replace(objective.train_cfg, dynamics_adversarial_weight=0.0),
                                 checkpoint.load(run_dir)[1]["normalization"])
    assert plain.critic is None

    def gradient(of):
        torch.manual_seed(0)
        return torch.autograd.grad(of(batch)["loss"], layer)[0]

    latent_grad = gradient(plain)
    objective.critic_optimizer.param_groups[0]["lr"] = 0.0  # the same critic for the passes below
    assert torch.equal(gradient(objective), latent_grad)   # critic step 2 of a warm-up of 2: no pull yet
    total_grad = gradient(objective)                        # step 3: the pull is on
    # The adversarial share of the gradient: half the latent loss's norm (the joint head has no
    # weight at this layer, so the difference is the critic's pull alone).
    pull = torch.linalg.vector_norm(total_grad - latent_grad)
    assert float(pull) == pytest.approx(0.5 * float(torch.linalg.vector_norm(latent_grad)), rel=1e-3)

    out = tmp_path / "adversarial"
    args = ["--config", str(cfg_path), "--data", str(dataset_dir), "--out", str(out), "--stage", "2",
            "--init-weights", str(run_dir), "--device", "cpu"]
    assert train.main(args + ["--steps", "3"]) == 0
    state = torch.load(out / train.STATE, weights_only=False)
    assert state["objective"]["critic_optimizer"]["state"][0]["step"] == 3
    assert not any(name.startswith("critic") for name in load_file(str(out / checkpoint.WEIGHTS)))
    assert train.main(args + ["--steps", "5", "--resume"]) == 0
    state = torch.load(out / train.STATE, weights_only=False)
    assert state["objective"]["critic_optimizer"]["state"][0]["step"] == 5  # resumed, not restarted
    stats = json.loads((out / checkpoint.CONFIG).read_text())["training"]["stages"]["2"]
    assert np.isfinite(stats["adversarial_last"]) and stats["critic_last"] > 0


def test_dataset_packed_for_a_gpu_machine_unpacks_to_the_same_bytes(tmp_path, dataset_dir):
    """tools/dataset_xz.py (how push_t's 3.3 GB travel to a lent GPU as 20 MB): every file and every
    byte of the images comes back, with more parts than jobs and a last part shorter than the rest."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import dataset_xz
    finally:
        sys.path.remove(str(ROOT / "tools"))
    packed, restored = tmp_path / "packed", tmp_path / "restored"
    dataset_xz.main(["pack", str(dataset_dir), str(packed), "--parts", "7", "--jobs", "2"])
    assert not (packed / "images.npy").exists() and len(list(packed.glob("images.*.xz"))) == 7
    manifest = json.loads((packed / "parts.json").read_text())
    offsets = [offset for _, offset in manifest["parts"]]
    assert manifest["bytes"] - offsets[-1] < offsets[1]  # the last part is the short one
    dataset_xz.main(["unpack", str(packed), str(restored), "--jobs", "2"])
    assert sorted(p.name for p in restored.iterdir()) == sorted(p.name for p in dataset_dir.iterdir())
    for path in dataset_dir.iterdir():
        assert (restored / path.name).read_bytes() == path.read_bytes(), path.name
    assert len(Dataset(restored)) == len(Dataset(dataset_dir))
    with pytest.raises(SystemExit, match="no images.npy"):
        dataset_xz.main(["pack", str(tmp_path), str(tmp_path / "nothing")])


def test_training_device_names_the_gpu_of_this_process(monkeypatch):
    """`--device cuda` once failed on a GPU machine (set_device needs an index): a bare "cuda" is
    the process's own GPU, torchrun's LOCAL_RANK."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert train.training_device("cuda") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert train.training_device("cuda") == torch.device("cuda", 3)
    assert train.training_device("cuda:1") == torch.device("cuda", 1)
    assert train.training_device("cpu") == torch.device("cpu")
    assert train.training_device(None) == (torch.device("cuda", 3) if torch.cuda.is_available() else torch.device("cpu"))


def test_motion_oversampling_draws_the_windows_where_the_object_moves(tmp_path, capsys):
    moves = (6, 15)
    data_dir = make_dataset(tmp_path / "block", block_moves=moves)
    data = train.WindowData(Dataset(data_dir), 5, "train")
    cfg = load_config(TINY)[1]
    weights = train.motion_weights(data, dataclasses.replace(cfg, motion_oversample=4.0))
    episodes = {e.start: e for e in Dataset(data_dir).episodes}
    target_in_episode = [int(s) + 4 - max(k for k in episodes if k <= s) for s in data.starts]
    expected = np.array([4.0 if t in moves else 1.0 for t in target_in_episode])
    np.testing.assert_array_equal(weights, expected)
    assert (weights > 1).sum() == 2 * 3  # two moves in each of the three training episodes

    # Drawn in proportion: the moving windows make 4 * 6 / (4 * 6 + 54) = 31 % of the draws, not 10 %.
    stream = train.batches(data, 8, seed=0, rank=0, world=1, workers=0, device=torch.device("cpu"), weights=weights)
    latest = [next(stream)["images"][:, -1] for _ in range(200)]
    moving_images = {bytes(data.dataset.images[int(s) + 4].tobytes()) for s, w in zip(data.starts, weights) if w > 1}
    share = np.mean([bytes(img.numpy().tobytes()) in moving_images for batch in latest for img in batch])
    assert 0.24 < share < 0.38, share

    with pytest.raises(ConfigError, match="motion_task"):
        train.motion_weights(data, dataclasses.replace(cfg, motion_oversample=2.0, motion_task="rope"))

    # Through the trainer: stage 2 trains on the weighted draw and says what it drew.
    config = tmp_path / "tiny_motion.yaml"
    config.write_text(TINY.read_text().replace("train:\n", "train:\n  motion_oversample: 4.0\n"))
    assert train.main(["--config", str(config), "--data", str(data_dir), "--out", str(tmp_path / "run"),
                       "--device", "cpu"]) == 0
    assert (tmp_path / "run" / "model.safetensors").is_file()
    # The tiny config's window is 3: 6 of 63 windows, 4 * 6 / (4 * 6 + 57) of the draws.
    assert "9.5% of the windows move the push_t object; drawn 4x as often, they make 29.6% of the batches" \
        in capsys.readouterr().err


def test_goal_undersampling_draws_the_windows_on_a_covered_goal_less_often(tmp_path):
    data = train.WindowData(Dataset(make_dataset(tmp_path / "d")), 3, "train")
    cfg = dataclasses.replace(load_config(TINY)[1], goal_undersample=0.1)
    targets = np.asarray(data.starts) + 2
    visible = np.full(len(data.dataset.images), 100)
    visible[targets[:5]] = 15  # the goal 85 % covered in the target frames of five windows
    weights = train.goal_weights(data, cfg, visible)
    np.testing.assert_array_equal(weights, np.where(np.arange(len(weights)) < 5, 0.1, 1.0))
    visible[targets[:5]] = 25  # 75 % covered: not the task done at the default 0.8
    assert (train.goal_weights(data, cfg, visible) == 1).all()
    with pytest.raises(ConfigError, match="visible in none"):
        train.goal_weights(data, cfg, np.zeros_like(visible))
    # the pixel pass counts the green goal's pixels left visible: the blue T on it hides them
    images = np.full((3, 16, 16, 3), 200, np.uint8)
    images[:, 4:8, 4:8] = (140, 217, 140)
    images[1, 4:8, 4:7] = (40, 60, 200)
    assert list(train.goal_cover_pass(images, "push_t", quiet=True)) == [16, 4, 16]
    with pytest.raises(ConfigError, match="no goal mask"):
        train.goal_cover_pass(images, "rope", quiet=True)


def test_multistep_dynamics_trains_the_jumps_it_rolls_out_with(tmp_path, dataset_dir, run_dir):
    """dynamics_jump_fraction starts half of each stage-2 batch's targets at the intermediate noise
    levels of 2- and 3-step inference (499; 666, 333) instead of 999, all regressed onto the clean
    latent; a model so trained rolls out with 1-3 steps, streaming or recomputing its window alike."""
    cfg_path = tmp_path / "tiny_jumps.yaml"
    cfg_path.write_text(TINY.read_text().replace("decode_steps: 1", "decode_steps: 1\n  dynamics_steps: 2")
                        .replace("checkpoint_every: 20", "checkpoint_every: 20\n  dynamics_jump_fraction: 0.5"))
    model_cfg, train_cfg = load_config(cfg_path)
    network = WorldModelNetwork(model_cfg, joint_dim=2)
    objective = train.StageObjective(network, 2, train_cfg, TWO_JOINT_NORMALIZATION)
    seen = []
    real_dynamics = network.dynamics.forward
    network.dynamics.forward = lambda x, t, s, *a, **k: seen.append((t[:, -1].clone(), s[:, -1].clone())) or real_dynamics(x, t, s, *a, **k)
    data = train.WindowData(Dataset(dataset_dir), model_cfg.window + 1)
    torch.manual_seed(0)
    objective(torch.utils.data.default_collate([data[i] for i in range(16)]))
    (t, s), = seen
    assert t[:8].tolist() == [999] * 8 and s.tolist() == [0] * 16
    assert set(t[8:].tolist()) <= {333, 499, 666} and len(set(t[8:].tolist())) > 1
    # dynamics_jump_levels: uniform draws that share's levels from 1..998 (a denoiser at every level)
    seen.clear()
    uniform = train.StageObjective(network, 2, dataclasses.replace(train_cfg, dynamics_jump_levels="uniform"), TWO_JOINT_NORMALIZATION)
    uniform(torch.utils.data.default_collate([data[i] for i in range(16)]))
    (t, s), = seen
    assert t[:8].tolist() == [999] * 8 and s.tolist() == [0] * 16
    assert all(1 <= v <= 998 for v in t[8:].tolist()) and not set(t[8:].tolist()) <= {333, 499, 666}

    out = tmp_path / "jumps"
    assert train.main(["--config", str(cfg_path), "--data", str(dataset_dir), "--out", str(out), "--stage", "2",
                       "--steps", "20", "--init-weights", str(run_dir), "--device", "cpu"]) == 0
    stats = json.loads((out / checkpoint.CONFIG).read_text())["training"]["stages"]["2"]
    assert np.isfinite(stats["dynamics_last"]) and np.isfinite(stats["loss_last"])
    latents = {}
    for steps in (1, 2, 3):
        streaming = WorldModel.load(out, dynamics_steps=steps)
        recompute = WorldModel.load(out, dynamics_steps=steps, streaming=False)
        rollout(streaming, dataset_dir, 3, steps=1), rollout(recompute, dataset_dir, 3, steps=1)
        torch.testing.assert_close(streaming.latent, recompute.latent, atol=1e-5, rtol=1e-5)
        latents[steps] = streaming.latent
    assert WorldModel.load(out).dynamics_steps == 2  # the config's choice
    assert not torch.allclose(latents[1], latents[2]) and not torch.allclose(latents[2], latents[3])
    with pytest.raises(ValueError, match="dynamics_steps"):
        WorldModel.load(out, dynamics_steps=4)


def test_l1_dynamics_distance_trains_the_median_and_logs_the_squared_error(dataset_dir):
    """dynamics_distance: l1 trains the next latent's absolute error (its per-element median); the
    logged "dynamics" stays the squared error, so runs of either distance compare."""
    model_cfg, train_cfg = load_config(TINY)
    network = WorldModelNetwork(model_cfg, joint_dim=2)
    data = train.WindowData(Dataset(dataset_dir), train.StageObjective.window_length(model_cfg, train_cfg))
    batch = torch.utils.data.default_collate([data[i] for i in range(8)])
    out = {}
    for distance in ("l2", "l1"):
        objective = train.StageObjective(network, 2, dataclasses.replace(train_cfg, dynamics_distance=distance), TWO_JOINT_NORMALIZATION)
        torch.manual_seed(0)
        out[distance] = {k: v.item() for k, v in objective(batch).items()}
    assert out["l1"]["dynamics"] == pytest.approx(out["l2"]["dynamics"]) and out["l1"]["joint"] == pytest.approx(out["l2"]["joint"])
    squared = out["l2"]["loss"] - train_cfg.joint_loss_weight * out["l2"]["joint"]
    absolute = out["l1"]["loss"] - train_cfg.joint_loss_weight * out["l1"]["joint"]
    assert squared == pytest.approx(out["l2"]["dynamics"], rel=1e-5)
    assert squared < absolute <= squared ** 0.5 * (1 + 1e-5)  # |e| > e^2 for small errors; mean|e| <= rms(e)


def test_object_loss_weight_weighs_the_cells_the_object_covers(tmp_path):
    """object_loss_weight: the latent cells the task's object covers (in the target or the last
    history frame, grown by one cell) weigh 1 + w in the dynamics loss; "dynamics" is logged unweighted."""
    data_dir = make_dataset(tmp_path / "block", block_moves=(6, 15))
    dataset = Dataset(data_dir)
    changed, cells = train.object_mask_pass(dataset.images, "push_t", latent_size=8, quiet=True)
    # The 48 px camera pools to 8x8 cells of 6 px: the block (rows 2-7, columns 2-7, then 5-10, then 8-13).
    first = dataset.episodes[1].start
    for frame, columns in ((0, slice(0, 2)), (6, slice(0, 2)), (15, slice(1, 3))):
        expected = np.zeros((8, 8), bool)
        expected[0:2, columns] = True
        np.testing.assert_array_equal(cells[first + frame].numpy(), expected)
    # A 3 px shift of the 6 px block changes 2 x 3 x 6 mask pixels, counted across chunk seams alike.
    assert changed[first + 6] == changed[first + 15] == 36 and changed[first + 7] == 0
    np.testing.assert_array_equal(train.object_mask_pass(dataset.images, "push_t", chunk=7, quiet=True)[0], changed)

    model_cfg, train_cfg = load_config(TINY)
    network = WorldModelNetwork(model_cfg, joint_dim=2)
    weighted = train.StageObjective(network, 2, dataclasses.replace(train_cfg, object_loss_weight=8.0), TWO_JOINT_NORMALIZATION)
    on, off = torch.zeros(1, 4, 8, 8), torch.zeros(1, 4, 8, 8)
    on[..., 3, 3], off[..., 0, 7] = 1.0, 1.0
    total = 9 * 9 + 55  # the object's cell grown to 3x3 weighs 9, the other 55 cells 1
    for newest in (0, 1):  # where the object was (last history frame) or is (target)
        object_cells = torch.zeros((1, 2, 8, 8), dtype=torch.bool)
        object_cells[0, newest, 3, 3] = True
        assert weighted._object_weighted(on, {"object_cells": object_cells}).item() == pytest.approx(9 / total)
        assert weighted._object_weighted(off, {"object_cells": object_cells}).item() == pytest.approx(1 / total)
    with pytest.raises(KeyError, match="object_cells"):
        weighted._object_weighted(on, {})

    # On a real batch: the trained term changes, the logged one does not.
    data = train.WindowData(dataset, train.StageObjective.window_length(model_cfg, train_cfg), object_cells=cells)
    batch = torch.utils.data.default_collate([data[i] for i in range(8)])
    assert batch["object_cells"].shape == (8, data.length, 8, 8)
    plain = train.StageObjective(network, 2, train_cfg, TWO_JOINT_NORMALIZATION)
    terms = {}
    for name, objective in (("plain", plain), ("weighted", weighted)):
        torch.manual_seed(0)
        terms[name] = {k: v.item() for k, v in objective(batch).items()}
    assert terms["weighted"]["dynamics"] == pytest.approx(terms["plain"]["dynamics"])
    assert terms["weighted"]["loss"] != pytest.approx(terms["plain"]["loss"])

    config = tmp_path / "tiny_object.yaml"  # through the trainer: stage 2 draws the cells with the windows
    config.write_text(TINY.read_text().replace("train:\n", "train:\n  object_loss_weight: 8.0\n"))
    assert train.main(["--config", str(config), "--data", str(data_dir), "--out", str(tmp_path / "run"),
                       "--steps", "5", "--device", "cpu"]) == 0
    stats = json.loads((tmp_path / "run" / checkpoint.CONFIG).read_text())["training"]["stages"]["2"]
    assert np.isfinite(stats["loss_last"]) and np.isfinite(stats["dynamics_last"])


@pytest.mark.parametrize("skip", ["last", "gated"])
def test_dynamics_skip_starts_as_a_copy_of_the_last_latent(tmp_path, dataset_dir, run_dir, skip):
    """dynamics_skip: the estimate of the next latent is the newest history latent (times a gate for
    "gated") plus the network's output, in training, self-forcing and inference alike. The output
    conv starts at zero (the gate half open), so an untrained dynamics with the skip copies the last
    latent (after the per-cell normalisation) where the plain one returns ~0."""
    trained = WorldModel.load(run_dir)
    cfg = trained.config
    images, joints, actions, future = episode_start(dataset_dir, cfg.window)
    _, train_cfg = load_config(TINY)
    data = train.WindowData(Dataset(dataset_dir), train.StageObjective.window_length(cfg, train_cfg))
    batch = torch.utils.data.default_collate([data[i] for i in range(8)])
    latents, losses, networks = {}, {}, {}
    for variant in ("none", skip):
        network = networks[variant] = WorldModelNetwork(dataclasses.replace(cfg, dynamics_skip=variant), joint_dim=2)
        network.encoder.load_state_dict(trained.network.encoder.state_dict())
        torch.manual_seed(0)  # training: at the start the skip's error is the change, the plain one's the latent
        losses[variant] = train.StageObjective(network, 2, train_cfg, TWO_JOINT_NORMALIZATION)(batch)["dynamics"].item()
        world = WorldModel(network, TWO_JOINT_NORMALIZATION, device="cpu")
        world.reset(images, joints, actions, seed=0)
        last = world.latent.clone()
        world.step(future[0])
        latents[variant] = (last, world.latent)
    last, copied = latents[skip]
    assert (copied - last).abs().max().item() < 1e-2
    assert (latents["none"][1] - latents["none"][0]).abs().max().item() > 0.1
    assert losses[skip] < 0.5 * losses["none"], losses

    # Self-forcing chains through the skip too: each own prediction of the untrained network copies the
    # one before, so a chain of 2 from real frame 1 repeats it; the frames before the chain stay real.
    chained = dataclasses.replace(train_cfg, self_forcing_fraction=1.0, self_forcing_frames=2)
    history = normalize_latent(torch.randn(3, cfg.window, cfg.latent_channels, cfg.latent_size, cfg.latent_size))
    own = train.StageObjective(networks[skip], 2, chained, TWO_JOINT_NORMALIZATION)._self_forced(history, torch.rand(3, cfg.window, 2) * 2 - 1)
    torch.testing.assert_close(own[:, :-2], history[:, :-2])
    for j in (-2, -1):
        assert (own[:, j] - history[:, -3]).abs().max().item() < 1e-2

    # through the trainer, into the checkpoint and back
    world = train_tiny_variant(tmp_path, dataset_dir, skip, "decode_steps: 1", f"decode_steps: 1\n  dynamics_skip: {skip}", 5)
    assert world.config.dynamics_skip == skip
    assert np.isfinite(rollout(world, dataset_dir, seed=0)[-1][1]).all()


def test_warm_start_of_every_stage_for_a_new_task(tmp_path, dataset_dir, run_dir):
    """--init-weights with stage 1 in the plan retrains every stage from CKPT (rope or pile on the
    push_t model's robot and camera): stage 1 starts where CKPT's ended, not from scratch."""
    other = make_dataset(tmp_path / "other_square", seed=7)
    out = tmp_path / "warm_all"
    assert train.main(["--config", str(TINY), "--data", str(other), "--out", str(out), "--steps", "5",
                       "--init-weights", str(run_dir), "--device", "cpu"]) == 0
    meta = json.loads((out / checkpoint.CONFIG).read_text())["training"]
    fresh = json.loads((run_dir / checkpoint.CONFIG).read_text())["training"]["stages"]["1"]
    assert meta["completed"] == [1, 2, 3] and meta["warm_start"]["from"] == str(run_dir)
    assert all(meta["stages"][k]["steps"] == 5 for k in ("1", "2", "3"))
    assert meta["stages"]["1"]["loss_first"] < 0.5 * fresh["loss_first"], (meta["stages"]["1"], fresh)


def joint_rollout_error(world: WorldModel, dataset_dir: Path, steps: int = 12) -> float:
    """Mean absolute joint error of an open-loop rollout of the validation episode's commands."""
    ep = Dataset(dataset_dir).episode(len(Dataset(dataset_dir).episodes) - 1)
    k = world.config.window
    world.reset(ep["images"][:k], ep["joint_positions"][:k], ep["actions"][:k], seed=0)
    predicted = np.stack([world.step(a)[1] for a in ep["actions"][k - 1:k - 1 + steps]])
    return float(np.abs(predicted - ep["joint_positions"][k:k + steps]).mean())


def test_servo_joint_head_learns_the_drive_alone_over_a_trained_model(tmp_path, dataset_dir, run_dir):
    """Stage 5 trains a servo joint head alone over a trained model (--init-weights): everything
    else stays as it was, the head learns the synthetic arm's drive (70 % of the command's lead per
    step, no momentum), and an open loop's joints, read as steps from the last ones, follow the real
    arm more closely than the absolute head's."""
    text = TINY.read_text().replace("joint_head_action: true", "joint_head_action: true\n  joint_head_servo: true")
    config = tmp_path / "tiny_servo.yaml"
    config.write_text(text + "  stage5: {steps: 300, lr: 1.0e-2, batch_size: 32, warmup: 10}\n")
    out = tmp_path / "servo"
    assert train.main(["--config", str(config), "--data", str(dataset_dir), "--out", str(out), "--stage", "5",
                       "--init-weights", str(run_dir), "--device", "cpu"]) == 0
    servo, absolute = WorldModel.load(out), WorldModel.load(run_dir)
    for name in ("encoder", "decoder", "dynamics"):
        for a, b in zip(getattr(servo.network, name).state_dict().values(), getattr(absolute.network, name).state_dict().values()):
            assert torch.equal(a, b), f"stage 5 must leave the {name} as it was"
    meta = json.loads((out / checkpoint.CONFIG).read_text())
    assert len(meta["normalization"]["joint_step_std"]) == 2 and meta["training"]["stages"]["5"]["steps"] == 300
    assert meta["training"]["completed"] == [1, 2, 3, 5]  # the dynamics came along trained, and stays recorded
    # The drive's gain: a command 0.05 further leads the next joints 0.035 further.
    latent = servo.encode(Dataset(dataset_dir).episode(0)["images"][:1])
    joints, command = torch.tensor([[0.5, 0.5]]), torch.tensor([[0.6, 0.4]])
    def next_joints(lead):
        c = command + lead
        with torch.no_grad():
            return servo.joints_from_latent(latent, servo.normalize_actions(c.numpy()), (c, command, joints, joints))
    gain = (next_joints(0.05) - next_joints(0.0)) / 0.05
    assert torch.allclose(gain, torch.tensor(0.7), atol=0.1), gain
    servo_error, absolute_error = joint_rollout_error(servo, dataset_dir), joint_rollout_error(absolute, dataset_dir)
    assert servo_error < 0.5 * absolute_error, (servo_error, absolute_error)
    with pytest.raises(ValueError, match="servo_state"):
        servo.reconstruct(Dataset(dataset_dir).episode(0)["images"][:2], Dataset(dataset_dir).episode(0)["actions"][:2])
    # A servo checkpoint without the joints' step scale is refused by name.
    broken = tmp_path / "no_step_scale"
    shutil.copytree(out, broken)
    meta["normalization"].pop("joint_step_std")
    (broken / checkpoint.CONFIG).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="joint_step_std"):
        WorldModel.load(broken)


def test_servo_joint_head_trains_in_stage2_from_scratch(tmp_path, dataset_dir):
    world = train_tiny_variant(tmp_path, dataset_dir, "servo2", "joint_head_action: true",
                               "joint_head_action: true\n  joint_head_servo: true", 5)
    assert world.servo and len(rollout(world, dataset_dir, seed=0)) == 4
    with pytest.raises(ConfigError, match="joint_head_servo"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(TINY.read_text().replace("joint_head_action: true", "joint_head_servo: true"))
        load_config(bad)


def test_a_checkpoint_from_before_a_config_key_trains_on(tmp_path, dataset_dir, run_dir):
    """config.json of an older checkpoint lacks keys added since (dynamics_steps); their defaults
    apply, so stage 3 (or --resume) on it must not call the model different from the --config one."""
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    meta = json.loads((old / checkpoint.CONFIG).read_text())
    del meta["model"]["dynamics_steps"]
    (old / checkpoint.CONFIG).write_text(json.dumps(meta))
    assert train.main(["--config", str(TINY), "--data", str(dataset_dir), "--out", str(old), "--stage", "3",
                       "--steps", "2", "--device", "cpu"]) == 0


def test_cached_latents_give_the_same_stage2_loss(run_dir, dataset_dir):
    """Stage 2 encodes the dataset once; its loss must equal the one computed from images."""
    cfg, train_cfg = load_config(TINY)
    trainer = train.Trainer(cfg, train_cfg, Dataset(dataset_dir), run_dir.parent / "cache_check", torch.device("cpu"))
    trainer.load_weights(run_dir)
    objective = train.StageObjective(trainer.network, 2, train_cfg, trainer.normalization)
    from_images = train.WindowData(trainer.dataset, cfg.window + 1)
    from_latents = train.WindowData(trainer.dataset, cfg.window + 1, latents=trainer.encode_dataset(chunk=7))
    batch_images = torch.utils.data.default_collate([from_images[i] for i in range(4)])
    batch_latents = torch.utils.data.default_collate([from_latents[i] for i in range(4)])
    assert "images" not in batch_latents
    losses = []
    for batch in (batch_images, batch_latents):
        torch.manual_seed(3)
        with torch.no_grad():
            losses.append(objective(batch))
    for key in ("dynamics", "joint"):
        torch.testing.assert_close(losses[0][key], losses[1][key], atol=1e-6, rtol=1e-5)


# checkpoints -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, recipe", [("push_t", "push_t_servo"), ("push_t_2h", "push_t"),
                                          ("push_t_curriculum", "push_t_curriculum")])
def test_shipped_push_t_models_load_match_their_recipe_and_step(name, recipe):
    """Each shipped push_t checkpoint (in git, so a bad commit of one would reach users) opens, is
    the network of the config its card names, and steps from its own start window to finite
    output."""
    world = WorldModel.load(ROOT / "models" / name, threads=1)
    model_cfg, _ = load_config(ROOT / "config/models" / f"{recipe}.yaml")
    assert dataclasses.asdict(world.config) == dataclasses.asdict(model_cfg)
    meta = json.loads((ROOT / "models" / name / checkpoint.CONFIG).read_text())["training"]
    assert sorted(meta["completed"]) == {"push_t_curriculum": [1, 2, 3, 4], "push_t_servo": [1, 2, 3, 5]}.get(recipe, [1, 2, 3])
    with np.load(ROOT / "models" / name / "start_windows.npz") as windows:
        images, joints, actions = windows["images"][0], windows["joint_positions"][0], windows["actions"][0]
    world.reset(images, joints, actions, seed=0)
    image, joint_positions = world.step(actions[-1])
    size = world.config.image_size  # the model's frame; the node resizes it to the camera's
    assert image.shape == (size, size, 3) and image.dtype == np.uint8 and np.isfinite(joint_positions).all()


def test_checkpoint_round_trip_gives_identical_outputs(run_dir, dataset_dir, tmp_path):
    first = WorldModel.load(run_dir, threads=1)
    copy = checkpoint.save(tmp_path / "copy", first.network, first.meta["normalization"])
    second = WorldModel.load(copy, threads=1)
    for (k, v), (k2, v2) in zip(first.network.state_dict().items(), second.network.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    for (ia, ja), (ib, jb) in zip(rollout(first, dataset_dir, 5), rollout(second, dataset_dir, 5)):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ja, jb)


def test_same_seed_same_rollout_different_seed_differs(run_dir, dataset_dir):
    world = WorldModel.load(run_dir)
    a, b, c = (rollout(world, dataset_dir, seed) for seed in (7, 7, 8))
    for (ia, ja), (ib, jb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ja, jb)
    reloaded = WorldModel.load(run_dir)
    d = rollout(reloaded, dataset_dir, 7)
    np.testing.assert_array_equal(a[-1][0], d[-1][0])
    world.reset(*episode_start(dataset_dir, 3)[:3], seed=8)
    world.step(episode_start(dataset_dir, 3)[3][0])
    latent_8 = world.latent.clone()
    world.reset(*episode_start(dataset_dir, 3)[:3], seed=7)
    world.step(episode_start(dataset_dir, 3)[3][0])
    assert not torch.equal(latent_8, world.latent)


def test_truncated_checkpoint_raises_clear_error(run_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad, ignore=shutil.ignore_patterns("tb", "*.pt"))
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*(corrupt|truncated)"):
        WorldModel.load(bad)


def test_mismatched_checkpoint_raises_clear_error(run_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad, ignore=shutil.ignore_patterns("tb", "*.pt"))
    meta = json.loads((bad / "config.json").read_text())
    meta["model"]["decoder_channels"] = 16
    (bad / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: weights do not match.*shape"):
        WorldModel.load(bad)


def test_missing_and_corrupt_files_raise_clear_errors(run_dir, tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        WorldModel.load(tmp_path / "nowhere")
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad, ignore=shutil.ignore_patterns("tb", "*.pt"))
    (bad / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing"):
        WorldModel.load(bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: corrupt JSON"):
        WorldModel.load(bad)


# contracts -------------------------------------------------------------------------------------
def test_network_shapes_and_dtypes():
    cfg, _ = load_config(TINY)
    net = WorldModelNetwork(cfg, joint_dim=2)
    s, lat, side = cfg.image_size, cfg.latent_channels, cfg.latent_size
    image = torch.rand(3, 3, s, s) * 2 - 1
    latent = net.encoder(image)
    assert latent.shape == (3, lat, side, side) and latent.dtype == torch.float32
    torch.testing.assert_close(latent.norm(dim=1), torch.ones(3, side, side))
    t, z = torch.full((3,), 999), torch.zeros(3, dtype=torch.long)
    assert net.decoder(image, t, z, latent).shape == (3, 3, s, s)
    frames = torch.randn(2, 4, lat, side, side)
    v = net.dynamics(frames, torch.full((2, 4), 15), torch.full((2, 4), 15), torch.rand(2, 4, 2))
    assert v.shape == frames.shape and v.dtype == torch.float32
    assert net.joint_head(latent, torch.rand(3, 2)).shape == (3, 2)
    with pytest.raises(ValueError, match="pass action"):
        net.joint_head(latent)  # this head reads the producing command: forgetting it must not pass silently


def test_patched_dynamics_runs_a_finer_latent_on_the_same_token_grid(tmp_path, dataset_dir):
    cfg, _ = load_config(TINY)
    fine = dataclasses.replace(cfg, encoder_channels=cfg.encoder_channels[:1], dynamics_patch=2, action_map_channels=4)
    fine.validate()
    assert fine.latent_size == 2 * cfg.latent_size
    coarse, net = WorldModelNetwork(cfg, joint_dim=2), WorldModelNetwork(fine, joint_dim=2).eval()
    # one token per 2x2 block of cells: the stem reads 4 cells' channels, the grid is the coarse one's
    assert net.dynamics.stem.in_channels == 4 * coarse.dynamics.stem.in_channels
    assert net.dynamics.action_map[-1].unflattened_size[-1] == cfg.latent_size
    side = fine.latent_size
    frames, t, a = torch.randn(2, 4, fine.latent_channels, side, side), torch.full((2, 4), 15), torch.rand(2, 4, 2)
    with torch.no_grad():
        assert net.dynamics(frames, t, t, a).shape == frames.shape
    with pytest.raises(ConfigError, match="dynamics_patch"):
        dataclasses.replace(cfg, dynamics_patch=3).validate()
    # and it trains and rolls out end to end
    world = train_tiny_variant(tmp_path, dataset_dir, "patch", "encoder_channels: [8, 16]",
                               "encoder_channels: [8]\n  dynamics_patch: 2", 3)
    assert world.config.dynamics_patch == 2 and world.config.latent_size == 16
    steps = rollout(world, dataset_dir, seed=0)
    assert steps[-1][0].shape == (32, 32, 3) and np.isfinite(steps[-1][1]).all()


def test_action_keypoints_draw_the_command_at_sub_cell_precision(tmp_path, dataset_dir):
    """``action_keypoints``: the command placed as learnt points on the dynamics' grid. The points stay
    on the grid, a command change far below a cell's width changes the drawing, a new model predicts
    as one without them (zero-initialised stem), and it trains and rolls out end to end."""
    cfg, _ = load_config(TINY)
    with_points = dataclasses.replace(cfg, action_keypoints=3)
    with_points.validate()
    torch.manual_seed(0)
    net = WorldModelNetwork(with_points, joint_dim=2).eval()
    drawer, side = net.dynamics.action_points, cfg.latent_size
    commands = torch.rand(64, 2) * 4 - 2
    with torch.no_grad():
        points = drawer.points(commands)
        drawing = drawer(commands)
        nudged = drawer(commands + 1e-3)
    assert points.shape == (64, 3, 2) and (points >= 0).all() and (points <= side).all()
    assert drawing.shape == (64, 9, side, side) and net.dynamics.points_stem.in_channels == 9
    assert (nudged - drawing).abs().amax(dim=(1, 2, 3)).min() > 0  # every command's drawing moves with it
    bump = drawing[:, :3].flatten(2)
    assert (bump.amax(-1) >= np.exp(-0.25) - 1e-6).all()  # a cell centre lies within half a cell on each axis
    # zero-initialised: the points change nothing until training gives them weight
    plain = WorldModelNetwork(cfg, joint_dim=2).eval()
    plain.load_state_dict({k: v for k, v in net.state_dict().items() if "action_points" not in k and "points_stem" not in k})
    for p in net.dynamics.out.parameters():  # a zero output layer would hide any difference
        torch.nn.init.normal_(p, std=0.1)
    plain.dynamics.out.load_state_dict(net.dynamics.out.state_dict())
    frames, t, a = torch.randn(2, 3, cfg.latent_channels, side, side), torch.full((2, 3), 15), torch.rand(2, 3, 2)
    with torch.no_grad():
        torch.testing.assert_close(net.dynamics(frames, t, t, a), plain.dynamics(frames, t, t, a))
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="action_keypoints"):
            dataclasses.replace(cfg, action_keypoints=bad).validate()
    world = train_tiny_variant(tmp_path, dataset_dir, "keypoints", "action_map_channels: 2",
                               "action_map_channels: 2\n  action_keypoints: 3", 3)
    assert world.config.action_keypoints == 3 and world.network.dynamics.points_stem.weight.abs().sum() > 0
    steps = rollout(world, dataset_dir, seed=0)
    assert np.isfinite(steps[-1][1]).all()


def test_world_model_step_contract_single_and_batched(run_dir, dataset_dir):
    world = WorldModel.load(run_dir)
    images, joints, actions, future = episode_start(dataset_dir, 3)
    world.reset(images, joints, actions, seed=0)
    image, joint = world.step(future[0])
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert joint.shape == (2,) and joint.dtype == np.float32
    assert upscale(image, CAMERA).shape == (CAMERA, CAMERA, 3)
    world.decode_steps = 3
    world.reset(np.stack([images, images]), np.stack([joints, joints]), np.stack([actions, actions]), seed=0)
    image, joint = world.step(np.stack([future[0], future[1]]))
    assert image.shape == (2, 32, 32, 3) and joint.shape == (2, 2)
    with pytest.raises(ValueError, match="joint_positions and actions"):
        world.reset(images, joints[:, :1], actions)


def test_commands_are_limited_to_what_the_drive_can_follow(run_dir, dataset_dir):
    images, joints, actions, future = episode_start(dataset_dir, 3)
    limited = WorldModel.load(run_dir, max_command_step=[0.1, 0.2])
    limited.reset(images, joints, actions, seed=0)
    far = joints[-1] + np.array([1.0, -1.0], np.float32)
    np.testing.assert_allclose(limited.limit_command(far), joints[-1] + np.array([0.1, -0.2]), atol=1e-6)
    near = joints[-1] + np.float32(0.05)
    np.testing.assert_allclose(limited.limit_command(near), near, atol=1e-6)  # within reach: unchanged
    plain = WorldModel.load(run_dir)
    plain.reset(images, joints, actions, seed=0)
    reached = joints[-1] + np.array([0.1, -0.2], np.float32)
    np.testing.assert_array_equal(limited.step(far)[0], plain.step(reached)[0])  # the far command acts as the reachable one


def test_snap_keeps_the_cells_the_dynamics_barely_moves(run_dir, dataset_dir):
    images, joints, actions, future = episode_start(dataset_dir, 3)
    plain = WorldModel.load(run_dir)
    plain.reset(images, joints, actions, seed=0)
    before = plain.latent.clone()
    plain.step(future[0])
    first = plain.latent.clone()
    moved = (first - before).norm(dim=-3)                          # (1, h, w) per-cell move, unsnapped
    threshold = float(moved.quantile(0.9))                         # most cells stay put
    snapped = WorldModel.load(run_dir, snap_threshold=threshold)
    snapped.reset(images, joints, actions, seed=0)
    snapped.step(future[0])
    near_moved = torch.nn.functional.max_pool2d((moved >= threshold).float(), 3, stride=1, padding=1) > 0
    still = (~near_moved).unsqueeze(-3).expand_as(before)       # still, and no neighbour moved either
    assert 0 < still[:, 0].float().mean() < (moved < threshold).float().mean()
    assert torch.equal(snapped.latent[still], before[still])       # an exact copy, not a nearby value
    assert torch.equal(snapped.latent[~still], first[~still])      # the rest as the dynamics put it
    # The snapped latent is what the next step sees as history: the rollouts go on apart.
    for action in future[1:4]:
        plain.step(action), snapped.step(action)
    assert not torch.equal(plain.latent, snapped.latent)
    off = WorldModel.load(run_dir, snap_threshold=0.0)
    off.reset(images, joints, actions, seed=0)
    off.step(future[0])
    assert torch.equal(off.latent, first)                          # 0 is off: the plain step
    for bad in (-0.1, float("nan"), 2.0):
        with pytest.raises(ConfigError, match="snap_threshold"):
            WorldModel.load(run_dir, snap_threshold=bad)


def test_frozen_noise_draws_a_scene_that_does_not_change_the_same_every_step(run_dir, dataset_dir):
    images, joints, actions, future = episode_start(dataset_dir, 3)
    frames, latents = {}, {}
    for mode in ("none", "decoder", "all"):
        # Every latent cell snapped: the scene stays what was encoded, only the decoder's noise can differ.
        world = WorldModel.load(run_dir, snap_threshold=1.99, frozen_noise=mode)
        world.reset(images, joints, actions, seed=0)
        start = world.latent.clone()
        frames[mode] = [world.step(a)[0] for a in future[:3]]
        assert torch.equal(world.latent, start)
        # Unsnapped, only "all" feeds the dynamics the same target noise every step.
        world = WorldModel.load(run_dir, frozen_noise=mode)
        latents[mode] = [latent for latent in rollout_latents(world, dataset_dir, seed=0)]
    assert not np.array_equal(frames["none"][0], frames["none"][1])      # fresh noise redraws it
    for mode in ("decoder", "all"):
        assert all(np.array_equal(frames[mode][0], f) for f in frames[mode][1:])
    assert torch.equal(latents["none"][0], latents["decoder"][0])       # the decoder's draw leaves the dynamics alone
    assert not torch.equal(latents["none"][0], latents["all"][0])
    # One draw per reset: the seed picks it, a reset draws it anew.
    world = WorldModel.load(run_dir, frozen_noise="all")
    a, b, c = (rollout(world, dataset_dir, seed) for seed in (7, 7, 8))
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a, b))
    assert not np.array_equal(a[0][0], c[0][0])


def rollout_latents(world: WorldModel, dataset_dir: Path, seed: int, steps: int = 3) -> list[torch.Tensor]:
    images, joints, actions, future = episode_start(dataset_dir, world.config.window)
    world.reset(images, joints, actions, seed=seed)
    out = []
    for a in future[:steps]:
        world.step(a)
        out.append(world.latent.clone())
    return out


def test_frozen_noise_in_a_models_config_runs_it_so_and_names_it_apart(run_dir, tmp_path):
    frozen = tmp_path / "frozen"
    shutil.copytree(run_dir, frozen, ignore=shutil.ignore_patterns("tb", "*.pt"))
    meta = json.loads((frozen / "config.json").read_text())
    meta["model"]["frozen_noise"] = "decoder"
    (frozen / "config.json").write_text(json.dumps(meta))
    assert WorldModel.load(frozen).frozen_noise == "decoder"
    assert WorldModel.load(frozen, frozen_noise="none").frozen_noise == "none"
    assert WorldModel.load(run_dir).frozen_noise == "none"
    # The same weights run another way: evaluations cached by the model's identity tell them apart.
    assert checkpoint.model_identity(run_dir) == checkpoint.weights_digest(run_dir)
    assert checkpoint.model_identity(frozen) == checkpoint.weights_digest(run_dir) + "+frozen_noise=decoder"
    meta["model"]["frozen_noise"] = True
    (frozen / "config.json").write_text(json.dumps(meta))
    with pytest.raises((ConfigError, CheckpointError), match="frozen_noise"):
        WorldModel.load(frozen)
    with pytest.raises(ConfigError, match="frozen_noise"):
        WorldModel.load(run_dir, frozen_noise="sometimes")


def test_consistency_schedule_and_jump():
    sched = Schedule()
    ab = sched.alpha_bar
    assert abs(float(ab[0]) - 0.9997) < 1e-3 and abs(float(ab[99]) - 0.961) < 2e-3 and float(ab[999]) < 1e-6
    assert decode_times(3) == [999, 666, 333, 0] and decode_times(1) == [999, 0]
    x, x0 = torch.randn(2, 4), torch.randn(2, 4)
    t = torch.tensor([500, 500])
    torch.testing.assert_close(sched.jump(x, t, t, x0), x)
    torch.testing.assert_close(sched.jump(x, t, torch.zeros_like(t), x0), x0)
    # the dynamics' multi-step re-noising keeps the noise x_t implies: x0 at t with eps -> x0 at s with eps
    eps, s = torch.randn(2, 4), torch.tensor([333, 100])
    torch.testing.assert_close(sched.renoise(sched.add_noise(x0, t, eps), t, s, x0), sched.add_noise(x0, s, eps))


def test_streaming_cache_equals_full_recompute():
    cfg, _ = load_config(TINY)
    net = WorldModelNetwork(cfg, joint_dim=2).eval()
    torch.manual_seed(0)
    for p in net.dynamics.parameters():  # zero-initialised outputs would make attention invisible
        torch.nn.init.normal_(p, std=0.1)
    k, total = cfg.window, cfg.window + 6
    lat = torch.randn(2, total, cfg.latent_channels, cfg.latent_size, cfg.latent_size)
    t, a = torch.randint(0, 999, (2, total)), torch.rand(2, total, 2)
    with torch.no_grad():
        full = net.dynamics(lat, t, t, a)  # whole sequence, each frame sees the `window` before it
        cache = net.dynamics.new_cache()
        parts = [net.dynamics(lat[:, :k], t[:, :k], t[:, :k], a[:, :k], cache, commit=k)]
        for i in range(k, total):
            parts.append(net.dynamics(lat[:, i:i + 1], t[:, i:i + 1], t[:, i:i + 1], a[:, i:i + 1], cache, commit=1))
        assert cache[0]["k"].shape[2] == k  # the cache slides: never more than the window
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # training's shortcut: the newest frame alone, computed with the same history
        torch.testing.assert_close(net.dynamics(lat, t, t, a, last_only=True)[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)


def test_learning_rate_warms_up_then_decays_to_the_final_fraction():
    factor = train.lr_factor(warmup=10, steps=110, final=0.1)
    assert factor(0) == pytest.approx(0.1) and factor(9) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.55) and factor(109) == pytest.approx(0.1, abs=1e-3)
    assert factor(500) == pytest.approx(0.1)  # past the end (a resumed run with more steps) it stays final
    assert all(train.lr_factor(10, 110, 1.0)(i) == 1.0 for i in range(9, 200))  # final 1: the old constant rate


def test_streaming_world_matches_window_recompute_on_first_step(run_dir, dataset_dir):
    streaming = WorldModel.load(run_dir, streaming=True)
    recompute = WorldModel.load(run_dir, streaming=False)
    (image_a, _), (image_b, _) = rollout(streaming, dataset_dir, 3, steps=1)[0], rollout(recompute, dataset_dir, 3, steps=1)[0]
    torch.testing.assert_close(streaming.latent, recompute.latent, atol=1e-5, rtol=1e-5)
    assert np.abs(image_a.astype(int) - image_b.astype(int)).max() <= 1


def test_start_frames_take_their_own_history_label(run_dir, dataset_dir):
    """``start_history_level`` labels only the observed start frames: streaming and recomputing agree
    on it, it changes the first step, and it is the plain model where it equals ``history_level``."""
    plain = WorldModel.load(run_dir)
    rollout(plain, dataset_dir, 3, steps=1)
    level = plain.history_level
    same = WorldModel.load(run_dir, start_history_level=level)
    rollout(same, dataset_dir, 3, steps=1)
    assert torch.equal(same.latent, plain.latent)
    other = 1 if level != 1 else 50
    streaming = WorldModel.load(run_dir, start_history_level=other)
    recompute = WorldModel.load(run_dir, start_history_level=other, streaming=False)
    rollout(streaming, dataset_dir, 3, steps=1)
    rollout(recompute, dataset_dir, 3, steps=1)
    torch.testing.assert_close(streaming.latent, recompute.latent, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(streaming.latent, plain.latent, atol=1e-4)
    # The model's own frames keep history_level: once the start frames have left the window, every
    # label the recomputing model gives its history is history_level.
    assert int(recompute._history_levels[0, -1]) == level and int(recompute._history_levels[0, 0]) == other
    for action in episode_start(dataset_dir, recompute.config.window)[3][1:recompute.config.window + 1]:
        recompute.step(action)
    assert (recompute._history_levels == level).all()
    with pytest.raises(ConfigError, match="history_level"):
        WorldModel.load(run_dir, start_history_level=5000)


def test_channels_last_layout_gives_the_same_step(run_dir, dataset_dir):
    """The CPU default lays the weights out channels-last for speed; the prediction must not change."""
    fast, plain = WorldModel.load(run_dir), WorldModel.load(run_dir, channels_last=False)
    assert fast.network.decoder.out.weight.is_contiguous(memory_format=torch.channels_last)
    (image_a, joints_a), (image_b, joints_b) = rollout(fast, dataset_dir, 3, steps=1)[0], rollout(plain, dataset_dir, 3, steps=1)[0]
    torch.testing.assert_close(fast.latent, plain.latent, atol=1e-5, rtol=1e-5)
    assert np.abs(image_a.astype(int) - image_b.astype(int)).max() <= 1
    np.testing.assert_allclose(joints_a, joints_b, atol=1e-5)


def test_explicit_few_frame_attention_gives_the_same_step(run_dir, dataset_dir, monkeypatch):
    """Inference spells the temporal attention out (faster on the CPU); it must match the fused kernel."""
    from iws_world_model import networks

    q, k, v = (torch.randn(6, 4, n, 8) for n in (2, 5, 5))
    mask = torch.zeros(1, 4, 2, 5)
    mask[..., 0, 4] = float("-inf")
    with torch.no_grad():
        torch.testing.assert_close(networks.attend_few(q, k, v, mask),
                                   torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                   atol=1e-5, rtol=1e-5)
    explicit = rollout(WorldModel.load(run_dir), dataset_dir, 3, steps=3)
    monkeypatch.setattr(networks, "FUSED_ATTENTION_AT_INFERENCE", True)
    fused = rollout(WorldModel.load(run_dir), dataset_dir, 3, steps=3)
    for (image_a, joints_a), (image_b, joints_b) in zip(explicit, fused):
        assert np.abs(image_a.astype(int) - image_b.astype(int)).max() <= 1
        np.testing.assert_allclose(joints_a, joints_b, atol=1e-5)


# config and bench ------------------------------------------------------------------------------
def test_config_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  image_size: 64\n  decoder_chanels: 16\n")
    with pytest.raises(ConfigError, match="decoder_chanels"):
        load_config(bad)
    bad.write_text("model:\n  decode_steps: 5\n")
    with pytest.raises(ConfigError, match="decode_steps"):
        load_config(bad)
    bad.write_text("model:\n  dynamics_skip: residual\n")
    with pytest.raises(ConfigError, match="dynamics_skip"):
        load_config(bad)
    for text in ("model:\n  dynamics_steps: 4\n", "model:\n  dynamics_objective: mse\n  dynamics_steps: 2\n"):
        bad.write_text(text)
        with pytest.raises(ConfigError, match="dynamics_steps"):
            load_config(bad)
    for key, value in (("dynamics_jump_fraction", 1.5), ("self_forcing_fraction", -0.1), ("self_forcing_frames", -1),
                       ("self_forcing_min_frames", 3), ("motion_oversample", 0.5), ("motion_min_pixels", 0),
                       ("dynamics_distance", "l3"), ("dynamics_jump_levels", "all"), ("object_loss_weight", -1.0),
                       ("stage4_self_forcing_fraction", 2.0), ("stage4_self_forcing_min_frames", 17),
                       ("stage3_predicted_fraction", 1.5), ("stage3_chain_frames", 0), ("dynamics_pixel_weight", -1.0),
                       ("dynamics_adversarial_weight", -0.1), ("critic_lr", 0), ("critic_warmup", -1),
                       ("goal_undersample", 0), ("goal_covered_fraction", 1.5)):
        bad.write_text(f"train:\n  {key}: {value}\n")
        with pytest.raises(ConfigError, match=key):
            load_config(bad)
    bad.write_text("train:\n  stage4: {steps: -1}\n")
    with pytest.raises(ConfigError, match="stage4.steps"):
        load_config(bad)
    bad.write_text("train:\n  stage3: {steps: 50}\n  stage4: {steps: 50}\n")  # keys left out keep the stage's defaults
    _, partial = load_config(bad)
    assert (partial.stage3.lr, partial.stage4.lr) == (2e-5, 1e-4)
    # A variant names its base and states only what it changes, mapping by mapping.
    for folder in ("recipes", "variants"):
        (tmp_path / folder).mkdir()
    (tmp_path / "recipes" / "tiny.yaml").write_text(TINY.read_text())
    (tmp_path / "variants" / "variant.yaml").write_text("base: ../recipes/tiny.yaml\nmodel:\n  history_level: 3\n"
                                                        "train:\n  stage3: {steps: 7}\n  dynamics_pixel_weight: 0.5\n")
    (model, trained), (base_model, base_trained) = load_config(tmp_path / "variants" / "variant.yaml"), load_config(TINY)
    assert model == dataclasses.replace(base_model, history_level=3)
    assert trained == dataclasses.replace(base_trained, stage3=dataclasses.replace(base_trained.stage3, steps=7),
                                          dynamics_pixel_weight=0.5)
    for text, match in (("base: nowhere.yaml\n", "no such config file"), ("base: [a]\n", "expected a file name"),
                        ("base: bad.yaml\n", "back to itself")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_config(bad)
    shipped = sorted((ROOT / "config/models").glob("*.yaml"))
    assert {p.stem for p in shipped} >= {"push_t", "push_t_mse", "push_t_jumps", "push_t_chain", "push_t_deep", "push_t_l1",
                                          "push_t_sampled", "push_t_object", "push_t_residual", "push_t_gated", "push_t_curriculum",
                                          "push_t_decoder_predicted", "push_t_pixels", "push_t_quiet_history", "push_t_curriculum_quiet",
                                          "push_t_fine_latent", "push_t_adversarial", "push_t_window8", "push_t_keypoints",
                                          "paper_128", "tiny"}
    for path in shipped:
        load_config(path)


def test_bench_prints_json(run_dir, capsys):
    assert bench.main(["--model", str(run_dir), "--json", "--steps", "5", "--warmup", "1", "--threads", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"fps", "ms_p50", "ms_p95"} <= set(result) and result["fps"] > 0
    assert bench.main(["--model", str(TINY), "--json", "--steps", "3", "--warmup", "1", "--batch", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["batch"] == 2
