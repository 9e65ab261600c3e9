"""Backends and the A/B pair as described by config/bringup.yaml, shared by `iws up`,
robot.launch.py and ab.launch.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from iws_common.profile import ProfileError, config_dir, normalize_namespace


class BringupError(ValueError):
    """An unknown backend or a broken config/bringup.yaml."""


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    description: str
    package: str | None = None  # None: nothing to start (real hardware)
    executable: str | None = None
    entry_point: str | None = None
    parameters: dict = dataclasses.field(default_factory=dict)

    @property
    def starts_a_node(self) -> bool:
        return self.package is not None


def bringup_config_path() -> Path:
    return config_dir() / "bringup.yaml"


def _read_config(path: Path | None) -> tuple[Path, dict]:
    path = path or bringup_config_path()
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BringupError(f"cannot read {path}: {exc}") from exc
    return path, data or {}


def _backend(path: Path, name: str, spec) -> Backend:
    try:
        return Backend(name=name, **(spec or {}))
    except TypeError as exc:
        raise BringupError(f"{path}: backend '{name}': {exc}") from exc


def load_backends(path: Path | None = None) -> dict[str, Backend]:
    path, data = _read_config(path)
    return {name: _backend(path, name, spec) for name, spec in data.get("backends", {}).items()}


def get_backend(name: str) -> Backend:
    backends = load_backends()
    if name not in backends:
        raise BringupError(f"unknown backend '{name}'; available: {sorted(backends)}")
    return backends[name]


def node_parameters(backend: Backend, robot: str, overrides: dict | None = None) -> dict:
    """The node's ROS parameters: the backend's defaults, the robot profile, then overrides.

    Overrides are given for parameters the backend declares (listed in its YAML defaults), and
    None means "keep the default", so one set of command-line options serves every backend.
    """
    params = {**backend.parameters, "robot": robot}
    params.update({k: v for k, v in (overrides or {}).items() if v is not None and k in backend.parameters})
    return params


def ros_arguments(params: dict, node_namespace: str = "") -> list[str]:
    """``--ros-args`` for a node: ``-p`` per parameter, ``-r __ns:=`` for its node namespace."""
    args = ["--ros-args"]
    if node_namespace:
        args += ["-r", f"__ns:={node_namespace}"]
    for key, value in params.items():
        if value == "":
            continue  # the node's declared default; an empty `-p key:=` would not parse as a string
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (list, tuple)):
            value = "[" + ",".join(str(v) for v in value) + "]"  # a YAML list: a string-array parameter
        args += ["-p", f"{key}:={value}"]
    return args


# -- A/B ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NodeLaunch:
    """One node of a bringup: what to start, under which node namespace, with which parameters."""
    label: str
    backend: Backend
    namespace: str
    parameters: dict


@dataclasses.dataclass(frozen=True)
class ABConfig:
    description: str
    sides: tuple[tuple[Backend, str], ...]  # (backend, namespace)
    fanout: Backend


def load_ab(path: Path | None = None) -> ABConfig:
    """The `ab` entry of config/bringup.yaml, checked: node-starting backends, distinct namespaces."""
    path, data = _read_config(path)
    spec = data.get("ab")
    if not isinstance(spec, dict):
        raise BringupError(f"{path}: no 'ab' entry")
    backends = {name: _backend(path, name, s) for name, s in data.get("backends", {}).items()}
    sides = []
    for i, side in enumerate(spec.get("sides") or []):
        name = (side or {}).get("backend")
        if name not in backends or not backends[name].starts_a_node:
            raise BringupError(f"{path}: ab side {i}: backend '{name}' is not a backend that starts a node "
                               f"({sorted(n for n, b in backends.items() if b.starts_a_node)})")
        if "namespace" not in backends[name].parameters:
            raise BringupError(f"{path}: backend '{name}' declares no 'namespace' parameter, so it cannot run in A/B")
        try:
            namespace = normalize_namespace(side.get("namespace", ""))
        except ProfileError as exc:
            raise BringupError(f"{path}: ab side {i}: {exc}") from exc
        if not namespace:
            raise BringupError(f"{path}: ab side {i}: a namespace is required (the top level is the fan-out's input)")
        sides.append((backends[name], namespace))
    namespaces = [ns for _, ns in sides]
    if len(sides) < 2 or len(set(namespaces)) != len(namespaces):
        raise BringupError(f"{path}: ab needs at least two sides with distinct namespaces, got {namespaces}")
    return ABConfig(description=str(spec.get("description", "")), sides=tuple(sides),
                    fanout=_backend(path, "fanout", spec.get("fanout")))


def ab_nodes(robot: str, overrides: dict | None = None, config: ABConfig | None = None) -> list[NodeLaunch]:
    """Every node of the A/B bringup: each side under its namespace, then the command fan-out.

    Overrides reach the sides that declare them (task: the reference robot, model: the world model).
    """
    config = config or load_ab()
    nodes = []
    for backend, namespace in config.sides:
        params = node_parameters(backend, robot, overrides)
        params["namespace"] = namespace
        nodes.append(NodeLaunch(namespace.strip("/").replace("/", "_"), backend, namespace, params))
    fanout_params = {**config.fanout.parameters, "robot": robot, "namespaces": [ns for _, ns in config.sides]}
    nodes.append(NodeLaunch("fanout", config.fanout, "", fanout_params))
    return nodes
