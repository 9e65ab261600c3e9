"""H.264 MP4 from RGB frames (PyAV), for dataset previews, the demo and A/B comparisons."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np


def write_mp4(frames: Iterable[np.ndarray], out: str | Path, fps: float, upscale: int = 1) -> int:
    """Write uint8 (H, W, 3) frames; returns how many were written. Sizes are made even for yuv420p."""
    import av

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=max(1, int(round(fps))))
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18"}
        for frame in frames:
            if upscale > 1:
                frame = np.repeat(np.repeat(frame, upscale, axis=0), upscale, axis=1)
            h, w = frame.shape[0] // 2 * 2, frame.shape[1] // 2 * 2
            frame = np.ascontiguousarray(frame[:h, :w])
            if count == 0:
                stream.height, stream.width = h, w
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
            count += 1
        for packet in stream.encode():
            container.mux(packet)
    return count
