"""The learner's reads (`Ingest`): batches of B unrolls from the trajectory stream, read, decoded,
validated and stacked (`Prepared`) beside the update, and acked once the update has trained on them.

The pieces it puts together are elsewhere: the reads of one consumer and the ingest thread
(distributed/learner/ingest_thread.py: `BatchReader`, `Prefetcher`), the ingest worker processes
(distributed/learner/ingest_workers.py), the replay (distributed/learner/replay.py) and the batch record
(impala_league/batch.py). `Learner` (distributed/learner/role.py) owns one; A3C's parameter server reads
gradients through a subclass (distributed/a3c.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, NamedTuple

import numpy as np
import torch

from impala_league.batch import Batch, as_entry, stack_entries, unstack
from impala_league.config import Config, replayed_per_batch
from impala_league.distributed.learner.ingest_thread import BatchReader, Prefetcher
from impala_league.distributed.learner.ingest_workers import IngestWorkers, slot_nbytes, worker_consumer
from impala_league.distributed.learner.replay import ReplayBuffer
from impala_league.distributed.wire.codec import DecodeError, UnrollSpec, decode_unrolls
from impala_league.distributed.wire.shards import ShardedTrajectories
from impala_league.distributed.wire.transport import TrajectoryStream

log = logging.getLogger("learner")


class Prepared(NamedTuple):
    """What `Learner.train_on` takes: F fresh unrolls from the stream and R from the replay, stacked.

    batch: [.., F + R, ..], the F fresh unrolls first. fresh: the F fresh payloads (decoded arrays), for
    the replay once the update has trained on them; [] without replay. replayed_versions: the
    `policy_version` of each of the R replayed unrolls (R = 0 without replay).
    """

    batch: Batch
    fresh: list[dict[str, np.ndarray]]
    replayed_versions: list[int]


class Ingest:
    """The learner's reads: batches of B unrolls from the trajectory stream, decoded, validated and
    stacked (`Prepared`) for `Learner.train_on`, acked once trained on.

    Owns the stream (`trajectories`: every shard, read and acked as one; ids carry their shard), this
    learner's consumer name in its group and its reader (`reader`: own pending entries first, malformed
    entries dead-lettered), the unrolls in flight (read and not yet acked: `run.total_agent_steps` counts
    them before more are read), what reads ahead of the update (`start`: the ingest thread,
    `learner.prefetch_batches` deep, or `learner.ingest_workers` processes; without either, `get`
    reads in the update's thread), and the replay, whose k unrolls join the F = `batch_size` fresh ones
    of every batch (`replay`, None without one).

    `decode`, `unrolls_in` and `prepare` say what an entry holds and what a batch of them becomes; A3C's
    parameter server reads gradients through them (distributed/a3c.py). What it reads of the learner:
    unrolls_left(), unrolls the run may still take (run.total_agent_steps); stopping(); run_over(), whether
    no more entries will come (an exploiter's run ends with the main agent's).
    """

    def __init__(self, cfg: Config, trajectories: ShardedTrajectories | TrajectoryStream, consumer: str, *,
                 fresh: int, unrolls_per_entry: int, unrolls_left: Callable[[], float], stopping: Callable[[], bool],
                 run_over: Callable[[], bool], unroll_spec: UnrollSpec | None = None,
                 replay: ReplayBuffer | None = None, pin: bool = False, worker_settings: dict | None = None):
        """fresh: F, stream unrolls per batch; unrolls_per_entry: what one entry is expected to hold
        (`actor.send_batch`); unroll_spec: what `decode` checks unrolls against; pin: stack batches in
        pinned memory (the update runs on a GPU); worker_settings: what ingest workers read with
        (`ingest_workers.worker_settings`), None without workers."""
        self.cfg = cfg
        self.trajectories = trajectories
        self.consumer = consumer
        self.batch_size = fresh
        self.unrolls_per_entry = unrolls_per_entry
        self.unrolls_left = unrolls_left
        self.stopping = stopping
        self.unroll_spec = unroll_spec
        self.run_over = run_over
        self.replay = replay
        self.replayed = replayed_per_batch(cfg.learner)  # k, of the replay's unrolls in every batch
        self.pin = pin
        self.worker_settings = worker_settings
        self.reader = BatchReader(trajectories, consumer, self.decode, self.unrolls_in, unrolls_per_entry,
                                  cfg.learner.read_block_ms)
        self.in_flight_unrolls = 0  # of the batches read and not yet acked (with the thread, or none)
        self.in_flight_lock = threading.Lock()
        self.ahead: Prefetcher | IngestWorkers | None = None  # what `start` started
        self.held = threading.Event()  # set by `close`: the entries in flight are no longer renewed
        self.reading = True  # cleared by `close`, which ends the ingest thread's reads

    @property
    def workers(self) -> IngestWorkers | None:
        """The ingest worker processes (learner.ingest_workers) once `start` started them, else None."""
        return self.ahead if isinstance(self.ahead, IngestWorkers) else None

    # -- what an entry holds, what a batch becomes -------------------------------------------------
    def decode(self, entries: list[bytes]) -> list[tuple[dict, object] | DecodeError]:
        """(header, payload) of each stream entry, or the DecodeError that rejects it."""
        return decode_unrolls(entries, self.unroll_spec)

    @staticmethod
    def unrolls_in(header: dict) -> int:
        """The unrolls a stream entry with this header holds (counted as trained or duplicate with it)."""
        return header["unrolls"]

    def unroll_versions(self, headers: list[dict]) -> list[int]:
        """The policy version of each unroll of the entries with these headers, in batch order."""
        return [h["policy_version"] for h in headers for _ in range(self.unrolls_in(h))]

    def prepare(self, payloads: list) -> object:
        """What `train_on` takes, made in the ingest thread from the decoded entries read (F fresh
        unrolls in all): a `Prepared` batch of them and k unrolls sampled from the replay (fewer while
        it holds fewer), in pinned memory when the update runs on a GPU."""
        replayed = self.replay.sample(self.replayed) if self.replay is not None else []
        return self.prepared(stack_entries(payloads + [as_entry(r.unroll) for r in replayed]), replayed)

    def prepare_stacked(self, arrays: dict[str, np.ndarray]) -> Prepared:
        """`prepare` for a batch an ingest worker stacked (time-major arrays in its shared-memory slot,
        valid until the batch is acked): the batch shares that memory (pinned copies for a GPU); the
        replayed unrolls, stacked here, are appended to a copy."""
        replayed = self.replay.sample(self.replayed) if self.replay is not None else []
        if replayed:
            more = stack_entries([as_entry(r.unroll) for r in replayed])
            arrays = {name: np.concatenate([a, more[name]], axis=0 if name.startswith("final_obs") else 1)
                      for name, a in arrays.items()}
        return self.prepared(arrays, replayed)

    def prepared(self, arrays: dict[str, np.ndarray], replayed: list) -> Prepared:
        """The `Prepared` batch of time-major arrays whose last len(replayed) unrolls are `replayed`; the
        fresh ones before them (views) go to the replay after the update."""
        batch = Batch.from_arrays(arrays, torch.device("cpu"), pin=self.pin)
        fresh = unstack(arrays, batch.reward.shape[1] - len(replayed)) if self.replay is not None else []
        return Prepared(batch, fresh, [r.policy_version for r in replayed])

    def remember(self, prepared: Prepared, headers: list[dict], stats: dict[str, float], step: int) -> list[int]:
        """Add the fresh unrolls of the update just made (the learner's `step`-th) to the replay; returns
        the policy lag of each unroll it replayed ([] without a replay). A batch whose update was skipped
        (non-finite loss) is not kept: replaying its extreme values would skip later updates too."""
        if self.replay is None:
            return []
        if not stats["skipped_update"]:
            for unroll, version in zip(prepared.fresh, self.unroll_versions(headers), strict=True):
                self.replay.add(unroll, version)
        return [step - 1 - version for version in prepared.replayed_versions]

    # -- reading -----------------------------------------------------------------------------------
    def keep_reading(self) -> bool:
        """False once the learner stops, or once `close` ends the reads."""
        return not self.stopping() and self.reading

    def read(self) -> tuple[list, list[dict], list] | None:
        """Block until entries holding F valid unrolls are read (`BatchReader.read`): their ids, headers
        and payloads (decoded arrays, [n, ...] each, see `decode`). None when stopping, or when
        `run_over()`."""
        return self.reader.read(self.batch_size, self.keep_reading, self.run_over)

    def next_batch(self) -> tuple[list[bytes], list[dict], object] | None:
        """Read, de-duplicate, decode, validate and prepare the next batch (`read`, `prepare`), marking
        it in flight until `acknowledge`. None when stopping.

        It reads nothing while the batches in flight already reach `run.total_agent_steps`, so a run that
        ends there leaves no unroll delivered and unacked."""
        while self.in_flight_unrolls >= self.unrolls_left():
            if not self.keep_reading():
                return None
            time.sleep(0.005)
        got = self.read()
        if got is None:
            return None
        ids, headers, payloads = got
        with self.in_flight_lock:
            self.in_flight_unrolls += sum(map(self.unrolls_in, headers))
        return ids, headers, self.prepare(payloads)

    def claim_stale(self) -> None:
        """Take over the entries a stopped learner of this name left pending (idle a minute), into the
        consumer that reads first: this learner's, or its first ingest worker's."""
        claimed = self.trajectories.claim_stale(worker_consumer(self.consumer, 0) if self.worker_settings
                                                else self.consumer, min_idle_ms=60_000)
        if claimed:
            log.info("claimed %d unrolls left pending by a stopped learner", claimed)

    def start(self) -> Prefetcher | IngestWorkers | None:
        """Start reading ahead of the update: the ingest workers (with worker settings), the ingest
        thread (`learner.prefetch_batches` ahead), or nothing (0: `get` reads in the update's thread).
        Without workers, a thread renews the entries in flight until `close` (workers renew their own)."""
        cfg = self.cfg
        if self.worker_settings is not None:
            self.ahead = IngestWorkers(
                self.worker_settings, self.consumer, cfg.learner.ingest_workers, cfg.learner.prefetch_batches,
                self.batch_size, slot_nbytes(self.unroll_spec, self.batch_size), self.unrolls_left,
                self.prepare_stacked, self.keep_reading)
        elif cfg.learner.prefetch_batches:
            self.ahead = Prefetcher(self.next_batch, cfg.learner.prefetch_batches)
        if self.workers is None:
            self.held = threading.Event()
            threading.Thread(target=self.reader.keep_alive, args=(self.held,), name="keep-alive", daemon=True).start()
        return self.ahead

    def get(self) -> tuple[list, list[dict], object] | None:
        """The next batch (ids, headers, prepared): from what `start` started, or read here; None at the end."""
        return self.ahead.get() if self.ahead else self.next_batch()

    def acknowledge(self, ids: list[bytes], headers: list[dict]) -> int | None:
        """Ack a batch the update has trained on, counting its unrolls as trained; returns the stream's
        trained count after it. With ingest workers the worker that read it acks it
        (`IngestWorkers.release`): the learner sends no command, and None is returned."""
        if self.workers is not None:
            self.workers.release(ids)
            return None
        counts = [self.unrolls_in(h) for h in headers]
        trained = self.trajectories.ack(ids, counts)
        self.reader.release(ids)
        with self.in_flight_lock:
            self.in_flight_unrolls -= sum(counts)
        return trained

    def close(self) -> None:
        """Stop reading ahead: what was read and not trained on stays pending, for the next learner."""
        self.held.set()
        self.reading = False  # the ingest thread's read ends
        if self.ahead:
            self.ahead.close()
