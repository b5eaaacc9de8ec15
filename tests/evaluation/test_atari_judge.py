"""The cross-game judge: a two-player Atari policy (atari2p:pong) as first_0 of the one-player game
(ALE/Pong-v5 under gymnasium's own wrappers) against the built-in player; what it sees, and the inputs
it refuses."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

import run
from impala_league.agents.checkpoint import save_checkpoint
from impala_league.agents.network import ActorCritic
from impala_league.agents.policy import load_policy
from impala_league.analysis.report import evaluation_table
from impala_league.config import load_config, to_yaml
from impala_league.envs import atari2p
from impala_league.envs.registry import env_spec
from impala_league.evaluation.atari_judge import (JudgeError, judge, judge_line, make_judged_game, one_player_game,
                                                  seat_in_game)
from impala_league.evaluation.atari_protocol import ProtocolError
from impala_league.evaluation.final import final_evaluation

pytest.importorskip("multi_agent_ale_py")
ROOT = Path(__file__).resolve().parents[2]
FRAMES = 400  # the time limit of a test game, in emulator frames: 100 agent steps


def write_checkpoint(path: Path, env: str, *overrides: str, step: int = 10) -> Path:
    """A randomly initialised policy of `env` (a narrow shallow conv torso on frames, an MLP on boards), in the
    learner's checkpoint format."""
    torso = ["agent.torso=mlp", "agent.hidden=16", "agent.mlp_layers=1"] if env == "connect_four" else \
        ["agent.torso=shallow", "agent.hidden=32"]
    cfg = load_config(None, [f"env.name={env}", *torso, *overrides])
    spec = env_spec(env, cfg.env.kwargs)
    torch.manual_seed(0)
    save_checkpoint(path, ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent, spec.obs_image), None,
                    to_yaml(cfg), {"step": step, "agent_steps_trained": 4 * step})
    return path


@pytest.fixture(scope="module")
def pong(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("judge") / "pong.safetensors", "atari2p:pong")


def gymnasium_pong(max_frames: int):
    """ALE/Pong-v5 under gymnasium's wrappers, built here as the issue states the protocol."""
    env = gymnasium.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=max_frames)
    return FrameStackObservation(AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84), 4)


def test_two_player_pong_draws_the_one_player_screen_and_first_0_is_its_right_paddle():
    two = atari2p.make_atari2p("pong", {"noop_max": 0, "sticky_actions": 0.0}).raw
    one = gymnasium.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0).unwrapped
    two.reset(seed=0)
    one.reset(seed=0)
    assert [int(a) for a in two.action_mapping] == [int(a.value) for a in one.ale.getMinimalActionSet()] \
        == [0, 1, 3, 4, 11, 12]
    screen = np.zeros((210, 160), np.uint8)
    for t in range(120):
        action = 2 if t % 40 < 20 else 3  # RIGHT (up), then LEFT (down)
        two.step({"first_0": action, "second_0": 0})
        one.step(action)
        two.ale.getScreenGrayscale(screen)
        if t == 0:
            continue  # the first frame after a reset is drawn before the game's palette is set
        theirs = one.ale.getScreenGrayscale()
        assert set(np.unique(screen)) == set(np.unique(theirs)) == {0, 87, 147, 148, 236}
        # The right paddle (columns 140-143 of the field) moves alike; the left one is the other player.
        np.testing.assert_array_equal(screen[34:194, 140:144], theirs[34:194, 140:144], err_msg=f"frame {t}")
    assert one_player_game("atari2p:pong") == "atari:Pong" and one_player_game("connect_four") is None


def test_the_policy_sees_gymnasiums_frames_and_its_own_plane_and_reruns_agree(pong, monkeypatch):
    policy = load_policy(pong, seed=3)
    seen: dict[int, list[tuple[np.ndarray, int]]] = {0: [], 1: []}  # per game: (observation, action) a step
    act_batch = policy.act_batch

    def spy(observations, masks, greedy=True, streams=None):
        actions = act_batch(observations, masks, greedy, streams)
        for k, observation, action in zip(streams, observations, actions.tolist()):
            seen[k].append((observation.copy(), action))
        return actions

    monkeypatch.setattr(policy, "act_batch", spy)
    result = judge(policy, "atari:Pong", "first_0", 2, seed=7, greedy=False, max_episode_frames=FRAMES,
                   protocol="deterministic")  # replayed below in a gymnasium Pong without sticky actions
    assert result["games"] == 2 and result["truncated"] == 2 and result["losses"] == 2  # the untrained one misses
    assert result["mean_return"] == sum(result["returns"]) / 2 < 0
    first = seen[0][0][0]
    assert first.shape == (6, 84, 84) and first.dtype == np.uint8
    for observation, _ in seen[0] + seen[1]:
        assert (observation[4] == 255).all() and (observation[5] == 0).all()  # first_0's plane lit
    # atari2p's own observation of first_0 ends with the same planes.
    own = atari2p.make_atari2p("pong", {}).reset(seed=0)[0]["first_0"]
    np.testing.assert_array_equal(own[4:], first[4:])
    # The frames are those of gymnasium's wrappers, game k seeded seed + k, replaying the policy's actions,
    # to the time limit (the no-op start's frames count).
    for k in range(2):
        reference = gymnasium_pong(FRAMES)
        frames, _ = reference.reset(seed=7 + k)
        total, ended, cut = 0.0, False, False
        for step, (observation, action) in enumerate(seen[k]):
            assert not (ended or cut)
            np.testing.assert_array_equal(observation[:4], frames, err_msg=f"game {k}, step {step}")
            frames, reward, ended, cut, _ = reference.step(action)
            total += reward
        assert cut and not ended and total == result["returns"][k]
        assert FRAMES // 4 - 8 <= len(seen[k]) <= FRAMES // 4  # 1 to 30 no-op frames
    assert result["mean_length"] == (len(seen[0]) + len(seen[1])) / 2
    again = judge(load_policy(pong, seed=3), "atari:Pong", "first_0", 2, seed=7, greedy=False,
                  max_episode_frames=FRAMES, protocol="deterministic")
    assert again == result
    assert judge_line(result).startswith("atari:Pong (ALE/Pong-v5) as first_0 of atari2p:pong against the built-in "
                                         "player, 2 games, deterministic protocol, sampled: mean return -")


def test_the_judge_plays_sticky_actions_by_default_and_a_rerun_plays_the_same_games(pong):
    assert make_judged_game("ALE/Pong-v5").unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    assert make_judged_game("ALE/Pong-v5", protocol="deterministic").unwrapped.ale.getFloat(
        "repeat_action_probability") == 0.0
    with pytest.raises(ProtocolError, match="unknown Atari evaluation protocol 'machado'; valid: sticky, deterministic"):
        make_judged_game("ALE/Pong-v5", protocol="machado")
    first, again = (judge(load_policy(pong, seed=3), "atari:Pong", "first_0", 2, seed=7, max_episode_frames=FRAMES)
                    for _ in range(2))
    assert first == again
    assert first["protocol"] == {"name": "sticky", "sticky_actions": 0.25, "frame_skip": 4, "noop_max": 30,
                                 "max_episode_frames": FRAMES, "full_action_space": False, "games": 2}
    assert 1 <= first["distinct_returns"] <= 2 and first["interval"] is not None


def test_seats_games_and_policies_that_do_not_fit_are_refused(pong, tmp_path):
    policy = load_policy(pong)
    with pytest.raises(JudgeError, match=r"atari2p:pong has no player 'third_0'; its players: first_0, second_0"):
        seat_in_game(policy, "atari:Pong", "third_0")
    with pytest.raises(JudgeError, match="second_0 is the built-in player's side there: use --seat first_0"):
        seat_in_game(policy, "atari:Pong", "second_0")
    with pytest.raises(JudgeError, match="another game than .*: its one-player game is atari:Pong"):
        seat_in_game(policy, "atari:Boxing", "first_0")
    with pytest.raises(JudgeError, match="one-player Atari game atari:<Game> \\(atari2p:pong's is atari:Pong\\)"):
        seat_in_game(policy, "tictactoe", "first_0")
    skip3 = load_policy(write_checkpoint(tmp_path / "skip3.safetensors", "atari2p:pong", "env.kwargs.frame_skip=3"))
    with pytest.raises(JudgeError, match="env.kwargs.frame_skip=3; the judge plays atari:Pong with frame_skip=4"):
        seat_in_game(skip3, "atari:Pong", "first_0")
    full = load_policy(write_checkpoint(tmp_path / "full.safetensors", "atari2p:pong",
                                        "env.kwargs.full_action_space=true"))
    with pytest.raises(JudgeError, match=r"full_action_space=true\); atari:Pong plays its minimal action set "
                                         r"\[0, 1, 3, 4, 11, 12\]"):
        seat_in_game(full, "atari:Pong", "first_0")
    mirrored = load_policy(write_checkpoint(tmp_path / "mirrored.safetensors", "atari2p:pong",
                                            "env.kwargs.mirrored_players=[first_0]"))
    with pytest.raises(JudgeError, match=r"saw first_0's frames flipped left to right \(env.kwargs.mirrored_players\)"):
        seat_in_game(mirrored, "atari:Pong", "first_0")
    assert seat_in_game(load_policy(write_checkpoint(tmp_path / "ego.safetensors", "atari2p:pong",
                                                     "env.kwargs.mirrored_players=[second_0]")),
                        "atari:Pong", "first_0").seat == "first_0"
    bare = load_policy(write_checkpoint(tmp_path / "bare.safetensors", "atari2p:pong",
                                        "env.kwargs.agent_indicator=false"))
    assert seat_in_game(bare, "atari:Pong", "first_0").planes.shape == (0, 84, 84)  # the frames alone


def test_run_py_refuses_bad_input_in_one_line_with_exit_2(pong, tmp_path, capsys):
    board = write_checkpoint(tmp_path / "c4.safetensors", "connect_four")
    done = subprocess.run([sys.executable, "run.py", "evaluate", "--checkpoint", str(board), "--env", "atari:Pong",
                           "--seat", "first_0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"error: {board} plays connect_four; the judge plays a policy of a two-player "
                                        "Atari game (atari2p:<game>, e.g. atari2p:pong) in its one-player game "
                                        "(atari:<Game>)"]
    one_player = write_checkpoint(tmp_path / "pong1p.safetensors", "atari:Pong")
    for args, expected in (
            (["--checkpoint", str(pong), "--env", "atari:Pong", "--seat", "third_0"], "has no player 'third_0'"),
            (["--checkpoint", str(one_player), "--env", "atari:Pong", "--seat", "first_0"], "a one-player game"),
            (["--checkpoint", str(pong), "--seat", "first_0"], "--seat needs --env atari:<Game>"),
            (["--checkpoint", str(pong), "--env", "atari:Pong", "--seat", "first_0", "--opponent", "random"],
             "--opponent does not go with --seat")):
        assert run.main(["evaluate", *args]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and expected in err and "Traceback" not in err


def test_the_final_evaluation_plays_the_built_in_player_apart_from_the_training_opponents(tmp_path, caplog):
    run_dir = tmp_path / "run"
    overrides = ("env.kwargs.max_cycles=400", "evaluation.built_in_games=2", "run.wandb_mode=disabled")
    checkpoint = write_checkpoint(run_dir / "checkpoints" / "latest.safetensors", "atari2p:pong", *overrides, step=20)
    write_checkpoint(run_dir / "checkpoints" / "history" / "0000010.safetensors", "atari2p:pong", *overrides, step=10)
    cfg = load_config(None, ["env.name=atari2p:pong", "agent.torso=shallow", "agent.hidden=32", *overrides])
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    with caplog.at_level(logging.INFO, logger="run"):
        final_evaluation(cfg, checkpoint, 1, run_dir, history=1, history_games=1)
    record = json.loads((run_dir / "evaluation.json").read_text())
    built_in = record["built_in_player"]
    assert set(record["opponents"]["random"]) == {"first", "second"}  # the training opponents' table, as before
    assert (built_in["env"], built_in["seat"], built_in["games"], built_in["max_episode_frames"]) == \
        ("atari:Pong", "first_0", 2, 400)  # cut at the run's own max_cycles
    assert built_in["truncated"] == 2 and len(built_in["returns"]) == 2
    over = record["over_training"]
    assert [e["step"] for e in over] == [10, 20] and over[-1]["built_in_player"] == built_in
    assert over[0]["built_in_player"]["games"] == 2 and over[0]["built_in_player"]["seed"] == 0
    assert "held out: atari:Pong (ALE/Pong-v5) as first_0 of atari2p:pong against the built-in player, 2 games" \
        in caplog.text
    assert "update 10, 40 agent steps, in atari:Pong vs the built-in player: mean return" in caplog.text
    table = evaluation_table(record)
    assert "as first_0 against the game's built-in player, greedy, seed 0" in table
    assert table.count("<td>2</td><td>") == 2  # one row per policy (the games column)
