"""Experience replay on the learner: a bounded memory of recently trained unrolls, mixed into new batches.

IMPALA compares its off-policy corrections without and with experience replay (Espeholt et al. 2018,
sec. 5.3, Table 2, "with replay"). A replayed unroll was produced by an older behaviour policy mu than
the stream's, so it is further off-policy; V-trace corrects it like any other unroll, with the mu it
carries itself (`behaviour_logits`, or `behaviour_log_probs` for multi-head actions; see
codec.UnrollSpec). Each learner (each rank of `learner.num_learners`, each league player) keeps its own
buffer, in memory only: a resumed learner starts with an empty one.
"""

from __future__ import annotations

import threading
import zlib
from collections import deque
from typing import NamedTuple, Sequence

import numpy as np

from impala_league.config import Config, ConfigError
from impala_league.distributed.wire.codec import UnrollSpec


class Replayed(NamedTuple):
    """One unroll held by the replay.

    unroll: its decoded arrays, name -> array as codec.UnrollSpec lists them (obs [T+1, ...],
      behaviour_logits [T, A], ...), the form `Batch.stack` takes; read-only copies owned by the buffer.
    policy_version: the version of the weights that acted it (the header's `policy_version`), for the
      policy lag of replayed unrolls.
    """

    unroll: dict[str, np.ndarray]
    policy_version: int


def unroll_nbytes(unroll: dict[str, np.ndarray]) -> int:
    """Bytes of an unroll's arrays: the sum of their `nbytes`."""
    return sum(a.nbytes for a in unroll.values())


class ReplayBuffer:
    """The most recent unrolls whose arrays fit in `capacity_bytes`, the oldest evicted first, sampled
    uniformly.

    `nbytes` counts the memory held: the sum of the held arrays' nbytes. `add` copies every array, so
    a decoded unroll's arrays, views into its whole stream entry, do not keep the entry alive unseen. Held arrays are read-only: sampled unrolls are shared by every batch that draws them.

    Thread-safe: the learner's update thread adds the unrolls it trained on while its ingest thread
    samples for the next batches.
    """

    def __init__(self, capacity_bytes: int, seed: Sequence[int]):
        """`capacity_bytes` > 0; `seed`: the root of the sampling generator (numpy SeedSequence
        entropy, e.g. (run.seed, rank, player id)), so that a run's draws are reproducible."""
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.rng = np.random.default_rng(list(seed))
        self.items: deque[Replayed] = deque()
        self.nbytes = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def add(self, unroll: dict[str, np.ndarray], policy_version: int) -> None:
        """Keep a copy of `unroll` (name -> array), evicting the oldest unrolls until it fits.

        Raises ValueError when the unroll alone is larger than the capacity.
        """
        kept = {name: _read_only_copy(a) for name, a in unroll.items()}
        size = unroll_nbytes(kept)
        if size > self.capacity_bytes:
            raise ValueError(f"an unroll of {size} bytes does not fit a replay of {self.capacity_bytes} bytes")
        with self.lock:
            while self.nbytes + size > self.capacity_bytes:
                self.nbytes -= unroll_nbytes(self.items.popleft().unroll)
            self.items.append(Replayed(kept, int(policy_version)))
            self.nbytes += size

    def sample(self, n: int) -> list[Replayed]:
        """`n` distinct held unrolls drawn uniformly at random, or every held one (in random order)
        while it holds fewer than `n`."""
        with self.lock:
            picks = self.rng.choice(len(self.items), size=min(n, len(self.items)), replace=False)
            return [self.items[i] for i in picks]

    def clear(self) -> None:
        """Forget every unroll (a league exploiter reset starts from new weights and new experience)."""
        with self.lock:
            self.items.clear()
            self.nbytes = 0


def make_replay(cfg: Config, unroll_spec: UnrollSpec, replayed: int, rank: int, player: str) -> ReplayBuffer:
    """The replay of learner `rank` of `player`, seeded by run.seed, its rank and its player (crc32:
    Python's str hash differs between processes). Raises ConfigError when learner.replay_memory_mb cannot
    hold the `replayed` unrolls a batch replays."""
    capacity = int(cfg.learner.replay_memory_mb * 2**20)
    largest = unroll_spec.max_unroll_nbytes
    if capacity < replayed * largest:
        raise ConfigError(f"learner.replay_memory_mb={cfg.learner.replay_memory_mb} holds fewer than the "
                          f"{replayed} unrolls a batch replays (up to {largest / 2**20:.3f} MB each for "
                          f"{unroll_spec.env.name} with T={cfg.actor.unroll_length}): raise it")
    return ReplayBuffer(capacity, seed=(cfg.run.seed, rank, zlib.crc32(player.encode())))


def _read_only_copy(a: np.ndarray) -> np.ndarray:
    copy = np.array(a, copy=True, order="C")
    copy.setflags(write=False)
    return copy
