"""Bringup: the launch file and `iws up` read one YAML and name things that exist."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import check_interface
from iws_bringup.backends import load_ab, load_backends
from iws_common.processes import NodeProcess
from iws_common.profile import load_profile

REPO = Path(__file__).resolve().parents[1]
LAUNCH_FILE = REPO / "src/iws_bringup/launch/robot.launch.py"
AB_LAUNCH_FILE = REPO / "src/iws_bringup/launch/ab.launch.py"


def console_scripts(package: str) -> dict[str, str]:
    """Console scripts declared in a package's setup.py, read statically."""
    tree = ast.parse((REPO / "src" / package / "setup.py").read_text())
    scripts = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and " = " in node.value and ":" in node.value:
            name, target = (part.strip() for part in node.value.split("=", 1))
            scripts[name] = target
    return scripts


@pytest.mark.parametrize("backend", sorted(load_backends().values(), key=lambda b: b.name), ids=lambda b: b.name)
def test_every_backend_names_an_existing_executable(backend):
    if not backend.starts_a_node:
        return
    assert (REPO / "src" / backend.package / "package.xml").is_file(), f"no package {backend.package}"
    scripts = console_scripts(backend.package)
    assert backend.executable in scripts, f"{backend.package} declares no executable {backend.executable}: {scripts}"
    assert scripts[backend.executable] == backend.entry_point, "launch and `iws up` would start different code"
    module, func = backend.entry_point.split(":")
    assert importlib.util.find_spec(module) is not None
    assert callable(getattr(importlib.import_module(module), func))


def test_launch_file_reads_the_shared_backends():
    source = LAUNCH_FILE.read_text()
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "iws_bringup.backends" for alias in node.names}
    assert {"get_backend", "node_parameters"} <= imported
    assert "generate_launch_description" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    setup = (REPO / "src/iws_bringup/setup.py").read_text()
    assert 'glob("launch/*.launch.py")' in setup, "launch files must be installed"


def test_ab_launch_file_reads_the_shared_ab_plan():
    tree = ast.parse(AB_LAUNCH_FILE.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "iws_bringup.backends" for alias in node.names}
    assert {"ab_nodes", "load_ab"} <= imported, "ab.launch.py and `iws up ab` must start the same plan"
    assert "generate_launch_description" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    fanout = load_ab().fanout
    scripts = console_scripts(fanout.package)
    assert scripts.get(fanout.executable) == fanout.entry_point, f"{fanout.package} must declare {fanout.executable}"
    assert callable(getattr(importlib.import_module(fanout.entry_point.split(":")[0]), "main"))


@pytest.mark.skipif(importlib.util.find_spec("launch_ros") is None, reason="launch_ros needs a ROS 2 distro")
@pytest.mark.parametrize("launch_file", [LAUNCH_FILE, AB_LAUNCH_FILE], ids=lambda p: p.name)
def test_launch_file_loads(launch_file):
    from launch.launch_description_sources import PythonLaunchDescriptionSource
    description = PythonLaunchDescriptionSource(str(launch_file)).get_launch_description(None)
    assert description.entities


def test_iws_up_rejects_unknown_backend_and_profile():
    run = lambda *args: subprocess.run([sys.executable, "-m", "iws_bringup.cli", "up", *args],
                                       capture_output=True, text=True, timeout=60)
    result = run("quantum")
    assert result.returncode == 2 and "unknown backend 'quantum'" in result.stderr
    result = run("reference", "--robot", "no_such_robot")
    assert result.returncode == 2 and "no_such_robot" in result.stderr
    result = run("real")
    assert result.returncode == 0 and "Nothing to start" in result.stdout


def test_iws_up_reference_serves_the_profile(domain_id, ros_client, tmp_path):
    node = NodeProcess([sys.executable, "-m", "iws_bringup.cli", "up", "reference", "--task", "pile"],
                       domain_id, tmp_path / "up.log")
    try:
        check_interface(ros_client, load_profile("reference_arm"))
    finally:
        assert node.stop() in (0, -2), node.output()
