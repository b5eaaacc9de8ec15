"""Load: 32 actors against a learner slowed on purpose, then let go. Redis memory stays within the bound
the high-water mark implies, no actor fails, and throughput recovers when the learner speeds up.

The 32 actors are real `Actor` objects, 16 per process on threads, each with its own Redis connection
(tests/actor_threads.py): 32 processes would spend the test importing torch on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from impala_league import REPO
from impala_league.distributed.launch.launcher import EmbeddedRedis
from impala_league.distributed.wire.transport import TrajectoryStream, connect
from tests.distributed.test_faults import encode, small_config, valid_unroll

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's

ACTORS, PER_PROCESS, NUM_ENVS, HIGH_WATER_MARK = 32, 16, 2, 64
SLOW_S = 3.0  # seconds the slowed learner sleeps before each update of B = 8 unrolls


class RedisSampler(threading.Thread):
    """Samples Redis `used_memory`, the stream's own memory and its length every 0.1 s; keeps their maxima."""

    def __init__(self, client, key: str):
        super().__init__(daemon=True)
        self.client, self.key = client, key
        self.peak_memory = self.peak_stream_memory = self.peak_backlog = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.peak_memory = max(self.peak_memory, self.client.info("memory")["used_memory"])
            self.peak_stream_memory = max(self.peak_stream_memory, self.client.memory_usage(self.key) or 0)
            self.peak_backlog = max(self.peak_backlog, self.client.xlen(self.key))


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def rate(client, stream: TrajectoryStream, seconds: float) -> tuple[float, float]:
    """(trained, produced) unrolls per second over the next `seconds`."""
    before, start = stream.accounting(), time.monotonic()
    time.sleep(seconds)
    after, elapsed = stream.accounting(), time.monotonic() - start
    return ((after["trained"] - before["trained"]) / elapsed, (after["produced"] - before["produced"]) / elapsed)


def test_32_actors_against_a_slow_learner_stay_within_the_memory_bound_and_recover(tmp_path, run_name):
    from impala_league.distributed.learner.role import Learner

    overrides = [f"actor.num_envs={NUM_ENVS}", f"actor.high_water_mark={HIGH_WATER_MARK}", "learner.batch_size=8",
                 "run.total_agent_steps=1000000000", "run.log_every_s=1", "learner.mirror_augment=none"]
    cfg = small_config(run_name, tmp_path, *overrides)
    unroll_bytes = len(encode(valid_unroll()))
    with EmbeddedRedis() as server:
        client = connect(server.url)
        stream = TrajectoryStream(client, run_name)
        learner = Learner(cfg, server.url, tmp_path / run_name)
        delay = {"s": 0.0}  # the test hook: seconds slept before each update
        train_on = learner.train_on
        learner.train_on = lambda unrolls: (time.sleep(delay["s"]), train_on(unrolls))[1]
        learner_thread = threading.Thread(target=learner.run)
        learner_thread.start()
        sampler = RedisSampler(client, stream.key)
        sampler.start()
        env = dict(os.environ, IMPALA_REDIS_URL=server.url)
        settings = [a for s in [f"run.name={run_name}", f"run.dir={tmp_path}", "run.wandb_mode=disabled",
                                "actor.unroll_length=4", "agent.hidden=16", *overrides] for a in ("--set", s)]
        procs = [subprocess.Popen([sys.executable, "-m", "tests.actor_threads", "--first-id", str(first), "--count",
                                   str(PER_PROCESS), "--config", str(REPO / "configs/tictactoe.yaml"), *settings],
                                  cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
                 for first in range(0, ACTORS, PER_PROCESS)]
        try:
            for proc in procs:
                assert proc.stdout.readline().strip() == "started"
            wait_for(lambda: client.hlen(stream.produced_key) == ACTORS, 90, "every actor to send")
            # With every connection open (each costs Redis about 40 KB) and the stream still short.
            baseline = client.info("memory")["used_memory"]
            delay["s"] = SLOW_S
            wait_for(lambda: client.xlen(stream.key) >= HIGH_WATER_MARK, 60, "the backlog to reach the mark")
            slow_trained, slow_produced = rate(client, stream, 2 * SLOW_S)
            delay["s"] = 0.0
            time.sleep(SLOW_S)  # the last slow update
            fast_trained, fast_produced = rate(client, stream, 3.0)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            summaries = [json.loads(proc.communicate(timeout=60)[0].strip().splitlines()[-1]) for proc in procs]
            # Keys that grow with the run's length, not the backlog (results, trained ids, weights): at their
            # largest now, since nothing trims them in a run this short.
            others = sum(client.memory_usage(key) or 0 for key in client.scan_iter() if key != stream.key.encode())
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            sampler.done.set()
            sampler.join()
            learner.stop()
            learner_thread.join(30)
    sent = [n for s in summaries for n in s["sent"]]
    # Actors check for room before sending, so each adds at most NUM_ENVS unrolls beyond the mark.
    backlog_bound = HIGH_WATER_MARK + ACTORS * NUM_ENVS
    stream_bound = 3 * backlog_bound * unroll_bytes  # entry ids, field names and listpack overhead
    # The stream at its bound, the other keys, and 1 MiB for client buffers and allocator slack.
    memory_bound = baseline + stream_bound + others + (1 << 20)
    print(f"\n{ACTORS} actors: slow learner {slow_trained:.0f} unrolls/s trained ({slow_produced:.0f} produced), "
          f"fast {fast_trained:.0f} ({fast_produced:.0f}); peak backlog {sampler.peak_backlog} (bound "
          f"{backlog_bound}); Redis used_memory peak {sampler.peak_memory / 2**20:.2f} MiB, baseline "
          f"{baseline / 2**20:.2f} MiB, other keys {others / 2**20:.2f} MiB, bound {memory_bound / 2**20:.2f} MiB; "
          f"stream peak {sampler.peak_stream_memory / 2**20:.2f} MiB (bound {stream_bound / 2**20:.2f}); "
          f"unrolls per actor {min(sent)}..{max(sent)}")
    assert [s["errors"] for s in summaries] == [[], []]
    assert [s["alive_at_stop"] for s in summaries] == [PER_PROCESS, PER_PROCESS]  # no actor crashed
    assert len(sent) == ACTORS and min(sent) > 0
    assert sampler.peak_backlog <= backlog_bound
    assert sampler.peak_stream_memory <= stream_bound
    assert sampler.peak_memory <= memory_bound
    assert slow_trained <= 8 / SLOW_S * 1.5  # B = 8 unrolls per update (+ one at the window's edge)
    assert fast_trained > 2.5 * slow_trained and fast_produced > 2.5 * slow_produced  # throughput recovered
