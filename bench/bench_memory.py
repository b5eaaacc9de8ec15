"""Memory tasks: an LSTM core against the memoryless network, side by side, on this machine.

For each config (each a memory task with `agent.core: lstm`) and each seed (`run.seed`), `run.py train`
runs with the same budget (`run.max_minutes` of the config, or --minutes), once as it is and once with
`agent.core=none` (--cores picks; --none-seeds gives the memoryless network fewer seeds); then the final
greedy evaluation's mean return (run.py's own, `--episodes` episodes) is read from the run's
evaluation.json. A uniformly random policy's mean return over the same number of episodes, played
through the same env adapter, and the best possible return sit beside them. Prints a markdown table:
over several seeds each cell is the mean, the 95% Student-t half-width and the seeds' values
(analysis.compare.seeds_text, as `run.py compare --seeds` reports scores).

    python bench/bench_memory.py [--minutes 6] [--episodes 200] [--seeds 0 1 2] [--none-seeds 0]
                                 [--configs configs/memory_cue.yaml ...]

Each run takes the whole machine: run nothing else meanwhile (the table gives agent steps and minutes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from impala_league.analysis.compare import seeds_text  # noqa: E402
from impala_league.config import load_config  # noqa: E402
from impala_league.envs.registry import make_env  # noqa: E402

CONFIGS = ["configs/memory_cue.yaml", "configs/popgym_repeat_previous.yaml", "configs/popgym_position_cartpole.yaml"]
BEST = {"cue_recall": 1.0, "popgym:RepeatPreviousEasy": 1.0, "popgym:PositionOnlyCartPoleEasy": 1.0}


def random_return(cfg, episodes: int, seed: int = 0) -> float:
    """Mean return of uniformly random legal actions over `episodes` episodes of the config's env."""
    rng = np.random.default_rng(seed)
    env = make_env(cfg.env.name, seed, cfg.env.kwargs)
    returns: list[float] = []
    step = env.advance()
    while len(returns) < episodes:
        env.act([int(rng.choice(np.flatnonzero(mask))) for mask in step.action_masks])
        step = env.advance()
        returns += [e.returns[0] for e in step.episodes]
    return float(np.mean(returns[:episodes]))


def train(config: str, core: str, seed: int, minutes: float | None, episodes: int, out: Path) -> dict:
    """One `run.py train`; its agent steps trained, updates, training minutes and the greedy evaluation's mean
    return."""
    name = f"bench_memory-{Path(config).stem}-{core}-seed{seed}-{int(time.time())}"
    cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / config), "--eval-games",
           str(episodes), "--set", f"run.name={name}", "--set", f"run.dir={out}", "--set", f"agent.core={core}",
           "--set", f"run.seed={seed}", "--set", "run.wandb_mode=disabled"]
    if minutes is not None:
        cmd += ["--set", f"run.max_minutes={minutes}"]
    start = time.monotonic()
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - start
    run_dir = out / name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    # When the training episodes' mean return (the sampling policy's) first came within 90% of the best.
    best = BEST.get(load_config(REPO / config).env.name, float("inf"))
    reached = next((r for r in records if (r.get("episode_return") or -math.inf) >= 0.9 * best), None)
    return {"seed": seed, "agent_steps": records[-1]["agent_steps_trained"], "minutes": records[-1]["elapsed_s"] / 60,
            "wall_minutes": wall / 60,
            "return": evaluation["episodes"]["mean_return"],
            "minutes_to_90": None if reached is None else reached["elapsed_s"] / 60,
            "agent_steps_to_90": None if reached is None else reached["agent_steps_trained"]}


def column(runs: list[dict], key: str, scale: float = 1.0) -> list[float | None]:
    """`key` of each run (seed), divided by `scale`; None where the run has none."""
    return [None if run[key] is None else run[key] / scale for run in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=CONFIGS)
    parser.add_argument("--minutes", type=float, default=None, help="training minutes of each run (default: "
                        "the config's run.max_minutes)")
    parser.add_argument("--episodes", type=int, default=200, help="greedy evaluation episodes per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="run.seed of each run (default: 0)")
    parser.add_argument("--none-seeds", type=int, nargs="*", default=None, help="the memoryless network's seeds "
                        "(default: --seeds; none at all skips it)")
    parser.add_argument("--out", default=str(REPO / "runs"), help="parent folder of the runs")
    args = parser.parse_args()
    none_seeds = args.seeds if args.none_seeds is None else args.none_seeds
    out = Path(args.out)
    rows = []
    for config in args.configs:
        cfg = load_config(REPO / config)
        results = {core: [train(config, core, seed, args.minutes, args.episodes, out) for seed in seeds]
                   for core, seeds in (("lstm", args.seeds), ("none", none_seeds))}
        rows.append((cfg.env.name, results, random_return(cfg, args.episodes)))
        print(json.dumps({"env": cfg.env.name, **results}), flush=True)
    print(f"\n| env | LSTM ({len(args.seeds)} seeds) | memoryless ({len(none_seeds)}) | random | best "
          "| LSTM within 90% of best (training), min | agent steps trained, M (LSTM / none) | minutes each |")
    print("|---|---|---|---|---|---|---|---|")
    for env, r, rand in rows:
        lstm, none = r["lstm"], r["none"]
        steps_none = seeds_text(column(none, "agent_steps", 1e6), 2) if none else "-"
        memoryless = seeds_text(column(none, "return"), 3) if none else "-"
        print(f"| {env} | {seeds_text(column(lstm, 'return'), 3)} | {memoryless} | {rand:.3f} | "
              f"{BEST.get(env, float('nan')):.1f} | {seeds_text(column(lstm, 'minutes_to_90'), 1)} | "
              f"{seeds_text(column(lstm, 'agent_steps', 1e6), 2)} / {steps_none} | {lstm[0]['minutes']:.1f} |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
