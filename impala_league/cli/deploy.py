"""`run.py deploy k8s|slurm`: a run's cluster files, from the role table `run.py train` starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from impala_league import REPO
from impala_league.cli.common import load
from impala_league.config import Rule, check_arguments
from impala_league.deploy.cluster import (GRES_GPUS, OBJECT_NAME, ROLES, SLURM_NAME, SLURM_TIME, VOLUMES,
                                          ClusterOptions, assignment_ok, cores, label_ok, size_bytes, toleration)
from impala_league.deploy.render import deploy

NAME = "deploy"

DEPLOY_HELP = """Render the files that run the config's training on a cluster, from the same role table
`run.py train` starts on one machine (deploy/render.py; docs/architecture.md, "On Kubernetes" and
"On SLURM", walk through them):

  run.py deploy k8s --config configs/cluster.yaml --image REGISTRY/impala-league:TAG --out deploy/k8s
      plain manifests and a kustomization.yaml in one namespace per run: Redis (StatefulSet, password
      from the Secret redis-auth), the learners, the league manager, one actor Job per learning player,
      a NetworkPolicy; `kubectl apply -k DIR`
  run.py deploy slurm --config configs/cluster.yaml --out deploy/slurm
      config.yaml and run.sbatch: node 0 runs Redis, the learners and the league manager (Redis and
      each learner rank on CPUs of their own), every other node `run.py actors` with one actor per
      CPU; `sbatch DIR/run.sbatch`

Every role's pods ask for (and are limited to) CPUs and memory derived from the config (an actor's
from its envs, a learner's from its batches and replay); --cpu and --memory set them. A GPU learner
(learner.device=cuda) gets one GPU per pod and tolerates the nvidia.com/gpu taint; learner.device=auto
is refused on a cluster (it would train on the CPU wherever there is no GPU, without a word).

  run.py deploy k8s --config configs/cluster.yaml --image R/impala-league:TAG-cu128 --out deploy/k8s \\
      --cpu actor=2 --memory learner=24Gi --storage-class nfs-client --storage runs=100Gi \\
      --gpu-node-selector cloud.google.com/gke-accelerator=nvidia-l4
  run.py deploy slurm --config configs/cluster.yaml --out deploy/slurm --nodes 9 --time 1-00:00:00 \\
      --partition gpu --account rl --cpu learner=8

A config that runs on one machine only (run.redis_url set, a shard or weights replica on a loopback
address or unix socket, a run directory off the shared volume), a bad option, or an option of the
other target is refused with the reason (exit code 2), and nothing is written.
"""


def _positive(parse):
    return lambda text: (parse(text) or 0) > 0


# The options' own rules (config.check_arguments); what ties them to the target and the config is
# cluster.check_options'.
ARGUMENT_RULES = {
    "cpu": Rule(predicate=lambda v: assignment_ok(v, ROLES, _positive(cores)),
                text=f"ROLE=CORES, ROLE one of {', '.join(ROLES)}, and CORES a number > 0 (2, 0.5, 500m)"),
    "memory": Rule(predicate=lambda v: assignment_ok(v, ROLES, _positive(size_bytes)),
                   text=f"ROLE=SIZE, ROLE one of {', '.join(ROLES)}, and SIZE a quantity of bytes > 0 (16Gi, 512Mi, 2G)"),
    "storage": Rule(predicate=lambda v: assignment_ok(v, VOLUMES, _positive(size_bytes)),
                    text=f"VOLUME=SIZE, VOLUME one of {', '.join(VOLUMES)}, and SIZE a quantity of bytes > 0 (100Gi)"),
    "storage_class": Rule(predicate=lambda v: OBJECT_NAME.fullmatch(v) is not None,
                          text="a StorageClass name: lowercase letters, digits, '-' and '.'"),
    "gpu_node_selector": Rule(predicate=label_ok, text="KEY=VALUE, a node label (cloud.google.com/gke-accelerator=nvidia-l4)"),
    "gpu_toleration": Rule(predicate=lambda v: toleration(v) is not None,
                           text="KEY[=VALUE][:EFFECT], a taint as kubectl taint spells it (EFFECT NoSchedule, "
                           "PreferNoSchedule or NoExecute)"),
    "nodes": Rule(low=1, high=100_000),
    "time": Rule(predicate=lambda v: SLURM_TIME.fullmatch(v) is not None,
                 text="a SLURM time limit: MINUTES, HOURS:MINUTES:SECONDS or DAYS-HOURS[:MINUTES[:SECONDS]]"),
    "partition": Rule(predicate=lambda v: all(SLURM_NAME.fullmatch(p) for p in v.split(",")),
                      text="partition names (letters, digits, '_', '.', '-'), comma-separated"),
    "account": Rule(predicate=lambda v: SLURM_NAME.fullmatch(v) is not None, text="letters, digits, '_', '.' or '-'"),
    "gres": Rule(predicate=lambda v: GRES_GPUS.fullmatch(v) is not None, text="gpu:COUNT or gpu:TYPE:COUNT (gpu:4, gpu:a100:4)"),
}



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
    p.add_argument("--cpu", action="append", default=[], metavar="ROLE=CORES",
                   help=f"CPUs of each process of ROLE ({', '.join(ROLES)}; repeatable). k8s: its pods' request and "
                   "limit (default: from the config); slurm: learner and redis only, the whole cores each learner "
                   "rank and Redis keep to themselves on node 0")
    p.add_argument("--memory", action="append", default=[], metavar="ROLE=SIZE",
                   help="k8s: memory request and limit of each pod of ROLE (repeatable; default: from the config; "
                   "redis: 4Gi, its maxmemory 3/4 of it)")
    p.add_argument("--storage", action="append", default=[], metavar="VOLUME=SIZE",
                   help=f"k8s: size of each Redis server's volume (redis, default {VOLUMES['redis']}) or of the run "
                   f"directory's (runs, default {VOLUMES['runs']}); repeatable")
    p.add_argument("--storage-class", metavar="NAME", help="k8s: the StorageClass of the run directory's volume, one "
                   "that offers ReadWriteMany (NFS, CephFS, a cloud file store; default: the cluster's default class)")
    p.add_argument("--gpu-node-selector", action="append", default=[], metavar="KEY=VALUE",
                   help="k8s, learner.device=cuda: a node label the learner pods require (repeatable)")
    p.add_argument("--gpu-toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]",
                   help="k8s, learner.device=cuda: a taint the learner pods tolerate beside nvidia.com/gpu (repeatable)")
    p.add_argument("--nodes", type=int, help="slurm: nodes of the job, node 0 and the actor nodes (default 2)")
    p.add_argument("--time", help="slurm: the job's time limit (e.g. 1-00:00:00; default: run.max_minutes + 10 "
                   "minutes, or 1-00:00:00 without run.max_minutes; the job requeues itself at the limit)")
    p.add_argument("--partition", help="slurm: the partition(s) to run in (default: the cluster's)")
    p.add_argument("--account", help="slurm: the account charged (default: yours)")
    p.add_argument("--gres", help="slurm, learner.device=cuda: node 0's GPUs, gpu:COUNT or gpu:TYPE:COUNT "
                   "(default gpu:K, one per learner rank)")
    return p


def cluster_options(args: argparse.Namespace) -> ClusterOptions:
    """The options of `args` (checked by ARGUMENT_RULES) as deploy takes them."""
    def pairs(items: list[str]) -> dict[str, str]:
        return dict(item.split("=", 1) for item in items)

    return ClusterOptions(cpu=pairs(args.cpu), memory=pairs(args.memory), storage=pairs(args.storage),
                          storage_class=args.storage_class, gpu_node_selector=pairs(args.gpu_node_selector),
                          gpu_toleration=[toleration(t) for t in args.gpu_toleration], nodes=args.nodes,
                          time=args.time, partition=args.partition, account=args.account, gres=args.gres)


def run(args: argparse.Namespace) -> int:
    """Render the files; exit code 2 (ConfigError, DeployError) for a bad option, a missing image or a
    config a cluster cannot run, before anything is written."""
    cfg = load(args)
    check_arguments(args, ARGUMENT_RULES)
    deploy(args.target, cfg, args.image, Path(args.out), REPO, cluster_options(args))
    return 0
