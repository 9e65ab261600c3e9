"""`iws dataset build`: rosbag2 recordings -> the cached dataset (iws_data.dataset).

Works for any backend and for real robots recorded with their own drivers, because it only reads
the robot profile's topics:

- Episodes: iws_interfaces/EpisodeEvent START..END (DISCARD drops one); a bag without events is
  one episode.
- Frames: image stamps resampled on the control-rate grid (nearest image within half a period; a
  slot without one repeats the previous image and counts as dropped). A stamp that goes backwards
  or jumps forward by more than --max-gap splits the episode (a clock jump).
- Joint positions at a frame: the latest JointState at or before it, reordered to profile order.
- Action at a frame: the joint target in force at that time, found by replaying every command
  through iws_common.commands.JointCommandFollower as the robot does (position commands clamped to
  the limits, trajectories sampled at the frame time, rejected commands ignored).
Stamps are header stamps where a message has one (non-zero), else the bag log time.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import struct
import sys
import time
from pathlib import Path

import numpy as np

from iws_common.commands import CommandRejected, JointCommandFollower
from iws_common.image_conversion import ImageEncodingError, image_to_numpy
from iws_common.profile import ProfileError, RobotProfile, load_profile
from iws_data.bags import BagError, BagReader, decode_cdr, find_bags
from iws_data.dataset import DatasetWriter
from iws_data.images import crop_and_resize

EVENT_START, EVENT_END, EVENT_DISCARD = 0, 1, 2
REPORT_LIST_LIMIT = 200


class DatasetBuildError(BagError):
    """A bag cannot become dataset frames; the message names the file and the topic."""


@dataclasses.dataclass
class Command:
    stamp_ns: int
    kind: str  # "position" or "trajectory"
    message: object


@dataclasses.dataclass
class EpisodeWindow:
    start_ns: int
    end_ns: int
    task: str = ""
    success: bool = False
    score: float = float("nan")
    terminated: bool = True


@dataclasses.dataclass
class BuildReport:
    bags: int = 0
    episodes: int = 0
    frames: int = 0
    dropped_frames: int = 0
    unused_images: int = 0
    frames_without_state: int = 0
    frames_without_command: int = 0
    stale_joint_state_frames: int = 0
    discarded_episodes: int = 0
    short_episodes_skipped: int = 0
    clamped_commands: int = 0
    rejected_commands: dict = dataclasses.field(default_factory=dict)
    gaps: list = dataclasses.field(default_factory=list)
    clock_jumps: list = dataclasses.field(default_factory=list)
    warnings: list = dataclasses.field(default_factory=list)
    skipped_bags: list = dataclasses.field(default_factory=list)

    def note(self, field: str, item) -> None:
        items = getattr(self, field)
        if len(items) < REPORT_LIST_LIMIT:
            items.append(item)

    def summary(self) -> str:
        lines = [f"{self.bags} bags -> {self.episodes} episodes, {self.frames} frames",
                 f"dropped frames (repeated image): {self.dropped_frames}; gaps: {len(self.gaps)}; clock jumps: {len(self.clock_jumps)}",
                 f"frames dropped for lack of joint state: {self.frames_without_state}, of command: {self.frames_without_command}; "
                 f"stale joint states: {self.stale_joint_state_frames}",
                 f"discarded episodes: {self.discarded_episodes}; too short: {self.short_episodes_skipped}; "
                 f"clamped commands: {self.clamped_commands}; rejected commands: {self.rejected_commands or 0}"]
        lines += [f"skipped broken bag: {b}" for b in self.skipped_bags[:20]]
        lines += [f"warning: {w}" for w in self.warnings[:20]]
        if len(self.warnings) > 20:
            lines.append(f"... and {len(self.warnings) - 20} more warnings (meta.json report)")
        return "\n".join(lines)


def header_stamp_ns(data: bytes | memoryview) -> int:
    """The std_msgs/Header stamp at the start of a CDR message, without decoding the rest."""
    fmt = "<iI" if data[1] else ">iI"
    sec, nanosec = struct.unpack_from(fmt, data, 4)
    return sec * 1_000_000_000 + nanosec


def stamp_or_log_time(data: bytes | memoryview, log_ns: int) -> int:
    stamp = header_stamp_ns(data)
    return stamp if stamp > 0 else log_ns


def _time_ns(t) -> int:
    return int(t.sec) * 1_000_000_000 + int(t.nanosec)


class BagEpisodeExtractor:
    """Turns one bag into aligned episodes (arrays) for a profile."""

    def __init__(self, profile: RobotProfile, size: int, report: BuildReport, max_gap_s: float = 1.0):
        self.profile = profile
        self.size = size
        self.report = report
        self.period_ns = round(profile.control_period_s * 1e9)
        self.max_gap_ns = round(max_gap_s * 1e9)
        self.joint_names = list(profile.joints.names)

    # -- reading -----------------------------------------------------------------------------
    def read(self, path: Path) -> dict:
        topics = self.profile.topics
        with BagReader(path) as bag:
            where = bag._describe()
            if bag.message_count == 0:
                raise DatasetBuildError(f"{where}: empty bag (no messages on any topic; expected {topics.image}, "
                                        f"{topics.joint_states} and {topics.position_command})", path, topics.image)
            present = bag.topics
            for topic in (topics.image, topics.joint_states):
                if topic not in present:
                    raise DatasetBuildError(f"{where}: missing topic {topic} (bag has {sorted(present)})", path, topic)
                if bag.count(topic) == 0:
                    raise DatasetBuildError(f"{where}: topic {topic} has no messages", path, topic)
            command_topics = [t for t in (topics.position_command, topics.trajectory_command) if bag.count(t) > 0]
            if not command_topics:
                missing = topics.position_command if topics.position_command not in present else f"{topics.position_command} (no messages)"
                raise DatasetBuildError(f"{where}: missing topic {missing}; a dataset needs commands "
                                        f"({topics.position_command} or {topics.trajectory_command})", path, topics.position_command)
            streams = {"images": [], "joint_states": [], "commands": [], "events": [], "task_states": []}
            wanted = [topics.image, topics.joint_states, topics.position_command, topics.trajectory_command,
                      topics.episode_events, topics.task_state]
            current_topic = None
            try:
                for topic, log_ns, data in bag.messages(wanted):
                    current_topic = topic
                    if topic == topics.image:
                        streams["images"].append((stamp_or_log_time(data, log_ns), data))
                    elif topic == topics.joint_states:
                        msg = decode_cdr(data, "sensor_msgs/msg/JointState")
                        streams["joint_states"].append((stamp_or_log_time(data, log_ns), msg))
                    elif topic == topics.position_command:
                        streams["commands"].append(Command(log_ns, "position", decode_cdr(data, "std_msgs/msg/Float64MultiArray")))
                    elif topic == topics.trajectory_command:
                        msg = decode_cdr(data, "trajectory_msgs/msg/JointTrajectory")
                        streams["commands"].append(Command(stamp_or_log_time(data, log_ns), "trajectory", msg))
                    elif topic == topics.episode_events:
                        msg = decode_cdr(data, "iws_interfaces/msg/EpisodeEvent")
                        streams["events"].append((stamp_or_log_time(data, log_ns), msg))
                    elif topic == topics.task_state:
                        streams["task_states"].append((stamp_or_log_time(data, log_ns), data))
            except BagError:
                raise
            except Exception as exc:
                raise DatasetBuildError(f"{where}: cannot decode a message on {current_topic}: {exc}", path, current_topic) from exc
            streams["where"] = where
            streams["bag_start_ns"] = bag.start_time_ns
            streams["bag_end_ns"] = bag.end_time_ns
        return streams

    # -- episodes ----------------------------------------------------------------------------
    def episode_windows(self, streams: dict) -> list[EpisodeWindow]:
        where = streams["where"]
        events = sorted(streams["events"], key=lambda e: e[0])
        first, last = streams["bag_start_ns"], streams["bag_end_ns"]
        if not events:
            return [EpisodeWindow(first, last, terminated=False)]
        windows, open_window = [], None
        for stamp, event in events:
            if event.event == EVENT_START:
                if open_window is not None:
                    self.report.warnings.append(f"{where}: START at {stamp * 1e-9:.3f} s while an episode was open: closed it there")
                    open_window.end_ns, open_window.terminated = stamp - 1, False
                    windows.append(open_window)
                open_window = EpisodeWindow(stamp, last, task=event.task)
            elif event.event == EVENT_END:
                if open_window is None:
                    self.report.warnings.append(f"{where}: END at {stamp * 1e-9:.3f} s without START: episode taken from the bag start")
                    open_window = EpisodeWindow(first, last, task=event.task)
                open_window.end_ns = stamp
                open_window.task = event.task or open_window.task
                open_window.success, open_window.score = bool(event.success), float(event.score)
                windows.append(open_window)
                open_window = None
            elif event.event == EVENT_DISCARD:
                self.report.discarded_episodes += 1
                if open_window is None:
                    self.report.warnings.append(f"{where}: DISCARD at {stamp * 1e-9:.3f} s without an open episode")
                open_window = None
            else:
                self.report.warnings.append(f"{where}: unknown episode event {event.event} ignored")
        if open_window is not None:
            self.report.warnings.append(f"{where}: episode started at {open_window.start_ns * 1e-9:.3f} s has no END "
                                        "(recording stopped?): kept up to the end of the bag")
            open_window.terminated = False
            windows.append(open_window)
        return windows

    def _segments(self, stamps: np.ndarray, where: str) -> list[np.ndarray]:
        """Split image indices at clock jumps (stamp backwards or forward by more than max gap)."""
        if len(stamps) == 0:
            return []
        steps = np.diff(stamps)
        cuts = np.nonzero((steps < 0) | (steps > self.max_gap_ns))[0]
        for c in cuts:
            self.report.note("clock_jumps", {"bag": where, "at_s": stamps[c] * 1e-9, "jump_s": float(steps[c]) * 1e-9})
        return np.split(np.arange(len(stamps)), cuts + 1)

    def _grid(self, stamps: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
        """Frame times on the control grid and, per frame, the index of its image (nearest within
        half a period, else the previous frame's image)."""
        start, stop = int(stamps[0]), int(stamps[-1])
        count = (stop - start + self.period_ns // 2) // self.period_ns + 1
        grid = start + np.arange(count, dtype=np.int64) * self.period_ns
        right = np.searchsorted(stamps, grid, side="left").clip(0, len(stamps) - 1)
        left = (right - 1).clip(0)
        nearest = np.where(np.abs(stamps[left] - grid) <= np.abs(stamps[right] - grid), left, right)
        found = np.abs(stamps[nearest] - grid) <= self.period_ns // 2
        chosen = nearest.copy()
        for k in range(1, count):  # repeat the last image for slots without one
            if not found[k]:
                chosen[k] = chosen[k - 1]
        dropped = int(np.count_nonzero(~found))
        if dropped:
            self.report.dropped_frames += dropped
            run_start = None
            for k in range(count + 1):
                missing = k < count and not found[k]
                if missing and run_start is None:
                    run_start = k
                elif not missing and run_start is not None:
                    self.report.note("gaps", {"bag": where, "at_s": grid[run_start] * 1e-9,
                                              "missing_frames": k - run_start, "length_s": (k - run_start) * self.period_ns * 1e-9})
                    run_start = None
        self.report.unused_images += len(stamps) - len(np.unique(chosen))
        return grid, chosen

    def _joint_order(self, names: tuple, where: str) -> list[int]:
        if sorted(names) != sorted(self.joint_names):
            topic = self.profile.topics.joint_states
            raise DatasetBuildError(f"{where}: joint names on {topic} {list(names)} do not match the profile "
                                    f"'{self.profile.name}' joints {self.joint_names}", where, topic)
        return [names.index(n) for n in self.joint_names]

    def joint_table(self, streams: dict) -> tuple[np.ndarray, np.ndarray]:
        """(stamps (M,), positions (M, J)) in profile order, sorted by stamp."""
        orders: dict[tuple, list[int]] = {}
        stamps, rows = [], []
        for stamp, msg in streams["joint_states"]:
            names = tuple(msg.name)
            if names not in orders:
                orders[names] = self._joint_order(names, streams["where"])
            position = np.asarray(msg.position, dtype=np.float64)
            if len(position) != len(names):
                self.report.warnings.append(f"{streams['where']}: JointState with {len(names)} names but {len(position)} positions skipped")
                continue
            stamps.append(stamp)
            rows.append(position[orders[names]])
        stamps_array = np.asarray(stamps, dtype=np.int64)
        order = np.argsort(stamps_array, kind="stable")
        return stamps_array[order], np.asarray(rows, dtype=np.float64).reshape(-1, len(self.joint_names))[order]

    def _apply(self, follower: JointCommandFollower, command: Command) -> None:
        try:
            before = follower.clamped
            if command.kind == "position":
                follower.set_position_command(command.message.data)
            else:
                msg = command.message
                times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
                follower.set_trajectory(list(msg.joint_names), times, [p.positions for p in msg.points], now=command.stamp_ns * 1e-9)
            self.report.clamped_commands += follower.clamped - before
        except CommandRejected as exc:
            self.report.rejected_commands[exc.kind] = self.report.rejected_commands.get(exc.kind, 0) + 1

    def actions_at(self, grid: np.ndarray, commands: list[Command], command_stamps: np.ndarray,
                   start_position: np.ndarray) -> np.ndarray:
        """Target in force at each grid time (NaN rows before the first command)."""
        follower = JointCommandFollower(self.profile.joints)
        follower.reset(start_position)
        actions = np.full((len(grid), len(self.joint_names)), np.nan)
        # Start from the command in force at the first frame (commands before an episode carry over).
        next_index = max(int(np.searchsorted(command_stamps, grid[0], side="right")) - 1, 0)
        have_command = False
        dt = self.period_ns * 1e-9
        for k, t in enumerate(grid):
            while next_index < len(commands) and commands[next_index].stamp_ns <= t:
                self._apply(follower, commands[next_index])
                next_index += 1
                have_command = True
            if have_command:
                follower.step(t * 1e-9, dt)
                actions[k] = follower.target
        return actions

    def decode_images(self, raw: list, where: str) -> np.ndarray:
        topic = self.profile.topics.image
        frames = []
        for data in raw:
            msg = decode_cdr(data, "sensor_msgs/msg/Image")
            try:
                frames.append(image_to_numpy(msg, want="rgb8"))
            except ImageEncodingError as exc:
                raise DatasetBuildError(f"{where}: image on {topic}: {exc}", where, topic) from exc
        shapes = {f.shape for f in frames}
        if len(shapes) > 1:
            raise DatasetBuildError(f"{where}: images on {topic} change size within an episode: {sorted(shapes)}", where, topic)
        return crop_and_resize(np.stack(frames), self.size)

    def episodes(self, path: Path):
        """Yield (arrays, info, split key) per episode of the bag."""
        streams = self.read(path)
        where = streams["where"]
        image_stamps = np.asarray([s for s, _ in streams["images"]], dtype=np.int64)
        image_order = np.argsort(image_stamps, kind="stable")
        image_stamps = image_stamps[image_order]
        image_raw = [streams["images"][i][1] for i in image_order]
        joint_stamps, joint_positions = self.joint_table(streams)
        commands = sorted(streams["commands"], key=lambda c: c.stamp_ns)
        command_stamps = np.asarray([c.stamp_ns for c in commands], dtype=np.int64)
        task_stamps = np.asarray([s for s, _ in streams["task_states"]], dtype=np.int64)

        for window_index, window in enumerate(self.episode_windows(streams)):
            inside = np.nonzero((image_stamps >= window.start_ns) & (image_stamps <= window.end_ns))[0]
            segments = self._segments(image_stamps[inside], where)
            for segment_index, segment in enumerate(segments):
                indices = inside[segment]
                grid, chosen = self._grid(image_stamps[indices], where)
                state_index = np.searchsorted(joint_stamps, grid, side="right") - 1
                has_state = state_index >= 0
                stale = has_state & (grid - joint_stamps[state_index.clip(0)] > 2 * self.period_ns)
                self.report.stale_joint_state_frames += int(np.count_nonzero(stale))
                first_state = int(np.argmax(has_state)) if has_state.any() else len(grid)
                start_position = joint_positions[state_index[first_state]] if first_state < len(grid) else np.zeros(len(self.joint_names))
                actions = self.actions_at(grid, commands, command_stamps, start_position) if len(commands) else np.full((len(grid), len(self.joint_names)), np.nan)
                has_command = ~np.isnan(actions).any(axis=1)
                keep = has_state & has_command
                self.report.frames_without_state += int(np.count_nonzero(~has_state))
                self.report.frames_without_command += int(np.count_nonzero(has_state & ~has_command))
                episode_key = f"#{window_index}" + (f".{segment_index}" if len(segments) > 1 else "")
                source = f"{path}{episode_key}"
                if np.count_nonzero(keep) < 2:
                    self.report.short_episodes_skipped += 1
                    self.report.warnings.append(f"{source}: fewer than 2 usable frames, skipped")
                    continue
                keep_index = np.nonzero(keep)[0]
                images = self.decode_images([image_raw[indices[c]] for c in chosen[keep_index]], where)
                success, score = window.success, window.score
                if not window.terminated and len(task_stamps):
                    # No END: label from the last ground-truth task state inside the episode.
                    last = np.searchsorted(task_stamps, grid[keep_index[-1]], side="right") - 1
                    if last >= 0 and task_stamps[last] >= window.start_ns:
                        state = decode_cdr(streams["task_states"][last][1], "iws_interfaces/msg/TaskState")
                        success, score = bool(state.success), float(state.score)
                        window.task = window.task or state.task
                arrays = {
                    "images": images,
                    "joint_positions": joint_positions[state_index[keep_index]].astype(np.float32),
                    "actions": actions[keep_index].astype(np.float32),
                    "timestamps": grid[keep_index] * 1e-9,
                }
                info = {"task": window.task, "success": bool(success), "score": float(score), "source": source}
                yield arrays, info, f"{Path(path).name}{episode_key}"


def validation_rank(key: str) -> float:
    """A stable pseudo-random number in [0, 1) per episode (bag name + episode in it), so splits
    survive adding bags and moving the directory."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:12], 16) / float(1 << 48)


def capacity_estimate(bags: list[Path], image_topic: str) -> int:
    """About one frame per image; the writer grows if the grid needs more and trims on close."""
    total = 0
    for path in bags:
        try:
            with BagReader(path) as bag:
                total += bag.count(image_topic)
        except BagError:
            pass  # reported when the bag is read for real

    return max(total + 16, 16)


def build_dataset(bag_paths: list[str | Path], out: str | Path, profile: RobotProfile | str = "reference_arm",
                  size: int = 96, val_fraction: float = 0.1, max_gap_s: float = 1.0, progress: bool = True,
                  overwrite: bool = False, skip_broken: bool = False) -> tuple[Path, BuildReport]:
    """Build a dataset directory from bags; returns (directory, report). On failure nothing that
    opens as a dataset is left behind."""
    if isinstance(profile, str):
        profile = load_profile(profile)
    out = Path(out)
    if (out / "meta.json").exists() and not overwrite:
        raise FileExistsError(f"{out}: a dataset exists already (pass --overwrite to replace it)")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    bags = find_bags(bag_paths)
    report = BuildReport(bags=len(bags))
    extractor = BagEpisodeExtractor(profile, size, report, max_gap_s=max_gap_s)
    capacity = capacity_estimate(bags, profile.topics.image)
    writer = DatasetWriter(out, (size, size), list(profile.joints.names), capacity,
                           meta={"profile": profile.name, "control_rate_hz": profile.control_rate_hz})
    try:
        return _build(bags, writer, extractor, report, val_fraction, skip_broken, progress)
    except BaseException:
        writer.abort()
        raise


def _build(bags, writer, extractor, report, val_fraction, skip_broken, progress):
    from tqdm import tqdm

    started = time.perf_counter()
    ranks = []
    with tqdm(bags, unit="bag", desc="dataset build", disable=not progress, dynamic_ncols=True) as bar:
        for path in bar:
            try:
                for arrays, info, split_key in extractor.episodes(path):
                    rank = validation_rank(split_key)
                    ranks.append(rank)
                    writer.add_episode(arrays["images"], arrays["joint_positions"], arrays["actions"], arrays["timestamps"],
                                       split="val" if rank < val_fraction else "train", **info)
                    report.frames += len(arrays["images"])
            except BagError as exc:
                if not skip_broken:
                    raise
                # Episodes of this bag already written (before the failure) are valid and stay.
                report.note("skipped_bags", str(exc))
                bar.write(f"iws dataset build: skipping broken bag: {exc}")
            bar.set_postfix(episodes=len(writer.episodes), frames=report.frames)
    if not writer.episodes:
        raise DatasetBuildError(f"no usable episodes in {[str(b) for b in bags]}", bags[0] if bags else None, None)
    # Small datasets: make sure both splits are non-empty when that is possible.
    n_val = sum(e.split == "val" for e in writer.episodes)
    if val_fraction > 0 and len(writer.episodes) >= 2 and n_val == 0:
        lowest = int(np.argmin(ranks))
        writer.episodes[lowest] = dataclasses.replace(writer.episodes[lowest], split="val")
    if n_val == len(writer.episodes) and len(writer.episodes) >= 2:
        highest = int(np.argmax(ranks))
        writer.episodes[highest] = dataclasses.replace(writer.episodes[highest], split="train")
    report.episodes = len(writer.episodes)
    elapsed = time.perf_counter() - started
    writer.close(report=dataclasses.asdict(report), sources=[str(b) for b in bags], val_fraction=val_fraction,
                 action_semantics="joint position target in force at the frame (JointCommandFollower.target: "
                                  "position commands clamped to the limits, trajectories sampled at the frame time)",
                 build_seconds=elapsed, created=time.strftime("%Y-%m-%dT%H:%M:%S"))
    return writer.root, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws dataset build", description=__doc__.split("\n")[0])
    parser.add_argument("bags", nargs="+", help="rosbag2 directories (MCAP or sqlite3), or directories containing them")
    parser.add_argument("--out", required=True, help="dataset directory to write")
    parser.add_argument("--robot", default="reference_arm", help="robot profile name or YAML path (topics, joints, rate)")
    parser.add_argument("--size", type=int, default=96, help="square image size after centre crop and area resize")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="fraction of episodes held out for validation")
    parser.add_argument("--max-gap", type=float, default=1.0, help="seconds without images that split an episode (clock jump)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset in --out")
    parser.add_argument("--skip-broken", action="store_true", help="leave out unreadable bags (listed in the report) instead of failing")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        out, report = build_dataset(args.bags, args.out, args.robot, size=args.size, val_fraction=args.val_fraction,
                                    max_gap_s=args.max_gap, progress=not args.no_progress, overwrite=args.overwrite,
                                    skip_broken=args.skip_broken)
    except (BagError, ProfileError, FileExistsError, ValueError) as exc:
        print(f"iws dataset build: error: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
