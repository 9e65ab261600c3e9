"""The paper's two policy experiments, each a command whose output is a report with a plot.

    iws experiment datamix --policy real=runs/policy_real100 --policy wm=runs/policy_wm100 \\
        --policy mix50=runs/policy_mix50 --wm-fraction real=0 --wm-fraction wm=1 --wm-fraction mix50=0.5 \\
        --episodes 50 --out docs/results/datamix
    iws experiment correlation --policy NAME=CKPT ... --episodes 10 --out docs/results/correlation

``datamix`` (experiment a): Diffusion Policies trained on real (reference-robot) demos, world-model
demos and mixes, each evaluated on the reference robot; reports success rates with 95 % intervals
and the ratio world-model-only / real-only against the 0.9 bar.

``correlation`` (experiment b): every policy evaluated on both backends from the same initial
states (matched seeds); Pearson r and MMRV (mean maximum rank violation) between the success rates,
and a scatter plot.

Every evaluation is `iws evaluate` (``iws_policy.evaluate.evaluate``) into ``OUT/<backend>_<name>/``;
one already there with the same episodes, steps and seed is reused, so a rerun resumes.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np


def parse_named(items: list[str], what: str) -> dict[str, str]:
    named = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{what} must be NAME=VALUE, got '{item}'")
        named[name] = value
    return named


def checkpoint_action_horizon(policy: str) -> int | None:
    """The commands per chunk a checkpoint was trained to execute (None for 'expert' or unreadable)."""
    try:
        return int(json.loads((Path(policy) / "config.json").read_text())["policy"]["action_horizon"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cached_evaluation(policy: str, backend: str, out: Path, episodes: int, steps: int, seed: int, model: str | None,
                      action_horizon: int | None = None) -> dict | None:
    """The earlier result in ``out`` when it matches: the same checkpoint path and weights (results from
    before 2026-12-07 name the path only), episodes, steps, seeds, loss rule, pixel scorer, action
    horizon (None: the checkpoint's own, which evaluations from before the option used), joints read
    as they come (not an ablation's `--mask-joint` run) and, in the world model, the same weights;
    else None. (`iws evaluate` itself continues from its
    episodes.jsonl, which stays out of git; evaluation.json is what a report's directory keeps.)"""
    from iws_policy.evaluate import AS_READ, LOST_FRAMES, model_weights, policy_weights
    from iws_reference_robot.scoring import scorer_identity

    cached = out / "evaluation.json"
    if not cached.is_file():
        return None
    result = json.loads(cached.read_text())
    own = checkpoint_action_horizon(policy)
    same_horizon = (result.get("action_horizon") or own) == (action_horizon or own)
    same_world = backend != "world_model" or result.get("model_weights") == model_weights(model)
    same_weights = "policy_weights" not in result or result["policy_weights"] == policy_weights(policy)
    same_inputs = result.get("joint_inputs", AS_READ) == AS_READ  # not an ablation's (--mask-joint)
    same_run = (result.get("policy"), result.get("episodes"), result.get("steps"), result.get("seed"),
                result.get("lost_frames_rule"), result.get("scorer")) == (policy, episodes, steps, seed, LOST_FRAMES,
                                                                         scorer_identity())
    return result if same_horizon and same_world and same_weights and same_inputs and same_run else None


def evaluation(policy: str, backend: str, out: Path, episodes: int, steps: int, seed: int, model: str | None,
               action_horizon: int | None = None) -> dict:
    """`iws evaluate` into ``out``, or its earlier result when it matches (`cached_evaluation`)."""
    from iws_policy.evaluate import evaluate

    cached = cached_evaluation(policy, backend, out, episodes, steps, seed, model, action_horizon)
    if cached is not None:
        return cached
    return evaluate(policy, backend, episodes, steps, seed, model=model, videos=2, out=out, progress=True,
                    action_horizon=action_horizon)


def run_side_by_side(planned: list[tuple[str, str, Path]], jobs: int, episodes: int, steps: int, seed: int,
                     model: str | None, action_horizon: int | None) -> None:
    """The planned (policy, backend, out) evaluations not yet on disk, ``jobs`` at a time, each an `iws
    evaluate` process of its own (its log in OUT/evaluate.log). In lockstep the policy's process and the
    backend's wait for each other, so on two cores two evaluations run at nearly full speed each
    (docs/benchmarks.md). The report is then made from their evaluation.json as from a rerun's."""
    import subprocess

    from iws_policy.evaluate import EvaluationError

    todo = [(p, b, o) for p, b, o in planned
            if cached_evaluation(p, b, o, episodes, steps, seed, model, action_horizon) is None]
    running: list[tuple[subprocess.Popen, Path, object]] = []

    def finish(proc, out, log) -> None:
        log.close()
        if proc.returncode != 0:
            raise EvaluationError(f"iws evaluate into {out} failed with {proc.returncode}; see {out / 'evaluate.log'}")
        print(f"iws experiment: {out} done", file=sys.stderr)

    try:
        for policy, backend, out in todo:
            while len(running) >= jobs:
                for entry in list(running):
                    if entry[0].poll() is not None:
                        running.remove(entry)
                        finish(*entry)
                time.sleep(0.5)
            out.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "iws_policy.evaluate", "--policy", policy, "--backend", backend,
                       "--episodes", str(episodes), "--steps", str(steps), "--seed", str(seed), "--videos", "2",
                       "--out", str(out)]  # with its progress bar in the log
            command += ["--model", model] if model and backend == "world_model" else []
            command += ["--action-horizon", str(action_horizon)] if action_horizon else []
            log = open(out / "evaluate.log", "w")
            print(f"iws experiment: evaluating {policy} on {backend} into {out}", file=sys.stderr)
            running.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), out, log))
        while running:
            entry = running.pop(0)
            entry[0].wait()
            finish(*entry)
    finally:  # interrupted or failed: stop the others (SIGTERM unwinds them and their backends)
        for proc, out, log in running:
            proc.terminate()
        for proc, out, log in running:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def mean_best_coverage(result: dict) -> float:
    """Mean over episodes of the best pixel score (the T's overlap with the goal): a graded
    measure that still separates policies when none succeeds."""
    scores = [r["pixel_best_score"] for r in result.get("per_episode", [])]
    return float(np.mean(scores)) if scores else float("nan")


def pearson(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def mmrv(sim, real) -> float:
    """Mean maximum rank violation (Li et al., SIMPLER 2024): for each policy, the largest real
    success gap to another policy that the simulator orders the other way; averaged. 0 is perfect."""
    sim, real = np.asarray(sim, float), np.asarray(real, float)
    n = len(sim)
    worst = [max([abs(real[i] - real[j]) for j in range(n) if (sim[i] < sim[j]) != (real[i] < real[j])] or [0.0])
             for i in range(n)]
    return float(np.mean(worst)) if n else float("nan")


def paired_episodes(real: dict, sim: dict) -> list[tuple[dict, dict]]:
    """The two backends' episodes from the same initial state (paired by seed, not by position),
    where both gave a verdict."""
    by_seed = {e.get("seed", i): e for i, e in enumerate(sim.get("per_episode", []))}
    return [(e, by_seed[e.get("seed", i)]) for i, e in enumerate(real.get("per_episode", []))
            if e.get("seed", i) in by_seed and "success" in e and "success" in by_seed[e.get("seed", i)]]


def episode_agreement(real: dict, sim: dict) -> dict:
    """Episode by episode, how the world model's verdicts match the robot's from the same initial
    states: equal success rates can hide verdicts that agree no more than chance. ``kappa`` is
    Cohen's (agreement beyond what the two rates give by chance: 0 for a side whose verdict never
    changes; nan when both never change), ``coverage_r`` the Pearson r of the episodes' best scores."""
    pairs = paired_episodes(real, sim)
    if not pairs:
        return {"episodes": 0, "agreement": float("nan"), "kappa": float("nan"), "coverage_r": float("nan"),
                "both": 0, "robot_only": 0, "world_model_only": 0, "neither": 0}
    r = np.array([bool(a["success"]) for a, _ in pairs])
    w = np.array([bool(b["success"]) for _, b in pairs])
    agreement = float((r == w).mean())
    chance = float(r.mean() * w.mean() + (1 - r.mean()) * (1 - w.mean()))
    kappa = (agreement - chance) / (1 - chance) if chance < 1 else float("nan")
    coverage_r = pearson([a.get("pixel_best_score", np.nan) for a, _ in pairs],
                         [b.get("pixel_best_score", np.nan) for _, b in pairs])
    return {"episodes": len(pairs), "agreement": agreement, "kappa": kappa, "coverage_r": coverage_r,
            "both": int((r & w).sum()), "robot_only": int((r & ~w).sum()),
            "world_model_only": int((~r & w).sum()), "neither": int((~r & ~w).sum())}


def verdicts_by_seed(real: dict, sim: dict) -> list[list[int]]:
    """[seed, robot's verdict, model's verdict] per paired episode: what a report keeps to resample."""
    return [[int(a.get("seed", i)), int(bool(a["success"])), int(bool(b["success"]))]
            for i, (a, b) in enumerate(paired_episodes(real, sim))]


def bootstrap_pearson(verdicts: list[list[list[int]]], bar: float = 0.9, draws: int = 2000, seed: int = 0) -> dict:
    """How sure the success-rate r is, from the episodes behind it: the start states (the seeds every
    policy shares) are drawn with replacement, the same draw for every policy and both backends (the
    matched starts are the unit of the experiment), and r recomputed. ``verdicts``: per policy, its
    ``verdicts_by_seed``. Gives the 2.5-97.5 percentiles of r and the share of draws with r >= ``bar``
    (draws where a side's rates are all equal have no r and are left out, counted in ``undefined``).
    With 30 episodes a policy's rate alone has a standard error of up to 0.09. The percentile interval
    leans low: a resample adds the episodes' binomial noise to the rates once more, which pulls r
    towards 0 (an r of 0.775 over 8 policies reads 0.51-0.88), so the share at the bar understates too."""
    tables = [{row[0]: row[1:] for row in policy} for policy in verdicts]
    seeds = sorted(set.intersection(*(set(t) for t in tables))) if tables else []
    if len(tables) < 2 or len(seeds) < 2:
        return {"episodes": len(seeds), "draws": 0, "ci95": [float("nan"), float("nan")],
                "share_at_bar": float("nan"), "undefined": 0}
    both = np.array([[t[s] for s in seeds] for t in tables], float)  # (policies, episodes, [robot, model])
    picks = np.random.default_rng(seed).integers(0, len(seeds), size=(draws, len(seeds)))
    rates = both[:, picks].mean(axis=2)  # (policies, draws, 2)
    robot, model = rates[..., 0] - rates[..., 0].mean(0), rates[..., 1] - rates[..., 1].mean(0)
    spread = np.sqrt((robot ** 2).sum(0) * (model ** 2).sum(0))
    defined = spread > 0
    r = (robot * model).sum(0)[defined] / spread[defined]
    if not len(r):
        return {"episodes": len(seeds), "draws": draws, "ci95": [float("nan"), float("nan")],
                "share_at_bar": float("nan"), "undefined": draws}
    return {"episodes": len(seeds), "draws": draws, "ci95": [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))],
            "share_at_bar": float((r >= bar).mean()), "undefined": int(draws - len(r))}


def _json(value):
    """NaN (a correlation of constant rates) as null, so the files are strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def _rate(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _plot(path: Path, draw) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4), dpi=120)
    draw(ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _train_info(checkpoint: str) -> dict:
    config = Path(checkpoint) / "config.json"
    if not config.is_file():
        return {}
    data = json.loads(config.read_text())
    return {k: data.get(k) for k in ("trained_steps", "train_seconds", "data", "batch")}


def datamix(policies: dict[str, str], wm_fraction: dict[str, float], out: Path, episodes: int, steps: int,
            seed: int, action_horizon: int | None = None, jobs: int = 1) -> dict:
    from iws_reference_robot.scoring import PIXEL_SUCCESS_THRESHOLD

    out.mkdir(parents=True, exist_ok=True)
    if jobs > 1:
        run_side_by_side([(c, "reference", out / f"reference_{n}") for n, c in policies.items()], jobs,
                         episodes, steps, seed, None, action_horizon)
    rows = []
    for name, checkpoint in policies.items():
        r = evaluation(checkpoint, "reference", out / f"reference_{name}", episodes, steps, seed, None, action_horizon)
        rows.append({"name": name, "checkpoint": checkpoint, "wm_fraction": wm_fraction.get(name),
                     "success_rate": r["success_rate"], "ci95": r["ci95"], "truth_success_rate": r.get("truth_success_rate"),
                     "mean_best_coverage": mean_best_coverage(r),
                     "episodes": r["episodes"], "eval_seconds": r["seconds"], "training": _train_info(checkpoint)})
    by_fraction = {row["wm_fraction"]: row for row in rows}
    real, wm = by_fraction.get(0.0), by_fraction.get(1.0)
    ratio = wm["success_rate"] / real["success_rate"] if real and wm and real["success_rate"] > 0 else None
    coverage_ratio = wm["mean_best_coverage"] / real["mean_best_coverage"] if real and wm and real["mean_best_coverage"] > 0 else None
    result = {"experiment": "datamix", "episodes": episodes, "steps": steps, "seed": seed, "action_horizon": action_horizon, "policies": rows,
              "wm_over_real": ratio, "bar": 0.9, "bar_met": ratio is not None and ratio >= 0.9,
              "wm_over_real_coverage": coverage_ratio}
    ordered = sorted((r for r in rows if r["wm_fraction"] is not None), key=lambda r: r["wm_fraction"])

    def draw(ax):
        x = [r["wm_fraction"] for r in ordered]
        y = [r["success_rate"] for r in ordered]
        err = [[r["success_rate"] - r["ci95"][0] for r in ordered], [r["ci95"][1] - r["success_rate"] for r in ordered]]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=4)
        ax.set_xlabel("share of world-model demos")
        ax.set_ylabel(f"success on the reference robot ({episodes} episodes)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title("Diffusion Policy: real vs world-model demos")
    _plot(out / "datamix.png", draw)
    (out / "datamix.json").write_text(json.dumps(_json(result), indent=1) + "\n")
    lines = ["# Experiment a: Diffusion Policy on real vs world-model demonstrations", "",
             f"Each policy evaluated on the reference robot, {episodes} episodes of {steps} steps from seeds "
             f"{seed}..{seed + episodes - 1}; success from the pixel scorer (any frame at {PIXEL_SUCCESS_THRESHOLD}); "
             f"{_horizon_text(action_horizon)}.", "",
             "| policy | world-model share | success | 95 % CI | ground truth | mean best coverage | training steps | training s | eval s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = r["training"]
        lines.append(f"| {r['name']} | {r['wm_fraction']} | {r['success_rate']:.2f} | {r['ci95'][0]:.2f}-{r['ci95'][1]:.2f} | "
                     f"{r['truth_success_rate']:.2f} | {r['mean_best_coverage']:.3f} | {t.get('trained_steps')} | {round(t.get('train_seconds') or 0)} | "
                     f"{r['eval_seconds']:.0f} |")
    if ratio is not None:
        ratio_text = str(round(ratio, 3))
    elif real is None or wm is None:
        ratio_text = "undefined (needs a real-only and a world-model-only policy)"
    else:
        ratio_text = "undefined (the real-only policy never succeeded)"
    lines += ["", f"World-model-only / real-only success: {ratio_text} (bar 0.9: "
              f"{'met' if result['bar_met'] else 'not met'}).",
              "" if coverage_ratio is None else f"On mean best coverage (a graded score that separates policies when none succeeds): {coverage_ratio:.3f}.",
              "", "![datamix](datamix.png)", ""]
    (out / "README.md").write_text("\n".join(lines))
    return result


def correlation(policies: dict[str, str], out: Path, episodes: int, steps: int, seed: int, model: str | None,
                action_horizon: int | None = None, jobs: int = 1) -> dict:
    """Both backends per policy; the report is rewritten after each policy, so a run cut short
    still reports the policies it finished."""
    out.mkdir(parents=True, exist_ok=True)
    if jobs > 1:
        run_side_by_side([(c, b, out / f"{b}_{n}") for n, c in policies.items() for b in ("reference", "world_model")],
                         jobs, episodes, steps, seed, model, action_horizon)
    rows, result = [], {}
    for name, checkpoint in policies.items():
        real = evaluation(checkpoint, "reference", out / f"reference_{name}", episodes, steps, seed, None, action_horizon)
        sim = evaluation(checkpoint, "world_model", out / f"world_model_{name}", episodes, steps, seed, model, action_horizon)
        rows.append({"name": name, "checkpoint": checkpoint, "reference": real["success_rate"],
                     "world_model": sim["success_rate"], "reference_ci95": real["ci95"], "world_model_ci95": sim["ci95"],
                     "reference_truth": real.get("truth_success_rate"),
                     "reference_coverage": mean_best_coverage(real), "world_model_coverage": mean_best_coverage(sim),
                     "world_model_object_lost_rate": sim.get("object_lost_rate"),
                     "world_model_ignoring_loss": sim.get("success_rate_ignoring_loss"),
                     "episode_agreement": episode_agreement(real, sim), "verdicts": verdicts_by_seed(real, sim),
                     "eval_seconds": real["seconds"] + sim["seconds"], "training": _train_info(checkpoint)})
        result = _correlation_report(rows, len(policies), out, episodes, steps, seed, model, action_horizon)
    return result


def _r_text(value: float, why: str = "every rate is the same") -> str:
    """A Pearson r for the report, or why it is undefined (nan: a constant side)."""
    return f"{value:.3f}" if math.isfinite(value) else f"undefined ({why})"


def _agreement_text(agreement: dict | None) -> str:
    if not agreement or not agreement["episodes"]:
        return "-"
    kappa = agreement["kappa"]
    return (f"{agreement['agreement']:.2f} of {agreement['episodes']} "
            f"({f'{kappa:.2f}' if math.isfinite(kappa) else 'undefined'})")


def _bootstrap_text(boot: dict) -> str:
    """The report's sentence on how sure r is (nothing when the episodes cannot be resampled)."""
    if not boot["draws"] or not math.isfinite(boot["ci95"][0]):
        return ""
    return (f"Resampling the {boot['episodes']} matched start states ({boot['draws']} draws): r within "
            f"{boot['ci95'][0]:.2f}-{boot['ci95'][1]:.2f} (95 %), at or above the bar in {boot['share_at_bar']:.0%} "
            f"of the draws. ")


def _horizon_text(action_horizon: int | None) -> str:
    return (f"each policy executed {action_horizon} commands per predicted chunk" if action_horizon
            else "each policy executed its checkpoint's commands per chunk")


def _correlation_report(rows, planned, out, episodes, steps, seed, model, action_horizon=None) -> dict:
    from iws_policy.evaluate import LOST_FRAMES

    x, y = [r["world_model"] for r in rows], [r["reference"] for r in rows]
    cx, cy = [r["world_model_coverage"] for r in rows], [r["reference_coverage"] for r in rows]
    # The pixel verdict on the robot has a few false positives just under the 0.95 overlap; where the
    # robot rarely succeeds they dominate its success rates, so r against the simulator's truth is given too.
    truth = [r.get("reference_truth") for r in rows]
    r_truth = pearson(x, truth) if all(t is not None for t in truth) else float("nan")
    result = {"experiment": "correlation", "episodes": episodes, "steps": steps, "seed": seed, "model": model,
              "action_horizon": action_horizon,
              "policies_planned": planned, "policies": rows, "pearson_r": pearson(x, y), "mmrv": mmrv(x, y),
              "pearson_r_coverage": pearson(cx, cy), "mmrv_coverage": mmrv(cx, cy),
              "pearson_r_reference_truth": r_truth, "bar_pearson": 0.9,
              "pearson_r_bootstrap": bootstrap_pearson([r.get("verdicts", []) for r in rows])}
    result["bar_met"] = bool(np.isfinite(result["pearson_r"]) and result["pearson_r"] >= 0.9 and len(rows) >= 8)

    def draw(ax):
        ax.scatter(x, y, label="success rate")
        ax.scatter(cx, cy, marker="x", label="mean best coverage")
        for r in rows:
            ax.annotate(r["name"], (r["world_model_coverage"], r["reference_coverage"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
        ax.plot([0, 1], [0, 1], "k:", linewidth=0.8)
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("in the world model")
        ax.set_ylabel("on the reference robot")
        ax.legend(fontsize=7, loc="upper left")
        r = lambda v: f"{v:.2f}" if math.isfinite(v) else "undefined (constant)"
        ax.set_title(f"{len(rows)} policies: r = {r(result['pearson_r'])} (success), "
                     f"{r(result['pearson_r_coverage'])} (coverage)", fontsize=9)
    _plot(out / "correlation.png", draw)
    (out / "correlation.json").write_text(json.dumps(_json(result), indent=1) + "\n")
    lines = ["# Experiment b: success in the world model against success on the reference robot", "",
             f"Each policy on both backends from the same initial states (seeds {seed}..{seed + episodes - 1}), "
             f"{episodes} episodes of {steps} steps each; world model: {model or 'models/push_t'}. "
             f"Success counts frames until the T goes unfound for {LOST_FRAMES} frames in a row (rare on the reference robot). "
             f"{len(rows)} of {planned} planned policies evaluated; {_horizon_text(action_horizon)}.", "",
             "| policy | success: world model | success: reference | reference, ground truth | coverage: world model | "
             "coverage: reference | world model lost the T | world-model success counting frames after the loss | "
             "verdicts agree (kappa) | episode coverage r | eval s (both) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['name']} | {r['world_model']:.2f} | {r['reference']:.2f} | {_rate(r.get('reference_truth'))} | "
              f"{r['world_model_coverage']:.3f} | "
              f"{r['reference_coverage']:.3f} | {_rate(r.get('world_model_object_lost_rate'))} | "
              f"{_rate(r.get('world_model_ignoring_loss'))} | {_agreement_text(r.get('episode_agreement'))} | "
              f"{_r_text(r.get('episode_agreement', {}).get('coverage_r', float('nan')), 'a constant side')} | "
              f"{r['eval_seconds']:.0f} |" for r in rows]
    one = "one policy" if len(rows) < 2 else None  # r needs two points before it needs them to differ
    lines += ["", f"Success rates: Pearson r = {_r_text(result['pearson_r'], one or 'every success rate is the same')}, "
              f"MMRV = {result['mmrv']:.3f} "
              f"(bar: r >= 0.9 over at least 8 policies: {'met' if result['bar_met'] else 'not met'}). "
              f"{_bootstrap_text(result['pearson_r_bootstrap'])}"
              f"Mean best coverage: Pearson r = {_r_text(result['pearson_r_coverage'], one or 'every rate is the same')}, MMRV = {result['mmrv_coverage']:.3f}. "
              f"World-model success against the reference robot's ground truth: Pearson r = "
              f"{_r_text(r_truth, one or 'no policy succeeded, or every rate is the same')}.",
              "", "Verdicts agree: the share of matched episodes (the same seed on both backends) where the world "
              "model's verdict is the robot's, with Cohen's kappa (0: no more than the two success rates agree by "
              "chance; 1: every episode); episode coverage r: Pearson r of the episodes' best scores. A simulator "
              "can match a policy's rate and still not know which episodes it wins.",
              "", "![correlation](correlation.png)", ""]
    (out / "README.md").write_text("\n".join(lines))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iws experiment", description=__doc__.split("\n\n")[0])
    parser.add_argument("which", choices=("datamix", "correlation"))
    parser.add_argument("--policy", action="append", required=True, help="NAME=CHECKPOINT (repeat)")
    parser.add_argument("--wm-fraction", action="append", default=[], help="datamix: NAME=share of world-model demos")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=20_000)
    parser.add_argument("--model", help="correlation: world model checkpoint (default: the shipped models/push_t)")
    parser.add_argument("--action-horizon", type=int, help="commands executed per predicted chunk (default: each checkpoint's)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=1,
                        help="evaluations run side by side, each an `iws evaluate` process (2 suits a 2-core machine: "
                             "in lockstep each waits for its backend half the time)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    from iws_policy.evaluate import EvaluationError, stop_on_sigterm
    from iws_world_model.checkpoint import CheckpointError
    stop_on_sigterm()  # finished evaluations are on disk; a rerun resumes
    try:
        policies = parse_named(args.policy, "--policy")
        started = time.perf_counter()
        if args.which == "datamix":
            fractions = {k: float(v) for k, v in parse_named(args.wm_fraction, "--wm-fraction").items()}
            result = datamix(policies, fractions, args.out, args.episodes, args.steps, args.seed, args.action_horizon,
                             jobs=args.jobs)
        else:
            result = correlation(policies, args.out, args.episodes, args.steps, args.seed, args.model, args.action_horizon,
                                 jobs=args.jobs)
    except (ValueError, EvaluationError, CheckpointError) as exc:
        print(f"iws experiment: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("iws experiment: interrupted; rerun to resume", file=sys.stderr)
        return 130
    print(json.dumps(_json({k: v for k, v in result.items() if k != "policies"} | {"seconds": time.perf_counter() - started})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
