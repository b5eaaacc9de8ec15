"""Foreign players judged by our judges: OpenSpiel's observation tensor read from our observation, move by
move against pyspiel itself, and evaluate_player playing the games evaluate plays for a checkpoint."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from impala_league.agents.model import make_model
from impala_league.agents.policy import Policy
from impala_league.checked_config import load_config
from impala_league.envs.registry import env_spec, make_env
from impala_league.evaluation.bots import make_bot
from impala_league.evaluation.evaluate import evaluate
from impala_league.evaluation.foreign import evaluate_player, spiel_observation_tensors
from impala_league.evaluation.judges import OPENSPIEL_GAMES

openspiel = pytest.mark.skipif(importlib.util.find_spec("pyspiel") is None, reason="open-spiel is not installed")


@openspiel
@pytest.mark.parametrize("env_name", ["connect_four", "tictactoe"])
def test_the_tensor_is_pyspiels_own_at_every_move_of_random_games(env_name):
    import pyspiel

    game = pyspiel.load_game(OPENSPIEL_GAMES[env_name].name)
    rng = np.random.default_rng(0)
    checked = 0
    for k in range(8):
        env, state = make_env(env_name, k), game.new_initial_state()
        step = env.advance()
        while not step.episodes:
            ours = spiel_observation_tensors(env_name, np.stack(step.observations))
            assert ours.dtype == np.float32 and ours.shape == (1, game.observation_tensor_size())
            np.testing.assert_array_equal(ours[0], np.asarray(state.observation_tensor(), dtype=np.float32))
            legal = np.flatnonzero(step.action_masks[0])
            assert legal.tolist() == sorted(state.legal_actions())  # the same action numbers
            move = int(rng.choice(legal))
            env.act([move])
            state.apply_action(move)
            step = env.advance()
            checked += 1
        assert state.is_terminal()
    assert checked > 40


def test_the_tensor_refuses_positions_no_game_reaches_and_games_openspiel_lacks():
    board = np.zeros((1, 6, 7, 2), dtype=np.int8)
    board[0, 5, 0:2, 0] = 1  # two pieces of the mover, none of the opponent
    with pytest.raises(ValueError, match="position 0 has 2 pieces of the player to move and 0"):
        spiel_observation_tensors("connect_four", board)
    with pytest.raises(ValueError, match="not battle"):
        spiel_observation_tensors("battle", board)


def test_connect_four_second_seat_to_move_reads_as_openspiels_player_one():
    """x played column 3 (the bottom cell, row 5 of ours, row 0 of OpenSpiel's): o, to move, sees it as its
    opponent's piece; OpenSpiel's x plane (0) holds it, the o plane (1) is empty, the empty plane (2) lacks it."""
    board = np.zeros((1, 6, 7, 2), dtype=np.int8)
    board[0, 5, 3, 1] = 1
    tensor = spiel_observation_tensors("connect_four", board).reshape(3, 6, 7)
    assert tensor[0].sum() == 1 and tensor[0, 0, 3] == 1 and tensor[1].sum() == 0
    assert tensor[2].sum() == 41 and tensor[2, 0, 3] == 0


def small_policy() -> Policy:
    cfg = load_config(None, ["env.name=connect_four", "agent.torso=mlp", "agent.hidden=16"])
    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    return Policy(make_model(spec, cfg.agent), cfg, spec)


def test_a_player_meets_the_games_evaluate_plays_for_a_checkpoint():
    """The same seeds: a policy judged as a foreign player gets evaluate's outcomes and tactics, seat by seat,
    against the random bot, whose games differ with another seed."""
    policy = small_policy()
    ours = evaluate(policy, "random", 6, seed=5)
    foreign = evaluate_player(policy, "connect_four", "random", 6, seed=5)
    assert foreign["seats"] == ours["seats"] and foreign["opponent"] == "random"
    assert foreign["games_per_seat"] == 6 and set(foreign["seats"]) == set(policy.spec.seats)
    assert evaluate_player(policy, "connect_four", "random", 6, seed=6)["seats"] != ours["seats"]


@openspiel
def test_a_bot_as_player_plays_the_mcts_judge_in_both_seats():
    """minimax:4 against mcts:20 in lockstep (the judge checks every position), scores in [0, 1]; the
    same seed gives the same result."""
    player = make_bot("minimax:4", "connect_four", seed=0)
    first = evaluate_player(player, "connect_four", "mcts:20", 2, seed=3)
    for seat in first["seats"].values():
        assert seat["games"] == 2 and seat["wins"] + seat["draws"] + seat["losses"] == 2
    assert evaluate_player(make_bot("minimax:4", "connect_four", seed=0), "connect_four", "mcts:20", 2,
                           seed=3) == first


def exported_mlp(folder, rng, corrupt: float = 0.0):
    """A random MLP 126 -> 8 (tanh) -> 7 written as bench/rllib_policy.py exports RLlib's, and the
    function it is (numpy)."""
    from bench.rllib_policy import write_mlp

    w1, b1 = rng.normal(size=(8, 126)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    w2, b2 = rng.normal(size=(7, 8)).astype(np.float32), rng.normal(size=7).astype(np.float32)

    def mlp(x):
        return np.tanh(x @ w1.T + b1) @ w2.T + b2

    check = rng.integers(0, 2, size=(5, 126)).astype(np.float32)
    write_mlp(folder, [(w1, b1, "Tanh"), (w2, b2, None)], check, mlp(check) + corrupt, {"progress": {}})
    return mlp


def test_an_exported_policy_plays_its_legal_column_of_highest_logit(tmp_path):
    from bench.rllib_policy import MLPPlayer
    from impala_league.evaluation.positions import undecided_positions

    rng = np.random.default_rng(0)
    mlp = exported_mlp(tmp_path, rng)
    player = MLPPlayer.load(tmp_path)
    positions = undecided_positions(40, seed=0)
    logits = mlp(spiel_observation_tensors("connect_four", positions.observations))
    expected = np.where(positions.action_masks == 1, logits, -np.inf).argmax(1)
    assert player.act_batch(positions.observations, positions.action_masks).tolist() == expected.tolist()
    only_last = np.zeros_like(positions.action_masks)
    only_last[:, 6] = 1
    assert set(player.act_batch(positions.observations, only_last).tolist()) == {6}  # never an illegal column


def test_an_export_whose_check_logits_it_does_not_reproduce_is_refused(tmp_path):
    from bench.rllib_policy import MLPPlayer

    exported_mlp(tmp_path, np.random.default_rng(1), corrupt=0.01)
    with pytest.raises(ValueError, match="differ from RLlib's by up to 0.01"):
        MLPPlayer.load(tmp_path)
