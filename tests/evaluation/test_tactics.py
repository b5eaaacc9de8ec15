"""One-move tactics counted over finished games, against hand-worked games."""

from __future__ import annotations

import pytest

from impala_league.evaluation.bots import CONNECT_FOUR, TICTACTOE
from impala_league.evaluation.tactics import Tactics, count_tactics

# Tic-tac-toe cells: 0 1 2 / 3 4 5 / 6 7 8; seat 0 (X) moves first.
# X misses its win at 2 (plays 8), after O failed to block that threat (played 4); O then wins at 5.
MISSED = (0, 3, 1, 4, 8, 5)
# O blocks X's threat at 2; X then blocks O's threat on the diagonal 2-4-6 at 6.
BLOCKED = (0, 4, 1, 2, 6)


def test_tictactoe_counts_match_the_hand_worked_games():
    assert count_tactics(TICTACTOE, [MISSED, BLOCKED], seat=0) == Tactics(win_chances=1, wins_taken=0,
                                                                        block_chances=1, blocks_made=1)
    assert count_tactics(TICTACTOE, [MISSED, BLOCKED], seat=1) == Tactics(win_chances=1, wins_taken=1,
                                                                        block_chances=2, blocks_made=1)
    rates = count_tactics(TICTACTOE, [MISSED, BLOCKED], seat=1).as_dict()
    assert rates["wins_taken_rate"] == 1.0 and rates["blocks_made_rate"] == 0.5


def test_connect_four_two_threats_are_no_block_chance_and_a_win_counts_once():
    # X builds 3-4-5 on the bottom row; O stacks on top and faces two threats (2 and 6); X wins at 6.
    game = (3, 3, 4, 4, 5, 5, 6)
    assert count_tactics(CONNECT_FOUR, [game], seat=0) == Tactics(win_chances=1, wins_taken=1)
    assert count_tactics(CONNECT_FOUR, [game], seat=1) == Tactics()
    assert Tactics().as_dict()["wins_taken_rate"] is None


def test_an_illegal_move_in_a_record_is_an_error():
    with pytest.raises(ValueError, match="occupied"):
        count_tactics(TICTACTOE, [(0, 0)], seat=0)
