"""`iws bag repair`: recover a rosbag2 bag whose recorder was killed, crashed or ran out of disk.

Like `ros2 bag reindex`, but also for a truncated MCAP file (no summary, no footer, a partial record
at the tail): every complete record is read straight from the file (schemas, channels, messages,
chunks, and the complete messages at the start of a cut-off uncompressed chunk), and a new, valid
rosbag2 directory is written with the same topics, types, QoS profiles (from the MCAP channel
metadata or a stale metadata.yaml) and custom data, and fresh counts and index. A .db3 bag without
metadata.yaml is rebuilt from its tables. The input is never modified.
"""
from __future__ import annotations

import argparse
import dataclasses
import mmap
import sqlite3
import struct
import sys
from contextlib import suppress
from pathlib import Path

from rosbags.rosbag2 import StoragePlugin, Writer

from iws_data.bags import BagError, bag_storage_file, typestore

MAGIC = b"\x89MCAP0\r\n"
OP_HEADER, OP_FOOTER, OP_SCHEMA, OP_CHANNEL, OP_MESSAGE, OP_CHUNK, OP_METADATA, OP_DATA_END = 1, 2, 3, 4, 5, 6, 0x0C, 0x0F
MAX_OPCODE = 0x0F


class RepairError(BagError):
    """The input cannot be repaired (not a bag, not MCAP, output exists); names the file."""


@dataclasses.dataclass
class RepairReport:
    source: Path
    out: Path
    counts: dict = dataclasses.field(default_factory=dict)  # topic -> messages recovered
    start_ns: int | None = None
    end_ns: int | None = None
    file_bytes: int = 0
    dropped_bytes: int = 0  # at the tail: an incomplete record, or garbage
    complete: bool = False  # the input had its footer (only the metadata was missing)
    note: str = ""

    @property
    def messages(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        lines = [f"iws bag repair: {self.source} -> {self.out}",
                 f"  recovered {self.messages} messages on {len(self.counts)} topics"
                 + ("" if self.start_ns is None else
                    f", {self.start_ns} .. {self.end_ns} ns ({(self.end_ns - self.start_ns) / 1e9:.3f} s)")]
        for topic, n in self.counts.items():
            lines.append(f"    {topic}: {n}")
        state = "complete file (index rebuilt)" if self.complete else "truncated file"
        lines.append(f"  {state}; {self.dropped_bytes} of {self.file_bytes} bytes dropped at the tail"
                     + (f" ({self.note})" if self.note else ""))
        return "\n".join(lines)


class _Cursor:
    """Little-endian MCAP field reader over a buffer; IndexError/struct.error mean 'ran out'."""

    def __init__(self, buf, pos: int = 0, end: int | None = None):
        self.buf, self.pos, self.end = buf, pos, len(buf) if end is None else end

    def take(self, n: int) -> bytes:
        if self.pos + n > self.end:
            raise EOFError
        data = bytes(self.buf[self.pos:self.pos + n])  # a copy: no view may outlive the mmap
        self.pos += n
        return data

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        return self.take(self.u32()).decode("utf-8")

    def map(self) -> dict:
        length = self.u32()
        inner = _Cursor(self.buf, self.pos, self.pos + length)
        if inner.end > self.end:
            raise EOFError
        self.pos = inner.end
        out = {}
        while inner.pos < inner.end:
            key = inner.string()
            out[key] = inner.string()
        return out


def _qos_from_yaml(text: str):
    from rosbags.rosbag2.metadata import parse_qos

    with suppress(Exception):
        return parse_qos(text)
    return []


def _rihs01(msgtype: str, msgdef: str, known: dict) -> str:
    """The type hash: from a stale metadata.yaml, our typestore, or the schema text itself."""
    if known.get(msgtype):
        return known[msgtype]
    with suppress(Exception):
        return typestore().hash_rihs01(msgtype)
    with suppress(Exception):
        from rosbags.typesys import Stores, get_typestore, get_types_from_msg

        store = get_typestore(Stores.EMPTY)
        store.register(get_types_from_msg(msgdef, msgtype))
        return store.hash_rihs01(msgtype)
    return "RIHS01_" + "0" * 64  # unknown: readers only compare it, never need it


def _stale_metadata(bag_dir: Path) -> dict:
    """What a stale or partial metadata.yaml still tells: QoS and type hashes per topic, custom data."""
    path = bag_dir / "metadata.yaml"
    if not path.is_file():
        return {}
    with suppress(Exception):
        import yaml

        info = yaml.safe_load(path.read_text())["rosbag2_bagfile_information"]
        topics = {}
        for entry in info.get("topics_with_message_count") or []:
            meta = entry["topic_metadata"]
            topics[meta["name"]] = meta
        return {"topics": topics, "custom_data": info.get("custom_data") or {}}
    return {}


class _Output:
    """The repaired bag: connections added as the input declares them, messages as they come."""

    def __init__(self, out: Path, storage: StoragePlugin, stale: dict, custom: dict, report: RepairReport):
        self.writer = Writer(out, version=Writer.VERSION_LATEST, storage_plugin=storage)
        for key, value in {**(stale.get("custom_data") or {}), **custom}.items():
            self.writer.set_custom_data(str(key), str(value))
        self.writer.open()
        self.stale_topics = stale.get("topics", {})
        self.hashes = {m.get("type"): m.get("type_description_hash") for m in self.stale_topics.values()}
        self.connections = {}
        self.report = report

    def add(self, key, topic: str, msgtype: str, msgdef: str, qos, serialization_format: str = "cdr") -> None:
        if not qos and topic in self.stale_topics:
            qos = _qos_from_yaml(self.stale_topics[topic].get("offered_qos_profiles") or "")
            if not isinstance(qos, list):
                qos = []
        existing = next((c for c in self.writer.connections if c.topic == topic and c.msgtype == msgtype), None)
        if existing is None:
            existing = self.writer.add_connection(
                topic, msgtype, msgdef=msgdef or "", rihs01=_rihs01(msgtype, msgdef, self.hashes),
                serialization_format=serialization_format or "cdr", offered_qos_profiles=qos)
            self.report.counts.setdefault(topic, 0)
        self.connections[key] = existing

    def write(self, key, log_time: int, data) -> bool:
        connection = self.connections.get(key)
        if connection is None:
            return False
        self.writer.write(connection, log_time, bytes(data))
        self.report.counts[connection.topic] += 1
        r = self.report
        r.start_ns = log_time if r.start_ns is None else min(r.start_ns, log_time)
        r.end_ns = log_time if r.end_ns is None else max(r.end_ns, log_time)
        return True


def _decompress(compression: str, data, size: int) -> bytes:
    from rosbags.rosbag2.storage_mcap import DECOMPRESSORS

    if compression not in DECOMPRESSORS:
        raise ValueError(f"unsupported chunk compression '{compression}'")
    return DECOMPRESSORS[compression](bytes(data), size)


class _McapScan:
    """Walks the records of an MCAP file in order, tolerating a cut-off tail."""

    def __init__(self, path: Path, output: _Output, report: RepairReport):
        self.path, self.report, self.output = path, report, output
        self.schemas: dict[int, tuple[str, str]] = {}
        self.skipped_messages = 0

    def _records(self, cur: _Cursor, in_chunk: bool) -> int:
        """Handle records until the buffer ends or one is incomplete; returns the end of the last
        complete record."""
        good = cur.pos
        while cur.pos < cur.end:
            start = cur.pos
            try:
                opcode = cur.take(1)[0]
                length = cur.u64()
                body = _Cursor(cur.buf, cur.pos, cur.pos + length)
                if body.end > cur.end:
                    if opcode == OP_CHUNK and not in_chunk:
                        self._partial_chunk(_Cursor(cur.buf, cur.pos, cur.end))
                    cur.pos = start
                    return good
            except EOFError:
                cur.pos = start
                return good
            if opcode == 0 or opcode > MAX_OPCODE:
                self.report.note = f"unknown record opcode {opcode:#x} at byte {start}: the rest is not MCAP"
                cur.pos = start
                return good
            try:
                stop = self._record(opcode, body, in_chunk)
            except (EOFError, UnicodeDecodeError, struct.error) as exc:
                self.report.note = f"malformed record {opcode:#x} at byte {start} ({type(exc).__name__})"
                cur.pos = start
                return good
            cur.pos = good = body.end
            if stop:
                return good
        return good

    def _record(self, opcode: int, body: _Cursor, in_chunk: bool) -> bool:
        if opcode == OP_SCHEMA:
            sid, name, encoding = body.u16(), body.string(), body.string()
            data = body.take(body.u32()).decode("utf-8", "replace")
            self.schemas[sid] = (name, data)
        elif opcode == OP_CHANNEL:
            cid, sid, topic, encoding = body.u16(), body.u16(), body.string(), body.string()
            metadata = body.map()
            msgtype, msgdef = self.schemas.get(sid, ("", ""))
            if msgtype:
                self.output.add(cid, topic, msgtype, msgdef, _qos_from_yaml(metadata.get("offered_qos_profiles", "")),
                                encoding)
        elif opcode == OP_MESSAGE:
            cid, _sequence, log_time, _publish_time = body.u16(), body.u32(), body.u64(), body.u64()
            if not self.output.write(cid, log_time, body.take(body.end - body.pos)):
                self.skipped_messages += 1
        elif opcode == OP_CHUNK and not in_chunk:
            body.u64(), body.u64()
            size, _crc, compression = body.u64(), body.u32(), body.string()
            data = body.take(body.u64())
            raw = _decompress(compression, data, size) if compression else data
            self._records(_Cursor(raw), in_chunk=True)
        elif opcode == OP_METADATA and not in_chunk:
            name, values = body.string(), body.map()
            if name == "rosbag2" and "serialized_metadata" in values:
                with suppress(Exception):
                    import yaml

                    found = yaml.safe_load(values["serialized_metadata"]).get("custom_data") or {}
                    for key, value in found.items():  # the recording's own, unless a metadata.yaml said otherwise
                        self.output.writer.custom_data.setdefault(str(key), str(value))
        elif opcode in (OP_DATA_END, OP_FOOTER) and not in_chunk:
            self.report.complete = True
            return True  # the summary repeats what the data section held
        return False

    def _partial_chunk(self, body: _Cursor) -> None:
        """A chunk cut off by the kill: its complete leading messages, if it is uncompressed."""
        with suppress(EOFError):
            body.u64(), body.u64(), body.u64(), body.u32()
            compression = body.string()
            body.u64()
            if not compression:
                before = self.report.messages
                self._records(_Cursor(body.buf, body.pos, body.end), in_chunk=True)
                if self.report.messages > before:
                    self.report.note = f"{self.report.messages - before} messages from the cut-off last chunk"

    def run(self) -> None:
        with open(self.path, "rb") as f:
            size = self.report.file_bytes = self.path.stat().st_size
            if size < len(MAGIC) or f.read(len(MAGIC)) != MAGIC:
                raise RepairError(f"{self.path}: not an MCAP file (no MCAP magic at the start)", self.path)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                view = memoryview(buf)
                try:
                    end = self._records(_Cursor(view, len(MAGIC)), in_chunk=False)
                    self.report.dropped_bytes = 0 if self.report.complete else size - end
                finally:
                    view.release()


def _repair_sqlite(db: Path, output: _Output, report: RepairReport) -> None:
    """A .db3 bag without (or with a stale) metadata.yaml: its tables hold everything."""
    report.file_bytes = db.stat().st_size
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        topics = conn.execute("SELECT id, name, type, serialization_format, offered_qos_profiles FROM topics").fetchall()
        definitions = {}
        with suppress(sqlite3.Error):
            definitions = {t: d for t, d in conn.execute("SELECT topic_type, encoded_message_definition FROM message_definitions")}
    except sqlite3.Error as exc:
        raise RepairError(f"{db}: not a readable rosbag2 sqlite3 file ({exc})", db) from exc
    for tid, name, msgtype, fmt, qos in topics:
        output.add(tid, name, msgtype, definitions.get(msgtype, ""), _qos_from_yaml(qos or ""), fmt)
    try:
        for tid, timestamp, data in conn.execute("SELECT topic_id, timestamp, data FROM messages ORDER BY id"):
            output.write(tid, timestamp, data)
        report.complete = True
    except sqlite3.Error as exc:
        report.note = f"stopped at a damaged page: {exc}"
    finally:
        conn.close()


def repair_bag(source: str | Path, out: str | Path | None = None) -> RepairReport:
    """Write a valid copy of ``source`` (a bag directory or its .mcap/.db3 file) to ``out``
    (default: ``<bag>_repaired`` next to it) and return what was recovered."""
    source = Path(source)
    if not source.exists():
        raise RepairError(f"{source}: no such file or directory", source)
    if source.is_dir():
        storage_file = bag_storage_file(source)
        if storage_file is None:
            raise RepairError(f"{source}: no .mcap or .db3 file in this directory: nothing to repair", source)
        bag_dir = source
    else:
        storage_file, bag_dir = source, source.parent
    out = Path(out) if out is not None else bag_dir.with_name(
        (bag_dir.name if source.is_dir() else storage_file.stem) + "_repaired")
    if out.exists():
        raise RepairError(f"{out}: already exists; choose another --out", out)
    report = RepairReport(source=source, out=out)
    stale = _stale_metadata(bag_dir)
    custom = {"repaired_by": "iws bag repair", "repaired_from": str(storage_file)}
    plugin = StoragePlugin.SQLITE3 if storage_file.suffix == ".db3" else StoragePlugin.MCAP

    if plugin == StoragePlugin.MCAP:  # refuse a non-MCAP file before creating anything
        with open(storage_file, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise RepairError(f"{storage_file}: not an MCAP file (no MCAP magic at the start)", storage_file)
    output = None
    try:
        output = _Output(out, plugin, stale, custom, report)
        if plugin == StoragePlugin.SQLITE3:
            _repair_sqlite(storage_file, output, report)
        else:
            scan = _McapScan(storage_file, output, report)
            scan.run()
            if not output.connections:
                raise RepairError(f"{storage_file}: no complete schema and channel records in the file: "
                                  f"no messages can be recovered", storage_file)
            if scan.skipped_messages:
                report.note = (report.note + "; " if report.note else "") + \
                    f"{scan.skipped_messages} messages on channels without a schema skipped"
        output.writer.close()
    except BaseException:
        if output is not None:
            with suppress(Exception):
                output.writer.abort()
        import shutil

        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        raise
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws bag repair", description=__doc__.split("\n")[0])
    parser.add_argument("bag", help="bag directory, or its .mcap / .db3 file")
    parser.add_argument("--out", default=None, help="repaired bag directory to create (default: <bag>_repaired)")
    args = parser.parse_args(argv)
    try:
        report = repair_bag(args.bag, args.out)
    except (BagError, OSError) as exc:
        print(f"iws bag repair: error: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
