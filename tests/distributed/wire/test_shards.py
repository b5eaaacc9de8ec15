"""Sharded trajectory streams (`transport.shards`, `transport.shard_urls`; distributed/wire/shards.py): each actor
writes to shard actor_id % shards, the learner trains on every shard, acks go to the shard an entry came
from, and the delivery accounting balances per shard and in total, also across a shard server's outage.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time

import pytest
from redis.crc import key_slot

from impala_league.analysis.runs import delete_run_keys, list_redis_runs
from impala_league.config import ConfigError
from impala_league.distributed.launch.launcher import EmbeddedRedis, redis_server_binary
from impala_league.distributed.wire import shards as shards_module
from impala_league.distributed.wire.shards import ShardedTrajectories
from impala_league.distributed.wire.transport import (GROUP, TrajectoryStream, actor_shard, connect, connect_shard,
                                                      shard_namespace, shard_urls)
from tests.background import Background
from tests.distributed.test_faults import T, encode, small_config, valid_unroll

UNROLL_COUNTS = ("produced", "trained", "dead_lettered", "backlog")


def delivery(stream) -> dict:
    """A stream's delivery accounting: without `throttled_s` (the seconds an actor waited vary from run to
    run) and `env_steps` (the steps its actors played)."""
    return {k: v for k, v in stream.accounting().items() if k not in ("throttled_s", "env_steps")}


def send(stream: TrajectoryStream, actor_id: int, rewards: list[float], sent: int = 0) -> int:
    """Add real encoded unrolls as actor `actor_id` does (ids `<actor>-tok-<n>`, produced counted in the
    same script). Returns the actor's running total."""
    payloads = [encode(valid_unroll(r), unroll_id=f"{actor_id}-tok-{sent + i}") for i, r in enumerate(rewards)]
    stream.add(payloads, producer=f"{actor_id}-tok", produced=sent + len(payloads))
    return sent + len(payloads)


def wait_for(condition, timeout: float, what: str, thread=None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert thread is None or thread.is_alive(), f"the learner ended: {thread.error}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def stop(learner, thread) -> None:
    learner.stop()
    thread.join(20)
    assert not thread.is_alive() and thread.error is None, thread.error


def test_one_shard_keeps_the_run_keys_and_more_shards_get_one_hash_tag_each(redis_client, run_name):
    one = TrajectoryStream(redis_client, run_name)
    assert (one.key, one.produced_key, one.throttled_key, one.trained_key, one.deadletter_key,
            one.deadletter_count_key) == (
        f"{run_name}:traj", f"{run_name}:traj:produced", f"{run_name}:traj:throttled", f"{run_name}:traj:trained",
        f"{run_name}:deadletter", f"{run_name}:deadletter:count")
    assert TrajectoryStream(redis_client, run_name, shard=0).key == one.key
    assert shard_namespace(run_name, 0) == run_name and shard_namespace(f"{run_name}:p", 2) == f"{{{run_name}:p:s2}}"
    three = TrajectoryStream(redis_client, "myrun", shard=3)
    keys = [three.key, three.produced_key, three.throttled_key, three.trained_key, three.deadletter_key,
            three.deadletter_count_key]
    assert keys[0] == "{myrun:s3}:traj" and keys[4] == "{myrun:s3}:deadletter"
    assert len({key_slot(k.encode()) for k in keys}) == 1  # one slot: the Lua scripts may touch them together
    assert len({key_slot(TrajectoryStream(redis_client, "myrun", shard=s).key.encode()) for s in (1, 2, 3)}) == 3
    assert [actor_shard(i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    url = "redis://:pw@127.0.0.1:6379/0"
    assert shard_urls(url, 3) == [url] * 3
    assert shard_urls(url, 3, ["redis://a:1/0", "redis://b:2"]) == [
        "redis://:pw@a:1/0", "redis://:pw@b:2", "redis://:pw@a:1/0"]


@pytest.mark.parametrize("overrides, message", [
    (["transport.shards=0"], r"transport.shards must be in \[1, 256\] \(got 0\)"),
    (["transport.shards=257"], r"transport.shards must be in \[1, 256\] \(got 257\)"),
    (["transport.shards=1", "transport.shard_urls=[redis://a:1,redis://b:2]"],
     "transport.shard_urls lists 2 servers for transport.shards=1"),
    (["transport.shards=2", "transport.shard_urls=[redis://:secret@a:1]"], "without user or password"),
    (["transport.shards=2", "transport.shard_urls=[http://a:1]"], "must be redis://host:port"),
])
def test_bad_shard_settings_are_refused_with_what_to_change(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        small_config("shards", tmp_path, *overrides)
    assert "secret" not in str(e.value)


def test_three_shards_on_one_redis_train_every_actors_unrolls_and_balance_per_shard(
        tmp_path, redis_client, redis_url, run_name):
    """Five actors on three shards (actor i on shard i % 3; actor 4 a real `Actor`), 18 unrolls; an add
    re-sent on shard 1 (done once) and a garbage entry on shard 2. The learner trains on all of them; each shard's counts balance, and so do the totals."""
    from impala_league.distributed.actor import Actor
    from impala_league.distributed.learner.role import Learner

    cfg = small_config(run_name, tmp_path, "transport.shards=3", "run.total_agent_steps=100000")
    actor = Actor(cfg, redis_url, actor_id=4)  # the real actor: id 4 writes to shard 1 and counts there
    assert actor.link.trajectories.key == f"{{{run_name}:s1}}:traj"
    actor.policy.version = 0  # as if it had loaded the learner's first weights (-1 is dead-lettered)
    assert actor.send([valid_unroll(0.5), valid_unroll(-0.5)]) is False
    actor.close()
    streams = [TrajectoryStream(redis_client, run_name, shard=s) for s in range(3)]
    for actor_id in range(4):
        send(streams[actor_shard(actor_id, 3)], actor_id, [1.0, -1.0, 0.5, 0.0])
    send(streams[1], 1, [1.0, -1.0, 0.5, 0.0])  # actor 1's add re-sent: nothing added
    redis_client.xadd(streams[2].key, {"data": b"garbage"})
    assert [s.backlog() for s in streams] == [8, 4 + 2, 4 + 1]

    learner = Learner(cfg, redis_url, tmp_path / run_name)
    thread = Background(learner.run)
    thread.start()
    wait_for(lambda: sum(s.accounting()["backlog"] for s in streams) == 0, 20, "the shards to drain", thread)
    stop(learner, thread)

    per_shard = [delivery(s) for s in streams]
    assert per_shard == [
        {"produced": 8, "trained": 8, "dead_lettered": 0, "backlog": 0},
        {"produced": 6, "trained": 6, "dead_lettered": 0, "backlog": 0},
        {"produced": 4, "trained": 4, "dead_lettered": 1, "backlog": 0}]
    assert learner.agent_steps == 18 * T and learner.checkpoints.unrolls_trained == 18
    assert delivery(learner.ingest.trajectories) == {k: sum(c[k] for c in per_shard) for k in UNROLL_COUNTS}
    for s in streams:  # every ack went to the shard its entry came from
        assert redis_client.xpending(s.key, GROUP)["pending"] == 0
    assert redis_client.xlen(streams[2].deadletter_key) == 1 and redis_client.xlen(f"{run_name}:deadletter") == 0
    record = json.loads((tmp_path / run_name / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["unrolls_trained"] == 18 and record["queue_depth_shards"] == [0, 0, 0]
    assert record["dead_letters"] == 1
    # `run.py runs` lists the shards' keys under the run and `--delete` removes them too.
    [row] = [r for r in list_redis_runs(redis_client) if r["name"] == run_name]
    assert row["keys"] > 10 and delete_run_keys(redis_client, run_name) == row["keys"]
    assert not redis_client.exists(*(s.key for s in streams), streams[2].deadletter_key)


def test_a_shard_server_that_stops_does_not_stop_the_others_and_loses_nothing_acked(
        tmp_path, redis_server, redis_client, run_name, monkeypatch, caplog):
    """Shard 0 on the run's Redis, shard 1 on a second server. Stopping the second (SIGTERM to its pid),
    the learner keeps training shard 0; restarted from its append-only file, shard 1 is trained again,
    the acks of before the stop are there, and everything balances."""
    from impala_league.distributed.learner.role import Learner

    monkeypatch.setattr(shards_module, "PROBE_MAX_S", 0.5)  # probe the stopped server often: a short test
    other = EmbeddedRedis(password=redis_server.password)
    try:
        urls = [f"redis://127.0.0.1:{server.port}/0" for server in (redis_server, other)]
        cfg = small_config(run_name, tmp_path, "transport.shards=2", "run.total_agent_steps=100000",
                           f"transport.shard_urls=[{','.join(urls)}]")
        far = connect(other.url)
        shard0, shard1 = TrajectoryStream(redis_client, run_name, shard=0), TrajectoryStream(far, run_name, shard=1)
        sent0, sent1 = send(shard0, 0, [1.0, -1.0, 0.5, 0.0]), send(shard1, 1, [1.0, -1.0, 0.5, 0.0])

        learner = Learner(cfg, redis_server.url, tmp_path / run_name)
        thread = Background(learner.run)
        thread.start()
        wait_for(lambda: shard0.accounting()["trained"] == 4 and shard1.accounting()["trained"] == 4, 20,
                 "both shards trained", thread)
        with caplog.at_level(logging.INFO, logger="shards"):
            os.kill(other.proc.pid, signal.SIGTERM)
            other.proc.wait(10)
            sent0 = send(shard0, 0, [0.25] * 6, sent0)
            wait_for(lambda: shard0.accounting()["trained"] == 10, 20, "shard 0 trained while shard 1 is down",
                     thread)
            assert learner.ingest.trajectories.servers_down() == 1
            other.restart()  # same port and password, its data from the append-only file
            sent1 = send(shard1, 1, [0.75] * 4, sent1)
            wait_for(lambda: shard1.accounting()["backlog"] == 0, 20, "shard 1 trained again", thread)
        stop(learner, thread)
        assert any("unreachable" in r.getMessage() for r in caplog.records)
        assert any("is back" in r.getMessage() for r in caplog.records)
        assert delivery(shard0) == {"produced": 10, "trained": 10, "dead_lettered": 0,
                                       "backlog": 0}
        assert delivery(shard1) == {"produced": 8, "trained": 8, "dead_lettered": 0,
                                       "backlog": 0}
        assert learner.agent_steps == 18 * T
        assert far.xpending(shard1.key, GROUP)["pending"] == 0 == redis_client.xpending(shard0.key, GROUP)["pending"]
        far.close()
    finally:
        other.stop()


def test_acks_for_a_stopped_shard_server_wait_and_are_sent_when_it_is_back(redis_server, redis_client, run_name,
                                                                           monkeypatch):
    """Entries read from shard 1 just before its server stops: their ack is kept (the other shard's goes
    through), they count as in flight (no pending re-read), and once the server is
    back the kept ack lands: trained on shard 1, nothing pending, nothing trained twice."""
    monkeypatch.setattr(shards_module, "SHARD_RETRY_S", 0.3)
    monkeypatch.setattr(shards_module, "PROBE_MAX_S", 0.2)
    other = EmbeddedRedis(password=redis_server.password)
    try:
        urls = [f"redis://127.0.0.1:{server.port}/0" for server in (redis_server, other)]
        sharded = ShardedTrajectories(redis_client, redis_server.url, run_name, 2, urls, block_ms=50)
        far = connect(other.url)
        shard0, shard1 = TrajectoryStream(redis_client, run_name, shard=0), TrajectoryStream(far, run_name, shard=1)
        send(shard0, 0, [1.0, 0.0])
        send(shard1, 1, [1.0, 0.0])
        sharded.ensure_group()
        entries = sharded.read("c", 4, 50) + sharded.read("c", 4, 50)
        assert sorted(e.shard for e, _ in entries) == [0, 0, 1, 1]
        os.kill(other.proc.pid, signal.SIGTERM)
        other.proc.wait(10)
        sharded.ack([e for e, _ in entries])
        assert shard0.accounting()["trained"] == 2 and sharded.servers_down() == 1
        other.restart()
        time.sleep(0.3)  # past the next probe
        assert sharded.read("c", 4, 50, pending_after="0") == []  # kept entries are not handed out again
        sharded.ack([])
        assert sharded.servers_down() == 0
        assert delivery(shard1) == {"produced": 2, "trained": 2, "dead_lettered": 0,
                                       "backlog": 0}
        assert sharded.accounting()["trained"] == 4 and far.xpending(shard1.key, GROUP)["pending"] == 0
        far.close()
    finally:
        other.stop()


def _free_cluster_port() -> int:
    """A loopback port that is free, and so is its cluster bus port (port + 10000)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


CLUSTER_NODES = 3


def _start_cluster_node(password: str, tmp_path) -> tuple[int, subprocess.Popen]:
    """One cluster-enabled redis-server on a free loopback port, answering PING: (port, process). A node
    that exits before it answers (its port taken between the choice and its bind, by another test) is
    started again on another port."""
    for _ in range(5):
        port = _free_cluster_port()
        proc = subprocess.Popen(
            [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password,
             "--masterauth", password, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
             "--cluster-node-timeout", "2000", "--dir", str(tmp_path), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if _answers(port, password):
                return port, proc
            time.sleep(0.1)
        proc.terminate()
        proc.wait(10)
    raise AssertionError("no cluster node answered in five starts")


@pytest.fixture
def cluster_node(redis_server, tmp_path):
    """A three-node Redis Cluster on loopback, the slots split in three, with the run's password:
    the URL of its first node, "redis://127.0.0.1:PORT/0" (a cluster client finds the others)."""
    ports, procs = [], []
    try:
        for _ in range(CLUSTER_NODES):
            port, proc = _start_cluster_node(redis_server.password, tmp_path)
            ports.append(port)
            procs.append(proc)
        nodes = []
        for i, port in enumerate(ports):
            node = connect(f"redis://:{redis_server.password}@127.0.0.1:{port}/0")
            node.execute_command("CLUSTER", "ADDSLOTS", *range(i * 16384 // CLUSTER_NODES, (i + 1) * 16384 // CLUSTER_NODES))
            nodes.append(node)
        for port in ports[1:]:
            nodes[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        wait_for(lambda: all(n.cluster("info")["cluster_state"] == "ok" and
                             int(n.cluster("info")["cluster_known_nodes"]) == CLUSTER_NODES for n in nodes),
                 30, "the cluster state")
        for node in nodes:
            node.close()
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def _answers(port: int, password: str) -> bool:
    try:
        return connect(f"redis://:{password}@127.0.0.1:{port}/0").ping()
    except Exception:  # noqa: BLE001 (not up yet)
        return False


def test_shards_on_a_redis_cluster_are_each_one_slot_and_train_balanced(tmp_path, redis_server, redis_client,
                                                                       cluster_node, run_name):
    """Three shards on a three-node Redis Cluster (shard_urls): shard 0 is tagged too, each shard's keys
    share a slot, shards spread over the nodes, actors and learner get RedisCluster clients, and the
    learner trains every unroll with the counts balanced per shard."""
    from redis.cluster import RedisCluster
    from redis.crc import key_slot

    from impala_league.distributed.actor import Actor
    from impala_league.distributed.learner.role import Learner

    # The tags spread: for a fixed run name, shards 0..2 fall on all three thirds of the slots.
    assert {key_slot(f"{shard_namespace('run', s, cluster=True)}:traj".encode()) * 3 // 16384
            for s in range(3)} == {0, 1, 2}
    cfg = small_config(run_name, tmp_path, "transport.shards=3", "run.total_agent_steps=100000",
                       f"transport.shard_urls=[{cluster_node}]")
    actor = Actor(cfg, redis_server.url, actor_id=1)
    assert isinstance(actor.link.trajectories.r, RedisCluster) and actor.link.trajectories.key == f"{{{run_name}:s1}}:traj"
    actor.policy.version = 0
    assert actor.send([valid_unroll(0.5), valid_unroll(-0.5)]) is False
    actor.close()
    cluster = connect_shard(shard_urls(redis_server.url, 3, [cluster_node])[0])
    assert len(cluster.get_primaries()) == CLUSTER_NODES
    shard0 = TrajectoryStream(cluster, run_name, shard=0)
    assert shard0.key == f"{{{run_name}:s0}}:traj" and shard_namespace(run_name, 0, cluster=True) == f"{{{run_name}:s0}}"
    send(shard0, 0, [1.0, -1.0, 0.5, 0.0])
    cluster.xadd(shard0.key, {"data": b"garbage"})
    shard1, shard2 = (TrajectoryStream(cluster, run_name, shard=s) for s in (1, 2))
    send(shard2, 2, [0.25, -0.25])
    for shard in (shard0, shard1, shard2):  # every key of a shard in its stream's slot
        keys = [shard.key, shard.produced_key, shard.trained_key, shard.deadletter_key]
        assert {key_slot(k.encode()) for k in keys} == {key_slot(shard.key.encode())}
    learner = Learner(cfg, redis_server.url, tmp_path / run_name)
    thread = Background(learner.run)
    thread.start()
    wait_for(lambda: sum(s.accounting()["backlog"] for s in (shard0, shard1, shard2)) == 0, 20,
             "every shard drained", thread)
    stop(learner, thread)
    assert delivery(shard0) == {"produced": 4, "trained": 4, "dead_lettered": 1, "backlog": 0}
    assert delivery(shard1) == {"produced": 2, "trained": 2, "dead_lettered": 0, "backlog": 0}
    assert delivery(shard2) == {"produced": 2, "trained": 2, "dead_lettered": 0, "backlog": 0}
    assert learner.agent_steps == 8 * T and cluster.xpending(shard0.key, GROUP)["pending"] == 0
    assert not redis_client.exists(f"{run_name}:traj", f"{run_name}:traj:trained")  # nothing on the run's Redis
    cluster.close()
