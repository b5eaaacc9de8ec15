"""Weights from read-only replicas of the run's Redis (transport.params_urls): a reader takes a replica's
copy only when it is exactly the weights the run's Redis names, else it fetches them from the run's Redis.

Real redis-servers: the session's (conftest.py) is the run's Redis; a `--replicaof` replica of it, and a
standalone server that is no replica (so a test can put wrong bytes under the weights keys).
"""

from __future__ import annotations

import logging
import socket

import pytest
import redis
import torch

from impala_league import REPO
from impala_league.config import ConfigError, load_config
from impala_league.distributed.launch.launcher import EmbeddedRedis
from impala_league.distributed.wire.codec import encode_weights, weights_digest
from impala_league.distributed.wire.params import ParamStore, params_replica

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's


def _plain(server: EmbeddedRedis) -> str:
    """The server's URL as transport.params_urls lists it: no password (the run's URL lends it)."""
    return f"redis://127.0.0.1:{server.port}/0"


@pytest.fixture(scope="module")
def replica(redis_server):
    server = EmbeddedRedis(appendonly=False, replica_of=redis_server)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def impostor(redis_server):
    """A server with the run's password that is not a replica: it holds whatever a test writes there."""
    server = EmbeddedRedis(appendonly=False, password=redis_server.password)
    yield server
    server.stop()


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"torso.weight": torch.randn(64, 32, generator=g), "head.bias": torch.randn(7, generator=g)}


def _publish(client: redis.Redis, run: str, weights: dict[str, torch.Tensor], version: int, delay: int = 0,
             replicas: int = 0) -> None:
    ParamStore(client, run, delay=delay).publish(weights, version)
    if replicas:  # the engine's own acknowledgement: the replica holds the publish once WAIT returns
        assert client.wait(replicas, 5000) >= replicas


def _reader(redis_url: str, run: str, url: str, delay: int = 0) -> ParamStore:
    from impala_league.distributed.wire.transport import connect

    client, name = params_replica(redis_url, [url], actor_id=0)
    return ParamStore(connect(redis_url), run, delay=delay, replica=client, replica_name=name)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fetch_through_a_replica_returns_the_primary_weights_sent_by_the_replica(
        redis_client, redis_url, run_name, replica):
    weights = _weights(1)
    _publish(redis_client, run_name, weights, 7, replicas=1)
    reader = _reader(redis_url, run_name, _plain(replica))
    sent_before = redis.Redis.from_url(replica.url).info("stats")["total_net_output_bytes"]
    version, fetched = reader.fetch()
    assert version == 7 and _same(fetched, weights)
    assert reader.from_replica and reader.replica_fallbacks == 0
    assert ParamStore(redis_client, run_name).replica_fallback_count() == 0
    assert reader.fetched_digest.decode() == weights_digest(encode_weights(weights))
    # The blob's bytes left the replica, not the run's Redis.
    sent = redis.Redis.from_url(replica.url).info("stats")["total_net_output_bytes"] - sent_before
    assert sent >= len(encode_weights(weights))


def test_a_delayed_reader_gets_the_k_behind_weights_from_the_replica(redis_client, redis_url, run_name, replica):
    for v in (1, 2, 3):
        _publish(redis_client, run_name, _weights(v), v, delay=1, replicas=1)
    reader = _reader(redis_url, run_name, _plain(replica), delay=1)
    version, fetched = reader.fetch()
    assert version == 2 and _same(fetched, _weights(2)) and reader.from_replica


@pytest.mark.parametrize("bad", ["garbage blob", "other weights with their own digest", "an older version"])
def test_a_replica_copy_that_is_not_the_published_weights_is_never_used(
        bad, redis_client, redis_url, run_name, impostor, caplog):
    weights = _weights(1)
    _publish(redis_client, run_name, weights, 5)
    fake = redis.Redis.from_url(impostor.url)
    store = ParamStore(fake, run_name)
    if bad == "garbage blob":  # the published version and digest, torn bytes
        store.publish(weights, 5)
        fake.set(store.key, b"\x00garbage" * 100)
    elif bad == "other weights with their own digest":  # consistent in itself, but not what the run's Redis names
        store.publish(_weights(2), 5)
    else:
        store.publish(weights, 4)
    reader = _reader(redis_url, run_name, _plain(impostor))
    with caplog.at_level(logging.WARNING, logger="params"):
        for _ in range(2):
            version, fetched = reader.fetch()
            assert version == 5 and _same(fetched, weights)
            assert not reader.from_replica
    assert reader.replica_fallbacks == 2
    assert ParamStore(redis_client, run_name).replica_fallback_count() == 2  # what metrics.jsonl reports
    assert len([r for r in caplog.records if "not from replica" in r.getMessage()]) == 1  # once, not per fetch
    assert ParamStore(redis_client, run_name).corrupt_count() == 0  # the run's weights are sound


def test_a_replica_one_publish_behind_is_read_again_and_used_once_it_caught_up(
        redis_client, redis_url, run_name, impostor, monkeypatch):
    import threading

    from impala_league.distributed.wire import params as params_module

    monkeypatch.setattr(params_module, "REPLICA_CATCH_UP_S", 0.5)  # room for the late write below
    weights = _weights(6)
    late = ParamStore(redis.Redis.from_url(impostor.url), run_name)
    late.publish(_weights(5), 5)
    _publish(redis_client, run_name, weights, 6)
    catch_up = threading.Timer(0.1, late.publish, (weights, 6))  # version 6 reaches the "replica" late
    catch_up.start()
    reader = _reader(redis_url, run_name, _plain(impostor))
    version, fetched = reader.fetch()
    catch_up.join()
    assert version == 6 and _same(fetched, weights)
    assert reader.from_replica and reader.replica_fallbacks == 0


def test_an_unreachable_replica_falls_back_to_the_primary(redis_client, redis_url, run_name, caplog):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    weights = _weights(3)
    _publish(redis_client, run_name, weights, 2)
    reader = _reader(redis_url, run_name, f"redis://127.0.0.1:{port}/0")
    with caplog.at_level(logging.WARNING, logger="params"):
        for _ in range(3):
            version, fetched = reader.fetch()
            assert version == 2 and _same(fetched, weights) and not reader.from_replica
    assert reader.replica_fallbacks == 3
    logged = [r.getMessage() for r in caplog.records if "not from replica" in r.getMessage()]
    assert len(logged) == 1 and f"127.0.0.1:{port}" in logged[0]
    password = redis_url.split("//:", 1)[1].rsplit("@", 1)[0]
    assert password not in logged[0]  # the replica's URL carries the run's password: never logged


def test_an_actor_reads_its_weights_from_the_replica_its_id_picks(tmp_path, redis_client, redis_url, run_name,
                                                                  replica, impostor):
    from impala_league.agents.model import make_model
    from impala_league.distributed.actor import Actor
    from impala_league.envs.registry import env_spec

    (tmp_path / run_name).mkdir()
    cfg = load_config(REPO / "configs/tictactoe.yaml", [
        f"run.name={run_name}", f"run.dir={tmp_path}", "run.wandb_mode=disabled", "actor.num_envs=1",
        f"transport.params_urls=[{_plain(impostor)},{_plain(replica)}]"])
    model = make_model(env_spec(cfg.env.name, cfg.env.kwargs), cfg.agent)
    _publish(redis_client, run_name, model.state_dict(), 9, replicas=1)
    actor = Actor(cfg, redis_url, 1)  # id 1 of two URLs: the replica
    try:
        actor.sync_params(wait=True)
        assert actor.policy.version == 9 and actor.link.params.from_replica
        assert actor.link.params.replica_name == _plain(replica).replace("redis://", "redis://***@")
        assert _same(actor.policy.model.state_dict(), model.state_dict())
    finally:
        actor.close()


def test_a_bad_params_url_is_refused_by_the_config():
    with pytest.raises(ConfigError, match=r"transport.params_urls must be redis://host:port\[/db\]"):
        load_config(REPO / "configs/tictactoe.yaml", ["transport.params_urls=[http://replica:6379]"])
    with pytest.raises(ConfigError, match="transport.params_urls") as e:  # a password stays out of the config
        load_config(REPO / "configs/tictactoe.yaml", ["transport.params_urls=[redis://:hunter2@replica:6379/0]"])
    assert "hunter2" not in str(e.value)
