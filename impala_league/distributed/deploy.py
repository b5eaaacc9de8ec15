"""Cluster files of a run (`run.py deploy k8s|slurm`), rendered from the role table `run.py train` starts.

The processes come from `launcher.worker_commands` and `launcher.learner_rank_args`, the same calls the
local launcher makes, so a deployment runs exactly the roles and arguments of a local run:

  Kubernetes (`render_k8s`): one Namespace per run (its name: run.name as a DNS label), holding
    - Redis: a StatefulSet (append-only file on its volume, `maxmemory-policy noeviction`, the password
      from the Secret `redis-auth` through the env, never in a file) and a headless Service `redis`;
    - shard servers `shard-<i>` (StatefulSet + headless Service `shard`) for the URLs of
      `transport.shard_urls` that name them (`redis://shard-<i>.shard:6379/0`);
    - the main learner: an Indexed Job of learner.num_learners pods, rank = the pod's completion index,
      meeting at `learner-0.learner` (a headless Service for the torch.distributed rendezvous);
    - the league manager and each exploiter learner: a Job of one pod on the same run-directory volume
      (a ReadWriteMany PersistentVolumeClaim at /app/runs);
    - one actor Job per learning player, as many pods as the config has actors for that player;
    - a NetworkPolicy that lets only the run's pods reach Redis and the shard servers.
  SLURM (`render_slurm`): one sbatch script: node 0 runs Redis, the learners and the league manager;
    every other node runs `run.py actors --count $SLURM_CPUS_ON_NODE`.

Every role is started with `--wait-redis` (Redis may come up after it) and, on Kubernetes, with
`--resume` (a rescheduled pod continues from the run directory; a fresh one starts from scratch).
Exit codes decide what the orchestrator does (README "Exit codes"): 0 the run is over (the pod
completes), 2 a config error (the Job fails: a restart cannot fix it), any other code a restart.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from impala_league.config import Config, UserError, to_yaml, without_secrets
from impala_league.distributed.launcher import REDIS_URL_ENV, learner_rank_args, worker_commands
from impala_league.distributed.ownership import USER_ERROR_EXIT
from impala_league.league.players import MAIN

K8S_VERSION = "1.34.0"  # the Kubernetes version whose schemas tests/distributed/test_deploy.py validates against
REDIS_IMAGE = "redis:7.4.2"
REDIS_PORT = 6379
RENDEZVOUS_PORT = 29500
WAIT_REDIS_S = 300  # a role may start before Redis is scheduled, pulled and loading its append-only file
CONFIG_DIR = "/etc/impala"  # the ConfigMap's mount in every role's pod
RUNS_MOUNT = "/app/runs"  # the run-directory volume: the image's WORKDIR is /app and run.dir is `runs`
SECRET = "redis-auth"  # kubectl create secret generic redis-auth --from-literal=password=...
SHARD_HOST = re.compile(r"shard-(\d+)\.shard")
LOOPBACK = re.compile(r"localhost|127(\.\d+){3}|\[?::1\]?|0\.0\.0\.0")
NODE_LOCAL_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # never shared between the nodes of a job
APP_UID = 10001  # the image's `impala` user (Dockerfile)
REDIS_UID = 999  # the redis image's `redis` user


class DeployError(UserError):
    """A config or option that cannot be deployed; the message says why and what to change."""


def dns_label(name: str) -> str:
    """`name` as an RFC 1123 DNS label (Kubernetes object and namespace names): lowercase, runs of
    characters other than [a-z0-9] become one '-', no '-' at either end, at most 63 characters.
    Raises DeployError when nothing is left."""
    label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:63].rstrip("-")
    if not label:
        raise DeployError(f"run.name {name!r} has no letter or digit to name Kubernetes objects with; set run.name")
    return label


def _host(url: str) -> str:
    """The host of a redis:// URL ('' for a unix socket)."""
    if url.startswith("unix://"):
        return ""
    return url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]


def shard_servers(cfg: Config) -> int:
    """How many shard servers `shard-<i>.shard` the run's `transport.shard_urls` name (max index + 1; 0 for none)."""
    found = [SHARD_HOST.fullmatch(_host(url)) for url in cfg.transport.shard_urls]
    return max((int(m.group(1)) + 1 for m in found if m), default=0)


def check_cluster_config(cfg: Config, target: str) -> None:
    """Refuse a config that runs on one machine only. Raises DeployError saying why and what to change:
    `run.redis_url` set (the deployment runs the run's Redis, and a URL in the config would put its
    password in a file), a trajectory shard or weights replica (`transport.params_urls`) on a loopback
    address or a unix socket (each pod or node would reach itself), Kubernetes' shard names on SLURM, a run directory that is not on the shared volume
    (Kubernetes: under /app/runs; SLURM: not in a node-local folder), and on Kubernetes a learner device
    that names one GPU of a machine (a pod has its own)."""
    if cfg.run.redis_url:
        raise DeployError("run.redis_url is set: the deployment runs the run's Redis and gives every process its URL "
                          f"from the environment ({REDIS_URL_ENV}, with the password from the Secret); drop "
                          "run.redis_url from the config")
    for key, url in [("shard_urls", u) for u in cfg.transport.shard_urls] + [
            ("params_urls", u) for u in cfg.transport.params_urls]:
        host = _host(url)
        if not host or LOOPBACK.fullmatch(host):
            raise DeployError(f"transport.{key} has {url}: a unix socket or loopback address is on one machine "
                              "only (the deployment starts no server beside each process); on a cluster list "
                              "servers by a name every host resolves"
                              + (", e.g. redis://shard-0.shard:6379/0 for the shard servers the manifests start"
                                 if target == "k8s" and key == "shard_urls" else ""))
        if target == "slurm" and SHARD_HOST.fullmatch(host):
            raise DeployError(f"transport.shard_urls has {url}: shard-<i>.shard are the Kubernetes shard servers' "
                              "names; on SLURM use transport.shards on the run's Redis, or list servers you run")
    run_dir = posixpath.normpath(cfg.run.dir)
    if target == "k8s":
        if not (run_dir == "runs" or run_dir.startswith("runs/") or run_dir == RUNS_MOUNT
                or run_dir.startswith(RUNS_MOUNT + "/")):
            raise DeployError(f"run.dir={cfg.run.dir} is not on the run's shared volume: on Kubernetes the run "
                              f"directories live on the PersistentVolumeClaim mounted at {RUNS_MOUNT}; set run.dir=runs")
        if re.fullmatch(r"cuda:\d+", cfg.learner.device):
            raise DeployError(f"learner.device={cfg.learner.device} names one GPU of a machine; a learner pod gets "
                              "one GPU of its own: set learner.device=cuda")
    elif any(run_dir == d or run_dir.startswith(d + "/") for d in NODE_LOCAL_DIRS):
        raise DeployError(f"run.dir={cfg.run.dir} is node-local: a requeued job may start on another node and "
                          "must find its checkpoints; set run.dir to a folder on a shared filesystem")


# -- the role table, grouped the way a cluster runs it ------------------------------------------------

@dataclass
class Roles:
    """The local role table (`worker_commands`, `learner_rank_args`) grouped for a cluster.

    main_learner: the `run.py learner` arguments of each rank of the main agent, rank 0 first.
    others: name -> (role, arguments) of the league manager and each exploiter learner.
    actors: player -> (actor count, `run.py actor` arguments without `--actor-id`: on a cluster an
        actor leases the lowest free id, so a rescheduled pod needs no number of its own)."""

    main_learner: list[list[str]]
    others: dict[str, tuple[str, list[str]]]
    actors: dict[str, tuple[int, list[str]]]


def cluster_roles(cfg: Config, run_dir: Path, resume: bool, dist_url: str | None) -> Roles:
    """Group `worker_commands(cfg, run_dir, resume)` and `learner_rank_args(cfg, run_dir, resume, dist_url)`."""
    others: dict[str, tuple[str, list[str]]] = {}
    actors: dict[str, tuple[int, list[str]]] = {}
    for name, (role, args, _nice) in worker_commands(cfg, run_dir, resume).items():
        if role != "actor":
            others[name] = (role, list(args))
            continue
        i = args.index("--actor-id")
        rest = args[:i] + args[i + 2:]
        player = args[args.index("--player") + 1]
        count, seen = actors.get(player, (0, rest))
        assert seen == rest, f"actors of {player} differ beyond their ids: {seen} vs {rest}"
        actors[player] = (count + 1, rest)
    return Roles(learner_rank_args(cfg, run_dir, resume, dist_url), others, actors)


# -- Kubernetes ------------------------------------------------------------------------------------

def _labels(run: str, component: str, player: str | None = None) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": "impala-league", "app.kubernetes.io/instance": run,
              "app.kubernetes.io/component": component}
    if player is not None:
        labels["impala-league/player"] = player
    return labels


def _redis_env() -> list[dict]:
    """The password from the Secret, then the run's Redis URL built from it by Kubernetes' $(VAR) expansion."""
    return [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "password"}}},
            {"name": REDIS_URL_ENV, "value": f"redis://:$(REDIS_PASSWORD)@redis:{REDIS_PORT}/0"}]


def _role_container(name: str, image: str, role: str, args: list[str], gpu: bool, runs: bool,
                    extra_env: list[dict] = ()) -> dict:
    container = {
        "name": name, "image": image,
        "args": [role, "--config", f"{CONFIG_DIR}/config.yaml", *args, "--wait-redis", str(WAIT_REDIS_S)],
        "env": [*extra_env, *_redis_env()],
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
        + ([{"name": "runs", "mountPath": RUNS_MOUNT}] if runs else []),
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": APP_UID},
    }
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return container


def _job(run: str, name: str, component: str, player: str | None, container: dict, pods: int, runs: bool,
         indexed: bool = False, subdomain: str | None = None, shm: bool = False) -> dict:
    """A Job of `pods` pods. Exit 0 (the run is over) completes a pod; exit 2 (a config error) fails the
    Job; any other exit is retried with a new pod, up to 10 per pod (backoffLimit); a pod evicted or
    preempted (condition DisruptionTarget) is replaced without counting. restartPolicy Never is what a
    podFailurePolicy requires; podReplacementPolicy Failed starts a replacement only once the old pod is
    gone, so a learner's last checkpoint is written before its successor reads it. `shm`: a memory-backed
    /dev/shm (a container's own is 64 MiB), where learner.ingest_workers hand their batches over."""
    if shm:
        container = {**container, "volumeMounts": [*container["volumeMounts"], {"name": "shm", "mountPath": "/dev/shm"}]}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {"fsGroup": APP_UID},
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": "config"}}]
        + ([{"name": "runs", "persistentVolumeClaim": {"claimName": "runs"}}] if runs else [])
        + ([{"name": "shm", "emptyDir": {"medium": "Memory"}}] if shm else []),
    }
    if subdomain:
        pod_spec["subdomain"] = subdomain
    spec: dict[str, Any] = {
        **({"completionMode": "Indexed"} if indexed else {}),
        "completions": pods, "parallelism": pods, "backoffLimit": 10 * pods, "podReplacementPolicy": "Failed",
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": container["name"], "operator": "In",
                                                  "values": [USER_ERROR_EXIT]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]},
        "template": {"metadata": {"labels": _labels(run, component, player)}, "spec": pod_spec},
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": _labels(run, component, player)},
            "spec": spec}


def _headless_service(run: str, name: str, component: str, port: int, port_name: str,
                      player: str | None = None, not_ready: bool = False) -> dict:
    spec: dict[str, Any] = {"clusterIP": "None", "selector": _labels(run, component, player),
                            "ports": [{"name": port_name, "port": port, "targetPort": port}]}
    if not_ready:  # the rendezvous: rank 0's name must resolve before anything is ready
        spec["publishNotReadyAddresses"] = True
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": _labels(run, component)},
            "spec": spec}


def _redis_statefulset(run: str, name: str, replicas: int) -> dict:
    """Redis as the run's processes need it: the append-only file (fsync every second) on the pod's own
    volume, so a rescheduled pod reloads streams, groups and pending entries; `noeviction`, so a full
    server refuses writes instead of dropping unread unrolls; the password from the Secret."""
    args = ["--port", str(REDIS_PORT), "--requirepass", "$(REDIS_PASSWORD)", "--appendonly", "yes",
            "--appendfsync", "everysec", "--dir", "/data", "--save", "", "--maxmemory", "3gb",
            "--maxmemory-policy", "noeviction", "--protected-mode", "no"]
    labels = _labels(run, name)
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "labels": labels},
        "spec": {
            "serviceName": name, "replicas": replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "securityContext": {"fsGroup": REDIS_UID, "runAsUser": REDIS_UID, "runAsGroup": REDIS_UID,
                                    "runAsNonRoot": True},
                "containers": [{
                    "name": "redis", "image": REDIS_IMAGE, "command": ["redis-server"], "args": args,
                    "env": [_redis_env()[0]],
                    "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
                    "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 2},
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "securityContext": {"allowPrivilegeEscalation": False},
                }],
            }},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}],
        },
    }


def _network_policy(run: str, components: list[str]) -> dict:
    """Only pods of this run (its instance label, in its namespace) may open Redis's port."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "redis", "labels": _labels(run, "redis")},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/instance": run},
                            "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                                  "values": components}]},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": run}}}],
                         "ports": [{"protocol": "TCP", "port": REDIS_PORT}]}],
        },
    }


def k8s_manifests(cfg: Config, image: str) -> dict[str, dict]:
    """file name -> Kubernetes object of the run `cfg` (its run.name already a DNS label), every role
    running `image`. Raises DeployError (see `check_cluster_config`)."""
    run = cfg.run.name
    run_dir = Path(cfg.run.dir) / run
    learners = cfg.learner.num_learners
    dist_url = f"tcp://learner-0.learner:{RENDEZVOUS_PORT}" if learners > 1 else None
    roles = cluster_roles(cfg, run_dir, resume=True, dist_url=dist_url)
    gpu = cfg.learner.device.startswith("cuda")
    text = to_yaml(without_secrets(cfg))
    out: dict[str, dict] = {
        "namespace.yaml": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": run, "labels": _labels(run, "run")}},
        "configmap-config.yaml": {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "config", "labels": _labels(run, "config")},
                                  "data": {"config.yaml": text}},
        "persistentvolumeclaim-runs.yaml": {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "runs", "labels": _labels(run, "runs")},
            # Every learner rank reads the checkpoint at --resume and the league manager writes beside them.
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "20Gi"}}}},
        "service-redis.yaml": _headless_service(run, "redis", "redis", REDIS_PORT, "redis"),
        "statefulset-redis.yaml": _redis_statefulset(run, "redis", 1),
    }
    redis_components = ["redis"]
    shards = shard_servers(cfg)
    if shards:
        out["service-shard.yaml"] = _headless_service(run, "shard", "shard", REDIS_PORT, "redis")
        out["statefulset-shard.yaml"] = _redis_statefulset(run, "shard", shards)
        redis_components.append("shard")
    out["networkpolicy-redis.yaml"] = _network_policy(run, redis_components)

    # The main learner's ranks: one pod template, the rank from the pod's completion index.
    rank_env = []
    args = list(roles.main_learner[0])
    if learners > 1:
        rank_env = [{"name": "LEARNER_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
        args[args.index("--rank") + 1] = "$(LEARNER_RANK)"
        out["service-learner.yaml"] = _headless_service(run, "learner", "learner", RENDEZVOUS_PORT, "rendezvous",
                                                        player=MAIN, not_ready=True)
    container = _role_container("learner", image, "learner", args, gpu, runs=True, extra_env=rank_env)
    shm = cfg.learner.ingest_workers > 0
    out["job-learner.yaml"] = _job(run, "learner", "learner", MAIN, container, learners, runs=True, indexed=True,
                                   subdomain="learner" if learners > 1 else None, shm=shm)
    for name, (role, args) in roles.others.items():
        player = args[args.index("--player") + 1] if "--player" in args else None
        job = "league" if role == "league" else f"learner-{dns_label(player)}"
        container = _role_container(role, image, role, args, gpu and role == "learner", runs=True)
        out[f"job-{job}.yaml"] = _job(run, job, role if role == "league" else "learner", player, container, 1,
                                      runs=True, shm=shm and role == "learner")
    for player, (count, args) in roles.actors.items():
        job = f"actors-{dns_label(player)}"
        container = _role_container("actor", image, "actor", args, gpu=False, runs=False)
        out[f"job-{job}.yaml"] = _job(run, job, "actor", player, container, count, runs=False)
    return out


def render_k8s(cfg: Config, image: str, out_dir: Path) -> list[Path]:
    """Write `k8s_manifests` (one object a file) and a kustomization.yaml that puts them all in the run's
    namespace into `out_dir`. Returns the files written."""
    manifests = k8s_manifests(cfg, image)
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "namespace": cfg.run.name, "resources": list(manifests)}
    written = []
    for name, obj in {**manifests, "kustomization.yaml": kustomization}.items():
        path = out_dir / name
        path.write_text(yaml.safe_dump(obj, sort_keys=False, width=120))
        written.append(path)
    return written


# -- SLURM -----------------------------------------------------------------------------------------

def _words(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


SLURM_HEAD = """#!/bin/bash
# Run {run} on a SLURM allocation; rendered by `run.py deploy slurm` with its config beside it.
# Node 0 runs Redis, the learner(s) and the league manager; every other node runs `run.py actors` with
# one actor per CPU. Submit with as many nodes as you want actor hosts plus one:
#   sbatch --nodes=9 {script}
# A requeued job (preemption, a lost node: --requeue) starts again with --resume from the run directory,
# and Redis reloads its append-only file from there.
#SBATCH --job-name={job}
#SBATCH --nodes=2
#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --signal=B:TERM@120
#SBATCH --output={job}-%j.out
set -euo pipefail

REPO={repo}
CONFIG={config}
RUN_DIR={run_dir}
PYTHON="$REPO/.venv/bin/python"
WAIT_REDIS={wait}
REDIS_PORT={port}
cd "$REPO"

HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
RESUME=()
if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
    RESUME=(--resume)
fi
{dist}# The password: $REDIS_PASSWORD where sbatch was run (the one shard servers of transport.shard_urls have),
# else a new one per start; in the environment only (srun passes it on), never in a file.
REDIS_PASSWORD=${{REDIS_PASSWORD:-$("$PYTHON" -c 'import secrets; print(secrets.token_hex(24))')}}
export IMPALA_REDIS_URL="redis://:${{REDIS_PASSWORD}}@${{HEAD}}:${{REDIS_PORT}}/0"

# Redis on node 0 (the binary `run.py train` embeds): the password on stdin, not on the command line.
REDIS_SERVER=$("$PYTHON" -c 'from impala_league.distributed.launcher import redis_server_binary; print(redis_server_binary())')
if [ "${{SLURM_RESTART_COUNT:-0}}" -eq 0 ]; then
    rm -rf "$RUN_DIR/redis"  # a fresh start: what an earlier job of this run left must not be loaded
fi
mkdir -p "$RUN_DIR/redis"
printf 'requirepass %s\\n' "$REDIS_PASSWORD" | "$REDIS_SERVER" - --port "$REDIS_PORT" --bind 0.0.0.0 \\
    --protected-mode no --appendonly yes --appendfsync everysec --dir "$RUN_DIR/redis" --save '' \\
    --maxmemory-policy noeviction --loglevel warning &
REDIS_PID=$!

ROLES=()
stop_roles() {{  # SIGTERM: learners write a checkpoint, the league manager its state
    kill -TERM "${{ROLES[@]}}" 2>/dev/null || true
}}
trap stop_roles TERM INT
"""

SLURM_TAIL = """
# The main learner (rank 0) ends the run; the others stop on the run's end (or are stopped after a minute).
code=0
wait "$LEARNER" || code=$?
while kill -0 "$LEARNER" 2>/dev/null; do  # a signal interrupted `wait`: the learner is writing its checkpoint
    code=0
    wait "$LEARNER" || code=$?
done
for _ in $(seq 60); do
    running=0
    for pid in "${ROLES[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then running=1; fi
    done
    if [ "$running" = 0 ]; then break; fi
    sleep 1
done
stop_roles
wait "${ROLES[@]}" 2>/dev/null || true
kill -TERM "$REDIS_PID" 2>/dev/null || true
wait "$REDIS_PID" 2>/dev/null || true
exit "$code"
"""


def slurm_script(cfg: Config, repo: Path, config_path: Path, script_name: str) -> str:
    """The sbatch script of run `cfg`: `repo` is the checkout (with its .venv) every node mounts,
    `config_path` the run's resolved config file there."""
    run_dir = Path(cfg.run.dir) / cfg.run.name
    learners = cfg.learner.num_learners
    roles = cluster_roles(cfg, run_dir, resume=False, dist_url="tcp://127.0.0.1:DIST_PORT" if learners > 1 else None)
    def command(role: str, args: list[str]) -> str:
        words = _words(["$PYTHON", "run.py", role, "--config", "$CONFIG", *args])
        # shlex quoted the variables too: give them back to the shell (they hold no spaces: quoted anyway)
        return (words.replace("'$PYTHON'", '"$PYTHON"').replace("'$CONFIG'", '"$CONFIG"')
                .replace("tcp://127.0.0.1:DIST_PORT", 'tcp://127.0.0.1:"$DIST_PORT"'))

    lines = ["# The learners and the league manager, on node 0 (the batch script's own node)."]
    for rank, args in enumerate(roles.main_learner):
        lines.append(f'{command("learner", args)} --wait-redis "$WAIT_REDIS" "${{RESUME[@]}}" &')
        lines.append("LEARNER=$!; ROLES+=($!)" if rank == 0 else "ROLES+=($!)")
    for _name, (role, args) in roles.others.items():
        lines.append(f'{command(role, args)} --wait-redis "$WAIT_REDIS" "${{RESUME[@]}}" &')
        lines.append("ROLES+=($!)")
    for player, (count, args) in roles.actors.items():
        if player == MAIN:
            continue
        lines.append(f"# {count} actor(s) of {player}, on node 0 too")
        lines.append(f'{command("actors", args)} --wait-redis "$WAIT_REDIS" --count {count} &')
        lines.append("ROLES+=($!)")
    _count, args = roles.actors[MAIN]
    lines += [
        "# Every other node: one actor per CPU of that node ($SLURM_CPUS_ON_NODE is read there, not here).",
        'if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then',
        "    # shellcheck disable=SC2016  # expanded by the bash on each node",
        '    srun --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks-per-node=1 --exclude="$HEAD" --kill-on-bad-exit=0 \\',
        "        bash -c 'exec \"$@\" --count \"$SLURM_CPUS_ON_NODE\"' actors \\",
        f'        {command("actors", args)} --wait-redis "$WAIT_REDIS" &',
        "    ROLES+=($!)",
        "else",
        '    echo "one node: no actor host for the main agent; submit with --nodes=2 or more" >&2',
        "fi",
    ]
    head = SLURM_HEAD.format(run=cfg.run.name, script=script_name, job=shlex.quote(cfg.run.name),
                             repo=shlex.quote(str(repo)), config=shlex.quote(str(config_path)),
                             run_dir=shlex.quote(str(run_dir)), wait=WAIT_REDIS_S, port=REDIS_PORT,
                             dist="" if learners == 1 else "# The learner ranks' rendezvous on node 0: a port per job\n"
                             "DIST_PORT=$((20000 + SLURM_JOB_ID % 20000))\n")
    return head + "\n".join(lines) + "\n" + SLURM_TAIL


def render_slurm(cfg: Config, out_dir: Path, repo: Path) -> list[Path]:
    """Write the run's config (no secrets) and its sbatch script `run.sbatch` into `out_dir`."""
    config_path = out_dir.resolve() / "config.yaml"
    config_path.write_text(to_yaml(without_secrets(cfg)))
    script = out_dir / "run.sbatch"
    script.write_text(slurm_script(cfg, repo.resolve(), config_path, str(script)))
    script.chmod(0o755)
    return [config_path, script]


# -- the command -----------------------------------------------------------------------------------

def deploy(target: str, cfg: Config, image: str | None, out_dir: Path, repo: Path,
           say: Callable[[str], None] = print) -> list[Path]:
    """`run.py deploy`: check `cfg` for a cluster, render `target` (k8s or slurm) into the new folder
    `out_dir`, and `say` what changed and what to do next. Returns the files written.
    Raises DeployError: a missing image (k8s), a config that cannot run on a cluster, an `out_dir` that
    is not empty."""
    if target == "k8s" and not image:
        raise DeployError("deploy k8s needs --image REGISTRY/impala-league:TAG, the image every role runs "
                          "(README, 'One image for every role', builds and pushes it)")
    if target == "slurm" and image:
        raise DeployError("deploy slurm runs this checkout's .venv on every node; --image is for k8s")
    check_cluster_config(cfg, target)
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
        files = render_k8s(cfg, image, out_dir)
        say(f"wrote {len(files)} files to {out_dir} (Kubernetes {K8S_VERSION} objects in namespace "
            f"{cfg.run.name!r}); next: kubectl apply -f {out_dir / 'namespace.yaml'}, create the Secret "
            f"'{SECRET}' there, kubectl apply -k {out_dir} (docs/architecture.md, 'On Kubernetes')")
    else:
        files = render_slurm(cfg, out_dir, repo)
        say(f"wrote {out_dir / 'run.sbatch'} and its config; next: sbatch --nodes=N {out_dir / 'run.sbatch'} "
            "(docs/architecture.md, 'On SLURM')")
    return files
