#!/usr/bin/env python3
"""Pack a cached dataset (`iws dataset build`) small enough to carry to a lent GPU machine, and unpack it there.

Rendered frames are flat colours: xz shrinks push_t's 3.3 GB of images about 190x. The image array
is cut into byte parts that are compressed and restored in parallel; every other file is copied.

    python3 tools/dataset_xz.py pack data/push_t_dataset .gpu/push_t_dataset --jobs 2
    python3 tools/dataset_xz.py unpack .gpu/push_t_dataset /tmp/push_t_dataset --jobs 16
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

IMAGES = "images.npy"
MANIFEST = "parts.json"


def _compress(args) -> int:
    source, offset, size, target = args
    with open(source, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    Path(target).write_bytes(lzma.compress(data, preset=6))
    return size


def _restore(args) -> int:
    part, offset, target = args
    data = lzma.decompress(Path(part).read_bytes())
    with open(target, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return len(data)


def pack(source: Path, target: Path, parts: int, jobs: int) -> None:
    if not (source / IMAGES).is_file():
        raise SystemExit(f"{source}: no {IMAGES}; is it a dataset directory (iws dataset build)?")
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != IMAGES:
            shutil.copy2(path, target / path.name)
    total = (source / IMAGES).stat().st_size
    step = -(-total // parts)
    chunks = [(str(source / IMAGES), o, min(step, total - o), str(target / f"images.{i:02d}.xz"))
              for i, o in enumerate(range(0, total, step))]
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(_compress, chunks))
    (target / MANIFEST).write_text(json.dumps({"bytes": total, "parts": [[Path(c[3]).name, c[1]] for c in chunks]}))
    packed = sum(p.stat().st_size for p in target.iterdir())
    print(f"{source} -> {target}: {total / 1e6:.0f} MB of images in {len(chunks)} parts, {packed / 1e6:.1f} MB in all")


def unpack(source: Path, target: Path, jobs: int) -> None:
    manifest = json.loads((source / MANIFEST).read_text())
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != MANIFEST and not path.name.endswith(".xz"):
            shutil.copy2(path, target / path.name)
    with open(target / IMAGES, "wb") as f:
        f.truncate(manifest["bytes"])
    with ProcessPoolExecutor(jobs) as pool:
        restored = sum(pool.map(_restore, [(str(source / name), offset, str(target / IMAGES))
                                           for name, offset in manifest["parts"]]))
    if restored != manifest["bytes"]:
        raise SystemExit(f"{source}: restored {restored} of {manifest['bytes']} bytes")
    print(f"{source} -> {target}: {restored / 1e6:.0f} MB of images")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("pack", "unpack"))
    p.add_argument("source", type=Path)
    p.add_argument("target", type=Path)
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    args = p.parse_args(argv)
    if args.action == "pack":
        pack(args.source, args.target, args.parts, args.jobs)
    else:
        unpack(args.source, args.target, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
