"""Which snapshots' weights Redis holds: at most `league.redis_snapshots` of them, chosen at every manager pass.

Every snapshot stays a league member for the whole run, with its file (`league/snapshots/<id>.safetensors`,
the durable copy, SHA-256 checked). Redis holds the weights of the *resident* snapshots only, the ones
actors load. At every pass (`SnapshotResidency.rebalance`) the manager picks them, in this order, until
`redis_snapshots` are chosen (`choose_resident`):

  1. the newest snapshot of each learner (pinned: the one its opponents meet most in the next games);
  2. the snapshots actors asked for in the last `WANT_HOLD_S` seconds, the latest asked first;
  3. the others by the weight the opponent distributions give them (the sum over the learners'
     distributions), ties going to those resident already, then to the newest.

It loads at most LOADS_PER_PASS of the chosen ones that Redis lacks from their files (verifying their
SHA-256; for at most LOAD_BUDGET_S a pass), and first evicts as many of the lowest-ranked resident ones as that needs (weights and SHA-256
deleted from Redis, file kept), so Redis never holds more than `redis_snapshots` and a league whose
actors ask for more than that churns at a bounded rate.
An actor that draws a snapshot Redis does not hold asks for it (`LeagueStore.want`), plays another
opponent in that game, and picks the snapshot up at a later parameter sync once it is loaded
(league/opponents.py): no game is played or scored against other weights than the ones it names.
A snapshot whose file is missing or corrupt when it is to be loaded leaves the league; `rebalance`
returns it with the reason, which names the file. Only the manager reads the files: actors need Redis
alone (on Kubernetes the run volume is the league manager's and learners').
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from impala_league.agents.checkpoint import CheckpointError, model_state, read_checkpoint
from impala_league.distributed.wire.codec import encode_weights
from impala_league.league.store import LeagueStore

log = logging.getLogger("league")

LOADS_PER_PASS = 8
"""At most this many snapshots are loaded from files per pass (a 2.6 MB Atari snapshot: about 20 ms each)..."""
LOAD_BUDGET_S = 0.2
"""... and no more once the pass's loads took this long (one at least)."""
WANT_HOLD_S = 30.0
"""A snapshot an actor asked for stays chosen (rule 2) this long after the latest ask: time for the actors
that drew it to fetch it at their next parameter syncs."""


def choose_resident(capacity: int, pinned: list[str], wanted: dict[str, float], weights: dict[str, float],
                    resident: set[str], created: dict[str, float]) -> list[str]:
    """The snapshots Redis should hold, at most `capacity`, in the order of the module docstring's rules.

    Args:
      capacity: `league.redis_snapshots`.
      pinned: the newest snapshot of each learner.
      wanted: snapshot id -> unix time of the latest actor's ask, within `WANT_HOLD_S`.
      weights: snapshot id -> summed probability of the learners' opponent distributions (0 when absent).
      resident: the ids Redis holds now (preferred at equal weight: no needless reloads).
      created: every snapshot member's id -> its creation time (the candidates: ids not in it are skipped).
    Returns the chosen ids, rule 1 first.
    """
    chosen: dict[str, None] = {}
    for s in pinned + sorted(wanted, key=lambda s: -wanted[s]):
        if len(chosen) >= capacity:
            break
        if s in created:
            chosen.setdefault(s)
    if len(chosen) < capacity:
        rest = sorted((s for s in created if s not in chosen),
                      key=lambda s: (-weights.get(s, 0.0), s not in resident, -created[s]))
        chosen.update(dict.fromkeys(rest[:capacity - len(chosen)]))
    return list(chosen)


class SnapshotResidency:
    """The resident snapshots of one league (see the module docstring) and what happened to them.

    Counters (saved in the league state): `loads` (snapshots loaded back from their files), `evictions`,
    `wants` (actors' asks taken), `evicted_ever` (ids evicted at least once: games against them count
    as games against evicted snapshots).
    """

    def __init__(self, store: LeagueStore, snapshot_dir: Path, capacity: int):
        self.store = store
        self.snapshot_dir = Path(snapshot_dir)
        self.capacity = capacity
        self.wanted: dict[str, float] = {}  # id -> latest ask (unix time), within WANT_HOLD_S
        self.evicted_ever: set[str] = set()
        self.loads = self.evictions = self.wants = 0

    def path(self, snapshot_id: str) -> Path:
        """The snapshot's file, its durable copy."""
        return self.snapshot_dir / f"{snapshot_id}.safetensors"

    def resident(self) -> set[str]:
        """The snapshots Redis holds, checked key by key: a marked one whose weights Redis lost (a server
        restarted from an incomplete append-only file) is unmarked and not counted."""
        marked = sorted(self.store.resident())
        present = self.store.present(marked)
        lost = [s for s, ok in zip(marked, present) if not ok]
        if lost:
            log.warning("Redis lost the weights of %d resident snapshots (%s); they are loaded again from their "
                        "files when chosen", len(lost), ", ".join(lost[:5]) + (" ..." if len(lost) > 5 else ""))
            self.store.evict_snapshots(lost)
        return {s for s, ok in zip(marked, present) if ok}

    def take_wants(self, members: set[str], now: float | None = None) -> None:
        """Fold the actors' new asks for member snapshots in; forget asks older than WANT_HOLD_S."""
        now = time.time() if now is None else now
        new = {s: t for s, t in self.store.take_wants().items() if s in members}
        self.wants += len(new)
        self.wanted.update(new)
        self.wanted = {s: t for s, t in self.wanted.items() if s in members and now - t <= WANT_HOLD_S}

    def rebalance(self, created: dict[str, float], pinned: list[str], weights: dict[str, float],
                  fill: bool = False) -> dict[str, str]:
        """Make Redis hold the chosen snapshots (`choose_resident`): at most LOADS_PER_PASS loads from
        files taking at most LOAD_BUDGET_S (with `fill`, the first pass of a manager: all of them),
        each after evicting the lowest-ranked resident snapshot when Redis is full.

        created: every snapshot member -> its creation time. Returns {id: reason} of the snapshots whose
        file could not be loaded (missing, corrupt): the caller removes them from the league.
        """
        resident = self.resident()
        ranked = choose_resident(len(created), pinned, self.wanted, weights, resident, created)
        rank = {s: i for i, s in enumerate(ranked)}
        target = ranked[:self.capacity]
        load = [s for s in target if s not in resident][:self.capacity if fill else LOADS_PER_PASS]
        victims = sorted(resident - set(target), key=lambda s: -rank.get(s, len(ranked)))  # non-members first
        gone = [s for s in victims if s not in rank]
        gone += [s for s in victims if s in rank][:max(0, len(resident) - len(gone) - self.capacity)]
        self._evict(gone)
        victims = [s for s in victims if s not in set(gone)]
        held = len(resident) - len(gone)
        failed, start = {}, time.perf_counter()
        for snapshot_id in load:
            if not fill and time.perf_counter() - start > LOAD_BUDGET_S:
                break
            try:
                tensors, _ = read_checkpoint(self.path(snapshot_id))
            except CheckpointError as e:
                failed[snapshot_id] = str(e)
                continue
            if held >= self.capacity:
                self._evict([victims.pop(0)])
                held -= 1
            self.store.put_snapshot(snapshot_id, encode_weights(model_state(tensors)))
            self.loads += 1
            held += 1
        return failed

    def _evict(self, snapshot_ids: list[str]) -> None:
        """Delete their weights from Redis (their files stay) and count them."""
        if snapshot_ids:
            self.store.evict_snapshots(snapshot_ids)
            self.evictions += len(snapshot_ids)
            self.evicted_ever.update(snapshot_ids)

    def make_room(self, created: dict[str, float], pinned: list[str], weights: dict[str, float]) -> None:
        """Before a new snapshot's weights go to Redis: evict down to `capacity - 1` resident snapshots
        (loading none that are not resident)."""
        resident = self.resident()
        if len(resident) < self.capacity:
            return
        keep = set(choose_resident(self.capacity - 1, pinned, self.wanted, weights, resident,
                                   {s: t for s, t in created.items() if s in resident}))
        self._evict(sorted(resident - keep))

    def to_json(self) -> dict:
        """The counters and ids that outlive the manager process (league state)."""
        return {"capacity": self.capacity, "loads": self.loads, "evictions": self.evictions, "wants": self.wants,
                "evicted_ever": sorted(self.evicted_ever)}

    def restore(self, saved: dict, members: set[str]) -> None:
        """Take back what `to_json` saved (the counters, the evicted ids still members)."""
        self.loads = int(saved.get("loads", 0))
        self.evictions = int(saved.get("evictions", 0))
        self.wants = int(saved.get("wants", 0))
        self.evicted_ever = {str(s) for s in saved.get("evicted_ever", []) if str(s) in members}
