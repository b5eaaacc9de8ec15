"""`run.py actors`: one host's actor processes under the launcher's rules (distributed/launch/launcher.py,
`Workers`), with real processes, a real Redis and real signals. No learner runs: the actors wait for
weights, holding their id leases, until the test ends them."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

from tests.distributed.test_faults import _alive, _read_until, _wait_gone

from impala_league import REPO


def _start_actors(run_name: str, redis_url: str, count: int) -> subprocess.Popen:
    """`run.py actors --count count` of tic-tac-toe. Leases last 60 s, far beyond a test: an id that is
    free again soon after its actor died was released, not left to lapse."""
    cmd = [sys.executable, str(REPO / "run.py"), "actors", "--config", str(REPO / "configs/tictactoe.yaml"),
           "--redis-url", redis_url, "--count", str(count), "--set", f"run.name={run_name}",
           "--set", "run.lease_ttl_s=60", "--set", "actor.num_envs=1", "--set", "actor.unroll_length=4",
           "--set", "agent.hidden=16"]
    env = {k: v for k, v in os.environ.items() if k != "IMPALA_REDIS_URL"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)


def _started(proc: subprocess.Popen, count: int, lines: list[str]) -> list[int]:
    """The pids of the `count` actors, from the supervisor's start lines."""
    return [int(_read_until(proc, rf"started actor #{i} \(pid (\d+)\)", lines).group(1)) for i in range(1, count + 1)]


def _holders(client, run_name: str, count: int, timeout: float = 60) -> dict[int, int]:
    """Actor id -> pid of its holder, once ids 0..count-1 are all held (their actors are past start-up)."""
    deadline = time.monotonic() + timeout
    while True:
        values = [client.get(f"{run_name}:actor:{i}") for i in range(count)]
        if all(values):
            return {i: int(re.match(r"\S+ pid (\d+) ", v.decode()).group(1)) for i, v in enumerate(values)}
        assert time.monotonic() < deadline, f"actor ids {values}"
        time.sleep(0.1)


def _finish(proc: subprocess.Popen, lines: list[str], timeout: float = 60) -> str:
    out = proc.communicate(timeout=timeout)[0]
    return "".join(lines) + out


def test_a_killed_actor_is_restarted_with_its_id_released(redis_client, redis_url, run_name):
    proc = _start_actors(run_name, redis_url, 1)
    lines: list[str] = []
    try:
        (first,) = _started(proc, 1, lines)
        assert _holders(redis_client, run_name, 1) == {0: first}
        os.kill(first, signal.SIGKILL)
        _read_until(proc, rf"actor #1 \(pid {first}\) exited with code -9; restarting it", lines)
        second = int(_read_until(proc, r"actor #1 restarted \(pid (\d+)\)", lines).group(1))
        assert second != first
        # The restarted actor took id 0 again, long before the dead one's 60 s lease could lapse: released.
        deadline = time.monotonic() + 60
        while (redis_client.get(f"{run_name}:actor:0") or b"").decode().split(" (")[0] != \
                f"{socket.gethostname()} pid {second}":
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            time.sleep(0.1)
        assert not redis_client.exists(f"{run_name}:actor:1")
        # The start count is incremented just after the id's lease is taken (claim_actor_id): wait for it.
        while int(redis_client.get(f"{run_name}:actor:0:starts")) != 2:
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out = _finish(proc, lines)
    assert proc.returncode == 143, out


def test_an_actor_that_exits_with_a_config_error_stops_all_with_code_2(redis_client, redis_url, run_name):
    """Weights published for another network (a learner of another config): each actor refuses them with
    code 2, which a restart cannot fix; the supervisor stops the other and exits 2 without a restart."""
    import torch

    from impala_league.distributed.wire.params import ParamStore

    ParamStore(redis_client, run_name).publish({"not_this_network.weight": torch.zeros(3)}, 1)
    proc = _start_actors(run_name, redis_url, 2)
    lines: list[str] = []
    pids = set(_started(proc, 2, lines))
    out = _finish(proc, lines)
    assert proc.returncode == 2, out
    assert re.search(r"actor #\d \(pid \d+\) failed with an error that a restart cannot fix", out), out
    assert "do not fit this actor's network" in out and "restarting it" not in out
    assert not _wait_gone(pids)


def test_the_run_s_done_key_ends_every_actor_and_the_supervisor_with_0(redis_client, redis_url, run_name):
    proc = _start_actors(run_name, redis_url, 2)
    lines: list[str] = []
    pids = set(_started(proc, 2, lines))
    assert set(_holders(redis_client, run_name, 2).values()) == pids  # both waiting for weights
    redis_client.set(f"{run_name}:done", 1)
    out = _finish(proc, lines)
    assert proc.returncode == 0, out
    for pid in pids:
        assert re.search(rf"actor #\d \(pid {pid}\) exited with code 0: the run is over", out), out
    assert "the run is over: all 2 actors exited" in out and "restarting it" not in out
    assert not _alive(pids)


def test_sigterm_stops_every_actor_and_exits_143(redis_client, redis_url, run_name):
    proc = _start_actors(run_name, redis_url, 2)
    lines: list[str] = []
    pids = set(_started(proc, 2, lines))
    _holders(redis_client, run_name, 2)  # past start-up: their SIGTERM handlers are set
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc, lines)
    assert proc.returncode == 143, out
    assert "stopping 2 actors" in out and "stopped by SIGTERM" in out
    # Each actor stopped by the signal before the run was over says so with its own code, 128 + 15.
    for pid in pids:
        assert re.search(rf"actor #\d \(pid {pid}\) exited with code 143", out), out
    assert not _alive(pids)
    assert not redis_client.exists(f"{run_name}:actor:0") and not redis_client.exists(f"{run_name}:actor:1")
