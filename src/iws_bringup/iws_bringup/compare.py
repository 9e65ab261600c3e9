"""`iws compare`: an A/B video, real | sim | absolute difference, with the error of every frame.

Subscribes to the camera topic of both sides of an A/B bringup (`iws up ab`: /real and /sim) and
pairs their frames in arrival order: the i-th frame of one side with the i-th of the other, which
is exact in lockstep when both sides are stepped alike and close in real time while both keep the
control rate (a side that runs ahead by more than --max-lag frames has its oldest frames dropped,
and counted). Writes an MP4 of real | sim | |real - sim| and, next to it, a JSON with the mean
absolute error (0-255 per channel) and PSNR (dB) of every pair. In the video's footer, the frame
index is under the real image, the mean absolute error (white) and PSNR (cyan) under the difference.

Both sides start from their own initial states (the world model from its shipped start windows),
so by default this compares behaviour under the same commands, not pixel-identical starts.
``--sync`` first resets /sim to the latest --sync-frames frames and joint states of /real (through
/sim's ResetWorld with a supplied window; in lockstep it steps /real to produce them).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import sys
import threading
import time
from pathlib import Path

import numpy as np

from iws_common.isolation import use_simulator_domain_by_default
from iws_common.profile import ProfileError, RobotProfile, load_profile, normalize_namespace


class CompareError(RuntimeError):
    """Nothing to compare, or the sync reset failed; the message says what to check."""


@dataclasses.dataclass
class FramePair:
    index: int
    real_stamp_ns: int
    sim_stamp_ns: int
    real: np.ndarray
    sim: np.ndarray


class FramePairer:
    """Pairs frames of two streams in arrival order; a stream more than ``max_lag`` frames ahead
    of the other drops its oldest waiting frame (counted in ``dropped``)."""

    SIDES = ("real", "sim")

    def __init__(self, max_lag: int):
        self.max_lag = max(1, int(max_lag))
        self.waiting = {side: collections.deque() for side in self.SIDES}
        self.dropped = {side: 0 for side in self.SIDES}
        self.pairs: list[FramePair] = []

    def add(self, side: str, stamp_ns: int, image: np.ndarray) -> FramePair | None:
        """Add one frame; returns the pair it completes, if any."""
        queue = self.waiting[side]
        queue.append((stamp_ns, image))
        other = self.waiting["sim" if side == "real" else "real"]
        if other:
            (real_stamp, real), (sim_stamp, sim) = self.waiting["real"].popleft(), self.waiting["sim"].popleft()
            pair = FramePair(len(self.pairs), real_stamp, sim_stamp, real, sim)
            self.pairs.append(pair)
            return pair
        if len(queue) > self.max_lag:
            queue.popleft()
            self.dropped[side] += 1
        return None


def frame_error(real: np.ndarray, sim: np.ndarray) -> tuple[float, float | None]:
    """(mean absolute error in 0-255 units, PSNR in dB or None for identical frames)."""
    diff = real.astype(np.float64) - sim.astype(np.float64)
    mse = float(np.mean(diff * diff))
    psnr = None if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)
    return float(np.mean(np.abs(diff))), psnr


def match_size(sim: np.ndarray, real: np.ndarray) -> np.ndarray:
    """The sim frame at the real frame's size (a world model may publish its native resolution)."""
    if sim.shape[:2] == real.shape[:2]:
        return sim
    from iws_data.images import resize_area
    return resize_area(sim[None], real.shape[0], real.shape[1])[0]


def compose_frame(pair: FramePair, mae: float, psnr: float | None, diff_gain: float = 1.0) -> np.ndarray:
    """real | sim | |real - sim| * gain, with a footer of index, MAE and PSNR (digits only)."""
    from iws_data.info import draw_text

    real, sim = pair.real, match_size(pair.sim, pair.real)
    diff = np.clip(np.abs(real.astype(np.int16) - sim.astype(np.int16)) * diff_gain, 0, 255).astype(np.uint8)
    h, w = real.shape[:2]
    gap, footer = 2, 9
    canvas = np.full((h + footer, 3 * w + 2 * gap, 3), 255, dtype=np.uint8)
    canvas[h:] = 0
    for i, panel in enumerate((real, sim, diff)):
        canvas[:h, i * (w + gap):i * (w + gap) + w] = panel
    draw_text(canvas, str(pair.index), 2, h + 2, scale=1)
    x = 2 * (w + gap) + 2
    text = f"{mae:.1f}"
    draw_text(canvas, text, x, h + 2, scale=1)
    draw_text(canvas, "99.9" if psnr is None else f"{min(psnr, 99.9):.1f}", x + 4 * len(text) + 8, h + 2,
              scale=1, color=(80, 220, 255))
    return canvas


def summarize(pairs: list[FramePair], dropped: dict, **info) -> dict:
    rows, maes, psnrs = [], [], []
    for pair in pairs:
        mae, psnr = frame_error(pair.real, match_size(pair.sim, pair.real))
        maes.append(mae)
        if psnr is not None:
            psnrs.append(psnr)
        rows.append({"index": pair.index, "real_stamp_ns": pair.real_stamp_ns, "sim_stamp_ns": pair.sim_stamp_ns,
                     "mean_abs_error": round(mae, 4), "psnr_db": None if psnr is None else round(psnr, 4)})
    return {**info, "frames": len(pairs),
            "mean_abs_error": float(np.mean(maes)) if maes else None,
            "psnr_db_mean": float(np.mean(psnrs)) if psnrs else None,
            "identical_frames": len(pairs) - len(psnrs), "unpaired": dict(dropped),
            "units": "mean_abs_error: 0-255 per channel; psnr_db: null for identical frames", "pairs": rows}


def write_comparison(pairs: list[FramePair], dropped: dict, out: Path, fps: float, diff_gain: float,
                     upscale: int, **info) -> dict:
    """The MP4 and the JSON next to it; returns the JSON's content."""
    from iws_data.video import write_mp4

    summary = summarize(pairs, dropped, video=str(out), **info)
    frames = (compose_frame(p, row["mean_abs_error"], row["psnr_db"], diff_gain) for p, row in zip(pairs, summary["pairs"]))
    write_mp4(frames, out, fps=fps, upscale=upscale)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return summary


# -- ROS ------------------------------------------------------------------------------------

def _wait_matched(subscriptions, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s.get_publisher_count() > 0 for s in subscriptions):
            return
        time.sleep(0.05)
    missing = [s.topic_name for s in subscriptions if s.get_publisher_count() == 0]
    raise CompareError(f"nobody publishes {missing} within {timeout:.0f} s ({what}): is `iws up ab` running "
                       "on this ROS_DOMAIN_ID?")


def sync_sim_to_real(client, real: RobotProfile, sim: RobotProfile, frames: int, timeout: float = 30.0) -> str:
    """Reset /sim to /real's latest ``frames`` frames and joint states (same stamps); in lockstep,
    step /real to produce them. Returns ResetWorld's message."""
    from sensor_msgs.msg import Image, JointState

    from iws_common import qos
    from iws_common.messages import stamp_ns
    from iws_interfaces.msg import WorldStatus
    from iws_interfaces.srv import ResetWorld, StepWorld

    if frames < 1:
        raise CompareError(f"--sync-frames must be at least 1, got {frames}")
    images: list = []
    joints: dict = {}
    lock = threading.Lock()

    def on_image(msg):
        with lock:
            images.append(msg)

    def on_joints(msg):
        with lock:
            joints[stamp_ns(msg.header.stamp)] = msg
    subs = [client.node.create_subscription(Image, real.topics.image, on_image, qos.IMAGE_LOSSLESS),
            client.node.create_subscription(JointState, real.topics.joint_states, on_joints, qos.STATE)]
    status = client.collect(WorldStatus, real.topics.world_status)
    _wait_matched(subs, timeout, "sync")
    try:
        client.wait_for(status, 1, timeout=timeout)
    except TimeoutError:
        raise CompareError(f"no WorldStatus on {real.topics.world_status} within {timeout:.0f} s") from None
    lockstep = status[-1].mode == "lockstep"

    def window():
        with lock:
            matched = [(m, joints[stamp_ns(m.header.stamp)]) for m in images if stamp_ns(m.header.stamp) in joints]
        return matched[-frames:] if len(matched) >= frames else None

    deadline = time.monotonic() + timeout
    if lockstep:
        client.call(StepWorld, real.services.step, StepWorld.Request(num_steps=frames))
    while window() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        if lockstep and window() is None:  # a frame got lost in discovery: one more step
            client.call(StepWorld, real.services.step, StepWorld.Request(num_steps=1))
    chosen = window()
    for sub in subs:
        client.node.destroy_subscription(sub)
    if chosen is None:
        raise CompareError(f"got {len(images)} frames from {real.topics.image} within {timeout:.0f} s, "
                           f"need {frames} with joint states of the same stamps")
    request = ResetWorld.Request(seed=-1, images=[m for m, _ in chosen], joint_states=[j for _, j in chosen])
    response = client.call(ResetWorld, sim.services.reset, request, timeout=timeout)
    if not response.success:
        raise CompareError(f"{sim.services.reset} refused the window: {response.message}")
    return response.message


def compare(profile: RobotProfile, real_ns: str, sim_ns: str, seconds: float, max_frames: int | None,
            max_lag: int, sync_frames: int | None = None) -> tuple[FramePairer, str]:
    """Collect frame pairs until ``seconds`` pass, ``max_frames`` pairs exist, or Ctrl-C."""
    from sensor_msgs.msg import Image

    from iws_common import qos
    from iws_common.client import RosClient
    from iws_common.image_conversion import image_to_numpy
    from iws_common.messages import stamp_ns

    real, sim = profile.namespaced(real_ns), profile.namespaced(sim_ns)
    pairer = FramePairer(max_lag)
    lock = threading.Lock()
    comparing = threading.Event()

    def on_frame(side):
        def callback(msg):
            if comparing.is_set():
                frame = image_to_numpy(msg, want="rgb8").copy()
                with lock:
                    pairer.add(side, stamp_ns(msg.header.stamp), frame)
        return callback

    client = RosClient(name="iws_compare")
    sync_message = ""
    try:
        subs = [client.node.create_subscription(Image, p.topics.image, on_frame(side), qos.IMAGE_LOSSLESS)
                for side, p in (("real", real), ("sim", sim))]
        _wait_matched(subs, 60.0, "comparison")
        if sync_frames:
            sync_message = sync_sim_to_real(client, real, sim, sync_frames)
            print(f"iws compare: synced {sim_ns} to the last {sync_frames} frames of {real_ns}: {sync_message}", flush=True)
        comparing.set()
        print(f"iws compare: comparing {real.topics.image} and {sim.topics.image} for up to {seconds:.0f} s"
              + (f" or {max_frames} frames" if max_frames else "") + " (Ctrl-C stops early)", flush=True)
        started = last_report = time.monotonic()
        try:
            while time.monotonic() - started < seconds and not (max_frames and len(pairer.pairs) >= max_frames):
                time.sleep(0.05)
                if time.monotonic() - last_report >= 2.0:
                    last_report = time.monotonic()
                    print(f"iws compare: {len(pairer.pairs)} pairs", flush=True)
        except KeyboardInterrupt:
            pass
        comparing.clear()
    finally:
        client.close()
    with lock:
        if max_frames:
            del pairer.pairs[max_frames:]
        for side, waiting in pairer.waiting.items():  # frames left without a partner count as unpaired too
            pairer.dropped[side] += len(waiting)
            waiting.clear()
        return pairer, sync_message


def main(argv: list[str] | None = None) -> int:
    from iws_bringup.backends import BringupError, load_ab

    parser = argparse.ArgumentParser(prog="iws compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the MP4 to write (the JSON goes next to it)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to record (default 20)")
    parser.add_argument("--frames", type=int, default=None, help="stop after this many pairs")
    parser.add_argument("--robot", default="reference_arm", help="robot profile name or YAML path")
    parser.add_argument("--real", help="namespace of the real side (default: the first side of bringup.yaml's ab)")
    parser.add_argument("--sim", help="namespace of the simulated side (default: the second side)")
    parser.add_argument("--sync", action="store_true", help="first reset the sim to the real side's latest frames")
    parser.add_argument("--sync-frames", type=int, default=4, help="frames in the --sync window (default 4)")
    parser.add_argument("--max-lag", type=int, default=None, help="frames a side may run ahead (default: 1 s of frames)")
    parser.add_argument("--diff-gain", type=float, default=1.0, help="brighten the difference image by this factor")
    parser.add_argument("--upscale", type=int, default=None, help="video pixels per image pixel (default: about 256 px per image)")
    args = parser.parse_args(argv)
    if args.out.suffix.lower() != ".mp4":
        parser.error(f"--out must end in .mp4, got {args.out}")
    if args.seconds <= 0 or (args.frames is not None and args.frames < 1):
        parser.error("--seconds must be positive and --frames at least 1")
    try:
        profile = load_profile(args.robot)
        use_simulator_domain_by_default(profile, "iws compare")
        sides = [ns for _, ns in load_ab().sides]
        real_ns = normalize_namespace(args.real) if args.real else sides[0]
        sim_ns = normalize_namespace(args.sim) if args.sim else sides[1]
        if not real_ns or not sim_ns or real_ns == sim_ns:
            raise CompareError(f"need two distinct, non-empty namespaces, got {real_ns!r} and {sim_ns!r}")
        max_lag = args.max_lag or max(1, round(profile.camera.rate_hz))
        pairer, sync_message = compare(profile, real_ns, sim_ns, args.seconds, args.frames, max_lag,
                                       args.sync_frames if args.sync else None)
        if not pairer.pairs:
            raise CompareError(f"no frame pairs from {real_ns} and {sim_ns} within {args.seconds:.0f} s: is "
                               "`iws up ab` running (and, in lockstep, is something stepping both sides)?")
        upscale = args.upscale or max(1, 256 // profile.camera.width)
        summary = write_comparison(pairer.pairs, pairer.dropped, args.out, profile.camera.rate_hz, args.diff_gain,
                                   upscale, robot=profile.name, real=real_ns, sim=sim_ns, synced=bool(args.sync),
                                   sync=sync_message)
    except (CompareError, BringupError, ProfileError) as exc:
        print(f"iws compare: {exc}", file=sys.stderr)
        return 1
    psnr = summary["psnr_db_mean"]
    print(f"iws compare: {summary['frames']} pairs, mean absolute error {summary['mean_abs_error']:.2f} (0-255), "
          f"mean PSNR {'n/a' if psnr is None else f'{psnr:.2f} dB'}, unpaired frames {summary['unpaired']}\n"
          f"video: {args.out}\nframe errors: {args.out.with_suffix('.json')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
