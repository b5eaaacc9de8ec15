"""Parameter store: the learner publishes weights (safetensors bytes) with a version; actors pull them.

Keys: `{run}:params` (bytes), `{run}:params:version` (int) and `{run}:params:agent_steps` (agent steps the
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

Weights to many actors (`transport.params_urls`): every actor fetching every blob from the run's one
Redis makes it send blobs x actors. Read-only replicas of that Redis (`redis-server --replicaof`) each
receive one copy of every write, and a reader given one (`replica`) fetches the blob there. The run's
Redis stays the authority: the reader first reads the name (version, SHA-256) there, then takes the
replica's copy only if it is those weights, the same version and a blob whose SHA-256 is the one the run's
Redis names. A replica that is behind (asynchronous replication: usually by under a millisecond), holds
other bytes, or does not answer is not used for that fetch: the reader fetches from the run's Redis,
counts it (`replica_fallbacks`, and in `{run}:params:replica_fallbacks`) and logs each cause once. One that did not answer is left alone for
REPLICA_RETRY_S; one just behind a publish, or passed by one between the two reads, is read again first
(REPLICA_READS).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import redis

from impala_league.distributed.wire import keys
from impala_league.distributed.wire.codec import WeightsCorrupt, decode_weights, encode_weights, verify_weights, weights_digest
from impala_league.distributed.wire.connection import _safe, replica_client, with_credentials

if TYPE_CHECKING:
    import torch

log = logging.getLogger("params")

REPLICA_RETRY_S = 30.0  # after a replica did not answer: fetch from the run's Redis this long before trying it again
# A replica receives a publish a moment after the run's Redis (usually under a millisecond, longer on a
# busy host): a reader that finds it one step behind, or one ahead (a publish between its two reads),
# reads again, up to REPLICA_READS times, REPLICA_CATCH_UP_S apart when it was behind.
REPLICA_READS = 3
REPLICA_CATCH_UP_S = 0.01


def params_replica(run_url: str, urls: list[str], actor_id: int) -> tuple[redis.Redis | None, str]:
    """The replica actor `actor_id` reads weights from, `urls[actor_id % len(urls)]` (transport.params_urls:
    ids are dense from 0, so the actors spread evenly), with the credentials of `run_url`, and its URL
    without them for logs; (None, "") when `urls` is empty. Connects on first use (`replica_client`)."""
    if not urls:
        return None, ""
    url = with_credentials(run_url, urls[actor_id % len(urls)])
    return replica_client(url), _safe(url)


class ParamStore:
    """Weights of one learner under `{run}:params*`. `delay` = K: keep (writer) and read (reader) the
    weights K publishes behind the latest; 0 = the latest only. `replica`: a read-only replica of
    `client`'s server that `fetch` reads the blob from when it holds the weights `client` names (see the
    module doc); `replica_name` names it in logs (no password)."""

    def __init__(self, client: redis.Redis, run: str, delay: int = 0, replica: redis.Redis | None = None,
                 replica_name: str = "replica"):
        self.r = client
        self.delay = delay
        self.replica, self.replica_name = replica, replica_name
        self.replica_fallbacks = 0  # fetches that wanted the replica's copy and read the run's Redis instead
        self.from_replica = False  # whether the last `fetch_bytes` returned the replica's copy
        self._replica_down_until = -math.inf  # monotonic time before which the replica is not tried
        self._causes_logged: set[str] = set()
        self.key = keys.params(run)
        self.version_key = keys.params(run, "version")
        self.agent_steps_key = keys.params(run, "agent_steps")
        self.history_key = keys.params(run, "history")
        self.history_versions_key = keys.params(run, "history:versions")
        self.sha_key = keys.params(run, "sha256")
        self.history_sha_key = keys.params(run, "history:sha256")
        self.corrupt_key = keys.params(run, "corrupt")
        self.fallbacks_key = keys.params(run, "replica_fallbacks")
        self.fetched_digest: bytes | None = None  # SHA-256 of the blob the last `fetch` returned

    def publish(self, state_dict: dict[str, torch.Tensor], version: int, agent_steps: int = 0) -> None:
        data = encode_weights(state_dict)
        digest = weights_digest(data)
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.key, data)
        pipe.set(self.sha_key, digest)
        pipe.set(self.version_key, int(version))
        pipe.set(self.agent_steps_key, int(agent_steps))
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
        self.r.delete(self.key, self.version_key, self.agent_steps_key, self.history_key, self.history_versions_key,
                      self.sha_key, self.history_sha_key, self.corrupt_key, self.fallbacks_key)

    def corrupt_count(self) -> int:
        """How many fetches found weights that did not match their SHA-256 (all readers together)."""
        return int(self.r.get(self.corrupt_key) or 0)

    def replica_fallback_count(self) -> int:
        """How many fetches meant for a replica read the run's Redis instead (all readers together)."""
        return int(self.r.get(self.fallbacks_key) or 0)

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
        raw = self.fetch_bytes()
        return None if raw is None else (raw[0], decode_weights(raw[1]))

    def fetch_bytes(self) -> tuple[int, bytes, int] | None:
        """(version, safetensors bytes, agent_steps; 0 with `delay`) of the weights `fetch` returns: the
        replica's copy when it holds exactly the weights the run's Redis names now, else read from the
        run's Redis. None before the first publish. Raises WeightsCorrupt (counted) when the run's Redis
        holds bytes that do not match their SHA-256; a replica's bad copy is never returned nor raised."""
        got = self._from_replica() if self.replica is not None else None
        self.from_replica = got is not None
        if got is not None:
            return got
        return self.fetch_delayed() if self.delay else self.fetch_raw()

    def fetch_delayed(self) -> tuple[int, bytes, int] | None:
        """(version, safetensors bytes, 0) of the weights `delay` publishes behind the latest (the
        oldest kept while fewer were published), or None before the first publish. Raises
        WeightsCorrupt (counted) when the bytes do not match their SHA-256."""
        return self._checked(self._read(self.r, delayed=True))

    def fetch_raw(self) -> tuple[int, bytes, int] | None:
        """(version, safetensors bytes, agent_steps) of the latest weights, or None before the first publish.
        Raises WeightsCorrupt (counted) when the bytes do not match their SHA-256."""
        return self._checked(self._read(self.r, delayed=False))

    def _checked(self, read: tuple[int, bytes, int, bytes | None] | None) -> tuple[int, bytes, int] | None:
        if read is None:
            return None
        version, data, agent_steps, digest = read
        verified = self._verified(version, data, digest)
        self.fetched_digest = digest
        return version, verified, agent_steps

    def _read(self, client: redis.Redis, delayed: bool) -> tuple[int, bytes, int, bytes | None] | None:
        """(version, blob, agent_steps, SHA-256 as published) from `client`, read atomically, unchecked: the
        latest, or (`delayed`) the one `delay` publishes behind it (agent_steps 0). None before the first publish."""
        pipe = client.pipeline(transaction=True)
        if delayed:
            length = client.llen(self.history_versions_key)
            if length == 0:
                return None
            index = min(self.delay, length - 1)  # a publish in between shifts it by one; the pair stays matched
            pipe.lindex(self.history_versions_key, index)
            pipe.lindex(self.history_key, index)
            pipe.lindex(self.history_sha_key, index)
            (version, data, digest), agent_steps = pipe.execute(), 0
        else:
            pipe.get(self.version_key)
            pipe.get(self.key)
            pipe.get(self.agent_steps_key)
            pipe.get(self.sha_key)
            version, data, agent_steps, digest = pipe.execute()
        if version is None or data is None:
            return None
        return int(version), data, int(agent_steps or 0), digest

    def _from_replica(self) -> tuple[int, bytes, int] | None:
        """The replica's copy of the weights the run's Redis names now (version, SHA-256), as
        `fetch_bytes` returns it, or None (counted, each cause logged once) when the replica cannot give
        exactly those: it is down, behind, or its bytes fail that SHA-256. Also None before the first publish."""
        if time.monotonic() < self._replica_down_until:
            return self._fall_back("down", f"it did not answer less than {REPLICA_RETRY_S:g} s ago")
        for _ in range(REPLICA_READS):
            version, digest = self.name()
            if version < 0:
                return None  # nothing published: the run's Redis says so itself
            try:
                read = self._read(self.replica, delayed=bool(self.delay))
            except redis.RedisError as e:
                self._replica_down_until = time.monotonic() + REPLICA_RETRY_S
                return self._fall_back("down", f"{type(e).__name__}: {e}")
            if read is not None and read[0] == version:
                break
            if read is None or read[0] < version:  # the last publish is on its way to the replica
                time.sleep(REPLICA_CATCH_UP_S)
            # else a publish came between the two reads: read the name again
        else:
            return self._fall_back("behind", f"it holds version {read[0] if read else 'none'} where the run's Redis "
                                   f"names {version}, {REPLICA_READS} reads {REPLICA_CATCH_UP_S * 1000:g} ms apart")
        try:
            verify_weights(read[1], digest, f"the replica's copy of weights version {version}")
        except WeightsCorrupt as e:
            return self._fall_back("corrupt", str(e))
        self.fetched_digest = digest
        return version, read[1], read[2]

    def _fall_back(self, cause: str, detail: str) -> None:
        """Count a fetch that reads the run's Redis instead of the replica; log the first of each cause."""
        self.replica_fallbacks += 1
        self.r.incr(self.fallbacks_key)
        if cause not in self._causes_logged:
            self._causes_logged.add(cause)
            log.warning("weights under '%s': not from replica %s (%s); fetching them from the run's Redis "
                        "(each cause is logged once, every such fetch counted)", self.key, self.replica_name, detail)
        return None
