"""The Kubernetes objects of a run (`run.py deploy k8s`): one Namespace per run, holding Redis (a
StatefulSet with its append-only file on its volume) and the shard servers, the main learner's Indexed
Job and its rendezvous Service, a Job for the league manager and each exploiter learner, one actor Job
per learning player, and a NetworkPolicy around Redis. `render.py`'s docstring walks through them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from impala_league.config import Config, to_yaml, without_secrets
from impala_league.deploy.cluster import (MIB, REDIS_PORT, RUNS_MOUNT, VOLUMES, WAIT_REDIS_S, ClusterOptions, Resources,
                                          cluster_roles, dns_label, gpu_learner, role_resources, shard_servers,
                                          size_bytes)
from impala_league.distributed.launch.launcher import REDIS_URL_ENV
from impala_league.distributed.launch.ownership import USER_ERROR_EXIT
from impala_league.league.players import MAIN

K8S_VERSION = "1.34.0"  # the Kubernetes version whose schemas tests/deploy/test_deploy.py validates against
REDIS_IMAGE = "redis:7.4.2"
RENDEZVOUS_PORT = 29500
CONFIG_DIR = "/etc/impala"  # the ConfigMap's mount in every role's pod
SECRET = "redis-auth"  # kubectl create secret generic redis-auth --from-literal=password=...
APP_UID = 10001  # the image's `impala` user (Dockerfile)
REDIS_UID = 999  # the redis image's `redis` user
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource: one per learner pod
GPU_TAINT = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}  # GPU node pools' usual taint
GRACE_S = {"learner": 120, "league": 60}  # SIGTERM to SIGKILL: a learner's last checkpoint, the league's state


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
    dist_url = f"tcp://learner-0.learner:{RENDEZVOUS_PORT}" if cfg.learner.num_learners > 1 else None
    roles = cluster_roles(cfg, Path(cfg.run.dir) / run, resume=True, dist_url=dist_url)
    gpu = gpu_learner(cfg)
    resources = role_resources(cfg, options)
    storage = {**VOLUMES, **options.storage}
    learner_pod = {"terminationGracePeriodSeconds": GRACE_S["learner"], **(_gpu_placement(options) if gpu else {})}
    shm = cfg.learner.ingest_workers > 0
    out = {**_run_objects(cfg, storage["runs"], options.storage_class),
           **_redis_objects(cfg, resources["redis"], storage["redis"]),
           **_main_learner(cfg, image, roles.main_learner[0], resources["learner"], gpu, learner_pod)}
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


def _run_objects(cfg: Config, runs_storage: str, storage_class: str | None) -> dict[str, dict]:
    """The run's Namespace, its config (without secrets) as a ConfigMap, and the run-directory volume."""
    run = cfg.run.name
    runs_spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": runs_storage}}}
    if storage_class:
        runs_spec["storageClassName"] = storage_class
    return {
        "namespace.yaml": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": run, "labels": _labels(run, "run")}},
        "configmap-config.yaml": {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "config", "labels": _labels(run, "config")},
                                  "data": {"config.yaml": to_yaml(without_secrets(cfg))}},
        # Every learner rank reads the checkpoint at --resume and the league manager writes beside them.
        "persistentvolumeclaim-runs.yaml": {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "runs", "labels": _labels(run, "runs")},
            "spec": runs_spec},
    }


def _redis_objects(cfg: Config, resources: Resources, storage: str) -> dict[str, dict]:
    """The run's Redis, the shard servers `transport.shard_urls` names, and the NetworkPolicy around them."""
    run = cfg.run.name
    out = {"service-redis.yaml": _headless_service(run, "redis", "redis", REDIS_PORT, "redis"),
           "statefulset-redis.yaml": _redis_statefulset(run, "redis", 1, resources, storage)}
    redis_components = ["redis"]
    shards = shard_servers(cfg)
    if shards:
        out["service-shard.yaml"] = _headless_service(run, "shard", "shard", REDIS_PORT, "redis")
        out["statefulset-shard.yaml"] = _redis_statefulset(run, "shard", shards, resources, storage)
        redis_components.append("shard")
    out["networkpolicy-redis.yaml"] = _network_policy(run, redis_components)
    return out


def _main_learner(cfg: Config, image: str, rank_args: list[str], resources: Resources, gpu: bool,
                  pod: dict) -> dict[str, dict]:
    """The main learner's ranks: one Indexed Job, one pod template, the rank from the pod's completion
    index (`rank_args`: rank 0's arguments), and with several ranks the rendezvous Service `learner`."""
    run, learners = cfg.run.name, cfg.learner.num_learners
    out: dict[str, dict] = {}
    rank_env = []
    args = list(rank_args)
    if learners > 1:
        rank_env = [{"name": "LEARNER_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
        args[args.index("--rank") + 1] = "$(LEARNER_RANK)"
        out["service-learner.yaml"] = _headless_service(run, "learner", "learner", RENDEZVOUS_PORT, "rendezvous",
                                                        player=MAIN, not_ready=True)
    container = _role_container("learner", image, "learner", args, resources, gpu, runs=True, extra_env=rank_env)
    out["job-learner.yaml"] = _job(run, "learner", "learner", MAIN, container, learners, runs=True, indexed=True,
                                   subdomain="learner" if learners > 1 else None, shm=cfg.learner.ingest_workers > 0,
                                   pod=pod)
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
