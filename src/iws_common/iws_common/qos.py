"""QoS presets, one per kind of stream, so that every backend offers the same profiles.

Publishers offer RELIABLE, like realsense2_camera and ros2_control's joint_state_broadcaster by
default, so that both reliable and best-effort subscribers connect. Publishers keep a short queue so
that lockstep bursts (many steps inside one StepWorld call) reach lossless subscribers whole; a
live client that wants only the newest frame subscribes best effort with depth 1.
"""
from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

# Offered by publishers of camera images and camera_info.
IMAGE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                   reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
# Live image clients (policies, viewers): only the newest frame; connects to any publisher.
IMAGE_SUBSCRIBER = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                              reliability=ReliabilityPolicy.BEST_EFFORT, durability=DurabilityPolicy.VOLATILE)
# Lossless image clients (recorder, benchmarks, tests): every frame, also in lockstep bursts.
IMAGE_LOSSLESS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                            reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
STATE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100,
                   reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
COMMAND = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                     reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
CLOCK = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                   reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
# Episode events must not be missed by a recorder that starts late: latched.
EVENTS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=20,
                    reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
