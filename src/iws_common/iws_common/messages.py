"""Message builders every backend shares: stamps from integer nanoseconds, camera_info from a profile."""
from __future__ import annotations

from builtin_interfaces.msg import Time
from sensor_msgs.msg import CameraInfo

from iws_common.profile import CameraSpec


def time_msg(nanoseconds: int) -> Time:
    return Time(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def stamp_ns(stamp: Time) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def camera_info_msg(camera: CameraSpec, frame_id: str) -> CameraInfo:
    """A pinhole camera with no distortion, as realsense2_camera publishes for its colour stream."""
    info = CameraInfo()
    info.header.frame_id = frame_id
    info.width, info.height = camera.width, camera.height
    info.distortion_model = "plumb_bob"
    info.d = [0.0] * 5
    info.k = camera.intrinsics_matrix()
    info.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    info.p = [camera.fx, 0.0, camera.cx, 0.0, 0.0, camera.fy, camera.cy, 0.0, 0.0, 0.0, 1.0, 0.0]
    return info
