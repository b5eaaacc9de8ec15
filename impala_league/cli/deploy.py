"""`run.py deploy k8s|slurm`: a run's cluster files, from the role table `run.py train` starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from impala_league import REPO
from impala_league.cli.common import load
from impala_league.distributed.deploy import deploy

NAME = "deploy"

DEPLOY_HELP = """Render the files that run the config's training on a cluster, from the same role table
`run.py train` starts on one machine (distributed/deploy.py; docs/architecture.md, "On Kubernetes" and
"On SLURM", walk through them):

  run.py deploy k8s --config configs/cluster.yaml --image REGISTRY/impala-league:TAG --out deploy/k8s
      plain manifests and a kustomization.yaml in one namespace per run: Redis (StatefulSet, password
      from the Secret redis-auth), the learners, the league manager, one actor Job per learning player,
      a NetworkPolicy; `kubectl apply -k DIR`
  run.py deploy slurm --config configs/cluster.yaml --out deploy/slurm
      config.yaml and run.sbatch: node 0 runs Redis, the learners and the league manager, every other
      node `run.py actors` with one actor per CPU; `sbatch --nodes=N DIR/run.sbatch`

A config that runs on one machine only (run.redis_url set, a shard or weights replica on a loopback
address or unix socket, a run directory off the shared volume) is refused with the reason (exit code 2).
"""



def add_parser(sub, help: str) -> argparse.ArgumentParser:
    """The `deploy` command's parser, added to the subparsers `sub` of run.py. No --redis-url: the
    deployment runs the run's Redis."""
    p = sub.add_parser(NAME, help=help, description=DEPLOY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", choices=("k8s", "slurm"), help="k8s (manifests + kustomization.yaml) or slurm (sbatch script)")
    p.add_argument("--config", help="YAML experiment config (see configs/; configs/cluster.yaml has what a cluster wants)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value (repeatable)")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and doc")
    p.add_argument("--image", help="k8s: the image every role runs, REGISTRY/impala-league:TAG (required)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the files into (new or empty)")
    return p


def run(args: argparse.Namespace) -> int:
    """Render the files; DeployError (exit code 2) for a missing image or a config a cluster cannot run."""
    deploy(args.target, load(args), args.image, Path(args.out), REPO)
    return 0
