"""Cluster files of a run (`run.py deploy k8s|slurm`), rendered from the role table `run.py train` starts.

The processes come from `launcher.worker_commands` and `launcher.learner_rank_args`, the same calls the
local launcher makes, so a deployment runs exactly the roles and arguments of a local run:

  Kubernetes (`k8s.py`, `render_k8s`): one Namespace per run (its name: run.name as a DNS label), holding
    - Redis: a StatefulSet (append-only file on its volume, `maxmemory-policy noeviction`, the password
      from the Secret `redis-auth` through the env, never in a file) and a headless Service `redis`;
    - shard servers `shard-<i>` (StatefulSet + headless Service `shard`) for the URLs of
      `transport.shard_urls` that name them (`redis://shard-<i>.shard:6379/0`);
    - the main learner: an Indexed Job of learner.num_learners pods, rank = the pod's completion index,
      meeting at `learner-0.learner` (a headless Service for the torch.distributed rendezvous);
    - the league manager and each exploiter learner: a Job of one pod on the same run-directory volume
      (a ReadWriteMany PersistentVolumeClaim at /app/runs);
    - one actor Job per learning player, as many pods as the config has actors for that player;
    - a NetworkPolicy that lets only the run's pods reach Redis and the shard servers;
    every container with CPU and memory requests equal to its limits (`default_resources` from the
    config, or the options), a GPU learner's pods with one GPU, a node selector and tolerations.
  SLURM (`slurm.py`, `render_slurm`): one sbatch script with the job's options (nodes, time, partition, account,
    GPUs): node 0 runs Redis, the learners and the league manager, Redis and each learner rank on cores
    of their own (`cpu_sets`); every other node runs `run.py actors --count $SLURM_CPUS_ON_NODE`.

Every role is started with `--wait-redis` (Redis may come up after it) and, on Kubernetes, with
`--resume` (a rescheduled pod continues from the run directory; a fresh one starts from scratch).
Exit codes decide what the orchestrator does (docs/cluster.md, "Exit codes"): 0 the run is over (the pod
completes), 2 a config error (the Job fails: a restart cannot fix it), any other code a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from impala_league.config import Config
from impala_league.deploy.cluster import (ClusterOptions, DeployError, check_cluster_config, check_options, dns_label,
                                          shard_servers)
from impala_league.deploy.k8s import K8S_VERSION, SECRET, render_k8s
from impala_league.deploy.slurm import render_slurm


def deploy(target: str, cfg: Config, image: str | None, out_dir: Path, repo: Path,
           options: ClusterOptions | None = None, say: Callable[[str], None] = print) -> list[Path]:
    """`run.py deploy`: check `cfg` and `options` for a cluster, render `target` (k8s or slurm) into the
    new folder `out_dir`, and `say` what changed and what to do next. Returns the files written.
    Raises DeployError: a missing image (k8s), a config that cannot run on a cluster, an option that
    does not fit the target or the config, an `out_dir` that is not empty."""
    options = options or ClusterOptions()
    if target == "k8s" and not image:
        raise DeployError("deploy k8s needs --image REGISTRY/impala-league:TAG, the image every role runs "
                          "(docs/cluster.md, 'One image for every role', builds and pushes it)")
    if target == "slurm" and image:
        raise DeployError("deploy slurm runs this checkout's .venv on every node; --image is for k8s")
    check_cluster_config(cfg, target)
    check_options(cfg, target, options)
    if target == "k8s":
        label = dns_label(cfg.run.name)
        if label != cfg.run.name:
            say(f"note: run.name {cfg.run.name!r} is not a DNS label (lowercase letters, digits and '-', at most 63): "
                f"the run is deployed as {label!r} (its namespace, Redis keys and run directory)")
            cfg.run.name = label
        if shard_servers(cfg):
            say(f"note: transport.shard_urls names {shard_servers(cfg)} shard server(s): rendered as StatefulSet "
                "'shard' (shard-0.shard, ...)")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise DeployError(f"--out {out_dir} exists and is not empty; deploy writes into a new folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DeployError(f"--out: cannot create {out_dir}: {e.strerror}") from None
    if target == "k8s":
        files = render_k8s(cfg, image, out_dir, options)
        say(f"wrote {len(files)} files to {out_dir} (Kubernetes {K8S_VERSION} objects in namespace "
            f"{cfg.run.name!r}); next: kubectl apply -f {out_dir / 'namespace.yaml'}, create the Secret "
            f"'{SECRET}' there, kubectl apply -k {out_dir} (docs/architecture.md, 'On Kubernetes')")
    else:
        files = render_slurm(cfg, out_dir, repo, options)
        say(f"wrote {out_dir / 'run.sbatch'} and its config; next: sbatch {out_dir / 'run.sbatch'} "
            f"({options.nodes or 2} nodes; docs/architecture.md, 'On SLURM')")
    return files
