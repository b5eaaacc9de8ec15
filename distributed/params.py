"""Parameter store: the learner publishes weights (safetensors bytes) with a version; actors pull them.

Keys: `{run}:params` (bytes), `{run}:params:version` (int) and `{run}:params:frames` (agent steps the
learner had trained on). They are written in one MULTI/EXEC and read in one, so a reader never pairs
new weights with an old version. Actors poll only the small
version key and fetch the weights when it changed.

Every blob travels with its SHA-256 (`{run}:params:sha256`, and `{run}:params:history:sha256` beside
the history), written in the same MULTI/EXEC; `fetch` verifies it and raises WeightsCorrupt on a
mismatch after counting it in `{run}:params:corrupt`. Readers log it and keep the weights they have.

A version number alone does not name one set of weights: a learner resumed from a checkpoint older
than its last publish publishes that checkpoint's update number again and counts up through numbers it
had used. A weights' name is therefore (version, SHA-256) (`name`); readers reload when either changed,
and `fetched_digest` tells them the digest of the blob `fetch` returned.

Policy lag on purpose (`actor.weight_delay` = K > 0): the writer also keeps its last K+1 publishes
in `{run}:params:history` (blobs) and `{run}:params:history:versions` (newest first), and a reader
with the same K gets the K-th newest one (the oldest kept while fewer were published), so actors act
with weights K versions behind the learner's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis

from distributed.codec import WeightsCorrupt, decode_weights, encode_weights, verify_weights, weights_digest

if TYPE_CHECKING:
    import torch


class ParamStore:
    """Weights of one learner under `{run}:params*`. `delay` = K: keep (writer) and read (reader) the
    weights K publishes behind the latest; 0 = the latest only."""

    def __init__(self, client: redis.Redis, run: str, delay: int = 0):
        self.r = client
        self.delay = delay
        self.key = f"{run}:params"
        self.version_key = f"{run}:params:version"
        self.frames_key = f"{run}:params:frames"
        self.history_key = f"{run}:params:history"
        self.history_versions_key = f"{run}:params:history:versions"
        self.sha_key = f"{run}:params:sha256"
        self.history_sha_key = f"{run}:params:history:sha256"
        self.corrupt_key = f"{run}:params:corrupt"
        self.fetched_digest: bytes | None = None  # SHA-256 of the blob the last `fetch` returned

    def publish(self, state_dict: dict[str, torch.Tensor], version: int, frames: int = 0) -> None:
        data = encode_weights(state_dict)
        digest = weights_digest(data)
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.key, data)
        pipe.set(self.sha_key, digest)
        pipe.set(self.version_key, int(version))
        pipe.set(self.frames_key, int(frames))
        if self.delay:
            pipe.lpush(self.history_key, data)
            pipe.lpush(self.history_sha_key, digest)
            pipe.lpush(self.history_versions_key, int(version))
            pipe.ltrim(self.history_key, 0, self.delay)
            pipe.ltrim(self.history_sha_key, 0, self.delay)
            pipe.ltrim(self.history_versions_key, 0, self.delay)
        pipe.execute()

    def clear(self) -> None:
        """Delete the published weights (a new run must not hand an old run's weights to its actors)."""
        self.r.delete(self.key, self.version_key, self.frames_key, self.history_key, self.history_versions_key,
                      self.sha_key, self.history_sha_key, self.corrupt_key)

    def corrupt_count(self) -> int:
        """How many fetches found weights that did not match their SHA-256 (all readers together)."""
        return int(self.r.get(self.corrupt_key) or 0)

    def _verified(self, version: int, data: bytes, digest: bytes | None) -> bytes:
        try:
            return verify_weights(data, digest, f"weights version {version} under '{self.key}'")
        except WeightsCorrupt:
            self.r.incr(self.corrupt_key)
            raise

    def version(self) -> int:
        """Version `fetch` would return (the latest, or K behind it), or -1 when nothing was published yet."""
        if self.delay:
            pipe = self.r.pipeline(transaction=True)
            pipe.lindex(self.history_versions_key, self.delay)
            pipe.lindex(self.history_versions_key, -1)
            v = next((x for x in pipe.execute() if x is not None), None)
        else:
            v = self.r.get(self.version_key)
        return int(v) if v is not None else -1

    def name(self) -> tuple[int, bytes | None]:
        """(version, SHA-256) of the weights `fetch` would return, read atomically: a version number
        with the digest of its blob names one set of weights, also across a learner's rollback (see the
        module doc). (-1, None) when nothing was published yet."""
        pipe = self.r.pipeline(transaction=True)
        if self.delay:
            for key in (self.history_versions_key, self.history_sha_key):
                pipe.lindex(key, self.delay)
                pipe.lindex(key, -1)
            delayed_v, oldest_v, delayed_sha, oldest_sha = pipe.execute()
            v, sha = (delayed_v, delayed_sha) if delayed_v is not None else (oldest_v, oldest_sha)
        else:
            pipe.get(self.version_key)
            pipe.get(self.sha_key)
            v, sha = pipe.execute()
        return (int(v), sha) if v is not None else (-1, None)

    def fetch(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(version, state_dict) of the latest weights (K behind them with `delay`), or None when
        nothing was published yet. Raises WeightsCorrupt (counted) when the bytes do not match their
        SHA-256."""
        raw = self.fetch_delayed() if self.delay else self.fetch_raw()
        return None if raw is None else (raw[0], decode_weights(raw[1]))

    def fetch_delayed(self) -> tuple[int, bytes, int] | None:
        """(version, safetensors bytes, 0) of the weights `delay` publishes behind the latest (the
        oldest kept while fewer were published), or None before the first publish. Raises
        WeightsCorrupt (counted) when the bytes do not match their SHA-256."""
        length = self.r.llen(self.history_versions_key)
        if length == 0:
            return None
        index = min(self.delay, length - 1)  # a publish in between shifts it by one; the pair stays matched
        pipe = self.r.pipeline(transaction=True)
        pipe.lindex(self.history_versions_key, index)
        pipe.lindex(self.history_key, index)
        pipe.lindex(self.history_sha_key, index)
        version, data, digest = pipe.execute()
        if version is None or data is None:
            return None
        verified = self._verified(int(version), data, digest)
        self.fetched_digest = digest
        return int(version), verified, 0

    def fetch_raw(self) -> tuple[int, bytes, int] | None:
        """(version, safetensors bytes, frames) of the latest weights, or None before the first publish.
        Raises WeightsCorrupt (counted) when the bytes do not match their SHA-256."""
        pipe = self.r.pipeline(transaction=True)
        pipe.get(self.version_key)
        pipe.get(self.key)
        pipe.get(self.frames_key)
        pipe.get(self.sha_key)
        version, data, frames, digest = pipe.execute()
        if version is None or data is None:
            return None
        verified = self._verified(int(version), data, digest)
        self.fetched_digest = digest
        return int(version), verified, int(frames or 0)
