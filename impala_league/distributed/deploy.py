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
    - a NetworkPolicy that lets only the run's pods reach Redis and the shard servers;
    every container with CPU and memory requests equal to its limits (`default_resources` from the
    config, or the options), a GPU learner's pods with one GPU, a node selector and tolerations.
  SLURM (`render_slurm`): one sbatch script with the job's options (nodes, time, partition, account,
    GPUs): node 0 runs Redis, the learners and the league manager, Redis and each learner rank on cores
    of their own (`cpu_sets`); every other node runs `run.py actors --count $SLURM_CPUS_ON_NODE`.

Every role is started with `--wait-redis` (Redis may come up after it) and, on Kubernetes, with
`--resume` (a rescheduled pod continues from the run directory; a fresh one starts from scratch).
Exit codes decide what the orchestrator does (docs/cluster.md, "Exit codes"): 0 the run is over (the pod
completes), 2 a config error (the Job fails: a restart cannot fix it), any other code a restart.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from impala_league.config import Config, UserError, core_size, to_yaml, without_secrets
from impala_league.distributed.wire.codec import UnrollSpec
from impala_league.distributed.launcher import REDIS_URL_ENV, learner_rank_args, worker_commands
from impala_league.distributed.ownership import USER_ERROR_EXIT
from impala_league.envs.registry import env_spec
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


# -- the options: resources, storage, GPUs, SLURM's job ------------------------------------------------

ROLES = ("learner", "actor", "league", "redis")  # --cpu and --memory: each process (pod) of that kind
VOLUMES = {"redis": "10Gi", "runs": "20Gi"}  # --storage, defaults: each Redis server's volume, the run directory's
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource: one per learner pod
GPU_TAINT = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}  # GPU node pools' usual taint
GRACE_S = {"learner": 120, "league": 60}  # SIGTERM to SIGKILL: a learner's last checkpoint, the league's state
MIB = 2**20
# Memory of one process of each kind before what its config adds (MiB): Python, numpy and torch (a learner's
# CUDA libraries too), the network and its optimizer; Redis's whole pod (its maxmemory is 3/4 of it).
BASE_MIB = {"learner": 2048, "actor": 1024, "league": 1536, "redis": 4096}
ENV_MIB = 16  # one env of an actor (an emulator, a board), beside its unroll buffers
SC2_GAME_MIB = 2048  # one StarCraft II env: a game process of its own (and a CPU)
INGEST_WORKER_MIB = 512  # each of learner.ingest_workers: a process of its own
MIN_REDIS_MIB = 256
SIZE_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
              "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
SIZE = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")  # a Kubernetes quantity of bytes
CORES = re.compile(r"\d+(?:\.\d+)?|\d+m")  # a Kubernetes CPU quantity: cores or millicores
OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS subdomain: a StorageClass's name
LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE")  # sbatch --time's forms
SLURM_NAME = re.compile(r"[A-Za-z0-9_.-]+")
GRES_GPUS = re.compile(r"gpu(:[A-Za-z0-9_.-]+)?:([1-9]\d*)")  # gpu:4 or gpu:a100:4


def size_bytes(text: str) -> int | None:
    """A Kubernetes quantity of bytes (16Gi, 512Mi, 2G, 1.5Gi) in bytes; None when `text` is not one."""
    m = SIZE.fullmatch(text)
    return None if m is None else int(float(m.group(1)) * SIZE_UNITS[m.group(2) or ""])


def cores(text: str) -> float | None:
    """A Kubernetes CPU quantity (2, 0.5, 500m) in cores; None when `text` is not one."""
    if not CORES.fullmatch(text):
        return None
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def assignment_ok(text: str, keys, value_ok: Callable[[str], bool]) -> bool:
    """Whether `text` is KEY=VALUE with KEY one of `keys` and `value_ok(VALUE)`."""
    key, eq, value = text.partition("=")
    return bool(eq) and key in keys and value_ok(value)


def label_ok(text: str) -> bool:
    """Whether `text` is a node label KEY=VALUE (`--gpu-node-selector`)."""
    key, eq, value = text.partition("=")
    return bool(eq) and LABEL_KEY.fullmatch(key) is not None and LABEL_VALUE.fullmatch(value) is not None


def toleration(text: str) -> dict | None:
    """`KEY[=VALUE][:EFFECT]` (kubectl taint's spelling) as a pod's toleration of that taint (any effect
    without EFFECT, any value without VALUE); None when `text` is not one."""
    rest, colon, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, eq, value = rest.partition("=")
    if (colon and effect not in TAINT_EFFECTS) or not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(value):
        return None
    return {"key": key, **({"operator": "Equal", "value": value} if eq else {"operator": "Exists"}),
            **({"effect": effect} if colon else {})}


@dataclass
class ClusterOptions:
    """What `run.py deploy` takes beside the config: its options (checked by the command's rules, then
    against the config and target by `check_options`).

    cpu, memory: role (ROLES) -> Kubernetes quantity (cores: 2, 0.5, 500m; bytes: 16Gi, 512Mi) of each
        process of that role, in place of `default_resources`'; SLURM takes `cpu` of learner and redis
        only, whole cores: those that each learner rank and Redis keep to themselves on node 0.
    storage: volume (VOLUMES) -> size: each Redis server's volume, the run-directory volume.
    storage_class: the run-directory volume's StorageClass (one that offers ReadWriteMany); None: the
        cluster's default class.
    gpu_node_selector, gpu_toleration: node labels a GPU learner's pod requires, and taints it tolerates
        beside GPU_TAINT (learner.device=cuda only).
    nodes, time, partition, account, gres: sbatch's options, written into the script (nodes: node 0 and
        the actor nodes, default 2; gres: the GPUs of node 0, default gpu:K for K ranks with learner.device=cuda).
    """

    cpu: dict[str, str] = field(default_factory=dict)
    memory: dict[str, str] = field(default_factory=dict)
    storage: dict[str, str] = field(default_factory=dict)
    storage_class: str | None = None
    gpu_node_selector: dict[str, str] = field(default_factory=dict)
    gpu_toleration: list[dict] = field(default_factory=list)
    nodes: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    gres: str | None = None


K8S_OPTIONS = ("memory", "storage", "storage_class", "gpu_node_selector", "gpu_toleration")
SLURM_OPTIONS = ("nodes", "time", "partition", "account", "gres")
GPU_OPTIONS = ("gpu_node_selector", "gpu_toleration", "gres")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def gpu_learner(cfg: Config) -> bool:
    """Whether the config's learners train on a GPU (learner.device cuda or cuda:N)."""
    return cfg.learner.device.startswith("cuda")


def check_options(cfg: Config, target: str, options: ClusterOptions) -> None:
    """The options against the target and the config. Raises DeployError naming the option: one of the
    other target's, a GPU option for a learner on the CPU, SLURM cores that are not whole, a Redis too
    small to hold its streams, fewer GPUs on node 0 than learner ranks."""
    for name in K8S_OPTIONS if target == "slurm" else SLURM_OPTIONS:
        if getattr(options, name):
            raise DeployError(f"{_option(name)} is for deploy {'k8s' if target == 'slurm' else 'slurm'}, not {target}")
    for name in GPU_OPTIONS:
        if getattr(options, name) and not gpu_learner(cfg):
            raise DeployError(f"{_option(name)} asks for GPUs, but learner.device={cfg.learner.device} trains on the "
                              "CPU: set learner.device=cuda, or leave the option out")
    if target == "slurm":
        for role, value in options.cpu.items():
            if role not in ("learner", "redis"):
                raise DeployError(f"--cpu {role}={value}: on SLURM only learner and redis keep cores of their own "
                                  "(every actor node runs one actor per CPU; node 0's other roles share the rest)")
            if not float(cores(value)).is_integer():
                raise DeployError(f"--cpu {role}={value}: SLURM binds whole cores; give a whole number")
    if "redis" in options.memory and size_bytes(options.memory["redis"]) < MIN_REDIS_MIB * MIB:
        raise DeployError(f"--memory redis={options.memory['redis']} is under {MIN_REDIS_MIB}Mi: too small to hold "
                          "the run's streams and weights")
    if options.gres and gpu_learner(cfg):
        gpus = int(GRES_GPUS.fullmatch(options.gres).group(2))
        if gpus < cfg.learner.num_learners:
            raise DeployError(f"--gres {options.gres} gives node 0 {gpus} GPU(s) for learner.num_learners="
                              f"{cfg.learner.num_learners} ranks: each rank needs a GPU of its own; ask for "
                              f"gpu:{cfg.learner.num_learners} or more")


@dataclass(frozen=True)
class Resources:
    """What one process of a role gets: `cpu` and `memory` as Kubernetes quantities (cores, bytes)."""

    cpu: str
    memory: str


def _mib(mib: float) -> str:
    """`mib` rounded up to a multiple of 256 MiB, as a quantity (Gi where it is whole)."""
    n = 256 * math.ceil(mib / 256)
    return f"{n // 1024}Gi" if n % 1024 == 0 else f"{n}Mi"


def default_resources(cfg: Config) -> dict[str, Resources]:
    """role -> the CPUs and memory that one process of the role needs with `cfg`:

    learner: learner.num_threads for the update, one for its ingest thread (learner.prefetch_batches > 0)
        and one per ingest worker; memory BASE_MIB, the batches in flight (prefetched, stacked and
        trained: prefetch_batches + 2 of B unrolls, twice with learner.mirror_augment=both), the replay
        (learner.replay_memory_mb with learner.replay_fraction > 0) and INGEST_WORKER_MIB per worker;
    actor: one CPU, plus one per env for StarCraft II (a game process each) or the emulator threads of
        Atari's ale_vector; memory BASE_MIB plus, per env, the env (ENV_MIB; SC2_GAME_MIB for StarCraft
        II) and two unrolls of each of its agents (one filling, one sent);
    league: one CPU and BASE_MIB; redis: one CPU and BASE_MIB (maxmemory 3/4 of it)."""
    spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
    unroll_mib = sum(nbytes for *_, nbytes in UnrollSpec(spec, cfg.actor.unroll_length, core_size(cfg.agent)).layout) / MIB
    sc2 = spec.kind == "sc2"
    threads = cfg.env.kwargs.get("emulator_threads", 1) if cfg.env.name.startswith("atari:") else 1
    actor_cpu = 1 + (cfg.actor.num_envs if sc2 else threads - 1)
    per_env = (SC2_GAME_MIB if sc2 else ENV_MIB) + 2 * len(spec.agents) * unroll_mib
    learner = cfg.learner
    batch_mib = learner.batch_size * unroll_mib * (2 if learner.mirror_augment == "both" else 1)
    learner_cpu = learner.num_threads + (learner.prefetch_batches > 0) + learner.ingest_workers
    learner_mib = (BASE_MIB["learner"] + (learner.prefetch_batches + 2) * batch_mib + learner.ingest_workers
                   * INGEST_WORKER_MIB + (learner.replay_memory_mb if learner.replay_fraction > 0 else 0))
    return {"learner": Resources(str(learner_cpu), _mib(learner_mib)),
            "actor": Resources(str(actor_cpu), _mib(BASE_MIB["actor"] + cfg.actor.num_envs * per_env)),
            "league": Resources("1", _mib(BASE_MIB["league"])),
            "redis": Resources("1", _mib(BASE_MIB["redis"]))}


def role_resources(cfg: Config, options: ClusterOptions) -> dict[str, Resources]:
    """`default_resources(cfg)` with the options' --cpu and --memory in their place."""
    return {role: Resources(options.cpu.get(role, res.cpu), options.memory.get(role, res.memory))
            for role, res in default_resources(cfg).items()}


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
    (Kubernetes: under /app/runs; SLURM: not in a node-local folder), a learner device that is not an
    explicit choice of CPU or GPU (auto would train on the CPU wherever a learner lands without a GPU,
    without a word), and on Kubernetes a learner device that names one GPU of a machine (a pod has its own)."""
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
    if not re.fullmatch(r"cpu|cuda(:\d+)?", cfg.learner.device):
        raise DeployError(f"learner.device={cfg.learner.device}: on a cluster choose the learners' device, cuda "
                          + ("(one GPU per learner pod, the CUDA image)" if target == "k8s" else
                             "(node 0's GPUs: --gres, default one per rank)")
                          + " or cpu; auto would train on the CPU wherever a learner has no GPU, without a word")


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


def _resources(res: Resources, gpu: bool = False) -> dict:
    """A container's requests and limits, equal (the pod's QoS class is Guaranteed: its memory is never
    taken back, and nothing else on the node eats into its CPUs); one GPU with `gpu`."""
    amounts = {"cpu": res.cpu, "memory": res.memory, **({GPU_RESOURCE: 1} if gpu else {})}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _gpu_placement(options: ClusterOptions) -> dict:
    """A GPU learner's pod fields: the node labels it requires, the taints it tolerates."""
    return {**({"nodeSelector": dict(options.gpu_node_selector)} if options.gpu_node_selector else {}),
            "tolerations": [GPU_TAINT, *options.gpu_toleration]}


def _role_container(name: str, image: str, role: str, args: list[str], resources: Resources, gpu: bool,
                    runs: bool, extra_env: list[dict] = ()) -> dict:
    container = {
        "name": name, "image": image,
        "args": [role, "--config", f"{CONFIG_DIR}/config.yaml", *args, "--wait-redis", str(WAIT_REDIS_S)],
        "env": [*extra_env, *_redis_env()],
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
        + ([{"name": "runs", "mountPath": RUNS_MOUNT}] if runs else []),
        "resources": _resources(resources, gpu),
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": APP_UID},
    }
    return container


def _job(run: str, name: str, component: str, player: str | None, container: dict, pods: int, runs: bool,
         indexed: bool = False, subdomain: str | None = None, shm: bool = False, pod: dict | None = None) -> dict:
    """A Job of `pods` pods. Exit 0 (the run is over) completes a pod; exit 2 (a config error) fails the
    Job; any other exit is retried with a new pod, up to 10 per pod (backoffLimit); a pod evicted or
    preempted (condition DisruptionTarget) is replaced without counting. restartPolicy Never is what a
    podFailurePolicy requires; podReplacementPolicy Failed starts a replacement only once the old pod is
    gone, so a learner's last checkpoint is written before its successor reads it. `shm`: a memory-backed
    /dev/shm (a container's own is 64 MiB), where learner.ingest_workers hand their batches over.
    `pod`: more fields of the pod's spec (terminationGracePeriodSeconds, a GPU learner's placement)."""
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
    pod_spec.update(pod or {})
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


def _redis_statefulset(run: str, name: str, replicas: int, resources: Resources, storage: str) -> dict:
    """Redis as the run's processes need it: the append-only file (fsync every second) on the pod's own
    volume of `storage`, so a rescheduled pod reloads streams, groups and pending entries; `noeviction`,
    so a full server refuses writes instead of dropping unread unrolls; maxmemory 3/4 of the pod's memory
    (the rest for the copy-on-write of the append-only file's rewrite); the password from the Secret."""
    maxmemory = size_bytes(resources.memory) * 3 // 4 // MIB
    args = ["--port", str(REDIS_PORT), "--requirepass", "$(REDIS_PASSWORD)", "--appendonly", "yes",
            "--appendfsync", "everysec", "--dir", "/data", "--save", "", "--maxmemory", f"{maxmemory}mb",
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
                    "resources": _resources(resources),
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "securityContext": {"allowPrivilegeEscalation": False},
                }],
            }},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}}}],
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


def k8s_manifests(cfg: Config, image: str, options: ClusterOptions | None = None) -> dict[str, dict]:
    """file name -> Kubernetes object of the run `cfg` (its run.name already a DNS label), every role
    running `image` with the resources, storage and GPU placement of `options` (checked). Raises
    DeployError (see `check_cluster_config`)."""
    options = options or ClusterOptions()
    run = cfg.run.name
    run_dir = Path(cfg.run.dir) / run
    learners = cfg.learner.num_learners
    dist_url = f"tcp://learner-0.learner:{RENDEZVOUS_PORT}" if learners > 1 else None
    roles = cluster_roles(cfg, run_dir, resume=True, dist_url=dist_url)
    gpu = gpu_learner(cfg)
    resources = role_resources(cfg, options)
    storage = {**VOLUMES, **options.storage}
    learner_pod = {"terminationGracePeriodSeconds": GRACE_S["learner"], **(_gpu_placement(options) if gpu else {})}
    text = to_yaml(without_secrets(cfg))
    runs_spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": storage["runs"]}}}
    if options.storage_class:
        runs_spec["storageClassName"] = options.storage_class
    out: dict[str, dict] = {
        "namespace.yaml": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": run, "labels": _labels(run, "run")}},
        "configmap-config.yaml": {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "config", "labels": _labels(run, "config")},
                                  "data": {"config.yaml": text}},
        # Every learner rank reads the checkpoint at --resume and the league manager writes beside them.
        "persistentvolumeclaim-runs.yaml": {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "runs", "labels": _labels(run, "runs")},
            "spec": runs_spec},
        "service-redis.yaml": _headless_service(run, "redis", "redis", REDIS_PORT, "redis"),
        "statefulset-redis.yaml": _redis_statefulset(run, "redis", 1, resources["redis"], storage["redis"]),
    }
    redis_components = ["redis"]
    shards = shard_servers(cfg)
    if shards:
        out["service-shard.yaml"] = _headless_service(run, "shard", "shard", REDIS_PORT, "redis")
        out["statefulset-shard.yaml"] = _redis_statefulset(run, "shard", shards, resources["redis"], storage["redis"])
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
    container = _role_container("learner", image, "learner", args, resources["learner"], gpu, runs=True,
                                extra_env=rank_env)
    shm = cfg.learner.ingest_workers > 0
    out["job-learner.yaml"] = _job(run, "learner", "learner", MAIN, container, learners, runs=True, indexed=True,
                                   subdomain="learner" if learners > 1 else None, shm=shm, pod=learner_pod)
    for name, (role, args) in roles.others.items():
        player = args[args.index("--player") + 1] if "--player" in args else None
        job = "league" if role == "league" else f"learner-{dns_label(player)}"
        learner = role == "learner"
        container = _role_container(role, image, role, args, resources[role], gpu and learner, runs=True)
        out[f"job-{job}.yaml"] = _job(run, job, role if role == "league" else "learner", player, container, 1,
                                      runs=True, shm=shm and learner,
                                      pod=learner_pod if learner else {"terminationGracePeriodSeconds": GRACE_S[role]})
    for player, (count, args) in roles.actors.items():
        job = f"actors-{dns_label(player)}"
        container = _role_container("actor", image, "actor", args, resources["actor"], gpu=False, runs=False)
        out[f"job-{job}.yaml"] = _job(run, job, "actor", player, container, count, runs=False)
    return out


class _Dumper(yaml.SafeDumper):
    """YAML as a person writes it: no anchors and aliases for objects that appear twice (some GitOps
    tools mishandle them), a file's text as a literal block (`|`) rather than one quoted line of escaped line breaks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def to_manifest(obj: Any) -> str:
    """`obj` as YAML for a person to review: keys in the order they were made (each file's own, stable
    from one render to the next), block scalars for multi-line text, no anchors."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=120)


def render_k8s(cfg: Config, image: str, out_dir: Path, options: ClusterOptions | None = None) -> list[Path]:
    """Write `k8s_manifests` (one object a file) and a kustomization.yaml that puts them all in the run's
    namespace into `out_dir`. Returns the files written."""
    manifests = k8s_manifests(cfg, image, options)
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "namespace": cfg.run.name, "resources": list(manifests)}
    written = []
    for name, obj in {**manifests, "kustomization.yaml": kustomization}.items():
        path = out_dir / name
        path.write_text(to_manifest(obj))
        written.append(path)
    return written


# -- SLURM -----------------------------------------------------------------------------------------

def _words(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


SLURM_HEAD = """#!/bin/bash
# Run {run} on a SLURM allocation; rendered by `run.py deploy slurm` with its config beside it.
# Node 0 runs Redis, the learner(s) and the league manager; every other node runs `run.py actors` with
# one actor per CPU. The job asks for {nodes} nodes, node 0 and {actor_nodes} actor node(s):
#   sbatch {script}
# (`sbatch --nodes=M {script}` for M - 1 actor nodes: sbatch's options override the file's.)
{gres_note}# A requeued job (preemption, a lost node: --requeue) starts again with --resume from the run directory,
# and Redis reloads its append-only file from there.
#SBATCH --job-name={job}
#SBATCH --nodes={nodes}
{sbatch}#SBATCH --exclusive
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

# CPU binding on node 0 (taskset): Redis keeps {redis_cores} core(s) and each learner rank {learner_cores} of its own
# (`deploy slurm --cpu redis=N --cpu learner=N`), the league manager and the exploiters share the rest.
# BIND: Redis's CPUs, the others', then rank 0's, 1's, ... (every CPU each, said on stderr, where node 0
# has too few to keep any).
read -ra BIND <<< "$("$PYTHON" -c 'import sys; from impala_league.distributed.deploy import node_cpus; print(*node_cpus(*map(int, sys.argv[1:])))' {redis_cores} {learner_cores} {ranks})"

# Redis on node 0 (the binary `run.py train` embeds): the password on stdin, not on the command line.
REDIS_SERVER=$("$PYTHON" -c 'from impala_league.distributed.launcher import redis_server_binary; print(redis_server_binary())')
if [ "${{SLURM_RESTART_COUNT:-0}}" -eq 0 ]; then
    rm -rf "$RUN_DIR/redis"  # a fresh start: what an earlier job of this run left must not be loaded
fi
mkdir -p "$RUN_DIR/redis"
printf 'requirepass %s\\n' "$REDIS_PASSWORD" | taskset -c "${{BIND[0]}}" "$REDIS_SERVER" - --port "$REDIS_PORT" \\
    --bind 0.0.0.0 --protected-mode no --appendonly yes --appendfsync everysec --dir "$RUN_DIR/redis" --save '' \\
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


def _cpu_list(cpus: list[int]) -> str:
    """CPU numbers as taskset's list, runs as ranges: 0-3,8,10-11."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def cpu_sets(available: list[int], redis: int, learner: int, ranks: int) -> list[str] | None:
    """Node 0's CPUs `available` split for taskset: Redis's first `redis`, then the rest (the league
    manager's, the exploiters'), then `learner` of its own for each of the `ranks` learner ranks. None
    where `available` has no CPU left for the rest once Redis and the ranks have theirs."""
    kept = redis + learner * ranks
    cpus = sorted(available)
    if len(cpus) <= kept:
        return None
    own = [cpus[redis + r * learner:redis + (r + 1) * learner] for r in range(ranks)]
    return [_cpu_list(cpus[:redis]), _cpu_list(cpus[kept:]), *map(_cpu_list, own)]


def node_cpus(redis: int, learner: int, ranks: int) -> list[str]:
    """`cpu_sets` of this process's CPUs (the sbatch script's, on node 0); where they are too few, each
    set is all of them, and stderr says so."""
    available = sorted(os.sched_getaffinity(0))
    sets = cpu_sets(available, redis, learner, ranks)
    if sets is None:
        print(f"node 0 has {len(available)} CPU(s): too few to keep {redis} for Redis, {learner} for each of "
              f"{ranks} learner rank(s) and one for the other roles; every role of node 0 runs on all of them",
              file=sys.stderr)
        sets = [_cpu_list(available)] * (2 + ranks)
    return sets


def _sbatch_options(cfg: Config, options: ClusterOptions) -> tuple[str, str]:
    """The #SBATCH lines of the options given (the GPUs of node 0 by default one per learner rank with
    learner.device=cuda) and, with GPUs, the header's note on where SLURM puts them."""
    gres = options.gres or (f"gpu:{cfg.learner.num_learners}" if gpu_learner(cfg) else None)
    given = [("time", options.time), ("partition", options.partition), ("account", options.account), ("gres", gres)]
    lines = "".join(f"#SBATCH --{name}={value}\n" for name, value in given if value)
    note = ("# --gres asks every node of the job for its GPUs (one request for them all): the learners on node 0\n"
            "# train on them (rank r on GPU r); the actor nodes' actors use their CPUs only.\n") if gres else ""
    return lines, note


def slurm_script(cfg: Config, repo: Path, config_path: Path, script_name: str,
                 options: ClusterOptions | None = None) -> str:
    """The sbatch script of run `cfg`: `repo` is the checkout (with its .venv) every node mounts,
    `config_path` the run's resolved config file there; sbatch's options and node 0's CPU binding from
    `options` (checked)."""
    options = options or ClusterOptions()
    run_dir = Path(cfg.run.dir) / cfg.run.name
    learners = cfg.learner.num_learners
    roles = cluster_roles(cfg, run_dir, resume=False, dist_url="tcp://127.0.0.1:DIST_PORT" if learners > 1 else None)
    resources = role_resources(cfg, options)

    def run_py(role: str, args: list[str]) -> str:
        words = _words(["$PYTHON", "run.py", role, "--config", "$CONFIG", *args])
        # shlex quoted the variables too: give them back to the shell (they hold no spaces: quoted anyway)
        return (words.replace("'$PYTHON'", '"$PYTHON"').replace("'$CONFIG'", '"$CONFIG"')
                .replace("tcp://127.0.0.1:DIST_PORT", 'tcp://127.0.0.1:"$DIST_PORT"'))

    def command(role: str, args: list[str], cpus: int) -> str:
        """`run.py role args` on node 0, on its CPU set BIND[cpus]."""
        return f'taskset -c "${{BIND[{cpus}]}}" {run_py(role, args)}'

    lines = ["# The learners and the league manager, on node 0 (the batch script's own node)."]
    for rank, args in enumerate(roles.main_learner):
        lines.append(f'{command("learner", args, 2 + rank)} --wait-redis "$WAIT_REDIS" "${{RESUME[@]}}" &')
        lines.append("LEARNER=$!; ROLES+=($!)" if rank == 0 else "ROLES+=($!)")
    for _name, (role, args) in roles.others.items():
        lines.append(f'{command(role, args, 1)} --wait-redis "$WAIT_REDIS" "${{RESUME[@]}}" &')
        lines.append("ROLES+=($!)")
    for player, (count, args) in roles.actors.items():
        if player == MAIN:
            continue
        lines.append(f"# {count} actor(s) of {player}, on node 0 too")
        lines.append(f'{command("actors", args, 1)} --wait-redis "$WAIT_REDIS" --count {count} &')
        lines.append("ROLES+=($!)")
    _count, args = roles.actors[MAIN]
    lines += [
        "# Every other node: one actor per CPU of that node ($SLURM_CPUS_ON_NODE is read there, not here).",
        'if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then',
        "    # shellcheck disable=SC2016  # expanded by the bash on each node",
        '    srun --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks-per-node=1 --exclude="$HEAD" --kill-on-bad-exit=0 \\',
        "        bash -c 'exec \"$@\" --count \"$SLURM_CPUS_ON_NODE\"' actors \\",
        f'        {run_py("actors", args)} --wait-redis "$WAIT_REDIS" &',
        "    ROLES+=($!)",
        "else",
        '    echo "one node: no actor host for the main agent; submit with --nodes=2 or more" >&2',
        "fi",
    ]
    nodes = options.nodes or 2
    sbatch, gres_note = _sbatch_options(cfg, options)
    head = SLURM_HEAD.format(run=cfg.run.name, script=script_name, job=shlex.quote(cfg.run.name), nodes=nodes,
                             actor_nodes=nodes - 1, sbatch=sbatch, gres_note=gres_note,
                             repo=shlex.quote(str(repo)), config=shlex.quote(str(config_path)),
                             run_dir=shlex.quote(str(run_dir)), wait=WAIT_REDIS_S, port=REDIS_PORT,
                             redis_cores=math.ceil(cores(resources["redis"].cpu)),
                             learner_cores=math.ceil(cores(resources["learner"].cpu)), ranks=learners,
                             dist="" if learners == 1 else "# The learner ranks' rendezvous on node 0: a port per job\n"
                             "DIST_PORT=$((20000 + SLURM_JOB_ID % 20000))\n")
    return head + "\n".join(lines) + "\n" + SLURM_TAIL


def render_slurm(cfg: Config, out_dir: Path, repo: Path, options: ClusterOptions | None = None) -> list[Path]:
    """Write the run's config (no secrets) and its sbatch script `run.sbatch` into `out_dir`."""
    config_path = out_dir.resolve() / "config.yaml"
    config_path.write_text(to_yaml(without_secrets(cfg)))
    script = out_dir / "run.sbatch"
    script.write_text(slurm_script(cfg, repo.resolve(), config_path, str(script), options))
    script.chmod(0o755)
    return [config_path, script]


# -- the command -----------------------------------------------------------------------------------

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
