"""Isolation beside hardware (docs/safety.md): a simulator refuses the hardware's domain and a graph
where a driver already serves the robot's topics, and with the defaults the commands a policy sends
to the simulator never reach a hardware node started the ordinary way."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from iws_common.client import RosClient
from iws_common.isolation import IsolationError, check_domain, check_graph, simulator_domain
from iws_common.profile import ProfileError, config_dir, load_profile
from ros_harness import REPO, next_domain_id

STANDIN = Path(__file__).with_name("hardware_standin.py")
PROFILE = load_profile("reference_arm")


def ordinary_env(domain: int | None) -> dict:
    """A shell without any iws setting: default discovery and transports, ROS_DOMAIN_ID as given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ROS_AUTOMATIC_DISCOVERY_RANGE", "FASTDDS_BUILTIN_TRANSPORTS", "ROS_DOMAIN_ID")}
    if domain is not None:
        env["ROS_DOMAIN_ID"] = str(domain)
    return env


def profile_with_domains(tmp_path: Path, hardware: int, simulator: int) -> Path:
    text = (config_dir() / "robots" / "reference_arm.yaml").read_text()
    text = text.replace("hardware_ros_domain_id: 0", f"hardware_ros_domain_id: {hardware}")
    text = text.replace("simulator_ros_domain_id: 42", f"simulator_ros_domain_id: {simulator}")
    path = tmp_path / "isolated_arm.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def hardware(tmp_path):
    """Start the stand-in driver on a domain; yields a function returning (process, count file)."""
    started = []

    def start(domain: int, profile: str | Path = "reference_arm"):
        count = tmp_path / f"hardware_commands_{len(started)}.txt"
        log = open(tmp_path / f"hardware_{len(started)}.log", "w")
        proc = subprocess.Popen([sys.executable, str(STANDIN), str(profile), str(count)], env=ordinary_env(domain),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        deadline = time.monotonic() + 30
        while not count.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / f"hardware_{len(started) - 1}.log").read_text()
            time.sleep(0.05)
        return proc, count

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def wait_exit(node, timeout: float = 120.0) -> int:
    try:
        return node.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the simulator did not refuse within {timeout} s:\n{node.output()[-2000:]}")


def wait_log(node, text: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        output = node.output()
        if text in output:
            return output
        assert node.alive(), f"node exited with {node.proc.returncode}:\n{output[-2000:]}"
        time.sleep(0.2)
    pytest.fail(f"'{text}' not in the node's log within {timeout} s:\n{node.output()[-2000:]}")


def test_profile_domains_are_validated(tmp_path):
    assert PROFILE.simulator_ros_domain_id != PROFILE.hardware_ros_domain_id
    with pytest.raises(ProfileError, match="must differ"):
        load_profile(profile_with_domains(tmp_path, 7, 7))
    assert simulator_domain(PROFILE, env={}) == PROFILE.simulator_ros_domain_id
    assert simulator_domain(PROFILE, env={"ROS_DOMAIN_ID": "17"}) == 17
    with pytest.raises(IsolationError, match="hardware's domain"):
        check_domain(PROFILE, PROFILE.hardware_ros_domain_id)
    check_domain(PROFILE, PROFILE.hardware_ros_domain_id, allow_hardware_domain=True)


class GraphWhereTheNameArrivesLate:
    """The DDS graph as rclpy reports it when a participant's endpoints are discovered before its
    node name (seen in CI): the name is "_NODE_NAME_UNKNOWN_" for the first ``late_s`` seconds."""

    def __init__(self, late_s: float):
        self.named_at = time.monotonic() + late_s

    def get_name(self):
        return "reference_robot"

    def get_namespace(self):
        return "/"

    def _endpoint(self):
        named = time.monotonic() >= self.named_at
        return type("Info", (), {"node_name": "controller_manager" if named else "_NODE_NAME_UNKNOWN_",
                                 "node_namespace": "/hardware_driver" if named else "/"})()

    def get_publishers_info_by_topic(self, topic):
        return [self._endpoint()] if topic == PROFILE.topics.joint_states else []

    def get_subscriptions_info_by_topic(self, topic):
        return []

    context = type("Context", (), {"get_domain_id": staticmethod(lambda: 7)})()


def test_the_refusal_waits_for_a_late_node_name():
    with pytest.raises(IsolationError) as refused:
        check_graph(GraphWhereTheNameArrivesLate(late_s=1.0), PROFILE, wait_s=0.3, poll_s=0.05)
    assert f"/hardware_driver/controller_manager publishes {PROFILE.topics.joint_states}" in str(refused.value)
    assert "not yet identified" not in str(refused.value)  # the placeholder is dropped once named
    # A name that never arrives: refused all the same, after at most name_wait_s more.
    began = time.monotonic()
    with pytest.raises(IsolationError, match="not yet identified"):
        check_graph(GraphWhereTheNameArrivesLate(late_s=60), PROFILE, wait_s=0.3, poll_s=0.05, name_wait_s=0.5)
    assert time.monotonic() - began < 2.0


@pytest.mark.parametrize("backend", ["reference", "world_model"])
def test_simulator_refuses_to_start_beside_a_driver(backend, hardware, domain_id, start_backend, tiny_world_model):
    hardware(domain_id)
    params = {"mode": "lockstep"} | ({"model": str(tiny_world_model)} if backend == "world_model" else {})
    refused = start_backend(backend, **params)
    refused.expected_exit = (1,)
    assert wait_exit(refused) == 1
    output = refused.output()
    assert "refusing to start" in output, output[-2000:]
    assert f"/hardware_driver/controller_manager publishes {PROFILE.topics.joint_states}" in output
    assert f"/hardware_driver/controller_manager subscribes {PROFILE.topics.position_command}" in output

    # The explicit override starts it, and the log names what it starts beside.
    allowed = start_backend(backend, allow_foreign_nodes=True, **params)
    wait_log(allowed, "up: ")
    # Named at start-up, or by the graph watch within seconds if discovery was slow.
    output = wait_log(allowed, "/hardware_driver/controller_manager", timeout=30)
    assert ("allow_foreign_nodes: starting beside /hardware_driver" in output
            or "another node now serves this robot's interface: /hardware_driver" in output)


def test_simulator_refuses_the_hardware_domain(tmp_path, domain_id, start_backend):
    profile = profile_with_domains(tmp_path, hardware=domain_id, simulator=next_domain_id())
    refused = start_backend("reference", robot=str(profile), mode="lockstep")
    refused.expected_exit = (1,)
    assert wait_exit(refused) == 1
    assert f"refusing to start on ROS domain {domain_id}, the hardware's domain" in refused.output()
    allowed = start_backend("reference", robot=str(profile), mode="lockstep", allow_hardware_domain=True)
    wait_log(allowed, "reference robot up")


def test_with_the_defaults_commands_never_reach_the_hardware(tmp_path, hardware):
    hardware_domain, sim_domain = next_domain_id(), next_domain_id()
    profile_path = profile_with_domains(tmp_path, hardware=hardware_domain, simulator=sim_domain)
    profile = load_profile(profile_path)
    standin, commands_at_hardware = hardware(hardware_domain, profile_path)

    # `iws up` from a shell without ROS_DOMAIN_ID: the profile's simulator domain, localhost only.
    log = open(tmp_path / "up.log", "w")
    up = subprocess.Popen([sys.executable, "-m", "iws_bringup.cli", "up", "reference", "--robot", str(profile_path)],
                          env=ordinary_env(None), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    # A policy joins the way `iws env` says.
    exports = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "env", "--robot", str(profile_path)],
                             capture_output=True, text=True, check=True).stdout
    assert exports.strip() == f"export ROS_DOMAIN_ID={sim_domain} ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST"
    policy = RosClient(sim_domain, name="policy")
    try:
        joints = policy.collect(JointState, profile.topics.joint_states)
        policy.wait_for(joints, 1, timeout=120)
        command = policy.publisher(Float64MultiArray, profile.topics.position_command)
        policy.wait_for_subscribers(command)
        assert command.get_subscription_count() == 1, "only the simulator may subscribe the policy's commands"
        target = np.asarray(profile.joints.home) + np.array([0.3, -0.3, 0.5])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not np.allclose(joints[-1].position, target, atol=0.05):
            command.publish(Float64MultiArray(data=target.tolist()))
            time.sleep(0.1)
        np.testing.assert_allclose(joints[-1].position, target, atol=0.05, err_msg="the simulator did not follow")
        assert standin.poll() is None
        assert commands_at_hardware.read_text() == "0", "a command meant for the simulator reached the hardware"
    finally:
        policy.close()
        up.terminate()
        up.wait(20)
    assert f"ROS domain {sim_domain}, discovery LOCALHOST" in (tmp_path / "up.log").read_text()


def test_a_driver_that_appears_later_is_reported(hardware, domain_id, start_backend):
    sim = start_backend("reference", mode="lockstep")
    wait_log(sim, "reference robot up")
    hardware(domain_id)
    wait_log(sim, "another node now serves this robot's interface: /hardware_driver/controller_manager", timeout=30)
