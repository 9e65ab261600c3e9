"""Shared fixtures: a private ROS domain per test, node processes, and a client in the test process."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("FASTDDS_BUILTIN_TRANSPORTS", "LARGE_DATA")
# Nodes started by the tests discover only on this machine; the test process must match them.
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

from ros_harness import REPO, NodeProcess, RosClient, backend_args, next_domain_id  # noqa: E402


@pytest.fixture
def domain_id() -> int:
    return next_domain_id()


@pytest.fixture
def ros_client(domain_id):
    client = RosClient(domain_id)
    yield client
    client.close()


@pytest.fixture
def start_backend(domain_id, tmp_path):
    """Start backend node processes: ``start_backend("world_model", mode="lockstep", model=...)``."""
    started: list[NodeProcess] = []

    def start(backend: str, **params) -> NodeProcess:
        log = tmp_path / f"{backend}_{len(started)}.log"
        node = NodeProcess(backend_args(backend, **params), domain_id, log)
        started.append(node)
        return node

    yield start
    for node in started:
        code = node.stop()
        # A node that crashed during the test fails it even if every assertion passed.
        assert code in (0, -2) or code in node.expected_exit, f"{node.log_path.name} exited with {code}:\n{node.output()[-3000:]}"


@pytest.fixture
def start_reference(start_backend):
    """Start reference robot processes: ``start_reference(mode="lockstep", task="push_t")``."""
    return lambda **params: start_backend("reference", **params)


@pytest.fixture(scope="session")
def tiny_world_model(tmp_path_factory) -> Path:
    """A real, small world model: reference-robot play data -> rosbag2 -> dataset -> `iws train`.

    The whole pipeline at toy scale (a few short episodes, the tiny config, a few dozen steps per
    stage), so that node and evaluation tests serve a model that went through every real step.
    """
    from iws_data.builder import build_dataset
    from iws_data.collect import collect
    from iws_world_model.train import main as train_main

    root = tmp_path_factory.mktemp("tiny_world_model")
    collect("reference_arm", "push_t", root / "bags", episodes=4, steps=24, seed=0, progress=False)
    dataset, _ = build_dataset([root / "bags"], root / "dataset", size=96, val_fraction=0.25, progress=False)
    code = train_main(["--config", str(REPO / "config/models/tiny.yaml"), "--data", str(dataset),
                       "--out", str(root / "model"), "--steps", "30", "--threads", "2"])
    assert code == 0
    return root / "model"
