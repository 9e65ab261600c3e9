"""Helpers for tests that talk to real nodes in other processes over DDS.

Each test gets its own ROS_DOMAIN_ID so that tests never hear each other; nodes run as
subprocesses under that domain, and the test process joins the same domain as a client.
"""
from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

from iws_bringup.backends import ros_arguments
from iws_common.client import RosClient  # noqa: F401  (re-exported for the tests)
from iws_common.processes import NodeProcess, ros_env  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
_domains = itertools.count(os.getpid() * 7)


def next_domain_id() -> int:
    """A domain per test (10..89), varied by process so that concurrent test runs rarely meet."""
    return 10 + next(_domains) % 80


def reference_robot_args(**params) -> list[str]:
    return [sys.executable, "-m", "iws_reference_robot.node"] + ros_arguments(params)
