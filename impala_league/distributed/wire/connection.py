"""Connections to a run's Redis servers: `connect` (a first PING, then retries of a lost connection by
`RetryPolicy` for `run.redis_retry_s`), clients of read-only replicas (`replica_client`) and of the
trajectory shards' servers (`connect_shard`, `shard_urls`, `with_credentials`), and the errors that name
the server without its password (`RedisUnavailable`, `RedisUnreachable`, `RedisGaveUp`). `transport.py`
holds the streams and leases read and written through these clients, and re-exports these names.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from typing import Any, Callable

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry

from impala_league.config import UserError

log = logging.getLogger("transport")  # the streams' logger: one name for the wire's log lines


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
