"""One owner per run, and how a run ends (docs/architecture.md, "Ownership and endings"): the run
directory's lock, the launcher's lease on a shared Redis, `run.py runs`, and the launcher's signals
(SIGINT, SIGTERM, SIGHUP, a second Ctrl-C, kill -9), with real processes, a real Redis and real signals.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from impala_league import REPO
from impala_league.distributed.launch.ownership import RunLock
from tests.distributed.test_faults import _alive, _descendants, _read_until, _wait_gone
from tests.distributed.test_faults import _start_train as _start_faults_train

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's

TRAINING = r"learner: agent steps trained [\d,]+/"  # the learner's first metrics line: it is in its training loop


def _start_train(tmp_path: Path, run_name: str, *extra: str) -> subprocess.Popen:
    """test_faults' endless tic-tac-toe run, with a metrics line every 0.2 s (the first one comes as soon as the
    learner is in its training loop, which the tests wait for)."""
    return _start_faults_train(tmp_path, run_name, "--set", "run.log_every_s=0.2", *extra)


def run_py(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "IMPALA_REDIS_URL"}
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def _finish(proc: subprocess.Popen, lines: list[str], sig: int = signal.SIGINT) -> tuple[str, float]:
    """Send `sig` to a running launcher; returns its whole output and the seconds it took to exit."""
    start = time.monotonic()
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0]
    return "".join(lines) + out, time.monotonic() - start


# -- one owner per run ------------------------------------------------------------------------------

@pytest.fixture(scope="class")
def live(tmp_path_factory, redis_server):
    """TestALiveRun's run: (launcher, host-a run.dir, run name) of a run in its training loop on the shared
    Redis; stopped with Ctrl-C after the class's tests, which must end it with code 130."""
    first = tmp_path_factory.mktemp("live") / "host-a"  # a machine's run.dir
    run_name = f"test-live-{uuid.uuid4().hex[:8]}"
    proc = _start_train(first, run_name, "--redis-url", redis_server.url)
    lines: list[str] = []
    try:
        _read_until(proc, TRAINING, lines)
        yield proc, first, run_name
        out, _ = _finish(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == 130, out


class TestALiveRun:
    """A live run is refused a second owner: by its directory's lock, and on a shared Redis by its
    launcher's lease. One run (on the shared Redis, so both apply) serves both tests."""

    def test_resuming_a_live_run_is_refused_with_its_owners_host_and_pid(self, live):
        proc, first, run_name = live
        metrics = (first / run_name / "metrics.jsonl").read_text()
        # The resume reads the run's config.yaml, which has no Redis URL: it would start an embedded Redis,
        # so the directory's lock alone refuses it.
        second = run_py("train", "--resume", str(first / run_name), "--eval-games", "0")
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"in use by a run of {socket.gethostname()} pid {proc.pid}" in second.stderr
        assert "started the learner" not in second.stdout  # refused before anything started
        assert (first / run_name / "metrics.jsonl").read_text().startswith(metrics)
        assert proc.poll() is None  # the first run goes on

    def test_a_second_train_of_a_live_run_name_on_a_shared_redis_is_refused_before_anything_is_made(
            self, live, tmp_path, redis_server, redis_client):
        proc, _, run_name = live
        second_dir = tmp_path / "host-b"  # another machine's run.dir, the same Redis
        producers = set(redis_client.hgetall(f"{run_name}:traj:produced"))
        # The second launcher waits one lease TTL (+1 s) for the first's lease to lapse before it refuses:
        # a 1 s TTL makes that wait 2 s instead of 11; the first keeps its lease alive all along.
        second = run_py("train", "--config", str(REPO / "configs/tictactoe.yaml"), "--redis-url", redis_server.url,
                        "--set", f"run.name={run_name}", "--set", f"run.dir={second_dir}", "--set",
                        "run.wandb_mode=disabled", "--set", "actor.num_actors=1", "--set", "run.lease_ttl_s=1",
                        timeout=60)
        after = set(redis_client.hgetall(f"{run_name}:traj:produced"))
        assert second.returncode == 2, second.stdout + second.stderr
        assert (f"another launcher ({socket.gethostname()} pid {proc.pid}) is running for run '{run_name}'"
                in second.stderr)
        assert not second_dir.exists()  # no half-made run directory
        assert after == producers and "started the" not in second.stdout  # no actor of the second run sent a thing
        assert proc.poll() is None  # the first run goes on


def test_runs_lists_local_directories_and_shared_redis_runs_and_deletes_only_a_run_that_is_over(
        tmp_path, redis_server, redis_client, run_name):
    base = tmp_path / "runs"
    for name, meta in (("done", {"agent_steps_trained": 3200, "finished": True}), ("halted", {"agent_steps_trained": 640, "finished": False}),
                       ("busy", None)):
        (base / name / "checkpoints").mkdir(parents=True)
        (base / name / "config.yaml").write_text("env:\n  name: tictactoe\n")
        if meta:
            (base / name / "checkpoints" / "latest.json").write_text(json.dumps(meta))
    over, live = f"{run_name}-over", f"{run_name}-live"
    redis_client.set(f"{over}:done", 1)
    redis_client.xadd(f"{over}:traj", {"data": b"x" * 1000})
    redis_client.set(f"{live}:learner", "elsewhere pid 7", px=60_000)
    redis_client.xadd(f"{live}:traj", {"data": b"x"})
    with RunLock(base / "busy"):
        listing = run_py("runs", "--dir", str(base), "--redis-url", redis_server.url)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line for line in listing.stdout.splitlines() if line.startswith("  ")}
    assert "finished" in rows["done"] and "3,200 agent steps trained" in rows["done"]
    assert "stopped" in rows["halted"]
    assert f"live ({socket.gethostname()} pid {os.getpid()})" in rows["busy"]
    assert "finished" in rows[over] and "2 keys" in rows[over]
    assert "live (elsewhere pid 7)" in rows[live]

    refused = run_py("runs", "--redis-url", redis_server.url, "--delete", live)
    assert refused.returncode == 2 and "is live" in refused.stderr and "elsewhere pid 7" in refused.stderr
    assert redis_client.exists(f"{live}:traj")
    deleted = run_py("runs", "--redis-url", redis_server.url, "--delete", over)
    assert deleted.returncode == 0 and "deleted 2 keys" in deleted.stdout, deleted.stderr
    assert not list(redis_client.scan_iter(match=f"{over}:*"))
    assert run_py("runs", "--help").returncode == 0


# -- signals and endings ----------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_run_within_seconds_with_a_checkpoint_and_exit_code_128_plus_n(tmp_path, run_name, sig):
    # wandb (offline) with Ctrl-C only: its closing is part of "within seconds", and it adds seconds to each run.
    wandb = "offline" if sig == signal.SIGINT else "disabled"
    proc = _start_train(tmp_path, run_name, "--set", f"run.wandb_mode={wandb}")
    lines: list[str] = []
    try:
        _read_until(proc, TRAINING, lines)
        children = _descendants(proc.pid)
        out, took = _finish(proc, lines, sig)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, out
    # 2-4 s alone; up to 10 s seen with another test's run beside it (`pytest -n 2` on 2 cores). A run
    # that waits out a timeout or a kill takes 30 s or more.
    assert took < 15, f"took {took:.1f} s\n{out}"
    assert "learner done" in out and (tmp_path / run_name / "checkpoints" / "latest.safetensors").exists()
    assert f"`run.py train --resume {tmp_path / run_name}` continues it" in out
    assert "Traceback" not in out
    assert not _wait_gone(children, timeout=5), "children outlived the launcher"


def test_a_second_ctrl_c_kills_every_process_at_once_and_says_so(tmp_path, run_name):
    proc = _start_train(tmp_path, run_name)
    lines: list[str] = []
    try:
        _read_until(proc, r"actor 0 \(pid \d+\): 2 x tictactoe", lines)
        children = _descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out = "".join(lines) + proc.communicate(timeout=30)[0]
        took = time.monotonic() - start
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert "SIGINT again: killing every process of the run now" in out
    assert took < 5, f"took {took:.1f} s"
    assert not _wait_gone(children, timeout=2), "children outlived the launcher"


def test_ctrl_c_before_the_first_checkpoint_leaves_no_directory_and_offers_no_resume(tmp_path, run_name):
    proc = _start_train(tmp_path, run_name)
    lines: list[str] = []
    try:
        _read_until(proc, r"started the learner", lines)  # the children are still starting
        out, _ = _finish(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert not (tmp_path / run_name).exists(), out
    assert "--resume" not in out and "stopped before its first checkpoint" in out
    again = _start_train(tmp_path, run_name)  # the next run takes the name, not <name>-2
    lines = []
    try:
        _read_until(again, r"started the learner", lines)
        again.send_signal(signal.SIGINT)
        again.communicate(timeout=60)
    finally:
        again.kill()
    assert f"run directory {tmp_path / run_name}\n" in "".join(lines)


@pytest.mark.parametrize("shared", [False, True], ids=["embedded-redis", "shared-redis"])
def test_children_of_a_killed_launcher_stop_within_seconds_and_write_nothing(tmp_path, redis_server, run_name, shared):
    extra = ["--redis-url", redis_server.url] if shared else []
    proc = _start_train(tmp_path, run_name, "--set", "learner.checkpoint_every_s=600", *extra)
    lines: list[str] = []
    checkpoint = tmp_path / run_name / "checkpoints" / "latest.safetensors"
    try:
        _read_until(proc, r"actor 0 \(pid \d+\): 2 x tictactoe", lines)
        time.sleep(1.0)  # training
        children = _descendants(proc.pid)
        before = checkpoint.stat().st_mtime_ns if checkpoint.exists() else None
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
    left = _wait_gone(children, timeout=5)
    assert not left, "still running 5 s after the launcher died: " + " ".join(
        Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ") for p in _alive(left))
    time.sleep(0.5)
    assert (checkpoint.stat().st_mtime_ns if checkpoint.exists() else None) == before  # nothing written


def test_a_run_that_ended_while_its_learner_was_closing_is_reported_as_finished(tmp_path, run_name):
    # With wandb on, the learner spends seconds closing after it sets the run's done key.
    proc = _start_train(tmp_path, run_name, "--set", "run.total_agent_steps=600", "--set", "run.wandb_mode=offline")
    lines: list[str] = []
    try:
        _read_until(proc, r"learner done:", lines)
        out, _ = _finish(proc, lines)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert "the run reached its end" in out and "stopped before the end" not in out
    assert "--resume" not in out


# `run.py train` with a Ctrl-C that comes just as the embedded redis-server is forked: an at-fork hook of the
# parent (where logging's lock release runs too) sends it, so its KeyboardInterrupt is raised where Python prints
# "Exception ignored" and drops it, unless the launcher holds the signal back across the fork.
_CTRL_C_AT_REDIS_FORK = r"""
import os, signal, sys

def ctrl_c_at_redis_fork():
    frame = sys._getframe()
    while frame is not None and type(frame.f_locals.get("self")).__name__ != "EmbeddedRedis":
        frame = frame.f_back
    if frame is not None:
        print("SIGINT during the redis-server fork", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGINT)

os.register_at_fork(after_in_parent=ctrl_c_at_redis_fork)
sys.argv = sys.argv[1:]
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_ctrl_c_during_the_embedded_redis_fork_stops_start_up_with_130_and_leaves_nothing(tmp_path, run_name):
    cmd = [sys.executable, "-c", _CTRL_C_AT_REDIS_FORK, str(REPO / "run.py"), "train", "--config",
           str(REPO / "configs/tictactoe.yaml"), "--eval-games", "0", "--set", f"run.name={run_name}",
           "--set", f"run.dir={tmp_path}", "--set", "run.wandb_mode=disabled", "--set", "actor.num_actors=1",
           "--set", "run.total_agent_steps=10000000", "--set", "actor.num_envs=2", "--set", "agent.hidden=16"]
    # PYTHONFAULTHANDLER: a launcher that does not stop is sent SIGABRT and prints where each thread was.
    env = {k: v for k, v in os.environ.items() if k != "IMPALA_REDIS_URL"} | {"PYTHONFAULTHANDLER": "1"}
    # Started with SIGINT ignored, as a shell starts a background job (`cmd &`): Python then installs no
    # Ctrl-C handler of its own, and start-up must still answer the signal as the supervising launcher does.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    lines: list[str] = []
    try:
        _read_until(proc, r"SIGINT during the redis-server fork", lines)
        start = time.monotonic()
        try:
            out = "".join(lines) + proc.communicate(timeout=30)[0]  # a lost Ctrl-C: it trains on
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out = "".join(lines) + proc.communicate(timeout=30)[0]
            pytest.fail(f"no exit 30 s after the Ctrl-C; the launcher's threads when sent SIGABRT:\n{out}")
        took = time.monotonic() - start
    finally:
        proc.kill()
        proc.wait()
        leftovers = {pid: cmd for pid, cmd in _cmdlines().items() if str(tmp_path) in cmd}
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 130, out
    assert took < 10, f"took {took:.1f} s\n{out}"
    assert "interrupted" in out and "started the" not in out and "Exception ignored" not in out, out
    assert not leftovers, f"left running: {leftovers}\n{out}"  # the redis-server, above all
    assert not (tmp_path / run_name).exists(), out


def _cmdlines() -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass
    return found
