"""Security: TLS (`rediss://` with a CA), passwords never logged, and the least-privilege ACL user that
docs/cluster.md documents, tried with a real actor and learner."""

from __future__ import annotations

import logging
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from impala_league import REPO
from impala_league.distributed.launch.embedded_redis import EmbeddedRedis, free_port, redis_server_binary
from impala_league.distributed.wire.transport import RedisUnavailable, TrajectoryStream, connect
from tests.background import Background
from tests.distributed.test_delivery import run_learner_until
from tests.distributed.test_faults import encode, small_config, valid_unroll

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1 signed by it, server key)."""
    ca_key, ca, key, csr, cert, ext = (folder / n for n in ("ca.key", "ca.crt", "server.key", "server.csr",
                                                           "server.crt", "san.ext"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "1", "-subj", "/CN=impala test CA")
    openssl("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-out",
            str(cert), "-days", "1", "-extfile", str(ext))
    return ca, cert, key


@pytest.fixture
def tls_redis(tmp_path):
    """(port, password, CA file) of a redis-server that listens only with TLS; skipped without one."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make test certificates")
    ca, cert, key = make_certificates(tmp_path)
    password, port = secrets.token_hex(16), free_port()
    binary = redis_server_binary()
    proc = subprocess.Popen([binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--tls-cert-file",
                             str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients",
                             "no", "--requirepass", password, "--save", "", "--appendonly", "no"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read()
                if "tls" in out.lower() and ("Bad directive" in out or "FATAL CONFIG" in out):
                    pytest.skip(f"{binary} was built without TLS (a Debian redis-server has it)")
                pytest.fail(f"TLS redis-server did not start: {out}")
            try:
                redis.Redis(port=port, password=password, ssl=True, ssl_cert_reqs="none").ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        yield port, password, ca
    finally:
        proc.terminate()
        proc.wait(10)


def test_rediss_with_a_ca_certificate_carries_a_learner_update(tls_redis, tmp_path, run_name, caplog):
    port, password, ca = tls_redis
    url = f"rediss://:{password}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    client = connect(url)
    assert client.connection_pool.connection_class is redis.SSLConnection
    for reward in (1.0, -1.0):
        client.xadd(f"{run_name}:traj", {"data": encode(valid_unroll(reward))})
    from impala_league.distributed.learner.role import Learner

    with caplog.at_level(logging.DEBUG):
        learner = Learner(small_config(run_name, tmp_path), url, tmp_path / run_name)
        run_learner_until(learner, lambda: learner.step >= 1)
    assert learner.step == 1 and TrajectoryStream(client, run_name).accounting()["trained"] == 2
    assert password not in caplog.text and password not in (tmp_path / run_name / "metrics.jsonl").read_text()

    # Without the CA the server's certificate is refused; plain redis:// cannot talk to a TLS port.
    with pytest.raises(RedisUnavailable, match=r"cannot reach Redis at rediss://\*\*\*@127.0.0.1.*certificate") as e:
        connect(f"rediss://:{password}@127.0.0.1:{port}/0")
    assert password not in str(e.value)
    with pytest.raises(RedisUnavailable) as e:
        connect(f"redis://:{password}@127.0.0.1:{port}/0")
    assert password not in str(e.value)
    # The host name is checked too: the certificate names 127.0.0.1, not localhost.
    with pytest.raises(RedisUnavailable, match="match"):
        connect(f"rediss://:{password}@localhost:{port}/0?ssl_ca_certs={ca}")


def test_a_password_is_never_logged_nor_written(tmp_path, run_name, caplog):
    """A learner run through a forced reconnect and a Redis restart, with every logger at DEBUG; then
    the CLI with a wrong password, in the URL's user info and in its query string."""
    from impala_league.distributed.learner.role import Learner

    with EmbeddedRedis() as server:
        client = connect(server.url)
        for reward in (1.0, -1.0, 0.5, 0.0):
            client.xadd(f"{run_name}:traj", {"data": encode(valid_unroll(reward))})
        cfg = small_config(run_name, tmp_path, "learner.checkpoint_every_s=0.01")
        with caplog.at_level(logging.DEBUG):
            learner = Learner(cfg, server.url, tmp_path / run_name)
            thread = threading.Thread(target=learner.run)
            thread.start()
            deadline = time.monotonic() + 20
            while learner.step < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            client.client_kill_filter(_type="normal", skipme=True)  # every connection of the learner drops
            server.proc.kill()  # an outage, logged with the URL once the learner meets it
            deadline = time.monotonic() + 20
            while "lost Redis at" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.02)
            server.restart()
            deadline = time.monotonic() + 20
            while learner.step < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            learner.stop()
            thread.join(20)
        assert learner.step == 2
        assert re.search(r"lost Redis at redis://\*\*\*@127.0.0.1", caplog.text)
        port = server.port
    written = [p.read_bytes() for p in (tmp_path / run_name).rglob("*") if p.is_file()]
    assert all(server.password.encode() not in data for data in written)  # metrics, checkpoint, its JSON
    assert server.password not in caplog.text
    for url in (f"redis://:WRONG-s3cret@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0?password=WRONG-s3cret"):
        out = subprocess.run([sys.executable, str(REPO / "run.py"), "actor", "--config",
                              str(REPO / "configs/tictactoe.yaml"), "--redis-url", url], capture_output=True,
                             text=True, cwd=REPO, timeout=120)
        assert out.returncode != 0 and "cannot reach Redis at redis://" in out.stdout + out.stderr
        assert "s3cret" not in out.stdout + out.stderr


def documented_acl(run: str, password: str) -> list[str]:
    """docs/cluster.md's `ACL SETUSER` line for run `run`, split into arguments."""
    m = re.search(r"^ACL SETUSER (impala .+)$", (REPO / "docs" / "cluster.md").read_text(), re.M)
    assert m, "docs/cluster.md lost its ACL SETUSER line"
    return m.group(1).replace("<run>", run).replace("<password>", password).split()


def test_the_documented_acl_user_can_run_an_actor_and_a_learner_and_nothing_else(tmp_path, run_name, monkeypatch):
    from impala_league.distributed.actor import Actor
    from impala_league.distributed.learner.role import Learner

    # the learner renews its entries in flight too
    monkeypatch.setattr("impala_league.distributed.learner.ingest_thread.KEEP_ALIVE_S", 0.05)

    with EmbeddedRedis() as server:
        admin = connect(server.url)
        password = secrets.token_hex(16)
        admin.execute_command("ACL", "SETUSER", *documented_acl(run_name, password))
        url = f"redis://impala:{password}@127.0.0.1:{server.port}/0"
        cfg = small_config(run_name, tmp_path, "actor.num_envs=2", "learner.checkpoint_every_s=0.5")
        learner = Learner(cfg, url, tmp_path / run_name)
        actor = Actor(cfg, url, 0)
        actor_thread = Background(actor.run)
        actor_thread.start()
        try:
            run_learner_until(learner, lambda: learner.step >= 3 or actor_thread.error, timeout=60)
        finally:
            actor.stop()
            actor_thread.join(20)
            actor.close()  # its id lease, whose keeper thread would outlive this test's Redis
        assert actor_thread.error is None and learner.step >= 3
        denied = [entry for entry in admin.acl_log() if entry["username"] == "impala"]
        assert denied == []  # nothing the two did was refused
        user = connect(url)
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.get("another-run:params")  # other runs' keys
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.config_get("requirepass")  # administration
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.flushall()
