"""The learner's side of sharded trajectory streams (`transport.shards`, keys in transport.py's doc).

`ShardedTrajectories` reads every shard of a learner's namespace and routes acks and dead letters to
the shard each entry came from. It answers the calls `Learner` makes of a `TrajectoryStream` (`read`,
`ack`, `dead_letter`, `claim_stale`, `remove_idle_consumers`, `accounting`), so the learner's loop reads
the same with 1 or 256 shards.

Reading: the shards on one Redis are read in one XREADGROUP over their streams; with several servers
each `read` first asks every server without blocking (round-robin start), and blocks (briefly) only when
none had anything. Entry ids are unique only within a stream, so each one travels as a `ShardEntry`.

A shard server other than the run's own Redis that goes away does not stop the learner: its client
retries for SHARD_RETRY_S only, then the server is marked down (logged once) and skipped, probed again
after 1, 2, 4 ... 30 s; the other shards keep training. Acks for entries of a down server (read before it
went) are kept and sent when it is back, in order, before anything newer is read from it; until then
those entries are treated as in flight (not re-read from the pending list). A learner that dies while
holding such acks leaves the entries pending: they are re-read and trained again after a restart (at
least once). The run's own Redis keeps today's rule: its outage is
retried for run.redis_retry_s, then the learner exits (it holds the lease, params and results too).
A shard host that does not answer at all (rather than refusing the connection) costs each probe up to two
connect timeouts (5 s each), hence the growing probe interval.

Redis Cluster: a shard URL that points at a cluster node gets a `RedisCluster` client
(`transport.connect_shard`), every shard on it is tagged (shard 0 too: `{<run>:s0}`), and its shards are
read with one XREADGROUP and acked with one script each (a cluster pipeline takes no EVAL). The run's own
Redis (params, results, leases) must be a plain server; an outage of a cluster is left to redis-py's
cluster client (node refresh and retries), not to `SHARD_RETRY_S`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import redis
from redis.cluster import RedisCluster

from impala_league.distributed.wire.connection import _safe, connect_shard, shard_urls
from impala_league.distributed.wire.transport import GROUP, TrajectoryStream

log = logging.getLogger("shards")

SHARD_RETRY_S = 2.0  # a shard server's client rides out blips this long before the server counts as down
PROBE_MAX_S = 30.0  # longest wait between tries of a down shard server
MULTI_SERVER_BLOCK_MS = 50  # with several servers, a blocking read waits on one of them this long at most


class ShardEntry(NamedTuple):
    """One stream entry's id with the shard it came from (entry ids are unique only per stream)."""

    shard: int
    id: bytes

    def decode(self) -> str:
        """A printable id, `<id>` for shard 0 and `<id>@s<shard>` otherwise (logs print ids this way)."""
        return self.id.decode() if self.shard == 0 else f"{self.id.decode()}@s{self.shard}"


@dataclass
class _Server:
    """One Redis holding some shards, and what the learner knows of its health."""

    url: str
    client: redis.Redis
    shards: list[int]
    isolated: bool  # an outage here is survived (not the run's own Redis)
    down_since: float | None = None
    retry_at: float = 0.0
    failures: int = 0
    outages: int = 0
    rotate: int = 0  # first shard of the next partial read (count < shards here)
    cluster: bool = False  # a Redis Cluster: one slot per shard, so one read and one ack script per shard
    deferred: dict[int, tuple[list[bytes], list[int]]] = field(default_factory=dict)  # shard -> acks to send (ids, counts)


class ShardedTrajectories:
    """Every trajectory shard of `namespace`, read and acked as one stream by the learner.

    client: the learner's client of the run's Redis (`run_url`); other servers get their own client.
    shards, urls: `transport.shards`, `transport.shard_urls`. block_ms: the learner's read block (the
    clients' socket timeouts exceed it). `connect_to(url, block_ms)` makes a shard server's client.
    Raises RedisUnavailable if a shard server does not answer at start.
    """

    def __init__(self, client: redis.Redis, run_url: str, namespace: str, shards: int = 1,
                 urls: list[str] | tuple[str, ...] = (), block_ms: int = 1000,
                 connect_to: Callable[[str, int], redis.Redis] | None = None):
        connect_to = connect_to or (lambda url, block: connect_shard(url, block_ms=block, retry_s=SHARD_RETRY_S))
        self.servers: list[_Server] = []
        self.streams: list[TrajectoryStream] = []
        self.server_of: list[_Server] = []
        by_url: dict[str, _Server] = {}
        for s, url in enumerate(shard_urls(run_url, shards, urls)):
            if url not in by_url:
                own = url == run_url
                shard_client = client if own else connect_to(url, block_ms)
                by_url[url] = _Server(url, shard_client, [], not own, cluster=isinstance(shard_client, RedisCluster))
                self.servers.append(by_url[url])
            server = by_url[url]
            server.shards.append(s)
            self.server_of.append(server)
            self.streams.append(TrajectoryStream(server.client, namespace, shard=s))
        self.key = self.streams[0].key if shards == 1 else f"{self.streams[0].key} and {shards - 1} more shards"
        self.next_server = 0
        self.trained = [0] * shards  # each shard's trained count as last seen (an ack returns it)
        self.last_counts: list[dict[str, int] | None] = [None] * shards
        self.backlogs = [0] * shards  # per shard, as of the last `accounting`
        # Deferred acks are kept by the update's thread (`ack`) and read by the ingest thread.
        self.deferred_lock = threading.Lock()

    @property
    def shards(self) -> int:
        return len(self.streams)

    @property
    def group_losses(self) -> int:
        """Streams found gone with their group (Redis restarted without its data), all shards together."""
        return sum(stream.group_losses for stream in self.streams)

    def servers_down(self) -> int:
        return sum(server.down_since is not None for server in self.servers)

    # -- failure isolation -------------------------------------------------------------------------
    def _up(self, server: _Server) -> bool:
        """Whether to talk to `server` now: it is up, or a probe of a down one is due."""
        return server.down_since is None or time.monotonic() >= server.retry_at

    def _call(self, server: _Server, fn: Callable[[], object], default: object = None) -> object:
        """fn() against `server`; on a lost shard server, mark it down and return `default`. The run's
        own Redis raises as before (its retry policy has already waited run.redis_retry_s)."""
        try:
            result = fn()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            if not server.isolated:
                raise
            self._went_down(server, e)
            return default
        if server.down_since is not None:
            log.info("shard server %s is back after %.1f s; reading its shards %s again", _where(server),
                     time.monotonic() - server.down_since, server.shards)
            server.down_since, server.failures = None, 0
            server.outages += 1
        return result

    def _went_down(self, server: _Server, error: Exception) -> None:
        now = time.monotonic()
        if server.down_since is None:
            server.down_since = now
            log.warning("shard server %s is unreachable (%s: %s); training on the other shards, its shards %s "
                        "wait (their unrolls stay in its streams)", _where(server), type(error).__name__, error,
                        server.shards)
        server.failures += 1
        server.retry_at = now + min(2.0 ** (server.failures - 1), PROBE_MAX_S)

    # -- reading -----------------------------------------------------------------------------------
    def ensure_group(self) -> None:
        """Create every shard's consumer group (and stream) if missing."""
        for stream, server in zip(self.streams, self.server_of):
            self._call(server, stream.ensure_group)

    def read(self, consumer: str, count: int, block_ms: int, pending_after: ShardEntry | str | None = None
             ) -> list[tuple[ShardEntry, bytes]]:
        """Up to `count` entries as (ShardEntry, data), like `TrajectoryStream.read`: new ones from the
        shards, or with `pending_after` ("0", or the last ShardEntry seen) this consumer's own pending
        entries, shard after shard."""
        if pending_after is not None:
            return self._read_pending(consumer, count, pending_after)
        n = len(self.servers)
        for i in range(n):
            server = self.servers[(self.next_server + i) % n]
            if n > 1 and self._up(server):
                got = self._read_new(server, consumer, count, None)
                if got:
                    self.next_server = (self.next_server + i + 1) % n
                    return got
        # Nothing anywhere (or one server): block on the next live server.
        for i in range(n):
            server = self.servers[(self.next_server + i) % n]
            if self._up(server):
                self.next_server = (self.next_server + i + 1) % n
                return self._read_new(server, consumer, count, block_ms if n == 1 else
                                      min(block_ms, MULTI_SERVER_BLOCK_MS))
        time.sleep(min(block_ms, 100) / 1000)  # every shard server is down: wait a little, as a block would
        return []

    def _read_new(self, server: _Server, consumer: str, count: int, block_ms: int | None
                  ) -> list[tuple[ShardEntry, bytes]]:
        """New entries of `server`'s shards, at most `count` in all: count // k from each of its k
        shards, or one from each of the next `count` shards (round-robin) when count < k."""
        shards = server.shards
        if len(shards) == 1 and block_ms:  # the unsharded read, with its checks
            s = shards[0]
            got = self._call(server, lambda: self.streams[s].read(consumer, count, block_ms), [])
            return [(ShardEntry(s, eid), data) for eid, data in got]
        if count >= len(shards):
            chosen, per = shards, count // len(shards)
        else:
            start = server.rotate % len(shards)
            chosen, per = (shards[start:] + shards[:start])[:count], 1
            server.rotate += count
        if server.cluster:  # shards in different slots: one XREADGROUP each, blocking only if all are empty
            return self._call(server, lambda: self._read_each(server, consumer, chosen, per, block_ms), [])
        return self._call(server, lambda: self._xreadgroup(server, consumer, chosen, per, block_ms), [])

    def _read_each(self, server: _Server, consumer: str, shards: list[int], per: int, block_ms: int | None
                   ) -> list[tuple[ShardEntry, bytes]]:
        out = []
        for s in shards:
            out += self._xreadgroup(server, consumer, [s], per, None)
        if not out and block_ms:
            out = self._xreadgroup(server, consumer, shards[:1], per, min(block_ms, MULTI_SERVER_BLOCK_MS))
        return out

    def _xreadgroup(self, server: _Server, consumer: str, shards: list[int], per: int, block_ms: int | None
                    ) -> list[tuple[ShardEntry, bytes]]:
        """One XREADGROUP over `shards`' streams (all on `server`), up to `per` entries each."""
        key_shard = {self.streams[s].key.encode(): s for s in shards}
        try:
            reply = server.client.xreadgroup(GROUP, consumer, {self.streams[s].key: ">" for s in shards},
                                             count=per, block=block_ms)
        except redis.ResponseError as e:
            if not str(e).startswith("NOGROUP"):
                raise
            for s in shards:  # which stream lost its group is not said: recreate the missing ones
                self.streams[s].recreate_if_lost()
            return []
        out = []
        for key, entries in reply or []:
            s = key_shard[key if isinstance(key, bytes) else key.encode()]
            out += [(ShardEntry(s, eid), (fields or {}).get(b"data", b"")) for eid, fields in entries]
        return out

    def _read_pending(self, consumer: str, count: int, after: ShardEntry | str) -> list[tuple[ShardEntry, bytes]]:
        """The next page of this consumer's pending entries: in the shard of `after` past its id, else in
        the following shards from their start. Entries whose ack waits for their server are left out."""
        shard, cursor = (after.shard, after.id) if isinstance(after, ShardEntry) else (0, "0")
        while shard < self.shards:
            server, stream = self.server_of[shard], self.streams[shard]
            if not self._up(server):
                shard, cursor = shard + 1, "0"
                continue
            page = self._call(server, lambda: stream.read(consumer, count, 0, pending_after=cursor), [])
            if not page:
                shard, cursor = shard + 1, "0"
                continue
            with self.deferred_lock:
                waiting = set(server.deferred.get(shard, ((), ()))[0])
            entries = [(ShardEntry(shard, eid), data) for eid, data in page if eid not in waiting]
            if entries:
                return entries
            cursor = page[-1][0]
        return []

    # -- acknowledging -----------------------------------------------------------------------------
    def _by_shard(self, entry_ids: list[ShardEntry], *values: list | tuple | None) -> dict[int, tuple[list, ...]]:
        """Entry ids, and each list of values beside them (empty or None ones stay empty), grouped by
        shard: shard -> (ids, values...), in order."""
        out: dict[int, tuple[list, ...]] = {}
        for i, entry in enumerate(entry_ids):
            ids, *vals = out.setdefault(entry.shard, tuple([] for _ in range(1 + len(values))))
            ids.append(entry.id)
            for kept, given in zip(vals, values):
                if given:
                    kept.append(given[i])
        return out

    def ack(self, entry_ids: list[ShardEntry], counts: list[int] | None = None) -> int:
        """Ack and delete trained entries (of `counts` unrolls each, default 1) in their shards
        (`TrajectoryStream.ack`, one round trip per server). Acks for a server that is down are kept and
        sent once it is back. Returns the trained count of all shards (those not acked now as last seen)."""
        for server in self.servers:  # acks kept while a server was down go first, if it is back
            if server.deferred and self._up(server):
                self._flush_deferred(server)
        groups = self._by_shard(entry_ids, counts)
        for server in self.servers:
            mine = {s: g for s, g in groups.items() if self.server_of[s] is server}
            if not mine:
                continue
            if server.down_since is not None and not self._up(server):
                self._defer(server, mine)
                continue
            if self._call(server, lambda: self._ack_on(server, mine), False) is False:
                self._defer(server, mine)
        return sum(self.trained)

    def _ack_on(self, server: _Server, groups: dict[int, tuple[list, list]]) -> bool:
        if server.cluster or len(groups) == 1:  # a cluster pipeline takes no EVAL; one shard needs no pipeline
            for s, (ids, counts) in groups.items():
                self.trained[s] = self.streams[s].ack(ids, counts)
            return True
        pipe = server.client.pipeline(transaction=False)
        for s, (ids, counts) in groups.items():
            self.streams[s].queue_ack(pipe, ids, counts)
        for s, trained in zip(groups, pipe.execute()):
            self.trained[s] = int(trained)
        return True

    def _defer(self, server: _Server, groups: dict[int, tuple[list, list]]) -> None:
        with self.deferred_lock:
            first = not server.deferred
            for s, group in groups.items():
                kept = server.deferred.setdefault(s, ([], []))
                server.deferred[s] = tuple(a + b for a, b in zip(kept, group))
        if first:
            log.warning("shard server %s is down: acks of unrolls trained on wait for it (the entries stay "
                        "pending there)", _where(server))

    def _flush_deferred(self, server: _Server) -> None:
        """Send the acks kept while `server` was down, if it answers now (the update's thread only: it
        alone adds to them)."""
        with self.deferred_lock:
            groups = dict(server.deferred)
        if self._call(server, lambda: self._ack_on(server, groups), False) is False:
            return
        with self.deferred_lock:
            server.deferred = {}
        log.info("sent %d acks kept while shard server %s was down", sum(len(g[0]) for g in groups.values()),
                 _where(server))

    def dead_letter(self, entry_id: ShardEntry, data: bytes, reason: str) -> None:
        """Dead-letter a rejected entry in its shard (`TrajectoryStream.dead_letter`); if its server is
        down now, the entry stays pending there and is re-read, and rejected, later."""
        s = entry_id.shard
        self._call(self.server_of[s], lambda: self.streams[s].dead_letter(entry_id.id, data, reason))

    # -- dead consumers ----------------------------------------------------------------------------
    def touch(self, consumer: str, entry_ids: list[ShardEntry]) -> None:
        """`TrajectoryStream.touch` of these entries in their shards (those of a down server wait)."""
        for s, (ids,) in self._by_shard(entry_ids).items():
            if self._up(self.server_of[s]):
                self._call(self.server_of[s], lambda: self.streams[s].touch(consumer, ids))

    def claim_stale(self, consumer: str, min_idle_ms: int, count: int = 100) -> int:
        """XAUTOCLAIM other consumers' idle entries in every reachable shard; returns how many."""
        return sum(self._call(server, lambda: stream.claim_stale(consumer, min_idle_ms, count), 0)
                   for stream, server in zip(self.streams, self.server_of) if self._up(server))

    def remove_idle_consumers(self, keep: str, min_idle_ms: int) -> list[str]:
        """Remove idle consumers with nothing pending from every reachable shard's group (names, once each)."""
        removed: list[str] = []
        for stream, server in zip(self.streams, self.server_of):
            if self._up(server):
                removed += self._call(server, lambda: stream.remove_idle_consumers(keep, min_idle_ms), [])
        return sorted(set(removed))

    # -- accounting --------------------------------------------------------------------------------
    def accounting(self) -> dict[str, float]:
        """`TrajectoryStream.accounting` summed over the shards (each read atomically; a down server's
        shards count as last read). Per-shard backlogs are left in `backlogs`."""
        total = {"produced": 0, "trained": 0, "dead_lettered": 0, "backlog": 0, "throttled_s": 0.0, "env_steps": 0}
        for s, (stream, server) in enumerate(zip(self.streams, self.server_of)):
            counts = self._call(server, stream.accounting) if self._up(server) else None
            counts = counts or self.last_counts[s]
            if counts is None:
                continue
            self.last_counts[s] = counts
            self.trained[s] = counts["trained"]
            self.backlogs[s] = counts["backlog"]
            for k in total:
                total[k] += counts[k]
        return total


def _where(server: _Server) -> str:
    return _safe(server.url)  # never the password
