"""Two-player Pong's league against the built-in player it never meets, over the run's minutes, beside
single-player Pong's training against that player.

For each run of configs/atari_pong_league.yaml: its main agent's league snapshots nearest every
`--every` minutes of training (metrics.jsonl's elapsed_s, which a resume continues) and its final
checkpoint, each judged as first_0 of ALE/Pong-v5 over `--games` games (`run.py evaluate --env atari:Pong
--seat first_0`, games seeded 0..games-1, so every point plays the same games; docs/atari_judge.md), under
the evaluation `--protocol` (sticky actions by default; docs/atari.md), greedy or sampled (`--play`).
Judgements are kept in `--json` with their protocol and play (points kept before protocols were recorded
read as deterministic and greedy), and a rerun judges only the points it lacks, so the curve of a resumed
run grows without judging its first hour again. Single-player runs
(configs/atari_pong.yaml) are drawn from their own metrics: the mean return of their last 20 training
episodes (sampled actions) against the same built-in player (bench/pong_seeds.py).

    python bench/pong_league_curve.py runs/atari_pong_league [RUN_DIR ...] --single runs/pong_seed0 \
        runs/pong_seed1 runs/pong_seed2 --every 5 --games 30 --play greedy sampled --jobs 2 \
        --json docs/pong_league_curve.json --out docs/pong_league_curve.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from impala_league.analysis.runs import Run, load_run  # noqa: E402
from pong_seeds import recent_returns  # noqa: E402

TARGET = 10.0  # the league's aim against the built-in player
PLAYS = ("greedy", "sampled")


def point_key(point: dict) -> tuple:
    """What makes two judgements of one checkpoint the same: games, protocol and play (a point kept before
    protocols were recorded was played greedily without sticky actions)."""
    return (point["checkpoint"], point["games"], point.get("protocol", "deterministic"), point.get("play", "greedy"))


def snapshot_minutes(run: Run) -> list[tuple[Path, int, float]]:
    """(path, update, minutes of training) of each main-agent snapshot of `run`, in order; a snapshot's
    minutes are those of the metrics record nearest its update."""
    records = [r for r in run.records if "step" in r and "elapsed_s" in r]
    if not records:
        raise SystemExit(f"{run.path} has no metrics records with step and elapsed_s")
    steps = np.array([r["step"] for r in records])
    rows = []
    for path in sorted((run.path / "league" / "snapshots").glob("main-*.safetensors")):
        update = int(path.stem.split("-")[1])
        nearest = records[int(np.abs(steps - update).argmin())]
        rows.append((path, update, run.elapsed(nearest) / 60))
    return rows


def pick(snapshots: list[tuple[Path, int, float]], every: float) -> list[tuple[Path, int, float]]:
    """The snapshot nearest each multiple of `every` minutes (the first snapshot for 0), no repeats."""
    if not snapshots:
        return []
    minutes = np.array([m for _, _, m in snapshots])
    chosen = []
    for mark in np.arange(0.0, minutes.max() + every / 2, every):
        row = snapshots[int(np.abs(minutes - mark).argmin())]
        if row not in chosen:
            chosen.append(row)
    return chosen


def judge(checkpoint: Path, games: int, protocol: str, play: str) -> dict:
    """`run.py evaluate`'s JSON for `checkpoint` as first_0 of atari:Pong, `games` games from seed 0 under
    `protocol`, greedy or sampled (`play`)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "judge.json"
        subprocess.run([sys.executable, str(REPO / "run.py"), "evaluate", "--checkpoint", str(checkpoint),
                        "--env", "atari:Pong", "--seat", "first_0", "--games", str(games), "--protocol", protocol,
                        *(["--sample"] if play == "sampled" else []), "--json", str(out)],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def plot(series: dict[str, list[dict]], singles: list[Run], out: Path) -> None:
    """Each league run's judged points of each play (mean return with its min-max range), by its label in
    `series`, and each single-player run's training curve, against minutes of training."""
    fig, axis = plt.subplots(figsize=(9, 4.8))
    for run in singles:
        minutes, _, means = recent_returns(run)
        axis.plot(minutes, means, color="gray", alpha=0.7, linewidth=1,
                  label=None if run is not singles[0] else "one-player Pong (configs/atari_pong.yaml), training against "
                                                             "the built-in player: last 20 episodes, sampled")
    for i, (label, points) in enumerate(series.items()):
        xs = np.array([p["minutes"] for p in points])
        means = np.array([p["mean_return"] for p in points])
        low, high = means - [p["min_return"] for p in points], [p["max_return"] for p in points] - means
        first = points[0]
        axis.errorbar(xs + 0.4 * i, means, yerr=[low, high], fmt="o-", color=f"C{i}", capsize=3,
                      label=f"{label}: {first.get('play', 'greedy')} as first_0, {first['games']} games, "
                            f"{first.get('protocol', 'deterministic')} protocol (bars: min, max)")
    axis.axhline(TARGET, color="C3", linestyle="--", linewidth=0.8, label=f"aim: {TARGET:+.0f}")
    axis.set_xlabel("minutes of training (2 cores)")
    axis.set_ylabel("return against ALE/Pong-v5's built-in player")
    axis.set_ylim(-22, 22)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    axis.set_title("two-player Pong's league (configs/atari_pong_league.yaml) against the built-in player it "
                   "never met", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of configs/atari_pong_league.yaml")
    parser.add_argument("--single", nargs="*", default=[], metavar="RUN_DIR",
                        help="runs of configs/atari_pong.yaml to draw beside them")
    parser.add_argument("--every", type=float, default=5.0, help="minutes between judged snapshots (default 5)")
    parser.add_argument("--games", type=int, default=30, help="games against the built-in player per point")
    parser.add_argument("--protocol", default="sticky", choices=("sticky", "deterministic"),
                        help="the evaluation protocol (docs/atari.md; default sticky)")
    parser.add_argument("--play", nargs="+", default=["greedy"], choices=PLAYS,
                        help="judge each point greedy, sampled, or both (default greedy)")
    parser.add_argument("--jobs", type=int, default=2, help="judgements at once, one process each")
    parser.add_argument("--json", type=Path, required=True, help="judgements kept here (read first if it exists)")
    parser.add_argument("--out", type=Path, help="the figure (PNG) to write")
    args = parser.parse_args()

    kept = json.loads(args.json.read_text()) if args.json.exists() else []
    done = {point_key(p) for p in kept}
    series = {}
    for run in map(load_run, args.runs):
        final = run.path / "checkpoints" / "latest.safetensors"
        records = [r for r in run.records if "step" in r and "elapsed_s" in r]
        wanted = pick(snapshot_minutes(run), args.every)
        if final.exists() and records:
            # A resumed run overwrites latest.safetensors, so the final is named by its update.
            wanted.append((final, records[-1]["step"], run.elapsed(records[-1]) / 60))
        todo = [(path, update, minutes, play) for path, update, minutes in wanted for play in args.play
                if (f"{path}@{update}", args.games, args.protocol, play) not in done]
        print(f"{run.path}: {len(wanted)} points, {len(todo)} judgements to play ({args.games} games each, "
              f"{args.protocol} protocol, {args.jobs} at once)")

        def one(row: tuple[Path, int, float, str], run: Run = run) -> dict:
            path, update, minutes, play = row
            result = judge(path, args.games, args.protocol, play)
            point = {"run": str(run.path), "checkpoint": f"{path}@{update}", "update": update,
                     "minutes": round(minutes, 2), "protocol": args.protocol, "play": play,
                     **{k: result[k] for k in ("games", "mean_return", "interval", "std_return", "min_return",
                                               "max_return", "distinct_returns", "wins", "losses", "returns",
                                               "mean_length")}}
            print(f"  {minutes:6.1f} min  update {update:7,d}  {play:7s} {point['mean_return']:+6.1f}  "
                  f"(min {point['min_return']:+.0f}, max {point['max_return']:+.0f}, "
                  f"{point['distinct_returns']} distinct)", flush=True)
            return point

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for point in pool.map(one, todo):
                kept.append(point)
                args.json.write_text(json.dumps(sorted(kept, key=lambda p: (p["run"], p["minutes"])), indent=1))
        for play in args.play:
            points = sorted((p for p in kept if p["run"] == str(run.path)
                             and point_key(p)[1:] == (args.games, args.protocol, play)), key=lambda p: p["minutes"])
            if not points:
                raise SystemExit(f"{run.path} has no league snapshots or checkpoint to judge")
            best = max(points, key=lambda p: p["mean_return"])
            print(f"{play}: best {best['mean_return']:+.1f} at {best['minutes']:.1f} min (update {best['update']:,d}); "
                  f"last: {points[-1]['mean_return']:+.1f} at {points[-1]['minutes']:.1f} min")
            series[f"{run.path.name} (learning rate {run.config.learner.lr_schedule}), {play}"] = points
    if args.out:
        plot(series, [load_run(path) for path in args.single], args.out)
        print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
