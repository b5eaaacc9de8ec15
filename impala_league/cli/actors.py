"""`run.py actors`: the actors of one host, supervised with the launcher's rules."""

from __future__ import annotations

import argparse
import os

from impala_league.cli.common import config_args, connect_waiting, load, player_arg, redis_url, require_game, wait_redis_arg
from impala_league.config import ConfigError
from impala_league.distributed.launch.launcher import supervise_actors

NAME = "actors"

ACTORS_HELP = """Run the actors of one host: C `run.py actor` processes (default: one per CPU of this
host), each with this command's --config, --set, --player and --wait-redis, each taking the lowest free
actor id of the run. The Redis URL reaches them through the environment, never their command line.

  run.py actors --config configs/connect_four.yaml --redis-url redis://:PASSWORD@HOST:6379/0 --count 16

It supervises them as `run.py train` does its own: a line per actor started, restarted or ended, with
its pid. An actor that crashes is started again (its id released first), up to 20 restarts in all,
then every actor is stopped (exit code 1). An actor that exits with code 2 (a config error) stops them
all (2). When the run is over (the learner set its done key) the actors end and so does this (0).
SIGTERM, SIGINT or SIGHUP sends every actor SIGTERM, kills those left after 10 s (at once on a second
signal), and exits with 128 + the signal's number. If this process is killed, its actors die with it.
"""


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `actors` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       description=ACTORS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    config_args(p)
    wait_redis_arg(p, "Redis and the trajectory shards' servers (each actor waits as long)")
    p.add_argument("--count", type=int, default=os.cpu_count() or 1, metavar="C",
                   help=f"actor processes to run (default: this host's CPU count, {os.cpu_count() or 1})")
    p.add_argument("--player", default="main", help="the learner these actors play for (default main)")
    return p


def run(args: argparse.Namespace) -> int:
    """Supervise --count actors on this host until the run is over; returns the exit code."""
    cfg = load(args)
    require_game(cfg)
    if args.count < 1:
        raise ConfigError(f"--count must be >= 1 (actor processes on this host), got {args.count}")
    url = redis_url(args, cfg)
    if not url:
        raise ConfigError("the actors need a Redis: pass --redis-url or set run.redis_url")
    player = player_arg(args, cfg)
    connect_waiting(args, cfg, url, shards=True).close()
    return supervise_actors(cfg, args.config, args.overrides, url, args.count, player, args.wait_redis)
