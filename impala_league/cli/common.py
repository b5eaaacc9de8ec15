"""What the commands share: the config arguments and their loading, the run's Redis URL and the wait for
it, the --player check, JSON output."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from impala_league.checked_config import load_config
from impala_league.config import Config, ConfigError, describe
from impala_league.distributed.launch.launcher import REDIS_URL_ENV
from impala_league.distributed.wire.transport import connect, shard_urls
from impala_league.league.players import learner_players


MAX_EVAL_GAMES = 10_000  # games per seat; evaluation steps all of them at once


def config_args(p: argparse.ArgumentParser) -> None:
    """--config, --set, --redis-url and --help-config, which every command that reads a config takes."""
    p.add_argument("--config", help="YAML experiment config (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. --set learner.batch_size=64 (repeatable)")
    p.add_argument("--redis-url", help="redis://[:password@]host:port/db of a shared Redis "
                   "(default: run.redis_url, else $IMPALA_REDIS_URL, else an embedded Redis for train)")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and doc")


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def wait_redis_arg(p: argparse.ArgumentParser, what: str = "Redis") -> None:
    """--wait-redis SECONDS (docs/cluster.md, "Exit codes": 4 once it has passed)."""
    p.add_argument("--wait-redis", type=seconds, default=0.0, metavar="SECONDS",
                   help=f"at start, wait up to SECONDS for {what} to answer (default 0: try once); past that, "
                   "exit with code 4, which means: start again later (e.g. Redis starts after this process)")


def load(args: argparse.Namespace) -> Config:
    """The config of --config and --set, checked; with --help-config, print every key and exit."""
    if args.help_config:
        print(describe())
        sys.exit(0)
    return load_config(args.config, args.overrides)


def require_game(cfg: Config) -> None:
    """StarCraft II runs stop here, before any actor starts, when the game is not installed."""
    if cfg.env.name.startswith("sc2:"):  # pysc2 is imported by StarCraft II runs only
        from impala_league.envs.sc2_wrappers.compat import SC2NotInstalledError
        from impala_league.envs.sc2_wrappers.env import check_game_installed

        try:
            check_game_installed(cfg.env.name, cfg.env.kwargs)
        except SC2NotInstalledError as e:
            raise ConfigError(str(e)) from None


def redis_url(args: argparse.Namespace, cfg: Config) -> str | None:
    """--redis-url, else run.redis_url, else $IMPALA_REDIS_URL; None: none given."""
    return args.redis_url or cfg.run.redis_url or os.environ.get(REDIS_URL_ENV)


def connect_waiting(args: argparse.Namespace, cfg: Config, url: str, shards: bool = False):
    """A client of the run's Redis at `url` once it answers PING and, with `shards`, once every other
    server of the trajectory shards (transport.shard_urls) does too: waiting up to --wait-redis seconds
    in all. Raises RedisUnreachable past that (exit code 4); a bad URL or password fails at once (2)."""
    deadline = time.monotonic() + args.wait_redis
    client = connect(url, wait_s=args.wait_redis)
    if shards:
        for server in dict.fromkeys(shard_urls(url, cfg.transport.shards, cfg.transport.shard_urls)):
            if server != url:
                connect(server, wait_s=max(0.0, deadline - time.monotonic())).close()
    return client


def player_arg(args: argparse.Namespace, cfg: Config) -> str:
    """The --player id, checked against the learners this config has."""
    players = learner_players(cfg)
    if args.player not in players:
        raise ConfigError(f"--player {args.player!r} is not a learner of this config; it has: {', '.join(players)} "
                          "(exploiters need league.enabled=true and league.main_exploiters / league.league_exploiters)")
    return args.player


def emit_json(result: dict, target: str) -> None:
    """Print `result` (target "-") or write it to the file `target`."""
    text = json.dumps(result, indent=2)
    if target == "-":
        print(text)
        return
    try:
        Path(target).write_text(text + "\n")
    except OSError as e:
        raise ConfigError(f"--json: cannot write {target}: {e.strerror}") from None
