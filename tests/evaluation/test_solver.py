"""Connect four's perfect judge: its conventions against our env and pyspiel, known values, its specs and
their errors, its rule against training opponents, and the positions evaluation it scores."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from impala_league.checked_config import load_config
from impala_league.config import ConfigError
from impala_league.envs.registry import make_env
from impala_league.evaluation.bots import league_bot, make_bot
from impala_league.evaluation.evaluate import play_games
from impala_league.evaluation.judges import check_judges
from impala_league.evaluation.positions import (PHASES, player_moves, score_moves, solved_positions,
                                                undecided_positions)
from impala_league.evaluation.solver import ILLEGAL, Solver, SolverMissing, parse_solver, require_bitbully

pyspiel = pytest.importorskip("pyspiel")
bitbully = pytest.importorskip("bitbully")


def test_conventions_agree_with_our_env_and_pyspiel_move_by_move():
    """Column index, side to move and the board, over whole random games played in all three at once."""
    from open_spiel.python.algorithms import minimax

    solver, game, rng = Solver(), pyspiel.load_game("connect_four"), np.random.default_rng(0)
    checked_late = 0
    for k in range(40):
        env, state, moves = make_env("connect_four", k), game.new_initial_state(), []
        step = env.advance()
        while not step.episodes:
            board = solver.board(step.observations[0])
            assert board.to_array() == bitbully.Board.from_moves(moves).to_array()  # the same columns
            assert board.current_player() - 1 == state.current_player() == step.agents[0]  # the same mover
            assert np.flatnonzero(step.action_masks[0]).tolist() == state.legal_actions() == board.legal_moves()
            values = solver.move_values(np.stack(step.observations))[0]
            if len(moves) >= 30:  # few enough empty cells for pyspiel's exhaustive search to be quick
                value, _ = minimax.alpha_beta_search(game, state=state.clone(), maximizing_player_id=state.current_player())
                assert np.sign(values.max()) == value
                checked_late += 1
            move = int(rng.choice(state.legal_actions()))
            env.act([move])
            state.apply_action(move)
            moves.append(move)
            step = env.advance()
    assert checked_late >= 5


def test_known_values_the_first_player_wins_in_the_centre_only():
    """Allis (1988) and Tromp: from the empty board the centre column wins, its two neighbours draw, the
    rest lose; and a win in one is the best move."""
    solver = Solver()
    empty = np.zeros((1, 6, 7, 2), dtype=np.int8)
    assert np.sign(solver.move_values(empty)[0]).tolist() == [-1, -1, 0, 1, 0, -1, -1]
    # First player: three in the bottom row (columns 0-2); second player: columns 0-2 one row up. First to move.
    obs = np.zeros((6, 7, 2), dtype=np.int8)
    obs[5, 0:3, 0] = 1
    obs[4, 0:3, 1] = 1
    values = solver.move_values(obs[None])[0]
    assert values.argmax() == 3 and values.max() == (42 - 7) // 2 + 1  # Pons' score of a win on the 7th ply
    full = np.zeros((6, 7, 2), dtype=np.int8)
    full[:, 3, 0], full[:, 3, 1] = [1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 1]
    assert solver.move_values(full[None])[0][3] == ILLEGAL


def test_the_solver_never_loses_a_won_game_and_the_noisy_one_does_lose():
    records = play_games("connect_four", (make_bot("solver", "connect_four", 0), make_bot("random", "connect_four", 1)),
                         20, seed=0)
    assert all(r.winner == 0 for r in records)  # the first player wins connect four
    records = play_games("connect_four", (make_bot("random", "connect_four", 1), make_bot("solver", "connect_four", 0)),
                         20, seed=0)
    assert all(r.winner == 1 for r in records)  # and the second wins against a random first player
    perfect = make_bot("solver", "connect_four", 0)
    assert all(r.winner == 0 for r in play_games("connect_four", (perfect, perfect), 3, seed=0))
    noisy = play_games("connect_four", (make_bot("solver:0.9", "connect_four", 0), make_bot("solver", "connect_four", 2)),
                       20, seed=0)
    assert any(r.winner == 1 for r in noisy)


@pytest.mark.parametrize("spec", ["solver:", "solver:1", "solver:1.0", "solver:-0.1", "solver:abc", "solver:0.5.1",
                                  "solvers"])
def test_a_bad_solver_spec_is_one_line_naming_the_valid_forms(spec):
    with pytest.raises(ValueError) as e:
        parse_solver(spec, "connect_four") if spec != "solvers" else make_bot(spec, "connect_four")
    assert "\n" not in str(e.value) and repr(spec) in str(e.value) and "solver or solver:E" in str(e.value)


def test_the_solver_solves_connect_four_only_and_is_never_a_training_opponent():
    assert parse_solver("solver", "connect_four") == 0.0 and parse_solver("solver:0.25", "connect_four") == 0.25
    with pytest.raises(ValueError, match="solves only connect_four, not tictactoe .*minimax:9"):
        parse_solver("solver", "tictactoe")
    with pytest.raises(ValueError, match="never a league member"):
        league_bot("solver", "connect_four", 0)
    with pytest.raises(ValueError, match="'solver:0.2' is a judge, and a judge is never a training opponent"):
        check_judges(("solver",), "connect_four", ("tactical", "solver:0.2"))
    with pytest.raises(ConfigError, match="^league.bots: 'solver' is a judge"):
        load_config(None, ["league.enabled=true", "league.bots=[random,solver]"])
    with pytest.raises(ConfigError, match="^evaluation.judges: judge 'solver' solves only connect_four"):
        load_config(None, ["env.name=tictactoe", "evaluation.judges=[solver]"])


def test_without_bitbully_the_error_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitbully", None)  # `import bitbully` raises ImportError
    with pytest.raises(SolverMissing, match=r"pip install bitbully==0\.0\.79 bitbully-databases==0\.0\.2"):
        require_bitbully()
    with pytest.raises(SolverMissing):
        make_bot("solver", "connect_four")


def test_positions_are_seeded_distinct_unfinished_and_what_our_env_shows():
    positions = undecided_positions(120, seed=5)
    again = undecided_positions(120, seed=5)
    assert positions.moves == again.moves and not np.array_equal(positions.observations,
                                                                 undecided_positions(120, seed=6).observations)
    assert len({o.tobytes() for o in positions.observations}) == 120
    assert all(low < high for _, low, high in PHASES) and positions.plies.max() >= 20
    for moves, observation, mask in list(zip(positions.moves, positions.observations, positions.action_masks))[:40]:
        env = make_env("connect_four", 0)
        step = env.advance()
        for move in moves:
            assert not step.episodes
            env.act([move])
            step = env.advance()
        assert not step.episodes
        assert np.array_equal(step.observations[0], observation) and np.array_equal(step.action_masks[0], mask)


def test_scores_by_hand():
    """Four positions: won (moves worth +2, 0, -1), drawn (0, -3), lost (-1, -2), won (+1 only)."""
    positions = undecided_positions(4, seed=0)
    values = np.full((4, 7), ILLEGAL, dtype=np.int64)
    values[0, :3], values[1, :2], values[2, :2], values[3, :1] = [2, 0, -1], [0, -3], [-1, -2], [1]
    positions = type(positions)(positions.moves, positions.observations, (values > ILLEGAL).astype(np.int8),
                                np.array([0, 12, 25, 3]))
    r = score_moves(positions, values, np.array([1, 1, 0, 0]))  # won->drawn, drawn->lost, (lost), won kept
    assert r["lost"] == 1 and r["all"]["positions"] == 3
    assert r["all"]["optimal"] == pytest.approx(1 / 3) and r["all"]["blunder"] == pytest.approx(1 / 3)
    assert r["all"]["win_to_draw"] == pytest.approx(1 / 3)
    assert [p["positions"] for p in r["phases"].values()] == [2, 1, 0]
    assert r["phases"]["plies 10-19"]["blunder"] == 1.0 and r["phases"]["plies 20+"]["optimal_ci95"] is None
    with pytest.raises(ValueError, match="an illegal move"):
        score_moves(positions, values, np.array([5, 0, 0, 0]))


def test_the_perfect_player_scores_perfectly_and_minimax_is_between(tmp_path):
    positions, values = solved_positions(200, seed=1)
    perfect = score_moves(positions, values, player_moves(make_bot("solver", "connect_four", 0), positions))
    assert perfect["all"]["optimal"] == 1.0 and perfect["all"]["blunder"] == 0.0
    shallow = score_moves(positions, values, player_moves(make_bot("minimax:2", "connect_four", 0), positions))
    randomly = score_moves(positions, values, player_moves(make_bot("random", "connect_four", 0), positions))
    assert 0.0 < shallow["all"]["blunder"] < randomly["all"]["blunder"]
    json.dumps(perfect)


def test_run_py_positions_exits_2_with_one_line_for_a_bad_count(capsys):
    import run

    for count in ("0", "-5"):
        assert run.main(["evaluate", "--players", "minimax:2", "--env", "connect_four", "--positions", count]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--positions must be a count of positions in 1..100,000" in err
    assert run.main(["evaluate", "--players", "minimax:2", "--env", "tictactoe", "--positions", "10"]) == 2
    assert "solves connect_four, not tictactoe" in capsys.readouterr().err
    assert run.main(["evaluate", "--players", "minimax:2", "--env", "connect_four", "--positions", "30",
                     "--games", "3"]) == 2
    assert "--games does not go with --positions" in capsys.readouterr().err
    assert run.main(["evaluate", "--players", "minimax:2", "--env", "connect_four", "--positions", "30",
                     "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["minimax:2"]["count"] == 30 and set(out["minimax:2"]["phases"]) == {name for name, _, _ in PHASES}
