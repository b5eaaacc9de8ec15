"""A short real training run: run.py train -> learner + actor processes -> a real redis-server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from impala_league import REPO
from impala_league.config import from_yaml_text
from impala_league.agents.checkpoint import CheckpointError, read_checkpoint
from impala_league.distributed.wire.transport import GROUP

pytestmark = pytest.mark.redis  # its tests start their own redis-server where they use no fixture's


def train_command(tmp_path: Path, run_name: str, redis_url: str, *extra: str, agent_steps: int = 3000) -> list[str]:
    return [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / "configs/tictactoe.yaml"),
           "--redis-url", redis_url, "--eval-games", "0",
           "--set", f"run.name={run_name}", "--set", f"run.dir={tmp_path}", "--set", "run.wandb_mode=disabled",
           "--set", f"run.total_agent_steps={agent_steps}", "--set", "run.log_every_s=1",
           "--set", "actor.num_actors=2", "--set", "actor.num_envs=4", "--set", "actor.unroll_length=8",
           "--set", "learner.batch_size=4", "--set", "actor.high_water_mark=16", *extra]


def train(tmp_path: Path, run_name: str, redis_url: str, *extra: str, agent_steps: int = 3000) -> subprocess.CompletedProcess:
    return subprocess.run(train_command(tmp_path, run_name, redis_url, *extra, agent_steps=agent_steps), capture_output=True,
                          text=True, timeout=180, cwd=REPO)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, redis_server):
    tmp = tmp_path_factory.mktemp("runs")
    name = "integration"
    proc = train(tmp, name, redis_server.url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp, name, proc


def test_unrolls_are_produced_consumed_acked_and_params_advance(finished_run, redis_server):
    tmp, name, proc = finished_run
    from impala_league.distributed.wire.transport import connect

    r = connect(redis_server.url)
    checkpoint = tmp / name / "checkpoints" / "latest.safetensors"
    _, metadata = read_checkpoint(checkpoint)
    meta = json.loads(metadata["meta"])
    # 3000 agent steps at T * B = 32 agent steps per update: 94 updates.
    assert meta["agent_steps_trained"] >= 3000 and meta["step"] == meta["agent_steps_trained"] // 32
    assert int(r.get(f"{name}:params:version")) == meta["step"]
    group = next(g for g in r.xinfo_groups(f"{name}:traj") if g["name"].decode() == GROUP)
    assert group["pending"] == 0  # everything delivered was acked
    # Accounting: every unroll sent was trained on (acked, then deleted) or is still unread.
    sent = sum(int(m) for m in re.findall(r"sent (\d+) unrolls", proc.stdout))
    consumed = meta["step"] * 4
    assert sent == consumed + r.xlen(f"{name}:traj")
    # Backpressure kept the unread backlog near the high-water mark (16) plus one send per actor.
    assert r.xlen(f"{name}:traj") <= 16 + 2 * 8
    assert r.exists(f"{name}:done")
    assert r.xlen(f"{name}:results") > 0
    assert int(r.get(f"{name}:deadletter:count") or 0) == 0
    records = [json.loads(line) for line in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    assert records and records[-1]["agent_steps_trained"] <= meta["agent_steps_trained"] and records[-1]["sps"] > 0
    assert (tmp / name / "config.yaml").exists()


def test_a_run_with_ingest_workers_trains_every_unroll_once_and_leaves_nothing_behind(tmp_path, redis_server,
                                                                                     run_name):
    """`learner.ingest_workers=2`: the same run through worker processes and shared-memory slots; every
    delivered unroll acked, the trained count that of the updates, and no slot left in /dev/shm."""
    from impala_league.distributed.wire.transport import TrajectoryStream, connect

    def slots() -> set[Path]:  # Python's shared-memory segments
        return set(Path("/dev/shm").glob("psm_*"))

    before = slots()
    proc = train(tmp_path, run_name, redis_server.url, "--set", "learner.ingest_workers=2",
                 "--set", "learner.prefetch_batches=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, metadata = read_checkpoint(tmp_path / run_name / "checkpoints" / "latest.safetensors")
    meta = json.loads(metadata["meta"])
    assert meta["agent_steps_trained"] >= 3000 and meta["step"] == meta["agent_steps_trained"] // 32
    r = connect(redis_server.url)
    counts = TrajectoryStream(r, run_name).accounting()
    assert counts["trained"] == meta["step"] * 4 and counts["dead_lettered"] == 0
    assert r.xpending(f"{run_name}:traj", GROUP)["pending"] == 0
    consumers = {c["name"].decode() for c in r.xinfo_consumers(f"{run_name}:traj", GROUP)}
    assert any(name.endswith("-ingest1") for name in consumers)
    assert slots() <= before


def test_resume_continues_from_the_checkpoint(finished_run, redis_server):
    tmp, name, _ = finished_run
    before = json.loads(read_checkpoint(tmp / name / "checkpoints" / "latest.safetensors")[1]["meta"])
    proc = train(tmp, name, redis_server.url, "--resume", agent_steps=before["agent_steps_trained"] + 1000)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = json.loads(read_checkpoint(tmp / name / "checkpoints" / "latest.safetensors")[1]["meta"])
    assert "resumed from" in proc.stdout
    assert after["step"] > before["step"] and after["agent_steps_trained"] >= before["agent_steps_trained"] + 1000
    assert after["step"] == after["agent_steps_trained"] // 32  # the update counter continued, not restarted


def test_resume_with_another_network_is_refused_before_the_run_config_is_rewritten(finished_run, redis_server):
    tmp, name, _ = finished_run
    config = (tmp / name / "config.yaml").read_text()
    hidden = from_yaml_text(read_checkpoint(tmp / name / "checkpoints" / "latest.safetensors")[1]["config"]).agent.hidden
    proc = train(tmp, name, redis_server.url, "--resume", "--set", "agent.hidden=17", "--set", "learner.optimizer=rmsprop")
    assert proc.returncode != 0
    assert f"agent.hidden: {hidden} -> 17" in proc.stderr and "learner.optimizer: 'adam' -> 'rmsprop'" in proc.stderr
    assert (tmp / name / "config.yaml").read_text() == config


def test_evaluate_prints_per_seat_rates_as_json(finished_run):
    tmp, name, _ = finished_run
    checkpoint = tmp / name / "checkpoints" / "latest.safetensors"
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), "evaluate", "--checkpoint", str(checkpoint),
                           "--opponent", "tactical", "--games", "20", "--seed", "5", "--json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    meta = json.loads(read_checkpoint(checkpoint)[1]["meta"])
    assert (result["step"], result["agent_steps_trained"], result["seed"]) == (meta["step"], meta["agent_steps_trained"], 5)
    assert result["checkpoint"] == str(checkpoint)
    assert set(result["seats"]) == {"player_1", "player_2"}
    for seat in result["seats"].values():
        assert seat["games"] == 20 and seat["wins"] + seat["draws"] + seat["losses"] == 20
        assert abs(seat["win_rate"] + seat["draw_rate"] + seat["loss_rate"] - 1) < 1e-9
        tactics = seat["tactics"]
        assert 0 <= tactics["wins_taken"] <= tactics["win_chances"] and 0 <= tactics["blocks_made"] <= tactics["block_chances"]


def test_load_policy_rejects_a_corrupt_file(tmp_path):
    from impala_league.agents.policy import load_policy

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all")
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        load_policy(bad)
    with pytest.raises(CheckpointError, match="not found"):
        load_policy(tmp_path / "missing.safetensors")


def test_crashed_actor_is_restarted_and_malformed_entries_are_dead_lettered(tmp_path, redis_server, run_name):
    """kill -9 of an actor mid-run: the launcher restarts it and the run finishes; garbage on the
    trajectory stream goes to the dead-letter stream with a reason and the learner goes on."""
    import os
    import signal

    from impala_league.distributed.wire.transport import connect

    r = connect(redis_server.url)
    r.xadd(f"{run_name}:traj", {"data": b"\x93not an unroll"})
    r.xadd(f"{run_name}:traj", {"junk": b"no data field"})
    cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / "configs/tictactoe.yaml"),
           "--redis-url", redis_server.url, "--eval-games", "0", "--set", f"run.name={run_name}",
           "--set", f"run.dir={tmp_path}", "--set", "run.wandb_mode=disabled", "--set", "run.total_agent_steps=20000",
           "--set", "actor.num_actors=2", "--set", "actor.num_envs=4", "--set", "actor.unroll_length=8",
           "--set", "learner.batch_size=4", "--set", "actor.high_water_mark=16"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    lines = []
    killed = None
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"actor 0 \(pid (\d+)\): 4 x", line)
        if m and killed is None:
            killed = int(m.group(1))
            os.kill(killed, signal.SIGKILL)
    assert proc.wait(timeout=120) == 0, "".join(lines)
    out = "".join(lines)
    assert killed is not None
    assert f"actor 0 (pid {killed}) exited with code -9; restarting it" in out
    assert len(re.findall(r"actor 0 \(pid \d+\): 4 x", out)) == 2  # started twice
    assert "for its lease to lapse" not in out  # the launcher freed the dead actor's id for its restart
    assert int(r.get(f"{run_name}:deadletter:count")) == 2
    reasons = [f[b"reason"].decode() for _, f in r.xrange(f"{run_name}:deadletter")]
    assert any("not msgpack" in x or "must be a map" in x for x in reasons), reasons
    assert r.exists(f"{run_name}:done")


def _league_is_under_way(r, run_name: str, run_dir: Path) -> bool:
    """Has every learner trained (a metrics record each) and played league members in both seats, the
    main exploiter the main agent and the main agent a snapshot of the league?"""
    import msgpack

    players = ("main", "main_exploiter_0", "league_exploiter_0")
    if not all((run_dir / f"metrics{'' if p == 'main' else '-' + p}.jsonl").exists()
               and (run_dir / f"metrics{'' if p == 'main' else '-' + p}.jsonl").read_text() for p in players):
        return False
    results = [msgpack.unpackb(f[b"data"]) for _, f in r.xrange(f"{run_name}:results")]
    seats = {p: {x["learner_seat"] for x in results if x["player"] == p and x["opponent_id"] != "self"} for p in players}
    return (all(s == {0, 1} for s in seats.values())
            and any(x["opponent_id"] == "main" for x in results if x["player"] == "main_exploiter_0")
            and any(x["opponent_id"].startswith("main-") for x in results if x["player"] == "main"))


def test_league_run_with_both_exploiters_snapshots_scores_and_resumes(tmp_path, redis_server, run_name):
    """A real league run: main + main exploiter + league exploiter, each with its own actors, one manager.

    Every learner trains and plays the league before the run is stopped (Ctrl-C), however slowly its
    processes start: seven processes importing torch on 2 busy cores start seconds apart, and a run of
    a fixed 1,500 agent steps (2 s of training) could end before an exploiter's first update. Then the
    run is resumed and finishes."""
    import signal
    import time

    from impala_league.distributed.wire.transport import connect

    league = ["--set", "league.enabled=true", "--set", "league.main_exploiters=1", "--set", "league.league_exploiters=1",
              "--set", "league.snapshot_every=10", "--set", "league.manager_every_s=0.2", "--set", "league.min_games=2",
              "--set", "actor.num_actors=1", "--set", "league.exploiter_nice=0"]
    proc = subprocess.Popen(train_command(tmp_path, run_name, redis_server.url, *league, agent_steps=10_000_000),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    r = connect(redis_server.url)
    run_dir = tmp_path / run_name
    try:
        deadline = time.monotonic() + 150
        while not _league_is_under_way(r, run_name, run_dir):
            assert proc.poll() is None and time.monotonic() < deadline, "the league never got under way"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            print(proc.communicate()[0])
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    for player in ("main_exploiter_0", "league_exploiter_0"):
        assert (run_dir / "checkpoints" / player / "latest.safetensors").exists()
    state = json.loads((run_dir / "league" / "state.json").read_text())
    snapshots = [m for m, info in state["members"].items() if info["kind"] == "snapshot"]
    assert any(s.startswith("main-") for s in snapshots), snapshots
    assert all((run_dir / "league" / "snapshots" / f"{s}.safetensors").exists() for s in snapshots)
    assert state["games"] > 0 and state["payoff"]
    # Resume: the manager reloads its snapshots and the exploiters their checkpoints; the run finishes.
    agent_steps = json.loads(read_checkpoint(run_dir / "checkpoints" / "latest.safetensors")[1]["meta"])["agent_steps_trained"]
    proc = train(tmp_path, run_name, redis_server.url, *league, "--resume", agent_steps=agent_steps + 500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"league resumed from {run_dir / 'league' / 'state.json'}: {len(snapshots)} snapshots" in out
    assert out.count("resumed from") >= 4  # main, both exploiters, the league
