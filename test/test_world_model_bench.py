"""`iws bench node` / `iws bench soak` on the tiny trained model: the reports are complete and sane,
and the node's `rate_hz` override changes its tick rate. No performance bars here (docs/benchmarks.md)."""
from __future__ import annotations

import io
import json
import math

import pytest

from iws_world_model_ros.bench import bench_node, bench_soak, node_main

LATENCY_KEYS = ("latency_ms_p50", "latency_ms_p95")
NODE_KEYS = ("rate_hz", *LATENCY_KEYS, "step_ms_p50", "step_ms_p95", "target_rate_hz",
             "node_achieved_rate_hz", "dropped_ticks", "images", "model")


@pytest.fixture(scope="module")
def node_at_5hz(tiny_world_model):
    # One inference thread: the test machine's cores are shared with other work.
    return bench_node(tiny_world_model, rate_hz=5.0, seconds=4.0, threads=1, warmup=2.0)


@pytest.fixture(scope="module")
def soak_at_profile_rate(tiny_world_model):
    progress = io.StringIO()
    result = bench_soak(tiny_world_model, rate_hz=0.0, minutes=0.1, threads=1, warmup=2.0, sample_s=2.0,
                        progress=progress)
    return result, progress.getvalue()


def _positive_finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_node_bench_reports_rate_and_latency(node_at_5hz, tiny_world_model):
    r = node_at_5hz
    assert set(NODE_KEYS) <= r.keys(), sorted(r)
    json.dumps(r)  # what --json prints
    assert r["model"] == str(tiny_world_model)
    assert r["rate_hz"] > 0 and r["images"] > 2
    assert all(_positive_finite(r[k]) for k in LATENCY_KEYS), r
    assert r["latency_ms_p95"] >= r["latency_ms_p50"]
    assert _positive_finite(r["step_ms_p50"])
    assert r["target_rate_hz"] == 5.0


def test_soak_reports_rate_memory_and_errors(soak_at_profile_rate):
    r, progress = soak_at_profile_rate
    json.dumps(r)
    for key in ("rate_hz", "rate_hz_per_minute", "rate_hz_min_minute", "latency_ms_p95",
                "rss_mb_start", "rss_mb_end", "rss_growth_mb", "errors"):
        assert key in r, key
    assert r["rate_hz"] > 0 and len(r["rate_hz_per_minute"]) == 1 and r["rate_hz_min_minute"] > 0
    assert _positive_finite(r["latency_ms_p95"])
    assert _positive_finite(r["rss_mb_start"]) and _positive_finite(r["rss_mb_end"])
    assert math.isfinite(r["rss_growth_mb"])
    errors = r["errors"]
    assert errors["count"] == 0 and errors["node_alive_at_end"], errors
    assert errors["node_exit_code"] in (0, -2), errors
    assert "minute 1/1" in progress


def test_rate_override_changes_the_tick_rate(node_at_5hz, soak_at_profile_rate):
    soak, _ = soak_at_profile_rate
    assert soak["target_rate_hz"] == 10.0  # rate_hz 0: the profile's control rate
    assert node_at_5hz["node_achieved_rate_hz"] <= 5.5  # the node never ticks faster than asked
    assert soak["rate_hz"] > 1.3 * node_at_5hz["rate_hz"], (soak["rate_hz"], node_at_5hz["rate_hz"])


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    assert node_main(["--model", str(tmp_path / "absent"), "--json"]) == 2
    err = capsys.readouterr().err
    assert "no world model checkpoint" in err and str(tmp_path / "absent") in err
