"""`run.py league`: the league manager (snapshots, payoff, Elo, opponent distributions) against a Redis."""

from __future__ import annotations

import argparse
from pathlib import Path

from impala_league.cli.common import config_args, connect_waiting, load, redis_url, wait_redis_arg
from impala_league.config import ConfigError
from impala_league.distributed.launch.ownership import exit_with_launcher
from impala_league.league.manager import run_league

NAME = "league"


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `league` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       epilog='example: .venv/bin/python run.py league --config configs/connect_four_league.yaml --redis-url redis://:PASSWORD@HOST:6379/0')
    config_args(p)
    wait_redis_arg(p)
    p.add_argument("--run-dir", help="run directory (default: <run.dir>/<run.name>)")
    p.add_argument("--resume", action="store_true", help="continue from <run-dir>/league/state.json")
    return p


def run(args: argparse.Namespace) -> int:
    """The league manager against the run's Redis; returns its exit code."""
    exit_with_launcher("league manager")
    cfg = load(args)
    if not cfg.league.enabled:
        raise ConfigError("the league manager needs league.enabled=true")
    url = redis_url(args, cfg)
    if not url:
        raise ConfigError("the league manager needs a Redis: pass --redis-url or set run.redis_url")
    connect_waiting(args, cfg, url).close()
    run_dir = Path(args.run_dir) if args.run_dir else Path(cfg.run.dir) / cfg.run.name
    return run_league(cfg, url, run_dir, resume=args.resume)
