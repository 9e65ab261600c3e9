"""`iws eval openloop` / `iws eval longrun` on the tiny world model trained through the real pipeline."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from iws_data.dataset import Dataset, DatasetWriter
from iws_reference_robot.tasks import T_BOXES, T_RASTER_STEP, PushT, _raster_boxes
from iws_world_model import evaluate, metrics, paired
from iws_world_model.world_model import WorldModel

PER_STEP = {"psnr", "ssim", "joint_mae_rad", "t_found_rate", "t_position_error_mm", "t_yaw_error_deg",
            "t_yaw_flip_rate", "t_displacement_mm", "t_overlap", "pusher_error_mm", "pusher_found_rate"}
T_MEAN_RADIUS_MM = 1000.0 * float(np.linalg.norm(_raster_boxes(T_BOXES, T_RASTER_STEP), axis=1).mean())


@pytest.fixture(scope="module")
def dataset_dir(tiny_world_model) -> Path:
    return tiny_world_model.parent / "dataset"  # the fixture's sibling: the data the model was trained on


def test_openloop_writes_report_with_baselines_and_video(tiny_world_model, dataset_dir, tmp_path, capsys):
    # the tiny model doubles as the "MSE" baseline: same code path, and same seed must mean same numbers
    code = evaluate.openloop_main(["--model", str(tiny_world_model), "--data", str(dataset_dir), "--episodes", "2",
                                   "--horizon", "100", "--baseline-mse", str(tiny_world_model), "--videos", "1",
                                   "--out", str(tmp_path), "--threads", "2"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "openloop.json").read_text())
    protocol = report["protocol"]
    window = WorldModel.load(tiny_world_model).config.window
    val = [e for e in Dataset(dataset_dir).split("val")]
    assert protocol["episodes"] == [e.index for e in val][:2]
    horizon = protocol["effective_horizon"]
    assert protocol["requested_horizon"] == 100 and horizon == max(e.length for e in val) - window < 100
    assert len(protocol["episodes_per_step"]) == horizon
    assert set(report["models"]) == {"world_model", "copy_last", "mse_baseline"}
    for name, result in report["models"].items():
        assert set(result["per_step"]) == PER_STEP, name
        assert all(len(v) == horizon for v in result["per_step"].values()), name
        assert set(result["per_episode"]) == PER_STEP, name
        assert all(len(v) == len(protocol["episodes"]) for v in result["per_episode"].values()), name
        assert set(result["summary"]) == PER_STEP | {"psnr_last_step", "t_yaw_error_deg_median", "t_at_rest_rate",
                                                     "t_yaw_error_deg_at_rest", "t_yaw_error_deg_moved", "arm_response"}
        assert len(result["summary"]["arm_response"]) == len(Dataset(dataset_dir).joint_names), name
    # copy-last is the last context frame: where the real T has not moved since, it is within REST_DEG
    copy_summary = report["models"]["copy_last"]["summary"]
    assert 0 < copy_summary["t_at_rest_rate"] <= 1 and copy_summary["t_yaw_error_deg_at_rest"] < evaluate.REST_DEG
    copy_episodes = report["models"]["copy_last"]["per_episode"]["psnr"]
    assert all(metrics.PSNR_CAP_DB > v > 0 for v in copy_episodes)  # each episode's own mean, not a copy of the summary
    assert report["models"]["mse_baseline"] == report["models"]["world_model"]
    copy = report["models"]["copy_last"]["per_step"]
    assert copy["psnr"][0] > copy["psnr"][-1]  # the world moves away from the last context frame
    assert copy["ssim"][0] > copy["ssim"][-1]
    assert len(report["real"]["t_found_rate"]) == horizon and report["real"]["t_found_rate"][0] == 1.0
    # the reference arm's position servo: a joint covers about 0.6 of its command's offset in a step
    shoulder, elbow = report["real"]["arm_response"][:2]
    assert 0.3 < shoulder["gain_command"] < 0.9 and 0.3 < elbow["gain_command"] < 0.9, report["real"]["arm_response"]
    assert report["video_panels"] == ["real", "world_model", "copy_last", "mse_baseline"]
    assert len(report["videos"]) == 1 and Path(report["videos"][0]).stat().st_size > 0


def test_arm_response_recovers_a_servos_gains():
    rng = np.random.default_rng(0)
    offset, last_step = rng.normal(0, 0.05, (500, 2)), rng.normal(0, 0.02, (500, 2))
    step = 0.6 * offset + 0.16 * last_step + rng.normal(0, 1e-4, (500, 2))
    step[:, 1] = offset[:, 1]  # a drive that reaches every command
    servo, snappy = metrics.arm_response(step, offset, last_step)
    assert servo["gain_command"] == pytest.approx(0.6, abs=0.01) and servo["gain_last_step"] == pytest.approx(0.16, abs=0.01)
    assert servo["r2"] > 0.99 and snappy["gain_command"] == pytest.approx(1.0) and abs(snappy["gain_last_step"]) < 1e-6


def test_autoencoder_reference_scores_each_real_frame_reconstructed(tiny_world_model, dataset_dir, tmp_path):
    report = evaluate.openloop(tiny_world_model, dataset_dir, episodes=2, horizon=12, out=tmp_path, videos=0,
                               autoencoder=True, progress=False)
    row = report["models"]["autoencoder"]
    assert set(row["per_step"]) == PER_STEP and report["video_panels"][-1] == "autoencoder"
    # step h of the row is real frame K + h through encoder and decoder, its joints read with the command that produced it
    world = WorldModel.load(tiny_world_model)
    cut = evaluate.load_open_loop_data(Dataset(dataset_dir), world.config.window, 12, 2, world.image_size)
    images, joints = world.reconstruct(cut.real_images.reshape(-1, *cut.real_images.shape[2:]),
                                       cut.future_actions.reshape(-1, cut.future_actions.shape[-1]), seed=0)
    n, horizon = cut.valid.shape
    assert images.dtype == np.uint8 and images.shape == (n * horizon, world.image_size, world.image_size, 3)
    psnr = metrics.frame_fidelity(images.reshape(cut.real_images.shape), cut.real_images)["psnr"].mean(0)
    np.testing.assert_allclose(row["per_step"]["psnr"], psnr, atol=1e-4)  # the report keeps 5 decimals
    joint_error = metrics.joint_error(joints.reshape(cut.real_joints.shape), cut.real_joints).mean(0)
    np.testing.assert_allclose(row["per_step"]["joint_mae_rad"], joint_error, atol=1e-5)
    again, _ = world.reconstruct(cut.real_images[0], cut.future_actions[0], seed=0)
    np.testing.assert_array_equal(again, images[:horizon])  # seeded: the same frames again


def test_a_servo_joint_head_reads_the_real_joints_before_each_reconstructed_frame(tiny_world_model, dataset_dir, tmp_path):
    """The autoencoder row of a model whose joint head predicts steps (joint_head_servo): frame h's
    joints are the real joints of frame h - 1 plus the step read with the real joints and commands
    before it; the open loop and one-step rows run too."""
    from iws_world_model import train
    repo = Path(__file__).resolve().parents[1]
    config = tmp_path / "tiny_servo.yaml"
    config.write_text(f"base: {repo / 'config/models/tiny.yaml'}\nmodel:\n  joint_head_servo: true\n"
                      "train:\n  stage5: {steps: 20, lr: 1.0e-3, batch_size: 8, warmup: 2}\n")
    servo_dir = tmp_path / "servo"
    assert train.main(["--config", str(config), "--data", str(dataset_dir), "--out", str(servo_dir), "--stage", "5",
                       "--init-weights", str(tiny_world_model), "--threads", "2"]) == 0
    report = evaluate.openloop(servo_dir, dataset_dir, episodes=2, horizon=6, out=tmp_path / "eval", videos=0,
                               autoencoder=True, one_step=True, progress=False)
    assert {"autoencoder", "one_step", "world_model"} <= set(report["models"])
    world = WorldModel.load(servo_dir)
    cut = evaluate.load_open_loop_data(Dataset(dataset_dir), world.config.window, 6, 2, world.image_size)
    state = (cut.future_actions[:, 0], cut.context_actions[:, -2], cut.context_joints[:, -1], cut.context_joints[:, -2])
    _, joints = world.reconstruct(cut.real_images[:, 0], cut.future_actions[:, 0], seed=0, servo_state=state)
    first = metrics.joint_error(joints[:, None], cut.real_joints[:, :1]).mean()
    assert report["models"]["autoencoder"]["per_step"]["joint_mae_rad"][0] == pytest.approx(first, abs=1e-5)


def test_one_step_row_predicts_each_frame_from_the_real_frames_before_it(tiny_world_model, dataset_dir, tmp_path):
    world = WorldModel.load(tiny_world_model)
    cut = evaluate.load_open_loop_data(Dataset(dataset_dir), world.config.window, 6, 2, world.image_size)
    open_loop, _ = evaluate.rollout_open_loop(world, cut, seed=3, progress=False)
    forced, forced_joints = evaluate.rollout_one_step(world, cut, seed=3, progress=False)
    np.testing.assert_array_equal(forced[:, 0], open_loop[:, 0])  # step 0: both start from the real context
    assert not np.array_equal(forced[:, 1:], open_loop[:, 1:])   # later: real history, not the model's own
    # step 2 is the open loop's first step started two real frames later
    k, size = world.config.window, world.image_size
    context = evaluate.resize(cut.context_images.reshape(-1, *cut.context_images.shape[2:]), size)
    frames = np.concatenate([context.reshape(*cut.context_images.shape[:2], size, size, 3), cut.real_images], 1)
    joints = np.concatenate([cut.context_joints, cut.real_joints], 1)
    commands = np.concatenate([cut.context_actions, cut.future_actions[:, 1:]], 1)
    shifted = evaluate.OpenLoopData(**{**vars(cut), "context_images": frames[:, 2:2 + k], "context_joints": joints[:, 2:2 + k],
                                       "context_actions": commands[:, 2:2 + k], "future_actions": cut.future_actions[:, 2:3],
                                       "valid": cut.valid[:, 2:3]})
    again, again_joints = evaluate.rollout_open_loop(world, shifted, seed=3, progress=False)
    np.testing.assert_array_equal(forced[:, 2], again[:, 0])
    np.testing.assert_allclose(forced_joints[:, 2], again_joints[:, 0], atol=1e-6)
    report = evaluate.openloop(tiny_world_model, dataset_dir, episodes=2, horizon=6, out=tmp_path, videos=0,
                               one_step=True, progress=False)
    assert set(report["models"]["one_step"]["per_step"]) == PER_STEP


def test_first_frame_predicts_later_frames_from_the_window_before_them(tiny_world_model, dataset_dir, tmp_path, capsys):
    """--first-frame F: the context is the window before frame F, so a model of a shorter window
    predicts the same frames as a longer one; the open loop's first step is then the one-step
    row's step F - window, the physics replay still reproduces the episode, and reports that
    predict from different frames refuse to pair."""
    world, dataset = WorldModel.load(tiny_world_model), Dataset(dataset_dir)
    k = world.config.window
    cut = evaluate.load_open_loop_data(dataset, k, 6, 2, world.image_size)
    later = evaluate.load_open_loop_data(dataset, k, 4, 2, world.image_size, first_frame=k + 2)
    assert (cut.first_frame, later.first_frame) == (k, k + 2)
    first = later.episodes[0]
    np.testing.assert_array_equal(later.context_images[0], dataset.images[first.start + 2:first.start + 2 + k])
    np.testing.assert_array_equal(later.real_images[:, :4], cut.real_images[:, 2:6])
    np.testing.assert_array_equal(later.future_actions[:, :4], cut.future_actions[:, 2:6])
    forced, _ = evaluate.rollout_one_step(world, cut, seed=3, progress=False)
    again, _ = evaluate.rollout_open_loop(world, later, seed=3, progress=False)
    np.testing.assert_array_equal(again[:, 0], forced[:, 2])
    with pytest.raises(evaluate.EvalError, match="needs it at"):
        evaluate.load_open_loop_data(dataset, k, 4, 2, world.image_size, first_frame=k - 1)
    report = evaluate.openloop(tiny_world_model, dataset_dir, episodes=1, horizon=4, out=tmp_path / "later", videos=0,
                               physics_nudge=(0,), first_frame=k + 3, progress=False)
    assert report["protocol"]["first_frame"] == k + 3
    exact = report["models"]["physics_nudge_0"]["summary"]
    assert exact["psnr"] > 45 and exact["joint_mae_rad"] < 1e-3  # the replay lines up with the later frames
    evaluate.openloop(tiny_world_model, dataset_dir, episodes=1, horizon=4, out=tmp_path / "window", videos=0,
                      pose=False, progress=False)
    assert paired.main([str(tmp_path / "window"), str(tmp_path / "later")]) == 2
    assert "predict from different frames" in capsys.readouterr().err


def test_history_level_override_labels_the_history_and_is_checked(tiny_world_model, dataset_dir, tmp_path, capsys):
    world = WorldModel.load(tiny_world_model)
    cut = evaluate.load_open_loop_data(Dataset(dataset_dir), world.config.window, 4, 2, world.image_size)
    default, _ = evaluate.rollout_open_loop(world, cut, seed=1, progress=False)
    relabelled = WorldModel.load(tiny_world_model, history_level=90)
    assert relabelled.history_level == 90 and world.history_level == world.config.history_level
    other, _ = evaluate.rollout_open_loop(relabelled, cut, seed=1, progress=False)
    assert not np.array_equal(default, other)  # the label reaches the dynamics
    report = evaluate.openloop(tiny_world_model, dataset_dir, episodes=1, horizon=2, out=tmp_path, videos=0,
                               history_level=90, progress=False)
    assert report["protocol"]["history_level"] == 90
    code = evaluate.openloop_main(["--model", str(tiny_world_model), "--data", str(dataset_dir), "--history-level",
                                   "1000", "--out", str(tmp_path)])
    assert code == 2 and "history_level" in capsys.readouterr().err


def test_snap_threshold_reaches_openloop_and_longrun_and_is_checked(tiny_world_model, dataset_dir, tmp_path, capsys):
    report = evaluate.openloop(tiny_world_model, dataset_dir, episodes=1, horizon=2, out=tmp_path, videos=0,
                               snap_threshold=0.3, progress=False)
    assert report["protocol"]["snap_threshold"] == 0.3
    for main, extra in ((evaluate.openloop_main, ["--data", str(dataset_dir)]),
                        (evaluate.longrun_main, ["--minutes", "0.01", "--rate", "10"])):
        code = main(["--model", str(tiny_world_model), *extra, "--snap-threshold", "-1", "--out", str(tmp_path)])
        assert code == 2 and "snap_threshold" in capsys.readouterr().err
    code = evaluate.longrun_main(["--model", str(tiny_world_model), "--minutes", "0.01", "--rate", "10",
                                  "--snap-threshold", "0.3", "--out", str(tmp_path / "longrun")])
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "longrun" / "longrun.json").read_text())["protocol"]["snap_threshold"] == 0.3


def test_reencode_feeds_the_dynamics_the_latent_of_the_frame_it_rendered(tiny_world_model, dataset_dir, tmp_path):
    world = WorldModel.load(tiny_world_model)
    cut = evaluate.load_open_loop_data(Dataset(dataset_dir), world.config.window, 4, 2, world.image_size)
    default, _ = evaluate.rollout_open_loop(world, cut, seed=1, progress=False)
    for streaming in (True, False):
        reencoding = WorldModel.load(tiny_world_model, reencode=True, streaming=streaming)
        reencoding.reset(cut.context_images, cut.context_joints, cut.context_actions, seed=1)
        images, _ = reencoding.step(cut.future_actions[:, 0])
        torch.testing.assert_close(reencoding.latent, reencoding.encode(images), rtol=0, atol=0)
        if not streaming:
            assert torch.equal(reencoding._history[:, -1], reencoding.latent)
    fed_back, _ = evaluate.rollout_open_loop(WorldModel.load(tiny_world_model, reencode=True), cut, seed=1, progress=False)
    np.testing.assert_array_equal(fed_back[:, 0], default[:, 0])  # the first frame is rendered before any feedback
    assert not np.array_equal(fed_back, default)
    report = evaluate.openloop(tiny_world_model, dataset_dir, episodes=1, horizon=2, out=tmp_path, videos=0,
                               reencode=True, progress=False)
    assert report["protocol"]["reencode"] is True


def test_paired_compares_two_reports_episode_by_episode(tiny_world_model, dataset_dir, tmp_path, capsys):
    report = evaluate.openloop(tiny_world_model, dataset_dir, episodes=3, horizon=4, out=tmp_path / "a", videos=0,
                               split="train", progress=False)
    assert len(report["protocol"]["episodes"]) == 3
    # The other report: two of the episodes, in another order, PSNR 1 dB higher in each.
    other = json.loads((tmp_path / "a" / "openloop.json").read_text())
    order = [2, 0]
    other["protocol"]["episodes"] = [report["protocol"]["episodes"][i] for i in order]
    rows = other["models"]["world_model"]["per_episode"]
    for key in rows:
        rows[key] = [rows[key][i] + 1.0 if key == "psnr" else rows[key][i] for i in order]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "openloop.json").write_text(json.dumps(other))
    result = paired.paired(paired.load_report(tmp_path / "a"), paired.load_report(tmp_path / "b"))
    psnr = result["figures"]["psnr"]
    assert result["episodes"] == 2 and psnr["n"] == 2
    assert psnr["difference"] == pytest.approx(1.0) and psnr["standard_error"] == pytest.approx(0.0, abs=1e-6)
    assert psnr["other_better"] == 2 and result["figures"]["ssim"]["difference"] == pytest.approx(0.0)
    # One report alone: its model row against its copy-last row, read as the base.
    assert paired.main([str(tmp_path / "a"), "--base-row", "copy_last", "--json"]) == 0
    joints = json.loads(capsys.readouterr().out)["figures"]["joint_mae_rad"]
    base = report["models"]["copy_last"]["per_episode"]["joint_mae_rad"]
    assert joints["base"] == pytest.approx(np.mean(base))
    assert paired.main([str(tmp_path / "a"), "--base-row", "mse"]) == 2
    assert "no row 'mse'" in capsys.readouterr().err
    other["protocol"]["episodes"] = [10_000, 10_001]
    (tmp_path / "b" / "openloop.json").write_text(json.dumps(other))
    assert paired.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "share no episode" in capsys.readouterr().err
    (tmp_path / "b" / "openloop.json").write_text("{")
    assert paired.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "not a JSON report" in capsys.readouterr().err


def test_seed_spread_scores_the_model_against_itself_under_the_next_seed(tiny_world_model, dataset_dir, tmp_path, capsys):
    code = evaluate.openloop_main(["--model", str(tiny_world_model), "--data", str(dataset_dir), "--episodes", "2",
                                   "--horizon", "8", "--seed", "4", "--seed-spread", "--videos", "0", "--out", str(tmp_path)])
    assert code == 0 and "against itself under seed 5" in capsys.readouterr().out
    report = json.loads((tmp_path / "openloop.json").read_text())
    assert report["protocol"]["seed_spread"] == 5 and "seed_spread" not in report["models"]["copy_last"]
    spread = report["models"]["world_model"]["seed_spread"]
    world = WorldModel.load(tiny_world_model)
    cut = evaluate.load_open_loop_data(Dataset(dataset_dir), world.config.window, 8, 2, world.image_size)
    first, _ = evaluate.rollout_open_loop(world, cut, seed=4, progress=False)
    second, _ = evaluate.rollout_open_loop(world, cut, seed=5, progress=False)
    assert not np.array_equal(first, second)  # the seed reaches the sampler
    psnr = metrics.frame_fidelity(first, second)["psnr"][cut.valid].mean()
    assert spread["psnr"] == pytest.approx(psnr, abs=1e-4) and spread["psnr"] < metrics.PSNR_CAP_DB
    # the tiny model draws no T to read; the pose part on the real frames against themselves, then turned
    estimator, _ = evaluate._pose_estimator(None)
    real = evaluate.frame_poses(estimator, cut.real_images, cut.valid, Dataset(dataset_dir).image_size)
    same = evaluate.rollout_spread(cut.real_images, cut.real_images, real, real, cut.valid)
    assert same["psnr"] == metrics.PSNR_CAP_DB and same["t_position_mm"] == 0.0 and same["t_yaw_deg"] == 0.0
    turned = (real[0], real[1] + np.array([0.0, 0.0, np.radians(30.0)]))
    assert evaluate.rollout_spread(cut.real_images, cut.real_images, real, turned, cut.valid)["t_yaw_deg"] == pytest.approx(30.0)


def test_physics_replay_reproduces_the_episode_and_its_nudge_moves_the_t(tiny_world_model, dataset_dir, tmp_path, capsys):
    # the reference simulator replaying the recorded commands from the collecting seed is the episode again
    exact = evaluate.openloop(tiny_world_model, dataset_dir, episodes=1, horizon=12, out=tmp_path, videos=0,
                              physics_nudge=(0, 15), progress=False)
    assert exact["protocol"]["physics_nudge"] == [0.0, 15.0]
    assert list(exact["models"])[-2:] == ["physics_nudge_0", "physics_nudge_15"]
    s = exact["models"]["physics_nudge_0"]["summary"]
    assert s["psnr"] > 45 and s["joint_mae_rad"] < 1e-3 and s["t_position_error_mm"] < 1 and s["t_yaw_error_deg"] < 1
    nudged = exact["models"]["physics_nudge_15"]["summary"]
    assert nudged["t_position_error_mm"] > 5 and nudged["psnr"] < s["psnr"]
    assert nudged["joint_mae_rad"] < 1e-3  # the arm follows the same commands; only the T was moved
    # the estimator read against the simulator's own pose: how precise the pose metrics are at this resolution
    truth = exact["models"]["physics_nudge_0"]["estimator_vs_truth"]
    assert truth["frames"] > 0 and 0 < truth["t_position_error_mm"] < 15 and truth["t_yaw_error_deg"] < 15
    # the replay needs the bags the dataset was built from: gone, the error says so and nothing runs
    moved = tmp_path / "moved"
    shutil.copytree(dataset_dir, moved)
    meta = json.loads((moved / "meta.json").read_text())
    for episode in meta["episodes"]:
        episode["source"] = str(tmp_path / "gone" / Path(episode["source"]).name)
    (moved / "meta.json").write_text(json.dumps(meta))
    code = evaluate.openloop_main(["--model", str(tiny_world_model), "--data", str(moved), "--episodes", "1",
                                   "--horizon", "4", "--physics-nudge", "2", "--out", str(tmp_path / "out")])
    assert code == 2 and "source bag is gone" in capsys.readouterr().err
    code = evaluate.openloop_main(["--model", str(tiny_world_model), "--data", str(dataset_dir), "--physics-nudge",
                                   "nan", "--out", str(tmp_path / "out")])
    assert code == 2 and "--physics-nudge" in capsys.readouterr().err


def test_real_frames_as_prediction_score_perfectly(tiny_world_model, dataset_dir):
    world = WorldModel.load(tiny_world_model)
    dataset = Dataset(dataset_dir)
    cut = evaluate.load_open_loop_data(dataset, world.config.window, 5, 1, world.image_size)
    estimator, _ = evaluate._pose_estimator(dataset.meta.get("profile"))
    real = evaluate.frame_poses(estimator, cut.real_images, cut.valid, dataset.image_size)
    pushers = evaluate.frame_pushers(estimator, cut.real_images, cut.valid)
    assert pushers[0].all(), "the reference robot's pusher is in every frame"
    result = evaluate.score_open_loop(cut.real_images, cut.real_joints, cut, real, real, pushers=(pushers, pushers))
    s = result["summary"]
    assert s["pusher_error_mm"] == 0.0 and s["pusher_found_rate"] == 1.0
    # the pusher drawn one model pixel to the right reads about a pixel's width on the table (9.8 mm at 64x64,
    # a little less at the pusher's top, nearer the camera)
    shifted = evaluate.frame_pushers(estimator, np.roll(cut.real_images, 1, axis=-2), cut.valid)
    moved = evaluate.score_open_loop(cut.real_images, cut.real_joints, cut, real, real, pushers=(pushers, shifted))
    assert moved["summary"]["pusher_error_mm"] == pytest.approx(9.8 * 64 / world.image_size, rel=0.1)
    assert s["psnr"] == metrics.PSNR_CAP_DB
    assert s["ssim"] == pytest.approx(1.0, abs=1e-5)
    assert s["joint_mae_rad"] == 0.0
    assert s["t_found_rate"] == 1.0 and s["t_position_error_mm"] == 0.0 and s["t_yaw_error_deg"] == 0.0
    assert s["t_yaw_error_deg_median"] == 0.0 and result["per_episode"]["t_yaw_error_deg"].tolist() == [0.0]
    assert s["t_yaw_flip_rate"] == 0.0 and s["t_displacement_mm"] == 0.0 and s["t_overlap"] == pytest.approx(1.0, abs=0.02)
    json.dumps(metrics.jsonable(result))  # capped, so valid JSON
    # a T read as its orientation 120 deg away counts as a flip; one 30 deg off does not
    for turn, flips in ((120.0, 1.0), (30.0, 0.0)):
        turned = (real[0], real[1] + np.array([0.0, 0.0, np.radians(turn)]))
        s = evaluate.score_open_loop(cut.real_images, cut.real_joints, cut, real, turned)["summary"]
        assert s["t_yaw_error_deg"] == pytest.approx(turn) and s["t_yaw_flip_rate"] == flips
        # a turn moves the T's area by 2 sin(turn / 2) times its mean distance from the centre of mass
        assert s["t_displacement_mm"] == pytest.approx(2 * math.sin(math.radians(turn) / 2) * T_MEAN_RADIUS_MM, rel=0.02)
        # and its overlap is the push_t score of the turned T on the untouched one (0.48 at 30 deg, 0.67 at 120)
        assert s["t_overlap"] == pytest.approx(PushT().overlap([0.0, 0.0, math.radians(turn)], [0.0, 0.0, 0.0]))
    # the yaw error split by whether the real T has moved since the context: here the real T "moved"
    # 30 deg from step 2 on, and the prediction turns it 120 deg in steps 0-1 only (an invented turn)
    assert cut.valid.all() and real[0].all()
    last = (real[0], real[1].copy())
    last[1][:, 2:, 2] += np.radians(30.0)
    rest = evaluate.at_rest(real, last)
    assert rest.tolist() == [[True, True, False, False, False]]
    invented = (real[0], real[1].copy())
    invented[1][:, :2, 2] += np.radians(120.0)
    s = evaluate.score_open_loop(cut.real_images, cut.real_joints, cut, real, invented, rest=rest)["summary"]
    assert s["t_at_rest_rate"] == pytest.approx(0.4)
    assert s["t_yaw_error_deg_at_rest"] == pytest.approx(120.0) and s["t_yaw_error_deg_moved"] == pytest.approx(0.0, abs=1e-9)


def test_separable_ssim_equals_torchmetrics():
    """metrics.ssim filters with the 1-D window twice; it must give torchmetrics' numbers."""
    import torch
    from torchmetrics.functional.image import structural_similarity_index_measure

    rng = np.random.default_rng(0)
    real = rng.integers(0, 256, (6, 40, 56, 3), dtype=np.uint8)
    pred = np.clip(real.astype(int) + rng.integers(-60, 60, real.shape), 0, 255).astype(np.uint8)
    p, r = metrics.to_unit(pred), metrics.to_unit(real)
    expected = structural_similarity_index_measure(p, r, data_range=1.0, reduction="none")
    torch.testing.assert_close(metrics.ssim(p, r), expected, atol=1e-12, rtol=0)
    assert float(metrics.ssim(r, r).min()) == pytest.approx(1.0, abs=1e-12)


def test_drift_statistics_accept_real_frames_and_flag_noise(dataset_dir):
    real = evaluate.resize(np.asarray(Dataset(dataset_dir).images[::4]), 32)
    reference = metrics.reference_range(real)
    assert metrics.in_distribution(metrics.frame_statistics(real), reference).mean() >= 0.95
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, real.shape, dtype=np.uint8)
    mean_kept = np.clip(real.astype(np.int16) + rng.integers(-60, 61, real.shape), 0, 255).astype(np.uint8)
    flat = np.full_like(real, int(real.mean()))
    for fake in (noise, mean_kept, flat):
        assert not metrics.in_distribution(metrics.frame_statistics(fake), reference).any()


def test_openloop_errors_without_long_enough_episodes(tiny_world_model, tmp_path, capsys):
    names = WorldModel.load(tiny_world_model).joint_names
    writer = DatasetWriter(tmp_path / "short", (96, 96), names, 8, meta={"control_rate_hz": 10.0, "profile": "reference_arm"})
    for split in ("train", "val"):  # 3 frames: no frame left to predict after the tiny model's 3-frame window
        writer.add_episode(np.zeros((3, 96, 96, 3), np.uint8), np.zeros((3, len(names)), np.float32),
                           np.zeros((3, len(names)), np.float32), np.arange(3) / 10.0, split, task="push_t")
    writer.close()
    args = ["--model", str(tiny_world_model), "--data", str(tmp_path / "short"), "--out", str(tmp_path / "out")]
    assert evaluate.openloop_main(args) == 2
    assert "no 'val' episode is long enough" in capsys.readouterr().err
    assert evaluate.openloop_main(args + ["--split", "test"]) == 2
    assert "no 'test' episodes" in capsys.readouterr().err
    assert not (tmp_path / "out" / "openloop.json").exists()


def test_longrun_reports_every_minute(tiny_world_model, tmp_path, capsys):
    code = evaluate.longrun_main(["--model", str(tiny_world_model), "--minutes", "0.05", "--rate", "15",
                                  "--out", str(tmp_path), "--threads", "2"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "longrun.json").read_text())
    assert report["protocol"]["steps"] == report["protocol"]["steps_run"] == 45
    assert len(report["minutes"]) == 1 and report["minutes"][0]["steps"] == 45
    minute = report["minutes"][0]
    assert {"t_found_rate", "t_score_mean", "pixel_mean", "pixel_std", "pixel_tv", "in_distribution_fraction",
            "nonfinite_steps", "step_ms"} <= set(minute)
    assert 0.0 <= minute["t_found_rate"] <= 1.0 and minute["nonfinite_steps"] == 0
    lo, hi = report["reference"]["pixel_mean"]
    assert lo < hi and report["reference"]["source"].startswith("start windows")
    assert isinstance(report["in_distribution_all_minutes"], bool)
    assert Path(report["video"]).stat().st_size > 0


def test_rest_reads_the_t_held_still_from_ordinary_and_near_goal_starts(tiny_world_model, tmp_path, capsys):
    """`iws eval rest`: the physics keeps an untouched T where it is (the floor the model is held
    to), near-goal starts sit just off the goal, and every checkpoint step is read for both kinds."""
    from iws_world_model import rest

    code = rest.main(["--model", str(tiny_world_model), "--starts", "2", "--near-goal", "2", "--steps", "4",
                      "--out", str(tmp_path), "--threads", "2", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "rest.json").read_text())
    assert report["protocol"]["checkpoints"] == [1, 4]
    kinds = report["kinds"]
    assert set(kinds) == {"start", "near_goal"} and all(k["worlds"] == 2 for k in kinds.values())
    assert kinds["start"]["true_overlap_with_goal"] < 0.2  # the reset keeps starts off the goal
    assert rest.NEAR_GOAL_OVERLAP[0] < kinds["near_goal"]["true_overlap_with_goal"] < rest.NEAR_GOAL_OVERLAP[1]
    for row in kinds.values():
        physics = row["physics_after_steps"]
        assert physics["position_drift_mm"] < 0.5 and physics["yaw_drift_deg"] < 0.5
        assert physics["overlap_with_start"] > 0.98
        assert set(row["model"]) == {"1", "4"}
        assert all(0.0 <= m["t_found_rate"] <= 1.0 for m in row["model"].values())
        flicker = row["model_frame_to_frame"]
        assert 0 <= flicker["steps"] <= 3 * 2  # 3 steps between 4 frames, 2 worlds, where both found the T
        assert flicker["still_rate"] is None or 0.0 <= flicker["still_rate"] <= 1.0

    assert rest.main(["--model", str(tiny_world_model), "--starts", "0", "--near-goal", "0"]) == 2
    assert "at least one start" in capsys.readouterr().err


def test_frame_to_frame_steps_count_a_t_at_rest_and_skip_unfound_frames():
    from iws_world_model.rest import _frame_to_frame

    still = np.tile([0.1, 0.2, 0.5], (5, 2, 1))                      # 5 frames, 2 worlds, the T never moves
    report = _frame_to_frame(still)
    assert report == {"steps": 8, "position_mm_median": 0.0, "yaw_deg_median": 0.0, "still_rate": 1.0}
    moving = still.copy()
    moving[:, 1, 0] += 0.001 * np.arange(5)                          # world 1 slides 1 mm a frame
    moving[2, 0] = np.nan                                            # world 0 loses the T in frame 2
    report = _frame_to_frame(moving)
    assert report["steps"] == 6 and report["still_rate"] == pytest.approx(2 / 6)
    assert report["position_mm_median"] == pytest.approx(1.0)
    assert _frame_to_frame(np.full((3, 1, 3), np.nan))["still_rate"] is None


def test_near_goal_placement_is_near_success_but_not_at_it():
    from iws_reference_robot.tasks import t_overlap
    from iws_world_model.rest import NEAR_GOAL_OVERLAP, near_goal_pose

    rng = np.random.default_rng(0)
    overlaps = [t_overlap(near_goal_pose(rng, PushT.GOAL), PushT.GOAL) for _ in range(50)]
    assert all(NEAR_GOAL_OVERLAP[0] < o < NEAR_GOAL_OVERLAP[1] for o in overlaps)
    assert np.ptp(overlaps) > 0.1  # spread across the band, not one pose
