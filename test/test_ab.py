"""A/B bringup: the reference robot (/real) and the world model (/sim) under one command stream,
and `iws compare`'s video and per-frame errors."""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from conformance import check_interface
from iws_bringup.backends import BringupError, ab_nodes, bringup_config_path, load_ab, ros_arguments
from iws_bringup.compare import FramePair, FramePairer, compose_frame, frame_error
from iws_common.processes import NodeProcess
from iws_common.profile import ProfileError, load_profile, normalize_namespace
from iws_interfaces.srv import StepWorld
from ros_harness import LockstepClient

PROFILE = load_profile("reference_arm")


def test_namespaced_profile_prefixes_every_name():
    sim = PROFILE.namespaced("sim/")
    assert sim.topics.joint_states == "/sim/joint_states" and sim.services.step == "/sim/iws/step_world"
    assert sim.topics.position_command == "/sim" + PROFILE.topics.position_command
    assert sim.joints == PROFILE.joints and sim.camera == PROFILE.camera
    assert PROFILE.namespaced("") is PROFILE and normalize_namespace("/") == ""
    for bad in ("/2sim", "/s-im", "/a//b"):
        with pytest.raises(ProfileError, match="not a valid ROS namespace"):
            normalize_namespace(bad)


def test_ab_plan_from_the_shared_yaml(tmp_path):
    nodes = ab_nodes("reference_arm", {"mode": "lockstep", "model": "/m", "task": "rope"})
    by_label = {n.label: n for n in nodes}
    assert set(by_label) == {"real", "sim", "fanout"}
    assert {"task": "rope", "mode": "lockstep", "namespace": "/real"}.items() <= by_label["real"].parameters.items()
    assert "task" not in by_label["sim"].parameters and by_label["sim"].parameters["model"] == "/m"
    assert by_label["fanout"].parameters["namespaces"] == ["/real", "/sim"]
    assert ros_arguments(by_label["fanout"].parameters)[-1] == "namespaces:=[/real,/sim]"
    assert ros_arguments({}, "/real") == ["--ros-args", "-r", "__ns:=/real"]
    broken = tmp_path / "bringup.yaml"
    broken.write_text(bringup_config_path().read_text().replace("namespace: /sim", "namespace: /real"))
    with pytest.raises(BringupError, match="distinct namespaces"):
        load_ab(broken)


def test_frame_pairing_and_errors():
    pairer = FramePairer(max_lag=2)
    image = lambda v: np.full((4, 4, 3), v, np.uint8)
    assert pairer.add("real", 1, image(10)) is None
    pair = pairer.add("sim", 7, image(20))
    assert (pair.index, pair.real_stamp_ns, pair.sim_stamp_ns) == (0, 1, 7)
    for stamp in (2, 3, 4):  # /real runs ahead by 3 > max_lag: its oldest waiting frame is dropped
        pairer.add("real", stamp, image(stamp))
    assert pairer.dropped == {"real": 1, "sim": 0} and pairer.add("sim", 8, image(0)).real_stamp_ns == 3
    mae, psnr = frame_error(image(10), image(20))
    assert mae == 10.0 and psnr == pytest.approx(10 * np.log10(255 ** 2 / 100))
    assert frame_error(image(5), image(5)) == (0.0, None)
    frame = compose_frame(FramePair(3, 0, 0, image(10), np.full((2, 2, 3), 30, np.uint8)), 20.0, 22.1)
    assert frame.shape[1] == 3 * 4 + 2 * 2 and frame.shape[0] > 4
    assert (frame[:4, 6:10] == 30).all() and (frame[:4, 12:16] == 20).all(), "the difference panel holds |real - sim|, the sim resized to the real size"


def test_up_ab_fans_out_commands_and_compare_writes_video(tiny_world_model, domain_id, ros_client, tmp_path):
    up = NodeProcess([sys.executable, "-m", "iws_bringup.cli", "up", "ab", "--mode", "lockstep", "--threads", "1",
                      "--model", str(tiny_world_model), "--logs", str(tmp_path / "logs")], domain_id, tmp_path / "up.log")
    compare = None
    try:
        sides = {ns: PROFILE.namespaced(ns) for ns in ("/real", "/sim")}
        for ns, profile in sides.items():
            step = lambda p=profile: ros_client.call(StepWorld, p.services.step, StepWorld.Request(num_steps=1))
            check_interface(ros_client, profile, step=step)
        real, sim = (LockstepClient(ros_client, p) for p in sides.values())

        # One top-level stream reaches both: bad input is rejected by both, a good command moves /real.
        command = ros_client.publisher(Float64MultiArray, PROFILE.topics.position_command)
        trajectory = ros_client.publisher(JointTrajectory, PROFILE.topics.trajectory_command)
        ros_client.wait_for_subscribers(command)
        ros_client.wait_for_subscribers(trajectory)
        command.publish(Float64MultiArray(data=[1.0, 2.0]))
        trajectory.publish(JointTrajectory(joint_names=["nope"], points=[JointTrajectoryPoint(positions=[0.0])]))
        time.sleep(0.5)
        for side in (real, sim):
            side.step(1)  # publishes WorldStatus
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and [s.status[-1].rejected_commands for s in (real, sim)] != [2, 2]:
            time.sleep(0.1)
        assert [s.status[-1].rejected_commands for s in (real, sim)] == [2, 2], "both sides see every command"
        target = np.array([-1.5, 1.5, 0.3])
        command.publish(Float64MultiArray(data=target.tolist()))
        time.sleep(0.5)
        sim_joint_states = len(sim.joints)
        real.step(5)
        sim.step(5)
        np.testing.assert_allclose(real.latest_joints(), target, atol=0.02)
        ros_client.wait_for(sim.joints, sim_joint_states + 5)
        assert np.all(np.isfinite(sim.latest_joints()))

        # `iws compare --sync`: /sim restarts from /real's last frames, then N stepped pairs.
        frames = 5
        compare = NodeProcess([sys.executable, "-m", "iws_bringup.cli", "compare", "--out", str(tmp_path / "ab.mp4"),
                               "--frames", str(frames), "--seconds", "60", "--sync", "--sync-frames", "2"],
                              domain_id, tmp_path / "compare.log")
        deadline = time.monotonic() + 60
        while "comparing" not in compare.output() and compare.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "synced /sim to the last 2 frames of /real" in compare.output(), compare.output()
        for _ in range(frames):
            real.step(1)
            sim.step(1)
        assert compare.proc.wait(60) == 0, compare.output()
    finally:
        if compare is not None:
            compare.stop()
        assert up.stop(timeout=30) in (0, -2), up.log_path.read_text()[-3000:]
    log = up.log_path.read_text()
    assert "real ready" in log and "sim ready" in log and "stopping" in log
    summary = json.loads((tmp_path / "ab.json").read_text())
    assert summary["frames"] == frames and summary["synced"] and len(summary["pairs"]) == frames
    assert all(0 <= p["mean_abs_error"] <= 255 for p in summary["pairs"])
    assert summary["mean_abs_error"] > 0, "an untrained tiny model cannot render the real frames exactly"
    import av
    with av.open(str(tmp_path / "ab.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == frames
