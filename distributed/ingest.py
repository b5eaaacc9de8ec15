"""The learner's ingest thread: reading, de-duplicating, decoding, validating and stacking the next
batches while the update runs (IMPALA's learner must be fed faster than it computes; Espeholt et al.
2018, sec. 3). Redis replies are parsed by hiredis and msgpack, numpy and torch do their work in C, so
the thread runs beside an update that spends its time in torch.

Nothing is acknowledged here: a prefetched batch is acked by the update's thread after the update
that used it, so a learner that dies with batches in its queue leaves them pending for the next one.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, TypeVar

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
