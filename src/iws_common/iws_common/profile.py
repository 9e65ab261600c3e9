"""Robot profiles: the contract between a robot and every iws node.

A profile (``config/robots/<name>.yaml``) names everything that differs between robots: joints and
their limits, topic and service names, camera size and intrinsics, frame ids and rates. Nodes and
tools read it; nothing about a robot is hard-coded elsewhere. This module imports neither ROS nor
torch, so every tool can load a profile cheaply.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml


class ProfileError(ValueError):
    """A robot profile is missing, unreadable or inconsistent."""


def repo_root() -> Path:
    """The checkout this package was installed from (editable installs) or the working directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "config" / "robots").is_dir() and (parent / "package.xml").is_file():
            return parent
    return Path.cwd()


def default_model_dir() -> Path:
    """The shipped default world model (models/push_t): what every tool serves without --model."""
    return repo_root() / "models" / "push_t"


def config_dir() -> Path:
    """Where robot profiles and model configs live: $IWS_CONFIG_DIR, else the checkout's config/."""
    override = os.environ.get("IWS_CONFIG_DIR")
    return Path(override) if override else repo_root() / "config"


@dataclasses.dataclass(frozen=True)
class JointSpec:
    names: tuple[str, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    max_velocity: tuple[float, ...]
    home: tuple[float, ...]

    @property
    def count(self) -> int:
        return len(self.names)


@dataclasses.dataclass(frozen=True)
class Topics:
    joint_states: str
    position_command: str
    trajectory_command: str
    image: str
    camera_info: str
    clock: str
    task_state: str
    world_status: str
    episode_events: str


@dataclasses.dataclass(frozen=True)
class Services:
    reset: str
    step: str
    pause: str


@dataclasses.dataclass(frozen=True)
class CameraSpec:
    width: int
    height: int
    encoding: str
    frame_id: str
    fx: float
    fy: float
    cx: float
    cy: float
    rate_hz: float

    def intrinsics_matrix(self) -> list[float]:
        """Row-major 3x3 K, as in sensor_msgs/CameraInfo.k."""
        return [self.fx, 0.0, self.cx, 0.0, self.fy, self.cy, 0.0, 0.0, 1.0]

    def scaled(self, width: int, height: int) -> "CameraSpec":
        """The same camera resampled to another image size (pixel centres kept aligned)."""
        sx, sy = width / self.width, height / self.height
        return dataclasses.replace(
            self, width=width, height=height, fx=self.fx * sx, fy=self.fy * sy,
            cx=(self.cx + 0.5) * sx - 0.5, cy=(self.cy + 0.5) * sy - 0.5)


@dataclasses.dataclass(frozen=True)
class RobotProfile:
    name: str
    description: str
    hardware_ros_domain_id: int
    simulator_ros_domain_id: int
    joints: JointSpec
    topics: Topics
    services: Services
    camera: CameraSpec
    base_frame: str
    control_rate_hz: float
    source: Path | None = None

    @property
    def control_period_s(self) -> float:
        return 1.0 / self.control_rate_hz

    def max_joint_step(self) -> list[float]:
        """How far each joint can move in one control period at its velocity limit (rad)."""
        return [v * self.control_period_s for v in self.joints.max_velocity]

    def namespaced(self, namespace: str) -> "RobotProfile":
        """The same robot with every topic and service under ``namespace`` (``/sim/joint_states``),
        so that two backends of one robot can serve side by side (A/B). "" leaves the names alone."""
        prefix = normalize_namespace(namespace)
        if not prefix:
            return self
        topics = Topics(**{f.name: prefix + getattr(self.topics, f.name) for f in dataclasses.fields(Topics)})
        services = Services(**{f.name: prefix + getattr(self.services, f.name) for f in dataclasses.fields(Services)})
        return dataclasses.replace(self, topics=topics, services=services)


_NAMESPACE = re.compile(r"^(/[A-Za-z_][A-Za-z0-9_]*)+$")


def normalize_namespace(namespace: str) -> str:
    """'sim', '/sim' or '/sim/' -> '/sim'; '' or '/' -> '' (no namespace). Refuses invalid ROS names."""
    text = str(namespace or "").strip().rstrip("/")
    if not text:
        return ""
    if not text.startswith("/"):
        text = "/" + text
    if not _NAMESPACE.match(text):
        raise ProfileError(f"namespace '{namespace}' is not a valid ROS namespace (letters, digits and _ "
                           "per token, not starting with a digit, e.g. /sim)")
    return text


def _section(data: dict, key: str, where: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: missing section '{key}'")
    return value


def _fields(cls, data: dict, where: str, convert=lambda name, v: v) -> Any:
    kwargs = {}
    for field in dataclasses.fields(cls):
        if field.name not in data:
            raise ProfileError(f"{where}: missing '{field.name}'")
        kwargs[field.name] = convert(field.name, data[field.name])
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ProfileError(f"{where}: unknown keys {sorted(unknown)}")
    return cls(**kwargs)


def _domain(data: dict, key: str, default: int, where: str) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 232:
        raise ProfileError(f"{where}: {key} must be an integer ROS domain id in 0..232, got {value!r}")
    return value


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A profile name (``reference_arm``) or a path to a YAML file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        path = candidate
    else:
        path = config_dir() / "robots" / f"{name_or_path}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in (config_dir() / "robots").glob("*.yaml"))
        raise ProfileError(f"robot profile '{name_or_path}' not found (looked at {path}); available: {available}")
    return path


def load_profile(name_or_path: str | Path = "reference_arm") -> RobotProfile:
    """Load and validate a robot profile by name or path."""
    path = resolve_profile_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")
    where = str(path)

    joints_raw = _section(data, "joints", where)
    joints = _fields(JointSpec, joints_raw, f"{where} [joints]",
                     lambda name, v: tuple(str(x) for x in v) if name == "names" else tuple(float(x) for x in v))
    n = joints.count
    if n == 0 or len(set(joints.names)) != n:
        raise ProfileError(f"{where} [joints]: names must be non-empty and unique, got {joints.names}")
    for key in ("lower", "upper", "max_velocity", "home"):
        if len(getattr(joints, key)) != n:
            raise ProfileError(f"{where} [joints]: '{key}' has {len(getattr(joints, key))} entries, expected {n}")
    for name, lo, hi, home in zip(joints.names, joints.lower, joints.upper, joints.home):
        if not (lo < hi) or not (lo <= home <= hi):
            raise ProfileError(f"{where} [joints]: joint {name}: need lower < upper and home within, got {lo}, {hi}, {home}")
    if any(v <= 0 for v in joints.max_velocity):
        raise ProfileError(f"{where} [joints]: max_velocity must be positive")

    topics = _fields(Topics, _section(data, "topics", where), f"{where} [topics]", lambda _, v: str(v))
    services = _fields(Services, _section(data, "services", where), f"{where} [services]", lambda _, v: str(v))
    for kind, group in (("topic", topics), ("service", services)):
        for field in dataclasses.fields(group):
            value = getattr(group, field.name)
            if not value.startswith("/"):
                raise ProfileError(f"{where}: {kind} '{field.name}' must be an absolute name, got '{value}'")

    camera = _fields(CameraSpec, _section(data, "camera", where), f"{where} [camera]",
                     lambda name, v: int(v) if name in ("width", "height") else (str(v) if name in ("encoding", "frame_id") else float(v)))
    if camera.width <= 0 or camera.height <= 0 or camera.rate_hz <= 0 or camera.fx <= 0 or camera.fy <= 0:
        raise ProfileError(f"{where} [camera]: sizes, focal lengths and rate must be positive")
    if camera.encoding not in ("rgb8", "bgr8", "mono8"):
        raise ProfileError(f"{where} [camera]: encoding must be rgb8, bgr8 or mono8, got {camera.encoding}")

    control = _section(data, "control", where)
    rate = float(control.get("rate_hz", 0))
    if not math.isfinite(rate) or rate <= 0:
        raise ProfileError(f"{where} [control]: rate_hz must be positive")

    hardware_domain = _domain(data, "hardware_ros_domain_id", 0, where)
    simulator_domain = _domain(data, "simulator_ros_domain_id", 42, where)
    if simulator_domain == hardware_domain:
        raise ProfileError(f"{where}: simulator_ros_domain_id must differ from hardware_ros_domain_id "
                           f"({hardware_domain}): a simulator must never share the hardware's domain")

    return RobotProfile(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        hardware_ros_domain_id=hardware_domain,
        simulator_ros_domain_id=simulator_domain,
        joints=joints, topics=topics, services=services, camera=camera,
        base_frame=str(_section(data, "frames", where).get("base", "base_link")),
        control_rate_hz=rate, source=path)
