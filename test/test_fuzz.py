"""Fuzzing both simulator backends through ROS (`iws bench fuzz` at test scale): malformed input on
every topic and service leaves each node up and answering, and each kind of rejection is logged
with its reason, rate-limited."""
from __future__ import annotations

from iws_bringup.fuzz import FuzzTarget, InputGenerator, bench_fuzz, rejection_log_stats
from iws_common.profile import load_profile


def test_generator_is_seeded_and_covers_the_malformed_kinds():
    profile = load_profile("reference_arm")
    a, b = InputGenerator(profile, 5), InputGenerator(profile, 5)
    kinds = set()
    for _ in range(300):
        (ka, ma), (kb, mb) = a.position_command(), b.position_command()
        assert ka == kb and list(ma.data) == list(mb.data) or ka == kb == "non_finite"
        kinds.add("position:" + ka)
        kinds.add("trajectory:" + a.trajectory()[0])
        b.trajectory()
        kinds.add("reset:" + a.reset_request()[0])
        b.reset_request()
    expected = {"position:non_finite", "position:empty", "position:wrong_length", "position:beyond_limits",
                "trajectory:unknown_joint", "trajectory:duplicate_joint", "trajectory:unsorted_times",
                "trajectory:negative_time", "trajectory:no_points", "reset:bad_encoding", "reset:count_mismatch",
                "reset:non_finite_joints", "reset:valid_window"}
    assert expected <= kinds, expected - kinds


def test_rejection_log_stats_counts_lines_per_kind_and_second():
    log = ("[ERROR] [100.1] [n]: rejected (non_finite): a\n[ERROR] [100.7] [n]: rejected (non_finite): b\n"
           "[ERROR] [101.2] [n]: rejected (reset): c\n[INFO] [101.3] [n]: up\n")
    stats = rejection_log_stats(log)
    assert stats["lines_per_kind"] == {"non_finite": 2, "reset": 1}
    assert stats["max_lines_per_kind_per_s"] == 2 and stats["tracebacks"] == 0


def test_tick_rate_leaves_out_repeated_frames_and_resets_first_frames(monkeypatch):
    """A reset publishes a frame with a stamp of its own; it is not a control tick."""
    from types import SimpleNamespace

    import iws_bringup.fuzz as fuzz
    target = object.__new__(FuzzTarget)  # the counting alone, without nodes
    target.image_arrivals, target._last_stamp = [], None
    frames = [(0.0, 100), (0.1, 200), (0.12, 200), (0.15, 250), (0.2, 300), (0.3, 400)]  # 250: a reset's
    for arrival, stamp in frames:
        monkeypatch.setattr(fuzz.time, "monotonic", lambda arrival=arrival: arrival)
        target._on_image(SimpleNamespace(header=SimpleNamespace(stamp=SimpleNamespace(sec=0, nanosec=stamp))))
    monkeypatch.undo()
    assert target.image_rate(0.0, 1.0) == 4 / 0.3  # 5 new stamps: the repeated frame is not a tick
    assert target.image_rate(0.0, 1.0, reset_stamps={250}) == 3 / 0.3


def test_fuzzed_backends_stay_up_and_log_each_kind_rate_limited(tiny_world_model, tmp_path):
    result = bench_fuzz(inputs=400, seed=11, model=str(tiny_world_model), rate=400.0, baseline_s=2.0,
                        log_dir=tmp_path, progress=None)
    assert result["inputs"] == 800
    assert result["crashes"] == 0, result
    for backend, r in result["backends"].items():
        assert r["inputs_per_channel"].keys() == {"position_command", "trajectory_command", "reset", "step", "pause"}
        for phase in ("realtime", "lockstep"):
            assert r[phase]["exit_code"] in (0, -2), (backend, phase, r[phase])
            assert r[phase]["tracebacks"] == 0, (tmp_path / f"{backend}_{phase}.log").read_text()[-3000:]
            assert r[phase]["max_lines_per_kind_per_s"] <= 2, (backend, phase, r[phase]["lines_per_kind"])
        assert r["realtime"]["rate_hz_during"] > 0 and r["realtime"]["node_alive"]
        logged = set(r["realtime"]["lines_per_kind"]) | set(r["lockstep"]["lines_per_kind"])
        assert {"non_finite", "wrong_length", "unknown_joint", "time_order", "reset", "step_too_many"} <= logged, logged
        assert r["lockstep"]["refused"].get("step", 0) > 0 and r["lockstep"]["answered"]["final_step"] == 1
