"""Shared fixtures: a private ROS domain per test, node processes, and a client in the test process."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("FASTDDS_BUILTIN_TRANSPORTS", "LARGE_DATA")
# Nodes started by the tests discover only on this machine; the test process must match them.
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

from ros_harness import NodeProcess, RosClient, next_domain_id, reference_robot_args  # noqa: E402


@pytest.fixture
def domain_id() -> int:
    return next_domain_id()


@pytest.fixture
def ros_client(domain_id):
    client = RosClient(domain_id)
    yield client
    client.close()


@pytest.fixture
def start_reference(domain_id, tmp_path):
    """Start reference robot processes: ``start_reference(mode="lockstep", task="push_t")``."""
    started: list[NodeProcess] = []

    def start(**params) -> NodeProcess:
        log = tmp_path / f"reference_robot_{len(started)}.log"
        node = NodeProcess(reference_robot_args(**params), domain_id, log)
        started.append(node)
        return node

    yield start
    for node in started:
        code = node.stop()
        # A node that crashed during the test fails it even if every assertion passed.
        assert code in (0, -2) or code in node.expected_exit, f"reference robot exited with {code}:\n{node.output()[-3000:]}"
