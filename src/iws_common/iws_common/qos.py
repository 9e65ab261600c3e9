"""QoS presets, one per kind of stream, so that every backend offers the same profiles.

Publishers offer RELIABLE, like realsense2_camera and ros2_control's joint_state_broadcaster by
default, so that both reliable and best-effort subscribers connect. Images keep depth 1 so that a
slow subscriber never receives stale frames; commands and states keep a short queue.
"""
from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

# Offered by publishers of camera images and camera_info. Depth 1: never queue stale frames.
IMAGE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                   reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
# Used by subscribers of images: best effort connects to both reliable and best-effort publishers.
IMAGE_SUBSCRIBER = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                              reliability=ReliabilityPolicy.BEST_EFFORT, durability=DurabilityPolicy.VOLATILE)
STATE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                   reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
COMMAND = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                     reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
CLOCK = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                   reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
# Episode events must not be missed by a recorder that starts late: latched.
EVENTS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=20,
                    reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
