"""Env and bot cost: our board-game adapter vs PettingZoo's wrapped env, and a bot move vs an env step.

Side by side in one process, random legal moves, the same number of moves each:
* reference: PettingZoo's `env()` (its checking wrappers included) stepped through `last()`/`step()`;
* ours: `make_env(name)`, the AEC adapter the actors use (`raw_env` plus our own legality check);
* the league bots' cost per move (`tactical`, `minimax:2`), over positions from random games, as a
  multiple of one adapter step: asked one position at a time and, as the actors ask them, for a
  batch of positions at once; and `minimax:2` by alpha-beta (the search deeper bots use), one position
  at a time, as the reference for its batched full-width search.

    python bench/bench_env.py [--env connect_four] [--moves 20000]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from impala_league.envs.registry import make_env  # noqa: E402
from impala_league.evaluation import bots  # noqa: E402

MODULES = {"connect_four": "pettingzoo.classic.connect_four_v3", "tictactoe": "pettingzoo.classic.tictactoe_v3"}


def pettingzoo_rate(module: str, moves: int, seed: int) -> tuple[float, list[tuple[np.ndarray, np.ndarray]]]:
    """Moves per second of PettingZoo's wrapped env, and every (observation, mask) it showed."""
    env = importlib.import_module(module).env()
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    positions = []
    start = time.perf_counter()
    for _ in range(moves):
        obs, _, terminated, truncated, _ = env.last()
        while terminated or truncated:
            env.reset()
            obs, _, terminated, truncated, _ = env.last()
        positions.append((obs["observation"], obs["action_mask"]))
        legal = np.flatnonzero(obs["action_mask"])
        env.step(int(legal[rng.integers(len(legal))]))
    return moves / (time.perf_counter() - start), positions


def adapter_rate(name: str, moves: int, seed: int) -> float:
    """Moves per second of the actors' adapter (`advance` + `act`)."""
    env = make_env(name, seed)
    rng = np.random.default_rng(seed)
    step = env.advance()
    start = time.perf_counter()
    for _ in range(moves):
        legal = np.flatnonzero(step.action_masks[0])
        env.act([int(legal[rng.integers(len(legal))])])
        step = env.advance()
    return moves / (time.perf_counter() - start)


def bot_seconds_per_move(spec: str, name: str, positions: list, batch: int) -> float:
    """Seconds per position of `act_batch` on `batch` positions at a time."""
    bot = bots.make_bot(spec, name, seed=0)
    observations = np.stack([o for o, _ in positions])
    masks = np.stack([m for _, m in positions])
    start = time.perf_counter()
    for first in range(0, len(positions), batch):
        bot.act_batch(observations[first:first + batch], masks[first:first + batch])
    return (time.perf_counter() - start) / len(positions)


def alpha_beta_seconds_per_move(name: str, depth: int, positions: list) -> float:
    """Seconds per position of the alpha-beta search, every position searched (none from the cache)."""
    bot = bots.MinimaxBot(name, depth, seed=0)
    game = bots.GAMES[name]
    start = time.perf_counter()
    for observation, mask in positions:
        bot.scores(game.board_from_observation(observation), np.flatnonzero(mask).tolist())
    return (time.perf_counter() - start) / len(positions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="connect_four", choices=sorted(MODULES))
    parser.add_argument("--moves", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32, help="positions per act_batch call, as an actor's envs")
    args = parser.parse_args()
    reference, positions = pettingzoo_rate(MODULES[args.env], args.moves, args.seed)
    ours = adapter_rate(args.env, args.moves, args.seed)
    print(f"{args.env}: PettingZoo env() {reference:,.0f} moves/s, our adapter {ours:,.0f} moves/s, "
          f"ratio {ours / reference:.2f}")
    sample = positions[:3000]
    for spec in ("tactical", "minimax:2"):
        single, batched = (bot_seconds_per_move(spec, args.env, sample, n) for n in (1, args.batch))
        print(f"{spec}: {single * 1e6:,.0f} us per move one at a time = {single * ours:.1f} adapter steps; "
              f"{batched * 1e6:,.0f} us in batches of {args.batch} = {batched * ours:.1f} adapter steps")
    alpha_beta = alpha_beta_seconds_per_move(args.env, 2, sample)
    print(f"minimax:2 by alpha-beta, one at a time: {alpha_beta * 1e6:,.0f} us per move; the batched search "
          f"is {alpha_beta / batched:.1f}x faster")


if __name__ == "__main__":
    main()
