"""One-move tactics of a player over finished games of connect four or tic-tac-toe.

Outcomes say how often a player lost; these counts say why. At each of the player's moves:

* a *win chance* is a position where some legal move wins at once; the player *took* it if it
  played one of them;
* a *block chance* is a position with no winning move where the opponent threatens to win at
  exactly one cell; the player *blocked* if it played there. (Against two threats nothing
  helps, so those positions are not counted.)

A policy that beats a one-ply bot only most of the time usually misses some of these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from impala_league.evaluation.bots import OPPONENT, TO_MOVE, GridGame


@dataclass
class Tactics:
    """Counts over a player's moves (see the module docstring for the definitions)."""

    win_chances: int = 0
    wins_taken: int = 0
    block_chances: int = 0
    blocks_made: int = 0

    def as_dict(self) -> dict:
        """The counts and the two rates (None where there was no chance)."""
        return {**asdict(self),
                "wins_taken_rate": self.wins_taken / self.win_chances if self.win_chances else None,
                "blocks_made_rate": self.blocks_made / self.block_chances if self.block_chances else None}


def count_tactics(game: GridGame, games: Iterable[tuple[int, ...]], seat: int) -> Tactics:
    """Tactics of the player in `seat` (0 moves first) over `games`, each the sequence of actions of a
    turn-based game of `game` in order of play (`GameRecord.actions`).

    Raises ValueError if a game holds an illegal move.
    """
    tactics = Tactics()
    for actions in games:
        board = [[0] * game.cols for _ in range(game.rows)]
        for ply, action in enumerate(actions):
            if ply % 2 == seat:
                legal = game.legal_moves(board)
                wins = game.winning_moves(board, TO_MOVE, legal)
                if wins:
                    tactics.win_chances += 1
                    tactics.wins_taken += action in wins
                else:
                    threats = game.winning_moves(board, OPPONENT, legal)
                    if len(threats) == 1:
                        tactics.block_chances += 1
                        tactics.blocks_made += action == threats[0]
            row, col = game.target_cell(board, action)
            board[row][col] = TO_MOVE if ply % 2 == seat else OPPONENT
    return tactics
