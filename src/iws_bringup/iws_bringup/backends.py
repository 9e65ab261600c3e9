"""Backends as described by config/bringup.yaml, shared by `iws up` and robot.launch.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from iws_common.profile import config_dir


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


def load_backends(path: Path | None = None) -> dict[str, Backend]:
    path = path or bringup_config_path()
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BringupError(f"cannot read {path}: {exc}") from exc
    backends = {}
    for name, spec in (data or {}).get("backends", {}).items():
        try:
            backends[name] = Backend(name=name, **(spec or {}))
        except TypeError as exc:
            raise BringupError(f"{path}: backend '{name}': {exc}") from exc
    return backends


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


def ros_arguments(params: dict) -> list[str]:
    args = ["--ros-args"]
    for key, value in params.items():
        if value == "":
            continue  # the node's declared default; an empty `-p key:=` would not parse as a string
        if isinstance(value, bool):
            value = str(value).lower()
        args += ["-p", f"{key}:={value}"]
    return args
