"""Tests for distributed/wire/transport.py and distributed/wire/params.py against a real redis-server."""

from __future__ import annotations

import socket
import threading
import time

import msgpack
import pytest
import torch

from impala_league.distributed.wire.params import ParamStore
from impala_league.distributed.wire.transport import GROUP, RedisUnavailable, ResultsStream, TrajectoryStream, connect


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def payloads(n: int, start: int = 0) -> list[bytes]:
    # Binary payloads with every byte value, so nothing is decoded or stripped on the way.
    return [f"unroll-{i}:".encode() + bytes(range(256)) for i in range(start, start + n)]


@pytest.fixture
def traj(redis_client, run_name) -> TrajectoryStream:
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    return stream


def pending_count(client, key: str) -> int:
    return client.xpending(key, GROUP)["pending"]


# -- connect ----------------------------------------------------------------------------------------

def test_connect_to_nothing_raises_quickly_without_the_password():
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    start = time.monotonic()
    with pytest.raises(RedisUnavailable, match="cannot reach Redis at redis://\\*\\*\\*@127.0.0.1") as info:
        connect(url)
    assert time.monotonic() - start < 2.0
    assert "s3cret" not in str(info.value)
    assert "cret" not in str(info.value)


def test_connect_error_hides_a_password_containing_at_sign():
    with pytest.raises(RedisUnavailable) as info:
        connect(f"redis://:pass@wxyz@127.0.0.1:{free_port()}/0")
    assert "wxyz" not in str(info.value) and "pass@" not in str(info.value)


@pytest.mark.parametrize("url, message", [
    ("http://:s3cret@127.0.0.1:6379/0", "bad Redis URL"),
    ("redis://:s3cret@127.0.0.1:notaport/0", "bad Redis URL"),
    ("redis://:s3cret@127.0.0.1:99999/0", "bad Redis URL"),
    ("localhost:6379", "bad Redis URL localhost:6379"),
])
def test_malformed_url_is_redis_unavailable_without_the_password(url, message):
    with pytest.raises(RedisUnavailable, match=message) as info:
        connect(url)
    assert "s3cret" not in str(info.value)


def test_db_index_out_of_range_is_redis_unavailable(redis_server):
    with pytest.raises(RedisUnavailable, match="DB index is out of range") as info:
        connect(f"redis://:{redis_server.password}@127.0.0.1:{redis_server.port}/999")
    assert redis_server.password not in str(info.value)


def test_password_in_the_query_string_is_not_shown(redis_server):
    with pytest.raises(RedisUnavailable, match="refused the password") as info:
        connect(f"redis://127.0.0.1:{redis_server.port}/0?password=hunter2")
    assert "hunter2" not in str(info.value)


def test_connect_with_wrong_password(redis_server):
    url = f"redis://:wrong-{redis_server.password[:4]}x@127.0.0.1:{redis_server.port}/0"
    with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{redis_server.port}") as info:
        connect(url)
    assert "wrong-" not in str(info.value)


def test_connect_works_with_the_right_password(redis_url):
    client = connect(redis_url)
    assert client.ping() is True
    client.close()


# -- trajectory stream ------------------------------------------------------------------------------

def test_add_read_ack_in_order(traj, redis_client):
    sent = payloads(5)
    traj.add(sent)
    assert redis_client.xlen(f"{traj.key}") == 5 and traj.key.endswith(":traj")
    assert traj.backlog() == 5
    got = traj.read("learner-0", count=3, block_ms=10)
    assert [data for _, data in got] == sent[:3]
    assert traj.backlog() == 5  # 2 unread + 3 pending
    got += traj.read("learner-0", count=10, block_ms=10)
    assert [data for _, data in got] == sent
    assert traj.read("learner-0", count=10, block_ms=10) == []
    assert traj.backlog() == 5 and pending_count(redis_client, traj.key) == 5
    traj.ack([eid for eid, _ in got[:2]])
    assert traj.backlog() == 3 and pending_count(redis_client, traj.key) == 3
    traj.ack([eid for eid, _ in got[2:]])
    assert redis_client.xlen(traj.key) == 0
    assert pending_count(redis_client, traj.key) == 0
    traj.ack([])  # nothing to do, no error


def test_group_created_after_actors_started_sees_earlier_entries(redis_client, run_name):
    stream = TrajectoryStream(redis_client, run_name)
    stream.add(payloads(3))  # actors may send before the learner creates the group
    stream.ensure_group()
    assert [d for _, d in stream.read("l", count=10, block_ms=10)] == payloads(3)


def test_ensure_group_is_idempotent(redis_client, run_name):
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    stream.ensure_group()
    assert redis_client.xlen(stream.key) == 0  # mkstream made the stream
    groups = redis_client.xinfo_groups(stream.key)
    assert [g["name"] for g in groups] == [GROUP.encode()] or [g["name"] for g in groups] == [GROUP]


def test_never_trims_unread_or_pending(traj, redis_client):
    traj.add(payloads(50))
    first = traj.read("learner-0", count=10, block_ms=10)
    traj.add(payloads(50, start=50))
    assert redis_client.xlen(traj.key) == 100
    assert traj.backlog() == 100
    pending = traj.read("learner-0", count=100, block_ms=10, pending_after="0")
    assert pending == first
    assert [d for _, d in pending] == payloads(10)
    traj.ack([eid for eid, _ in pending])
    assert redis_client.xlen(traj.key) == 90
    rest = traj.read("learner-0", count=200, block_ms=10)
    assert [d for _, d in rest] == payloads(90, start=10)


def test_pending_entries_survive_a_restart_and_can_be_claimed(traj, redis_client):
    traj.add(payloads(6))
    taken = traj.read("A", count=4, block_ms=10)
    # "Restart" of A: a new read of its own pending entries returns exactly those, in order.
    assert traj.read("A", count=100, block_ms=10, pending_after="0") == taken
    assert traj.read("B", count=100, block_ms=10, pending_after="0") == []
    assert traj.claim_stale("B", min_idle_ms=0) == 4
    assert traj.read("B", count=100, block_ms=10, pending_after="0") == taken
    assert traj.read("A", count=100, block_ms=10, pending_after="0") == []
    # The two never-delivered entries are still there for new reads.
    assert [d for _, d in traj.read("B", count=100, block_ms=10)] == payloads(2, start=4)


def test_claim_stale_respects_min_idle(traj):
    traj.add(payloads(2))
    traj.read("A", count=2, block_ms=10)
    assert traj.claim_stale("B", min_idle_ms=60_000) == 0
    assert len(traj.read("A", count=10, block_ms=10, pending_after="0")) == 2


def test_claim_stale_pages_through_many_entries(traj):
    traj.add(payloads(25))
    traj.read("A", count=25, block_ms=10)
    assert traj.claim_stale("B", min_idle_ms=0, count=10) == 25
    assert [d for _, d in traj.read("B", count=100, block_ms=10, pending_after="0")] == payloads(25)


def test_dead_letter(traj, redis_client, run_name):
    traj.add(payloads(3))
    (bad_id, bad_data), *others = traj.read("learner-0", count=3, block_ms=10)
    traj.dead_letter(bad_id, bad_data, "array 'reward' has non-finite values")
    dead = redis_client.xrange(f"{run_name}:deadletter")
    assert len(dead) == 1
    fields = dead[0][1]
    assert fields[b"entry_id"] == bad_id
    assert fields[b"reason"] == b"array 'reward' has non-finite values"
    assert fields[b"data"] == bad_data == payloads(1)[0]
    assert traj.dead_lettered() == 1
    assert int(redis_client.get(f"{run_name}:deadletter:count")) == 1
    assert redis_client.xlen(traj.key) == 2  # the original is deleted, the others untouched
    assert [eid for eid, _ in traj.read("learner-0", count=10, block_ms=10, pending_after="0")] == [e for e, _ in others]
    traj.dead_letter(others[0][0], others[0][1], "x" * 5000)
    assert traj.dead_lettered() == 2
    assert len(redis_client.xrange(f"{run_name}:deadletter")[1][1][b"reason"]) == 1000  # reason is capped


def test_dead_lettered_is_zero_on_a_fresh_run(traj):
    assert traj.dead_lettered() == 0


def test_wait_for_room_returns_at_once_below_the_mark(traj):
    traj.add(payloads(5))
    assert traj.wait_for_room(high_water_mark=5) < 0.05  # backlog 5 is not above 5
    assert traj.wait_for_room(high_water_mark=100) < 0.05


def test_wait_for_room_blocks_until_the_learner_acks(traj):
    traj.add(payloads(6))

    def learner():
        time.sleep(0.3)
        entries = traj.read("learner-0", count=4, block_ms=10)
        traj.ack([eid for eid, _ in entries])

    thread = threading.Thread(target=learner)
    thread.start()
    waited = traj.wait_for_room(high_water_mark=2, poll_s=0.01)
    thread.join()
    assert 0.25 <= waited < 2.0
    assert traj.backlog() == 2


def test_wait_for_room_blocks_while_only_read_not_acked(traj):
    """Delivered-but-unacked entries still count: reading alone does not make room."""
    traj.add(payloads(4))
    traj.read("learner-0", count=4, block_ms=10)
    deadline = time.monotonic() + 0.2
    waited = traj.wait_for_room(high_water_mark=2, should_stop=lambda: time.monotonic() > deadline, poll_s=0.01)
    assert 0.15 <= waited < 1.0


def test_wait_for_room_returns_when_told_to_stop(traj):
    traj.add(payloads(5))
    deadline = time.monotonic() + 0.2
    waited = traj.wait_for_room(high_water_mark=2, should_stop=lambda: time.monotonic() > deadline, poll_s=0.01)
    assert 0.15 <= waited < 1.0
    assert traj.backlog() == 5
    assert traj.wait_for_room(high_water_mark=2, should_stop=lambda: True) < 0.05


def test_each_actor_s_seconds_throttled_are_counted_once_and_summed(traj):
    """An actor sends its running total with each add, so a transaction re-sent after a lost reply sets
    the same value again; accounting sums the actors' totals."""
    traj.add(payloads(2), producer="0-a", produced=2, throttled_s=1.25)
    traj.add(payloads(1), producer="0-a", produced=3, throttled_s=1.25)  # the same total again
    traj.add(payloads(1), producer="1-b", produced=1)  # never throttled: no field
    assert traj.accounting()["throttled_s"] == 1.25
    traj.add(payloads(1), producer="1-b", produced=2, throttled_s=0.5)
    traj.add(payloads(1), producer="0-a", produced=4, throttled_s=2.0)
    counts = traj.accounting()
    assert counts["throttled_s"] == 2.5 and counts["produced"] == 6


def test_the_metrics_window_reports_the_update_thread_s_shares_of_its_time():
    from impala_league.distributed.learner.metrics import MetricsWindow

    window = MetricsWindow(start=100.0)
    window.add(40, [0, 1], {"loss": 0.5, "skipped_update": 0.0})
    window.update_s, window.waited_s = 3.0, 0.5
    record = window.summary(now=104.0)
    assert record["update_share"] == 0.75 and record["wait_share"] == 0.125


def test_runs_do_not_see_each_others_entries(redis_client, run_name):
    a = TrajectoryStream(redis_client, run_name + "-a")
    b = TrajectoryStream(redis_client, run_name + "-b")
    a.ensure_group()
    b.ensure_group()
    a.add(payloads(3))
    assert b.backlog() == 0 and b.read("l", count=10, block_ms=10) == []


# -- results stream ---------------------------------------------------------------------------------

RESULTS = [{"actor_id": 0, "winner": 1, "length": 17, "returns": [-1.0, 1.0], "opponent_id": "self"},
           {"actor_id": 1, "winner": -1, "length": 42, "returns": [0.0, 0.0], "opponent_id": "snap-3"},
           {"actor_id": 0, "winner": 0, "length": 7, "returns": [1.0, -1.0], "opponent_id": "self"}]


def test_results_read_once(redis_client, run_name):
    writer, reader = ResultsStream(redis_client, run_name), ResultsStream(redis_client, run_name)
    assert reader.read_new() == []  # no stream yet
    writer.add_many(RESULTS[:2])
    assert reader.read_new() == RESULTS[:2]
    assert reader.read_new() == []
    writer.add_many(RESULTS[2:])
    writer.add_many([])
    assert reader.read_new() == RESULTS[2:]
    assert reader.read_new() == []
    assert ResultsStream(redis_client, run_name).read_new() == RESULTS  # a new reader starts at the beginning


@pytest.mark.parametrize("fields", [{"data": b"\xc1\xff garbage"}, {"data": b"\x92\x01"}, {"other": b"x"}],
                         ids=["not msgpack", "truncated msgpack", "no data field"])
def test_results_skip_malformed_entries(redis_client, run_name, fields):
    stream = ResultsStream(redis_client, run_name)
    stream.add_many(RESULTS[:1])
    redis_client.xadd(stream.key, fields)
    stream.add_many(RESULTS[1:])
    assert stream.read_new() == RESULTS
    assert stream.read_new() == []


def test_results_skip_entries_that_are_not_maps(redis_client, run_name):
    stream = ResultsStream(redis_client, run_name)
    redis_client.xadd(stream.key, {"data": msgpack.packb(1)})
    stream.add_many(RESULTS[:1])
    assert stream.read_new() == RESULTS[:1]


def test_results_skip_entries_whose_numbers_are_not_numbers(redis_client, run_name):
    """The learner takes np.mean of winners and lengths: a string there used to crash it."""
    stream = ResultsStream(redis_client, run_name)
    for bad in ({"winner": "x", "length": 3}, {"winner": 0, "length": "long"}, {"winner": [0, 1], "length": 3},
                {"winner": 0, "length": float("nan")}, {"winner": True, "length": 3}):
        redis_client.xadd(stream.key, {"data": msgpack.packb(bad)})
    stream.add_many(RESULTS[:1])
    assert stream.read_new() == RESULTS[:1]


def test_results_skip_to_end(redis_client, run_name):
    writer = ResultsStream(redis_client, run_name)
    resumed = ResultsStream(redis_client, run_name)
    resumed.skip_to_end()  # no stream yet: nothing to skip, no error
    writer.add_many(RESULTS[:2])
    resumed.skip_to_end()
    assert resumed.read_new() == []
    writer.add_many(RESULTS[2:])
    assert resumed.read_new() == RESULTS[2:]


# -- parameter store --------------------------------------------------------------------------------

def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"torso.weight": torch.randn(8, 4, generator=g), "torso.bias": torch.randn(8, generator=g),
            "steps": torch.tensor(seed, dtype=torch.int64)}


def test_param_store_publish_fetch_replace(redis_client, run_name):
    store = ParamStore(redis_client, run_name)
    assert store.version() == -1
    assert store.fetch() is None
    store.publish(state(1), 7)
    assert store.version() == 7
    version, fetched = store.fetch()
    assert version == 7
    assert set(fetched) == set(state(1))
    for name, tensor in state(1).items():
        assert torch.equal(fetched[name], tensor), name
    store.publish(state(2), 8)
    version, fetched = store.fetch()
    assert version == 8 and store.version() == 8
    for name, tensor in state(2).items():
        assert torch.equal(fetched[name], tensor), name
    assert not torch.equal(fetched["torso.weight"], state(1)["torso.weight"])
    assert ParamStore(redis_client, run_name + "-other").version() == -1


# -- one learner per run ----------------------------------------------------------------------------

def test_a_second_learner_is_refused_and_a_dead_ones_lease_lapses(redis_client, run_name):
    from impala_league.distributed.wire.transport import LearnerLease, LeaseHeld

    def lease(holder: str) -> LearnerLease:
        return LearnerLease(redis_client, run_name, holder, ttl_s=0.6)  # run.lease_ttl_s

    assert LearnerLease(redis_client, run_name, "default").TTL_MS == 10_000
    first = lease("host-a pid 1")
    assert first.acquire()
    assert first.TTL_MS == 600 and 0 < redis_client.pttl(first.key) <= 600
    time.sleep(1.0)  # longer than the TTL: the holder's thread keeps the lease alive
    start = time.monotonic()
    with pytest.raises(LeaseHeld, match=f"another learner \\(host-a pid 1\\) is running for run '{run_name}'"):
        lease("host-b pid 2").acquire()
    assert time.monotonic() - start < 3
    assert not lease("host-b pid 2").acquire(should_stop=lambda: True)  # a stop request ends the wait
    first.release()
    second = lease("host-b pid 2")
    assert second.acquire()
    second._stop.set()  # the holder is killed: nobody refreshes, nobody releases
    third = lease("host-c pid 3")
    assert third.acquire()
    assert redis_client.get(third.key) == b"host-c pid 3"
    third.release()
    assert not redis_client.exists(third.key)
