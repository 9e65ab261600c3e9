"""Faults in recording: a recorder killed with SIGKILL, and a recorder whose disk fills up.

Both record a live publisher in another process (the harness of test_data_recorder.py). The bar:
every message that the recorder flushed before the kill is recovered by `iws bag repair` (the
publisher stops first and the test waits longer than the flush interval, so that is every message
sent), and a full disk gives one clear error line, a non-zero exit and a bag that is readable,
directly or after repair.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_data_recorder import PUBLISHER, kill_group, ros_env, start

from iws_data.bags import FLUSH_INTERVAL_S, BagReader
from iws_data.repair import repair_bag
from process_harness import wait_for_line
from ros_harness import next_domain_id

IWS = [sys.executable, "-m", "iws_bringup.cli"]


def record_publisher(tmp_path: Path, recorder_prefix: list[str], seconds: float, bag_parent: Path | None = None):
    """Start a recorder and the publisher, publish for ``seconds``, stop the publisher; returns
    (recorder process, its log, messages sent per topic, bag path) with the recorder still running."""
    env = ros_env(next_domain_id())
    bag = (bag_parent or tmp_path) / "bag"
    recorder_log, publisher_log = tmp_path / "recorder.log", tmp_path / "publisher.log"
    recorder = start(recorder_prefix + ["record", "--robot", "reference_arm", "--out", str(bag)], env, recorder_log)
    (tmp_path / "publisher.py").write_text(PUBLISHER)
    publisher = start([sys.executable, str(tmp_path / "publisher.py")], env, publisher_log)
    try:
        wait_for_line(recorder_log, "recording", recorder, 30)
        wait_for_line(publisher_log, "READY", publisher, 30)
        time.sleep(seconds)
        publisher.send_signal(signal.SIGINT)
        publisher.wait(15)
        sent = json.loads(publisher_log.read_text().strip().splitlines()[-1])
    except BaseException:
        kill_group(recorder)
        raise
    finally:
        kill_group(publisher)
    return recorder, recorder_log, sent, bag


def test_sigkill_mid_episode_then_repair_recovers_every_flushed_message(tmp_path):
    recorder, log, sent, bag = record_publisher(tmp_path, IWS, 2.0)
    try:
        time.sleep(FLUSH_INTERVAL_S + 1.0)  # past the recorder's last flush
        assert recorder.poll() is None, log.read_text()
    finally:
        kill_group(recorder)  # SIGKILL: no index, no metadata.yaml
    assert recorder.returncode == -signal.SIGKILL
    assert not (bag / "metadata.yaml").exists()

    fixed = tmp_path / "fixed"
    result = subprocess.run(IWS + ["bag", "repair", str(bag), "--out", str(fixed)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "recovered" in result.stdout and "dropped at the tail" in result.stdout, result.stdout

    with BagReader(fixed) as reader:
        counts = {topic: reader.count(topic) for topic in sent}
        read_back = sum(1 for _ in reader.messages(sent))
        image_topic = next(t for t in sent if "image" in t)
        _, _, data = next(reader.messages([image_topic]))
        image = reader.decode(data, "sensor_msgs/msg/Image")
    assert all(n > 10 for topic, n in sent.items() if topic != "/iws/episode_events"), sent
    assert counts == sent, f"repaired {counts} != sent {sent}\n{result.stdout}\n{log.read_text()}"
    assert read_back == sum(sent.values())
    assert (image.width, image.height, image.encoding) == (96, 96, "rgb8")
    assert "repaired_by" in (fixed / "metadata.yaml").read_text()

    # The repaired recording is a normal bag: the builder turns it into an episode.
    from iws_data.builder import build_dataset

    dataset, report = build_dataset([fixed], tmp_path / "dataset", size=32, val_fraction=0.0, progress=False)
    assert report.episodes == 1 and report.frames > 10, report.summary()


def test_repair_refuses_what_is_not_mcap_and_regenerates_missing_metadata(tmp_path):
    not_a_bag = tmp_path / "junk"
    not_a_bag.mkdir()
    (not_a_bag / "junk.mcap").write_bytes(b"PK\x03\x04 this is a zip file")
    result = subprocess.run(IWS + ["bag", "repair", str(not_a_bag)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "junk.mcap: not an MCAP file" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "junk_repaired").exists()

    from iws_common.profile import load_profile
    from iws_data.bags import BagWriter

    profile = load_profile("reference_arm")
    with BagWriter(tmp_path / "whole", profile, ["joint_states", "position_command"],
                   custom_data={"profile": profile.name}) as writer:
        for i in range(50):
            writer.write(profile.topics.position_command, b"\x00\x01\x00\x00" + bytes(12), 1_000 + i)
    (tmp_path / "whole" / "metadata.yaml").unlink()  # e.g. only the .mcap was copied
    report = repair_bag(tmp_path / "whole")
    assert report.complete and report.dropped_bytes == 0
    with BagReader(tmp_path / "whole_repaired") as reader:
        assert reader.count(profile.topics.position_command) == 50
        assert set(reader.topics) == {profile.topics.joint_states, profile.topics.position_command}
    assert "profile: reference_arm" in (tmp_path / "whole_repaired" / "metadata.yaml").read_text()


# A file size limit stands in for a full disk: writes past it fail with EFBIG (SIGXFSZ ignored),
# without root or a mount, and the recorder must treat it like ENOSPC.
FILE_LIMIT = 400_000
LIMITED = [sys.executable, "-c",
           "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           f"resource.setrlimit(resource.RLIMIT_FSIZE, ({FILE_LIMIT}, {FILE_LIMIT})); "
           "from iws_bringup.cli import main; sys.exit(main(sys.argv[1:]))"]


@pytest.fixture(params=["file_size_limit", "tmpfs"])
def full_disk(request, tmp_path):
    """(recorder command prefix, bag parent): a file size limit everywhere; a real ENOSPC on a
    small tmpfs where mounting is allowed (root with CAP_SYS_ADMIN), else skipped."""
    if request.param == "file_size_limit":
        yield LIMITED, tmp_path
        return
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FILE_LIMIT}", "tmpfs", str(mount_point)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        yield IWS, mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_disk_full_stops_with_a_clear_error_and_a_readable_bag(tmp_path, full_disk):
    prefix, bag_parent = full_disk
    recorder, log, sent, bag = record_publisher(tmp_path, prefix, 2.0, bag_parent)  # ~1 MB of images: past the limit
    try:
        code = recorder.wait(20)
    finally:
        kill_group(recorder)
    output = log.read_text()
    assert code == 1, output
    assert "Traceback" not in output, output
    match = re.search(r"iws record: error: (\S+\.mcap): write failed: .*stopped recording after (\d+) messages written",
                      output)
    assert match, output
    assert Path(match[1]) == bag / "bag.mcap"
    written = int(match[2])
    assert 0 < written < sum(sent.values())

    if "was closed and is readable" in output:
        readable = bag
    else:
        assert f"iws bag repair {bag}" in output, output
        readable = repair_bag(bag, tmp_path / "repaired").out
    with BagReader(readable) as reader:
        assert reader.message_count == written
        assert sum(1 for _ in reader.messages(sent)) == written
    assert (bag / "bag.mcap").stat().st_size <= FILE_LIMIT


def test_write_failure_at_close_leaves_a_repairable_prefix(tmp_path, monkeypatch):
    """When even the index cannot be written, the file is cut back to the last flush and the error
    says to repair; repair recovers every message written."""
    import errno

    from rosbags.rosbag2.storage_mcap import McapWriter

    from iws_common.profile import load_profile
    from iws_data.bags import BagWriteError, BagWriter

    profile = load_profile("reference_arm")
    writer = BagWriter(tmp_path / "bag", profile, ["position_command"], flush_interval_s=None)
    for i in range(40):
        writer.write(profile.topics.position_command, b"\x00\x01\x00\x00" + bytes(12), 1_000 + i)
        if i == 19:
            writer.flush()

    def disk_full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(McapWriter, "close", disk_full)
    with pytest.raises(BagWriteError) as failure:
        writer.close()
    error = failure.value
    assert not error.readable and error.written == 40 and error.lost == 0, str(error)
    assert str(error).startswith(f"{tmp_path / 'bag' / 'bag.mcap'}: write failed: No space left on device")
    assert f"iws bag repair {tmp_path / 'bag'}" in str(error)
    monkeypatch.undo()
    report = repair_bag(tmp_path / "bag")
    assert report.counts == {profile.topics.position_command: 40} and report.dropped_bytes == 0
