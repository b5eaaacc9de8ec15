"""The end-of-run evaluations of several runs of one two-player config (e.g. the main command with
`--set run.seed=N`), over the runs: per bot and judge, each seat's win rate and the score pooled over
the seats (win + draw/2), as the mean over runs +- the 95% Student-t half-width with each run's value
(analysis.compare.seeds_text, as `run.py compare --seeds` reports scores; docs/seeds.md).

Reads each run's evaluation.json (bots under `opponents`, outside judges under `judges`, held out from
training) and metrics.jsonl and config.yaml (agent steps trained, minutes, run.seed). Prints a markdown table; --json writes the
numbers.

    python bench/evaluation_seeds.py runs/main_seed0 runs/main_seed1 runs/main_seed2 [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from omegaconf import OmegaConf  # noqa: E402

from impala_league.analysis.compare import score_statistics, seeds_text  # noqa: E402
from impala_league.records import upgraded  # noqa: E402


def run_summary(run_dir: Path) -> dict:
    """One run's evaluation: per opponent (bots, then judges) each seat's win rate and score, the pooled
    score and the games per seat; and the run's agent steps trained and training minutes."""
    evaluation = upgraded(json.loads((run_dir / "evaluation.json").read_text()))
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    seed = OmegaConf.load(run_dir / "config.yaml").run.seed
    opponents = {}
    for kind in ("opponents", "judges"):
        for name, seats in (evaluation.get(kind) or {}).items():
            seats = dict(sorted(seats.items(), key=lambda item: item[1]["seat"]))
            games = sum(s["games"] for s in seats.values())
            opponents[name] = {"held_out": kind == "judges", "games_per_seat": [s["games"] for s in seats.values()],
                               "win_rate": [s["win_rate"] for s in seats.values()],
                               "score": [s["score"] for s in seats.values()],
                               "pooled": sum(s["score"] * s["games"] for s in seats.values()) / games}
    return {"run": str(run_dir), "seed": seed, "agent_steps": evaluation["agent_steps_trained"],
            "updates": evaluation["step"], "minutes": last["elapsed_s"] / 60, "opponents": opponents}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, one per seed")
    parser.add_argument("--json", type=Path, help="write the per-run numbers and the table's here")
    args = parser.parse_args()
    runs = [run_summary(r) for r in args.runs]
    names = [n for n in runs[0]["opponents"] if all(n in r["opponents"] for r in runs)]
    print(f"{len(runs)} runs: " + "; ".join(f"{r['run']} (seed {r['seed']}): {r['agent_steps'] / 1e6:.2f}M agent "
                                             f"steps, {r['updates']:,} updates in {r['minutes']:.1f} min" for r in runs))
    print("\n| opponent | games a seat | won, first seat, % | won, second seat, % | score, seats pooled |")
    print("|---|---|---|---|---|")
    table = {}
    for name in names:
        per_run = [r["opponents"][name] for r in runs]
        first, second = ([100 * o["win_rate"][seat] for o in per_run] for seat in (0, 1))
        pooled = [o["pooled"] for o in per_run]
        table[name] = {"first_seat_won_percent": score_statistics(first),
                       "second_seat_won_percent": score_statistics(second),
                       "pooled_score": score_statistics(pooled)}
        label = f"{name} (held out)" if per_run[0]["held_out"] else name
        games = "/".join(str(g) for g in per_run[0]["games_per_seat"])
        print(f"| {label} | {games} | {seeds_text(first, 1)} | {seeds_text(second, 1)} | {seeds_text(pooled, 2)} |")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "over_runs": table}, indent=1))


if __name__ == "__main__":
    main()
