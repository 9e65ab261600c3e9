"""The MuJoCo reference world without ROS: determinism, control, kinematics, camera, task scores."""
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import math  # noqa: E402

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from iws_common.profile import load_profile  # noqa: E402
from iws_reference_robot import scene  # noqa: E402
from iws_reference_robot.experts import EXPERTS, PushTExpert, make_expert  # noqa: E402
from iws_reference_robot.sim import ReferenceSim  # noqa: E402
from iws_reference_robot.tasks import PushT, TaskState, t_pose_gaps  # noqa: E402


@pytest.fixture(scope="module")
def profile():
    return load_profile("reference_arm")


@pytest.fixture(scope="module")
def push_sim(profile):
    sim = ReferenceSim(profile, "push_t", seed=0)
    yield sim
    sim.close()


def test_shapes_and_dtypes(push_sim, profile):
    push_sim.reset(0)
    img = push_sim.render()
    assert img.shape == (profile.camera.height, profile.camera.width, 3) and img.dtype == np.uint8
    j = profile.joints.count
    assert push_sim.joint_positions().shape == (j,) and push_sim.joint_positions().dtype == np.float64
    assert push_sim.joint_velocities().shape == (j,)
    np.testing.assert_allclose(push_sim.joint_positions(), profile.joints.home)
    assert push_sim.time == 0.0
    state = push_sim.task_state()
    assert isinstance(state, TaskState) and state.task == "push_t"
    assert state.object_poses.shape == (1, 3) and state.goal_pose.shape == (3,)


def test_camera_fovy_follows_intrinsics(push_sim, profile):
    fovy = push_sim.model.cam_fovy[push_sim.model.camera("top").id]
    assert fovy == pytest.approx(math.degrees(2 * math.atan(profile.camera.height / 2 / profile.camera.fy)), abs=1e-3)


def test_reset_is_deterministic(push_sim):
    push_sim.reset(5)
    a_img, a_state = push_sim.render(), push_sim.task_state()
    push_sim.step(push_sim.joint_positions() + 0.1)
    push_sim.reset(5)
    np.testing.assert_array_equal(push_sim.render(), a_img)
    np.testing.assert_array_equal(push_sim.task_state().object_poses, a_state.object_poses)
    assert push_sim.time == 0.0
    push_sim.reset(6)
    assert not np.array_equal(push_sim.task_state().object_poses, a_state.object_poses)
    assert not np.array_equal(push_sim.render(), a_img)


def test_setpoint_moves_joints_and_image(push_sim):
    push_sim.reset(1)
    before_q, before_img = push_sim.joint_positions(), push_sim.render()
    target = before_q + np.array([0.15, -0.15, 0.3])
    for _ in range(3):
        push_sim.step(target)
    assert push_sim.time == pytest.approx(3 * push_sim.profile.control_period_s)
    np.testing.assert_allclose(push_sim.joint_positions(), target, atol=0.02)
    assert np.abs(push_sim.render().astype(int) - before_img).sum() > 0


def test_fk_ik_round_trip(push_sim):
    rng = np.random.default_rng(0)
    for _ in range(50):
        xy = np.array([rng.uniform(-0.2, 0.2), rng.uniform(0.2, 0.4)])
        q = push_sim.inverse_kinematics(xy)
        assert np.all(q >= push_sim.lower) and np.all(q <= push_sim.upper)
        np.testing.assert_allclose(push_sim.forward_kinematics(q), xy, atol=1e-6)
    far = push_sim.inverse_kinematics([0.0, 2.0])
    np.testing.assert_allclose(push_sim.forward_kinematics(far), [0.0, push_sim.reach[1]], atol=1e-3)
    push_sim.reset(0)
    np.testing.assert_allclose(push_sim.forward_kinematics(push_sim.joint_positions()), push_sim.pusher_xy(), atol=1e-9)


def test_projection_matches_rendered_pusher(push_sim):
    push_sim.reset(2)
    for xy in ([0.15, 0.18], [-0.15, 0.25], [0.0, 0.42]):
        q = push_sim.inverse_kinematics(xy)
        for _ in range(8):
            push_sim.step(q)
        img = push_sim.render().astype(int)
        red = (img[..., 0] > 150) & (img[..., 1] < 80) & (img[..., 2] < 80)
        assert red.sum() > 3
        v, u = np.nonzero(red)
        pusher = push_sim.pusher_xy()
        expected = push_sim.project_to_pixels([pusher[0], pusher[1], scene.PUSHER_TOP])
        assert np.hypot(u.mean() - expected[0], v.mean() - expected[1]) < 1.5


def test_push_t_score(push_sim):
    task = push_sim.task
    goal = task.GOAL
    assert task.overlap(goal, goal) >= 0.99
    assert task.overlap(goal + [0.3, 0.0, 0.0], goal) == pytest.approx(0.0, abs=1e-6)
    task.block.set(push_sim.data, goal)
    assert push_sim.task_state().score >= 0.99 and push_sim.task_state().success


def test_push_t_overlap_is_the_exact_area_without_steps_near_the_goal():
    """The score is area, not a count of raster cells: cells lined up with the goal's edges once
    read 0.944 for a T whose area overlap was 0.962, a true success judged a failure."""
    from iws_reference_robot.tasks import T_BOXES, _raster_boxes, inside_boxes, t_overlap, to_local, to_world

    goal = PushT.GOAL
    fine = _raster_boxes(T_BOXES, 0.0002)
    rng = np.random.default_rng(0)
    for _ in range(40):
        pose = goal + rng.normal(0.0, [0.02, 0.02, 0.5])
        assert t_overlap(pose, goal) == pytest.approx(inside_boxes(to_local(to_world(fine, pose), goal), T_BOXES).mean(), abs=0.003)
    # sliding along y by 0.25 mm at a time: the score falls smoothly, about 0.0075 a step (the stem's width x 0.25 mm / area)
    scores = [t_overlap(goal + [0.0, dy, 0.0], goal) for dy in np.arange(0.0, 0.004, 0.00025)]
    assert scores[0] == 1.0 and np.all(np.diff(scores) < 0) and np.max(np.abs(np.diff(scores))) < 0.01
    assert t_overlap([0.0002, 0.3114, 0.7869], goal) == pytest.approx(0.962, abs=0.001)
    assert math.isnan(t_overlap([np.nan, 0.0, 0.0], goal))


def test_t_pose_gaps_measure_how_far_the_t_area_moved(push_sim):
    """ADD and overlap over arrays of poses, as the open-loop report uses them."""
    task = push_sim.task
    goal = np.array(task.GOAL)
    poses = np.stack([goal, goal + [0.01, 0.0, 0.0], goal + [0.0, 0.0, math.pi], [np.nan, 0.0, 0.0]])
    displacement, overlap = t_pose_gaps(poses[None], goal)  # broadcast over a leading episode axis
    assert displacement.shape == overlap.shape == (1, 4)
    assert displacement[0, :2] == pytest.approx([0.0, 0.01])  # a slide moves every point alike
    assert displacement[0, 2] > 0.07  # a flip moves the area twice the T's mean radius
    assert overlap[0, 0] == 1.0 and overlap[0, 1] == pytest.approx(task.overlap(poses[1], goal))
    assert np.isnan(displacement[0, 3]) and np.isnan(overlap[0, 3])


def test_push_t_expert_improves_score(profile):
    sim = ReferenceSim(profile, "push_t", seed=0)
    expert = PushTExpert(sim)
    gains = []
    for episode in range(3):
        sim.reset(100 + episode)
        expert.reset(np.random.default_rng(episode))
        state = sim.task_state()
        start = state.score
        for _ in range(80):
            sim.step(expert.act(state, sim.joint_positions()))
            state = sim.task_state()
        gains.append(state.score - start)
    sim.close()
    assert np.mean(gains) > 0.3


@pytest.mark.parametrize("task", ["rope", "pile"])
def test_other_tasks_reset_and_step(profile, task):
    sim = ReferenceSim(profile, task, seed=0)
    state = sim.task_state()
    assert state.task == task and 0.0 <= state.score <= 1.0 and state.object_poses.shape[1] == 3
    for name in (task, "smooth_random", "contact_seeking"):
        expert = make_expert(name, sim)
        expert.reset(np.random.default_rng(0))
        for _ in range(10):
            setpoint = expert.act(sim.task_state(), sim.joint_positions())
            assert setpoint.shape == (3,) and np.all(np.isfinite(setpoint))
            sim.step(setpoint)
    assert np.all(np.isfinite(sim.task_state().object_poses))
    assert sim.render().shape == (96, 96, 3)
    sim.close()


def test_memoryless_expert_answers_the_same_state_alike_whatever_came_before(push_sim):
    """Its command is a function of the T's pose and the arm alone: two experts, one fresh and one
    that has just pushed the T for 40 steps, agree on the next state."""
    push_sim.reset(7)
    worked = make_expert("push_t_memoryless", push_sim)
    worked.reset(np.random.default_rng(0))
    start = push_sim.task_state().object_poses[0].copy()
    for _ in range(40):
        push_sim.step(worked.act(push_sim.task_state(), push_sim.joint_positions()))
    state, q = push_sim.task_state(), push_sim.joint_positions()
    assert np.linalg.norm(state.object_poses[0][:2] - start[:2]) > 0.01  # it pushed the T
    fresh = make_expert("push_t_memoryless", push_sim)
    fresh.reset(np.random.default_rng(1))
    np.testing.assert_array_equal(worked.act(state, q), fresh.act(state, q))


@pytest.mark.parametrize("kind", ["memoryless", "wandering"])
def test_push_t_only_mixes_refuse_other_tasks(profile, kind):
    from iws_data.collect import make_policy
    sim = ReferenceSim(profile, "rope", seed=0)
    try:
        with pytest.raises(ValueError, match="push_t's expert only"):
            make_policy(kind, "rope", sim)
    finally:
        sim.close()


def test_wandering_expert_pushes_the_t_to_its_own_targets_away_from_the_goal(push_sim):
    """Purposeful pushes that end anywhere: it reaches a target of its own, then takes another."""
    from iws_reference_robot.tasks import PushT, t_overlap
    push_sim.reset(1000)
    expert = make_expert("push_t_wandering", push_sim)
    expert.reset(np.random.default_rng(1000))
    first = expert.target.copy()
    assert t_overlap(first, PushT.GOAL) < expert.GOAL_CLEARANCE
    best = 0.0
    for _ in range(200):
        push_sim.step(expert.act(push_sim.task_state(), push_sim.joint_positions()))
        best = max(best, t_overlap(push_sim.task_state().object_poses[0], first))
        if not np.array_equal(expert.target, first):
            break
    assert best >= expert.REACHED, f"best overlap with its first target {best:.2f}"
    assert not np.array_equal(expert.target, first), "a reached target is replaced by a new one"


def test_experts_limit_pusher_step(push_sim):
    push_sim.reset(3)
    for name in EXPERTS:
        if name in ("rope", "pile"):
            continue
        expert = make_expert(name, push_sim)
        expert.reset(np.random.default_rng(1))
        q = push_sim.joint_positions()
        setpoint = expert.act(push_sim.task_state(), q)
        step = np.linalg.norm(push_sim.forward_kinematics(setpoint) - push_sim.forward_kinematics(q))
        assert step <= expert.max_step + 1e-6


def _run_expert(sim, name, seeds, steps):
    """(start score, end score) per episode of the task's scripted expert."""
    expert = make_expert(name, sim)
    scores = []
    for seed in seeds:
        sim.reset(seed)
        expert.reset(np.random.default_rng(seed))
        state = sim.task_state()
        start = state.score
        for _ in range(steps):
            sim.step(expert.act(state, sim.joint_positions()))
            state = sim.task_state()
        assert np.all(np.isfinite(state.object_poses))
        scores.append((start, state.score))
    return np.array(scores)


def test_rope_push_is_local(profile):
    """The rope lies on the table with friction: a push bends it where it is pushed, the rest stays."""
    sim = ReferenceSim(profile, "rope", seed=0)
    task = sim.task
    sim.reset(0)
    # A straight rope along x, centred at x = 0 at y = 0.36; the pusher comes from below its middle.
    task.root.set(sim.data, [-task.length / 2, 0.36, 0.0])
    sim.data.qpos[task.bend_qpos] = 0.0
    sim.data.qvel[task.bend_dof] = 0.0
    mujoco.mj_forward(sim.model, sim.data)
    expert = make_expert("smooth_random", sim)
    for _ in range(15):
        sim.step(expert.move_toward([0.0, 0.30], sim.joint_positions()))
    before = task.nodes()
    np.testing.assert_allclose(before[:, 1], 0.36, atol=0.002)  # untouched rope stays put
    for _ in range(12):  # about 5 cm past first contact, slowly
        sim.step(expert.move_toward([0.0, 0.45], sim.joint_positions(), max_step=0.01))
    for _ in range(5):
        sim.step(sim.joint_positions())
    moved = np.abs(task.nodes() - before)[:, 1]  # along the push (the ends also come in a little along x)
    middle = task.SEGMENTS // 2
    assert moved[middle] > 0.03
    assert moved[[0, 1, 2, -3, -2, -1]].max() < 0.25 * moved[middle]
    # Resting again, it stays where it was left (static friction holds against the bending springs).
    rest = task.nodes()
    for _ in range(20):
        sim.step(expert.move_toward([0.0, 0.30], sim.joint_positions()))
    assert np.abs(task.nodes() - rest).max() < 0.003
    sim.close()


def test_rope_expert_improves_score(profile):
    sim = ReferenceSim(profile, "rope", seed=0)
    scores = _run_expert(sim, "rope", range(100, 103), 150)
    sim.close()
    assert np.mean(scores[:, 1] - scores[:, 0]) > 0.3


def test_pile_expert_improves_score(profile):
    sim = ReferenceSim(profile, "pile", seed=0)
    scores = _run_expert(sim, "pile", range(100, 103), 200)
    sim.close()
    assert np.mean(scores[:, 1]) >= 0.6 and np.mean(scores[:, 1] - scores[:, 0]) > 0.4


def test_noisy_pixel_expert_adds_the_seeded_noise_and_rejects_bad_specs(push_sim, profile):
    from iws_policy.node import ExpertSpec, make_runner, parse_expert_spec
    from iws_reference_robot.pixel_expert import PushTExpertPolicy

    assert parse_expert_spec("expert") == ExpertSpec(noise=0.0, speed=1.0)
    assert parse_expert_spec("expert:noise=0.02") == ExpertSpec(noise=0.02)
    assert parse_expert_spec("expert:speed=0.5,noise=0.01") == ExpertSpec(noise=0.01, speed=0.5)
    assert parse_expert_spec("runs/policy") is None  # a checkpoint directory, not an expert
    for bad in ("expert:noise=-0.1", "expert:noise=nan", "expert:gain=2", "expert:noise=", "expert:speed=0",
                "expert:speed=1.5", "expert:noise=0.01,noise=0.02", "expert:noise=0.01,"):
        with pytest.raises(ValueError, match="expert spec"):
            make_runner(bad, profile)
    push_sim.reset(5)
    image, joints = push_sim.render(), push_sim.joint_positions()
    plain = PushTExpertPolicy(profile, seed=7).act(image, joints)
    noisy = [PushTExpertPolicy(profile, seed=7, command_noise=0.02).act(image, joints) for _ in range(2)]
    other_seed = make_runner("expert:noise=0.02", profile, seed=8).act(image, joints)
    assert plain is not None and noisy[0].shape == plain.shape
    np.testing.assert_array_equal(noisy[0], noisy[1])          # the same seed, the same noise (either backend)
    assert 0 < np.abs(noisy[0] - plain).max() < 0.1            # noise of about 0.02 rad on the expert's command
    assert not np.array_equal(noisy[0], other_seed)
    with pytest.raises(ValueError, match="command_noise"):
        PushTExpertPolicy(profile, command_noise=-1.0)
    with pytest.raises(ValueError, match="speed"):
        PushTExpertPolicy(profile, speed=0.0)


def test_slowed_pixel_expert_takes_shorter_steps_and_pushes_less_in_the_same_time(push_sim, profile):
    """The 'speed' family: the same expert, its pusher step scaled. It must be slower in fact, not
    just in name: over the first 40 commands its pusher travels less, and the T moves less."""
    from iws_reference_robot.pixel_expert import drive_pixel_expert

    travel, moved = {}, {}
    for speed in (1.0, 0.3):
        pushers, poses = [], []
        for _, state in drive_pixel_expert(push_sim, profile, seed=3, steps=40, speed=speed):  # resets it to seed 3
            pushers.append(push_sim.pusher_xy())
            poses.append(state.object_poses[0])
        travel[speed] = float(np.linalg.norm(np.diff(np.array(pushers), axis=0), axis=1).sum())
        moved[speed] = float(np.linalg.norm(poses[-1][:2] - poses[0][:2]))
    assert travel[0.3] < 0.6 * travel[1.0]
    assert moved[0.3] < moved[1.0]
