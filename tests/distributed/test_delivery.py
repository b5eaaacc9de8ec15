"""Delivery accounting (docs/architecture.md, "Delivery accounting"): an actor's add re-sent after a
lost reply is done once, acks count once, and the counters of produced, trained and dead-lettered
unrolls add up, including across a `kill -9` of the learner under real actor processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from impala_league import REPO
from impala_league.distributed.launch.launcher import EmbeddedRedis
from impala_league.distributed.wire.transport import GROUP, TrajectoryStream, connect, redis_outages
from tests.distributed.test_faults import T, encode, small_config, valid_unroll

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's


def run_learner_until(learner, done, timeout: float = 20.0) -> None:
    """Run `learner` on a thread until `done()` holds, then stop it and wait for its final checkpoint."""
    thread = threading.Thread(target=learner.run)
    thread.start()
    deadline = time.monotonic() + timeout
    while not done() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    learner.stop()
    thread.join(20)
    assert not thread.is_alive()


# -- adds done once, acks counted once -------------------------------------------------------------

def test_a_resent_add_is_done_once_and_counts_its_unrolls_once(redis_client, run_name):
    stream = TrajectoryStream(redis_client, run_name)
    assert stream.add([b"a", b"b"], producer="0-tok", produced=2) == 2
    assert stream.add([b"a", b"b"], producer="0-tok", produced=2) == 2  # re-sent after a lost reply: nothing added
    assert stream.add([b"c"], producer="1-tok", produced=1) == 3  # another producer's first add
    assert stream.add([b"d"], producer="0-tok", produced=3) == 4
    assert stream.add([b"c"], producer="1-tok", produced=1) == 4  # an old call arriving late: nothing added
    assert [f[b"data"] for _, f in redis_client.xrange(stream.key)] == [b"a", b"b", b"c", b"d"]
    counts = stream.accounting()
    assert counts["produced"] == 4 and counts["backlog"] == 4
    assert stream.add([b"e"]) == 5 and stream.add([b"e"]) == 6  # no producer: added unconditionally
    assert stream.accounting()["produced"] == 4


def test_ack_counts_only_what_it_acknowledged(redis_client, run_name):
    """A script re-sent after a lost reply finds its entries acked already and counts nothing."""
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    stream.add([b"x", b"y"])
    entries = stream.read("learner-0", count=2, block_ms=10)
    ids = [eid for eid, _ in entries]
    assert stream.ack(ids) == 2
    assert stream.ack(ids) == 2  # again: nothing pending any more
    stream.dead_letter(ids[0], b"x", "again")  # acked already: not dead-lettered as well
    assert stream.accounting() == {"produced": 0, "trained": 2, "dead_lettered": 0, "backlog": 0, "throttled_s": 0.0, "env_steps": 0}
    assert redis_client.xpending(stream.key, GROUP)["pending"] == 0


def test_entries_of_several_unrolls_count_their_unrolls_once(redis_client, run_name):
    """Entries of 3, 2 and 4 unrolls: acking the first two counts 5 trained, once even if the script is
    re-sent; the third stays in the backlog."""
    stream = TrajectoryStream(redis_client, run_name)
    stream.ensure_group()
    stream.add([b"x", b"y", b"z"], producer="0-tok", produced=9)
    ids = [eid for eid, _ in stream.read("learner-0", count=3, block_ms=10)]
    assert stream.ack(ids[:2], counts=[3, 2]) == 5
    assert stream.ack(ids[:2], counts=[3, 2]) == 5
    assert stream.accounting() == {"produced": 9, "trained": 5, "dead_lettered": 0, "backlog": 1, "throttled_s": 0.0, "env_steps": 0}


class ReplyDroppingProxy:
    """A TCP proxy to Redis that, when armed, forwards the next request holding an EVAL and then cuts
    the connection before the reply comes back: the script ran, the client never hears so."""

    def __init__(self, port: int):
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            mute = threading.Event()  # set: replies on this connection are dropped
            threading.Thread(target=self._pump, args=(client, server, mute, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, mute, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, mute: threading.Event, requests: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if requests and self.armed.is_set() and b"EVAL" in data:
                    self.armed.clear()
                    mute.set()
                    self.dropped += 1
                    dst.sendall(data)
                    time.sleep(0.2)  # Redis runs the script and replies; the reply goes nowhere
                    break
                if mute.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_an_add_whose_reply_was_lost_is_resent_and_done_once(tmp_path, redis_server, run_name):
    """The real path of a re-sent add: the actor's script runs, its reply is lost, the retry policy
    re-sends it. The re-sent script finds the producer's count done and adds nothing: the stream holds
    each unroll once, and the learner trains on each once."""
    from impala_league.distributed.learner.role import Learner

    proxy = ReplyDroppingProxy(redis_server.port)
    try:
        url = f"redis://:{redis_server.password}@127.0.0.1:{proxy.port}/0"
        actor_side = TrajectoryStream(connect(url), run_name)
        proxy.armed.set()
        assert actor_side.add([encode(valid_unroll(1.0)), encode(valid_unroll(-1.0))], producer="0-tok",
                              produced=2) == 2
        assert proxy.dropped == 1 and redis_outages(actor_side.r) == 1  # the reply was lost, the retry got one
        actor_side.add([encode(valid_unroll(0.5))], producer="0-tok", produced=3)
    finally:
        proxy.close()
    stream = TrajectoryStream(connect(redis_server.url), run_name)
    assert stream.accounting()["backlog"] == 3 and stream.accounting()["produced"] == 3
    learner = Learner(small_config(run_name, tmp_path), redis_server.url, tmp_path / run_name)
    run_learner_until(learner, lambda: stream.accounting()["backlog"] == 1)  # B = 2: the last one waits
    assert learner.step == 1 and learner.agent_steps == 2 * T
    assert stream.accounting() == {"produced": 3, "trained": 2, "dead_lettered": 0, "backlog": 1, "throttled_s": 0.0, "env_steps": 0}


# -- kill -9 of the learner under real actor processes ----------------------------------------------

def _spawn(role: str, url: str, log_path: Path, *args: str) -> subprocess.Popen:
    """`run.py learner|actor` with a small tictactoe config, output to `log_path`."""
    env = dict(os.environ, IMPALA_REDIS_URL=url, PYTHONUNBUFFERED="1")
    with log_path.open("a") as out:
        return subprocess.Popen([sys.executable, str(REPO / "run.py"), role, *args], stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)


def _wait(condition, timeout: float, what: str, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"{what}: pid {proc.pid} exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_every_unroll_is_accounted_for_across_a_kill_9_of_the_learner(tmp_path, run_name):
    """Two actor processes and a learner over real Redis. Faults: two garbage entries and a `kill -9`
    of the learner mid-run; it is restarted with --resume, the actors are stopped, and the learner
    drains the stream. Then produced + garbage == trained + dead-lettered, with nothing left, and the
    resumed model's agent steps count exactly the unrolls not rolled back."""
    run_dir = tmp_path / run_name
    run_dir.mkdir()
    settings = [f"run.name={run_name}", f"run.dir={tmp_path}", "run.wandb_mode=disabled", "run.log_every_s=1",
                "run.total_agent_steps=1000000000", f"actor.unroll_length={T}", "actor.num_envs=2",
                "actor.high_water_mark=8", "learner.batch_size=1", "learner.checkpoint_every_s=1",
                "learner.read_block_ms=100", "agent.hidden=16"]
    config = ["--config", str(REPO / "configs/tictactoe.yaml"), *[a for s in settings for a in ("--set", s)]]
    learner_args = ["learner", *config, "--run-dir", str(run_dir)]
    procs: list[subprocess.Popen] = []
    with EmbeddedRedis() as server:
        client = connect(server.url)
        stream = TrajectoryStream(client, run_name)
        log_path = tmp_path / "learner.log"
        try:
            learner = _spawn(*learner_args[:1], server.url, log_path, *learner_args[1:])
            actors = [_spawn("actor", server.url, tmp_path / f"actor{i}.log", *config, "--actor-id", str(i))
                      for i in range(2)]
            procs += [learner, *actors]
            checkpoint = run_dir / "checkpoints" / "latest.json"
            _wait(lambda: stream.accounting()["trained"] >= 12 and checkpoint.exists(), 90, "training", procs)
            for garbage in (b"\x00not an unroll", b"\xc1"):
                client.xadd(stream.key, {"data": garbage})
            _wait(lambda: stream.accounting()["trained"] >= 24, 60, "more training", procs)

            learner.kill()  # kill -9, mid-run
            learner.wait()
            trained_at_kill = stream.accounting()["trained"]
            in_checkpoint = json.loads(checkpoint.read_text())["unrolls_trained"]
            client.delete(f"{run_name}:learner")  # its lease would lapse by itself in 10 s
            restarted_at = time.monotonic()
            learner = _spawn(*learner_args[:1], server.url, log_path, *learner_args[1:], "--resume")
            procs = [learner, *actors]
            _wait(lambda: stream.accounting()["trained"] > trained_at_kill, 60, "the resumed learner", procs)
            recovery_s = time.monotonic() - restarted_at
            _wait(lambda: stream.accounting()["trained"] >= trained_at_kill + 12, 60, "training after resume", procs)

            for actor in actors:
                actor.send_signal(signal.SIGTERM)
            for actor in actors:
                assert actor.wait(30) == 128 + signal.SIGTERM  # stopped before the run was over
            _wait(lambda: stream.accounting()["backlog"] == 0, 60, "the learner to drain the stream", [learner])
            learner.send_signal(signal.SIGTERM)
            assert learner.wait(60) == 128 + signal.SIGTERM
            counts = stream.accounting()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    logs = log_path.read_text()
    sent = sum(int(m) for i in range(2)
               for m in re.findall(r"sent (\d+) unrolls", (tmp_path / f"actor{i}.log").read_text()))
    rolled_back = trained_at_kill - in_checkpoint
    print(f"\naccounting: {counts}, garbage 2, trained at kill {trained_at_kill}, in checkpoint "
          f"{in_checkpoint}, rolled back {rolled_back}, first update {recovery_s:.1f} s after the restart")
    assert counts["produced"] == sent  # what the actors say they sent, counted once each
    assert counts["backlog"] == 0 and counts["dead_lettered"] == 2
    assert counts["produced"] + 2 == counts["trained"] + counts["dead_lettered"]
    assert 0 <= rolled_back <= trained_at_kill
    if rolled_back:
        assert f"{rolled_back} unrolls acked after the checkpoint (trained count {in_checkpoint} -> " in logs
    final = json.loads(checkpoint.read_text())
    assert final["unrolls_trained"] == counts["trained"]
    assert final["agent_steps_trained"] == T * (counts["trained"] - rolled_back)  # the model holds every update but those lost
    assert "Traceback" not in logs
