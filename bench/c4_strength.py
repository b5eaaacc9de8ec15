"""Connect four's strength against judges a run never trained against, over the run's minutes.

For each run directory of a connect-four league: its main agent's snapshots nearest each of `--minutes`
minutes of training (metrics.jsonl's elapsed_s) and its final checkpoint, each judged greedily by
- the perfect solver's positions (`run.py evaluate --positions N --seed S`): optimal and blunder rates;
- each `--judges` judge (e.g. mcts:400, mcts:1600), `--games` games a seat, seats pooled (win + draw/2).
Judgements are kept in `--json`, and a rerun judges only what it lacks. It prints one row per point and,
with several runs, each minute mark's mean and spread over them.

    python bench/c4_strength.py runs/c4_seed1 runs/c4_seed2 --minutes 15 30 60 --positions 1000 \
        --positions-seed 1 --judges mcts:1600 --games 50 --jobs 2 --json docs/c4_strength.json
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

import numpy as np  # noqa: E402

from impala_league.analysis.runs import load_run  # noqa: E402
from impala_league.records import upgraded  # noqa: E402
from pong_league_curve import snapshot_minutes  # noqa: E402


def evaluate(args: list[str]) -> dict:
    """`run.py evaluate ARGS --json FILE`'s JSON."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out.json"
        subprocess.run([sys.executable, str(REPO / "run.py"), "evaluate", *args, "--json", str(out)], check=True,
                       cwd=REPO, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def judge(checkpoint: Path, what: str, count: int, seed: int) -> dict:
    """One judgement of `checkpoint`: `what` "positions" (count positions of seed `seed`: the rates over the
    positions not already lost) or a judge spec (count games a seat from seed `seed`: the pooled score)."""
    if what == "positions":
        r = evaluate(["--checkpoint", str(checkpoint), "--positions", str(count), "--seed", str(seed)])
        return {"optimal": r["all"]["optimal"], "blunder": r["all"]["blunder"], "positions": r["all"]["positions"],
                "phases": {name: p["blunder"] for name, p in r["phases"].items()}}
    r = evaluate(["--checkpoint", str(checkpoint), "--opponent", what, "--games", str(count), "--seed", str(seed)])
    seats = list(r["seats"].values())
    return {"score": float(np.mean([s["score"] for s in seats])), "seats": [s["score"] for s in seats],
            "games": count}


def points(run_dir: Path, minutes: list[float]) -> list[tuple[str, Path, int, float, int]]:
    """(label, checkpoint, update, minutes, agent steps) of the snapshots nearest `minutes` and the final."""
    run = load_run(run_dir)
    snapshots = snapshot_minutes(run)
    out = []
    for mark in minutes:
        near = [s for s in snapshots if abs(s[2] - mark) <= 1.0]
        if near:
            path, update, at = min(near, key=lambda s: abs(s[2] - mark))
            meta_file = path.with_suffix(".json")
            meta = upgraded(json.loads(meta_file.read_text())) if meta_file.exists() else {}
            out.append((f"{mark:g} min", path, update, at, meta.get("agent_steps_trained") or 0))
    final = run_dir / "checkpoints" / "latest.safetensors"
    records = [r for r in run.records if "step" in r and "elapsed_s" in r]
    if final.exists() and records:
        out.append(("final", final, records[-1]["step"], run.elapsed(records[-1]) / 60,
                    records[-1].get("agent_steps_trained", 0)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of connect-four leagues")
    parser.add_argument("--minutes", nargs="*", type=float, default=[], help="snapshots nearest these minutes")
    parser.add_argument("--positions", type=int, default=1000, help="solver's positions a point (0: none)")
    parser.add_argument("--positions-seed", type=int, default=1, help="the positions' seed (default 1)")
    parser.add_argument("--judges", nargs="*", default=[], help="judge specs a point plays, e.g. mcts:400")
    parser.add_argument("--judges-seed", type=int, default=0, help="seed of the judges' games (default 0)")
    parser.add_argument("--games", type=int, default=50, help="games a seat against each judge")
    parser.add_argument("--jobs", type=int, default=2, help="judgements at once, one process each")
    parser.add_argument("--json", type=Path, required=True, help="judgements kept here (read first if it exists)")
    args = parser.parse_args()

    kept = json.loads(args.json.read_text()) if args.json.exists() else {}
    todo = []
    rows = []
    for run_dir in args.runs:
        for label, path, update, at, agent_steps in points(run_dir, args.minutes):
            key = f"{path.resolve()}@{update}"
            rows.append((run_dir.name, label, key, at, agent_steps))
            wanted = ([("positions", args.positions, args.positions_seed)] if args.positions else []) + \
                [(j, args.games, args.judges_seed) for j in args.judges]
            for what, count, seed in wanted:
                name = f"{what}:{count}:{seed}"
                if name not in kept.get(key, {}):
                    todo.append((key, path, what, count, seed, name))
    print(f"{len(rows)} points, {len(todo)} judgements to make ({args.jobs} at once)", flush=True)

    def one(job):
        key, path, what, count, seed, name = job
        result = judge(path, what, count, seed)
        kept.setdefault(key, {})[name] = result
        args.json.write_text(json.dumps(kept, indent=1) + "\n")
        print(f"  {key}: {name} {result.get('blunder', result.get('score')):.3f}", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, todo))
    names = ([f"positions:{args.positions}:{args.positions_seed}"] if args.positions else []) + \
        [f"{j}:{args.games}:{args.judges_seed}" for j in args.judges]
    print("run  point  minutes  agent steps  " + "  ".join(names))
    by_label: dict[str, list[list[float]]] = {}
    for run_name, label, key, at, agent_steps in rows:
        values = [kept[key][n].get("blunder", kept[key][n].get("score")) for n in names]
        by_label.setdefault(label, []).append(values)
        print(f"{run_name}  {label}  {at:.1f}  {agent_steps:,}  " + "  ".join(f"{v:.3f}" for v in values))
    if len(args.runs) > 1:
        print("over runs (mean, min-max): blunder rate for positions, pooled score for judges")
        for label, values in by_label.items():
            v = np.array(values)
            print(f"  {label} ({len(v)} runs): " + "  ".join(
                f"{n} {c.mean():.3f} ({c.min():.3f}-{c.max():.3f})" for n, c in zip(names, v.T)))


if __name__ == "__main__":
    main()
