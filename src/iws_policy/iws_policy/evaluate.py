"""`iws evaluate`: a policy's success rate on either backend, through ROS, from matched initial states.

    iws evaluate --policy runs/policy_real --backend reference --episodes 50
    iws evaluate --policy runs/policy_real --backend world_model --episodes 50 [--model models/push_t]
    iws evaluate --policy expert --backend world_model --episodes 20 --videos 4

The backend runs in its own process in lockstep on a private ROS domain, exactly as `iws up` starts
it; this process is the policy's ROS client (camera image and joint states in, position commands
out) and the referee. Episode k starts from the reference robot's initial state for seed
``seed + k`` on both backends: the reference robot resets to that seed, the world model to a
window of frames rendered from it (ResetWorld with images and joint states). Each control step the
policy acts on the newest frame, its command is acknowledged by the backend, then one StepWorld.

Success comes from the camera image alone (``iws_reference_robot.scoring.PixelScorer``, the same
function on both backends): an episode succeeds when any of its frames is scored a success (the
Diffusion Policy push-T convention of maximum coverage), up to the frame where the object was lost:
not found in ``LOST_FRAMES`` frames in a row. On the reference robot that is rare (no T unfound in
4,000 frames of 20 expert episodes; 1 of 200 policy episodes on 2026-12-03); a world model that
smeared the T away under a policy's commands was seen to paint it back later at the goal, which is
no success. On the reference robot the ground truth
(TaskState) is reported beside it. The rate has a Wilson 95 % interval. Writes ``OUT/evaluation.json``
and MP4s of the first ``--videos`` episodes.

Nothing finished is lost: each episode is appended to ``OUT/episodes.jsonl`` as it ends, under a
first line that names the evaluation (policy and model weights, backend, seed, steps, horizon,
scorer). A run that fails or is interrupted is continued by the same command with the same
``--out``: it starts at the first episode the file does not hold. A file of another evaluation is
replaced.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from iws_common.profile import default_model_dir

os.environ.setdefault("MUJOCO_GL", "egl")

LOST_FRAMES = 5  # the object unfound this many frames in a row (0.5 s at 10 Hz): lost from then on


class EvaluationError(RuntimeError):
    pass


def best_score_before_loss(scores: list[float], found: list[bool], lost_frames: int = LOST_FRAMES) -> tuple[float, int | None]:
    """The best score of an episode's frames before the object was lost, and the frame where the
    loss began (None: never lost). Frames from the loss on do not count."""
    missing, lost_at = 0, None
    for t, seen in enumerate(found):
        missing = 0 if seen else missing + 1
        if missing >= lost_frames:
            lost_at = t - lost_frames + 1
            break
    valid = scores if lost_at is None else scores[:lost_at]
    return (float(max(valid)) if valid else 0.0), lost_at


PROGRESS_FILE = "episodes.jsonl"
# How a learnt policy read its joints, part of an evaluation's identity: as they came (results
# without the key), or some read at the middle of their range (--mask-joint, an ablation). Runs of
# 2026-12-07 with every joint clamped and the wrist so read name "clamped to the trained range".
AS_READ = "as read"


def joint_inputs(mask_joints: tuple[str, ...] = ()) -> str:
    return AS_READ if not mask_joints else "read at the middle of the trained range: " + ", ".join(sorted(mask_joints))


def mean_outside_range(rows: list[dict]) -> list[float] | None:
    """Per joint, the share of frames a learnt policy read it outside its trained range (None: a scripted policy)."""
    shares = [r["joints_outside_range"] for r in rows if "joints_outside_range" in r]
    return [round(float(x), 4) for x in np.mean(shares, axis=0)] if shares else None


def load_progress(path: Path, identity: dict) -> list[dict]:
    """The episodes an earlier run of the same evaluation finished, in order. A file of another
    evaluation, or none, gives none; a last line cut off by a failure is dropped."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    try:
        if not lines or json.loads(lines[0]) != {"evaluation": identity}:
            return []
    except ValueError:
        return []
    rows = []
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except ValueError:
            break
        if not isinstance(row, dict) or row.get("episode") != len(rows):
            break
        rows.append(row)
    return rows


def policy_weights(policy: str) -> str | None:
    """The digest of a checkpoint directory's weights (None: a scripted policy such as the expert)."""
    from iws_world_model.checkpoint import WEIGHTS, weights_digest
    return weights_digest(policy) if (Path(policy) / WEIGHTS).is_file() else None


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


class BackendSession:
    """A lockstep backend in its own process and this process as its client."""

    def __init__(self, backend: str, robot: str, model: str | None, log_dir: Path):
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float64MultiArray

        from iws_bringup.backends import get_backend, node_parameters, ros_arguments
        from iws_common import qos
        from iws_common.client import RosClient
        from iws_common.processes import DomainLease, NodeProcess
        from iws_common.profile import load_profile
        from iws_interfaces.msg import TaskState

        self.backend = backend
        self.profile = load_profile(robot)
        spec = get_backend(backend)
        overrides = {"mode": "lockstep", "threads": 1}
        if backend == "world_model" and model:
            overrides["model"] = str(model)
        params = node_parameters(spec, robot, overrides)
        self.lease = DomainLease()  # an experiment starts a session per policy and backend: released in close()
        domain = self.lease.domain_id
        self.node = NodeProcess([sys.executable, "-m", spec.entry_point.split(":")[0]] + ros_arguments(params),
                                domain, log_dir / f"{backend}.log")
        self.client = RosClient(domain, name="iws_evaluate")
        topics = self.profile.topics
        self.images = self.client.collect(Image, topics.image, qos.IMAGE_LOSSLESS)
        self.joints = self.client.collect(JointState, topics.joint_states)
        self.task_states = self.client.collect(TaskState, topics.task_state)
        self.command = self.client.publisher(Float64MultiArray, topics.position_command)
        self._command_type = Float64MultiArray
        self._step_client = None
        self.commands_sent = 0  # since the last reset: each step waits until the backend has them all

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.images:
            if not self.node.alive():
                raise EvaluationError(f"{self.backend} exited with {self.node.proc.returncode}:\n{self.node.output()[-2000:]}")
            if time.monotonic() > deadline:
                raise EvaluationError(f"no image from {self.backend} within {timeout:.0f} s")
            time.sleep(0.05)
        self.client.wait_for_subscribers(self.command)

    def latest(self, stamp_ns: int | None = None, timeout: float = 30.0):
        """The newest image and the joint state of the same stamp (waiting for ``stamp_ns``)."""
        from iws_common.image_conversion import image_to_numpy
        from iws_common.messages import stamp_ns as to_ns

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.images and (stamp_ns is None or to_ns(self.images[-1].header.stamp) >= stamp_ns):
                image = self.images[-1]
                stamp = to_ns(image.header.stamp)
                joints = [j for j in list(self.joints)[-5:] if to_ns(j.header.stamp) == stamp]
                if joints:
                    by_name = dict(zip(joints[-1].name, joints[-1].position))
                    q = np.array([by_name[n] for n in self.profile.joints.names])
                    del self.images[:-2], self.joints[:-5]
                    return stamp, image_to_numpy(image), q
            if not self.node.alive():
                raise EvaluationError(f"{self.backend} died:\n{self.node.output()[-2000:]}")
            time.sleep(0.002)
        raise EvaluationError(f"no frame (stamp {stamp_ns}) from {self.backend} within {timeout:.0f} s")

    def send(self, command: np.ndarray) -> None:
        self.command.publish(self._command_type(data=[float(v) for v in command]))
        self.commands_sent += 1

    def step(self) -> int:
        """One step, once the backend has every command sent since the reset (commands travel on
        their own topic and could arrive after the step: a rerun would then not replay the run)."""
        from iws_common.commands import CommandsInFlight, step_when_commands_arrive
        from iws_common.messages import stamp_ns as to_ns
        from iws_interfaces.srv import StepWorld

        if self._step_client is None:  # one client for the whole evaluation: discovery takes a while
            self._step_client = self.client.node.create_client(StepWorld, self.profile.services.step)
            if not self._step_client.wait_for_service(timeout_sec=30):
                raise EvaluationError(f"{self.profile.services.step} not available")
        request = StepWorld.Request(num_steps=1, min_commands_since_reset=self.commands_sent)

        def ask():  # one call, watching the backend's process: a dead node answers nothing
            future = self._step_client.call_async(request)
            deadline = time.monotonic() + 30
            while not future.done():
                if time.monotonic() > deadline or not self.node.alive():
                    raise EvaluationError(f"StepWorld unanswered:\n{self.node.output()[-2000:]}")
                time.sleep(0.0005)
            return future.result()

        try:
            response = step_when_commands_arrive(ask, self.commands_sent)
        except CommandsInFlight as exc:
            raise EvaluationError(f"{self.backend} {exc}") from exc
        if not response.success:
            raise EvaluationError(f"StepWorld refused: {response.message}")
        return to_ns(response.sim_time)

    def reset(self, seed: int, window: dict | None) -> int:
        from sensor_msgs.msg import JointState

        from iws_common.image_conversion import numpy_to_image
        from iws_common.messages import stamp_ns as to_ns
        from iws_interfaces.srv import ResetWorld

        request = ResetWorld.Request(seed=seed)
        if window is not None:
            names = list(self.profile.joints.names)
            request.images = [numpy_to_image(img, "rgb8") for img in window["images"]]
            request.joint_states = [JointState(name=names, position=[float(v) for v in q]) for q in window["joint_positions"]]
        response = self.client.call(ResetWorld, self.profile.services.reset, request)
        if not response.success:
            raise EvaluationError(f"ResetWorld refused: {response.message}")
        self.commands_sent = 0
        return to_ns(response.first_frame_stamp)

    def close(self) -> None:
        self.client.close()
        self.node.stop()
        self.lease.release()


def evaluate(policy: str, backend: str, episodes: int, steps: int = 200, seed: int = 10_000, robot: str = "reference_arm",
             model: str | None = None, videos: int = 0, out: Path | None = None, progress: bool = True,
             threads: int = 1, action_horizon: int | None = None, mask_joints: tuple[str, ...] = ()) -> dict:
    import torch
    from tqdm import tqdm

    from iws_data.video import write_mp4
    from iws_policy.node import make_runner
    from iws_reference_robot.scoring import PixelScorer
    from iws_reference_robot.sim import ReferenceSim, start_window

    torch.set_num_threads(threads)  # the backend process needs the other core
    from iws_common.profile import load_profile
    profile = load_profile(robot)
    # A bad checkpoint or horizon fails here, before a backend starts.
    horizon = getattr(make_runner(policy, profile, action_horizon=action_horizon, mask_joints=mask_joints),
                      "action_horizon", None)
    # Digest before the run: the weights this evaluation judges by (and a missing model fails now).
    weights = model_weights(model) if backend == "world_model" else None
    out = Path(out or tempfile.mkdtemp(prefix="iws_evaluate_"))
    out.mkdir(parents=True, exist_ok=True)
    scorer = PixelScorer(profile)
    identity = {"policy": policy, "policy_weights": policy_weights(policy), "backend": backend, "robot": robot,
                "model_weights": weights, "steps": steps, "seed": seed, "action_horizon": horizon,
                "scorer": scorer.identity, "lost_frames_rule": LOST_FRAMES,  # the rows' verdicts depend on both
                "joint_inputs": joint_inputs(mask_joints)}
    progress_path = out / PROGRESS_FILE
    done = load_progress(progress_path, identity)
    with open(progress_path, "w") as f:  # rewritten: drops another evaluation's file and a cut-off last line
        f.write(json.dumps({"evaluation": identity}) + "\n" + "".join(json.dumps(r) + "\n" for r in done))
    rows = done[:episodes]  # a rerun with fewer episodes reads the first ones and keeps the rest in the file
    resumed, earlier_seconds = len(rows), sum(r.get("seconds", 0.0) for r in rows)
    if resumed and progress:
        print(f"iws evaluate: continuing after the {resumed} episodes already in {progress_path}", file=sys.stderr)
    started = time.perf_counter()
    # Nothing left to run: no backend is started (a world model takes half a minute to load).
    session = BackendSession(backend, robot, model, out) if resumed < episodes else None
    scene, window_frames = None, None
    try:
        if session is not None:
            scene = ReferenceSim(profile, task="push_t", seed=seed) if backend == "world_model" else None
            session.wait_ready()
        if scene is not None:
            from iws_world_model.checkpoint import read_meta
            window_frames = int(read_meta(model or default_model_dir())["model"]["window"])
        for k in tqdm(range(resumed, episodes), desc=f"evaluate on {backend}", disable=not progress,
                      dynamic_ncols=True, initial=resumed, total=episodes):
            episode_started = time.perf_counter()
            episode_seed = seed + k
            runner = make_runner(policy, profile, seed=episode_seed, action_horizon=action_horizon, mask_joints=mask_joints)
            window = start_window(scene, episode_seed, window_frames) if scene is not None else None
            stamp = session.reset(episode_seed, window)
            frames, scores, found, fits, truth = [], [], [], [], []
            session.task_states.clear()
            for t in range(steps + 1):
                stamp, image, joints = session.latest(stamp)
                frames.append(image) if k < videos else None
                verdict = scorer(image)
                scores.append(verdict.score)
                found.append(verdict.found)
                fits.append(verdict.fit)
                if t == steps:
                    break
                command = runner.act(image, joints)
                if command is not None:
                    session.send(command)
                stamp = session.step()
            if backend == "reference":
                truth = [s.score for s in list(session.task_states)]
            if hasattr(runner, "close"):
                runner.close()
            best, lost_at = best_score_before_loss(scores, found)
            row = {"episode": k, "seed": episode_seed, "pixel_best_score": best, "pixel_final_score": float(scores[-1]),
                   "pixel_best_score_any_frame": float(max(scores)), "object_lost_at": lost_at,
                   "success": best >= scorer.threshold,
                   "pixel_scores": [round(float(x), 4) for x in scores],  # per frame: other verdict rules can be replayed
                   "pixel_fits": [round(float(x), 3) for x in fits]}  # how T-like the object is drawn (1: exactly)
            if getattr(runner, "frames", 0):  # a learnt policy: how often each joint read outside its trained range
                row["joints_outside_range"] = [round(float(n) / runner.frames, 4) for n in runner.frames_outside]
            if truth:
                row.update(truth_best_score=float(max(truth)), truth_success=bool(max(truth) >= scorer.task_threshold),
                           truth_scores=[round(float(x), 4) for x in truth])
            if k < videos:
                write_mp4(frames, out / f"episode_{k:03d}.mp4", fps=profile.control_rate_hz, upscale=3)
            row["seconds"] = round(time.perf_counter() - episode_started, 2)
            rows.append(row)
            with open(progress_path, "a") as f:
                f.write(json.dumps(row) + "\n")
    finally:
        if session is not None:
            session.close()
        if scene is not None:
            scene.close()
    successes = sum(r["success"] for r in rows)
    low, high = wilson_interval(successes, len(rows))
    result = {"policy": policy, "policy_weights": identity["policy_weights"], "backend": backend,
              "model": model if backend == "world_model" else None, "model_weights": weights,
              "episodes": len(rows), "steps": steps, "seed": seed, "action_horizon": horizon,
              "success_rate": successes / max(len(rows), 1),
              "ci95": [low, high], "lost_frames_rule": LOST_FRAMES, "scorer": scorer.identity,
              "joint_inputs": identity["joint_inputs"], "joints_outside_range": mean_outside_range(rows),
              "object_lost_rate": sum(r["object_lost_at"] is not None for r in rows) / max(len(rows), 1),
              "success_rate_ignoring_loss": sum(r["pixel_best_score_any_frame"] >= scorer.threshold for r in rows) / max(len(rows), 1),
              "seconds": earlier_seconds + time.perf_counter() - started, "resumed_episodes": resumed,
              "out": str(out), "per_episode": rows}
    if backend == "reference":
        result["truth_success_rate"] = sum(r.get("truth_success", False) for r in rows) / max(len(rows), 1)
        result["scorer_agreement"] = float(np.mean([r["success"] == r.get("truth_success") for r in rows])) if rows else None
    (out / "evaluation.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the backend node this process started is stopped too."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def model_weights(model: str | None) -> str:
    """The digest of the world model an evaluation ran (None: the shipped default), with the
    inference settings its config changes (`model_identity`)."""
    from iws_world_model.checkpoint import model_identity
    return model_identity(model or default_model_dir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", required=True,
                        help="policy checkpoint directory, or 'expert[:noise=STD][,speed=FRACTION]' (the pixel "
                             "expert; noise adds Gaussian noise of STD rad to its commands, speed scales its "
                             "largest pusher step)")
    parser.add_argument("--backend", choices=("reference", "world_model"), required=True)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=10_000, help="episode k starts from seed + k on either backend")
    parser.add_argument("--model", help="world model checkpoint (default: the shipped models/push_t)")
    parser.add_argument("--robot", default="reference_arm")
    parser.add_argument("--videos", type=int, default=0, help="MP4s of the first N episodes")
    parser.add_argument("--action-horizon", type=int, help="commands executed per predicted chunk (default: the checkpoint's)")
    parser.add_argument("--mask-joint", action="append", default=[], metavar="NAME",
                        help="read this joint at the middle of the policy's trained range, whatever it reads (an "
                             "ablation: does the policy act on it?); repeatable")
    parser.add_argument("--out", type=Path, help="directory for evaluation.json, videos and logs; the same command continues a run "
                             "that stopped early there (episodes.jsonl)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.steps < 1:
        parser.error("--episodes and --steps must be positive")
    from iws_policy.diffusion import PolicyCheckpointError
    from iws_world_model.checkpoint import CheckpointError
    stop_on_sigterm()
    try:
        result = evaluate(args.policy, args.backend, args.episodes, args.steps, args.seed, args.robot, args.model,
                          args.videos, args.out, progress=not args.json, action_horizon=args.action_horizon,
                          mask_joints=tuple(args.mask_joint))
    except (EvaluationError, PolicyCheckpointError, CheckpointError, ValueError) as exc:
        print(f"iws evaluate: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("iws evaluate: interrupted", file=sys.stderr)
        return 130
    summary = {k: v for k, v in result.items() if k != "per_episode"}
    if not args.json:
        print(f"{args.policy} on {args.backend}: success {result['success_rate']:.2f} "
              f"(95% CI {result['ci95'][0]:.2f}-{result['ci95'][1]:.2f}) over {result['episodes']} episodes "
              f"in {result['seconds']:.0f} s; {result['out']}/evaluation.json")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
