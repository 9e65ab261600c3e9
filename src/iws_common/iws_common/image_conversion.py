"""numpy <-> sensor_msgs/Image without cv_bridge (the PyPI cv_bridge is a broken ROS 1 port).

Supported encodings: rgb8, bgr8 (H x W x 3) and mono8 (H x W). ``step`` (bytes per row, which may
include padding) is honoured on the way in and written as ``width * channels`` on the way out.
"""
from __future__ import annotations

import numpy as np

CHANNELS = {"rgb8": 3, "bgr8": 3, "mono8": 1}


class ImageEncodingError(ValueError):
    """An image message or array does not match its declared encoding or size."""


def image_to_numpy(msg, want: str | None = "rgb8") -> np.ndarray:
    """Decode a sensor_msgs/Image into uint8 (H, W, 3) or (H, W); convert to ``want`` if given."""
    encoding = msg.encoding.lower()
    if encoding not in CHANNELS:
        raise ImageEncodingError(f"unsupported image encoding '{msg.encoding}' (supported: {sorted(CHANNELS)})")
    channels = CHANNELS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    row_bytes = width * channels
    if step < row_bytes:
        raise ImageEncodingError(f"image step {step} is smaller than width*channels = {row_bytes}")
    buffer = np.frombuffer(bytes(msg.data) if not isinstance(msg.data, (bytes, bytearray, memoryview, np.ndarray)) else msg.data,
                           dtype=np.uint8)
    if buffer.size < step * height:
        raise ImageEncodingError(f"image data has {buffer.size} bytes, expected step*height = {step * height}")
    rows = buffer[: step * height].reshape(height, step)[:, :row_bytes]
    array = rows.reshape(height, width, channels) if channels > 1 else rows.reshape(height, width)
    return convert_encoding(array, encoding, want) if want else np.ascontiguousarray(array)


def convert_encoding(array: np.ndarray, source: str, target: str) -> np.ndarray:
    """Convert between rgb8, bgr8 and mono8 (ITU-R 601 luma)."""
    if source == target:
        return np.ascontiguousarray(array)
    if source in ("rgb8", "bgr8") and target in ("rgb8", "bgr8"):
        return np.ascontiguousarray(array[..., ::-1])
    if target == "mono8":
        rgb = array if source == "rgb8" else array[..., ::-1]
        luma = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114
        return np.clip(np.rint(luma), 0, 255).astype(np.uint8)
    if source == "mono8":
        return np.ascontiguousarray(np.repeat(array[..., None], 3, axis=-1))
    raise ImageEncodingError(f"cannot convert {source} to {target}")


def numpy_to_image(array: np.ndarray, encoding: str = "rgb8", msg=None, stamp=None, frame_id: str = ""):
    """Encode a uint8 array as sensor_msgs/Image (``msg`` is reused if given, to avoid allocations)."""
    if encoding not in CHANNELS:
        raise ImageEncodingError(f"unsupported image encoding '{encoding}' (supported: {sorted(CHANNELS)})")
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise ImageEncodingError(f"image array must be uint8, got {array.dtype}")
    channels = CHANNELS[encoding]
    if (channels == 1 and array.ndim != 2) or (channels > 1 and (array.ndim != 3 or array.shape[2] != channels)):
        raise ImageEncodingError(f"array of shape {array.shape} does not fit encoding {encoding}")
    if msg is None:
        from sensor_msgs.msg import Image
        msg = Image()
    msg.height, msg.width = int(array.shape[0]), int(array.shape[1])
    msg.encoding = encoding
    msg.is_bigendian = 0
    msg.step = msg.width * channels
    msg.data = np.ascontiguousarray(array).tobytes()
    if stamp is not None:
        msg.header.stamp = stamp
    if frame_id:
        msg.header.frame_id = frame_id
    return msg
