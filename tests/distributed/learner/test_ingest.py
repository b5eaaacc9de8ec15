"""The learner's ingest thread (distributed/learner/ingest_thread.py): batches are read ahead of the update, yet
every unroll is trained on once, nothing is acked before its update, and errors reach the update."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from impala_league.distributed.learner.ingest_thread import Prefetcher
from impala_league.distributed.wire.transport import GROUP, TrajectoryStream
from tests.distributed.test_delivery import run_learner_until
from tests.distributed.test_faults import encode, small_config, valid_unroll


def test_prefetcher_keeps_depth_items_ready_and_ends_with_none():
    """Never more than `depth` ahead, the one being produced included: a learner's unacked entries are
    bounded by (depth + 1) batches, which actor.high_water_mark's minimum for K learners counts on (one
    more per rank let a rank hold so much that the actors stopped while its peer waited for a batch)."""
    produced = []

    def produce():
        if len(produced) == 5:
            return None
        produced.append(len(produced))
        return produced[-1]

    batches = Prefetcher(produce, depth=2)
    deadline = time.monotonic() + 5
    while len(produced) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(produced) == 2
    assert batches.get() == 0
    time.sleep(0.2)
    assert len(produced) == 3
    assert [batches.get() for _ in range(5)] == [1, 2, 3, 4, None]
    batches.close()
    assert not batches.thread.is_alive()


def test_an_error_in_the_ingest_thread_is_raised_by_get():
    def produce():
        raise ConnectionError("Redis went away")

    batches = Prefetcher(produce, depth=2)
    with pytest.raises(ConnectionError, match="Redis went away"):
        batches.get()
    batches.close()


def test_a_prefetched_batch_is_not_read_again_from_the_pending_list(tmp_path, redis_client, redis_url, run_name):
    """B = 2. Batch 1 (u1, u2) is read and waits for its update. Re-reading our own pending entries
    (after the dead-consumer sweep) must not hand out batch 1's entries again: batch 2 is u3, u4."""
    from impala_league.distributed.learner.role import Learner

    key = f"{run_name}:traj"
    u1, u2, u3, u4 = (encode(valid_unroll(r)) for r in (1.0, -1.0, 0.5, 0.25))
    for data in (u1, u2, u3, u4):
        redis_client.xadd(key, {"data": data})
    learner = Learner(small_config(run_name, tmp_path), redis_url, tmp_path / run_name)
    learner.ingest.trajectories.ensure_group()
    ids1, headers1, _ = learner.ingest.next_batch()
    learner.ingest.reader.pending_cursor = "0"  # as after a sweep: page through our own pending entries again
    ids2, headers2, prepared2 = learner.ingest.next_batch()
    assert not set(ids1) & set(ids2)
    assert [h["unroll_id"] for h in headers1 + headers2] == [
        header["unroll_id"] for header, _ in learner.ingest.decode([u1, u2, u3, u4])]
    np.testing.assert_array_equal(prepared2.batch.reward[0].numpy(), [0.5, 0.25])
    stream = TrajectoryStream(redis_client, run_name)
    assert stream.accounting() == {"produced": 0, "trained": 0, "dead_lettered": 0, "backlog": 4, "throttled_s": 0.0, "env_steps": 0}
    learner.acknowledge(ids1, headers1)
    learner.acknowledge(ids2, headers2)
    assert stream.accounting() == {"produced": 0, "trained": 4, "dead_lettered": 0, "backlog": 0, "throttled_s": 0.0, "env_steps": 0}
    assert learner.ingest.reader.in_flight == set()


@pytest.mark.parametrize("ingest", [("learner.prefetch_batches=4",),
                                    ("learner.ingest_workers=2", "learner.prefetch_batches=4",
                                     "actor.high_water_mark=16")], ids=["thread", "workers"])
def test_nothing_prefetched_is_acked_when_the_learner_stops(tmp_path, redis_client, redis_url, run_name, ingest):
    """A learner with prefetch depth 4 stopped after its first update: the batches its ingest thread
    (or its ingest workers, each its own consumer) had read stay pending (backlog), none counted as
    trained, and the next learner trains them."""
    from impala_league.distributed.learner.role import Learner

    key = f"{run_name}:traj"
    for i in range(12):
        redis_client.xadd(key, {"data": encode(valid_unroll(float(i % 3) - 1))})
    learner = Learner(small_config(run_name, tmp_path, *ingest), redis_url, tmp_path / run_name)
    learner.train_on = lambda batch, train_on=learner.train_on: (time.sleep(0.3), train_on(batch))[1]
    run_learner_until(learner, lambda: learner.step >= 1)
    stream = TrajectoryStream(redis_client, run_name)
    counts = stream.accounting()
    assert counts["trained"] == 2 * learner.step and counts["backlog"] == 12 - 2 * learner.step
    pending = {c["name"].decode(): c["pending"] for c in redis_client.xinfo_consumers(key, GROUP)}
    held = {name for name, n in pending.items() if n}
    assert held and all(name.endswith(("-ingest0", "-ingest1")) == (len(ingest) > 1) for name in held)
    again = Learner(small_config(run_name, tmp_path, *ingest), redis_url, tmp_path / run_name, resume=True)
    run_learner_until(again, lambda: stream.accounting()["backlog"] == 0)
    assert stream.accounting() == {"produced": 0, "trained": 12, "dead_lettered": 0, "backlog": 0, "throttled_s": 0.0, "env_steps": 0}
    assert redis_client.xpending(key, GROUP)["pending"] == 0


def test_the_update_runs_while_the_next_batch_is_read(tmp_path, redis_client, redis_url, run_name):
    """With prefetch, the ingest thread reads batch k+1 while update k runs: some read starts before
    an update that began earlier has ended."""
    from impala_league.distributed.learner.role import Learner

    for i in range(16):
        redis_client.xadd(f"{run_name}:traj", {"data": encode(valid_unroll(float(i % 2)))})
    learner = Learner(small_config(run_name, tmp_path), redis_url, tmp_path / run_name)
    events, lock = [], threading.Lock()

    def traced(name, fn):
        def call(*args):
            with lock:
                events.append((name, "start", time.monotonic()))
            try:
                return fn(*args)
            finally:
                with lock:
                    events.append((name, "end", time.monotonic()))
        return call

    learner.ingest.next_batch = traced("ingest", learner.ingest.next_batch)
    learner.train_on = traced("update", lambda batch, f=learner.train_on: (time.sleep(0.1), f(batch))[1])
    run_learner_until(learner, lambda: learner.step >= 4)
    starts, ends = ([t for n, k, t in events if n == "update" and k == kind] for kind in ("start", "end"))
    updates = list(zip(starts, ends))
    reads = [t for n, k, t in events if n == "ingest" and k == "start"]
    assert len(updates) >= 4
    assert any(s < r < e for s, e in updates for r in reads)


@pytest.mark.redis
def test_an_entry_with_bytes_after_a_zstd_frame_is_dead_lettered_and_the_others_train(tmp_path, redis_client,
                                                                                       redis_url, run_name):
    """Among four good compressed entries, one whose reward frame has a byte after it: the four make two
    batches of B = 2, the bad one is in the dead-letter stream with a reason naming stream and entry."""
    import msgpack

    from impala_league.distributed.learner.role import Learner

    key = f"{run_name}:traj"
    good = [encode(valid_unroll(r), compression="zstd") for r in (1.0, -1.0, 0.5, 0.25)]
    msg = msgpack.unpackb(encode(valid_unroll(9.0), compression="zstd"), raw=False)
    msg["arrays"]["reward"][2] += b"\x00"
    bad = msgpack.packb(msg, use_bin_type=True)
    ids = [redis_client.xadd(key, {"data": data}) for data in (good[0], bad, *good[1:])]
    learner = Learner(small_config(run_name, tmp_path), redis_url, tmp_path / run_name)
    learner.ingest.trajectories.ensure_group()
    batches = [learner.ingest.next_batch() for _ in range(2)]
    assert [np.asarray(b[2].batch.reward[0]).tolist() for b in batches] == [[1.0, -1.0], [0.5, 0.25]]
    for batch_ids, headers, _ in batches:
        learner.acknowledge(batch_ids, headers)
    [(_, fields)] = redis_client.xrange(f"{run_name}:deadletter")
    assert fields[b"entry_id"] == ids[1] and fields[b"data"] == bad
    assert fields[b"reason"].decode() == (f"stream {key} entry {ids[1].decode()}: array 'reward' has 1 byte after "
                                          "its zstd frame")
    assert TrajectoryStream(redis_client, run_name).accounting() == {
        "produced": 0, "trained": 4, "dead_lettered": 1, "backlog": 0, "throttled_s": 0.0, "env_steps": 0}
    learner.metrics.close()
