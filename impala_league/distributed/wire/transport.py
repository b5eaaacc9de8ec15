"""Redis Streams transport: trajectories, episode results, dead letters. Keys are namespaced by run.

Keys (see docs/architecture.md):
  {run}:traj        stream of unrolls, field `data` = codec bytes; consumer group `learners`
  {run}:results     stream of finished episodes (msgpack map), read by the learner/league for metrics
  {run}:deadletter  stream of rejected entries: `reason`, `entry_id`, `data`
  {run}:deadletter:count  counter of rejected entries
  {run}:traj:produced  hash: actor (`{actor_id}-{token}`) -> unrolls it has added, set with its XADDs
  {run}:traj:throttled hash: actor -> seconds it has waited for room (backpressure)
  {run}:traj:env_steps hash: actor -> env steps it has played (each env.step once, whoever acted)
  {run}:traj:trained   counter of unrolls acked after an update trained on them
  {run}:done        set by the learner when the run is over; actors exit when they see it

Shards (`transport.shards` = S, `shard_namespace`): actor i writes to shard i % S, the learner reads every
shard. Shard 0 is the keys above, unchanged (so S=1 is the unsharded run, and a run given more shards
still drains its old stream). Shard s > 0 has the same trajectory keys under the prefix `{<run>:s<s>}`:
  {run:s1}:traj, {run:s1}:traj:produced, :throttled, :trained, {run:s1}:deadletter, :count
The braces are a Redis Cluster hash tag: all keys of one shard hash to one slot (the Lua scripts below
touch several of them) and different shards spread over slots. An exploiter P's shards are `{<run>:P:s<s>}`.
On a Redis Cluster (`connect_shard`) shard 0 is tagged too: `{<run>:s0}:traj` ...
`transport.shard_urls` places shard s on shard_urls[s % len] (else all on the run's Redis); results,
params, leases and `done` stay on the run's Redis. The accounting below holds per shard, hence summed.

Unread and pending unrolls are never trimmed: actors apply backpressure instead (`wait_for_room`), and
the learner deletes an entry only after acknowledging it, i.e. after the update that used it.

Failures (docs/architecture.md, "Failures and recovery"): every client made by `connect` (connection.py,
whose names this module re-exports) retries a lost connection with capped exponential backoff for `run.redis_retry_s` (`RetryPolicy`); a group read that
answers NOGROUP recreates the group and counts the loss (`TrajectoryStream.read`); unrolls pending on a
dead consumer are claimed by the live learner and the consumer is then removed (`DeadConsumerSweeper`).

Accounting ("Delivery accounting" in docs/architecture.md): every unroll an actor produced is trained
on, dead-lettered, or still in the stream:
  sum(produced) == trained + dead-lettered + backlog.
Each side's scripts do their work once however often they are re-sent: an actor's adds go in the same
script as its `produced` count and are skipped when that count shows them done (`add`), and the
learner's counters change in the same script as the XACK and count only entries that the XACK
acknowledged. So no unroll is added twice, and the learner needs no duplicate check.
"""

from __future__ import annotations

import logging
import math
import threading
import time

import msgpack
import redis
from redis.cluster import RedisCluster

from impala_league.config import UserError
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.connection import (RedisGaveUp, RedisUnavailable, RedisUnreachable, RetryPolicy,
                                                       actor_shard, connect, connect_shard, redis_outages,
                                                       replica_client, shard_namespace, shard_urls, with_credentials)

__all__ = [  # connection.py's names, re-exported: the roles import the wire from here
    "RedisGaveUp", "RedisUnavailable", "RedisUnreachable", "RetryPolicy", "actor_shard", "connect", "connect_shard",
    "redis_outages", "replica_client", "shard_namespace", "shard_urls", "with_credentials",
    "GROUP", "RESULTS_MAXLEN", "DeadConsumerSweeper", "LeaseHeld", "LearnerLease", "ResultsStream",
    "TrajectoryStream", "run_is_over",
]

log = logging.getLogger("transport")

GROUP = "learners"
RESULTS_MAXLEN = 100_000  # episode results are statistics: the oldest may be trimmed


class TrajectoryStream:
    """The `{run}:traj` stream seen by actors (`add`, `wait_for_room`) and learners (`read`, `ack`).
    `name` gives another stream the same delivery rules (A3C's gradients: `{run}:grads`); `shard`
    names one of the run's trajectory shards (`shard_namespace`; 0: the run's own keys)."""

    def __init__(self, client: redis.Redis | RedisCluster, run: str, name: str = "traj", shard: int = 0):
        self.r = client
        self.shard = shard
        prefix = shard_namespace(run, shard, cluster=isinstance(client, RedisCluster))
        self.key = keys.stream(prefix, name)
        self.deadletter_key = keys.deadletter(prefix)
        self.deadletter_count_key = keys.deadletter(prefix, count=True)
        self.produced_key = keys.stream_counter(self.key, "produced")
        self.throttled_key = keys.stream_counter(self.key, "throttled")
        self.env_steps_key = keys.stream_counter(self.key, "env_steps")
        self.trained_key = keys.stream_counter(self.key, "trained")
        self.group_losses = 0  # times the stream and its group were found gone (see `read`)
        self.last_backlog: tuple[int, float] | None = None  # (backlog, monotonic time) of the last count

    # -- actor side ---------------------------------------------------------------------------------
    def add(self, payloads: list[bytes], producer: str | None = None, produced: int = 0,
            throttled_s: float = 0.0, env_steps: int = 0) -> int:
        """XADD encoded stream entries in one atomic script (never with MAXLEN: that could drop unread
        unrolls).

        With `producer` (an actor's `{actor_id}-{token}`, unique to the process), the same script sets
        its field of `{run}:traj:produced` to `produced`, the unrolls it has added so far, this call's
        included, and adds nothing when that field already holds `produced` or more: a call re-sent after
        a lost reply (the retry policy does that) finds its adds done and does not repeat them, so every
        unroll is in the stream once. A producer's calls must therefore raise `produced`. Its field of
        `{run}:traj:throttled` is set to `throttled_s`, the seconds it has waited for room so far
        (`wait_for_room`), from which the learner tells what the actors would produce unthrottled, and
        its field of `{run}:traj:env_steps` to `env_steps`, the env steps it has played so far.
        Without `producer` the entries are added unconditionally (a re-sent call adds them again).

        Returns the backlog after the adds (counted in the same round trip; see `backlog`).
        """
        throttled = f"{throttled_s:.3f}" if producer is not None and throttled_s else ""
        steps = int(env_steps) if producer is not None and env_steps else ""
        n = int(self.r.eval(_ADD_ONCE, 4, self.key, self.produced_key, self.throttled_key, self.env_steps_key,
                            producer or "", produced, throttled, steps, *payloads))
        self.last_backlog = (n, time.monotonic())
        return n

    def backlog(self) -> int:
        """Unrolls in the stream: unread plus delivered-but-unacked (acked ones are deleted)."""
        n = self.r.xlen(self.key)
        self.last_backlog = (n, time.monotonic())
        return n

    def wait_for_room(self, high_water_mark: int, should_stop: Callable[[], bool] = lambda: False,
                      poll_s: float = 0.05, backlog: int | None = None) -> float:
        """Block while the backlog is above `high_water_mark`. Returns seconds waited.

        `backlog`: a count the caller already has (`add` returns one); at or below the mark it saves
        the round trip.
        """
        start = time.monotonic()
        if backlog is not None and backlog <= high_water_mark:
            return 0.0
        while self.backlog() > high_water_mark and not should_stop():
            time.sleep(poll_s)
        return time.monotonic() - start

    # -- learner side ------------------------------------------------------------------------------
    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) if missing; a racing creator is fine."""
        try:
            self.r.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def read(self, consumer: str, count: int, block_ms: int, pending_after: bytes | str | None = None
             ) -> list[tuple[bytes, bytes]]:
        """Up to `count` entries as (entry_id, data): new ones, or with `pending_after` set, this
        consumer's own delivered-but-unacked entries with ids above it (re-read after a restart;
        start with "0" and pass the last id seen to page through them).

        If the group is gone (NOGROUP: Redis restarted without persistence, or the key was deleted), the
        group is created again (`recreate_lost_group`) and the read returns no entries; the caller goes on.
        Raises ValueError if `block_ms` is not below the client's socket timeout (see `connect`).
        """
        pool = getattr(self.r, "connection_pool", None)  # (a RedisCluster client has one per node)
        timeout = pool.connection_kwargs.get("socket_timeout") if pool is not None else None
        if pending_after is None and timeout is not None and block_ms / 1000 >= timeout:
            raise ValueError(f"a read blocking {block_ms} ms needs a socket timeout above {block_ms / 1000:g} s, this "
                             f"client's is {timeout:g} s: make the client with connect(url, block_ms={block_ms})")
        try:
            reply = self.r.xreadgroup(GROUP, consumer, {self.key: ">" if pending_after is None else pending_after},
                                      count=count, block=block_ms if pending_after is None else None)
        except redis.ResponseError as e:
            if not str(e).startswith("NOGROUP"):
                raise
            self.recreate_lost_group()
            return []
        if not reply:
            return []
        # An entry deleted while pending comes back with no fields; it has nothing to train on.
        return [(eid, (fields or {}).get(b"data", b"")) for eid, fields in reply[0][1]]

    def recreate_if_lost(self) -> bool:
        """After a read of several streams answered NOGROUP: recreate this stream's group if it is the
        one gone, counting and logging the loss (`recreate_lost_group`). Returns whether it was."""
        try:
            self.r.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
            return False
        self._count_group_loss()
        return True

    def recreate_lost_group(self) -> None:
        """Create the group again after it was found gone, and count and log the loss.

        The unrolls that were in the stream went with it; their number is known only as of the last
        `backlog` count. A learner racing to recreate the group is fine (`ensure_group`).
        """
        self.ensure_group()
        self._count_group_loss()

    def _count_group_loss(self) -> None:
        self.group_losses += 1
        if self.last_backlog is None:
            lost = "an unknown number of unrolls"
        else:
            n, at = self.last_backlog
            lost = f"{n} unrolls (the count {time.monotonic() - at:.0f} s before)"
        log.warning("stream and group lost: %s and its group '%s' were gone (Redis restarted without its data?) "
                    "and are recreated; %s pending at the time were lost (loss %d of this run)",
                    self.key, GROUP, lost, self.group_losses)

    def remove_idle_consumers(self, keep: str, min_idle_ms: int) -> list[str]:
        """XGROUP DELCONSUMER each consumer but `keep` idle for `min_idle_ms` with nothing pending.

        DELCONSUMER drops a consumer's pending entries with it, so emptiness is checked in the same
        script that deletes: an entry delivered in between is never lost. Returns the removed names.
        """
        removed = []
        for info in self.r.xinfo_consumers(self.key, GROUP):
            name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
            if name != keep and info["idle"] >= min_idle_ms and info["pending"] == 0:
                if self.r.eval(_DELETE_IF_EMPTY, 1, self.key, GROUP, name) == 0:
                    removed.append(name)
        return removed

    def touch(self, consumer: str, entry_ids: list[bytes]) -> None:
        """Reset the idle time of entries pending on `consumer` (XCLAIM to itself, JUSTID: no delivery
        counted), so that no `claim_stale` takes them from a consumer that still holds them."""
        if entry_ids:
            self.r.xclaim(self.key, GROUP, consumer, 0, entry_ids, justid=True)

    def claim_stale(self, consumer: str, min_idle_ms: int, count: int = 100) -> int:
        """XAUTOCLAIM entries pending on other (dead) consumers for longer than `min_idle_ms`.

        They become this consumer's pending entries, so `read(pending_after="0")` returns them.
        """
        claimed, start = 0, "0-0"
        while True:
            reply = self.r.xautoclaim(self.key, GROUP, consumer, min_idle_ms, start_id=start, count=count)
            start, entries = reply[0], reply[1]
            claimed += len(entries)
            if start in (b"0-0", "0-0"):
                return claimed

    def ack(self, entry_ids: list[bytes], counts: list[int] | None = None) -> int:
        """Acknowledge and delete entries that an update has consumed, in one atomic script that also
        adds the unrolls of the entries acknowledged now (`counts`, one per entry; default 1 each) to
        `{run}:traj:trained`. Returns the trained count after this call."""
        if not entry_ids:
            return int(self.r.get(self.trained_key) or 0)
        return int(self.r.eval(_ACK_COUNTED, 2, self.key, self.trained_key, *_ack_args(entry_ids, counts)))

    def queue_ack(self, pipe: redis.client.Pipeline, entry_ids: list[bytes], counts: list[int] | None = None) -> None:
        """Queue `ack`'s script on `pipe` (several shards of one server acked in one round trip); the
        pipeline's reply for it is the trained count after it."""
        pipe.eval(_ACK_COUNTED, 2, self.key, self.trained_key, *_ack_args(entry_ids, counts))

    def dead_letter(self, entry_id: bytes, data: bytes, reason: str) -> None:
        """Move a rejected entry to `{run}:deadletter` with its reason, count it, and ack it (all only if
        it was still pending: a script re-sent after a lost reply does nothing the second time)."""
        self.r.eval(_DEAD_LETTER, 3, self.key, self.deadletter_key, self.deadletter_count_key,
                    GROUP, entry_id, reason[:1000], data[:1 << 20])

    def dead_lettered(self) -> int:
        return int(self.r.get(self.deadletter_count_key) or 0)

    def accounting(self) -> dict[str, float]:
        """Where the unrolls of this stream went (see the module doc): `produced` (by all actors),
        `trained`, `dead_lettered` and `backlog` (unread or pending), read atomically;
        `throttled_s`, the seconds all its actors have waited for room (backpressure); and `env_steps`,
        the env steps all its actors have played."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hvals(self.produced_key)
        pipe.get(self.trained_key)
        pipe.get(self.deadletter_count_key)
        pipe.xlen(self.key)
        pipe.hvals(self.throttled_key)
        pipe.hvals(self.env_steps_key)
        produced, trained, dead, backlog, throttled, env_steps = pipe.execute()
        return {"produced": sum(int(n) for n in produced), "trained": int(trained or 0),
                "dead_lettered": int(dead or 0), "backlog": backlog,
                "throttled_s": sum(float(s) for s in throttled), "env_steps": sum(int(n) for n in env_steps)}


# Scripts go by EVAL, not EVALSHA: a Redis restarted between SCRIPT LOAD and EVALSHA would answer
# NOSCRIPT to the retried command, and the user needs no SCRIPT permission.
# An actor's adds, done once: skipped when the producer's `produced` field already shows them (a
# re-sent script); the backlog after them is returned either way.
# KEYS: stream, produced hash, throttled hash, env steps hash; ARGV: producer ('' = none), produced,
# throttled ('' = leave), env steps ('' = leave), entries.
_ADD_ONCE = """
local new = ARGV[1] == '' or tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '-1') < tonumber(ARGV[2])
if new then
  for i = 5, #ARGV do redis.call('XADD', KEYS[1], '*', 'data', ARGV[i]) end
  if ARGV[1] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
  if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[3]) end
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[4], ARGV[1], ARGV[4]) end
end
return redis.call('XLEN', KEYS[1])
"""

# Acks entries and adds their unrolls to the trained counter. Each entry's XACK on its own: only the
# unrolls of entries still pending count (a script re-sent after a lost reply counts nothing the second time).
# KEYS: stream, counter; ARGV: group, n, n entry ids, n unroll counts.
_ACK_COUNTED = """
local n = tonumber(ARGV[2])
local acked = 0
for i = 3, 2 + n do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then acked = acked + tonumber(ARGV[i + n]) end
end
redis.call('XDEL', KEYS[1], unpack(ARGV, 3, 2 + n))
return redis.call('INCRBY', KEYS[2], acked)
"""


def _ack_args(entry_ids: list[bytes], counts: list[int] | None) -> list:
    """ARGV of _ACK_COUNTED; no `counts`: one unroll per entry."""
    return [GROUP, len(entry_ids), *entry_ids, *(counts or [1] * len(entry_ids))]


# KEYS: stream, dead-letter stream, its counter; ARGV: group, entry id, reason, data.
_DEAD_LETTER = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 10000, '*', 'entry_id', ARGV[2], 'reason', ARGV[3], 'data', ARGV[4])
  redis.call('INCR', KEYS[3])
end
redis.call('XDEL', KEYS[1], ARGV[2])
return 0
"""


# XGROUP DELCONSUMER KEYS[1] ARGV[1] ARGV[2] if that consumer has no pending entry; -1 if it has.
_DELETE_IF_EMPTY = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) == 0 then
  return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
return -1
"""


class DeadConsumerSweeper:
    """Gives the unrolls left pending by dead consumers to a live learner, then forgets those consumers.

    A consumer that dies (a learner killed on another host, or one renamed by a new hostname) keeps its
    delivered-but-unacked entries forever: nobody would train on them, and they count against the
    actors' high-water mark. Every `every_s` seconds `claim_due` XAUTOCLAIMs the entries idle for
    `min_idle_ms` (they become pending on `consumer`, to be re-read from its pending list), then removes
    every other consumer idle as long whose pending list is empty (`remove_idle_consumers`).
    """

    def __init__(self, stream: TrajectoryStream, consumer: str, min_idle_ms: int = 60_000, every_s: float = 60.0):
        self.stream = stream
        self.consumer = consumer
        self.min_idle_ms = min_idle_ms
        self.every_s = every_s
        self.next_at = time.monotonic() + every_s
        self.claimed = 0  # entries claimed, all sweeps together
        self.removed: list[str] = []  # consumers removed, all sweeps together

    def claim_due(self) -> int:
        """Sweep if one is due. Returns the entries claimed by this call (0 when none or not due)."""
        if time.monotonic() < self.next_at:
            return 0
        self.next_at = time.monotonic() + self.every_s
        try:
            claimed = self.stream.claim_stale(self.consumer, self.min_idle_ms)
            removed = self.stream.remove_idle_consumers(self.consumer, self.min_idle_ms)
        except redis.ResponseError as e:
            if "NOGROUP" in str(e) or "no such key" in str(e):
                return 0  # the group is gone: the next read recreates it and counts the loss
            raise
        if claimed:
            log.info("claimed %d unrolls left pending by dead consumers of %s", claimed, self.stream.key)
        if removed:
            log.info("removed dead consumers with nothing pending from group '%s': %s", GROUP, ", ".join(removed))
        self.claimed += claimed
        self.removed += removed
        return claimed


def _valid_result(result: dict) -> bool:
    """The fields the learner aggregates are numbers (a string or a list there would crash np.mean)."""
    def number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    return (number(result.get("winner", -1)) and number(result.get("length", 0))
            and -1 <= result.get("winner", -1) <= 64 and 0 <= result.get("length", 0) <= 1e9
            and number(result.get("learner_seat", -1)) and isinstance(result.get("player", ""), str)
            and isinstance(result.get("opponent_id", ""), str))


class ResultsStream:
    """`{run}:results`: one msgpack map per finished episode."""

    def __init__(self, client: redis.Redis, run: str):
        self.r = client
        self.key = keys.results(run)
        self.last_id = "0-0"

    def add_many(self, results: list[dict]) -> None:
        if results:
            pipe = self.r.pipeline(transaction=False)
            for result in results:
                pipe.xadd(self.key, {"data": msgpack.packb(result)}, maxlen=RESULTS_MAXLEN, approximate=True)
            pipe.execute()

    def read_new(self, count: int = 10_000) -> list[dict]:
        """Results added since the previous call (from the start of the stream on the first call)."""
        reply = self.r.xread({self.key: self.last_id}, count=count)
        out = []
        if reply:
            for eid, fields in reply[0][1]:
                self.last_id = eid
                try:
                    result = msgpack.unpackb(fields[b"data"])
                except (KeyError, ValueError, msgpack.UnpackException):
                    continue  # a malformed result only costs one statistic
                if isinstance(result, dict) and _valid_result(result):
                    out.append(result)
        return out

    def read_group(self, group: str, consumer: str, count: int = 10_000,
                   pending: bool = False) -> tuple[list[bytes], list[dict]]:
        """New results for consumer group `group` (created at the stream's end on first use), or with
        `pending` the ones delivered to `consumer` earlier but not acknowledged (after a crash).

        Returns (entry ids to `ack`, decoded results); malformed entries are in the ids but not in
        the results, so they are acknowledged and skipped.
        """
        try:
            self.r.xgroup_create(self.key, group, id="$", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        reply = self.r.xreadgroup(group, consumer, {self.key: "0" if pending else ">"}, count=count)
        ids, out = [], []
        for eid, fields in (reply[0][1] if reply else []):
            ids.append(eid)
            try:
                result = msgpack.unpackb(fields[b"data"])
            except (KeyError, ValueError, msgpack.UnpackException):
                continue
            if isinstance(result, dict) and _valid_result(result):
                out.append(result)
        return ids, out

    def ack(self, group: str, entry_ids: list[bytes]) -> None:
        if entry_ids:
            self.r.xack(self.key, group, *entry_ids)

    def skip_to_end(self) -> None:
        """Ignore results already in the stream (a resumed learner reports only new episodes)."""
        info = self.r.xinfo_stream(self.key) if self.r.exists(self.key) else None
        if info:
            self.last_id = info["last-generated-id"]


class LearnerLease:
    """`{run}:learner`: at most one learner trains a run (and `{run}:league`: one league manager).

    Two learners on one run would each count agent steps, publish interleaved weight versions, overwrite
    each other's checkpoints and, holding unacked entries that count against the actors'
    high-water mark, can starve each other. The key names its holder and expires unless the holder
    refreshes it (a background thread does, every TTL / 3), so a killed learner's lease lapses by itself.
    """

    TTL_MS = 10_000
    _REFRESH = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end "
                "return 0")
    _RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

    def __init__(self, client: redis.Redis, run: str, holder: str, role: str = "learner",
                 ttl_s: float | None = None):
        if ttl_s is not None:  # run.lease_ttl_s; TTL_MS (10 s) otherwise
            self.TTL_MS = max(1, round(ttl_s * 1000))
        self.r = client
        self.run = run
        self.role = role
        self.key = keys.lease(run, role)
        self.holder = holder
        self._stop = threading.Event()

    def acquire(self, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Take the lease, waiting up to one TTL for a lapsed holder's. Returns False if told to stop.

        Raises LeaseHeld when another live learner keeps it.
        """
        deadline = time.monotonic() + self.TTL_MS / 1000 + 1
        logged = False
        while not self.r.set(self.key, self.holder, nx=True, px=self.TTL_MS):
            if should_stop():
                return False
            other = (self.r.get(self.key) or b"?").decode(errors="replace")
            if time.monotonic() > deadline:
                raise LeaseHeld(f"another {self.role} ({other}) is running for run '{self.run}' on this Redis; "
                                f"one {self.role} per run: stop it, or choose another run.name")
            if not logged:
                log.info("run '%s' is held by %s %s; waiting up to %.0f s for its lease to lapse",
                         self.run, self.role, other, self.TTL_MS / 1000)
                logged = True
            time.sleep(0.2)
        self._start_keeping()
        return True

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it, without waiting. Returns whether it was taken."""
        if not self.r.set(self.key, self.holder, nx=True, px=self.TTL_MS):
            return False
        self._start_keeping()
        return True

    def holder_now(self) -> str:
        """Who holds the lease now ("?" if nobody)."""
        return (self.r.get(self.key) or b"?").decode(errors="replace")

    def _start_keeping(self) -> None:
        threading.Thread(target=self._keep, name=f"{self.role}-lease", daemon=True).start()

    def _keep(self) -> None:
        warned = False
        while not self._stop.wait(self.TTL_MS / 3000):
            try:
                if not self.r.eval(self._REFRESH, 1, self.key, self.holder, self.TTL_MS):
                    warned = self._retake(warned)
            except redis.RedisError:
                pass  # the main thread meets the same error and reports it

    def _retake(self, warned: bool) -> bool:
        """The lease is not ours any more: Redis lost it (restart without persistence) or an outage
        outlasted its TTL. Take it again if free; say so once if another learner has it. Returns warned."""
        if self.r.set(self.key, self.holder, nx=True, px=self.TTL_MS):
            log.warning("the %s lease of run '%s' had lapsed (Redis lost it, or was unreachable for longer than "
                        "%d s); taken again", self.role, self.run, self.TTL_MS // 1000)
            return False
        if not warned:
            other = (self.r.get(self.key) or b"?").decode(errors="replace")
            log.error("run '%s' is now held by another %s (%s) after this one's lease lapsed; stop one of them",
                      self.run, self.role, other)
        return True

    def release(self) -> None:
        self._stop.set()
        try:
            self.r.eval(self._RELEASE, 1, self.key, self.holder)
        except redis.RedisError:
            pass  # it lapses by itself


class LeaseHeld(UserError, RuntimeError):
    """Another learner holds the run; the message names it."""


def run_is_over(client: redis.Redis, run: str) -> bool:
    """Whether run `run` has ended (its done key is set); False when Redis does not answer, so that a
    role that cannot tell counts as stopped before the end."""
    try:
        return bool(client.exists(keys.done(run)))
    except redis.RedisError:
        return False
