#!/usr/bin/env python
"""IMPALA self-play training: one CLI for every role.

  train     start Redis (embedded unless --redis-url), the learner and the actors, and supervise them
  learner   one learner alone (multi-machine: point it, the league and the actors at one Redis)
  league    the league manager alone (snapshots, payoff, Elo, opponent distributions)
  actor     one actor process
  actors    C actor processes on this host, restarted when they crash, stopped together
  evaluate  play a checkpoint against a baseline bot in both seats, or a round-robin of checkpoints,
            run directories and bots with Elo ratings
  replay    re-simulate a recorded game, check it, and show it (text boards, GIF)
  compare   train several configurations one after another for the same wall clock and seeds
            (IMPALA vs A3C, or the four off-policy corrections) and write a table and plots
  report    one self-contained HTML page about run directories (or a compare output)
  runs      list runs (local run directories; with --redis-url the runs in a shared Redis), and delete
            the Redis keys of a run that is over
  config    print the resolved config of --config and --set
  deploy    render a run's cluster files: Kubernetes manifests (k8s) or a SLURM batch script (slurm)

Run `.venv/bin/python run.py <role> --help` (the environment `bash scripts/bootstrap.sh` makes) for the
options of a role, and `--help-config` for every config key.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

try:
    from impala_league.config import UserError
    from impala_league.distributed.launch.ownership import REDIS_UNREACHABLE_EXIT, USER_ERROR_EXIT
    from impala_league.distributed.wire.transport import RedisUnreachable
except ModuleNotFoundError as e:  # `python run.py` outside the project's environment
    print(f"error: {e.name} is not installed for {sys.executable}: run `bash scripts/bootstrap.sh`, then "
          f"`.venv/bin/python run.py {' '.join(sys.argv[1:]) or '--help'}`", file=sys.stderr)
    sys.exit(2)

# command -> (its module in cli/, its one-line help)
COMMANDS = {
    "train": ("impala_league.cli.train", "run a whole training job on this machine"),
    "learner": ("impala_league.cli.learner", "run the learner against a Redis"),
    "league": ("impala_league.cli.league", "run the league manager against a Redis"),
    "actor": ("impala_league.cli.actor", "run one actor process against a Redis"),
    "actors": ("impala_league.cli.actors", "run and supervise C actor processes on this host"),
    "evaluate": ("impala_league.cli.evaluate", "play a checkpoint against a baseline bot, or a round-robin with Elo"),
    "replay": ("impala_league.cli.replay", "re-simulate a recorded game, check it, and show it"),
    "compare": ("impala_league.cli.compare", "train several configurations for the same wall clock and compare them"),
    "report": ("impala_league.cli.report", "one self-contained HTML page about run directories and compare outputs"),
    "runs": ("impala_league.cli.runs", "list runs, or delete the Redis keys of a run that is over"),
    "config": ("impala_league.cli.show_config", "print the resolved config of --config and --set (YAML, no secrets)"),
    "deploy": ("impala_league.cli.deploy", "render Kubernetes manifests or a SLURM batch script of a run"),
}
REDIS_UNREACHABLE_HINT = ("Start it (or fix the URL or the network) and start this again, or wait for it with "
                          "--wait-redis SECONDS")


def build_parser(role: str | None):
    """The CLI's parser, with the arguments of command `role` (its module imported) and the one-line help of
    every command. Returns (parser, the command's module or None)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    module = None
    for name, (module_name, help) in COMMANDS.items():
        if name == role:
            module = importlib.import_module(module_name)
            module.add_parser(sub, help)
        else:
            sub.add_parser(name, help=help)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    """Run one role; returns the process's exit code (docs/cluster.md, "Exit codes", lists them)."""
    argv = sys.argv[1:] if argv is None else argv
    parser, module = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)  # a usage error exits here with argparse's code, 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stdout)
    try:
        return module.run(args)
    except RedisUnreachable as e:
        print(f"error: {e} {REDIS_UNREACHABLE_HINT} (exit code {REDIS_UNREACHABLE_EXIT}: Redis unreachable at start)",
              file=sys.stderr)
        return REDIS_UNREACHABLE_EXIT
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    except KeyboardInterrupt:  # outside the launcher's own handling (start-up, final evaluation)
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
