"""A cluster job that starts again continues the run: the sbatch script resumes a run directory that holds a
checkpoint however the job started (requeued, submitted again, another array task), requeues itself at
its time limit, and carries a time limit of its own; Kubernetes' learner and league pods always resume.

The script runs for real under bash with stubs of `scontrol`, the checkout's python (which records each
`run.py` command) and redis-server: seconds, no training.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from impala_league import REPO
from impala_league.checked_config import load_config
from impala_league.deploy.k8s import k8s_manifests
from impala_league.deploy.slurm import render_slurm

TICTACTOE = str(REPO / "configs" / "tictactoe.yaml")

PYTHON_STUB = """#!/bin/bash
# The checkout's python: the script's one-liners answered, each run.py command logged.
if [ "$1" = -c ]; then
    case "$2" in
        *node_cpus*) echo 0 0 0 ;;
        *redis_server_binary*) echo "$STUBS/redis-server" ;;
        *) echo password ;;
    esac
    exit 0
fi
echo "$*" >> "$STUBS/commands"
if [ "$2" = learner ] && [ -n "${LEARNER_WAITS:-}" ]; then
    sleep 30 & s=$!
    trap 'kill $s; echo stopped >> "$STUBS/commands"; exit 0' TERM
    touch "$STUBS/learner-up"
    wait $s
fi
"""
REDIS_STUB = '#!/bin/bash\ncat > /dev/null\nsleep 30 & s=$!\ntrap \'kill $s; exit 0\' TERM\nwait $s\n'
SCONTROL_STUB = ('#!/bin/bash\nif [ "$1" = show ]; then echo 127.0.0.1; '
                 'else echo "scontrol $*" >> "$STUBS/commands"; fi\n')


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)


def _job(tmp_path: Path, *settings: str) -> tuple[Path, Path, dict[str, str]]:
    """The rendered script of a one-node tictactoe run, its run directory and the job's environment."""
    repo, stubs = tmp_path / "repo", tmp_path / "stubs"
    _stub(repo / ".venv" / "bin" / "python", PYTHON_STUB)
    _stub(stubs / "redis-server", REDIS_STUB)
    _stub(stubs / "scontrol", SCONTROL_STUB)
    cfg = load_config(TICTACTOE, ["run.name=job", f"run.dir={tmp_path / 'shared'}", "learner.device=cpu", *settings])
    out = tmp_path / "slurm"
    out.mkdir()
    render_slurm(cfg, out, repo)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMPALA_", "SLURM_", "REDIS_"))}
    env.update(PATH=f"{stubs}:{env['PATH']}", STUBS=str(stubs), SLURM_JOB_NODELIST="node0", SLURM_JOB_ID="4242",
               SLURM_JOB_NUM_NODES="1")
    return out / "run.sbatch", tmp_path / "shared" / "job", env


def _commands(env: dict[str, str]) -> list[str]:
    path = Path(env["STUBS"]) / "commands"
    return path.read_text().splitlines() if path.exists() else []


def _learner(env: dict[str, str]) -> str:
    (line,) = [c for c in _commands(env) if c.startswith("run.py learner")]
    return line


def _run(script: Path, env: dict[str, str]) -> None:
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_fresh_job_starts_from_scratch_and_clears_an_earlier_redis(tmp_path):
    script, run_dir, env = _job(tmp_path)
    (run_dir / "redis").mkdir(parents=True)
    (run_dir / "redis" / "appendonly.aof").write_text("left by a job that never checkpointed")
    _run(script, env)
    assert "--resume" not in _learner(env).split()
    assert not (run_dir / "redis" / "appendonly.aof").exists()


def test_a_job_submitted_again_over_a_checkpoint_resumes_it_and_keeps_its_redis(tmp_path):
    """sbatch of the same script (SLURM_RESTART_COUNT unset) or a new array task: the checkpoint decides."""
    for task in ("", "3"):
        script, run_dir, env = _job(tmp_path / (task or "again"))
        (run_dir / "checkpoints").mkdir(parents=True)
        (run_dir / "checkpoints" / "latest.safetensors").write_bytes(b"update 386")
        (run_dir / "redis").mkdir()
        (run_dir / "redis" / "appendonly.aof").write_text("the run's streams")
        if task:
            env["SLURM_ARRAY_TASK_ID"] = task
        _run(script, env)
        assert _learner(env).split()[-1] == "--resume", task
        assert (run_dir / "redis" / "appendonly.aof").read_text() == "the run's streams"


def _signalled(tmp_path: Path, sig: int) -> list[str]:
    """The commands of a job whose batch shell gets `sig` while its learner runs."""
    script, _run_dir, env = _job(tmp_path)
    env["LEARNER_WAITS"] = "1"
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (Path(env["STUBS"]) / "learner-up").exists():
            assert time.monotonic() < deadline and job.poll() is None, "the job ended before its learner started"
            time.sleep(0.05)
        job.send_signal(sig)
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return _commands(env)


def test_the_time_limit_signal_stops_the_roles_then_requeues_the_job(tmp_path):
    commands = _signalled(tmp_path / "limit", signal.SIGUSR1)
    assert commands[-2:] == ["stopped", "scontrol requeue 4242"]  # after the learner's checkpoint, not before
    assert "scontrol requeue 4242" not in _signalled(tmp_path / "scancel", signal.SIGTERM)  # scancel: no requeue


def test_the_script_asks_for_the_time_limit_signal_and_a_time_of_its_own(tmp_path):
    script = _job(tmp_path / "a", "run.max_minutes=13.5")[0].read_text()
    assert "#SBATCH --signal=B:USR1@120\n" in script
    assert "#SBATCH --time=0:24:00\n" in script  # 13.5 minutes of training, 10 to start and stop
    script = _job(tmp_path / "b", "run.max_minutes=0", "run.total_agent_steps=10000000000")[0].read_text()
    assert "#SBATCH --time=1-00:00:00\n" in script  # no training time limit: a day, requeued as it runs out


def test_every_learner_and_league_pod_resumes_its_run():
    cfg = load_config(TICTACTOE, ["learner.device=cpu", "league.enabled=true", "league.main_exploiters=1"])
    manifests = k8s_manifests(cfg, "registry.example/impala-league:1")
    containers = [obj["spec"]["template"]["spec"]["containers"][0]
                  for obj in manifests.values() if obj["kind"] == "Job"]
    resumed = {c["args"][0] for c in containers if "--resume" in c["args"]}
    assert resumed == {"learner", "league"} and len([c for c in containers if c["args"][0] == "learner"]) == 2
