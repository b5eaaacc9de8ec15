"""Start-up that an orchestrator can read: a Redis that does not answer yet is waited for (--wait-redis)
and then has an exit code of its own (4), apart from a bad config or URL (2). Real processes and a real
redis-server, no mocks; each `run.py` process pays about 3 s of CPU for importing torch, so there are two.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from impala_league import REPO
from impala_league.distributed.launch.children import describe_exit
from impala_league.distributed.launch.embedded_redis import redis_server_binary
from impala_league.distributed.launch.ownership import PEER_LOST_EXIT, REDIS_UNREACHABLE_EXIT, USER_ERROR_EXIT
from impala_league.distributed.wire import keys
from impala_league.distributed.wire.transport import RedisUnavailable, RedisUnreachable, connect

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's

TICTACTOE = str(REPO / "configs/tictactoe.yaml")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exit_codes_are_distinct_and_named():
    assert len({USER_ERROR_EXIT, PEER_LOST_EXIT, REDIS_UNREACHABLE_EXIT} | {0, 1}) == 5
    assert describe_exit(REDIS_UNREACHABLE_EXIT) == "exited with code 4 (Redis unreachable at start)"
    assert describe_exit(1) == "exited with code 1"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"


# -- connect(wait_s=...) in this process ------------------------------------------------------------

def test_connect_waits_for_an_unreachable_redis_then_names_it(caplog):
    url = f"redis://:s3cret@127.0.0.1:{closed_port()}/0"
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="transport"), pytest.raises(RedisUnreachable) as info:
        connect(url, wait_s=1.0)
    took = time.monotonic() - start
    assert 1.0 <= took < 3.0, took
    assert f"cannot reach Redis at redis://***@127.0.0.1:{url.rsplit(':', 1)[1]} (waited 1 s)" in str(info.value)
    waiting = [r.getMessage() for r in caplog.records if "does not answer yet" in r.getMessage()]
    assert len(waiting) == 1 and "waiting up to 1 s" in waiting[0], waiting  # one line, not one per try
    assert "s3cret" not in str(info.value) + caplog.text


def test_a_refused_password_is_not_waited_for(redis_server):
    start = time.monotonic()
    with pytest.raises(RedisUnavailable, match="refused the password") as info:
        connect(f"redis://:WRONG@127.0.0.1:{redis_server.port}/0", wait_s=10.0)
    assert not isinstance(info.value, RedisUnreachable)  # exit code 2: waiting would not fix it
    assert time.monotonic() - start < 2.0


def test_an_untrusted_certificate_is_not_waited_for(tmp_path):
    """TLS to a server whose certificate the client does not trust is a setting to fix (exit code 2)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no openssl to make a test certificate: {e}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def handshake() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with contextlib.suppress(OSError):
                    context.wrap_socket(conn, server_side=True).close()

    threading.Thread(target=handshake, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(RedisUnavailable, match="TLS handshake failed.*certificate") as info:
            connect(f"rediss://:s3cret@127.0.0.1:{server.getsockname()[1]}/0", wait_s=10.0)
    finally:
        server.close()
    assert not isinstance(info.value, RedisUnreachable)
    assert time.monotonic() - start < 5.0


# -- run.py roles -----------------------------------------------------------------------------------

class Output:
    """The merged stdout and stderr of a process, line by line, each with the monotonic time it came."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float) -> float:
        """The time the first line containing `text` came, waiting up to `timeout` seconds for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if text in line:
                    return at
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} within {timeout} s:\n{self.text()}")

    def text(self) -> str:
        self._thread.join(0.5)
        return "\n".join(line for _, line in self.lines)


def start_role(role: str, cwd: Path, *args: str) -> tuple[subprocess.Popen, Output]:
    env = {k: v for k, v in os.environ.items() if k not in ("IMPALA_REDIS_URL", "IMPALA_RUN_OWNER")}
    proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), role, "--config", TICTACTOE, *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, Output(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_learner_exits_4_naming_the_url_once_wait_redis_has_passed(tmp_path):
    port = closed_port()
    proc, out = start_role("learner", tmp_path, "--redis-url", f"redis://:s3cret@127.0.0.1:{port}/0",
                           "--wait-redis", "2")
    try:
        began = out.wait_for("does not answer yet", timeout=90)  # after torch's import and the config
        code = proc.wait(timeout=30)
    finally:
        stop(proc)
    ended = time.monotonic()
    text = out.text()
    assert code == REDIS_UNREACHABLE_EXIT, text
    assert 1.8 <= ended - began < 12, ended - began  # the wait, then a prompt exit (loose: a busy CPU)
    assert text.count("does not answer yet") == 1 and "waiting up to 2 s" in text
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text
    assert f"cannot reach Redis at redis://***@127.0.0.1:{port}/0 (waited 2 s)" in errors[0]
    assert "--wait-redis SECONDS" in errors[0] and "exit code 4" in errors[0]
    assert "Traceback" not in text and "s3cret" not in text
    assert not (tmp_path / "runs").exists()  # nothing written before Redis answered


def test_actor_waits_for_a_redis_that_starts_later_and_runs_on(tmp_path, run_name):
    port, password = closed_port(), "later-pw"
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    proc, out = start_role("actor", tmp_path, "--redis-url", url, "--wait-redis", "5", "--set",
                           f"run.name={run_name}", "--set", "actor.num_envs=2")
    server = None
    try:
        out.wait_for("does not answer yet", timeout=90)
        time.sleep(1.0)
        server = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--requirepass",
                                   password, "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = connect(url, wait_s=5.0)
        deadline = time.monotonic() + 60
        while not client.exists(keys.actor_id(run_name, 0)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, out.text()  # it connected, took its id and waits for the learner's weights
        assert client.exists(keys.actor_id(run_name, 0)), out.text()
        client.set(keys.done(run_name), 1)  # the run is over: the actor stops as at a learner's end
        code = proc.wait(timeout=30)
        client.close()
    finally:
        stop(proc)
        if server is not None:
            server.terminate()
            server.wait(10)
    text = out.text()
    assert code == 0, text
    assert text.count("does not answer yet") == 1 and "error:" not in text
