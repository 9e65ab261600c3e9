"""`iws eval paired`: two open-loop reports, episode by episode.

One model run against another differs by a few degrees or tenths of a dB, and the episodes
differ among themselves by far more: a difference of means says little until it is paired. This
pairs the per-episode figures of two rows (two reports, or two rows of one) over the episodes both
hold, by episode number, and gives the mean difference with its standard error and how many
episodes moved each way. The docs quote these figures as "paired per episode ... SE". The means
are over episodes (each episode's mean over its steps), so they can differ a little from a report's
summary, which averages the per-step curve.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

# Figures where a larger value is better; every other per-episode figure is an error.
HIGHER_IS_BETTER = {"psnr", "ssim", "t_found_rate", "t_overlap", "pusher_found_rate"}


class PairingError(ValueError):
    pass


def load_report(path: str | Path) -> dict:
    """An openloop.json, or a directory holding one (an evaluation's --out)."""
    path = Path(path)
    if path.is_dir():
        path = path / "openloop.json"
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise PairingError(f"{path}: no such report") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PairingError(f"{path}: not a JSON report ({exc})") from None
    if not isinstance(report, dict) or "models" not in report or "episodes" not in report.get("protocol", {}):
        raise PairingError(f"{path}: not an `iws eval openloop` report (no protocol.episodes or models)")
    report["_path"] = str(path)
    return report


def _row(report: dict, name: str) -> dict:
    rows = report["models"]
    if name not in rows:
        raise PairingError(f"{report['_path']}: no row {name!r} (rows: {', '.join(rows)})")
    return rows[name]["per_episode"]


def paired(base: dict, other: dict, base_row: str = "world_model", other_row: str = "world_model") -> dict:
    """Per figure: both means over the shared episodes, the mean of other - base, its standard error,
    and in how many episodes ``other`` is better / worse. Episodes where either value is missing (a T
    never found) drop out of that figure."""
    for key in ("split", "effective_horizon", "dataset"):
        a, b = base["protocol"].get(key), other["protocol"].get(key)
        if a is not None and b is not None and a != b:
            raise PairingError(f"the reports differ in {key} ({a!r} against {b!r}): their episodes do not pair")
    # The first predicted frame (reports before --first-frame predicted from their window on).
    a, b = (report["protocol"].get("first_frame", report["protocol"].get("window")) for report in (base, other))
    if a is not None and b is not None and a != b:
        raise PairingError(f"the reports predict from different frames ({a} against {b}): pass the same "
                           "--first-frame to `iws eval openloop`")
    # episode number -> its position in each report, in the base report's order
    where_other = {e: i for i, e in enumerate(other["protocol"]["episodes"])}
    pairs = [(i, where_other[e]) for i, e in enumerate(base["protocol"]["episodes"]) if e in where_other]
    if not pairs:
        raise PairingError("the reports share no episode")
    a_rows, b_rows = _row(base, base_row), _row(other, other_row)
    a_index, b_index = zip(*pairs)
    figures = {}
    for key in a_rows:
        if key not in b_rows:
            continue
        a = np.array([a_rows[key][i] for i in a_index], dtype=float)  # None (JSON null) -> nan
        b = np.array([b_rows[key][i] for i in b_index], dtype=float)
        both = np.isfinite(a) & np.isfinite(b)
        d = b[both] - a[both]
        n = int(both.sum())
        sign = 1 if key in HIGHER_IS_BETTER else -1
        figures[key] = {
            "n": n, "base": float(a[both].mean()) if n else None, "other": float(b[both].mean()) if n else None,
            "difference": float(d.mean()) if n else None,
            "standard_error": float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else None,
            "other_better": int((sign * d > 0).sum()), "other_worse": int((sign * d < 0).sum()),
        }
    return {"base": f"{base['_path']}:{base_row}", "other": f"{other['_path']}:{other_row}",
            "episodes": len(pairs), "figures": figures}


def _print(result: dict) -> None:
    print(f"base  {result['base']}\nother {result['other']}\n{result['episodes']} shared episode(s); "
          "difference = other - base, paired per episode")
    print(f"  {'figure':24s} {'base':>9s} {'other':>9s} {'difference':>11s} {'SE':>8s} {'z':>6s}  better/worse")
    for key, f in result["figures"].items():
        if f["n"] == 0:
            print(f"  {key:24s} (no episode has both)")
            continue
        se = f["standard_error"]
        z = f"{f['difference'] / se:6.1f}" if se else "     -"
        se_text = f"{se:8.4g}" if se is not None else "       -"
        print(f"  {key:24s} {f['base']:9.4g} {f['other']:9.4g} {f['difference']:+11.4g} {se_text} {z}  "
              f"{f['other_better']}/{f['other_worse']} of {f['n']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="iws eval paired", description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="openloop.json (or its directory): the reference")
    p.add_argument("other", nargs="?", help="the report compared with it (default: the base report itself)")
    p.add_argument("--base-row", default="world_model", help="row of the base report (e.g. copy_last)")
    p.add_argument("--row", default="world_model", help="row of the other report")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    try:
        base = load_report(args.base)
        other = load_report(args.other) if args.other else base
        result = paired(base, other, args.base_row, args.row)
    except PairingError as exc:
        print(f"iws eval paired: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0
