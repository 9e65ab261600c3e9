"""`iws record` against live publishers in other processes: nothing received before a signal is lost.

Each test runs the publisher and the recorder as subprocesses with hard timeouts on a private
ROS_DOMAIN_ID (the suite's 10..89, ros_harness.next_domain_id), stops the publisher first (it prints how many messages it sent), waits,
then signals the recorder and requires the bag to hold exactly what was sent.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from iws_common.processes import ros_env  # noqa: F401  (also used by test_data_faults)
from iws_common.profile import load_profile
from iws_data.bags import BagReader
from process_harness import wait_for_line
from ros_harness import next_domain_id

PROFILE = load_profile("reference_arm")

PUBLISHER = textwrap.dedent('''
    """Publishes a profile's image, joint states, commands and episode events at ~20 Hz until SIGINT,
    then prints the count it sent per topic as JSON."""
    import json, signal, sys, time
    import numpy as np
    import rclpy
    from rclpy.signals import SignalHandlerOptions
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64MultiArray
    from iws_interfaces.msg import EpisodeEvent
    from iws_common import qos
    from iws_common.image_conversion import numpy_to_image
    from iws_common.profile import load_profile

    stop = False
    def on_signal(*_):
        global stop
        stop = True
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    profile = load_profile("reference_arm")
    node = rclpy.create_node("test_publisher")
    topics = profile.topics
    pubs = {
        topics.image: node.create_publisher(Image, topics.image, qos.IMAGE),
        topics.joint_states: node.create_publisher(JointState, topics.joint_states, qos.STATE),
        topics.position_command: node.create_publisher(Float64MultiArray, topics.position_command, qos.COMMAND),
        topics.episode_events: node.create_publisher(EpisodeEvent, topics.episode_events, qos.EVENTS),
    }
    # Wait until the recorder has matched every publisher, so the count is exact.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not stop:
        if all(p.get_subscription_count() > 0 for p in pubs.values()):
            break
        time.sleep(0.05)
    else:
        print(json.dumps({"error": "recorder never subscribed"}), flush=True)
        sys.exit(3)
    # Best effort (the recorder's image QoS) drops samples sent before both sides finished matching.
    time.sleep(1.0)
    print("READY", flush=True)
    sent = {t: 0 for t in pubs}
    def publish(topic, msg):
        pubs[topic].publish(msg)
        sent[topic] += 1
    event = EpisodeEvent(event=EpisodeEvent.START, episode_index=0, task="push_t")
    publish(topics.episode_events, event)
    rng = np.random.default_rng(0)
    k = 0
    while not stop:
        now = node.get_clock().now().to_msg()
        image = numpy_to_image(rng.integers(0, 255, (96, 96, 3), dtype=np.uint8), "rgb8", stamp=now, frame_id="cam")
        publish(topics.image, image)
        js = JointState(name=list(profile.joints.names), position=[0.1 * k, 0.0, 0.0], velocity=[0.0] * 3)
        js.header.stamp = now
        publish(topics.joint_states, js)
        publish(topics.position_command, Float64MultiArray(data=[0.1 * k, 0.0, 0.0]))
        k += 1
        time.sleep(0.05)
    print(json.dumps(sent), flush=True)
    node.destroy_node()
    rclpy.shutdown()
''')


def start(args, env, log: Path) -> subprocess.Popen:
    with open(log, "w") as output:  # the child keeps its own descriptor
        return subprocess.Popen(args, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_recorder_signal_mid_episode_keeps_every_message(tmp_path, stop_signal):
    domain_id = next_domain_id()
    env = ros_env(domain_id)
    bag = tmp_path / "bag"
    recorder_log, publisher_log = tmp_path / "recorder.log", tmp_path / "publisher.log"
    recorder = start([sys.executable, "-m", "iws_bringup.cli", "record", "--robot", "reference_arm", "--out", str(bag)],
                     env, recorder_log)
    (tmp_path / "publisher.py").write_text(PUBLISHER)
    publisher = start([sys.executable, str(tmp_path / "publisher.py")], env, publisher_log)
    try:
        wait_for_line(recorder_log, "recording", recorder, 30)
        wait_for_line(publisher_log, "READY", publisher, 30)
        time.sleep(2.0)  # ~40 of each message, mid-episode (START sent, no END)
        publisher.send_signal(signal.SIGINT)
        publisher.wait(15)
        sent = json.loads(publisher_log.read_text().strip().splitlines()[-1])
        time.sleep(1.0)
        recorder.send_signal(stop_signal)
        assert recorder.wait(20) == 0, recorder_log.read_text()
    finally:
        kill_group(publisher)
        kill_group(recorder)

    assert (bag / "metadata.yaml").is_file(), recorder_log.read_text()
    with BagReader(bag) as reader:
        counts = {topic: reader.count(topic) for topic in sent}
        read_back = sum(1 for _ in reader.messages(sent))
    assert all(n > 10 for topic, n in sent.items() if topic != "/iws/episode_events"), sent
    assert counts == sent, f"bag {counts} != sent {sent}\n{recorder_log.read_text()}"
    assert read_back == sum(sent.values())
    # The raw bytes are valid messages: rclpy reads them back.
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import Image
    profile = load_profile("reference_arm")
    with BagReader(bag) as reader:
        _, _, data = next(reader.messages([profile.topics.image]))
    image = deserialize_message(bytes(data), Image)
    assert (image.width, image.height, image.encoding) == (96, 96, "rgb8")


def test_recorder_stamps_a_command_with_the_clock_in_force_when_it_was_published(tmp_path):
    """A headerless command gets the /clock tick last *published* before it: not the one before
    if the tick overtook it on the way (a command sent in answer to a lockstep step arriving before
    that step's /clock: it was one period early by arrival), nor the next one if its callback runs
    late. Without source timestamps the reception time stands in. A real /clock message over DDS
    must come with the source timestamp this relies on."""
    import rclpy
    from builtin_interfaces.msg import Time
    from rclpy.serialization import deserialize_message, serialize_message
    from rosgraph_msgs.msg import Clock
    from std_msgs.msg import Float64MultiArray

    from iws_common import qos
    from iws_data.recorder import Recorder

    rclpy.init(domain_id=next_domain_id())
    try:
        recorder = Recorder(PROFILE, tmp_path / "bag", ["position_command"], discovery_wait_s=0.0)
        tick = lambda sec, sent, received: recorder._on_clock(
            Clock(clock=Time(sec=sec)), {"source_timestamp": sent, "received_timestamp": received})
        write = recorder._writer_for(PROFILE.topics.position_command)
        command = lambda i: serialize_message(Float64MultiArray(data=[float(i), 0.0, 0.0]))
        tick(1, 100, 110)
        write(command(0), {"source_timestamp": 400, "received_timestamp": 450})  # sent after tick 2, arrived before it
        tick(2, 300, 500)
        write(command(1), {"source_timestamp": 350, "received_timestamp": 900})  # sent after tick 2, callback after tick 3
        tick(3, 600, 610)
        write(command(2), {"source_timestamp": 0, "received_timestamp": 200})   # no source time: by arrival (tick 1)
        write(command(3), {"source_timestamp": 0, "received_timestamp": 0})     # no times at all: the clock now (tick 3)
        write(command(4), {"source_timestamp": 700, "received_timestamp": 710})  # no tick after it (paused robot) ...
        assert len(recorder.held) == 1
        recorder.HOLD_S = 0.0
        recorder.flush_if_due()                                                  # ... written after HOLD_S (tick 3)
        assert recorder.held == []
        publisher = recorder.node.create_publisher(Clock, PROFILE.topics.clock, qos.CLOCK)
        published_after = time.time_ns()
        publisher.publish(Clock(clock=Time(sec=7)))
        deadline = time.monotonic() + 10
        while recorder.sim_time_ns != 7_000_000_000 and time.monotonic() < deadline:
            rclpy.spin_once(recorder.node, timeout_sec=0.1)
        path = recorder.close()
        recorder.node.destroy_node()
    finally:
        rclpy.shutdown()
    assert recorder.clock_values_ns[-1] == 7_000_000_000
    # The DDS source timestamp (wall clock of the publishing host), not a fallback.
    assert published_after <= recorder.clock_published_ns[-1] < published_after + 5_000_000_000
    with BagReader(path) as bag:
        stamps = {int(deserialize_message(bytes(data), Float64MultiArray).data[0]): t
                  for _, t, data in bag.messages([PROFILE.topics.position_command])}
    assert stamps == {0: 2_000_000_000, 1: 2_000_000_000, 2: 1_000_000_000, 3: 3_000_000_000, 4: 3_000_000_000}
