"""A compressed long league (bench/bench_long_league.py at test size): the real league manager process
snapshots a learner at every pass while actors draw and report games, and is killed with SIGKILL and
restarted with --resume in the middle. Redis never holds more than `league.redis_snapshots` snapshots,
every snapshot file loads, games are played against snapshots that had been evicted (with their own
weights), and no snapshot or result is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import msgpack
import numpy as np
import torch

from impala_league import REPO
from impala_league.agents.checkpoint import model_state, read_checkpoint
from impala_league.agents.network import ActorCritic
from impala_league.config import load_config
from impala_league.distributed.wire.params import ParamStore
from impala_league.envs.registry import env_spec
from impala_league.league.opponents import Opponents

BOUND = 4
TIMEOUT_S = 150  # per phase; a phase ends as soon as its goal is met (about 10 s on an idle machine)


def _manager(overrides: list[str], redis_url: str, run_dir, resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "run.py"), "league", "--redis-url", redis_url, "--run-dir", str(run_dir)]
    cmd += [a for o in overrides for a in ("--set", o)] + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)


def _snapshot_keys(client, run: str) -> int:
    return sum(1 for k in client.scan_iter(match=f"{run}:league:snap:*", count=1000) if not k.endswith(b":sha256"))


def _file_weights(run_dir, snapshot_id: str) -> dict[str, torch.Tensor]:
    tensors, _ = read_checkpoint(run_dir / "league" / "snapshots" / f"{snapshot_id}.safetensors")
    return model_state(tensors)


def _saved_snapshots(run_dir) -> set[str]:
    try:
        state = json.loads((run_dir / "league" / "state.json").read_text())
    except (OSError, ValueError):
        return set()
    return {m for m, info in state["members"].items() if info["kind"] == "snapshot"}


class _LearnerAndActor:
    """The learner's publishes and an actor's games, as the real ones make them, one round per `step`."""

    def __init__(self, client, cfg, run_dir):
        self.client, self.cfg, self.run_dir = client, cfg, run_dir
        self.spec = env_spec("tictactoe")
        self.params = ParamStore(client, cfg.run.name)
        self.actor = Opponents(client, cfg, self.spec, "main", 0, np.random.SeedSequence(0))
        self.rng = np.random.default_rng(0)
        self.version = self.posted = self.most_keys = 0
        self.checked: set[str] = set()

    def step(self) -> None:
        self.version += 1  # the learner publishes new weights; the manager snapshots them at its next pass
        torch.manual_seed(self.version)
        self.params.publish(ActorCritic(self.spec.obs_shape, self.spec.num_actions, self.cfg.agent).state_dict(),
                            self.version)
        self.actor.read_distribution()
        self.actor.refresh()
        for _ in range(8):  # games: each against one drawn opponent, reported as actors do
            match = self.actor.draw(set())
            if match.opponent == "self":
                continue
            if match.opponent not in self.checked:  # the weights played are the snapshot's own
                self.checked.add(match.opponent)
                for name, tensor in _file_weights(self.run_dir, match.opponent).items():
                    assert torch.equal(match.policy.state_dict()[name], tensor), match.opponent
            self.client.xadd(f"{self.cfg.run.name}:results", {"data": msgpack.packb(
                {"player": "main", "opponent_id": match.opponent, "opponent_version": match.version,
                 "learner_seat": match.learner_seat, "winner": int(self.rng.integers(-1, 2)), "length": 5,
                 "returns": [0.0, 0.0]})})
            self.posted += 1
        self.most_keys = max(self.most_keys, _snapshot_keys(self.client, self.cfg.run.name))
        time.sleep(0.02)

    def until(self, goal, proc: subprocess.Popen) -> None:
        """Step until `goal()` holds (looked at every 10 steps); fails past TIMEOUT_S or if `proc` exits."""
        start = time.monotonic()
        while True:
            for _ in range(10):
                self.step()
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            if goal():
                return
            assert time.monotonic() - start < TIMEOUT_S, f"no progress in {TIMEOUT_S} s: {self.posted} games"


def test_a_compressed_long_league_stays_bounded_and_loses_nothing_across_a_sigkill(tmp_path, redis_client,
                                                                                  redis_url, run_name):
    overrides = [f"run.name={run_name}", f"run.dir={tmp_path}", "run.lease_ttl_s=1", "env.name=tictactoe",
                 "agent.torso=mlp", "agent.hidden=16", "league.enabled=true", "league.bots=[]",
                 "league.snapshot_every=1", "league.manager_every_s=0.05", "league.min_games=2",
                 f"league.redis_snapshots={BOUND}", "league.opponent_cache=2"]
    cfg = load_config(None, overrides)
    run_dir = tmp_path / run_name
    play = _LearnerAndActor(redis_client, cfg, run_dir)
    proc = _manager(overrides, redis_url, run_dir, resume=False)
    try:
        play.until(lambda: len(_saved_snapshots(run_dir)) >= 3 * BOUND, proc)
        before_kill, posted = _saved_snapshots(run_dir), play.posted
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc = _manager(overrides, redis_url, run_dir, resume=True)
        play.until(lambda: len(_saved_snapshots(run_dir)) >= len(before_kill) + 3 * BOUND
                   and play.posted >= posted + 200, proc)
        redis_client.set(f"{run_name}:done", 1)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    state = json.loads((run_dir / "league" / "state.json").read_text())
    snapshots = sorted(m for m, info in state["members"].items() if info["kind"] == "snapshot")
    files = sorted(p.stem for p in (run_dir / "league" / "snapshots").glob("*.safetensors"))
    assert play.most_keys <= BOUND and len(snapshots) >= 6 * BOUND, (play.most_keys, len(snapshots))
    assert files == snapshots and before_kill <= set(snapshots) and not state["dropped"], out[-3000:]  # none lost
    for snapshot_id in snapshots:
        _file_weights(run_dir, snapshot_id)  # every file loads and matches its SHA-256
    assert state["games"] == play.posted, (state["games"], play.posted)  # no result lost: read again after the kill
    assert state["evicted_games"] >= 1 and state["residency"]["loads"] >= 1 and play.actor.unavailable >= 1
    print(f"{len(snapshots)} snapshots, {play.posted} games ({state['evicted_games']} against evicted snapshots), "
          f"{state['residency']['loads']} loads, at most {play.most_keys} snapshots in Redis")
