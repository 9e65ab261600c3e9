"""The `iws` command line: one console script that dispatches to the module owning each command.

Each command lives next to the code it runs and exposes ``main(argv)``; this module only maps
words to modules and imports the chosen one lazily, so `iws record` never pays for torch.
"""
from __future__ import annotations

import importlib
import sys

# (words...) -> "module:function". Longest match wins.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("up",): ("iws_bringup.up:main", "start a backend on a robot profile's topics (reference, world_model, ab)"),
    ("env",): ("iws_bringup.up:env_main", "print the exports that put this shell's nodes on the simulator's ROS domain"),
    ("demo",): ("iws_bringup.demo:main", "the main job: drive a simulated arm through ROS, record a bag and a video"),
    ("compare",): ("iws_bringup.compare:main", "A/B video real | sim | difference with per-frame error (after `iws up ab`)"),
    ("teleop",): ("iws_reference_robot.teleop:main", "keyboard teleop of the pusher from a terminal, with episode start/save/discard"),
    ("bench", "fuzz"): ("iws_bringup.fuzz:main", "malformed input on every topic and service of both simulator backends"),
    ("bench", "reference"): ("iws_reference_robot.bench:main", "lockstep steps/s of the reference robot incl. render and publish"),
    ("record",): ("iws_data.recorder:main", "record a robot profile's topics to rosbag2 (MCAP)"),
    ("collect",): ("iws_policy.synthetic:collect_main", "collect play data / demonstrations as rosbag2 episodes (--backend reference | world_model)"),
    ("evaluate",): ("iws_policy.evaluate:main", "a policy's success rate on the reference robot or the world model, through ROS"),
    ("experiment",): ("iws_policy.experiments:main", "policy experiments: datamix (real vs world-model demos), correlation (sim vs real success)"),
    ("policy", "train"): ("iws_policy.train:main", "train a Diffusion Policy on datasets (real, world-model or mixed demos)"),
    ("bag", "repair"): ("iws_data.repair:main", "recover a killed or truncated recording into a valid rosbag2 bag"),
    ("bench", "collect"): ("iws_data.bench:collect_main", "frames/s of lockstep data collection"),
    ("bench", "dataset"): ("iws_data.bench:dataset_main", "frames/s of the dataset builder"),
    ("dataset", "build"): ("iws_data.builder:main", "build a cached dataset from rosbag2 recordings"),
    ("dataset", "info"): ("iws_data.info:info_main", "summarise a cached dataset"),
    ("dataset", "preview"): ("iws_data.info:preview_main", "write an MP4 of one episode with actions overlaid"),
    ("train",): ("iws_world_model.train:main", "train a world model from a cached dataset"),
    ("eval", "openloop"): ("iws_world_model.evaluate:openloop_main", "open-loop fidelity on held-out episodes"),
    ("eval", "longrun"): ("iws_world_model.evaluate:longrun_main", "closed-loop long-horizon stability"),
    ("eval", "rest"): ("iws_world_model.rest:main", "does the model keep an untouched T still while the arm holds?"),
    ("eval", "paired"): ("iws_world_model.paired:main", "two open-loop reports paired episode by episode (difference and its standard error)"),
    ("eval", "scorer"): ("iws_reference_robot.scoring:main", "validate the pixel success scorer against reference-robot ground truth"),
    ("bench", "step"): ("iws_world_model.bench:main", "world-model step FPS and latency"),
    ("bench", "node"): ("iws_world_model_ros.bench:node_main", "world model node under a live policy: rate, command-to-image latency"),
    ("bench", "soak"): ("iws_world_model_ros.bench:soak_main", "the same policy loop for minutes: rate per minute, latency, node memory, errors"),
}


def _usage() -> str:
    lines = ["usage: iws COMMAND [ARGS...]", "", "commands:"]
    for words, (_, help_text) in COMMANDS.items():
        lines.append(f"  {' '.join(words):<18} {help_text}")
    lines.append("\n`iws COMMAND --help` for the arguments of one command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for n in (2, 1):
        key = tuple(argv[:n])
        if len(key) == n and key in COMMANDS:
            target, _ = COMMANDS[key]
            module_name, func_name = target.split(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name and module_name.startswith(exc.name):
                    print(f"iws {' '.join(key)}: not available in this installation ({exc})", file=sys.stderr)
                    return 2
                raise
            result = getattr(module, func_name)(argv[n:])
            return int(result or 0)
    print(_usage(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
    return 0 if argv and argv[0] in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
