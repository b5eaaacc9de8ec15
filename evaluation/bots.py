"""Baseline opponents for evaluation: a random bot and a one-ply tactical bot.

Every bot sees exactly what a learning agent sees in a PettingZoo classic game, namely one agent's
observation dict split into its two parts:

* ``observation``: int8 ``[H, W, 2]``; channel 0 holds the pieces of the player to move, channel 1
  the opponent's (1 = piece, 0 = empty).
* ``action_mask``: int8 ``[num_actions]``; 1 where the move is legal.

Board model. The tactical bot (and search bots built on it) simulate moves on a small board model,
``GridGame``, with one instance per supported game:

* ``CONNECT_FOUR``: 6 x 7 board, action = column 0..6; a piece falls to the highest empty row
  index (row 5 is the bottom row); 4 in a row wins.
* ``TICTACTOE``: 3 x 3 board, action = ``row * 3 + col`` of the observation grid (this is
  PettingZoo's ``board.squares`` index, since its observation is ``squares.reshape(3, 3)``);
  3 in a row wins.

A board is an int8 ``[H, W]`` array: ``TO_MOVE`` (+1) for pieces of the player to move in the
observation it came from, ``OPPONENT`` (-1) for the other player's, 0 for empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

TO_MOVE = 1
"""Board value of the pieces of the player to move (observation channel 0)."""
OPPONENT = -1
"""Board value of the opponent's pieces (observation channel 1)."""

# Line directions as (d_row, d_col): horizontal, vertical, diagonal, anti-diagonal.
_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


@dataclass(frozen=True)
class GridGame:
    """Rules of an n-in-a-row game on a grid, enough to simulate one-ply (or deeper) lookahead."""

    name: str
    """Game name as used by ``make_bot`` ("connect_four", "tictactoe")."""
    rows: int
    cols: int
    connect: int
    """Number of pieces in a line needed to win."""
    gravity: bool
    """True: an action is a column and the piece falls to the highest empty row index.
    False: an action is the cell ``row * cols + col``."""

    @property
    def num_actions(self) -> int:
        return self.cols if self.gravity else self.rows * self.cols

    def board_from_observation(self, observation: np.ndarray) -> np.ndarray:
        """Converts an int8 ``[rows, cols, 2]`` observation to an int8 ``[rows, cols]`` board.

        Raises:
          ValueError: if the observation shape is not ``(rows, cols, 2)``.
        """
        if observation.shape != (self.rows, self.cols, 2):
            raise ValueError(
                f"{self.name}: expected observation shape {(self.rows, self.cols, 2)}, "
                f"got {observation.shape}"
            )
        return (observation[..., 0] - observation[..., 1]).astype(np.int8)

    def legal_moves(self, board: np.ndarray) -> list[int]:
        """Actions that are legal on ``board`` (int8 ``[rows, cols]``), ascending."""
        if self.gravity:
            # A column is playable while its top cell (row 0) is empty.
            return [c for c in range(self.cols) if board[0, c] == 0]
        return [int(i) for i in np.flatnonzero(board.reshape(-1) == 0)]

    def target_cell(self, board: np.ndarray, move: int) -> tuple[int, int]:
        """The (row, col) a piece played with ``move`` would occupy on ``board``.

        Raises:
          ValueError: if ``move`` is out of range or not legal on ``board``.
        """
        if not 0 <= move < self.num_actions:
            raise ValueError(f"{self.name}: move {move} out of range [0, {self.num_actions})")
        if self.gravity:
            empty_rows = np.flatnonzero(board[:, move] == 0)
            if empty_rows.size == 0:
                raise ValueError(f"{self.name}: column {move} is full")
            return int(empty_rows[-1]), move
        row, col = divmod(move, self.cols)
        if board[row, col] != 0:
            raise ValueError(f"{self.name}: cell {move} is occupied")
        return row, col

    def play(self, board: np.ndarray, move: int, player: int) -> np.ndarray:
        """Returns a copy of ``board`` with ``player`` (TO_MOVE or OPPONENT) having played ``move``.

        Raises:
          ValueError: if ``move`` is not legal on ``board``.
        """
        row, col = self.target_cell(board, move)
        new_board = board.copy()
        new_board[row, col] = player
        return new_board

    def is_win(self, board: np.ndarray, player: int, row: int, col: int) -> bool:
        """True if ``player``'s piece at (row, col) lies on a line of ``connect`` of its pieces.

        Checking only lines through the last placed piece is enough to detect a game-ending move
        and is much cheaper than scanning the whole board.
        """
        for d_row, d_col in _DIRECTIONS:
            count = 1
            for sign in (1, -1):
                r, c = row + sign * d_row, col + sign * d_col
                while 0 <= r < self.rows and 0 <= c < self.cols and board[r, c] == player:
                    count += 1
                    r, c = r + sign * d_row, c + sign * d_col
            if count >= self.connect:
                return True
        return False

    def winning_moves(self, board: np.ndarray, player: int, moves: list[int]) -> list[int]:
        """The subset of ``moves`` with which ``player`` would win immediately on ``board``.

        ``board`` is modified during the call and restored before it returns.

        Raises:
          ValueError: if a move in ``moves`` is not legal on ``board``.
        """
        winners = []
        for move in moves:
            row, col = self.target_cell(board, move)
            # Place, test, undo: avoids a copy per candidate move.
            board[row, col] = player
            if self.is_win(board, player, row, col):
                winners.append(move)
            board[row, col] = 0
        return winners


CONNECT_FOUR = GridGame(name="connect_four", rows=6, cols=7, connect=4, gravity=True)
TICTACTOE = GridGame(name="tictactoe", rows=3, cols=3, connect=3, gravity=False)
GAMES: dict[str, GridGame] = {g.name: g for g in (CONNECT_FOUR, TICTACTOE)}
"""Games with a board model, keyed by the env name used in configs."""

BOT_SPECS = ("random", "tactical")


class Bot(Protocol):
    def act(self, observation: np.ndarray, action_mask: np.ndarray) -> int:
        """Chooses a legal action.

        Args:
          observation: int8 ``[H, W, 2]``, channel 0 = pieces of the player to move.
          action_mask: int8 ``[num_actions]``, 1 = legal.

        Returns:
          An action index with ``action_mask[action] == 1``.
        """
        ...


def _legal_actions(action_mask: np.ndarray) -> np.ndarray:
    legal = np.flatnonzero(action_mask)
    if legal.size == 0:
        raise ValueError("action_mask has no legal move")
    return legal


class RandomBot:
    """Plays a uniformly random legal move; works for any game with an action mask."""

    def __init__(self, seed: int | None = None):
        self._rng = np.random.default_rng(seed)

    def act(self, observation: np.ndarray, action_mask: np.ndarray) -> int:
        """See ``Bot.act``. Raises ValueError if ``action_mask`` has no legal move."""
        return int(self._rng.choice(_legal_actions(action_mask)))


class TacticalBot:
    """One-ply tactics: win now if possible, else block the opponent's immediate win, else random.

    Ties among several winning (or blocking) moves are broken uniformly at random.
    """

    def __init__(self, game: str, seed: int | None = None):
        """Raises ValueError if ``game`` has no board model (see ``GAMES``)."""
        if game not in GAMES:
            raise ValueError(f"TacticalBot: unsupported game {game!r}; choose one of {sorted(GAMES)}")
        self.game = GAMES[game]
        self._rng = np.random.default_rng(seed)

    def act(self, observation: np.ndarray, action_mask: np.ndarray) -> int:
        """See ``Bot.act``.

        Raises:
          ValueError: if ``action_mask`` has no legal move or the observation shape does not
            match the game.
        """
        legal = [int(a) for a in _legal_actions(action_mask)]
        board = self.game.board_from_observation(observation)
        candidates = self.game.winning_moves(board, TO_MOVE, legal)
        if not candidates:
            # A cell where the opponent would complete a line must be taken now.
            candidates = self.game.winning_moves(board, OPPONENT, legal)
        if not candidates:
            candidates = legal
        return int(self._rng.choice(candidates))


def make_bot(spec: str, env_name: str, seed: int | None = None) -> Bot:
    """Builds a baseline bot.

    Args:
      spec: "random" or "tactical".
      env_name: game name; "tactical" needs one of ``GAMES`` ("connect_four", "tictactoe"),
        "random" accepts any name since it only reads the action mask.
      seed: seed of the bot's np.random.Generator; None = nondeterministic.

    Raises:
      ValueError: unknown ``spec``, or "tactical" with a game that has no board model.
    """
    if spec == "random":
        return RandomBot(seed)
    if spec == "tactical":
        if env_name not in GAMES:
            raise ValueError(
                f"bot 'tactical' does not support env {env_name!r}; choose one of {sorted(GAMES)}"
            )
        return TacticalBot(env_name, seed)
    raise ValueError(f"unknown bot spec {spec!r}; choose one of {list(BOT_SPECS)}")
