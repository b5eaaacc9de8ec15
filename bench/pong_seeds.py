"""Pong over several seeds: when each run of configs/atari_pong.yaml took off and reached +15, from the
runs' own metrics.jsonl, with the spread over seeds and one figure of every run's curve.

For each run directory (one `run.py train --config configs/atari_pong.yaml --set run.seed=N` each):
the mean return of its last 20 training episodes at every metrics record (the records' per-window means
weighted by their episode counts, going back until 20 episodes are covered), and from it

* take-off: the first record where that mean is at least -18, 2.5 points above the uniform policy's
  -20.5, and its agent steps and minutes;
* the first record at +15 or more (the issue's "reaches +15"), agent steps and minutes;
* the torso's dead units (metrics' dead_units) over the first minute and at take-off, the policy's
  entropy and the agent steps per second.

Each time is reported over the seeds as mean +- the t 95% half-width and as the IQM with its bootstrap
95% interval (analysis.compare.score_statistics, docs/seeds.md). A run that never reached a mark has
no value for it and the table says so. `--earlier` draws the README's earlier single run, whose
10-minute window means (docs/atari.md) are all that is kept of it, as points.

    python bench/pong_seeds.py runs/pong_seed0 runs/pong_seed1 runs/pong_seed2 --out docs/pong_seeds.png \
        [--earlier] [--reference RUN_DIR ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from impala_league.analysis.compare import score_statistics  # noqa: E402
from impala_league.analysis.runs import Run, load_run  # noqa: E402

LAST_EPISODES = 20
TAKE_OFF = -18.0
TARGET = 15.0
# The README's earlier run (docs/atari.md): the mean return of each 10-minute window of its hour.
EARLIER_WINDOWS = [(5, -20.3), (15, -19.5), (25, -14.2), (35, -7.1), (45, 8.0), (55, 18.9)]


def recent_returns(run: Run, last: int = LAST_EPISODES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(minutes [R], agent steps trained [R], mean return of the last `last` training episodes [R]) at
    each metrics record R that has episodes before it; the mean weights each record's episode_return
    by its episode count, back to the record where `last` episodes are covered."""
    minutes, steps, means = [], [], []
    window: list[tuple[float, int]] = []
    for record in run.records:
        if record.get("episodes") and "episode_return" in record:
            window.append((record["episode_return"], record["episodes"]))
            while sum(n for _, n in window[1:]) >= last:
                window.pop(0)
        if window:
            minutes.append(run.elapsed(record) / 60)
            steps.append(record["agent_steps_trained"])
            means.append(sum(r * n for r, n in window) / sum(n for _, n in window))
    return np.array(minutes), np.array(steps), np.array(means)


def first_at(minutes: np.ndarray, steps: np.ndarray, means: np.ndarray, level: float) -> dict | None:
    """{"minutes", "agent_steps"} of the first point whose mean is at least `level`; None if none is."""
    hits = np.flatnonzero(means >= level)
    return None if not hits.size else {"minutes": float(minutes[hits[0]]), "agent_steps": int(steps[hits[0]])}


def summarize_run(run: Run) -> dict:
    """One run's marks and diagnostics (see the module docstring)."""
    minutes, steps, means = recent_returns(run)
    records = run.records
    take_off, target = first_at(minutes, steps, means, TAKE_OFF), first_at(minutes, steps, means, TARGET)

    def mean_of(key: str, until_s: float) -> float | None:
        values = [r[key] for r in records if key in r and run.elapsed(r) <= until_s]
        return float(np.mean(values)) if values else None

    return {
        "run": run.name, "seed": run.config.run.seed, "center_frames": run.config.agent.center_frames,
        "minutes": run.elapsed(records[-1]) / 60,
        "agent_steps": records[-1]["agent_steps_trained"], "sps": records[-1]["agent_steps_trained"] / run.elapsed(records[-1]),
        "final_mean_return": float(means[-1]) if means.size else None,
        "take_off": take_off, "reached_15": target,
        "dead_units_first_minute": mean_of("dead_units", 60),
        "dead_units_at_take_off": mean_of("dead_units", 60 * take_off["minutes"]) if take_off else None,
        "curve": {"minutes": minutes.tolist(), "agent_steps": steps.tolist(), "mean_return": means.tolist()},
    }


def over_seeds(rows: list[dict], mark: str, unit: str) -> str:
    """`mark`'s `unit` over the runs: mean +- t half-width, IQM [bootstrap 95%], runs that reached it."""
    values = [row[mark][unit] if row[mark] else None for row in rows]
    stats = score_statistics(values)
    if not stats["seeds"]:
        return "none reached it"
    fmt = (lambda v: f"{v:,.1f}") if unit == "minutes" else (lambda v: f"{v / 1e6:.2f}M")
    text = fmt(stats["mean"]) + (f" +- {fmt(stats['ci95'])}" if stats["ci95"] is not None else " (one run)")
    if stats["iqm_ci95"]:
        text += f", IQM {fmt(stats['iqm'])} [{fmt(stats['iqm_ci95'][0])}, {fmt(stats['iqm_ci95'][1])}]"
    return text + f" ({stats['seeds']} of {len(rows)} runs)"


def plot(rows: list[dict], references: list[dict], out: Path, earlier: bool) -> None:
    """Every run's last-20-episodes mean against minutes and against agent steps, the +15 line, the
    `references` runs in gray, and (with `earlier`) the README's earlier run's 10-minute window means."""
    fig, (by_time, by_steps) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for row in [*rows, *references]:
        curve, style = row["curve"], {"color": "gray", "linestyle": "--"} if row in references else {}
        label = f"seed {row['seed']}" + ("" if row["center_frames"] else ", frames not centered") + (
            " (reference)" if row in references else "")
        by_time.plot(curve["minutes"], curve["mean_return"], label=label, **style)
        by_steps.plot(np.array(curve["agent_steps"]) / 1e6, curve["mean_return"], label=label, **style)
    if earlier:
        xs, ys = zip(*EARLIER_WINDOWS)
        by_time.plot(xs, ys, "ko", label="earlier run (README; 10-min window means)")
    for axis, xlabel in ((by_time, "minutes of training"), (by_steps, "agent steps trained (millions)")):
        axis.axhline(TARGET, color="gray", linestyle="--", linewidth=0.8)
        axis.set_xlabel(xlabel)
        axis.grid(alpha=0.3)
    by_time.set_ylabel(f"mean return of the last {LAST_EPISODES} training episodes")
    by_steps.legend(*by_time.get_legend_handles_labels(), loc="lower right", bbox_to_anchor=(1.0, 0.1), fontsize=8)
    fig.suptitle(f"configs/atari_pong.yaml, {len(rows)} runs on 2 cores")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories of configs/atari_pong.yaml")
    parser.add_argument("--out", type=Path, help="the figure (PNG) to write")
    parser.add_argument("--json", type=Path, help="write every run's marks and curve here")
    parser.add_argument("--earlier", action="store_true", help="draw the README's earlier run's window means")
    parser.add_argument("--reference", nargs="*", default=[], metavar="RUN_DIR",
                        help="runs drawn in gray beside the others and left out of the statistics (e.g. one of "
                             "another config)")
    args = parser.parse_args()
    rows = [summarize_run(load_run(path)) for path in args.runs]
    references = [summarize_run(load_run(path)) for path in args.reference]
    print(f"{'run':18s} {'seed':>4s} {'min':>5s} {'agent steps':>12s} {'SPS':>6s} {'take-off (min, steps)':>22s} "
          f"{'+15 (min, steps)':>18s} {'final':>6s} {'dead 1st min':>12s}")
    for row in [*rows, *references]:
        marks = [f"{row[m]['minutes']:5.1f}, {row[m]['agent_steps'] / 1e6:5.2f}M" if row[m] else "-"
                 for m in ("take_off", "reached_15")]
        print(f"{row['run']:18s} {row['seed']:4d} {row['minutes']:5.1f} {row['agent_steps']:12,d} {row['sps']:6,.0f} "
              f"{marks[0]:>22s} {marks[1]:>18s} {row['final_mean_return']:+6.1f} {row['dead_units_first_minute']:12.2f}")
    for mark, name in (("take_off", f"take-off (>= {TAKE_OFF:+.0f})"), ("reached_15", f"reached {TARGET:+.0f}")):
        print(f"{name}: minutes {over_seeds(rows, mark, 'minutes')}; agent steps {over_seeds(rows, mark, 'agent_steps')}")
    if args.out:
        plot(rows, references, args.out, args.earlier)
        print(f"figure: {args.out}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
