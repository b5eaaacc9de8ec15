"""The perfect judge of connect four: the BitBully solver, with its 12-ply opening book.

``solver`` plays a best move of every position: among the moves of the best value (Pons' score: a win
sooner scores higher, a loss later scores less low), one drawn at random, seeded. ``solver:E`` is the same
player that, with probability E in [0, 1), plays a uniformly random legal move instead: a judge a policy
can score against from either seat (with perfect play the first player wins connect four, so against
``solver`` itself a perfect policy scores 1 as first player and 0 as second).

Like ``mcts:N`` (evaluation/judges.py) it is a judge, never a training opponent. Unlike it, it reads each
position alone: the board determines the position (the pieces' count gives the side to move), so it
answers batches of positions as the bots do (``act_batch``).

Conventions (checked against our env and pyspiel by tests/evaluation/test_solver.py): an action is a column,
0 the leftmost, in our env, in pyspiel and in BitBully; BitBully's player 1 is the first player (our seat 0,
pyspiel's player 0); its row-major array has the top row first, as our observation does.

Values: ``Solver.move_values`` gives each move's score for the player to move: > 0 the mover wins with best
play after it (``WIN``), 0 a draw (``DRAW``), < 0 a loss (``LOSS``); ``outcome`` maps a score to one of those.

Cost on one core: 1,000 positions of 0-35 plies in 5-15 s, most of it the few positions just past the book.

This module imports BitBully only when a solver is built (``require_bitbully``).
"""

from __future__ import annotations

import re

import numpy as np

from impala_league.config import UserError

SOLVER_KIND = "solver"
"""The judge kind ``solver`` (perfect play) and ``solver:E`` (a random move with probability E)."""
SOLVER_FORM = "solver or solver:E"
"""How a solver judge is written: E, the probability of a random legal move, a decimal in [0, 1)."""
SOLVER_GAMES = ("connect_four",)
"""The games the solver solves."""
BITBULLY_PIN = "bitbully==0.0.79 bitbully-databases==0.0.2"
"""The versions requirements.txt pins; named by the error when BitBully is missing."""
WIN, DRAW, LOSS = 1, 0, -1
"""Outcomes of a position or move for the player to move, with best play from there on."""
ILLEGAL = -1000
"""``Solver.move_values`` of a move that is not legal."""


class SolverMissing(UserError, ImportError):
    """A solver was asked for where BitBully is not installed; says how to install it."""


def is_solver_spec(spec: str) -> bool:
    """True if ``spec`` names the solver kind (``solver`` or ``solver:...``), valid or not (``parse_solver``)."""
    return spec == SOLVER_KIND or spec.startswith(SOLVER_KIND + ":")


def parse_solver(spec: str, env_name: str) -> float:
    """The random-move probability E of ``"solver"`` (0) or ``"solver:E"``; nothing is imported.

    Raises:
      ValueError, one line naming the valid forms: E not a decimal in [0, 1); or ``env_name`` not a game the
        solver solves (tic-tac-toe's perfect player is ``minimax:9``).
    """
    kind, colon, text = spec.partition(":")
    epsilon = None
    if kind == SOLVER_KIND and not colon:
        epsilon = 0.0
    elif kind == SOLVER_KIND and re.fullmatch(r"0?\.[0-9]{1,6}|0", text):
        epsilon = float(text)
    if epsilon is None:
        raise ValueError(f"judge {spec!r}: the solver's forms are {SOLVER_FORM}, E the probability of a random "
                         "legal move in [0, 1) (e.g. solver:0.2)")
    if env_name not in SOLVER_GAMES:
        other = " (tic-tac-toe's perfect player is minimax:9)" if env_name == "tictactoe" else ""
        raise ValueError(f"judge {spec!r} solves only {' and '.join(SOLVER_GAMES)}, not {env_name}{other}")
    return epsilon


def require_bitbully():
    """BitBully's ``BitBully`` and ``Board``, imported, with its opening book's package.

    Raises:
      SolverMissing: bitbully or bitbully-databases is not installed; the message names the install command.
    """
    try:
        import bitbully_databases  # noqa: F401  (the opening book BitBully loads)
        from bitbully import BitBully, Board
    except ImportError as e:
        raise SolverMissing(f"the solver judge needs BitBully, which is not installed ({e}): run "
                            f".venv/bin/python -m pip install {BITBULLY_PIN} (or scripts/bootstrap.sh)") from None
    return BitBully, Board


def outcome(score: int) -> int:
    """``WIN``, ``DRAW`` or ``LOSS`` of a solver score for the player to move."""
    return int(np.sign(score))


class Solver:
    """BitBully with its default opening book (12 plies, with distances), scoring positions of our env.

    Observations are ours: int8 ``[N, 6, 7, 2]``, channel 0 the mover's pieces, row 0 the top row.
    """

    ROWS, COLS = 6, 7

    def __init__(self):
        """Raises SolverMissing where BitBully is not installed."""
        bitbully, self._board = require_bitbully()
        self._engine = bitbully(opening_book="default")

    def board(self, observation: np.ndarray):
        """BitBully's ``Board`` of one observation ``[6, 7, 2]``.

        Raises:
          ValueError: not ``[6, 7, 2]``, a cell with two pieces, or piece counts no game reaches (the mover
            has as many pieces as the opponent, or one fewer).
        """
        observation = np.asarray(observation)
        if observation.shape != (self.ROWS, self.COLS, 2):
            raise ValueError(f"solver: expected an observation of shape (6, 7, 2), got {observation.shape}")
        mine, theirs = observation[..., 0] != 0, observation[..., 1] != 0
        if (mine & theirs).any() or int(theirs.sum()) - int(mine.sum()) not in (0, 1):
            raise ValueError(f"solver: no game reaches this board ({int(mine.sum())} pieces of the player to "
                             f"move, {int(theirs.sum())} of the other)")
        first, second = (mine, theirs) if mine.sum() == theirs.sum() else (theirs, mine)
        return self._board.from_array((first * 1 + second * 2).astype(int).tolist())

    def move_values(self, observations: np.ndarray) -> np.ndarray:
        """int64 ``[N, 7]``: the score of every move for the player to move (module docstring), ``ILLEGAL``
        where the column is full, for observations ``[N, 6, 7, 2]``. Raises ValueError as ``board``."""
        values = np.full((len(observations), self.COLS), ILLEGAL, dtype=np.int64)
        for n, observation in enumerate(observations):
            for column, score in self._engine.score_all_moves(self.board(observation)).items():
                values[n, column] = score
        return values


class SolverJudge:
    """``solver`` / ``solver:E`` as a player of our env: a batch of positions at once, like a ``Bot``.

    name: its spec. A seeded judge given the same calls makes the same choices.
    """

    def __init__(self, game: str, epsilon: float = 0.0, seed: int | None = None):
        """Raises ValueError for a game the solver does not solve or E outside [0, 1), SolverMissing without
        BitBully."""
        if game not in SOLVER_GAMES:
            raise ValueError(f"the solver solves {' and '.join(SOLVER_GAMES)}, not {game}")
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"solver: the random-move probability {epsilon} is outside [0, 1)")
        self.solver = Solver()
        self.epsilon = epsilon
        self.name = SOLVER_KIND if epsilon == 0 else f"{SOLVER_KIND}:{epsilon:g}"
        self._rng = np.random.default_rng(seed)

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray) -> np.ndarray:
        """int64 ``[N]``: a best move (ties drawn at random) of each position, or with probability E a random
        legal one; observations ``[N, 6, 7, 2]``, action_masks ``[N, 7]``.

        Raises:
          ValueError: a position without a legal move, or whose mask disagrees with the board.
        """
        legal = np.asarray(action_masks) != 0
        if not legal.any(1).all():
            raise ValueError("solver: a position has no legal move")
        values = self.solver.move_values(observations)
        if not np.array_equal(values > ILLEGAL, legal):
            raise ValueError("solver: the action mask disagrees with the board's free columns")
        best = values == values.max(1, keepdims=True)
        explore = self._rng.random(len(legal)) < self.epsilon
        candidates = np.where(explore[:, None], legal, best)
        return np.where(candidates, self._rng.random(candidates.shape), -1.0).argmax(1)
