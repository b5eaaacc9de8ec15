"""`run.py actor`: one actor process against a Redis."""

from __future__ import annotations

import argparse

from impala_league.cli.common import config_args, connect_waiting, load, player_arg, redis_url, require_game, wait_redis_arg
from impala_league.config import ConfigError
from impala_league.distributed.actor import run_actor
from impala_league.distributed.launch.ownership import exit_with_launcher
from impala_league.evaluation.bots import league_bot

NAME = "actor"


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `actor` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       epilog='example: .venv/bin/python run.py actor --config configs/connect_four.yaml --redis-url redis://:PASSWORD@HOST:6379/0')
    config_args(p)
    wait_redis_arg(p, "Redis and the trajectory shards' servers")
    p.add_argument("--actor-id", type=int, default=None,
                   help="this actor's id in the run (refused if a live actor holds it); default: the lowest free id")
    p.add_argument("--player", default="main", help="the learner this actor plays for (default main)")
    return p


def run(args: argparse.Namespace) -> int:
    """One actor (or A3C worker) against the run's Redis; returns its exit code."""
    exit_with_launcher(f"actor {args.actor_id}")
    cfg = load(args)
    require_game(cfg)
    if args.actor_id is not None and args.actor_id < 0:
        raise ConfigError("--actor-id must be >= 0")
    url = redis_url(args, cfg)
    if not url:
        raise ConfigError("the actor needs a Redis: pass --redis-url or set run.redis_url")
    player = player_arg(args, cfg)
    connect_waiting(args, cfg, url, shards=True).close()
    if cfg.learner.algo == "a3c":
        from impala_league.distributed.a3c import A3CWorker  # it pulls in the learner's modules: for A3C's workers only

        return run_actor(cfg, url, args.actor_id, player, actor_class=A3CWorker, bots=league_bot)
    return run_actor(cfg, url, args.actor_id, player, bots=league_bot)
