"""`make demo`'s job, shortened: a backend in real time, the expert through ROS, a bag and a video."""
from __future__ import annotations

import subprocess
import sys

import pytest

from iws_common.profile import load_profile
from iws_data.bags import BagReader

PROFILE = load_profile("reference_arm")


def run_demo(tmp_path, *args) -> tuple[str, object]:
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "iws_bringup.cli", "demo", "--seconds", "5", "--out", str(out), *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout, out


@pytest.mark.parametrize("backend", ["reference", "world_model"])
def test_demo_records_a_bag_and_a_video(tmp_path, backend, tiny_world_model):
    extra = ["--model", str(tiny_world_model)] if backend == "world_model" else []
    stdout, out = run_demo(tmp_path, "--backend", backend, *extra)
    assert "achieved rate" in stdout and str(out / "bag") in stdout
    with BagReader(out / "bag") as bag:
        images = bag.count(PROFILE.topics.image)
        commands = bag.count(PROFILE.topics.position_command)
        assert bag.count(PROFILE.topics.joint_states) >= 30
        assert bag.count(PROFILE.topics.episode_events) == 2
    assert images >= 30, f"{images} images in 5 s at 10 Hz"
    if backend == "reference":  # the expert acts on what it sees (the tiny model's T may be unrecognisable)
        assert commands >= 10
    video = out / "camera.mp4"
    assert video.stat().st_size > 1000
    import av
    with av.open(str(video)) as container:
        assert sum(1 for _ in container.decode(video=0)) == images
