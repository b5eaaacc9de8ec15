"""Multiple machines on one: Redis and the learner in one network namespace, the actors in another,
joined by a veth pair with their own addresses (10.231.N.1 and .2, which exist only inside those
namespaces). The link is cut and restored mid-run; the actors resume, and the delivery accounting
shows that no acked work was lost.

Skipped where namespaces cannot be made (not root, no `ip`, or `ip netns add` refused). The namespaces,
and the veth pair with them, are deleted in a `finally`.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time

import pytest

from bench.netns import ip, linked_namespaces, namespaces_refused
from impala_league import REPO
from impala_league.distributed.launch.launcher import redis_server_binary
from impala_league.distributed.wire.transport import TrajectoryStream, connect
from tests.distributed.test_delivery import _wait

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's

CUT_S = 13.0  # longer than the actors' socket timeout (11 s): their commands fail and are retried


@pytest.fixture
def two_hosts(run_name):
    """(server namespace, actor namespace, server address, the actor's link device)."""
    why = namespaces_refused()
    if why:
        pytest.skip(why)
    tag = run_name[-8:]
    with linked_namespaces(tag, 16 + int(tag, 16) % 200) as link:
        yield link.server_ns, link.actor_ns, link.server_ip, link.actor_dev


def test_actors_in_another_namespace_resume_after_the_link_is_cut_and_restored(two_hosts, tmp_path, run_name):
    server_ns, actor_ns, server_ip, actor_link = two_hosts
    password = secrets.token_hex(16)
    socket_path = tmp_path / "redis.sock"  # this test's own way in: a unix socket crosses namespaces
    url = f"redis://:{password}@{server_ip}:6379/0"
    settings = [f"run.name={run_name}", f"run.dir={tmp_path}", "run.wandb_mode=disabled", "run.log_every_s=1",
                "run.total_agent_steps=1000000000", "actor.unroll_length=4", "actor.num_envs=2", "actor.high_water_mark=8",
                "learner.batch_size=1", "learner.read_block_ms=100", "agent.hidden=16"]
    config = ["--config", str(REPO / "configs/tictactoe.yaml"), *[a for s in settings for a in ("--set", s)]]
    env = dict(os.environ, IMPALA_REDIS_URL=url, PYTHONUNBUFFERED="1")
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, ns: str, *cmd: str) -> None:
        with (tmp_path / f"{name}.log").open("a") as out:
            procs[name] = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=out, stderr=subprocess.STDOUT,
                                           cwd=REPO, env=env, start_new_session=True)

    try:
        start("redis", server_ns, redis_server_binary(), "--bind", server_ip, "--port", "6379", "--requirepass",
              password, "--unixsocket", str(socket_path), "--unixsocketperm", "700", "--save", "", "--appendonly",
              "no", "--dir", str(tmp_path))
        _wait(socket_path.exists, 10, "redis-server")
        client = connect(f"unix://:{password}@{socket_path}?db=0")
        stream = TrajectoryStream(client, run_name)
        start("learner", server_ns, sys.executable, str(REPO / "run.py"), "learner", *config,
              "--run-dir", str(tmp_path / run_name))
        for i in range(2):
            start(f"actor{i}", actor_ns, sys.executable, str(REPO / "run.py"), "actor", *config, "--actor-id", str(i))
        running = list(procs.values())
        _wait(lambda: stream.accounting()["trained"] >= 20, 90, "training across the link", running)

        ip("-n", actor_ns, "link", "set", actor_link, "down")  # the network between the hosts fails
        cut = stream.accounting()
        time.sleep(CUT_S)
        during = stream.accounting()
        ip("-n", actor_ns, "link", "set", actor_link, "up")
        restored = time.monotonic()
        _wait(lambda: stream.accounting()["produced"] > during["produced"] + 10, 60, "actors to resume", running)
        resumed_s = time.monotonic() - restored

        for name in ("actor0", "actor1"):
            procs[name].send_signal(signal.SIGTERM)
        for name in ("actor0", "actor1"):
            assert procs[name].wait(60) == 128 + signal.SIGTERM, (tmp_path / f"{name}.log").read_text()
        _wait(lambda: stream.accounting()["backlog"] == 0, 60, "the learner to drain", [procs["learner"]])
        final = stream.accounting()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"\nlink cut {CUT_S:.0f} s: produced {cut['produced']} -> {during['produced']} during the cut; "
          f"actors sent again {resumed_s:.1f} s after it was restored; final {final}")
    assert during["produced"] - cut["produced"] <= 2 * 2  # at most a send in flight per actor got through
    assert during["trained"] >= cut["trained"]  # the learner, beside Redis, went on with the backlog
    # Nothing acked was lost and nothing trained twice: an add re-sent after the cut lost its reply is
    # done once (`TrajectoryStream.add`), so each produced unroll is trained once.
    assert final["produced"] == final["trained"] + final["dead_lettered"]
    assert final["dead_lettered"] == 0 and final["backlog"] == 0
    for i in range(2):
        actor_log = (tmp_path / f"actor{i}.log").read_text()
        assert "Traceback" not in actor_log and password not in actor_log
        # Noticed by the command in flight (a timeout) or by the refresh of the actor's id lease (the
        # route is gone: a connection error), whichever comes first.
        assert re.search(r"lost Redis at redis://\*\*\*@10\.231\.\d+\.1:6379/0 \((TimeoutError|ConnectionError)",
                         actor_log)
        assert "is back after" in actor_log  # reconnected by the retry policy, not restarted
