"""Baseline opponents for evaluation: a random bot, a one-ply tactical bot and a minimax searcher.

Every bot sees exactly what a learning agent sees in a PettingZoo classic game, namely one agent's
observation dict split into its two parts:

* ``observation``: int8 ``[H, W, 2]``; channel 0 holds the pieces of the player to move, channel 1
  the opponent's (1 = piece, 0 = empty).
* ``action_mask``: int8 ``[num_actions]``; 1 where the move is legal.

Board model. The tactical and minimax bots simulate moves on a small board model,
``GridGame``, with one instance per supported game:

* ``CONNECT_FOUR``: 6 x 7 board, action = column 0..6; a piece falls to the highest empty row
  index (row 5 is the bottom row); 4 in a row wins.
* ``TICTACTOE``: 3 x 3 board, action = ``row * 3 + col`` of the observation grid (this is
  PettingZoo's ``board.squares`` index, since its observation is ``squares.reshape(3, 3)``);
  3 in a row wins.

A board is a list of ``H`` rows of ``W`` ints (``board[row][col]``): ``TO_MOVE`` (+1) for pieces
of the player to move in the observation it came from, ``OPPONENT`` (-1) for the other player's, 0
for empty. Plain lists, because the search reads single cells: indexing a Python list is about ten
times cheaper than indexing a numpy array. Functions that only read a board also take an int8
``[H, W]`` array.

Every bot also answers a batch of positions at once (``act_batch``), as the actors ask it for all
envs it plays in. Shallow minimax (``FULL_WIDTH_MAX_DEPTH``) and the tactical bot search a batch with
numpy, on counts of each player's pieces per line (``GridGame.window_matrix``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from impala_league.evaluation.judges import (JUDGE_FORM, JUDGE_KIND, MCTSJudge, check_judge_spec, is_judge_spec,
                                             parse_judge)
from impala_league.evaluation.solver import SOLVER_FORM, SOLVER_KIND, SolverJudge, is_solver_spec, parse_solver

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

    @cached_property
    def windows(self) -> np.ndarray:
        """int64 ``[num_windows, connect]``: flat board indices of every line of ``connect`` cells.

        Connect four has 69 (24 horizontal, 21 vertical, 12 per diagonal), tic-tac-toe 8.
        """
        lines = []
        for d_row, d_col in _DIRECTIONS:
            for row in range(self.rows):
                for col in range(self.cols):
                    cells = [(row + i * d_row, col + i * d_col) for i in range(self.connect)]
                    if all(0 <= r < self.rows and 0 <= c < self.cols for r, c in cells):
                        lines.append([r * self.cols + c for r, c in cells])
        return np.array(lines, dtype=np.int64)

    @cached_property
    def window_matrix(self) -> np.ndarray:
        """int8 ``[rows * cols, num_windows]``: 1 where the flat cell lies on the window. A board's
        pieces ``[N, rows * cols]`` times this matrix count each player's pieces per window."""
        matrix = np.zeros((self.rows * self.cols, len(self.windows)), dtype=np.int8)
        for w, cells in enumerate(self.windows):
            matrix[cells, w] = 1
        return matrix

    def boards_from_observations(self, observations: np.ndarray) -> np.ndarray:
        """int8 ``[N, rows * cols]`` flat boards (``TO_MOVE`` +1, ``OPPONENT`` -1) of observations
        ``[N, rows, cols, 2]``.

        Raises:
          ValueError: if the observations are not ``[N, rows, cols, 2]``.
        """
        if observations.ndim != 4 or observations.shape[1:] != (self.rows, self.cols, 2):
            raise ValueError(f"{self.name}: expected observations of shape [N, {self.rows}, {self.cols}, 2], "
                             f"got {observations.shape}")
        boards = observations[..., 0].astype(np.int8) - observations[..., 1]
        return boards.reshape(len(boards), -1)

    def line_counts(self, boards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pieces of ``TO_MOVE`` and of ``OPPONENT`` per window: two int8 ``[N, num_windows]`` for flat
        boards int8 ``[N, rows * cols]``."""
        return ((boards == TO_MOVE).astype(np.int8) @ self.window_matrix,
                (boards == OPPONENT).astype(np.int8) @ self.window_matrix)

    def target_cells(self, filled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For occupancy ``filled`` bool ``[N, rows * cols]``: which moves are legal, bool
        ``[N, num_actions]``, and the flat cell each would fill, int64 ``[N, num_actions]`` (a cell
        of the move's column where it is not legal)."""
        if not self.gravity:
            return ~filled, np.broadcast_to(np.arange(self.num_actions), filled.shape)
        heights = filled.reshape(len(filled), self.rows, self.cols).sum(1)
        rows = self.rows - 1 - np.minimum(heights, self.rows - 1)
        return heights < self.rows, rows * self.cols + np.arange(self.cols)

    def board_from_observation(self, observation: np.ndarray) -> list[list[int]]:
        """Converts an int8 ``[rows, cols, 2]`` observation to a board (``rows`` lists of ``cols`` ints).

        Raises:
          ValueError: if the observation shape is not ``(rows, cols, 2)``.
        """
        if observation.shape != (self.rows, self.cols, 2):
            raise ValueError(
                f"{self.name}: expected observation shape {(self.rows, self.cols, 2)}, "
                f"got {observation.shape}"
            )
        return (observation[..., 0].astype(np.int8) - observation[..., 1]).tolist()

    def legal_moves(self, board) -> list[int]:
        """Actions that are legal on ``board``, ascending."""
        if self.gravity:
            # A column is playable while its top cell (row 0) is empty.
            return [c for c in range(self.cols) if board[0][c] == 0]
        return [r * self.cols + c for r in range(self.rows) for c in range(self.cols) if board[r][c] == 0]

    def target_cell(self, board, move: int) -> tuple[int, int]:
        """The (row, col) a piece played with ``move`` would occupy on ``board``.

        Raises:
          ValueError: if ``move`` is out of range or not legal on ``board``.
        """
        if not 0 <= move < self.num_actions:
            raise ValueError(f"{self.name}: move {move} out of range [0, {self.num_actions})")
        if self.gravity:
            for row in range(self.rows - 1, -1, -1):
                if board[row][move] == 0:
                    return row, move
            raise ValueError(f"{self.name}: column {move} is full")
        row, col = divmod(move, self.cols)
        if board[row][col] != 0:
            raise ValueError(f"{self.name}: cell {move} is occupied")
        return row, col

    def play(self, board, move: int, player: int) -> list[list[int]]:
        """Returns a copy of ``board`` with ``player`` (TO_MOVE or OPPONENT) having played ``move``.

        Raises:
          ValueError: if ``move`` is not legal on ``board``.
        """
        row, col = self.target_cell(board, move)
        new_board = [list(cells) for cells in board]
        new_board[row][col] = player
        return new_board

    def is_win(self, board, player: int, row: int, col: int) -> bool:
        """True if ``player``'s piece at (row, col) lies on a line of ``connect`` of its pieces.

        Checking only lines through the last placed piece is enough to detect a game-ending move
        and is much cheaper than scanning the whole board.
        """
        for d_row, d_col in _DIRECTIONS:
            count = 1
            for sign in (1, -1):
                r, c = row + sign * d_row, col + sign * d_col
                while 0 <= r < self.rows and 0 <= c < self.cols and board[r][c] == player:
                    count += 1
                    r, c = r + sign * d_row, c + sign * d_col
            if count >= self.connect:
                return True
        return False

    def winning_moves(self, board: list[list[int]], player: int, moves: list[int]) -> list[int]:
        """The subset of ``moves`` with which ``player`` would win immediately on ``board``.

        ``board`` is modified during the call and restored before it returns.

        Raises:
          ValueError: if a move in ``moves`` is not legal on ``board``.
        """
        winners = []
        for move in moves:
            row, col = self.target_cell(board, move)
            # Place, test, undo: avoids a copy per candidate move.
            board[row][col] = player
            if self.is_win(board, player, row, col):
                winners.append(move)
            board[row][col] = 0
        return winners


CONNECT_FOUR = GridGame(name="connect_four", rows=6, cols=7, connect=4, gravity=True)
TICTACTOE = GridGame(name="tictactoe", rows=3, cols=3, connect=3, gravity=False)
GAMES: dict[str, GridGame] = {g.name: g for g in (CONNECT_FOUR, TICTACTOE)}
"""Games with a board model, keyed by the env name used in configs."""

BOT_SPECS = ("random", "tactical", "minimax:D", JUDGE_FORM, SOLVER_FORM)
"""Bot spec forms accepted by ``make_bot``; D is the search depth in plies, N the simulations a move of
OpenSpiel's MCTS, E the random-move probability of connect four's solver (the outside judges,
``evaluation/judges.py`` and ``evaluation/solver.py``: never league members)."""

MAX_MINIMAX_DEPTH: dict[str, int] = {"connect_four": 8, "tictactoe": 9}
"""Deepest search per game. Tic-tac-toe: 9 plies reach the end of every game (perfect play).
Connect four: 8 plies take about 0.1 s per move (0.5 s at worst); 9 would take up to 4 s and 10 up
to 18 s per move in this pure-Python search, too slow for evaluating over many games."""


class Bot:
    """A baseline player of a board game. Subclasses implement `act_batch`; `act` is one position of it.

    A seeded bot given the same calls makes the same choices.
    """

    def act(self, observation: np.ndarray, action_mask: np.ndarray) -> int:
        """Chooses a legal action.

        Args:
          observation: int8 ``[H, W, 2]``, channel 0 = pieces of the player to move.
          action_mask: int8 ``[num_actions]``, 1 = legal.

        Returns:
          An action index with ``action_mask[action] == 1``.

        Raises:
          ValueError: if ``action_mask`` has no legal move, or (bots with a board model) the observation's
            shape does not match the game.
        """
        return int(self.act_batch(observation[None], action_mask[None])[0])

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray) -> np.ndarray:
        """``act`` for N positions: observations int8 ``[N, H, W, 2]``, action_masks int8
        ``[N, num_actions]`` -> actions int64 ``[N]``. Raises ValueError as ``act`` does, for any of the
        positions."""
        raise NotImplementedError


def _legal_mask(action_masks: np.ndarray) -> np.ndarray:
    legal = np.asarray(action_masks) != 0
    if legal.ndim != 2:
        raise ValueError(f"action_masks must be [N, num_actions], got shape {legal.shape}")
    if not legal.any(1).all():
        raise ValueError(f"action_mask has no legal move (position {int(np.flatnonzero(~legal.any(1))[0])})")
    return legal


def _choose(rng: np.random.Generator, candidates: np.ndarray) -> np.ndarray:
    """One candidate per row, uniformly at random: int64 [N] for candidates bool [N, A] (each row with
    at least one). One draw per batch: the candidate with the largest uniform key."""
    return np.where(candidates, rng.random(candidates.shape), -1.0).argmax(1)


class RandomBot(Bot):
    """Plays a uniformly random legal move; works for any game with an action mask."""

    def __init__(self, seed: int | None = None):
        self._rng = np.random.default_rng(seed)

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray) -> np.ndarray:
        """See ``Bot.act_batch``. Raises ValueError if a position has no legal move."""
        return _choose(self._rng, _legal_mask(action_masks))


class TacticalBot(Bot):
    """One-ply tactics: win now if possible, else block the opponent's immediate win, else random.

    Ties among several winning (or blocking) moves are broken uniformly at random.
    """

    def __init__(self, game: str, seed: int | None = None):
        """Raises ValueError if ``game`` has no board model (see ``GAMES``)."""
        if game not in GAMES:
            raise ValueError(f"TacticalBot: unsupported game {game!r}; choose one of {sorted(GAMES)}")
        self.game = GAMES[game]
        self._rng = np.random.default_rng(seed)

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray) -> np.ndarray:
        """See ``Bot.act_batch``. Raises ValueError as ``act`` does, for any of the positions."""
        legal = _legal_mask(action_masks)
        boards = self.game.boards_from_observations(observations)
        mine, theirs = self.game.line_counts(boards)
        _, cells = self.game.target_cells(boards != 0)
        # A line the mover would complete with the move, or one the opponent would complete there.
        wins = (mine[:, None, :] + self.game.window_matrix[cells] == self.game.connect).any(-1) & legal
        blocks = (theirs[:, None, :] + self.game.window_matrix[cells] == self.game.connect).any(-1) & legal
        candidates = np.where(wins.any(1, keepdims=True), wins, np.where(blocks.any(1, keepdims=True), blocks, legal))
        return _choose(self._rng, candidates)


WIN_SCORE = 1_000_000
"""Negamax value of a win on the first ply; a win found on ply p scores ``WIN_SCORE - p``."""

# Leaf weights of a window (a line of `connect` cells) that holds k pieces of one player only and
# no piece of the other, by how many pieces it still lacks: one (an open three in connect four,
# an open two in tic-tac-toe) or two (an open two in connect four). All else scores 0.
_LACKS_ONE, _LACKS_TWO = 5, 2
CENTRE_WEIGHT = 3
"""Connect four: leaf value of a piece in the centre column, for its owner (see ``_centre_weights``)."""
_INF = 10**9
# Best root moves by (game, depth, board bytes, legal moves), shared by every MinimaxBot.
_best_moves_cache: dict[tuple, list[int]] = {}
_BEST_MOVES_CACHE_SIZE = 100_000


def _centre_weights(game: GridGame) -> np.ndarray:
    """int64 ``[rows * cols]``: leaf value of a piece of ``TO_MOVE`` on each flat cell (an ``OPPONENT``
    piece there counts the negative).

    Connect four: ``CENTRE_WEIGHT`` per piece in the centre column, 0 elsewhere. A centre piece lies on
    the most lines of four, but the line values count only lines with two or more pieces, so without
    this every opening move scores alike. Weights 1..3 on the columns next to it as well played worse
    against the line values alone than the centre column alone (docs/evaluation.md, "Evaluate a policy").
    Tic-tac-toe: none. Its line values already prefer the centre, which lies on 4 lines (a corner on
    3, an edge on 2), each worth ``_LACKS_TWO`` while it holds one piece.
    """
    weights = np.zeros((game.rows, game.cols), dtype=np.int64)
    if game.name == "connect_four":
        weights[:, game.cols // 2] = CENTRE_WEIGHT
    return weights.reshape(-1)


def _line_values(connect: int) -> np.ndarray:
    """int64 ``[(connect + 1) ** 2]``: leaf value of a window for ``TO_MOVE``, indexed by
    ``mine * (connect + 1) + theirs`` where mine / theirs count ``TO_MOVE`` / ``OPPONENT`` pieces on it."""
    table = np.zeros((connect + 1) ** 2, dtype=np.int64)
    weight = {connect - 1: _LACKS_ONE, connect - 2: _LACKS_TWO}
    for pieces in range(connect + 1):
        table[pieces * (connect + 1)] = weight.get(pieces, 0)  # only TO_MOVE's pieces
        table[pieces] = -weight.get(pieces, 0)  # only OPPONENT's
    return table


FULL_WIDTH_MAX_DEPTH = 3
"""``minimax:D`` up to this depth searches every move (no pruning) for a batch of positions at once
with numpy: connect four at depth 2 takes 30-46 us per position in batches of 32, about 20 times less
than alpha-beta one position at a time (``bench/bench_env.py``). Deeper searches use alpha-beta."""


class MinimaxBot(Bot):
    """Depth-limited negamax over a ``GridGame`` board.

    Values are from the point of view of the player to move: ``WIN_SCORE - p`` for a win on ply p
    (sooner wins score higher, later losses less low), 0 for a full board, and at the depth limit
    the heuristic ``evaluate``. Among root moves of equal value one is drawn at random (seeded).

    Up to ``FULL_WIDTH_MAX_DEPTH`` plies, a batch of positions is searched at once, every move
    (``move_values``). Deeper, each position is searched with alpha-beta pruning (``scores``),
    children centre-first, which prunes more and cannot change the chosen value; its best moves are
    cached per position (the search is deterministic; only the tie-break is random), so positions met
    again, such as openings and every tic-tac-toe position, cost nothing.

    Cost on one core, connect four, per move by alpha-beta: ``minimax:2`` about 0.2 ms over positions
    of random games (``bench/bench_env.py`` times both searches); measured with numpy boards, before
    boards became lists (which cut ``minimax:2`` by a third): mean / worst over a minimax-vs-minimax game
    ``minimax:4`` 3 / 8 ms, ``minimax:6`` 22 / 70 ms, ``minimax:8`` 0.1 / 0.5 s. Tic-tac-toe
    ``minimax:9`` from the empty board: 0.12 s.
    """

    def __init__(self, game: str, depth: int, seed: int | None = None):
        """Raises ValueError if ``game`` has no board model or ``depth`` is outside [1, max]."""
        if game not in GAMES:
            raise ValueError(f"MinimaxBot: unsupported game {game!r}; choose one of {sorted(GAMES)}")
        max_depth = MAX_MINIMAX_DEPTH[game]
        if not 1 <= depth <= max_depth:
            raise ValueError(f"minimax depth {depth} is out of range for {game}: choose 1..{max_depth}")
        self.game = GAMES[game]
        self.depth = depth
        self._rng = np.random.default_rng(seed)
        self._line_values = _line_values(self.game.connect)
        self._centre = _centre_weights(self.game)
        # Centre-first order of moves, by distance of the move's column (or cell) from the centre.
        centre_row, centre_col = (self.game.rows - 1) / 2, (self.game.cols - 1) / 2
        if self.game.gravity:
            key = lambda a: abs(a - centre_col)  # noqa: E731
        else:
            key = lambda a: abs(a // self.game.cols - centre_row) + abs(a % self.game.cols - centre_col)  # noqa: E731
        self._order = sorted(range(self.game.num_actions), key=key)

    def evaluate(self, board) -> int:
        """Heuristic value of ``board`` for ``TO_MOVE``: lines plus centre.

        Lines: sum over every window (``GridGame.windows``) holding pieces of one player only:
        +5 / +2 if ``TO_MOVE``'s pieces lack one / two cells of a full line, -5 / -2 for
        ``OPPONENT``'s. In connect four these are open threes and open twos.
        Centre (connect four): +3 per ``TO_MOVE`` piece in the centre column, -3 per ``OPPONENT``
        piece there (``CENTRE_WEIGHT``, ``_centre_weights``). Without it every opening move scores alike.
        """
        flat = np.asarray(board, dtype=np.int8).reshape(1, -1)
        mine, theirs = self.game.line_counts(flat)
        return int(self._value_of_lines(mine, theirs).sum()) + int(flat[0].astype(np.int64) @ self._centre)

    def _value_of_lines(self, mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
        """Leaf value per window for the player whose pieces per window are ``mine``, against ``theirs``
        (int8 [..., num_windows], broadcast together)."""
        return self._line_values[mine * (self.game.connect + 1) + theirs]  # int8 indices: 7x faster than intp

    def move_values(self, boards: np.ndarray) -> np.ndarray:
        """Negamax values for ``TO_MOVE`` of every move on flat boards int8 ``[N, rows * cols]``:
        int64 ``[N, num_actions]``, ``-_INF`` where a move is illegal. Full width to ``self.depth``
        plies, so each value is exact: where ``scores`` gives a value, the two agree."""
        mine, theirs = self.game.line_counts(boards)
        return self._move_values(mine, theirs, boards.astype(np.int64) @ self._centre, boards != 0, self.depth, 1)

    def _move_values(self, mine: np.ndarray, theirs: np.ndarray, centre: np.ndarray, filled: np.ndarray,
                     depth: int, ply: int) -> np.ndarray:
        """Values [M, A] of the moves (ply ``ply``) of the player to move, with pieces per window
        ``mine`` [M, W] against the opponent's ``theirs`` [M, W], centre term ``centre`` int64 [M] (its
        own minus the opponent's, see ``evaluate``) and occupied cells ``filled`` [M, K], searched
        ``depth`` plies. The same rules as ``_negamax``: a win on ply p scores ``WIN_SCORE - p``; a
        full board 0; at the depth limit ``evaluate``."""
        legal, cells = self.game.target_cells(filled)
        moves = legal.shape[1]
        child_mine = mine[:, None, :] + self.game.window_matrix[cells]  # [M, A, W]
        child_centre = centre[:, None] + self._centre[cells]  # [M, A]; the centre term is linear in the pieces
        wins = (child_mine == self.game.connect).any(-1)
        child_filled = np.repeat(filled[:, None, :], moves, 1)
        m, a = np.nonzero(legal)
        child_filled[m, a, cells[m, a]] = True
        if depth == 1:  # the opponent, to move on the child, values it by its lines and the centre
            child = self._value_of_lines(theirs[:, None, :], child_mine).sum(-1) - child_centre
        else:
            replies = self._move_values(np.repeat(theirs, moves, 0), child_mine.reshape(-1, child_mine.shape[-1]),
                                        -child_centre.reshape(-1), child_filled.reshape(-1, filled.shape[-1]),
                                        depth - 1, ply + 1)
            child = replies.max(1).reshape(legal.shape)
        child[child_filled.all(-1)] = 0
        values = -child
        values[wins] = WIN_SCORE - ply
        values[~legal] = -_INF
        return values

    def scores(self, board: list[list[int]], legal: list[int]) -> dict[int, int]:
        """Negamax value, for ``TO_MOVE``, of each move in ``legal`` that ties or beats the best.

        Moves proven worse than the best are left out (alpha-beta cannot give their exact value).
        ``board`` is modified during the call and restored before it returns.
        """
        values: dict[int, int] = {}
        best = -_INF
        for move in self._ordered(legal):
            row, col = self.game.target_cell(board, move)
            board[row][col] = TO_MOVE
            if self.game.is_win(board, TO_MOVE, row, col):
                value = WIN_SCORE - 1
            else:
                # Window (best - 1, inf): a move worth exactly `best` is still valued exactly,
                # so every tie is found; worse moves fail low and are dropped.
                beta = _INF if best == -_INF else -(best - 1)
                value = -self._negamax(board, OPPONENT, self.depth - 1, -_INF, beta, 2)
            board[row][col] = 0
            if value >= best:
                best = value
                values[move] = value
        return {m: v for m, v in values.items() if v == best}

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray) -> np.ndarray:
        """See ``Bot.act_batch``. Raises ValueError as ``act`` does, for any of the positions."""
        legal = _legal_mask(action_masks)
        boards = self.game.boards_from_observations(observations)
        if self.depth <= FULL_WIDTH_MAX_DEPTH:
            values = np.where(legal, self.move_values(boards), -_INF)
            return _choose(self._rng, values == values.max(1, keepdims=True))
        best = np.zeros_like(legal)
        for n, (observation, board, moves) in enumerate(zip(observations, boards, legal)):
            best[n, self._best_moves(observation, board, moves)] = True
        return _choose(self._rng, best)

    def _best_moves(self, observation: np.ndarray, board: np.ndarray, legal: np.ndarray) -> list[int]:
        """The best moves by alpha-beta (``scores``), ascending, cached per position."""
        moves = np.flatnonzero(legal).tolist()
        key = (self.game.name, self.depth, observation.tobytes(), tuple(moves))
        best = _best_moves_cache.get(key)
        if best is None:
            best = sorted(self.scores(board.reshape(self.game.rows, self.game.cols).tolist(), moves))
            if len(_best_moves_cache) >= _BEST_MOVES_CACHE_SIZE:
                _best_moves_cache.clear()  # bounds memory; refilling is cheap
            _best_moves_cache[key] = best
        return best

    def _ordered(self, moves: list[int]) -> list[int]:
        allowed = set(moves)
        return [m for m in self._order if m in allowed]

    def _negamax(self, board: list[list[int]], player: int, depth: int, alpha: int, beta: int, ply: int) -> int:
        """Value of ``board`` for ``player`` (to move), searched ``depth`` plies; moves here are ply ``ply``.

        Fail-hard alpha-beta: exact when the value lies in (alpha, beta), else a bound on that side.
        """
        moves = self._ordered(self.game.legal_moves(board))
        if not moves:
            return 0  # full board: draw
        if depth == 0:
            return player * self.evaluate(board)
        # A win now beats anything deeper; finding it first saves searching the other moves.
        cells = [self.game.target_cell(board, move) for move in moves]
        for row, col in cells:
            board[row][col] = player
            won = self.game.is_win(board, player, row, col)
            board[row][col] = 0
            if won:
                return WIN_SCORE - ply
        for row, col in cells:
            board[row][col] = player
            value = -self._negamax(board, -player, depth - 1, -beta, -alpha, ply + 1)
            board[row][col] = 0
            if value > alpha:
                alpha = value
                if alpha >= beta:
                    break
        return alpha


def parse_minimax_depth(spec: str, env_name: str) -> int:
    """The depth D of a ``"minimax:D"`` spec.

    Raises:
      ValueError: D missing or not an integer, D outside [1, ``MAX_MINIMAX_DEPTH[env_name]``],
        or ``env_name`` without a board model.
    """
    if env_name not in GAMES:
        raise ValueError(f"bot {spec!r} does not support env {env_name!r}; choose one of {sorted(GAMES)}")
    _, _, depth_text = spec.partition(":")
    max_depth = MAX_MINIMAX_DEPTH[env_name]
    try:
        depth = int(depth_text)
    except ValueError:
        raise ValueError(f"bot {spec!r}: the depth must be an integer, as in 'minimax:2' "
                         f"(1..{max_depth} for {env_name})") from None
    if not 1 <= depth <= max_depth:
        raise ValueError(f"bot {spec!r}: depth {depth} is out of range for {env_name}; choose 1..{max_depth}")
    return depth


def is_bot_spec(spec: str) -> bool:
    """True if ``spec`` names a bot kind (``random``, ``tactical``, ``minimax`` or ``minimax:...``, or a
    judge ``mcts``, ``mcts:...``, ``solver``, ``solver:...``), whether or not its parameters are valid;
    ``make_bot`` checks those."""
    return spec in ("random", "tactical", "minimax") or spec.startswith("minimax:") or is_judge_spec(spec)


def league_bot(spec: str, env_name: str, seed: int) -> Bot | None:
    """The bot a league member id names, or None when it names no bot kind (a learner, a snapshot): the
    bot factory an actor is handed (league.opponents.BotFactory). Raises ValueError as `make_bot`, and for
    a judge (``mcts:N``, ``solver``), which is never a training opponent."""
    if is_judge_spec(spec):
        raise ValueError(f"{spec!r} is a judge, never a league member (evaluation/judges.py)")
    return make_bot(spec, env_name, seed) if is_bot_spec(spec) else None


def check_bot_spec(spec: str, env_name: str) -> None:
    """Raise ValueError, as ``make_bot`` would, if ``spec`` cannot play ``env_name``; builds nothing for a
    judge (its spec is parsed, OpenSpiel not imported)."""
    if is_judge_spec(spec):
        check_judge_spec(spec, env_name)
    else:
        make_bot(spec, env_name)


def make_bot(spec: str, env_name: str, seed: int | None = None) -> Bot | MCTSJudge | SolverJudge:
    """Builds a baseline bot.

    Args:
      spec: "random", "tactical", "minimax:D" (negamax searching D plies; D in
        [1, ``MAX_MINIMAX_DEPTH[env_name]``]: 9 for tictactoe, where 9 is perfect play, 8 for
        connect_four) or the judge "mcts:N" (OpenSpiel's MCTSBot, N simulations a move, connect_four
        and tictactoe; see ``evaluation/judges.py``: it follows whole games in ``play_games``), or the
        judge "solver" / "solver:E" (connect four's perfect player; see ``evaluation/solver.py``).
      env_name: game name; "tactical" and "minimax:D" need one of ``GAMES`` ("connect_four",
        "tictactoe"), "random" accepts any name since it only reads the action mask.
      seed: seed of the bot's np.random.Generator; None = nondeterministic.

    Raises:
      ValueError: unknown ``spec``, a bad minimax depth or judge, or a board bot with a game that has no
        board model.
      judges.OpenSpielMissing: an MCTS judge where open-spiel is not installed.
      solver.SolverMissing: the solver where bitbully is not installed.
    """
    if is_solver_spec(spec):
        return SolverJudge(env_name, parse_solver(spec, env_name), seed)
    if is_judge_spec(spec):
        return MCTSJudge(env_name, parse_judge(spec, env_name), seed)
    if spec == "random":
        return RandomBot(seed)
    if spec == "tactical":
        if env_name not in GAMES:
            raise ValueError(
                f"bot 'tactical' does not support env {env_name!r}; choose one of {sorted(GAMES)}"
            )
        return TacticalBot(env_name, seed)
    if spec.startswith("minimax:"):
        return MinimaxBot(env_name, parse_minimax_depth(spec, env_name), seed)
    if spec == "minimax":
        raise ValueError("bot 'minimax' needs a search depth, as in 'minimax:2'; "
                         f"bot specs: {', '.join(repr(s) for s in BOT_SPECS)}")
    raise ValueError(f"unknown bot spec {spec!r}{did_you_mean(spec)}; choose one of "
                     f"{', '.join(repr(s) for s in BOT_SPECS)}")


BOT_KINDS = ("random", "tactical", "minimax", JUDGE_KIND, SOLVER_KIND)  # a spec's part before ':'


def did_you_mean(spec: str) -> str:
    """" (did you mean 'tactical'?)" for a misspelled kind (the part of `spec` before ':', close to one of
    BOT_KINDS by difflib), with the rest of the spec kept ('minimx:2' -> 'minimax:2'); '' if none is close."""
    kind, sep, rest = spec.partition(":")
    close = difflib.get_close_matches(kind.lower(), BOT_KINDS, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}{sep}{rest}'?)" if close else ""
