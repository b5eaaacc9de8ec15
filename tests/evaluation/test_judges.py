"""The outside judge mcts:N: its specs and their errors, its rule against training opponents, OpenSpiel's
MCTSBot kept in lockstep with our env, its seeds, and what it plays."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from impala_league.config import ConfigError
from impala_league.envs.base import EpisodeResult, Step
from impala_league.envs.registry import env_spec, make_env
from impala_league.evaluation.bots import BOT_SPECS, league_bot, make_bot
from impala_league.evaluation.evaluate import count_outcomes, play_games, score_interval
from impala_league.evaluation.judges import (LockstepError, MCTSJudge, OpenSpielMissing, check_judges, parse_judge,
                                             require_openspiel, resolve_judges)
from impala_league.checked_config import load_config

openspiel = pytest.mark.skipif(importlib.util.find_spec("pyspiel") is None, reason="open-spiel is not installed")


@pytest.mark.parametrize("spec", ["mcts:0", "mcts:-5", "mcts:abc", "mcts", "mcts:", "mcts:1e3", "mcts: 40",
                                  "mcts:100001", "mcts:040"])
def test_a_bad_judge_spec_is_one_line_naming_the_valid_form(spec):
    with pytest.raises(ValueError) as e:
        parse_judge(spec, "connect_four")
    assert "\n" not in str(e.value) and "mcts:N" in str(e.value) and repr(spec) in str(e.value)


def test_a_judge_names_the_games_openspiel_has():
    assert parse_judge("mcts:400", "connect_four") == 400 and parse_judge("mcts:1", "tictactoe") == 1
    with pytest.raises(ValueError, match="connect_four and tictactoe, not battle"):
        parse_judge("mcts:400", "battle")
    with pytest.raises(ValueError, match="connect_four and tictactoe, not battle"):
        make_bot("mcts:400", "battle")
    assert "mcts:N" in BOT_SPECS


def test_judges_are_never_training_opponents_nor_named_twice():
    check_judges(("mcts:100", "minimax:4"), "connect_four", ("random", "tactical", "minimax:2"))  # fine
    with pytest.raises(ValueError, match="'mcts:100' is named twice"):
        check_judges(("mcts:100", "mcts:400", "mcts:100"), "connect_four", ())
    with pytest.raises(ValueError, match="league.bots: 'mcts:50' is a judge, and a judge is never a training opponent"):
        check_judges(("mcts:100",), "connect_four", ("random", "mcts:50"))  # any mcts, listed as a judge or not
    with pytest.raises(ValueError, match="'minimax:4' is a judge.*or from evaluation.judges"):
        check_judges(("minimax:4",), "connect_four", ("minimax:4",))
    with pytest.raises(ValueError, match="never a league member"):
        league_bot("mcts:100", "connect_four", 0)
    assert resolve_judges(None, "connect_four") == ("mcts:100", "mcts:400", "mcts:1600")
    assert resolve_judges(None, "battle") == () and resolve_judges([], "tictactoe") == ()


def test_the_config_refuses_a_judge_among_the_league_bots_and_a_bad_ladder():
    with pytest.raises(ConfigError, match="^league.bots: 'mcts:400' is a judge"):
        load_config(None, ["league.enabled=true", "league.bots=[random,mcts:400]"])
    with pytest.raises(ConfigError, match="^evaluation.judges: judge 'mcts:100' is named twice"):
        load_config(None, ["evaluation.judges=[mcts:100,mcts:100]"])
    with pytest.raises(ConfigError, match="^evaluation.judges: judge 'mcts:400' plays only .* not cue_recall"):
        load_config(None, ["env.name=cue_recall", "agent.torso=mlp", "evaluation.judges=[mcts:400]"])
    assert load_config(None, ["env.name=cue_recall", "agent.torso=mlp"]).evaluation.judges is None  # no ladder there


def test_run_py_exits_2_with_one_line_for_a_bad_judge(capsys):
    import run

    assert run.main(["config", "--set", "evaluation.judges=[mcts:abc]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "mcts:N" in err and "'mcts:abc'" in err


def test_without_openspiel_the_error_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspiel", None)  # `import pyspiel` raises ImportError
    with pytest.raises(OpenSpielMissing, match=r"pip install open-spiel==2\.0\.2"):
        require_openspiel()
    with pytest.raises(OpenSpielMissing, match="scripts/bootstrap.sh"):
        make_bot("mcts:10", "tictactoe")


@openspiel
def test_the_judge_takes_a_win_in_one_before_blocking():
    """x: 0 1, o: 3 4 on tic-tac-toe's grid (cell row * 3 + col); x to move wins with 2, o threatens 5."""
    for seed in range(3):
        judge = MCTSJudge("tictactoe", 20, seed)
        env = make_env("tictactoe", 0)
        step = env.advance()
        judge.begin(1, env_spec("tictactoe").agent_seats, [step])
        for move in (0, 3, 1, 4):
            env.act([move])
            step = env.advance()
            judge.follow(0, [move], step)
        assert judge.act_games([0], np.stack(step.observations), np.stack(step.action_masks)).tolist() == [2]


@openspiel
def test_a_desync_is_an_error_never_silent():
    spec = env_spec("connect_four")
    env = make_env("connect_four", 0)
    step = env.advance()
    judge = MCTSJudge("connect_four", 10, 0)
    judge.begin(1, spec.agent_seats, [step])
    env.act([3])
    step = env.advance()
    with pytest.raises(LockstepError, match="game 0, after move 1: boards differ"):
        judge.follow(0, [4], step)  # the env played column 3
    judge.begin(1, spec.agent_seats, [make_env("connect_four", 0).advance()])
    ended = Step(agents=[0], observations=step.observations, action_masks=step.action_masks,
                 episodes=[EpisodeResult(returns=(1.0, -1.0), length=1, winner=0)])
    with pytest.raises(LockstepError, match="the env's game ended .* OpenSpiel's goes on"):
        judge.follow(0, [3], ended)
    swapped = Step(agents=[0], observations=step.observations, action_masks=step.action_masks)  # seat 0 again
    judge.begin(1, spec.agent_seats, [make_env("connect_four", 0).advance()])
    with pytest.raises(LockstepError, match="OpenSpiel has player 1 to move, the env seats \\[0\\]"):
        judge.follow(0, [3], swapped)
    with pytest.raises(TypeError, match="follows whole games"):
        judge.act_batch(np.stack(step.observations), np.stack(step.action_masks))


@openspiel
@pytest.mark.parametrize("env", ["connect_four", "tictactoe"])
def test_a_rerun_with_the_same_seed_plays_the_same_games(env):
    def games(judge_seed: int):
        return [r.actions for r in play_games(env, (make_bot("mcts:20", env, judge_seed), make_bot("tactical", env, 1)),
                                              4, seed=0)]

    first = games(7)
    assert games(7) == first  # a fresh judge, the same seed: move for move the same
    assert games(8) != first  # another seed searches otherwise
    assert len(set(first)) > 1  # each game has its own random state


@openspiel
def test_mcts_with_the_solver_never_loses_tictactoe_to_random():
    """mcts:100, 20 games a seat (mcts:25 lost 2 of 20 as second seat with these seeds)."""
    first = count_outcomes(play_games("tictactoe", (make_bot("mcts:100", "tictactoe", 0),
                                                    make_bot("random", "tictactoe", 1)), 20, seed=0), 0)
    second = count_outcomes(play_games("tictactoe", (make_bot("random", "tictactoe", 1),
                                                     make_bot("mcts:100", "tictactoe", 5)), 20, seed=100), 1)
    assert first.losses == 0 and second.losses == 0
    assert first.wins >= 18 and second.wins >= 14  # and it wins: a judge that played as the wrong seat would not


def test_the_score_interval_is_wilson_on_the_score():
    assert score_interval(0.5, 50) == pytest.approx((0.3664, 0.6336), abs=1e-4)
    low, high = score_interval(1.0, 50)
    assert high == 1.0 and low == pytest.approx(0.9286, abs=1e-4)
    assert score_interval(0.74, 100) == pytest.approx((0.6463, 0.8160), abs=1e-4)


@openspiel
def test_a_judge_plays_in_a_round_robin_and_a_bad_one_is_refused_by_name():
    from impala_league.evaluation.tournament import PlayerError, resolve_players, round_robin

    with pytest.raises(PlayerError, match="player 'mcts:0': judge 'mcts:0': the judge form is mcts:N"):
        resolve_players(["mcts:0", "random"], "tictactoe")
    env, players = resolve_players(["mcts:200", "random"], "tictactoe")
    result = round_robin(env, players, 4, seed=3)
    by_name = {r["name"]: r for r in result["ratings"]}
    assert by_name["mcts:200"]["losses"] == 0 and by_name["mcts:200"]["wins"] >= 6  # 8 games against random
    assert round_robin(env, players, 4, seed=3)["matches"] == result["matches"]  # seeded: the same games again
