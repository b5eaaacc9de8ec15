"""Earlier policies over training: the launcher's checkpoint copies, which of them (or of a league's
snapshots) the end-of-run evaluation plays, and what it logs and keeps in evaluation.json."""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from impala_league.agents.checkpoint import model_state, read_checkpoint, read_meta, save_checkpoint
from impala_league.agents.network import ActorCritic
from impala_league.agents.policy import load_policy
from impala_league.config import load_config, to_yaml
from impala_league.distributed.learner.checkpoint_history import CheckpointHistory, history_files
from impala_league.envs.registry import env_spec
from impala_league.evaluation.final import final_evaluation, tactics_line
from impala_league.evaluation.over_training import earlier_policies

TINY = ["env.name=tictactoe", "agent.torso=mlp", "agent.hidden=16", "agent.mlp_layers=1", "run.wandb_mode=disabled"]


@functools.lru_cache
def tiny_config(overrides: tuple[str, ...] = ()):
    return load_config(None, [*TINY, *overrides])


def write_checkpoint(path: Path, meta: dict, overrides: tuple[str, ...] = (), optimizer: bool = False) -> Path:
    """A randomly initialised tic-tac-toe policy in the learner's checkpoint format (with RMSProp state
    when `optimizer`)."""
    cfg = tiny_config(overrides)
    spec = env_spec("tictactoe")
    torch.manual_seed(meta["step"])
    model = ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent)
    opt = None
    if optimizer:
        opt = torch.optim.RMSprop(model.parameters())
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    save_checkpoint(path, model, opt, to_yaml(cfg), meta)
    return path


def test_the_history_keeps_evenly_spaced_copies_of_the_network_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # 40 durable writes: their fsyncs are most of the time
    latest = tmp_path / "checkpoints" / "latest.safetensors"
    history = CheckpointHistory(latest, keep=2)
    assert history.update() is None  # no checkpoint yet
    written = {}
    for step in range(1, 21):
        write_checkpoint(latest, {"step": step, "agent_steps_trained": 100 * step}, optimizer=True)
        written[step] = model_state(read_checkpoint(latest)[0])
        history.update()
        assert history.update() is None  # the same checkpoint is copied once
    # 1..5 copied, thinned to 1 3 5 (stride 2); 7 9 added, thinned to 1 5 9 (stride 4); 13 17 -> 1 9 17.
    files = history_files(tmp_path / "checkpoints")
    assert [read_meta(p)["step"] for p in files] == [1, 9, 17] and history.stride == 8
    tensors, _ = read_checkpoint(files[-1])
    assert tensors and not any(k.startswith("optim.") for k in tensors)  # verified digest, network only
    assert any(k.startswith("optim.") for k in read_checkpoint(latest)[0])
    loaded = load_policy(files[-1]).model.state_dict()
    assert loaded.keys() == written[17].keys() and all(torch.equal(loaded[k], written[17][k]) for k in loaded)
    # A resumed run's launcher does not copy the checkpoint it finds, and goes on from the copies there.
    again = CheckpointHistory(latest, keep=2)
    assert again.update() is None and again.copies == files


def test_earlier_policies_are_evenly_spaced_before_the_final_step(tmp_path):
    paths = [write_checkpoint(tmp_path / f"{s:04d}.safetensors", {"step": s, "agent_steps_trained": 10 * s})
             for s in range(100, 1001, 100)]
    (tmp_path / "broken.safetensors").write_bytes(b"not a checkpoint")
    candidates = [*paths, tmp_path / "broken.safetensors"]
    steps = lambda picked: [meta["step"] for _, meta in picked]  # noqa: E731
    assert steps(earlier_policies(candidates, 1000, 3)) == [100, 500, 900]  # 1000 is the final checkpoint
    assert steps(earlier_policies(candidates, 1000, 1)) == [900]
    assert steps(earlier_policies(candidates, None, 20)) == list(range(100, 1001, 100))
    assert earlier_policies(candidates, 1000, 0) == [] and earlier_policies([], 1000, 6) == []


def test_the_final_evaluation_logs_tactics_and_plays_the_main_agents_snapshots(tmp_path, caplog):
    run_dir = tmp_path / "run"
    league = ("league.enabled=true", "evaluation.judges=[mcts:10,mcts:30]", "evaluation.judge_games=3")
    (run_dir).mkdir()
    cfg = tiny_config(league)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    checkpoint = write_checkpoint(run_dir / "checkpoints" / "latest.safetensors", {"step": 400, "agent_steps_trained": 4000}, league)
    snapshots = run_dir / "league" / "snapshots"
    for step in (100, 200, 300):
        write_checkpoint(snapshots / f"main-{step:07d}.safetensors",
                         {"id": f"main-{step:07d}", "player": "main", "step": step, "agent_steps_trained": 10 * step}, league)
    corrupt = write_checkpoint(snapshots / "main-0000350.safetensors",
                               {"id": "main-0000350", "player": "main", "step": 350, "agent_steps_trained": 3500}, league)
    data = bytearray(corrupt.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in a weight: its digest no longer matches
    corrupt.write_bytes(bytes(data))
    write_checkpoint(snapshots / "main_exploiter_0-0000250.safetensors",
                     {"id": "main_exploiter_0-0000250", "player": "main_exploiter_0", "step": 250, "agent_steps_trained": 2500},
                     league)
    with caplog.at_level(logging.INFO, logger="run"):
        final_evaluation(cfg, checkpoint, 4, run_dir, history=3, history_games=3)
    record = json.loads((run_dir / "evaluation.json").read_text())
    over = record["over_training"]
    assert [(e["step"], e["agent_steps_trained"], e["games"]) for e in over] == [(100, 1000, 3), (300, 3000, 3), (400, 4000, 4)]
    assert over[0]["checkpoint"].endswith("main-0000100.safetensors")
    assert over[-1]["opponents"] == {o: record["opponents"][o] for o in ("tactical", "minimax:9")}
    # The judges, apart from the bots: every one at the end, the first over training too.
    assert set(record["judges"]) == {"mcts:10", "mcts:30"} and record["judge_games"] == 3
    assert over[-1]["judges"] == {"mcts:10": record["judges"]["mcts:10"]}
    assert all(set(e["judges"]) == {"mcts:10"} for e in over)
    for r in [r for seats in record["judges"].values() for r in seats.values()]:
        assert r["games"] == 3 and r["score"] == (r["wins"] + r["draws"] / 2) / 3
        assert r["score_ci95"][0] <= r["score"] <= r["score_ci95"][1]
    for entry in over:
        assert set(entry["opponents"]) == {"tactical", "minimax:9"}
        for seats in entry["opponents"].values():
            assert set(seats) == {"player_1", "player_2"}
            for r in seats.values():
                assert r["wins"] + r["draws"] + r["losses"] == entry["games"]
                t = r["tactics"]
                assert set(t) >= {"wins_taken_rate", "blocks_made_rate"}
                assert t["wins_taken_rate"] == (t["wins_taken"] / t["win_chances"] if t["win_chances"] else None)
    text = caplog.text
    # Per opponent (3 bots, 2 judges) and seat the final evaluation shows the tactics; over training one line
    # per policy and bot or judge.
    assert text.count("immediate wins (") + text.count("0/0 immediate wins") == 10, text
    assert "as player_1: won" in text and "forced blocks" in text
    assert "over training: 2 earlier policies, 3 games per seat and bot" in text
    assert "leaving out" in text and "main-0000350.safetensors is corrupt" in text
    assert "update 300, 3,000 agent steps, vs minimax:9: won" in text and "update 400 (final), 4,000 agent steps" in text
    assert "held out: greedy policy vs judge mcts:30 over 3 games per seat" in text and "] of 3" in text
    assert "update 300, 3,000 agent steps, vs mcts:10: won" in text


@pytest.mark.parametrize("tactics, line", [
    ({"win_chances": 40, "wins_taken": 30, "block_chances": 0, "blocks_made": 0},
     "; took 30/40 immediate wins (75%), made 0/0 forced blocks"),
    ({"win_chances": 201, "wins_taken": 200, "block_chances": 3, "blocks_made": 2},
     "; took 200/201 immediate wins (99%), made 2/3 forced blocks (66%)"),
    (None, ""),
])
def test_the_tactics_line_shows_counts_and_rates(tactics, line):
    assert tactics_line(tactics) == line
