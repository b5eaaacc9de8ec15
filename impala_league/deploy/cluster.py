"""What a cluster deployment of a run is, whichever the orchestrator (`run.py deploy k8s|slurm`): the
options beside the config (resources, storage, GPUs, SLURM's job) and their checks, each role's default
CPUs and memory, the checks that refuse a config that runs on one machine only, and the launcher's role
table grouped the way a cluster runs it. `k8s.py` and `slurm.py` render from these; `render.py` is the
command.
"""

from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from impala_league.config import Config, UserError, core_size
from impala_league.distributed.launch.launcher import REDIS_URL_ENV, learner_rank_args, worker_commands
from impala_league.distributed.wire.codec import UnrollSpec
from impala_league.envs.registry import env_spec

REDIS_PORT = 6379
WAIT_REDIS_S = 300  # a role may start before Redis is scheduled, pulled and loading its append-only file
RUNS_MOUNT = "/app/runs"  # the Kubernetes run-directory volume: the image's WORKDIR is /app and run.dir is `runs`
SHARD_HOST = re.compile(r"shard-(\d+)\.shard")  # the Kubernetes shard servers' names
LOOPBACK = re.compile(r"localhost|127(\.\d+){3}|\[?::1\]?|0\.0\.0\.0")
NODE_LOCAL_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # never shared between the nodes of a job


class DeployError(UserError):
    """A config or option that cannot be deployed; the message says why and what to change."""


# -- the options: resources, storage, GPUs, SLURM's job ------------------------------------------------

ROLES = ("learner", "actor", "league", "redis")  # --cpu and --memory: each process (pod) of that kind
VOLUMES = {"redis": "10Gi", "runs": "20Gi"}  # --storage, defaults: each Redis server's volume, the run directory's
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
        beside `k8s.GPU_TAINT` (learner.device=cuda only).
    nodes, time, partition, account, gres: sbatch's options, written into the script (nodes: node 0 and
        the actor nodes, default 2; time: default `slurm.default_time`; gres: the GPUs of node 0, default
        gpu:K for K ranks with learner.device=cuda).
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
