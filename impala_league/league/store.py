"""The league's Redis keys: opponent distributions, snapshot weights, and exploiter resets.

Keys (all under the run's name):
  {run}:league:opponents:{player}  JSON {"opponents": {id: probability}}, written by the manager
  {run}:league:snap:{id}           a snapshot's weights (safetensors bytes, as `{run}:params`), only while
                                   the snapshot is resident (at most `league.redis_snapshots` of them)
  {run}:league:snap:{id}:sha256    their SHA-256 (hex), written with them; `snapshot` verifies it
  {run}:league:resident            set of the snapshot ids whose weights Redis holds, changed in the same
                                   MULTI/EXEC as the weights (`put_snapshot`, `evict_snapshots`)
  {run}:league:wanted              sorted set: snapshot id -> unix time an actor last drew it while Redis
                                   did not hold it; the manager takes them (`take_wants`) and loads them
  {run}:league:corrupt             counter of snapshot reads whose bytes did not match their SHA-256
  {run}:league:reset:{player}      counter; a learner that sees it change re-initialises its weights
Snapshot files in the run directory are the durable copy of every snapshot; Redis holds the weights of
the resident ones, which actors read (league/residency.py says which).
"""

from __future__ import annotations

import json
import time

import redis

from impala_league.distributed.wire import keys
from impala_league.distributed.wire.codec import WeightsCorrupt, verify_weights, weights_digest

MAX_OPPONENTS = 10_000


class LeagueStore:
    def __init__(self, client: redis.Redis, run: str):
        self.r = client
        self.run = run

    def _opponents_key(self, player: str) -> str:
        return keys.league(self.run, "opponents", player)

    def snapshot_key(self, snapshot_id: str) -> str:
        return keys.league(self.run, "snap", snapshot_id)

    def _reset_key(self, player: str) -> str:
        return keys.league(self.run, "reset", player)

    def publish_opponents(self, player: str, opponents: dict[str, float]) -> None:
        self.r.set(self._opponents_key(player), json.dumps({"opponents": opponents}))

    def opponents(self, player: str) -> dict[str, float] | None:
        """The player's opponent distribution (normalised), or None when none is published yet.

        Raises ValueError when the stored value is malformed.
        """
        raw = self.r.get(self._opponents_key(player))
        if raw is None:
            return None
        try:
            dist = json.loads(raw)["opponents"]
            ok = (isinstance(dist, dict) and 0 < len(dist) <= MAX_OPPONENTS
                  and all(isinstance(k, str) and isinstance(v, (int, float)) and 0 <= v <= 1
                          for k, v in dist.items())
                  and sum(dist.values()) > 0)  # probabilities: no sum can overflow
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise ValueError(f"malformed opponent distribution under {self._opponents_key(player)}")
        total = sum(dist.values())
        return {k: float(v) / total for k, v in dist.items()}

    def clear_opponents(self) -> None:
        """Delete every published distribution and reset counter (a new run starts without a league)."""
        found = list(self.r.scan_iter(match=keys.league(self.run, "opponents", "*"), count=1000))
        found += list(self.r.scan_iter(match=keys.league(self.run, "reset", "*"), count=1000))
        if found:
            self.r.delete(*found)

    def put_snapshot(self, snapshot_id: str, weights: bytes) -> None:
        """Store a snapshot's weights with their SHA-256 and mark it resident, in one MULTI/EXEC."""
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.snapshot_key(snapshot_id), weights)
        pipe.set(self.snapshot_key(snapshot_id) + ":sha256", weights_digest(weights))
        pipe.sadd(self._resident_key(), snapshot_id)
        pipe.execute()

    def evict_snapshots(self, snapshot_ids: list[str]) -> None:
        """Delete the weights of `snapshot_ids` from Redis and unmark them resident, in one MULTI/EXEC.
        Their files stay: they are still league members (league/residency.py)."""
        if not snapshot_ids:
            return
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(*[k for s in snapshot_ids for k in (self.snapshot_key(s), self.snapshot_key(s) + ":sha256")])
        pipe.srem(self._resident_key(), *snapshot_ids)
        pipe.execute()

    def resident(self) -> set[str]:
        """The ids of the snapshots whose weights Redis holds now."""
        return {m.decode() if isinstance(m, bytes) else str(m) for m in self.r.smembers(self._resident_key())}

    def present(self, snapshot_ids: list[str]) -> list[bool]:
        """Whether Redis holds the weights of each of `snapshot_ids` (one round trip)."""
        pipe = self.r.pipeline(transaction=False)
        for s in snapshot_ids:
            pipe.exists(self.snapshot_key(s))
        return [bool(x) for x in pipe.execute()]

    def want(self, snapshot_id: str) -> None:
        """An actor drew `snapshot_id` while Redis did not hold it: ask the manager to load it."""
        self.r.zadd(self._wanted_key(), {snapshot_id: time.time()})

    def take_wants(self) -> dict[str, float]:
        """The snapshots actors asked for since the last call (id -> unix time of the latest ask), removed."""
        pipe = self.r.pipeline(transaction=True)
        pipe.zrange(self._wanted_key(), 0, MAX_OPPONENTS - 1, withscores=True)
        pipe.delete(self._wanted_key())
        wanted, _ = pipe.execute()
        return {(k.decode() if isinstance(k, bytes) else str(k)): float(t) for k, t in wanted}

    def _resident_key(self) -> str:
        return keys.league(self.run, "resident")

    def _wanted_key(self) -> str:
        return keys.league(self.run, "wanted")

    def has_snapshot(self, snapshot_id: str) -> bool:
        return bool(self.r.exists(self.snapshot_key(snapshot_id)))

    def snapshot(self, snapshot_id: str) -> bytes | None:
        """The snapshot's weights, or None when Redis has none. Raises WeightsCorrupt (counted under
        `{run}:league:corrupt`) when they do not match their SHA-256."""
        pipe = self.r.pipeline(transaction=True)
        pipe.get(self.snapshot_key(snapshot_id))
        pipe.get(self.snapshot_key(snapshot_id) + ":sha256")
        data, digest = pipe.execute()
        if data is None:
            return None
        try:
            return verify_weights(data, digest, f"snapshot {snapshot_id!r}")
        except WeightsCorrupt:
            self.r.incr(keys.league(self.run, "corrupt"))
            raise

    def corrupt_count(self) -> int:
        return int(self.r.get(keys.league(self.run, "corrupt")) or 0)

    def request_reset(self, player: str) -> int:
        return int(self.r.incr(self._reset_key(player)))

    def reset_count(self, player: str) -> int:
        value = self.r.get(self._reset_key(player))
        return int(value) if value is not None else 0
