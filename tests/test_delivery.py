"""Delivery accounting (docs/architecture.md, "Delivery accounting"): duplicate deliveries are detected
and skipped, across learner restarts too, and the counters of produced, trained, dead-lettered and
duplicate unrolls add up, including across a `kill -9` of the learner under real actor processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distributed.launcher import EmbeddedRedis
from distributed.transport import GROUP, SEEN_IDS, TrajectoryStream, connect
from tests.test_faults import T, encode, small_config, valid_unroll

REPO = Path(__file__).resolve().parent.parent


def run_learner_until(learner, done, timeout: float = 20.0) -> None:
    """Run `learner` on a thread until `done()` holds, then stop it and wait for its final checkpoint."""
    thread = threading.Thread(target=learner.run)
    thread.start()
    deadline = time.monotonic() + timeout
    while not done() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    learner.stop()
    thread.join(20)
    assert not thread.is_alive()


# -- duplicates, unit level -------------------------------------------------------------------------

def test_a_resent_transaction_adds_copies_but_counts_the_unrolls_once(redis_client, run_name):
    stream = TrajectoryStream(redis_client, run_name)
    stream.add([b"a", b"b"], producer="0-tok", produced=2)
    stream.add([b"a", b"b"], producer="0-tok", produced=2)  # the same transaction, re-sent after a lost reply
    stream.add([b"c"], producer="1-tok", produced=1)
    counts = stream.accounting()
    assert counts["produced"] == 3 and counts["backlog"] == 5


def test_duplicates_are_trained_ids_and_repeats_within_one_check(redis_client, run_name):
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    stream.add([b"x", b"y"])
    entries = stream.read("learner-0", count=2, block_ms=10)
    assert stream.ack([eid for eid, _ in entries], ["0-a-0", "0-a-1"]) == 2
    assert stream.duplicates(["0-a-1", "0-a-2", "0-a-2", "0-a-0", "1-b-0"]) == [True, False, True, True, False]
    assert stream.duplicates([]) == []


def test_ack_counts_only_what_it_acknowledged(redis_client, run_name):
    """A script re-sent after a lost reply finds its entries acked already and counts nothing."""
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    stream.add([b"x", b"y", b"z"])
    entries = stream.read("learner-0", count=3, block_ms=10)
    ids = [eid for eid, _ in entries]
    assert stream.ack(ids[:2], ["u0", "u1"]) == 2
    assert stream.ack(ids[:2], ["u0", "u1"]) == 2  # again: nothing pending any more
    stream.skip_duplicates(ids[2:])
    stream.skip_duplicates(ids[2:])
    stream.dead_letter(ids[0], b"x", "again")  # acked already: not dead-lettered as well
    assert stream.accounting() == {"produced": 0, "trained": 2, "dead_lettered": 0, "duplicates": 1, "backlog": 0}
    assert redis_client.xpending(stream.key, GROUP)["pending"] == 0


def test_the_seen_set_keeps_the_last_seen_ids(redis_client, run_name, monkeypatch):
    import distributed.transport as transport

    monkeypatch.setattr(transport, "SEEN_IDS", 3)
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    for batch in (["a", "b"], ["c", "d"]):
        stream.add([b"."] * 2)
        entries = stream.read("learner-0", count=2, block_ms=10)
        stream.ack([eid for eid, _ in entries], batch)
    assert redis_client.zrange(stream.seen_key, 0, -1, withscores=True) == [(b"b", 2.0), (b"c", 4.0), (b"d", 4.0)]
    assert SEEN_IDS >= 10_000  # production: far more than a backlog or a minute of claims


# -- duplicates, through the learner ---------------------------------------------------------------

def test_the_learner_skips_duplicate_deliveries_also_after_a_restart(tmp_path, redis_client, redis_url, run_name):
    from distributed.learner import Learner

    key = f"{run_name}:traj"
    first, second = encode(valid_unroll(1.0)), encode(valid_unroll(-1.0))
    for data in (first, first, second):  # a copy of `first` right behind it: both land in one batch
        redis_client.xadd(key, {"data": data})
    cfg = small_config(run_name, tmp_path, "learner.checkpoint_every_s=0.01")
    learner = Learner(cfg, redis_url, tmp_path / run_name)
    run_learner_until(learner, lambda: learner.step >= 1)
    assert learner.step == 1 and learner.frames == 2 * T  # one update, on `first` and `second` once each
    assert TrajectoryStream(redis_client, run_name).accounting() == {
        "produced": 0, "trained": 2, "dead_lettered": 0, "duplicates": 1, "backlog": 0}

    # A copy of each that arrives after a restart (a resend held up by an outage) is still detected.
    resumed = Learner(cfg, redis_url, tmp_path / run_name, resume=True)
    for data in (second, first, encode(valid_unroll(0.5)), encode(valid_unroll(0.0))):
        redis_client.xadd(key, {"data": data})
    run_learner_until(resumed, lambda: resumed.step >= 2)
    assert resumed.step == 2 and resumed.frames == 2 * 2 * T
    assert TrajectoryStream(redis_client, run_name).accounting() == {
        "produced": 0, "trained": 4, "dead_lettered": 0, "duplicates": 3, "backlog": 0}
    assert resumed.rolled_back == 0  # the first learner checkpointed after its update
    record = json.loads((tmp_path / run_name / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["duplicate_unrolls"] == 3 and record["unrolls_trained"] == 4
