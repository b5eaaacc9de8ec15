"""Soak: a training run sampled for memory growth in every process and in Redis.

Short in CI (SOAK_SECONDS, default 10 s of sampling after start-up); long on demand:

    SOAK_SECONDS=3600 .venv/bin/python -m pytest -q -s tests/distributed/test_soak.py

Every 0.5 s it samples the resident set (VmRSS) of the launcher, the learner and each actor, and Redis's
`used_memory` less the key that grows by design up to a cap (the results stream, trimmed at about
RESULTS_MAXLEN episodes). It fails if a process's mean RSS over the
last third of the run exceeds that over the first third by more than GROWTH (and SLACK_MIB), if Redis's
other memory grows likewise, or if a capped key exceeds its cap.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from impala_league import REPO
from impala_league.distributed.launch.launcher import EmbeddedRedis
from impala_league.distributed.wire.transport import RESULTS_MAXLEN, connect
from tests.distributed.test_faults import _descendants

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "10"))
GROWTH, SLACK_MIB = 0.05, 4  # Redis: 1 MiB


def rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(m.group(1)) / 1024 if m else None


def role(pid: int) -> str | None:
    """'learner', 'actor N' or None for a process of the run."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    if "run.py" not in " ".join(args):
        return None
    if "actor" in args:
        return f"actor {args[args.index('--actor-id') + 1]}"
    return "learner" if "learner" in args else None


def grew(samples: list[float], slack: float) -> tuple[float, float, bool]:
    """(mean of the first third, mean of the last third, whether the growth is beyond tolerance)."""
    third = max(1, len(samples) // 3)
    first, last = statistics.mean(samples[:third]), statistics.mean(samples[-third:])
    return first, last, last > first * (1 + GROWTH) + slack


def test_no_process_and_not_redis_grows_in_memory_over_a_run(tmp_path, run_name):
    with EmbeddedRedis() as server:
        client = connect(server.url)
        cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / "configs/tictactoe.yaml"),
               "--eval-games", "0", "--set", f"run.name={run_name}", "--set", f"run.dir={tmp_path}",
               "--set", "run.wandb_mode=disabled", "--set", "run.total_agent_steps=1000000000", "--set", "run.log_every_s=1",
               "--set", "actor.num_actors=2", "--set", "actor.num_envs=4", "--set", "actor.unroll_length=8",
               "--set", "learner.batch_size=4", "--set", "actor.high_water_mark=16", "--set", "agent.hidden=16",
               "--set", "learner.checkpoint_every_s=5"]
        env = dict(os.environ, IMPALA_REDIS_URL=server.url)
        log_path = tmp_path / "train.log"
        with log_path.open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        rss: dict[str, list[float]] = {}
        redis_other: list[float] = []
        capped = {"results": 0}
        try:
            deadline = time.monotonic() + 120
            while not re.search(r"learner: agent steps trained [\d,]+/", log_path.read_text()):  # past start-up
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
            roles = {pid: role(pid) for pid in _descendants(proc.pid)}
            roles = {pid: name for pid, name in roles.items() if name is not None}
            roles[proc.pid] = "launcher"
            assert sorted(roles.values()) == ["actor 0", "actor 1", "launcher", "learner"]
            end = time.monotonic() + SOAK_SECONDS
            while time.monotonic() < end:
                assert proc.poll() is None, log_path.read_text()
                for pid, name in roles.items():
                    value = rss_mib(pid)
                    assert value is not None, f"{name} (pid {pid}) died"
                    rss.setdefault(name, []).append(value)
                used = client.info("memory")["used_memory"]
                growing = client.memory_usage(f"{run_name}:results") or 0
                redis_other.append((used - growing) / 2**20)
                capped["results"] = max(capped["results"], client.xlen(f"{run_name}:results"))
                time.sleep(0.5)
        finally:
            proc.terminate()
            proc.wait(90)
    report, failures = [], []
    for name, samples in sorted(rss.items()) + [("redis (other than capped keys)", redis_other)]:
        first, last, bad = grew(samples, SLACK_MIB if name[0] != "r" else 1)
        report.append(f"{name}: {first:.1f} -> {last:.1f} MiB")
        if bad:
            failures.append(name)
    print(f"\nsoak {SOAK_SECONDS:.0f} s, {len(redis_other)} samples: " + "; ".join(report) + f"; capped keys {capped}")
    assert not failures, f"memory grew in {failures}: {report}"
    assert capped["results"] <= RESULTS_MAXLEN * 1.1
