"""Learning players of a run: their ids, roles, Redis namespaces and files.

The main agent is the run itself: its keys are `{run}:traj`, `{run}:params`, ... and its files
`checkpoints/latest.safetensors` and `metrics.jsonl`, exactly as in a run without a league. Every
other learner `p` (an exploiter) has its own namespace `{run}:{p}` (so `{run}:{p}:traj`, ...),
`checkpoints/{p}/latest.safetensors` and `metrics-{p}.jsonl`.
"""

from __future__ import annotations

import re
from pathlib import Path

from impala_league.config import Config

MAIN = "main"
ROLES = ("main", "main_exploiter", "league_exploiter")
PLAYER_ID = re.compile(r"main|(main_exploiter|league_exploiter)_\d+")
SNAPSHOT_ID = re.compile(r"(main|(main_exploiter|league_exploiter)_\d+)-\d{7,}")  # `<learner>-<update>`, a safe file name


def learner_players(cfg: Config) -> list[str]:
    """Ids of the run's learners: `main`, then `main_exploiter_0..`, then `league_exploiter_0..`."""
    players = [MAIN]
    if cfg.league.enabled:
        players += [f"main_exploiter_{k}" for k in range(cfg.league.main_exploiters)]
        players += [f"league_exploiter_{k}" for k in range(cfg.league.league_exploiters)]
    return players


def role(player: str) -> str:
    """The role of a learner id (`main_exploiter_0` -> `main_exploiter`). Raises ValueError."""
    if not PLAYER_ID.fullmatch(player):
        raise ValueError(f"{player!r} is not a learner id (main, main_exploiter_N, league_exploiter_N)")
    return player if player == MAIN else player.rsplit("_", 1)[0]


def namespace(run: str, player: str) -> str:
    """Prefix of the player's own Redis keys (trajectories, params, lease, dead letters)."""
    return run if player == MAIN else f"{run}:{player}"


def checkpoint_dir(run_dir: Path, player: str) -> Path:
    return Path(run_dir) / "checkpoints" if player == MAIN else Path(run_dir) / "checkpoints" / player


def metrics_path(run_dir: Path, player: str) -> Path:
    return Path(run_dir) / ("metrics.jsonl" if player == MAIN else f"metrics-{player}.jsonl")
