"""Robot profiles, command rules and image conversion: the helpers every node shares."""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from sensor_msgs.msg import Image

from iws_common.commands import (WAITING_FOR_COMMANDS, CommandRejected, CommandsInFlight, JointCommandFollower,
                                 step_when_commands_arrive)
from iws_common.image_conversion import ImageEncodingError, convert_encoding, image_to_numpy, numpy_to_image
from iws_common.profile import ProfileError, config_dir, load_profile


# -- profiles -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(p.stem for p in (config_dir() / "robots").glob("*.yaml")))
def test_every_shipped_profile_loads(name):
    profile = load_profile(name)
    assert profile.joints.count == len(profile.joints.lower) == len(profile.joints.upper)
    assert profile.camera.width > 0 and profile.control_rate_hz > 0
    assert profile.topics.image.startswith("/") and profile.services.step.startswith("/")


def test_profiles_carry_what_differs_between_robots():
    reference, ur5e = load_profile("reference_arm"), load_profile("ur5e_realsense")
    assert reference.joints.names != ur5e.joints.names
    assert (reference.camera.width, reference.camera.height) != (ur5e.camera.width, ur5e.camera.height)
    assert reference.topics.trajectory_command != ur5e.topics.trajectory_command


def _write_profile(tmp_path, mutate):
    data = yaml.safe_load((config_dir() / "robots" / "reference_arm.yaml").read_text())
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["joints"].update(lower=[0.0]), "'lower' has 1 entries"),
    (lambda d: d.pop("camera"), "missing section 'camera'"),
    (lambda d: d["topics"].update(image="camera/image"), "must be an absolute name"),
    (lambda d: d["camera"].update(encoding="yuv422"), "encoding must be"),
    (lambda d: d["joints"].update(names=["a", "a", "b"]), "unique"),
    (lambda d: d["topics"].update(imagee="/x"), "unknown keys"),
])
def test_bad_profile_gives_a_clear_error(tmp_path, mutate, message):
    with pytest.raises(ProfileError, match=message):
        load_profile(_write_profile(tmp_path, mutate))


def test_unknown_profile_lists_the_available_ones():
    with pytest.raises(ProfileError, match="reference_arm"):
        load_profile("no_such_robot")


def test_camera_scaling_keeps_the_pinhole_consistent():
    camera = load_profile("ur5e_realsense").camera
    half = camera.scaled(320, 240)
    assert half.fx == pytest.approx(camera.fx / 2)
    assert half.cx == pytest.approx((camera.cx + 0.5) / 2 - 0.5)


# -- command rules --------------------------------------------------------------------------
@pytest.fixture
def follower():
    return JointCommandFollower(load_profile("reference_arm").joints)


@pytest.mark.parametrize("values, kind", [
    ([float("nan"), 0.0, 0.0], "non_finite"),
    ([float("inf"), 0.0, 0.0], "non_finite"),
    ([0.0, 0.0], "wrong_length"),
    ([], "wrong_length"),
    ([0.0] * 4, "wrong_length"),
])
def test_bad_position_commands_are_rejected_and_the_target_is_kept(follower, values, kind):
    follower.set_position_command([0.1, 0.2, 0.3])
    with pytest.raises(CommandRejected) as info:
        follower.set_position_command(values)
    assert info.value.kind == kind
    np.testing.assert_array_equal(follower.target, [0.1, 0.2, 0.3])
    assert follower.rejected[kind] == 1


def test_position_beyond_limits_is_clamped(follower):
    upper = np.asarray(follower.joints.upper)
    target = follower.set_position_command(upper + 1.0)
    np.testing.assert_array_equal(target, upper)
    assert follower.clamped == 1


def test_setpoint_respects_max_velocity(follower):
    follower.reset([0.0, 0.0, 0.0])
    follower.set_position_command([2.0, -2.0, 0.01])
    setpoint = follower.step(now=0.0, dt=0.1)
    # max_velocity [2, 2, 3] rad/s over 0.1 s: the first two joints are limited, the third arrives.
    np.testing.assert_allclose(setpoint, [0.2, -0.2, 0.01])


@pytest.mark.parametrize("names, times, positions, kind", [
    (["shoulder_pan_joint", "elbow_joint", "gripper"], [1.0], [[0, 0, 0]], "unknown_joint"),
    (["shoulder_pan_joint", "elbow_joint"], [1.0], [[0, 0]], "joint_set"),
    (["shoulder_pan_joint", "elbow_joint", "wrist_joint"], [2.0, 1.0], [[0, 0, 0], [0, 0, 0]], "time_order"),
    (["shoulder_pan_joint", "elbow_joint", "wrist_joint"], [1.0, 1.0], [[0, 0, 0], [0, 0, 0]], "time_order"),
    (["shoulder_pan_joint", "elbow_joint", "wrist_joint"], [-1.0], [[0, 0, 0]], "bad_time"),
    (["shoulder_pan_joint", "elbow_joint", "wrist_joint"], [1.0], [[0, float("nan"), 0]], "non_finite"),
    (["shoulder_pan_joint", "elbow_joint", "wrist_joint"], [1.0], [[0, 0]], "wrong_length"),
    (["shoulder_pan_joint", "elbow_joint", "wrist_joint"], [], [], "empty"),
])
def test_bad_trajectories_are_rejected(follower, names, times, positions, kind):
    with pytest.raises(CommandRejected) as info:
        follower.set_trajectory(names, times, positions, now=0.0)
    assert info.value.kind == kind


def test_trajectory_is_interpolated_in_profile_order(follower):
    follower.reset([0.0, 0.0, 0.0])
    follower.set_trajectory(["wrist_joint", "shoulder_pan_joint", "elbow_joint"], [1.0], [[0.3, 0.1, 0.2]], now=10.0)
    np.testing.assert_allclose(follower.step(now=10.5, dt=0.1), [0.05, 0.1, 0.15])
    np.testing.assert_allclose(follower.step(now=11.5, dt=0.1), [0.1, 0.2, 0.3])


def _step_response(success: bool, received: int, message: str = ""):
    from iws_interfaces.srv import StepWorld
    return StepWorld.Response(success=success, commands_since_reset=received, message=message)


def test_a_step_is_asked_again_only_while_commands_are_in_flight():
    """The lockstep clients' loop (iws evaluate, the test harness): a refusal that waits for commands
    is asked again until the backend steps; any other refusal comes back at once for the caller."""
    waiting = [_step_response(False, k, f"{WAITING_FOR_COMMANDS}: {k} of 3 received since the reset") for k in (1, 2)]
    answers = iter(waiting + [_step_response(True, 3)])
    calls = []

    def ask():
        calls.append(1)
        return next(answers)

    assert step_when_commands_arrive(ask, commands_sent=3, poll_s=0).success
    assert len(calls) == 3

    paused = _step_response(False, 1, "the world is paused")  # fewer commands, but refused for another reason
    calls.clear()
    assert step_when_commands_arrive(lambda: calls.append(1) or paused, commands_sent=3) is paused
    assert len(calls) == 1


def test_commands_that_never_arrive_end_the_step_with_the_count():
    stuck = _step_response(False, 2, f"{WAITING_FOR_COMMANDS}: 2 of 5 received since the reset")
    with pytest.raises(CommandsInFlight, match="received 2 of the 5 commands sent since the reset"):
        step_when_commands_arrive(lambda: stuck, commands_sent=5, timeout_s=0.05, poll_s=0.001)


# -- image conversion -----------------------------------------------------------------------
@pytest.mark.parametrize("encoding, shape", [("rgb8", (5, 7, 3)), ("bgr8", (5, 7, 3)), ("mono8", (5, 7))])
def test_image_round_trip(encoding, shape):
    array = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    msg = numpy_to_image(array, encoding)
    assert (msg.height, msg.width, msg.encoding, msg.step) == (5, 7, encoding, 7 * (3 if len(shape) == 3 else 1))
    np.testing.assert_array_equal(image_to_numpy(msg, want=None), array)


def test_bgr_is_converted_to_rgb():
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[..., 0] = 200
    msg = numpy_to_image(convert_encoding(rgb, "rgb8", "bgr8"), "bgr8")
    np.testing.assert_array_equal(image_to_numpy(msg, want="rgb8"), rgb)


def test_padded_rows_honour_step():
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    padded = np.zeros((2, 12), np.uint8)
    padded[:, :9] = array.reshape(2, 9)
    msg = Image(height=2, width=3, encoding="rgb8", step=12, data=padded.tobytes())
    np.testing.assert_array_equal(image_to_numpy(msg), array)


def test_mono_to_rgb_and_back():
    gray = np.array([[0, 128], [255, 7]], np.uint8)
    rgb = convert_encoding(gray, "mono8", "rgb8")
    np.testing.assert_array_equal(convert_encoding(rgb, "rgb8", "mono8"), gray)


@pytest.mark.parametrize("msg, message", [
    (Image(height=2, width=2, encoding="yuv422", step=4, data=bytes(8)), "unsupported"),
    (Image(height=2, width=2, encoding="rgb8", step=6, data=bytes(5)), "expected step"),
    (Image(height=2, width=2, encoding="rgb8", step=3, data=bytes(12)), "smaller than"),
])
def test_malformed_images_give_clear_errors(msg, message):
    with pytest.raises(ImageEncodingError, match=message):
        image_to_numpy(msg)


def test_a_publish_that_races_shutdown_ends_the_node_cleanly():
    """SIGINT invalidates the context while a callback runs; its publish then raises RCLError. After
    shutdown that is a clean stop (exit 0); with the context still up it is a real error."""
    import rclpy
    from rclpy._rclpy_pybind11 import RCLError

    from iws_common.run import spin_until_shutdown

    def racing_spin():
        rclpy.shutdown()
        raise RCLError("Failed to publish: publisher's context is invalid")

    rclpy.init()
    spin_until_shutdown(racing_spin)
    assert not rclpy.ok()

    def racing_take():  # the executor's take after SIGINT, as CI once saw it
        rclpy.shutdown()
        raise RuntimeError("Unable to convert call argument '0' to Python object")

    rclpy.init()
    spin_until_shutdown(racing_take)
    assert not rclpy.ok()

    for error in (RCLError("a real failure"), RuntimeError("a real failure")):
        def failing_spin():
            raise error

        rclpy.init()
        try:
            with pytest.raises(type(error)):
                spin_until_shutdown(failing_spin)
        finally:
            rclpy.try_shutdown()


def test_private_domains_are_leased_one_tool_at_a_time(tmp_path, monkeypatch):
    """Two tools side by side on one machine never share a private ROS domain, also across processes;
    a lease ends with its release or its process."""
    import subprocess
    import sys

    from iws_common import processes
    monkeypatch.setattr(processes, "LEASE_DIR", tmp_path)
    monkeypatch.setattr(processes, "PRIVATE_DOMAINS", range(90, 93))
    leases = [processes.DomainLease() for _ in range(3)]
    assert sorted(lease.domain_id for lease in leases) == [90, 91, 92]
    with pytest.raises(RuntimeError, match="held by another iws tool"):
        processes.DomainLease()
    leases[1].release()
    with processes.DomainLease() as again:
        assert again.domain_id == leases[1].domain_id
    for lease in leases:
        lease.release()

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom iws_common import processes\n"
         f"processes.LEASE_DIR, processes.PRIVATE_DOMAINS = Path({str(tmp_path)!r}), range(90, 91)\n"
         "print(processes.private_domain_id(), flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "90"
        monkeypatch.setattr(processes, "PRIVATE_DOMAINS", range(90, 91))
        with pytest.raises(RuntimeError):
            processes.DomainLease()
    finally:
        holder.kill()
        holder.wait()
    assert processes.DomainLease().domain_id == 90  # the kernel dropped the dead process's lock
