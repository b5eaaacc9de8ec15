"""The league's Redis keys: opponent distributions, snapshot weights, and exploiter resets.

Keys (all under the run's name):
  {run}:league:opponents:{player}  JSON {"opponents": {id: probability}}, written by the manager
  {run}:league:snap:{id}           a snapshot's weights (safetensors bytes, as `{run}:params`)
  {run}:league:snap:{id}:sha256    their SHA-256 (hex), written with them; `snapshot` verifies it
  {run}:league:corrupt             counter of snapshot reads whose bytes did not match their SHA-256
  {run}:league:reset:{player}      counter; a learner that sees it change re-initialises its weights
Snapshot files in the run directory are the durable copy; Redis holds what actors read.
"""

from __future__ import annotations

import json

import redis

from impala_league.distributed import keys
from impala_league.distributed.codec import WeightsCorrupt, verify_weights, weights_digest

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
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.snapshot_key(snapshot_id), weights)
        pipe.set(self.snapshot_key(snapshot_id) + ":sha256", weights_digest(weights))
        pipe.execute()

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
