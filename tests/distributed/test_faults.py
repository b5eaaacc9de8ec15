"""Faults an adversarial user or a bad day can cause: garbage on the trajectory stream, poisoned
unrolls, resumes that do not fit, bad Redis URLs, killed and interrupted processes.

Every test uses the real redis-server of conftest.py and stays well under 20 seconds.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
import zstandard

from impala_league import REPO
from impala_league.config import load_config
from impala_league.agents.checkpoint import CheckpointError, read_checkpoint
from impala_league.distributed.wire.codec import UnrollSpec, encode_unroll
from impala_league.envs.registry import env_spec

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's

T = 4


def small_config(run_name: str, tmp_path: Path, *extra: str):
    (tmp_path / run_name).mkdir(parents=True, exist_ok=True)
    return load_config(REPO / "configs/tictactoe.yaml", [
        f"run.name={run_name}", f"run.dir={tmp_path}", "run.wandb_mode=disabled", "run.log_every_s=0.01",
        f"actor.unroll_length={T}", "learner.batch_size=2", "actor.high_water_mark=8", "agent.hidden=16",
        "learner.read_block_ms=50", *extra])


def valid_unroll(reward: float = 0.0) -> dict[str, np.ndarray]:
    spec = UnrollSpec(env_spec("tictactoe"), T)
    arrays = {name: np.zeros(shape, dtype) for name, (dtype, shape) in spec.arrays.items()}
    arrays["action_mask"][:] = 1
    arrays["reward"][:] = reward
    return arrays


_unroll_ids = itertools.count()


def encode(arrays: dict[str, np.ndarray], env: str = "tictactoe", unroll_id: str | None = None,
           compression: str = "none") -> bytes:
    """An unroll's bytes; each call gets a new unroll id unless one is given (as an actor's unrolls do)."""
    unroll_id = f"t-0-{next(_unroll_ids)}" if unroll_id is None else unroll_id
    return encode_unroll(arrays, unroll_id=unroll_id, policy_version=0, actor_id=0, env=env, compression=compression)


def tampered(mutate, compression: str = "none") -> bytes:
    msg = msgpack.unpackb(encode(valid_unroll(), compression=compression), raw=False)
    mutate(msg)
    return msgpack.packb(msg, use_bin_type=True)


def _truncate(msg):
    msg["arrays"]["obs"][2] = msg["arrays"]["obs"][2][:-5]


def _huge_shape(msg):
    msg["arrays"]["obs"][1] = [2**40, 3, 3, 2]


def _zstd_bomb(msg):
    """obs as a 13 kB zstd frame that decompresses to 64 MiB."""
    msg["arrays"]["obs"][2] = zstandard.ZstdCompressor().compress(bytes(64 << 20))


def _corrupt_zstd(msg):
    frame = bytearray(msg["arrays"]["reward"][2])
    frame[-4:] = b"\xff\xff\xff\xff"  # the block's end and the checksum-less frame's tail
    msg["arrays"]["reward"][2] = bytes(frame)


def _nan_reward(msg):
    reward = np.frombuffer(msg["arrays"]["reward"][2], np.float32).copy()
    reward[1] = np.nan
    msg["arrays"]["reward"][2] = reward.tobytes()


# -- a live learner ---------------------------------------------------------------------------------

def test_live_learner_dead_letters_garbage_and_survives_a_poisoned_unroll(tmp_path, redis_client, redis_url, run_name):
    from impala_league.distributed.learner.role import Learner

    key = f"{run_name}:traj"
    garbage = {
        "not msgpack": {"data": b"\xc1\xc1\xc1"},
        "no data field": {"junk": b"x"},
        "empty data": {"data": b""},
        "non-map msgpack": {"data": msgpack.packb([1, 2, 3])},
        "truncated unroll": {"data": tampered(_truncate)},
        "huge declared shape": {"data": tampered(_huge_shape)},
        "nan reward": {"data": tampered(_nan_reward)},
        "zstd bomb": {"data": tampered(_zstd_bomb, "zstd")},
        "corrupt zstd frame": {"data": tampered(_corrupt_zstd, "zstd")},
        "wrong env": {"data": encode(valid_unroll(), env="connect_four")},
    }
    # Two updates of B=2: one batch with a finite reward that overflows V-trace, one clean batch.
    redis_client.xadd(key, {"data": encode(valid_unroll(3e38))})
    for fields in garbage.values():
        redis_client.xadd(key, fields)
    for compression in ("none", "zstd", "zstd"):  # a learner trains on raw and compressed unrolls alike
        redis_client.xadd(key, {"data": encode(valid_unroll(1.0), compression=compression)})
    cfg = small_config(run_name, tmp_path, f"run.total_agent_steps={2 * 2 * T}")
    learner = Learner(cfg, redis_url, tmp_path / run_name)
    learner.run()
    assert learner.step == 2
    assert all(torch.isfinite(p).all() for p in learner.model.parameters())
    assert int(redis_client.get(f"{run_name}:deadletter:count")) == len(garbage)
    reasons = [f[b"reason"].decode() for _, f in redis_client.xrange(f"{run_name}:deadletter")]
    assert len(reasons) == len(garbage) and all(reasons)
    assert any("is for env 'connect_four'" in r for r in reasons)
    assert any("non-finite" in r for r in reasons)
    assert any(f"'obs' is a zstd frame of {64 << 20} bytes" in r for r in reasons)
    assert redis_client.xlen(key) == 0  # everything was either trained on or dead-lettered
    records = [json.loads(line) for line in (tmp_path / run_name / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["skipped_updates"] for r in records) == 1


def test_a_starting_learner_clears_the_done_flag_of_an_earlier_end(tmp_path, redis_client, redis_url, run_name):
    """Standalone `run.py learner --resume` of a finished run: its old `done` flag used to send every
    actor home at once, and the learner waited for unrolls forever."""
    import threading

    from impala_league.distributed.learner.role import Learner

    redis_client.set(f"{run_name}:done", 1)
    learner = Learner(small_config(run_name, tmp_path, "run.total_agent_steps=1000"), redis_url, tmp_path / run_name)
    thread = threading.Thread(target=learner.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not redis_client.exists(f"{run_name}:params:version") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not redis_client.exists(f"{run_name}:done")
    finally:
        learner.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert not redis_client.exists(f"{run_name}:done")  # stopped, not finished
    assert not redis_client.exists(f"{run_name}:learner")  # the lease was released


def test_actor_with_another_network_than_the_learner_is_a_clear_error(tmp_path, redis_client, redis_url, run_name):
    from impala_league.config import ConfigError
    from impala_league.distributed.actor import Actor
    from impala_league.distributed.wire.params import ParamStore
    from impala_league.agents.network import ActorCritic

    cfg = small_config(run_name, tmp_path)
    spec = env_spec("tictactoe")
    ParamStore(redis_client, run_name).publish(ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent).state_dict(), 3)
    actor = Actor(small_config(run_name, tmp_path, "agent.hidden=32", "actor.num_envs=2"), redis_url, 0)
    try:
        with pytest.raises(ConfigError, match=r"do not fit this actor's network.*\(size mismatch for"):
            actor.sync_params(wait=True)
    finally:
        actor.close()  # its id's lease thread would renew until the session's Redis stops


def test_resume_with_a_different_network_or_optimizer_is_a_clear_error(tmp_path, redis_url, run_name):
    from impala_league.distributed.learner.role import Learner

    cfg = small_config(run_name, tmp_path, "run.total_agent_steps=1")
    first = Learner(cfg, redis_url, tmp_path / run_name)
    first.checkpoint()
    first.metrics.file.close()
    for change, message in ((["agent.hidden=32"], "does not fit this run's config"),
                            (["learner.optimizer=rmsprop"], "learner.optimizer=rmsprop")):
        with pytest.raises(CheckpointError, match=message):
            Learner(small_config(run_name, tmp_path, *change), redis_url, tmp_path / run_name, resume=True)
    # Hyperparameters of the config win over those saved with the optimizer state.
    resumed = Learner(small_config(run_name, tmp_path, "learner.learning_rate=0.123"), redis_url,
                      tmp_path / run_name, resume=True)
    assert resumed.optimizer.param_groups[0]["lr"] == 0.123
    resumed.metrics.file.close()


def test_checkpoint_holds_no_redis_password(tmp_path, redis_url, run_name):
    from impala_league.distributed.learner.role import Learner

    cfg = small_config(run_name, tmp_path, f"run.redis_url={redis_url}")
    learner = Learner(cfg, redis_url, tmp_path / run_name)
    learner.checkpoint()
    learner.metrics.file.close()
    password = redis_url.split(":")[2].split("@")[0]
    assert password not in read_checkpoint(learner.checkpoints.path)[1]["config"]


# -- the command line -------------------------------------------------------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cli_errors(tmp_path_factory, redis_server):
    """Runs bad command lines at once (each pays torch's import time); name -> (code, out, err, cwd)."""
    from safetensors.torch import save_file

    foreign = tmp_path_factory.mktemp("foreign") / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign), metadata={"config": "env:\n  name: chess\n", "meta": "{}"})
    tictactoe = str(REPO / "configs/tictactoe.yaml")
    commands = {
        "train unreachable": ["train", "--config", tictactoe, "--redis-url",
                              f"redis://:s3cret@127.0.0.1:{_free_port()}/0"],
        "train bad port": ["train", "--config", tictactoe, "--redis-url", "redis://:s3cret@127.0.0.1:notaport/0"],
        "learner wrong password": ["learner", "--config", tictactoe, "--redis-url",
                                   f"redis://:s3cret@127.0.0.1:{redis_server.port}/0"],
        "actor not a url": ["actor", "--config", tictactoe, "--redis-url", "http://s3cret@example/0"],
        "actor negative id": ["actor", "--config", tictactoe, "--redis-url", redis_server.url, "--actor-id", "-3"],
        "train missing cuda": ["train", "--config", tictactoe, "--set", "learner.device=cuda:99"],
        "train run.dir is a file": ["train", "--config", tictactoe, "--redis-url", redis_server.url,
                                    "--set", f"run.dir={foreign}"],
        "evaluate negative seed": ["evaluate", "--checkpoint", str(foreign), "--seed", "-5"],
        "evaluate foreign checkpoint": ["evaluate", "--checkpoint", str(foreign)],
    }
    env = {k: v for k, v in os.environ.items() if k != "IMPALA_REDIS_URL"}
    procs = {}
    for name, args in commands.items():
        cwd = tmp_path_factory.mktemp(name.replace(" ", "_"))
        procs[name] = (subprocess.Popen([sys.executable, str(REPO / "run.py"), *args], cwd=cwd, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), cwd)
    results = {}
    for name, (proc, cwd) in procs.items():
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results[name] = (proc.returncode, out, err, cwd)
    return results


@pytest.mark.parametrize("name, message", [
    ("train bad port", "bad Redis URL redis://***@127.0.0.1:notaport/0"),
    ("learner wrong password", "refused the password"),
    ("actor not a url", "bad Redis URL"),
    ("actor negative id", "--actor-id must be >= 0"),
    ("train missing cuda", "learner.device=cuda:99"),
    ("train run.dir is a file", "cannot create the run directory"),
    ("evaluate negative seed", "--seed must be in [0, 2**31)"),
    ("evaluate foreign checkpoint", "foreign.safetensors: the run config in its metadata is not usable"),
])
def test_bad_command_lines_exit_2_with_one_clear_line(cli_errors, name, message):
    code, out, err, cwd = cli_errors[name]
    assert code == 2, out + err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in out + err
    assert "s3cret" not in out + err
    if name.startswith("train"):
        assert list(cwd.iterdir()) == []  # no run directory was created


def test_unreachable_redis_exits_4_with_one_clear_line(cli_errors):
    """Not a bad command line: Redis may come up later, so it has its own code (see
    tests/distributed/launch/test_startup.py)."""
    code, out, err, cwd = cli_errors["train unreachable"]
    assert code == 4, out + err
    assert err.startswith("error: cannot reach Redis at redis://***@127.0.0.1:") and err.count("\n") == 1, err
    assert "--wait-redis SECONDS" in err
    assert "Traceback" not in out + err and "s3cret" not in out + err
    assert list(cwd.iterdir()) == []  # no run directory was created


# -- killed and interrupted processes ---------------------------------------------------------------

def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children are in their own sessions, so not one process group)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _start_train(tmp_path: Path, run_name: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / "configs/tictactoe.yaml"),
           "--eval-games", "1", "--set", f"run.name={run_name}", "--set", f"run.dir={tmp_path}",
           "--set", "run.wandb_mode=disabled", "--set", "run.total_agent_steps=10000000", "--set", "actor.num_actors=1",
           "--set", "actor.num_envs=2", "--set", "actor.unroll_length=4", "--set", "learner.batch_size=2",
           "--set", "actor.high_water_mark=8", "--set", "agent.hidden=16", *extra]
    env = {k: v for k, v in os.environ.items() if k != "IMPALA_REDIS_URL"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)


def _read_until(proc: subprocess.Popen, pattern: str, lines: list[str], timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            return m
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(lines))


def _wait_gone(pids: set[int], timeout: float = 15) -> set[int]:
    deadline = time.monotonic() + timeout
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive(pids)


def test_killed_learner_stops_the_launcher_with_a_clear_message(tmp_path, redis_server, run_name):
    proc = _start_train(tmp_path, run_name, "--redis-url", redis_server.url)
    lines: list[str] = []
    try:
        learner_pid = int(_read_until(proc, r"started the learner \(pid (\d+)\)", lines).group(1))
        _read_until(proc, r"actor 0 \(pid \d+\): 2 x tictactoe", lines)  # running, weights published
        children = _descendants(proc.pid)
        os.kill(learner_pid, signal.SIGKILL)
        out = "".join(lines) + proc.communicate(timeout=30)[0]
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    assert f"the learner (pid {learner_pid}) was killed by SIGKILL" in out
    assert "Traceback" not in out
    assert not _wait_gone(children), "children outlived the launcher"


def test_ctrl_c_checkpoints_skips_evaluation_and_leaves_nothing_running(tmp_path, redis_server, run_name):
    proc = _start_train(tmp_path, run_name, "--redis-url", redis_server.url)
    lines: list[str] = []
    try:
        _read_until(proc, r"actor 0 \(pid \d+\): 2 x tictactoe", lines)
        children = _descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        out = "".join(lines) + proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert proc.returncode == 130, out  # 128 + SIGINT, as a shell reports an interrupted command
    assert "Traceback" not in out
    assert "learner done" in out and (tmp_path / run_name / "checkpoints" / "latest.safetensors").exists()
    assert "greedy policy vs" not in out  # an interrupted run is not evaluated
    assert f"--resume {tmp_path / run_name}" in out
    assert not _wait_gone(children), "children outlived the launcher"


def test_sigkilled_launcher_takes_its_embedded_redis_and_children_along(tmp_path, run_name):
    proc = _start_train(tmp_path, run_name)  # embedded redis-server
    lines: list[str] = []
    try:
        _read_until(proc, r"started the learner", lines)
        time.sleep(0.5)
        children = _descendants(proc.pid)
        assert len(children) >= 3, children  # redis-server, learner, actor
        # No temp dir to leave behind: the run's redis-server works in the run's own folder (it chdirs to its
        # --dir). A listing of /tmp would race with other tests' launchers under -n.
        cwds = {Path(os.readlink(f"/proc/{p}/cwd")) for p in children}
        assert tmp_path / run_name / "redis" in cwds, cwds
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
    assert not _wait_gone(children), "orphans: " + " ".join(Path(f"/proc/{p}/cmdline").read_text()
                                                            for p in _alive(children))
