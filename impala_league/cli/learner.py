"""`run.py learner`: one learner (a rank of several with learner.num_learners) against a Redis."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from impala_league.analysis.report import log_report
from impala_league.cli.common import config_args, connect_waiting, load, player_arg, redis_url, wait_redis_arg
from impala_league.config import ConfigError
from impala_league.distributed.a3c import ParameterServer
from impala_league.distributed.launch.ownership import PEER_LOST_EXIT, exit_with_launcher, write_run_config
from impala_league.distributed.learner.data_parallel import DataParallelError
from impala_league.distributed.learner.role import run_learner

NAME = "learner"


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `learner` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       epilog='example (one host of a shared Redis): .venv/bin/python run.py learner --config configs/connect_four.yaml --redis-url redis://:PASSWORD@HOST:6379/0')
    config_args(p)
    wait_redis_arg(p, "Redis and the trajectory shards' servers")
    p.add_argument("--run-dir", help="run directory (default: <run.dir>/<run.name>)")
    p.add_argument("--resume", action="store_true", help="continue from <run-dir>/checkpoints/latest.safetensors")
    p.add_argument("--player", default="main", help="which learner: main (default), main_exploiter_N or "
                   "league_exploiter_N (see league.* in --help-config)")
    p.add_argument("--rank", type=int, default=0, help="with learner.num_learners=K: this learner's rank, 0..K-1 "
                   "(0 publishes weights and writes checkpoints and metrics)")
    p.add_argument("--dist-url", help="with learner.num_learners=K: the rendezvous of the K learners, "
                   "tcp://<rank 0's host>:<free port>, the same for every rank")
    return p


def run(args: argparse.Namespace) -> int:
    """One learner (or A3C's parameter server) against the run's Redis; returns its exit code."""
    exit_with_launcher("learner")
    cfg = load(args)
    if cfg.learner.num_learners == 1 and (args.rank or args.dist_url):
        raise ConfigError("--rank and --dist-url are for several learners: set learner.num_learners")
    if not 0 <= args.rank < cfg.learner.num_learners:
        raise ConfigError(f"--rank {args.rank} is not in [0, {cfg.learner.num_learners}) "
                          f"(learner.num_learners={cfg.learner.num_learners})")
    url = redis_url(args, cfg)
    if not url:
        raise ConfigError("the learner needs a Redis: pass --redis-url or set run.redis_url")
    connect_waiting(args, cfg, url, shards=True).close()  # fail fast, before anything is written
    player = player_arg(args, cfg)
    run_dir = Path(args.run_dir) if args.run_dir else Path(cfg.run.dir) / cfg.run.name
    if not (run_dir / "config.yaml").exists():
        write_run_config(run_dir, cfg, "--run-dir or run.dir")
    try:
        if cfg.learner.algo == "a3c":
            return run_learner(cfg, url, run_dir, resume=args.resume, player=player, learner_class=ParameterServer,
                               report=log_report)
        return run_learner(cfg, url, run_dir, resume=args.resume, player=player, report=log_report,
                           rank=args.rank, dist_url=args.dist_url)
    except DataParallelError as e:
        print(f"error: {e}", file=sys.stderr)
        return PEER_LOST_EXIT
