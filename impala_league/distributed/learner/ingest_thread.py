"""The learner's ingest thread: reading, de-duplicating, decoding, validating and stacking the next
batches while the update runs (IMPALA's learner must be fed faster than it computes; Espeholt et al.
2018, sec. 3). Redis replies are parsed by hiredis and msgpack, numpy and torch do their work in C, so
the thread runs beside an update that spends its time in torch.

Nothing is acknowledged here: a prefetched batch is acked by the update's thread after the update
that used it, so a learner that dies with batches in its queue leaves them pending for the next one.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Generic, TypeVar

import redis

from impala_league.distributed.wire.codec import DecodeError
from impala_league.distributed.wire.shards import ShardedTrajectories, ShardEntry
from impala_league.distributed.wire.transport import DeadConsumerSweeper

log = logging.getLogger("learner")

KEEP_ALIVE_S = 15.0  # well inside the dead-consumer sweep's 60 s of idleness

Item = TypeVar("Item")


class Prefetcher(Generic[Item]):
    """Calls `produce` in a background thread and keeps up to `depth` of its results ready.

    `produce` returns the next item, or None when there is no more (the learner stops); `get` then
    returns None too. An exception in `produce` is raised again by `get`.

    At most `depth` items exist ahead of the caller at any time, the one being produced included: the
    thread waits for a free slot before it calls `produce`. Each item holds unacked stream entries, so
    a learner holds at most depth + 1 batches (these and the one it trains on), the bound
    `config.learners_in_flight` counts on; producing first and waiting to put would hold one more.
    """

    def __init__(self, produce: Callable[[], Item | None], depth: int):
        self.produce = produce
        self.ready: queue.Queue = queue.Queue()
        self.slots = threading.Semaphore(depth)
        self.error: BaseException | None = None
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while self._take_slot():
                item = self.produce()
                self.ready.put(item)
                if item is None:
                    return
        except BaseException as e:  # handed to the update's thread, which raises it
            self.error = e
            self.ready.put(None)

    def _take_slot(self) -> bool:
        """Wait for room for one more item; False once closed."""
        while not self.closed.is_set():
            if self.slots.acquire(timeout=0.1):
                return True
        return False

    def get(self) -> Item | None:
        """The next item, waiting for it; None once `produce` has returned None. Raises what `produce` raised."""
        item = self.ready.get()
        self.slots.release()
        if item is None and self.error is not None:
            raise self.error
        return item

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread (after the `produce` call under way, which ends once the learner is stopping)."""
        self.closed.set()
        self.thread.join(timeout)


class BatchReader:
    """One consumer's reads of the trajectory shards, as batches of decoded, valid stream entries.

    Own pending entries come first (after a restart, and after each dead-consumer sweep that claimed
    some), then new ones. Malformed entries go to the dead-letter stream with their reason and do not
    count towards a batch. Entries handed out and not yet `release`d are never handed out again, also
    when the pending list is paged through anew while they wait for their update.

    trajectories: `ShardedTrajectories` (or one `TrajectoryStream`: ids are then bytes). consumer: this
    reader's name in the consumer group. decode(datas) -> per entry (header, payload) or DecodeError
    (`codec.decode_unrolls` for unrolls); unrolls_in(header): what an entry counts towards a batch.
    unrolls_per_entry: `actor.send_batch`, what one entry is expected to hold (a read asks for that
    many entries). sweep: this reader runs the dead-consumer sweep (one reader of a learner does).
    """

    def __init__(self, trajectories: ShardedTrajectories, consumer: str, decode: Callable[[list[bytes]], list],
                 unrolls_in: Callable[[dict], int], unrolls_per_entry: int, block_ms: int, sweep: bool = True):
        self.trajectories = trajectories
        self.consumer = consumer
        self.decode = decode
        self.unrolls_in = unrolls_in
        self.unrolls_per_entry = unrolls_per_entry
        self.block_ms = block_ms
        self.sweeper = DeadConsumerSweeper(trajectories, consumer) if sweep else None  # every minute
        self.pending_cursor: ShardEntry | bytes | str | None = "0"  # re-read our own unacked entries first
        self.in_flight: set = set()  # ids handed out, not yet released (acked after their update)
        self.lock = threading.Lock()

    def read(self, unrolls: int, keep_reading: Callable[[], bool], finished: Callable[[], bool] = lambda: False
             ) -> tuple[list, list[dict], list] | None:
        """Block until entries holding `unrolls` valid unrolls are read: their ids, headers and payloads
        (decoded arrays, [n, ...] each), marked in flight. Entries holding more than `unrolls_per_entry`
        (another producer's) make the batch larger. None once `keep_reading()` turns false, or when a
        read found nothing and `finished()` says no more will come. No entry is in the stream twice
        (actors' adds are done once, `TrajectoryStream.add`), so nothing is checked for duplicates."""
        ids, headers, payloads = [], [], []
        have = 0
        while have < unrolls:
            if not keep_reading():
                return None
            if not ids and self.sweeper is not None and self.sweeper.claim_due():
                self.pending_cursor = "0"  # dead consumers' unrolls are now our own pending ones
            entries = self.trajectories.read(self.consumer, -(-(unrolls - have) // self.unrolls_per_entry),
                                             self.block_ms, pending_after=self.pending_cursor)
            if not entries and finished():
                return None
            if self.pending_cursor is not None:
                # Page through our own unacked entries once, then read new ones.
                self.pending_cursor = entries[-1][0] if entries else None
                with self.lock:  # our pending entries include the batches handed out
                    entries = [(entry_id, data) for entry_id, data in entries if entry_id not in self.in_flight]
            for (entry_id, data), got in zip(entries, self.decode([data for _, data in entries])):
                if isinstance(got, DecodeError):
                    self.dead_letter(entry_id, data, str(got))
                    continue
                header, payload = got
                ids.append(entry_id)
                headers.append(header)
                payloads.append(payload)
                have += self.unrolls_in(header)
        with self.lock:
            self.in_flight.update(ids)
        return ids, headers, payloads

    def dead_letter(self, entry_id: ShardEntry | bytes, data: bytes, reason: str) -> None:
        """Move a rejected entry to the dead-letter stream with `reason`, prefixed with the stream and the
        entry it came from, so the log line and the dead-letter record say where it was read."""
        if isinstance(entry_id, ShardEntry):
            stream, entry = self.trajectories.streams[entry_id.shard].key, entry_id.id.decode()
        else:
            stream, entry = self.trajectories.key, entry_id.decode()
        reason = f"stream {stream} entry {entry}: {reason}"
        self.trajectories.dead_letter(entry_id, data, reason)
        log.warning("dead-lettered %s", reason)

    def release(self, ids: list) -> None:
        """These entries are acked (or given back): no longer in flight."""
        with self.lock:
            self.in_flight.difference_update(ids)

    def keep_alive(self, stop: threading.Event, every_s: float | None = None) -> None:
        """Until `stop` is set, every `every_s` seconds reset the idle time of the entries in flight, so
        that a dead-consumer sweep (this learner's other readers', another rank's) never takes what a
        live reader holds, however long its batches wait for their update (default KEEP_ALIVE_S). Run it
        in a thread of its own."""
        while not stop.wait(every_s or KEEP_ALIVE_S):
            with self.lock:
                held = list(self.in_flight)
            try:
                self.trajectories.touch(self.consumer, held)
            except redis.RedisError as e:  # the reads report a lost Redis; this tries again next time
                log.debug("could not renew the entries in flight: %s", e)
