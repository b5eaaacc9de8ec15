"""Redis Streams transport: trajectories, episode results, dead letters. Keys are namespaced by run.

Keys (see docs/architecture.md):
  {run}:traj        stream of unrolls, field `data` = codec bytes; consumer group `learners`
  {run}:results     stream of finished episodes (msgpack map), read by the learner/league for metrics
  {run}:deadletter  stream of rejected entries: `reason`, `entry_id`, `data`
  {run}:deadletter:count  counter of rejected entries
  {run}:done        set by the learner when the run is over; actors exit when they see it

Unread and pending unrolls are never trimmed: actors apply backpressure instead (`wait_for_room`), and
the learner deletes an entry only after acknowledging it, i.e. after the update that used it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

import msgpack
import redis

log = logging.getLogger("transport")

GROUP = "learners"
RESULTS_MAXLEN = 100_000  # episode results are statistics: the oldest may be trimmed


class RedisUnavailable(RuntimeError):
    """Redis cannot be reached; the message says where and what to check."""


def connect(url: str, *, block_ms: int = 1000) -> redis.Redis:
    """A client for `url` whose socket timeout exceeds any blocking read we issue.

    Raises RedisUnavailable with the host (never the password) if Redis does not answer PING.
    """
    # A blocking XREADGROUP longer than the socket timeout would surface as a TimeoutError.
    try:
        client = redis.Redis.from_url(url, socket_timeout=block_ms / 1000 + 10, socket_connect_timeout=5,
                                      health_check_interval=30)
    except ValueError as e:  # bad scheme, port, db...: redis-py's message never holds the password
        raise RedisUnavailable(f"bad Redis URL {_safe(url)}: {e}; expected redis://[:password@]host:port/db") from None
    try:
        client.ping()
    except redis.AuthenticationError as e:
        raise RedisUnavailable(f"Redis at {_safe(url)} refused the password: {e}") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        raise RedisUnavailable(f"cannot reach Redis at {_safe(url)}: {e}. Is redis-server running there, "
                               f"and is the URL (redis://[:password@]host:port/db) right?") from None
    except redis.RedisError as e:  # e.g. an HTTP server on that port, or a db index out of range
        raise RedisUnavailable(f"Redis at {_safe(url)} did not answer as a usable Redis: "
                               f"{type(e).__name__}: {e}") from None
    return client


def _safe(url: str) -> str:
    """The URL without its credentials (user info and query string), for messages and logs."""
    url = url.split("?", 1)[0]  # redis-py also reads ?password=... from the query string
    if "@" in url:
        scheme, rest = url.split("://", 1) if "://" in url else ("redis", url)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"  # a password may itself contain '@'
    return url


class TrajectoryStream:
    """The `{run}:traj` stream seen by actors (`add`, `wait_for_room`) and learners (`read`, `ack`)."""

    def __init__(self, client: redis.Redis, run: str):
        self.r = client
        self.key = f"{run}:traj"
        self.deadletter_key = f"{run}:deadletter"
        self.deadletter_count_key = f"{run}:deadletter:count"

    # -- actor side --------------------------------------------------------------------------------
    def add(self, payloads: list[bytes]) -> None:
        """XADD encoded unrolls in one round trip (never with MAXLEN: that could drop unread unrolls)."""
        pipe = self.r.pipeline(transaction=False)
        for data in payloads:
            pipe.xadd(self.key, {"data": data})
        pipe.execute()

    def backlog(self) -> int:
        """Unrolls in the stream: unread plus delivered-but-unacked (acked ones are deleted)."""
        return self.r.xlen(self.key)

    def wait_for_room(self, high_water_mark: int, should_stop: Callable[[], bool] = lambda: False,
                      poll_s: float = 0.05) -> float:
        """Block while the backlog is above `high_water_mark`. Returns seconds waited."""
        start = time.monotonic()
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
        start with "0" and pass the last id seen to page through them)."""
        reply = self.r.xreadgroup(GROUP, consumer, {self.key: ">" if pending_after is None else pending_after},
                                  count=count, block=block_ms if pending_after is None else None)
        if not reply:
            return []
        # An entry deleted while pending comes back with no fields; it has nothing to train on.
        return [(eid, (fields or {}).get(b"data", b"")) for eid, fields in reply[0][1]]

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

    def ack(self, entry_ids: list[bytes]) -> None:
        """Acknowledge and delete entries that an update has consumed (one round trip)."""
        if entry_ids:
            pipe = self.r.pipeline(transaction=False)
            pipe.xack(self.key, GROUP, *entry_ids)
            pipe.xdel(self.key, *entry_ids)
            pipe.execute()

    def dead_letter(self, entry_id: bytes, data: bytes, reason: str) -> None:
        """Move a rejected entry to `{run}:deadletter` with its reason, count it, and ack it."""
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(self.deadletter_key, {"entry_id": entry_id, "reason": reason[:1000], "data": data[:1 << 20]},
                  maxlen=10_000, approximate=True)
        pipe.incr(self.deadletter_count_key)
        pipe.xack(self.key, GROUP, entry_id)
        pipe.xdel(self.key, entry_id)
        pipe.execute()

    def dead_lettered(self) -> int:
        return int(self.r.get(self.deadletter_count_key) or 0)


def _valid_result(result: dict) -> bool:
    """The fields the learner aggregates are numbers (a string or a list there would crash np.mean)."""
    def number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    return (number(result.get("winner", -1)) and number(result.get("length", 0))
            and number(result.get("learner_seat", -1)) and isinstance(result.get("player", ""), str)
            and isinstance(result.get("opponent_id", ""), str))


class ResultsStream:
    """`{run}:results`: one msgpack map per finished episode."""

    def __init__(self, client: redis.Redis, run: str):
        self.r = client
        self.key = f"{run}:results"
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

    def read_group(self, group: str, consumer: str, count: int = 10_000) -> tuple[list[bytes], list[dict]]:
        """New results for consumer group `group` (created at the stream's end on first use).

        Returns (entry ids to `ack`, decoded results); malformed entries are in the ids but not in
        the results, so they are acknowledged and skipped.
        """
        try:
            self.r.xgroup_create(self.key, group, id="$", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        reply = self.r.xreadgroup(group, consumer, {self.key: ">"}, count=count)
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
    """`{run}:learner`: at most one learner trains a run.

    Two learners on one run would each count frames, publish interleaved weight versions, overwrite
    each other's checkpoints and, holding unacked entries that count against the actors'
    high-water mark, can starve each other. The key names its holder and expires unless the holder
    refreshes it (a background thread does, every TTL / 3), so a killed learner's lease lapses by itself.
    """

    TTL_MS = 10_000
    _REFRESH = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end "
                "return 0")
    _RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

    def __init__(self, client: redis.Redis, run: str, holder: str):
        self.r = client
        self.run = run
        self.key = f"{run}:learner"
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
                raise LeaseHeld(f"another learner ({other}) is training run '{self.run}' on this Redis; "
                                f"one learner per run: stop it, or choose another run.name")
            if not logged:
                log.info("run '%s' is held by learner %s; waiting up to %.0f s for its lease to lapse",
                         self.run, other, self.TTL_MS / 1000)
                logged = True
            time.sleep(0.2)
        threading.Thread(target=self._keep, name="learner-lease", daemon=True).start()
        return True

    def _keep(self) -> None:
        while not self._stop.wait(self.TTL_MS / 3000):
            try:
                self.r.eval(self._REFRESH, 1, self.key, self.holder, self.TTL_MS)
            except redis.RedisError:
                pass  # the main thread meets the same error and reports it

    def release(self) -> None:
        self._stop.set()
        try:
            self.r.eval(self._RELEASE, 1, self.key, self.holder)
        except redis.RedisError:
            pass  # it lapses by itself


class LeaseHeld(RuntimeError):
    """Another learner holds the run; the message names it."""


def run_done_key(run: str) -> str:
    return f"{run}:done"
