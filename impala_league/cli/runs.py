"""`run.py runs`: list runs, or delete the Redis keys of a run that is over."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from impala_league.analysis.runs import delete_run_keys, list_redis_runs, list_run_dirs
from impala_league.cli.common import wait_redis_arg
from impala_league.config import ConfigError
from impala_league.distributed.wire.transport import connect

NAME = "runs"

RUNS_HELP = """List runs, or delete what a run left in a shared Redis.

  run.py runs                                   the run directories under runs/ (--dir): live (host and
                                                pid of its owner), finished or stopped, agent steps, env
  run.py runs --redis-url URL                   also the run names that have keys in that Redis: live or
                                                not, finished or not, keys and bytes
  run.py runs --redis-url URL --delete NAME     delete every key of run NAME (refused while it is live)
"""


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `runs` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       description=RUNS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="runs", help="the folder of run directories to list (default: runs)")
    p.add_argument("--redis-url", help="also list the runs whose keys are in this shared Redis "
                   "(default: $IMPALA_REDIS_URL)")
    p.add_argument("--delete", metavar="RUN_NAME", help="delete every key of run RUN_NAME from --redis-url; "
                   "refused while the run is live (a launcher, learner or league manager holds its lease)")
    wait_redis_arg(p, "the Redis of --redis-url")
    return p


def run(args: argparse.Namespace) -> int:
    """List the run directories (and a shared Redis's runs), or delete a finished run's keys."""
    url = args.redis_url or os.environ.get("IMPALA_REDIS_URL")
    if args.delete:
        if not url:
            raise ConfigError("--delete removes a run's keys from a shared Redis: pass --redis-url")
        deleted = delete_run_keys(connect(url, wait_s=args.wait_redis), args.delete)
        print(f"deleted {deleted} keys of run '{args.delete}'")
        return 0
    rows = list_run_dirs(Path(args.dir))
    print(f"{args.dir}/: {len(rows) or 'no'} run director{'y' if len(rows) == 1 else 'ies'}")
    for row in rows:
        print(f"  {row['name']:<28} {row['state']:<34} {row['env']:<16} {row['agent_steps_trained']:>12,} "
              "agent steps trained")
    if url:
        remote = list_redis_runs(connect(url, wait_s=args.wait_redis))
        print(f"Redis: {len(remote) or 'no'} run{'' if len(remote) == 1 else 's'}")
        for row in remote:
            print(f"  {row['name']:<28} {row['state']:<34} {row['keys']:>6} keys {row['bytes'] / 1e6:>9.1f} MB")
    return 0
