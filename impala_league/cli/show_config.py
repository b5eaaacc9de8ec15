"""`run.py config`: the resolved config of --config and --set, as YAML without secrets."""

from __future__ import annotations

import argparse

from impala_league.cli.common import config_args, load
from impala_league.config import to_yaml, without_secrets

NAME = "config"


def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `config` command's parser, added to the subparsers `sub` of run.py."""
    p = sub.add_parser(NAME, help=help,
                       epilog='example: .venv/bin/python run.py config --config configs/atari_pong.yaml --set learner.batch_size=8')
    config_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the resolved config as YAML, without secrets."""
    print(to_yaml(without_secrets(load(args))), end="")
    return 0
