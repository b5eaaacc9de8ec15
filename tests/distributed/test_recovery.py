"""Failures and recovery (docs/architecture.md): Redis restarts with and without its data, outages
longer than `run.redis_retry_s`, consumers that died with unrolls pending, blocking reads and socket
timeouts, and a redis-server killed under a running training job.

Tests that stop or restart Redis get a redis-server of their own (`own_redis`, `volatile_redis`); the
others use the session's. Each stays within seconds.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from impala_league import REPO
from impala_league.distributed.launch.launcher import EmbeddedRedis
from impala_league.distributed.wire.transport import (GROUP, DeadConsumerSweeper, RedisGaveUp, RedisUnavailable,
                                                      RetryPolicy, TrajectoryStream, connect, redis_outages)
from tests.background import Background
from tests.distributed.test_faults import T, _descendants, encode, small_config, valid_unroll

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's


@pytest.fixture
def own_redis():
    """A redis-server for this test alone, with its append-only file (as the launcher runs it)."""
    server = EmbeddedRedis()
    yield server
    server.stop()


def kill_once_written(server: EmbeddedRedis) -> int:
    """SIGKILL `server` once its append-only file holds every write it has acknowledged; returns its pid.

    With appendfsync everysec, Redis postpones writing its AOF (for up to 2 s) while the previous
    background fsync still runs, and replies anyway; a kill then loses those writes. That is the
    documented everysec trade-off, and on a busy machine it made these tests flaky."""
    client = redis.Redis.from_url(server.url)
    deadline = time.monotonic() + 5
    while client.info("persistence")["aof_buffer_length"] and time.monotonic() < deadline:
        time.sleep(0.01)
    client.close()
    pid = server.proc.pid
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.fixture
def volatile_redis():
    """A redis-server for this test alone that keeps nothing across a restart (no persistence)."""
    server = EmbeddedRedis(appendonly=False)
    yield server
    server.stop()


def payloads(n: int, start: int = 0) -> list[bytes]:
    return [f"unroll-{i}".encode() for i in range(start, start + n)]


def consumers(client, key: str) -> dict[str, int]:
    """name -> pending count of each consumer of the group."""
    return {c["name"].decode(): c["pending"] for c in client.xinfo_consumers(key, GROUP)}


def messages(caplog, pattern: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if re.search(pattern, r.getMessage())]


# -- (c) block times and socket timeouts are set together -------------------------------------------

@pytest.mark.parametrize("block_ms", [1, 1000, 30_000])
def test_connect_sets_a_socket_timeout_above_the_block_time(redis_url, block_ms):
    client = connect(redis_url, block_ms=block_ms)
    assert client.connection_pool.connection_kwargs["socket_timeout"] > block_ms / 1000
    client.close()


def test_a_read_blocking_as_long_as_configured_returns_nothing_rather_than_an_error(redis_url, run_name):
    client = connect(redis_url, block_ms=1500)
    stream = TrajectoryStream(client, run_name)
    stream.ensure_group()
    start = time.monotonic()
    assert stream.read("learner-0", count=1, block_ms=1500) == []
    assert time.monotonic() - start >= 1.4
    assert redis_outages(client) == 0 and client.get_retry().attempts == 0  # no timeout hidden by a retry
    client.close()


def test_a_read_blocking_longer_than_the_socket_timeout_is_refused_before_it_is_sent(redis_url, run_name):
    """Sent, it would end in a TimeoutError after the socket timeout (and, retried, never return)."""
    short = redis.Redis.from_url(redis_url, socket_timeout=0.5)
    stream = TrajectoryStream(short, run_name)
    stream.ensure_group()
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"needs a socket timeout above 1 s, this client's is 0.5 s"):
        stream.read("learner-0", count=1, block_ms=1000)
    assert time.monotonic() - start < 0.2
    short.close()


def test_the_learner_client_can_block_for_its_configured_read(tmp_path, redis_url, run_name):
    from impala_league.distributed.learner.role import Learner

    learner = Learner(small_config(run_name, tmp_path, "learner.read_block_ms=30000"), redis_url, tmp_path / run_name)
    assert learner.redis.connection_pool.connection_kwargs["socket_timeout"] > 30
    learner.metrics.file.close()


# -- reconnect with backoff -------------------------------------------------------------------------

def test_a_client_rides_out_a_redis_restart_and_logs_the_outage_once(own_redis, caplog):
    client = connect(own_redis.url, retry_s=20)
    stream = TrajectoryStream(client, "run")
    stream.ensure_group()
    stream.add(payloads(3))
    taken = stream.read("learner-0", count=2, block_ms=10)
    kill_once_written(own_redis)
    start = time.monotonic()
    results = {}

    def backlog():  # the learner's loop
        results["backlog"] = stream.backlog()
        results["waited"] = time.monotonic() - start

    def other():  # a second user of the same client during the same outage (the learner's lease keeper)
        results["other"] = client.get("anything")

    threads = [threading.Thread(target=backlog), threading.Thread(target=other)]
    with caplog.at_level(logging.INFO, logger="transport"):
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        own_redis.restart()  # from this thread: a server dies with the thread that started it
        for thread in threads:
            thread.join(10)
    waited, backlog = results["waited"], results["backlog"]
    assert backlog == 3 and results["other"] is None
    assert 0.9 <= waited < 6.0  # back within the 2 s backoff cap of the restart (+ slack for a loaded machine)
    # The append-only file kept the stream, the group and who holds what.
    assert stream.read("learner-0", count=10, block_ms=10, pending_after="0") == taken
    assert consumers(client, stream.key) == {"learner-0": 2}
    assert len(messages(caplog, "lost Redis at redis://\\*\\*\\*@127.0.0.1")) == 1
    assert len(messages(caplog, "is back after")) == 1
    policy = client.get_retry()
    assert isinstance(policy, RetryPolicy) and policy.outages == 1
    assert policy.attempts <= 16  # at once, then after 0.1, 0.2, 0.4, 0.8, 1.6, 2 s: no busy loop (two threads)
    assert own_redis.password not in " ".join(r.getMessage() for r in caplog.records)
    client.close()


def test_redis_down_longer_than_the_limit_gives_up_after_the_limit(own_redis):
    client = connect(own_redis.url, retry_s=1.5)
    own_redis.stop()
    start = time.monotonic()
    with pytest.raises(RedisGaveUp, match=r"unreachable for 2 s \(run.redis_retry_s=1.5\)"):
        client.xlen("anything")
    assert 1.5 <= time.monotonic() - start < 3.5
    assert client.get_retry().attempts <= 8
    start = time.monotonic()
    with pytest.raises(RedisGaveUp):  # once given up, the next command fails at once
        client.xlen("anything")
    assert time.monotonic() - start < 0.5


def test_a_refused_password_is_not_retried(own_redis):
    client = connect(own_redis.url, retry_s=30)
    client.config_set("requirepass", "changed")  # takes effect for new connections
    client.connection_pool.disconnect()
    start = time.monotonic()
    with pytest.raises(redis.AuthenticationError):
        client.ping()
    assert time.monotonic() - start < 1.0


def test_the_embedded_redis_watchdog_restarts_a_killed_server_with_its_data(caplog):
    server = EmbeddedRedis(restart_on_exit=True)
    try:
        client = connect(server.url, retry_s=10)
        client.set("kept", "yes")
        pid = kill_once_written(server)
        with caplog.at_level(logging.WARNING, logger="launcher"):
            assert client.get("kept") == b"yes"  # waits through the restart
        assert server.proc.pid != pid and server.restarts == 1
        assert messages(caplog, f"redis-server \\(pid {pid}\\) was killed by SIGKILL; restarting it")
    finally:
        server.stop()
    assert not Path(server.dir).exists()


def test_the_embedded_redis_owns_its_data_folder(tmp_path):
    folder = tmp_path / "run" / "redis"
    folder.mkdir(parents=True)
    (folder / "appendonly.aof").write_text("*3\r\n$3\r\nSET\r\n$5\r\nstale\r\n$1\r\n1\r\n")  # a killed launcher's
    server = EmbeddedRedis(folder)
    try:
        client = connect(server.url)
        assert client.get("stale") is None  # not loaded: the folder was emptied first
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert Path(client.config_get("dir")["dir"]) == folder
    finally:
        server.stop()
    assert not folder.exists() and (tmp_path / "run").exists()


# -- (b) Redis restarted without persistence: NOGROUP -----------------------------------------------

def test_a_group_lost_with_redis_data_is_recreated_and_the_loss_counted(volatile_redis, caplog):
    client = connect(volatile_redis.url, retry_s=10)
    stream = TrajectoryStream(client, "run")
    stream.ensure_group()
    stream.add(payloads(3))
    stream.read("learner-0", count=2, block_ms=10)
    assert stream.backlog() == 3
    volatile_redis.restart()  # no AOF: streams, groups, pending entries are gone
    with pytest.raises(redis.ResponseError, match="NOGROUP"):  # what the learner's next group read meets
        client.xreadgroup(GROUP, "learner-0", {stream.key: ">"}, count=1)
    with caplog.at_level(logging.WARNING, logger="transport"):
        assert stream.read("learner-0", count=10, block_ms=10) == []
    assert stream.group_losses == 1
    [message] = messages(caplog, "stream and group lost")
    assert "3 unrolls" in message and "pending at the time were lost" in message
    assert [g["name"].decode() for g in client.xinfo_groups(stream.key)] == [GROUP]
    stream.add(payloads(2, start=10))  # the learner goes on with what actors send next
    assert [d for _, d in stream.read("learner-0", count=10, block_ms=10)] == payloads(2, start=10)


def test_a_racing_learner_that_recreates_the_group_first_is_tolerated(redis_client, run_name):
    rival = TrajectoryStream(redis_client, run_name)

    class Racing(TrajectoryStream):
        def ensure_group(self):
            rival.ensure_group()  # the other learner wins the race between our NOGROUP and our create
            with pytest.raises(redis.ResponseError, match="BUSYGROUP"):
                self.r.xgroup_create(self.key, GROUP, id="0", mkstream=True)
            super().ensure_group()  # ... which must tolerate BUSYGROUP

    stream = Racing(redis_client, run_name)
    redis_client.delete(stream.key)  # the stream and its group are gone
    assert stream.read("learner-0", count=1, block_ms=10) == []
    assert stream.group_losses == 1
    stream.add(payloads(1))
    assert [d for _, d in stream.read("learner-0", count=1, block_ms=10)] == payloads(1)


def test_the_learner_goes_on_after_redis_restarts_without_its_data(tmp_path, volatile_redis, run_name, caplog):
    from impala_league.distributed.learner.role import Learner

    cfg = small_config(run_name, tmp_path, f"run.total_agent_steps={2 * 2 * T}", "run.redis_retry_s=20")
    learner = Learner(cfg, volatile_redis.url, tmp_path / run_name)
    feeder = connect(volatile_redis.url, retry_s=20)
    for reward in (1.0, -1.0):
        feeder.xadd(f"{run_name}:traj", {"data": encode(valid_unroll(reward))})
    with caplog.at_level(logging.INFO):
        thread = Background(learner.run)
        thread.start()
        deadline = time.monotonic() + 20
        while learner.step < 1 and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert learner.step == 1, thread.error
        volatile_redis.restart()  # everything in Redis is gone: stream, group, params, lease
        for reward in (0.5, 0.0):
            feeder.xadd(f"{run_name}:traj", {"data": encode(valid_unroll(reward))})
        thread.join(30)
    assert not thread.is_alive() and thread.error is None, thread.error
    assert learner.step == 2 and learner.agent_steps == 2 * 2 * T
    assert learner.ingest.trajectories.group_losses == 1
    assert messages(caplog, "stream and group lost")
    assert feeder.xlen(f"{run_name}:traj") == 0  # the two sent after the restart were trained on
    assert feeder.exists(f"{run_name}:done") and int(feeder.get(f"{run_name}:params:version")) == 2
    records = [json.loads(line) for line in (tmp_path / run_name / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["stream_losses"] == 1 and records[-1]["redis_outages"] >= 1


def test_a_lease_lost_with_redis_data_is_taken_again_by_its_learner(redis_client, run_name, caplog):
    from impala_league.distributed.wire.transport import LearnerLease

    lease = LearnerLease(redis_client, run_name, "host-a pid 1")
    lease.TTL_MS = 600
    assert lease.acquire()
    try:
        with caplog.at_level(logging.WARNING, logger="transport"):
            redis_client.delete(lease.key)  # as after a restart without persistence
            time.sleep(0.5)  # more than one refresh period (TTL / 3)
            assert redis_client.get(lease.key) == b"host-a pid 1"
            redis_client.set(lease.key, "host-b pid 2")  # another learner took it meanwhile
            time.sleep(0.7)
            assert redis_client.get(lease.key) == b"host-b pid 2"  # not stolen back
    finally:
        lease.release()
    assert len(messages(caplog, "had lapsed .* taken again")) == 1
    assert len(messages(caplog, r"now held by another learner \(host-b pid 2\)")) == 1  # said once


# -- (a) dead consumers -----------------------------------------------------------------------------

def test_a_consumer_with_pending_entries_is_never_removed(redis_client, run_name):
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    stream.add(payloads(2))
    stream.read("dead", count=2, block_ms=10)
    time.sleep(0.05)
    assert stream.remove_idle_consumers("live", min_idle_ms=0) == []  # idle, but two unrolls pending
    assert consumers(redis_client, stream.key) == {"dead": 2}
    assert stream.claim_stale("live", min_idle_ms=0) == 2
    assert stream.remove_idle_consumers("live", min_idle_ms=0) == ["dead"]
    assert consumers(redis_client, stream.key) == {"live": 2}
    assert stream.remove_idle_consumers("live", min_idle_ms=0) == []  # never the live one itself


def test_the_sweeper_claims_each_entry_once_it_is_idle_and_then_removes_the_dead_consumer(redis_client, run_name):
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    stream.add(payloads(2))
    first = stream.read("dead", count=1, block_ms=10)
    time.sleep(0.5)
    second = stream.read("dead", count=1, block_ms=10)  # the consumer's last act: it dies now
    sweeper = DeadConsumerSweeper(stream, "live", min_idle_ms=400, every_s=0.3)
    assert sweeper.claim_due() == 0  # not due yet: sweeps are periodic
    time.sleep(0.3)
    assert sweeper.claim_due() == 1  # only the first entry has been idle long enough
    assert consumers(redis_client, stream.key) == {"dead": 1, "live": 1}  # dead keeps what it still holds
    assert sweeper.claim_due() == 0  # the next sweep is a period away
    time.sleep(0.35)
    assert sweeper.claim_due() == 1
    assert consumers(redis_client, stream.key) == {"live": 2}  # removed once its pending list was empty
    assert sweeper.claimed == 2 and sweeper.removed == ["dead"]
    assert stream.read("live", count=10, block_ms=10, pending_after="0") == first + second


def test_a_dead_consumers_two_unrolls_are_trained_on_by_the_live_learner(tmp_path, redis_client, redis_url,
                                                                         run_name, caplog):
    from impala_league.distributed.learner.role import Learner

    key = f"{run_name}:traj"
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    for reward in (1.0, -1.0):
        redis_client.xadd(key, {"data": encode(valid_unroll(reward))})
    stream.read("learner-deadhost", count=2, block_ms=10)  # delivered to a learner that then died
    learner = Learner(small_config(run_name, tmp_path, f"run.total_agent_steps={2 * T}"), redis_url, tmp_path / run_name)
    # A minute each in production: here the first sweep comes 0.2 s after start, for entries idle 0.3 s.
    learner.ingest.reader.sweeper = DeadConsumerSweeper(learner.ingest.trajectories, learner.ingest.consumer,
                                                        min_idle_ms=300, every_s=0.2)
    thread = threading.Thread(target=learner.run)
    with caplog.at_level(logging.INFO, logger="transport"):
        thread.start()
        thread.join(20)
    if thread.is_alive():
        learner.stop()
        thread.join(10)
        pytest.fail("the learner never got the dead consumer's unrolls")
    assert learner.step == 1 and learner.agent_steps == 2 * T  # one update, on exactly those two unrolls
    assert learner.ingest.reader.sweeper.claimed == 2 and learner.ingest.reader.sweeper.removed == ["learner-deadhost"]
    assert "learner-deadhost" not in consumers(redis_client, key)
    assert redis_client.xlen(key) == 0  # trained on, acked and deleted
    assert redis_client.xpending(key, GROUP)["pending"] == 0
    assert messages(caplog, "claimed 2 unrolls left pending by dead consumers")
    assert messages(caplog, "removed dead consumers with nothing pending .*learner-deadhost")


# -- give up after run.redis_retry_s ----------------------------------------------------------------

def test_an_actor_exits_with_redis_unavailable_when_redis_stays_down(tmp_path, own_redis, run_name):
    import torch

    from impala_league.agents.network import ActorCritic
    from impala_league.distributed.actor import run_actor
    from impala_league.distributed.wire.params import ParamStore
    from impala_league.envs.registry import env_spec

    cfg = small_config(run_name, tmp_path, "actor.num_envs=2", "run.redis_retry_s=1")
    spec = env_spec("tictactoe")
    ParamStore(connect(own_redis.url), run_name).publish(
        ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent).state_dict(), 0)
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    threads = torch.get_num_threads()
    def stop_once_acting() -> None:  # the actor has sent unrolls: it is past start-up
        client = redis.Redis.from_url(own_redis.url)
        while not client.exists(f"{run_name}:traj"):
            time.sleep(0.05)
        own_redis.stop()

    stopper = threading.Thread(target=stop_once_acting)
    stopper.start()
    start = time.monotonic()
    try:
        with pytest.raises(RedisUnavailable, match=r"actor 0 lost Redis: .*unreachable for 1 s \(run.redis_retry_s=1"):
            run_actor(cfg, own_redis.url, 0)
    finally:
        stopper.join()
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
        torch.set_num_threads(threads)
    assert 1.0 <= time.monotonic() - start < 8.0  # it waited out run.redis_retry_s, and no longer


def test_a_learner_exits_with_redis_unavailable_and_a_checkpoint_when_redis_stays_down(tmp_path, own_redis, run_name):
    import torch

    from impala_league.distributed.learner.role import run_learner

    cfg = small_config(run_name, tmp_path, "run.redis_retry_s=1", "learner.num_threads=3")
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    threads = torch.get_num_threads()
    def stop_once_training() -> None:  # the learner holds its lease: it is past start-up
        client = redis.Redis.from_url(own_redis.url)
        while not client.exists(f"{run_name}:learner"):
            time.sleep(0.05)
        time.sleep(0.5)
        own_redis.stop()

    stopper = threading.Thread(target=stop_once_training)
    stopper.start()
    start = time.monotonic()
    try:
        with pytest.raises(RedisUnavailable, match=r"the learner lost Redis \(RedisGaveUp: .*run.redis_retry_s=1\)"
                                                   r".*checkpoint at update 0 written"):
            run_learner(cfg, own_redis.url, tmp_path / run_name)
        assert torch.get_num_threads() == 3  # learner.num_threads
    finally:
        stopper.join()
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
        torch.set_num_threads(threads)
    assert time.monotonic() - start < 8.0
    assert (tmp_path / run_name / "checkpoints" / "latest.safetensors").exists()


# -- (d) redis-server killed under a running training job -------------------------------------------

def test_redis_killed_under_a_running_train_is_restarted_and_the_run_finishes(tmp_path, run_name):
    """Embedded Redis with its AOF: kill -9 it mid-run; the launcher restarts it, actor and learner
    reconnect, nothing in the stream is lost, and the run reaches its agent steps."""
    cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / "configs/tictactoe.yaml"),
           "--eval-games", "0", "--set", f"run.name={run_name}", "--set", f"run.dir={tmp_path}",
           "--set", "run.wandb_mode=disabled", "--set", "run.total_agent_steps=6000", "--set", "run.log_every_s=1",
           "--set", "actor.num_actors=1", "--set", "actor.num_envs=4", "--set", "actor.unroll_length=8",
           "--set", "learner.batch_size=4", "--set", "actor.high_water_mark=16", "--set", "agent.hidden=16"]
    env = {k: v for k, v in os.environ.items() if k != "IMPALA_REDIS_URL"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    lines: list[str] = []
    killed_at = None
    try:
        for line in proc.stdout:
            lines.append(line)
            if killed_at is None and re.search(r"learner: agent steps trained [\d,]+/", line):
                servers = [p for p in _descendants(proc.pid)
                           if b"redis-server" in Path(f"/proc/{p}/cmdline").read_bytes()]
                assert len(servers) == 1, servers
                assert (tmp_path / run_name / "redis").is_dir()  # its AOF lives in the run directory
                os.kill(servers[0], signal.SIGKILL)
                killed_at = time.monotonic()
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    out = "".join(lines)
    assert code == 0, out
    assert killed_at is not None, out
    assert "was killed by SIGKILL; restarting it from its append-only file" in out
    backs = [float(x) for x in re.findall(r"is back after ([\d.]+) s", out)]
    # At least one client saw the outage and reported its return; one whose next command came after the
    # restart reconnects inside redis-py's own retry and has nothing to report.
    assert backs, out
    assert max(backs) < 5.0
    assert "stream and group lost" not in out  # the AOF kept the stream: nothing had to be recreated
    assert "learner done" in out and "Traceback" not in out
    meta = json.loads((tmp_path / run_name / "checkpoints" / "latest.json").read_text())
    assert meta["agent_steps_trained"] >= 6000
    assert not (tmp_path / run_name / "redis").exists()  # removed with the server
    print(f"reconnected after {backs} s")
