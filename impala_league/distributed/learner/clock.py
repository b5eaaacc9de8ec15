"""The learner's training clock: how far the run has trained, carried from one learner process to the
next in the checkpoint (distributed/learner/checkpoints.py saves and restores it).

Two measures, each a key of the checkpoint's meta: `elapsed_s`, the run's training seconds (what
run.max_minutes and the `linear` learning-rate schedule count), and `unrolls_trained`, the stream's
trained count as of the last ack (what tells a resumed learner how many acked unrolls its model lacks).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("learner")


class TrainingClock:
    """The run's training seconds and trained count, across processes.

    elapsed(): the run's training seconds: those of earlier processes (`elapsed_before`, restored from
      the checkpoint) plus this one's since `start` (monotonic seconds; none before it).
    unrolls_trained: `{ns}:traj:trained` as of the last ack, or as read from Redis between updates.
    restored_trained: the checkpoint's `unrolls_trained` (None for a fresh run).
    rolled_back: unrolls acked after the restored checkpoint was written, so trained on by updates the
      resumed model lacks (`count_rolled_back`; 0 without a resume, see docs/architecture.md).
    """

    def __init__(self) -> None:
        self.elapsed_before = 0.0  # seconds
        self.started: float | None = None  # monotonic start of this process's training
        self.unrolls_trained = 0
        self.restored_trained: int | None = None
        self.rolled_back = 0

    def start(self, now: float) -> None:
        """This process starts training at `now` (monotonic seconds): its seconds count from then."""
        self.started = now

    def elapsed(self, now: float | None = None) -> float:
        """Training seconds of the whole run at `now` (monotonic; default: the present): earlier
        processes' (restored) plus this one's."""
        if self.started is None:
            return self.elapsed_before
        return self.elapsed_before + ((time.monotonic() if now is None else now) - self.started)

    def meta(self) -> dict[str, float | int]:
        """The checkpoint meta's keys of this clock: `elapsed_s` (seconds, now) and `unrolls_trained`."""
        return {"unrolls_trained": self.unrolls_trained, "elapsed_s": self.elapsed()}

    def restore(self, meta: dict) -> None:
        """Take back a checkpoint's meta (`meta()`'s keys; a checkpoint without them counts 0). Raises
        ValueError or TypeError when a value is not a number."""
        self.elapsed_before = float(meta.get("elapsed_s", 0.0))
        self.restored_trained = int(meta.get("unrolls_trained", 0))

    def count_rolled_back(self, trained: int) -> bool:
        """After a resume, with the stream's trained count now (`trained`): unrolls acked after the
        checkpoint was written were trained on by updates that died with the old process. They stay
        counted as trained; this counts (`rolled_back`) and logs them. Returns True when the count is
        below the checkpoint's: a new Redis, whose counts started again from 0."""
        self.unrolls_trained = trained
        if self.restored_trained is None:
            return False
        if trained > self.restored_trained:
            self.rolled_back = trained - self.restored_trained
            log.warning("%d unrolls acked after the checkpoint (trained count %d -> %d) were trained on by updates "
                        "the resumed model does not have (the previous learner died before checkpointing them)",
                        self.rolled_back, self.restored_trained, trained)
        return trained < self.restored_trained
