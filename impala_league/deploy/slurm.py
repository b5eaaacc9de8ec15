"""The SLURM batch script of a run (`run.py deploy slurm`): node 0 runs Redis, the learners and the league
manager, each learner rank and Redis on cores of their own (`cpu_sets`); every other node runs
`run.py actors --count $SLURM_CPUS_ON_NODE`.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from pathlib import Path

from impala_league.config import Config, to_yaml, without_secrets
from impala_league.deploy.cluster import (REDIS_PORT, WAIT_REDIS_S, ClusterOptions, cluster_roles, cores, gpu_learner,
                                          role_resources)
from impala_league.league.players import MAIN


LIMIT_SIGNAL_S = 120  # USR1 this long before the time limit: every role stops, the learners checkpoint
SLACK_MINUTES = 10  # the default time limit beyond run.max_minutes: the start, and the stop at the signal
CHECKPOINT_NAME = "latest.safetensors"  # checkpoints.CHECKPOINT_NAME (that module imports torch)
DEFAULT_TIME = "1-00:00:00"  # the default time limit of a run without run.max_minutes


def _words(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


SLURM_HEAD = """#!/bin/bash
# Run {run} on a SLURM allocation; rendered by `run.py deploy slurm` with its config beside it.
# Node 0 runs Redis, the learner(s) and the league manager; every other node runs `run.py actors` with
# one actor per CPU. The job asks for {nodes} nodes, node 0 and {actor_nodes} actor node(s):
#   sbatch {script}
# (`sbatch --nodes=M {script}` for M - 1 actor nodes: sbatch's options override the file's.)
{gres_note}# A run directory that holds a checkpoint is resumed however the job started (requeued after a preemption
# or a lost node, submitted again, another array task): every role gets --resume, and Redis reloads its
# append-only file from there. {signal_s} s before the time limit SLURM sends USR1: every role stops (the
# learners write their checkpoints), then the job requeues itself (`scontrol requeue`) and continues.
#SBATCH --job-name={job}
#SBATCH --nodes={nodes}
{sbatch}#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --signal=B:USR1@{signal_s}
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
# Resume where any learner of the run has written a checkpoint: a fresh start would overwrite it.
RESUME=()
if [ -n "$(find "$RUN_DIR/checkpoints" -name {checkpoint} -print -quit 2>/dev/null)" ] \
    || [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
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
read -ra BIND <<< "$("$PYTHON" -c 'import sys; from impala_league.deploy.slurm import node_cpus; print(*node_cpus(*map(int, sys.argv[1:])))' {redis_cores} {learner_cores} {ranks})"

# Redis on node 0 (the binary `run.py train` embeds): the password on stdin, not on the command line.
REDIS_SERVER=$("$PYTHON" -c 'from impala_league.distributed.launch.embedded_redis import redis_server_binary; print(redis_server_binary())')
if [ "${{#RESUME[@]}}" -eq 0 ]; then
    rm -rf "$RUN_DIR/redis"  # a fresh start: what an earlier job of this run left must not be loaded
fi
mkdir -p "$RUN_DIR/redis"
printf 'requirepass %s\\n' "$REDIS_PASSWORD" | taskset -c "${{BIND[0]}}" "$REDIS_SERVER" - --port "$REDIS_PORT" \\
    --bind 0.0.0.0 --protected-mode no --appendonly yes --appendfsync everysec --dir "$RUN_DIR/redis" --save '' \\
    --maxmemory-policy noeviction --loglevel warning &
REDIS_PID=$!

ROLES=()
REQUEUE=0
stop_roles() {{  # SIGTERM: learners write a checkpoint, the league manager its state
    kill -TERM "${{ROLES[@]}}" 2>/dev/null || true
}}
trap stop_roles TERM INT
# USR1, the time limit near: stop now, requeue once everything has stopped (scancel's TERM does not requeue)
trap 'REQUEUE=1; stop_roles' USR1
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
if [ "$REQUEUE" = 1 ]; then
    echo "the time limit is near: requeueing job $SLURM_JOB_ID, which resumes from the checkpoint" >&2
    scontrol requeue "$SLURM_JOB_ID"
fi
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


def default_time(cfg: Config) -> str:
    """The job's time limit without --time, in sbatch's D-HH:MM:SS or H:MM:SS: run.max_minutes and
    SLACK_MINUTES (rounded up to a minute), or DEFAULT_TIME where the run has no time limit (the job then
    requeues itself at the limit and continues)."""
    if cfg.run.max_minutes <= 0:
        return DEFAULT_TIME
    days, minutes = divmod(math.ceil(cfg.run.max_minutes + SLACK_MINUTES), 24 * 60)
    hours, minutes = divmod(minutes, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00" if days else f"{hours}:{minutes:02d}:00"


def _sbatch_options(cfg: Config, options: ClusterOptions) -> tuple[str, str]:
    """The #SBATCH lines of the options given (the GPUs of node 0 by default one per learner rank with
    learner.device=cuda; the time limit by default `default_time`) and, with GPUs, the header's note on
    where SLURM puts them."""
    gres = options.gres or (f"gpu:{cfg.learner.num_learners}" if gpu_learner(cfg) else None)
    given = [("time", options.time or default_time(cfg)), ("partition", options.partition),
             ("account", options.account), ("gres", gres)]
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
                             signal_s=LIMIT_SIGNAL_S, checkpoint=CHECKPOINT_NAME, actor_nodes=nodes - 1,
                             sbatch=sbatch, gres_note=gres_note,
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
