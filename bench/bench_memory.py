"""Memory tasks: an LSTM core against the memoryless network, side by side, on this machine.

For each config (each a memory task with `agent.core: lstm`), `run.py train` runs twice with the same
budget (`run.max_minutes` of the config, or --minutes), once as it is and once with `agent.core=none`;
then the final greedy evaluation's mean return (run.py's own, `--episodes` episodes) is read from the
run's evaluation.json. A uniformly random policy's mean return over the same number of episodes, played
through the same env adapter, and the best possible return sit beside them. Prints a markdown table.

    python bench/bench_memory.py [--minutes 6] [--episodes 200] [--configs configs/memory_cue.yaml ...]

Each run takes the whole machine: run nothing else meanwhile (the table gives frames and minutes).
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


def train(config: str, core: str, minutes: float | None, episodes: int, out: Path) -> dict:
    """One `run.py train`; its frames, updates, training minutes and the greedy evaluation's mean return."""
    name = f"bench_memory-{Path(config).stem}-{core}-{int(time.time())}"
    cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / config), "--eval-games",
           str(episodes), "--set", f"run.name={name}", "--set", f"run.dir={out}", "--set", f"agent.core={core}",
           "--set", "run.wandb_mode=disabled"]
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
    return {"frames": records[-1]["frames"], "minutes": records[-1]["elapsed_s"] / 60, "wall_minutes": wall / 60,
            "return": evaluation["episodes"]["mean_return"],
            "minutes_to_90": None if reached is None else reached["elapsed_s"] / 60,
            "frames_to_90": None if reached is None else reached["frames"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=CONFIGS)
    parser.add_argument("--minutes", type=float, default=None, help="training minutes of each run (default: "
                        "the config's run.max_minutes)")
    parser.add_argument("--episodes", type=int, default=200, help="greedy evaluation episodes per run")
    parser.add_argument("--out", default=str(REPO / "runs"), help="parent folder of the runs")
    args = parser.parse_args()
    out = Path(args.out)
    rows = []
    for config in args.configs:
        cfg = load_config(REPO / config)
        results = {core: train(config, core, args.minutes, args.episodes, out) for core in ("lstm", "none")}
        rows.append((cfg.env.name, results, random_return(cfg, args.episodes)))
        print(json.dumps({"env": cfg.env.name, **results}), flush=True)
    print("\n| env | LSTM | memoryless | random | best | LSTM within 90% of best (training) | agent steps trained (LSTM / none) "
          "| minutes each |")
    print("|---|---|---|---|---|---|---|---|")
    for env, r, rand in rows:
        lstm = r["lstm"]
        reached = ("never" if lstm["minutes_to_90"] is None else
                   f"{lstm['minutes_to_90']:.1f} min, {lstm['frames_to_90'] / 1e6:.2f}M steps")
        print(f"| {env} | {lstm['return']:.3f} | {r['none']['return']:.3f} | {rand:.3f} | "
              f"{BEST.get(env, float('nan')):.1f} | {reached} | {lstm['frames'] / 1e6:.2f}M / "
              f"{r['none']['frames'] / 1e6:.2f}M | {lstm['minutes']:.1f} |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
