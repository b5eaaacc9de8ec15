"""Outside judges: players a policy is measured against and never trains against.

``mcts:N`` is OpenSpiel's own Monte-Carlo tree search, ``open_spiel.python.algorithms.mcts.MCTSBot``,
with the settings of OpenSpiel's examples: UCT exploration constant c = 2, one random rollout per leaf
(``RandomRolloutEvaluator(n_rollouts=1)``), the solver on (``solve=True``: proven wins, draws and losses
are backed up the tree, so a position it has solved is played as solved) and N simulations a move
(``max_simulations=N``). It plays the board games that OpenSpiel also has (``OPENSPIEL_GAMES``):
connect four and tic-tac-toe.

Lockstep. The games are played on our PettingZoo env (``evaluation.evaluate.play_games``); the judge
keeps one pyspiel state per game and applies every move of both players to it. At the start and after
every move it checks that the two agree: the side to move, the legal moves, the pieces on the board
and, at the end, that both ended on the same move with the same winner. Any disagreement raises
``LockstepError``; there is no silent desync. Actions are the same numbers in both games (a column
in connect four, 0 = left; a cell ``row * 3 + col`` of the observation grid in tic-tac-toe), which the
board check proves move by move.

Seeds. Game k of a judge seeded s gets a fresh ``MCTSBot`` whose search and rollouts draw from one
``np.random.RandomState((s + k) % 2**32)``: a rerun with the same seed plays the same games.

Cost on one core (connect four, early moves): ``mcts:100`` 0.03 s a move, ``mcts:400`` 0.11 s,
``mcts:1600`` 0.43 s; tic-tac-toe ``mcts:1600`` 0.05 s.

The other judge kind is the perfect player of connect four, ``solver`` and ``solver:E`` (evaluation/solver.py);
``is_judge_spec`` and ``check_judges`` cover both kinds.

This module imports OpenSpiel only when a judge is built (``require_openspiel``): specs are parsed
and checked without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from impala_league.config import UserError
from impala_league.evaluation.solver import SOLVER_FORM, is_solver_spec, parse_solver, require_bitbully

JUDGE_KIND = "mcts"
"""The judge kind of a spec ``mcts:N``."""
JUDGE_FORM = "mcts:N"
"""How an MCTS judge spec is written: N simulations a move, in [1, ``MAX_SIMULATIONS``]."""
JUDGE_FORMS = f"{JUDGE_FORM}, {SOLVER_FORM}"
"""Every judge's form: OpenSpiel's MCTS, and connect four's solver (evaluation/solver.py)."""
MAX_SIMULATIONS = 100_000
"""The most simulations a move: connect four at 100,000 would take about 30 s a move."""
UCT_C = 2.0
"""UCT's exploration constant (OpenSpiel's examples use 2)."""
OPENSPIEL_PIN = "open-spiel==2.0.2"
"""The version requirements.txt pins; named by the error when OpenSpiel is missing."""
DEFAULT_JUDGES: dict[str, tuple[str, ...]] = {
    "connect_four": ("mcts:100", "mcts:400", "mcts:1600"),
    "tictactoe": ("mcts:100", "mcts:400", "mcts:1600"),
}
"""The ladder the end-of-run evaluation plays where `evaluation.judges` is null; games not listed: none."""


@dataclass(frozen=True)
class SpielGame:
    """How one of our board games reads in OpenSpiel.

    name: pyspiel's game name. x_plane, o_plane: the planes of pyspiel's ``observation_tensor``
    (``[planes, rows, cols]``) holding the pieces of its player 0 ('x', our seat 0) and player 1 ('o').
    bottom_first: the tensor's row 0 is the bottom row (connect four), where our observation's row 0
    is the top one.
    """

    name: str
    x_plane: int
    o_plane: int
    bottom_first: bool


OPENSPIEL_GAMES: dict[str, SpielGame] = {
    "connect_four": SpielGame("connect_four", x_plane=0, o_plane=1, bottom_first=True),
    "tictactoe": SpielGame("tic_tac_toe", x_plane=2, o_plane=1, bottom_first=False),
}
"""Our env names of the games OpenSpiel also has, with how each reads there."""


class LockstepError(RuntimeError):
    """The env and the judge's pyspiel state disagree (side to move, legal moves, board or result)."""


class OpenSpielMissing(UserError, ImportError):
    """A judge was asked for where the open-spiel package is not installed; says how to install it."""


def is_judge_spec(spec: str) -> bool:
    """True if ``spec`` names a judge kind (``mcts``, ``mcts:...``, ``solver``, ``solver:...``), valid or not
    (``check_judge_spec``)."""
    return spec == JUDGE_KIND or spec.startswith(JUDGE_KIND + ":") or is_solver_spec(spec)


def check_judge_spec(spec: str, env_name: str) -> None:
    """Raise ValueError, one line naming the valid form, unless ``spec`` is a judge that plays ``env_name``
    (``parse_judge`` for ``mcts:N``, ``solver.parse_solver`` for the solver); nothing is imported."""
    if is_solver_spec(spec):
        parse_solver(spec, env_name)
    else:
        parse_judge(spec, env_name)


def parse_judge(spec: str, env_name: str) -> int:
    """The simulations N of a judge spec ``"mcts:N"`` for ``env_name``; nothing is imported.

    Raises:
      ValueError, one line naming the valid form: N missing, not an integer, or outside
        [1, ``MAX_SIMULATIONS``]; or ``env_name`` not one of the games OpenSpiel has (``OPENSPIEL_GAMES``).
    """
    form = f"the judge form is {JUDGE_FORM}, N simulations a move in 1..{MAX_SIMULATIONS:,} (e.g. mcts:400)"
    kind, _, text = spec.partition(":")
    simulations = int(text) if kind == JUDGE_KIND and re.fullmatch(r"[1-9][0-9]{0,8}", text) else None
    if simulations is None or simulations > MAX_SIMULATIONS:
        raise ValueError(f"judge {spec!r}: {form}")
    if env_name not in OPENSPIEL_GAMES:
        raise ValueError(f"judge {spec!r} plays only the games OpenSpiel also has: "
                         f"{' and '.join(OPENSPIEL_GAMES)}, not {env_name}")
    return simulations


def resolve_judges(judges: Sequence[str] | None, env_name: str) -> tuple[str, ...]:
    """The judges of a run: ``judges`` (the config's `evaluation.judges`), or where it is None the game's
    ladder (``DEFAULT_JUDGES``; none for other games)."""
    return tuple(judges) if judges is not None else DEFAULT_JUDGES.get(env_name, ())


def check_judges(judges: Sequence[str], env_name: str, league_bots: Sequence[str],
                 judges_from: str = "evaluation.judges") -> None:
    """The rules of a judge list: each judge valid for the game (``check_judge_spec``), none named twice,
    and none a training opponent: no judge and no ``mcts:*`` or ``solver*`` in ``league_bots``. ``judges_from`` names
    where the list came from (the config key or a command's option), for the error.

    Other bot specs (``minimax:4``) may be judges too; the caller checks them with the bots' own rules.

    Raises:
      ValueError, one line: which judge, and why.
    """
    for spec in judges:
        if is_judge_spec(spec):
            check_judge_spec(spec, env_name)
        if list(judges).count(spec) > 1:
            raise ValueError(f"judge {spec!r} is named twice; list each judge once ({JUDGE_FORMS})")
    for bot in league_bots:
        if is_judge_spec(bot) or bot in judges:
            raise ValueError(f"league.bots: {bot!r} is a judge, and a judge is never a training opponent (the "
                             "held-out score measures play the agent never trained against): remove it from "
                             "league.bots" + (f" or from {judges_from}" if bot in judges and not is_judge_spec(bot)
                                              else ""))


def require_openspiel():
    """OpenSpiel's ``pyspiel`` and its ``mcts`` module, imported.

    Raises:
      OpenSpielMissing: open-spiel is not installed; the message names the install command.
    """
    try:
        import pyspiel
        from open_spiel.python.algorithms import mcts
    except ImportError as e:
        raise OpenSpielMissing(f"the {JUDGE_FORM} judges need OpenSpiel, which is not installed ({e}): "
                               f"run .venv/bin/python -m pip install {OPENSPIEL_PIN} (or scripts/bootstrap.sh)") from None
    return pyspiel, mcts


def require_judge_packages(judges: Sequence[str], positions: bool = False) -> None:
    """Import what the judges among ``judges`` need (OpenSpiel for ``mcts:N``, BitBully for the solver, and
    BitBully with ``positions``, the solver's positions evaluation), so that a run fails before it trains.

    Raises:
      OpenSpielMissing, solver.SolverMissing: naming the install command.
    """
    if any(is_judge_spec(j) and not is_solver_spec(j) for j in judges):
        require_openspiel()
    if positions or any(map(is_solver_spec, judges)):
        require_bitbully()


class MCTSJudge:
    """OpenSpiel's MCTSBot as a player of our env, one pyspiel state per game kept in lockstep with it.

    Unlike a ``Bot``, which answers any position, a judge follows whole games (it needs the pyspiel
    state the moves led to): ``begin`` starts ``games`` games, ``act_games`` chooses the moves of some
    of them, and ``follow`` is told every move of every game, its own and the other players'.
    ``evaluation.evaluate.play_games`` drives it.
    """

    def __init__(self, game: str, simulations: int, seed: int | None = None):
        """A judge of ``simulations`` simulations a move for our env ``game``; seed: see the module docstring
        (None = nondeterministic).

        Raises:
          ValueError: ``game`` not one of ``OPENSPIEL_GAMES``, or simulations outside [1, MAX_SIMULATIONS].
          OpenSpielMissing: open-spiel is not installed.
        """
        if game not in OPENSPIEL_GAMES:
            raise ValueError(f"mcts judges play {' and '.join(OPENSPIEL_GAMES)}, not {game}")
        if not 1 <= simulations <= MAX_SIMULATIONS:
            raise ValueError(f"mcts judge: simulations {simulations} outside 1..{MAX_SIMULATIONS}")
        self._pyspiel, self._mcts = require_openspiel()
        self.spiel = OPENSPIEL_GAMES[game]
        self.game = self._pyspiel.load_game(self.spiel.name)
        self.simulations = simulations
        self.seed = seed
        self.name = f"{JUDGE_KIND}:{simulations}"
        self._states: list = []
        self._bots: list = []
        self._moves: list[int] = []
        self._agent_seats: tuple[int, ...] = ()

    def new_bot(self, game_index: int):
        """The fresh MCTSBot of game ``game_index``: its search and its rollouts share one RandomState."""
        random_state = np.random.RandomState(None if self.seed is None else (self.seed + game_index) % 2**32)
        evaluator = self._mcts.RandomRolloutEvaluator(n_rollouts=1, random_state=random_state)
        return self._mcts.MCTSBot(self.game, UCT_C, self.simulations, evaluator, solve=True,
                                  random_state=random_state)

    def begin(self, games: int, agent_seats: Sequence[int], first_steps: Sequence) -> None:
        """Start games 0 .. games-1 afresh: a new pyspiel state and bot each, checked against each env's
        first position ``first_steps[k]`` (an ``envs.base.Step``). ``agent_seats[i]``: the seat of agent
        index i (``EnvSpec.agent_seats``); seat s is pyspiel's player s.

        Raises:
          LockstepError: a first position disagrees with pyspiel's initial state.
        """
        self._agent_seats = tuple(agent_seats)
        self._states = [self.game.new_initial_state() for _ in range(games)]
        self._bots = [self.new_bot(k) for k in range(games)]
        self._moves = [0] * games
        for k, step in enumerate(first_steps):
            self._check_position(k, step.agents, step.observations, step.action_masks)

    def act_games(self, games: Sequence[int], observations: np.ndarray, action_masks: np.ndarray) -> np.ndarray:
        """The judge's moves in ``games`` (indices given to ``begin``), whose positions are
        ``observations`` ``[N, H, W, 2]`` and ``action_masks`` ``[N, num_actions]``: int64 ``[N]``.

        Raises:
          LockstepError: a position is not the one the judge's state holds, or it is not the judge's state's
            player to move there.
        """
        actions = np.empty(len(games), dtype=np.int64)
        for n, k in enumerate(games):
            state = self._states[k]
            self._check_position(k, [self._agent_of(state.current_player(), k)], [observations[n]], [action_masks[n]])
            actions[n] = self._bots[k].step(state)
        return actions

    def follow(self, game: int, actions: Sequence[int], step) -> None:
        """Apply the move ``actions`` (one action: turn-based games) just played in ``game`` to its pyspiel
        state and check the env's ``step`` after it (an ``envs.base.Step``): where ``step.episodes`` says the
        game ended, pyspiel's state must be terminal with the same winner and length; else the side to
        move, legal moves and board must agree.

        Raises:
          LockstepError: on any disagreement, naming the game, the move and what differs.
        """
        state = self._states[game]
        if len(actions) != 1:
            self._fail(game, f"{len(actions)} actions in one step; OpenSpiel's {self.spiel.name} takes one a move")
        action = int(actions[0])
        if state.is_terminal() or action not in state.legal_actions():
            self._fail(game, f"action {action} is not legal in OpenSpiel's state (legal: "
                       f"{[] if state.is_terminal() else state.legal_actions()})")
        state.apply_action(action)
        self._moves[game] += 1
        if step.episodes:
            self._check_result(game, step.episodes[0])
        else:
            self._check_position(game, step.agents, step.observations, step.action_masks)

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray) -> np.ndarray:
        """Not for a judge: it needs the games' histories. Raises TypeError naming what to use."""
        raise TypeError(f"{self.name} follows whole games (a pyspiel state each): play it through "
                        "evaluation.evaluate.play_games, not as a league bot")

    def _agent_of(self, player: int, game: int) -> int:
        agents = [i for i, seat in enumerate(self._agent_seats) if seat == player]
        if len(agents) != 1:
            self._fail(game, f"OpenSpiel's player {player} is not the seat of exactly one agent (seats "
                       f"{self._agent_seats})")
        return agents[0]

    def _check_position(self, game: int, agents: Sequence[int], observations: Sequence[np.ndarray],
                        action_masks: Sequence[np.ndarray]) -> None:
        """Raise LockstepError unless the env's position (acting agents, their observations and masks)
        is the pyspiel state's: one agent to move, of pyspiel's current player's seat, the same legal
        moves and the same pieces."""
        state = self._states[game]
        if state.is_terminal():
            self._fail(game, f"OpenSpiel's game has ended (returns {state.returns()}), the env's goes on")
        player = state.current_player()
        seats = [self._agent_seats[a] for a in agents]
        if seats != [player]:
            self._fail(game, f"OpenSpiel has player {player} to move, the env seats {seats}")
        legal = np.flatnonzero(np.asarray(action_masks[0])).tolist()
        if legal != sorted(state.legal_actions()):
            self._fail(game, f"legal moves differ: env {legal}, OpenSpiel {sorted(state.legal_actions())}")
        board = self._board(state, player)
        if not np.array_equal(board, np.asarray(observations[0], dtype=np.int64)):
            self._fail(game, f"boards differ (planes: mover, opponent): env\n{np.moveaxis(observations[0], -1, 0)}\n"
                       f"OpenSpiel\n{np.moveaxis(board, -1, 0)}")

    def _board(self, state, player: int) -> np.ndarray:
        """int64 ``[rows, cols, 2]``: pyspiel's board as our observation of ``player`` to move (channel 0
        its pieces, channel 1 the opponent's, row 0 the top)."""
        tensor = np.asarray(state.observation_tensor(player)).reshape(self.game.observation_tensor_shape())
        if self.spiel.bottom_first:
            tensor = tensor[:, ::-1]
        planes = (self.spiel.x_plane, self.spiel.o_plane) if player == 0 else (self.spiel.o_plane, self.spiel.x_plane)
        return np.stack([tensor[p] for p in planes], axis=-1).astype(np.int64)

    def _check_result(self, game: int, episode) -> None:
        """Raise LockstepError unless pyspiel's state ended as the env's ``episode`` did (an
        ``envs.base.EpisodeResult``): terminal, the same winner (None: a draw), the same number of moves."""
        state = self._states[game]
        if not state.is_terminal():
            self._fail(game, f"the env's game ended (winner {episode.winner}), OpenSpiel's goes on")
        returns = state.returns()
        winner = None if returns[0] == returns[1] else int(np.argmax(returns))
        if winner != episode.winner or self._moves[game] != episode.length:
            self._fail(game, f"results differ: env winner {episode.winner} after {episode.length} moves, OpenSpiel "
                       f"winner {winner} (returns {returns}) after {self._moves[game]}")

    def _fail(self, game: int, what: str):
        raise LockstepError(f"{self.name} on {self.spiel.name}, game {game}, after move {self._moves[game]}: {what}")
