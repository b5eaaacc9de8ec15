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

Failures (docs/architecture.md, "Failures and recovery"): every client made by `connect` retries a lost
connection with capped exponential backoff for `run.redis_retry_s` (`RetryPolicy`); a group read that
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
import os
import ssl
import threading
import time
from typing import Any, Callable

import msgpack
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry

from impala_league.config import UserError
from impala_league.distributed.wire import keys

log = logging.getLogger("transport")

GROUP = "learners"
RESULTS_MAXLEN = 100_000  # episode results are statistics: the oldest may be trimmed


class RedisUnavailable(UserError, RuntimeError):
    """Redis cannot be reached; the message says where and what to check."""


class RedisUnreachable(RedisUnavailable):
    """Redis did not answer `connect`'s first PING: nothing listens at the address, the connection timed
    out, or the server is still loading its data. Unlike a wrong URL or a refused password this may pass,
    so the roles exit with a code of its own (`ownership.REDIS_UNREACHABLE_EXIT`): start again later."""


class RedisGaveUp(redis.ConnectionError):
    """Redis stayed unreachable for longer than the retry policy's limit."""


class RetryPolicy(Retry):
    """How a client lives through a Redis outage (a restart, a network blip): the one retry policy of
    actors, learner and launcher, installed by `connect` as redis-py's connection-level `Retry`.

    A command that fails with a connection error or timeout is retried at once (a pooled connection is
    stale after a restart), then after 0.1, 0.2, 0.4 ... seconds, capped at `cap_s`, until it succeeds or
    Redis has been unreachable for `limit_s` (run.redis_retry_s): then RedisGaveUp is raised, which the
    processes turn into their RedisUnavailable exit. An outage is logged once when it starts and once when
    it ends, however many commands and threads wait on it. A refused password is never retried.

    Commands are re-sent after a lost connection, so one whose reply was lost may run twice: the
    commands the processes send are idempotent or do only what is not done yet (an actor's adds, see
    `TrajectoryStream.add`; acks count only what they acknowledged), except the XADD of episode results
    (`ResultsStream.add_many`), which may then record an episode twice.
    """

    def __init__(self, where: str, limit_s: float, base_s: float = 0.1, cap_s: float = 2.0):
        super().__init__(NoBackoff(), retries=-1)  # the schedule is ours: call_with_retry below
        self.where, self.limit_s, self.base_s, self.cap_s = where, limit_s, base_s, cap_s
        self.armed = False  # until connect's first PING succeeds: a wrong URL must fail fast, not wait
        self.outages = 0  # outages that ended with Redis back
        self.attempts = 0  # failed attempts, all outages together (no busy loop: tests bound it)
        self._down_since: float | None = None
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> "RetryPolicy":
        return self  # redis-py copies its retry into every connection: they must share one outage clock

    def call_with_retry(self, do: Callable[[], Any], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> Any:
        """Run `do` until it succeeds or the outage outlasts `limit_s` (redis-py's Retry interface)."""
        failures = 0
        while True:
            try:
                result = do()
            except self._supported_errors as error:
                if isinstance(error, (redis.AuthenticationError, RedisGaveUp)) or (
                        is_retryable is not None and not is_retryable(error)):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                if not self.armed:
                    raise
                down_for = self._failed(error)
                if failures == 1:
                    continue
                if down_for >= self.limit_s:
                    raise RedisGaveUp(f"Redis at {self.where} unreachable for {down_for:.0f} s "
                                      f"(run.redis_retry_s={self.limit_s:g}): {error}") from None
                time.sleep(min(self.base_s * 2 ** (failures - 2), self.cap_s, self.limit_s - down_for))
                continue
            if self._down_since is not None:
                self._recovered()
            return result

    def _failed(self, error: Exception) -> float:
        """Note a failed attempt; returns seconds since the outage began (logging its start once)."""
        with self._lock:
            self.attempts += 1
            now = time.monotonic()
            if self._down_since is None:
                self._down_since = now
                log.warning("pid %d: lost Redis at %s (%s: %s); retrying for up to %g s", os.getpid(), self.where,
                            type(error).__name__, error, self.limit_s)
            return now - self._down_since

    def _recovered(self) -> None:
        with self._lock:
            if self._down_since is not None:
                log.info("pid %d: Redis at %s is back after %.1f s", os.getpid(), self.where,
                         time.monotonic() - self._down_since)
                self._down_since = None
                self.outages += 1


def redis_outages(client: redis.Redis) -> int:
    """Outages that `client` lived through (0 for a client not made by `connect`)."""
    policy = client.get_retry()
    return policy.outages if isinstance(policy, RetryPolicy) else 0


def connect(url: str, *, block_ms: int = 1000, retry_s: float = 60.0, wait_s: float = 0.0) -> redis.Redis:
    """A client for `url` whose socket timeout exceeds any blocking read we issue, and which retries a
    lost connection for up to `retry_s` seconds (`RetryPolicy`).

    wait_s: how long to keep sending the first PING while Redis does not answer (a server that starts
    after this process); 0 tries once. One line is logged when the waiting begins.
    Raises RedisUnreachable if Redis has not answered PING by then, RedisUnavailable (with the host,
    never the password) for a bad URL, a refused password, or a server that is not a usable Redis.
    """
    # Block time and socket timeout are set together: a blocking XREADGROUP longer than the socket
    # timeout would surface as a TimeoutError (and, retried, would never return). `read` checks it.
    policy = RetryPolicy(_safe(url), retry_s)
    client = _client(url, socket_timeout=block_ms / 1000 + 10, connect_timeout=5, retry=policy)
    _first_ping(client, url, wait_s)
    policy.armed = True
    return client


def replica_client(url: str, timeout_s: float = 2.0) -> redis.Redis:
    """A client for a server the caller can do without, a read-only replica of the run's Redis
    (transport.params_urls): no retries and `timeout_s` to connect or answer, so a replica that is down
    costs one failed command (redis.RedisError) and the caller reads the run's Redis instead; no first
    PING, so a replica that is down now is tried again at the next command. Raises RedisUnavailable for a
    bad URL."""
    return _client(url, socket_timeout=timeout_s, connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0))


def _client(url: str, *, socket_timeout: float, connect_timeout: float, retry: Retry) -> redis.Redis:
    """A redis-py client for `url` with our options. Raises RedisUnavailable (no password) for a bad URL."""
    try:
        # No CLIENT command on connect (redis-py's SETINFO and maintenance-notification handshakes):
        # the least-privilege ACL user of docs/cluster.md may not run CLIENT, and Redis logs every refusal.
        return redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                                    health_check_interval=30, retry=retry, driver_info=None,
                                    maint_notifications_config=MaintNotificationsConfig(enabled=False))
    except ValueError as e:  # bad scheme, port, db...: redis-py's message never holds the password
        raise RedisUnavailable(f"bad Redis URL {_safe(url)}: {e}; expected redis://[:password@]host:port/db") from None


WAIT_POLL_S = 0.5  # between first PINGs while waiting for a Redis that is not up yet


def _first_ping(client: redis.Redis, url: str, wait_s: float) -> None:
    """PING until Redis answers or `wait_s` has passed. The retry policy is not armed yet, so each PING
    fails at once: a wrong URL is reported without waiting out `run.redis_retry_s`."""
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        try:
            client.ping()
            return
        except redis.AuthenticationError as e:  # a ConnectionError to redis-py, but waiting will not fix it
            raise RedisUnavailable(f"Redis at {_safe(url)} refused the password: {e}") from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:  # BusyLoadingError included
            if _tls_refused(e):
                raise RedisUnavailable(f"cannot reach Redis at {_safe(url)}: the TLS handshake failed: {str(e).rstrip('.')}; check "
                                       "the URL's ssl_ca_certs (and ssl_certfile, ssl_keyfile) and the host name") from None
            left = deadline - time.monotonic()
            if left <= 0:
                waited = f" (waited {wait_s:g} s)" if wait_s > 0 else ""
                raise RedisUnreachable(f"cannot reach Redis at {_safe(url)}{waited}: {str(e).rstrip('.')}. Is "
                                       "redis-server running there, and is the URL (redis://[:password@]host:port/db) "
                                       "right?") from None
            if not waiting:
                log.warning("pid %d: Redis at %s does not answer yet (%s); waiting up to %g s for it", os.getpid(),
                            _safe(url), e, wait_s)
                waiting = True
            time.sleep(min(WAIT_POLL_S, left))
        except redis.RedisError as e:  # e.g. an HTTP server on that port, or a db index out of range
            raise RedisUnavailable(f"Redis at {_safe(url)} did not answer as a usable Redis: "
                                   f"{type(e).__name__}: {e}") from None


def _tls_refused(error: BaseException) -> bool:
    """Whether a failed connection is a TLS refusal (a certificate not trusted, a host name that does not
    match, TLS spoken to a plain port): a setting to fix, not a server to wait for. redis-py raises its
    ConnectionError while handling the ssl module's error, which it keeps as the context."""
    cause = error.__cause__ or error.__context__
    transient = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)  # a server going down mid-handshake
    return isinstance(cause, ssl.SSLError) and not isinstance(cause, transient)


def _safe(url: str) -> str:
    """The URL without its credentials (user info and query string), for messages and logs."""
    url = url.split("?", 1)[0]  # redis-py also reads ?password=... from the query string
    if "@" in url:
        scheme, rest = url.split("://", 1) if "://" in url else ("redis", url)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"  # a password may itself contain '@'
    return url


def shard_namespace(namespace: str, shard: int, cluster: bool = False) -> str:
    """Key prefix of trajectory shard `shard` of `namespace` (the run, or `{run}:{P}` for exploiter P).

    Shard 0 is `namespace` itself; shard s > 0 is `{<namespace>:s<s>}`, a Redis Cluster hash tag that
    puts every key of the shard in one slot (see the module doc). On a Redis Cluster (`cluster`) shard 0
    is tagged too, `{<namespace>:s0}`: untagged keys spread over slots, and its scripts would be refused."""
    return namespace if shard == 0 and not cluster else f"{{{namespace}:s{shard}}}"


def connect_shard(url: str, *, block_ms: int = 1000, retry_s: float = 60.0) -> redis.Redis | RedisCluster:
    """A client for the server of a trajectory shard (`transport.shard_urls`): `connect`'s, or a
    `RedisCluster` client (redis-py's own reconnects and slot routing) when that server is a node of a
    Redis Cluster. Raises RedisUnavailable as `connect`."""
    client = connect(url, block_ms=block_ms, retry_s=retry_s)
    try:
        cluster = bool(client.info("cluster").get("cluster_enabled"))
    except redis.ResponseError:  # an ACL user without INFO: a plain server, as far as we can tell
        cluster = False
    if not cluster:
        return client
    client.close()
    return RedisCluster.from_url(url, socket_timeout=block_ms / 1000 + 10, socket_connect_timeout=5)


def actor_shard(actor_id: int, shards: int) -> int:
    """The shard actor `actor_id` writes to: actor_id % shards (ids are dense from 0, so shards fill evenly)."""
    return actor_id % shards


def shard_urls(run_url: str, shards: int, urls: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The Redis URL of each of `shards` shards: `urls[s % len(urls)]`, or `run_url` for all when `urls`
    is empty. A shard URL carries no credentials (config.yaml keeps `transport.shard_urls`): it gets the
    user and password of `run_url`."""
    if not urls:
        return [run_url] * shards
    return [with_credentials(run_url, urls[s % len(urls)]) for s in range(shards)]


def with_credentials(run_url: str, url: str) -> str:
    """`url` (a server named in the config, which carries no credentials) with the user and password of
    `run_url`, the run's Redis; `url` itself when it has its own or `run_url` has none."""
    credentials = run_url.split("://", 1)[-1].rsplit("@", 1)[0] + "@" if "@" in run_url else ""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{credentials}{rest}" if "@" not in rest else url


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

    Two learners on one run would each count frames, publish interleaved weight versions, overwrite
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
