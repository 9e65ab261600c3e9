"""rosbag2 reading and writing over the pure-Python ``rosbags`` (no rosbag2 install needed).

Bags are standard rosbag2 directories (metadata.yaml + one .mcap or .db3 file) that `ros2 bag
play` and Foxglove open. Messages are stored as the CDR bytes rclpy produces, so recording costs no
(de)serialisation. Reading needs neither rclpy nor a ROS install: the dataset builder decodes with
the typestore here.
"""
from __future__ import annotations

import errno
import functools
import os
import sqlite3
import struct
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Iterable, Iterator

from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.serde import SerdeError
from rosbags.typesys import Stores, get_typestore, get_types_from_msg

from iws_common.profile import RobotProfile

INTERFACES_PACKAGE = "iws_interfaces"
STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
DEFAULT_STORAGE = "mcap"
# How often a recording pushes what it holds in memory to the file: a SIGKILL or power cut loses at
# most this much (plus what the OS had not yet written, on power loss), see BagWriter.
FLUSH_INTERVAL_S = 0.5

# Stream kind -> (profile.topics attribute, message type, QoS preset name in iws_common.qos).
STREAMS: dict[str, tuple[str, str]] = {
    "image": ("sensor_msgs/msg/Image", "IMAGE"),
    "camera_info": ("sensor_msgs/msg/CameraInfo", "IMAGE"),
    "joint_states": ("sensor_msgs/msg/JointState", "STATE"),
    "position_command": ("std_msgs/msg/Float64MultiArray", "COMMAND"),
    "trajectory_command": ("trajectory_msgs/msg/JointTrajectory", "COMMAND"),
    "task_state": ("iws_interfaces/msg/TaskState", "STATE"),
    "episode_events": ("iws_interfaces/msg/EpisodeEvent", "EVENTS"),
}


class BagError(RuntimeError):
    """A bag cannot be written or read as expected; the message names the file (and topic)."""

    def __init__(self, message: str, path: str | Path | None = None, topic: str | None = None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.topic = topic


def interface_msg_dir() -> Path:
    """Where the installed iws_interfaces .msg files are: the ament index, else the venv prefix,
    else the source tree (a checkout used without building the interfaces)."""
    candidates = []
    with suppress(Exception):
        from ament_index_python.packages import get_package_share_directory
        candidates.append(Path(get_package_share_directory(INTERFACES_PACKAGE)) / "msg")
    candidates.append(Path(sys.prefix) / "share" / INTERFACES_PACKAGE / "msg")
    candidates.append(Path(__file__).resolve().parents[2] / INTERFACES_PACKAGE / "msg")
    for directory in candidates:
        if any(directory.glob("*.msg")):
            return directory
    raise BagError(f"cannot find the {INTERFACES_PACKAGE} .msg files (looked in {[str(c) for c in candidates]})")


@functools.lru_cache(maxsize=1)
def typestore():
    """ROS 2 kilted types plus iws_interfaces, for writing definitions and decoding without rclpy."""
    store = get_typestore(Stores.ROS2_KILTED)
    types = {}
    for path in sorted(interface_msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(path.read_text(), f"{INTERFACES_PACKAGE}/msg/{path.stem}"))
    store.register(types)
    return store


def decode_cdr(data: bytes | memoryview, msgtype: str):
    """Deserialize CDR bytes into a rosbags message object.

    Like ``Typestore.deserialize_cdr`` without its end-of-buffer check: rclpy (Fast CDR) sizes
    buffers by an estimate and leaves 4-8+ uninitialised bytes at the end, e.g. a JointState with
    an empty velocity, which rosbags' strict check (at most 3 spare bytes) rejects. A truncated
    message still fails, in the decoder itself.
    """
    if len(data) < 4 or bytes(data[:2]) not in (b"\x00\x00", b"\x00\x01"):
        raise SerdeError(f"invalid or unsupported CDR encapsulation for {msgtype}")
    store = typestore()
    msgdef = store.get_msgdef(msgtype)
    func = msgdef.deserialize_cdr_le if data[1] else msgdef.deserialize_cdr_be
    try:
        message, pos = func(data[4:], 0, msgdef.cls, store)
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise SerdeError(f"could not deserialize {msgtype}: {exc}") from exc
    return message


def _qos_time(duration) -> QosTime:
    ns = int(duration.nanoseconds)
    return QosTime(ns // 1_000_000_000, ns % 1_000_000_000)


def to_bag_qos(profile) -> Qos:
    """An rclpy QoSProfile as the rosbag2 offered_qos_profiles entry (enum values share names)."""
    return Qos(
        history=QosHistory[profile.history.name],
        depth=int(profile.depth),
        reliability=QosReliability[profile.reliability.name],
        durability=QosDurability[profile.durability.name],
        deadline=_qos_time(profile.deadline),
        lifespan=_qos_time(profile.lifespan),
        liveliness=QosLiveliness[profile.liveliness.name],
        liveliness_lease_duration=_qos_time(profile.liveliness_lease_duration),
        avoid_ros_namespace_conventions=bool(profile.avoid_ros_namespace_conventions),
    )


def profile_streams(profile: RobotProfile, kinds: Iterable[str] | None = None) -> dict[str, tuple[str, str, str]]:
    """{kind: (topic, msgtype, qos preset)} for the profile's recorded streams."""
    chosen = list(STREAMS) if kinds is None else list(kinds)
    unknown = [k for k in chosen if k not in STREAMS]
    if unknown:
        raise BagError(f"unknown stream kinds {unknown}; known: {list(STREAMS)}")
    return {k: (getattr(profile.topics, k), *STREAMS[k]) for k in chosen}


class BagWriteError(BagError):
    """Writing to the bag's file failed (disk full, file too large, I/O error). ``written`` messages
    are safely in the file; ``readable`` says whether the bag was closed (else `iws bag repair`)."""

    def __init__(self, message: str, path: Path, written: int, lost: int, readable: bool):
        super().__init__(message, path)
        self.written, self.lost, self.readable = written, lost, readable


class BagWriter:
    """Writes serialized CDR messages of a profile's streams into a new rosbag2 directory.

    rosbags' MCAP writer keeps the current chunk in memory until it reaches 1 MiB, so this pushes
    pending data to disk every ``flush_interval_s`` (the chunk is closed and the file flushed, or
    the sqlite transaction committed), on a write or via ``flush_if_due()`` from a timer. A process
    killed with SIGKILL therefore loses at most the last ``flush_interval_s`` of messages; the rest
    is recovered by `iws bag repair`. ``close()`` writes the index and metadata.yaml.

    A failed write (ENOSPC, EFBIG, EIO...) raises BagWriteError once: the file is cut back to the
    last complete flush and closed if the disk allows it, else left as a clean prefix for repair.
    """

    def __init__(self, path: str | Path, profile: RobotProfile, kinds: Iterable[str] | None = None,
                 storage: str = DEFAULT_STORAGE, flush_interval_s: float | None = FLUSH_INTERVAL_S,
                 custom_data: dict | None = None):
        from iws_common import qos as qos_presets  # rclpy import: only writers need it

        if storage not in STORAGES:
            raise BagError(f"unknown storage '{storage}' (choose from {list(STORAGES)})", path)
        self.path = Path(path)
        self.profile = profile
        self.flush_interval_s = flush_interval_s
        self._writer = Writer(self.path, version=Writer.VERSION_LATEST, storage_plugin=STORAGES[storage])
        for key, value in (custom_data or {}).items():
            self._writer.set_custom_data(str(key), str(value))
        try:
            self._writer.open()
        except Exception as exc:
            raise BagError(f"{self.path}: cannot create bag: {exc}", self.path) from exc
        store = typestore()
        self.connections = {}
        self.topics_by_kind = {}
        for kind, (topic, msgtype, preset) in profile_streams(profile, kinds).items():
            if topic in self.connections:
                continue
            self.connections[topic] = self._writer.add_connection(
                topic, msgtype, typestore=store, offered_qos_profiles=[to_bag_qos(getattr(qos_presets, preset))])
            self.topics_by_kind[kind] = topic
        self.counts = {topic: 0 for topic in self.connections}
        self._last_flush = time.monotonic()
        self.closed = False
        self.failed: BagWriteError | None = None
        self._good = None
        try:  # schemas and channels reach the file at once, so even an empty recording is repairable
            self.flush()
        except (OSError, sqlite3.Error) as exc:
            self._fail(exc)

    @property
    def message_count(self) -> int:
        return sum(self.counts.values())

    def write(self, topic: str, data: bytes | memoryview, timestamp_ns: int) -> None:
        """Append one serialized message; ``timestamp_ns`` is the bag log time."""
        connection = self.connections.get(topic)
        if connection is None:
            raise BagError(f"{self.path}: topic {topic} is not one of this bag's topics {list(self.connections)}", self.path, topic)
        if self.failed is not None:
            raise self.failed
        try:
            self._writer.write(connection, int(timestamp_ns), data)
            self.counts[topic] += 1
            self.flush_if_due()
        except (OSError, sqlite3.Error) as exc:
            self._fail(exc)

    def flush_if_due(self) -> None:
        """Flush when ``flush_interval_s`` has passed since the last flush (call it from a timer too,
        so that the last messages before a quiet period reach the disk)."""
        if self.flush_interval_s is not None and time.monotonic() - self._last_flush >= self.flush_interval_s:
            try:
                self.flush()
            except (OSError, sqlite3.Error) as exc:
                self._fail(exc)

    @property
    def storage_file(self) -> Path:
        storage = self._writer.storage
        return Path(storage.path) if storage is not None else (bag_storage_file(self.path) or self.path)

    def flush(self) -> None:
        """Push buffered messages to the file (a partial bag then keeps them, see class doc)."""
        storage = self._writer.storage
        self._last_flush = time.monotonic()
        if storage is None or self.closed:
            return
        if hasattr(storage, "close_chunk"):  # MCAP
            if storage.chunk.bio.tell():
                if not storage.chunk.msgs:  # schemas/channels only: keep the chunk's time range sane
                    storage.chunk.message_start_time = 0
                storage.close_chunk()
            storage.bio.flush()
            self._good = (storage.bio.tell(), len(storage.chunks), dict(storage.channel_stats),
                          storage.message_start_time, storage.message_end_time, dict(self._writer.counts),
                          self._writer.min_timestamp, self._writer.max_timestamp, dict(self.counts))
        elif hasattr(storage, "conn"):  # sqlite3
            storage.conn.commit()
            self._good = (None, None, None, None, None, dict(self._writer.counts),
                          self._writer.min_timestamp, self._writer.max_timestamp, dict(self.counts))

    def _fail(self, exc: Exception) -> None:
        """After a failed write: roll back to the last flush, try to close, raise BagWriteError."""
        if self.failed is not None:
            raise self.failed
        file = self.storage_file
        received = self.message_count
        self.closed = True
        readable = self._salvage()
        written = self.message_count
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            reason += " (the file size limit is reached)"
        lost = received - written
        if readable:
            outcome = f"the bag {self.path} was closed and is readable"
        else:
            outcome = (f"the bag could not be closed; run `iws bag repair {self.path}` to recover the "
                       f"{written} messages written before the failure")
        self.failed = BagWriteError(
            f"{file}: write failed: {reason}; stopped recording after {written} messages written "
            f"({lost} received since the last flush were lost); {outcome}", self.path, written, lost, readable)
        raise self.failed from exc

    def _salvage(self) -> bool:
        """Cut the file back to the last complete flush and write the index and metadata.yaml.
        Returns whether the bag is readable as is (else it is a clean, repairable prefix)."""
        storage, good = self._writer.storage, self._good
        if storage is None:  # the storage was closed: only metadata.yaml can be missing
            return (self.path / "metadata.yaml").is_file()
        if good is None:
            with suppress(Exception):
                self._writer.abort()
            return False
        offset, nchunks, stats, start, end, writer_counts, tmin, tmax, counts = good
        if hasattr(storage, "close_chunk"):
            from rosbags.rosbag2.storage_mcap import PendingChunk
            from collections import defaultdict
            from io import BytesIO

            with suppress(Exception):
                storage.bio.close()  # its buffer holds a partial record: dropped by the truncate below
            try:
                os.truncate(storage.path, offset)
                storage.bio = open(storage.path, "r+b")
                storage.bio.seek(offset)
            except OSError:
                self._writer.storage = None
                return False
            del storage.chunks[nchunks:]
            storage.channel_stats = stats
            storage.message_start_time, storage.message_end_time = start, end
            storage.chunk = PendingChunk(2**63 - 1, 0, BytesIO(), defaultdict(list))
        else:
            with suppress(Exception):
                storage.conn.rollback()
        self._writer.counts = writer_counts
        self._writer.min_timestamp, self._writer.max_timestamp = tmin, tmax
        self.counts = counts
        try:
            self._writer.close()
            return True
        except Exception:
            with suppress(OSError):
                (self.path / "metadata.yaml.tmp").unlink()
            if self._writer.storage is None:  # the storage file is complete; metadata.yaml is not
                return False
            if hasattr(storage, "close_chunk"):
                with suppress(Exception):
                    storage.bio.close()
                with suppress(OSError):
                    os.truncate(storage.path, offset)
            else:
                with suppress(Exception):
                    storage.conn.close()
            self._writer.storage = None
            return False

    def close(self) -> Path:
        """Write the index and metadata.yaml; a failure here is handled like a failed write."""
        if self.failed is not None:
            raise self.failed
        if not self.closed:
            try:
                self.flush()
            except (OSError, sqlite3.Error) as exc:
                self._fail(exc)
            self.closed = True
            try:
                self._writer.close()
            except (OSError, sqlite3.Error) as exc:
                self.closed = False
                self._fail(exc)
        return self.path

    def abort(self) -> None:
        """Stop without writing the index (used when the bag is going to be deleted)."""
        if not self.closed:
            self.closed = True
            with suppress(Exception):
                self._writer.abort()

    def __enter__(self) -> "BagWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def bag_storage_file(path: Path) -> Path | None:
    files = sorted(p for p in path.iterdir() if p.suffix in (".mcap", ".db3")) if path.is_dir() else []
    return files[0] if files else None


def find_bags(paths: Iterable[str | Path]) -> list[Path]:
    """Expand arguments into rosbag2 bag directories: a bag itself, or a directory of bags
    (searched recursively), in sorted order. Directories with a storage file but no
    metadata.yaml count as bags, so that the reader reports them as broken rather than skipping."""
    bags: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise BagError(f"{path}: no such file or directory", path)
        if path.is_file():
            bags.append(path)
        elif (path / "metadata.yaml").is_file() or bag_storage_file(path):
            bags.append(path)
        else:
            found = sorted({p.parent for p in path.rglob("metadata.yaml")}
                           | {p.parent for p in path.rglob("*.mcap")} | {p.parent for p in path.rglob("*.db3")})
            # Hidden directories hold unfinished work (iws collect's .partial/): not bags yet.
            found = [p for p in found if not any(part.startswith(".") for part in p.relative_to(path).parts)]
            if not found:
                raise BagError(f"{path}: no rosbag2 bags inside (no metadata.yaml, .mcap or .db3)", path)
            bags.extend(found)
    return bags


class BagReader:
    """Reads a bag's raw messages by topic; every failure becomes a BagError naming the file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise BagError(f"{self.path}: no such bag", self.path)
        if self.path.is_dir() and not (self.path / "metadata.yaml").is_file():
            storage_file = bag_storage_file(self.path)
            detail = f" ({storage_file.name} present: the recording was not closed)" if storage_file else ""
            raise BagError(f"{self.path}: missing metadata.yaml{detail}; the bag is incomplete or not a rosbag2 directory", self.path)
        try:
            self._reader = Reader(self.path)
            self._reader.open()
        except Exception as exc:
            raise BagError(f"{self._describe()}: corrupt or truncated bag ({type(exc).__name__}: {exc})", self.path) from exc

    def _describe(self) -> str:
        storage_file = bag_storage_file(self.path)
        return str(storage_file) if storage_file else str(self.path)

    @property
    def topics(self) -> dict[str, str]:
        """{topic: msgtype}."""
        return {c.topic: c.msgtype for c in self._reader.connections}

    @property
    def message_count(self) -> int:
        return self._reader.message_count

    @property
    def start_time_ns(self) -> int:
        return self._reader.start_time if self.message_count else 0

    @property
    def end_time_ns(self) -> int:
        return self._reader.end_time if self.message_count else 0

    def count(self, topic: str) -> int:
        return sum(c.msgcount for c in self._reader.connections if c.topic == topic)

    def messages(self, topics: Iterable[str]) -> Iterator[tuple[str, int, bytes]]:
        """(topic, log time ns, CDR bytes) in log-time order."""
        wanted = set(topics)
        connections = [c for c in self._reader.connections if c.topic in wanted]
        try:
            for connection, timestamp, data in self._reader.messages(connections=connections):
                yield connection.topic, timestamp, data
        except BagError:
            raise
        except Exception as exc:
            raise BagError(f"{self._describe()}: corrupt or truncated bag while reading ({type(exc).__name__}: {exc})", self.path) from exc

    def decode(self, data: bytes, msgtype: str):
        return decode_cdr(data, msgtype)

    def close(self) -> None:
        with suppress(Exception):
            self._reader.close()

    def __enter__(self) -> "BagReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
