"""Ingest worker processes (learner.ingest_workers, distributed/learner/ingest_workers.py): batches read,
decoded and stacked in other processes reach the update as the ingest thread's would, each unroll
once, malformed entries dead-lettered, nothing acked before its update, nothing lost when the
learner stops (tests/distributed/learner/test_ingest.py), and a worker that dies stops the learner with its reason."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import psutil
import pytest
import redis
import torch

from impala_league.batch import stack_entries, unstack
from impala_league.batch import Batch
from impala_league.config import ConfigError
from impala_league.distributed.learner.ingest_thread import BatchReader
from impala_league.distributed.learner.ingest_workers import IngestWorkerError, _check_shared_memory
from impala_league.distributed.learner.role import Learner
from impala_league.distributed.wire.codec import UnrollSpec, decode_unrolls
from impala_league.distributed.wire.shards import ShardedTrajectories
from impala_league.distributed.wire.transport import GROUP, DeadConsumerSweeper, TrajectoryStream
from impala_league.envs.registry import env_spec
from tests.distributed.test_faults import T, encode, small_config, tampered, valid_unroll

WORKERS = ("learner.ingest_workers=2", "learner.prefetch_batches=2")


def _fill(redis_client, run_name: str, rewards) -> list[bytes]:
    datas = [encode(valid_unroll(float(r))) for r in rewards]
    for data in datas:
        redis_client.xadd(f"{run_name}:traj", {"data": data})
    return datas


def _rewards_of(prepared) -> list[float]:
    return prepared.batch.reward[0].tolist()


def test_workers_hand_over_every_unroll_once_and_dead_letter_the_malformed(tmp_path, redis_client, redis_url,
                                                                          run_name):
    """Ten valid unrolls (rewards 0..9) and one malformed entry; B = 2, two workers. Every valid unroll
    reaches the update exactly once, stacked as the thread stacks it; the malformed one is
    dead-lettered with its reason; nothing is acked before `acknowledge`."""
    _fill(redis_client, run_name, range(5))
    redis_client.xadd(f"{run_name}:traj", {"data": tampered(lambda m: m["arrays"].pop("reward"))})
    _fill(redis_client, run_name, range(5, 10))
    learner = Learner(small_config(run_name, tmp_path, *WORKERS), redis_url, tmp_path / run_name)
    learner.ingest.trajectories.ensure_group()
    batches = learner.ingest.start()
    stream = TrajectoryStream(redis_client, run_name)
    try:
        rewards = []
        for k in range(5):  # two slots: a batch must be acked before a third is read
            ids, headers, prepared = batches.get()
            rewards += _rewards_of(prepared)
            if k == 0:
                assert stream.accounting()["trained"] == 0  # nothing acked before its update
                expected = Batch.stack([valid_unroll(r) for r in _rewards_of(prepared)], torch.device("cpu"))
                for name in ("obs", "action_mask", "action", "reward", "done", "behaviour_logits", "truncated"):
                    assert torch.equal(getattr(prepared.batch, name), getattr(expected, name)), name
            learner.acknowledge(ids, headers)
        assert sorted(rewards) == [float(r) for r in range(10)]
    finally:
        batches.close()
    assert stream.accounting() == {"produced": 0, "trained": 10, "dead_lettered": 1, "backlog": 0, "throttled_s": 0.0,
                                   "env_steps": 0}
    [(_, fields)] = redis_client.xrange(f"{run_name}:deadletter")
    assert b"reward" in fields[b"reason"]


def test_a_worker_that_dies_stops_the_learner_with_its_reason(tmp_path, redis_client, redis_url, run_name):
    learner = Learner(small_config(run_name, tmp_path, *WORKERS), redis_url, tmp_path / run_name)
    learner.ingest.trajectories.ensure_group()
    batches = learner.ingest.start()
    try:
        batches.procs[1].send_signal(signal.SIGKILL)
        with pytest.raises(RuntimeError, match="ingest worker 1 was killed by signal 9"):
            batches.get()
    finally:
        batches.close()


def test_replayed_unrolls_join_a_workers_batch_after_its_fresh_ones(tmp_path, redis_client, redis_url, run_name):
    """B = 4 with replay 0.5: two fresh unrolls from a worker's slot, two from the replay appended; the
    fresh ones handed to the replay are the slot's, as copies that outlive it."""
    learner = Learner(small_config(run_name, tmp_path, "learner.batch_size=4", "learner.replay_fraction=0.5",
                                   *WORKERS), redis_url, tmp_path / run_name)
    for r in (7.0, 8.0):
        learner.ingest.replay.add(valid_unroll(r), policy_version=3)
    fresh = stack_entries([{k: v[None] for k, v in valid_unroll(r).items()} for r in (1.0, 2.0)])
    prepared = learner.ingest.prepare_stacked(fresh)
    assert prepared.batch.reward.shape == (4, 4)
    assert prepared.batch.reward[0, :2].tolist() == [1.0, 2.0]
    assert sorted(prepared.batch.reward[0, 2:].tolist()) == [7.0, 8.0]
    assert prepared.replayed_versions == [3, 3]
    assert [u["reward"][0] for u in prepared.fresh] == [1.0, 2.0]
    fresh["reward"][:] = -5.0  # the slot is reused: the prepared batch is not
    assert prepared.batch.reward[0, :2].tolist() == [1.0, 2.0]


def test_unstack_gives_back_each_unroll_with_its_final_observations():
    unrolls = [valid_unroll(float(r)) for r in range(3)]
    unrolls[1]["truncated"][1] = unrolls[1]["done"][1] = 1
    unrolls[1]["final_obs"] = np.full((1, *unrolls[1]["obs"].shape[1:]), 5, unrolls[1]["obs"].dtype)
    for u in (unrolls[0], unrolls[2]):
        u["final_obs"] = np.zeros((0, *u["obs"].shape[1:]), u["obs"].dtype)
    back = unstack(stack_entries([{k: v if k == "final_obs" else v[None] for k, v in u.items()} for u in unrolls]))
    for original, again in zip(unrolls, back):
        assert original.keys() == again.keys()
        for name in original:
            np.testing.assert_array_equal(original[name], again[name])


def test_ingest_workers_need_a_slot_each(tmp_path, run_name):
    with pytest.raises(ConfigError, match="learner.ingest_workers=3 must be in \\[0, learner.prefetch_batches=2\\]"):
        small_config(run_name, tmp_path, "learner.ingest_workers=3")


def test_the_high_water_mark_leaves_room_for_every_slot_read_in_part(tmp_path, run_name):
    """Four slots of B = 32, each partly read, hold up to 128 unrolls unacked: a mark below that could
    stop the actors while every slot waits for the rest of its batch."""
    with pytest.raises(ConfigError, match="actor.high_water_mark must be >= 128: .* with ingest workers"):
        small_config(run_name, tmp_path, "learner.ingest_workers=2", "learner.prefetch_batches=4",
                     "learner.batch_size=32", "actor.high_water_mark=127")
    small_config(run_name, tmp_path, "learner.ingest_workers=2", "learner.prefetch_batches=4",
                 "learner.batch_size=32", "actor.high_water_mark=128")


def test_entries_a_live_reader_holds_are_never_taken_by_the_sweep(redis_client, redis_url, run_name):
    """Worker 0 sweeps entries idle for a while into its own pending list: a sibling that still holds
    some (its batch waiting for a long update) renews them, so they are not taken from it and trained
    twice. Once it stops renewing (it died), the sweep takes them."""
    _fill(redis_client, run_name, range(4))
    spec = UnrollSpec(env_spec("tictactoe"), T)
    trajectories = ShardedTrajectories(redis_client, redis_url, run_name)
    trajectories.ensure_group()

    def reader(name: str) -> BatchReader:
        return BatchReader(trajectories, name, lambda datas: decode_unrolls(datas, spec), lambda h: h["unrolls"],
                           1, 50, sweep=False)

    holder, sweeping = reader("holder"), reader("sweeping")
    sweeping.sweeper = DeadConsumerSweeper(trajectories, "sweeping", min_idle_ms=400, every_s=0.1)
    ids, _, _ = holder.read(2, lambda: True)
    alive = threading.Event()
    renewing = threading.Thread(target=holder.keep_alive, args=(alive, 0.1))
    renewing.start()
    time.sleep(0.8)
    assert sweeping.sweeper.claim_due() == 0
    alive.set()
    renewing.join()
    time.sleep(0.6)
    assert sweeping.sweeper.claim_due() == 2
    assert {e["consumer"] for e in redis_client.xpending_range(f"{run_name}:traj", GROUP, "-", "+", 10)} == {
        b"sweeping"}


def test_a_worker_that_loses_redis_raises_what_the_learner_reports_as_lost_redis(tmp_path, redis_url, run_name):
    learner = Learner(small_config(run_name, tmp_path, "run.redis_retry_s=0", *WORKERS), redis_url, tmp_path / run_name)
    learner.ingest.worker_settings["redis_url"] = "redis://127.0.0.1:1/0"  # nothing listens there
    batches = learner.ingest.start()
    try:
        with pytest.raises(redis.ConnectionError, match="learner ingest worker [01] failed: .*127.0.0.1:1"):
            batches.get()
    finally:
        batches.close()


def test_a_worker_that_dies_under_run_learner_leaves_a_checkpoint(tmp_path, redis_client, redis_url, run_name):
    from impala_league.distributed.learner.role import run_learner

    _fill(redis_client, run_name, range(6))
    cfg = small_config(run_name, tmp_path, *WORKERS)
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    threads = torch.get_num_threads()

    def ingest_workers() -> list[psutil.Process]:
        found = []
        for child in psutil.Process().children():
            try:  # another test's child can exit between listing and reading its command line
                if "impala_league.distributed.learner.ingest_workers" in child.cmdline():
                    found.append(child)
            except psutil.NoSuchProcess:
                pass
        return found

    def kill_a_worker() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            workers = ingest_workers()
            if workers and redis_client.get(f"{run_name}:traj:trained") == b"6":
                workers[0].kill()
                return
            time.sleep(0.05)
        for worker in ingest_workers():  # never leave run_learner waiting for data that will not come
            worker.kill()

    killer = threading.Thread(target=kill_a_worker)
    killer.start()
    try:
        with pytest.raises(IngestWorkerError, match=r"learner ingest worker \d was killed by signal 9; checkpoint "
                                                    r"at update 3 written"):
            run_learner(cfg, redis_url, tmp_path / run_name)
    finally:
        killer.join()
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
        torch.set_num_threads(threads)
    assert (tmp_path / run_name / "checkpoints" / "latest.safetensors").exists()


def test_a_batch_of_many_small_entries_is_read_ahead_in_every_slot(tmp_path, redis_client, redis_url, run_name):
    """B = 512 entries of one unroll: each slot's description is as long as its batch, and still every
    slot is filled without the learner reading a reply (it lies in the slot, not in the 64 KiB pipe);
    the workers then stop at once."""
    key = f"{run_name}:traj"
    data = encode(valid_unroll(1.0))
    pipe = redis_client.pipeline(transaction=False)
    for _ in range(1024):
        pipe.xadd(key, {"data": data})
    pipe.execute()
    learner = Learner(small_config(run_name, tmp_path, "learner.batch_size=512", "actor.send_batch=1",
                                   "actor.high_water_mark=1024", "learner.ingest_workers=1",
                                   "learner.prefetch_batches=2"), redis_url, tmp_path / run_name)
    learner.ingest.trajectories.ensure_group()
    batches = learner.ingest.start()
    try:
        deadline = time.monotonic() + 20
        while redis_client.xpending(key, GROUP)["pending"] < 1024 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert redis_client.xpending(key, GROUP)["pending"] == 1024  # both slots read ahead
        for _ in range(2):
            ids, headers, prepared = batches.get()
            assert len(ids) == 512 and prepared.batch.reward.shape == (T, 512)
            learner.acknowledge(ids, headers)
    finally:
        start = time.monotonic()
        batches.close()
    assert time.monotonic() - start < 5 and [p.returncode for p in batches.procs] == [0]
    assert TrajectoryStream(redis_client, run_name).accounting()["trained"] == 1024


def test_workers_ignore_a_terminals_ctrl_c_from_their_start(tmp_path, redis_url, run_name):
    """Ctrl-C in a terminal reaches the learner's whole process group: the learner stops its workers
    itself (closing their stdin), so they ignore SIGINT and SIGTERM from the moment they start."""
    learner = Learner(small_config(run_name, tmp_path, *WORKERS), redis_url, tmp_path / run_name)
    batches = learner.ingest.start()
    try:
        for proc in batches.procs:
            proc.send_signal(signal.SIGINT)  # at once: the worker has not imported anything yet
            proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert [proc.poll() for proc in batches.procs] == [None, None]
    finally:
        batches.close()
    assert [proc.returncode for proc in batches.procs] == [0, 0]


def test_too_little_shared_memory_is_a_clear_error():
    with pytest.raises(IngestWorkerError, match="need up to .* MB of shared memory, and /dev/shm has .* free: lower "
                                                "learner.prefetch_batches"):
        _check_shared_memory(1 << 60)
