"""A player's moves in connect-four positions, scored by the perfect solver (evaluation/solver.py).

The positions. ``undecided_positions(count, seed)`` draws ``count`` distinct positions where the game is
not over: position i plays a ply count drawn uniformly from 0 .. ``MAX_PLIES`` - 1, each ply a uniformly
random legal move with probability 1/2, else ``tactical``'s move (take a win, else block one, else
random); a game that ends first is drawn again. One seed gives one set, whoever asks.

The scores. The solver values every move of every position (Pons' score, its sign the result with best
play on). Of the positions the mover has not already lost (some move keeps a win or a draw), a move is
*optimal* when it keeps the position's result (a won position stays won, a drawn one drawn) and a
*blunder* when it turns a won or drawn position lost; a won position turned drawn is neither and is
counted apart. Each rate comes with its 95% Wilson interval, over all positions and by phase: plies
0-9, 10-19 and 20 and more (``PHASES``).

A feedforward policy's baseline V(x) is also set against the solved result of every position (+1 won,
0 drawn, -1 lost for the mover; ``value_error``): with learner.discount 1 and a terminal reward of +-1,
V estimates the expected result under the policy's own play, so its error says how well the network
reads a position, apart from how it moves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from impala_league.agents.policy import Policy
from impala_league.evaluation.bots import CONNECT_FOUR, TO_MOVE, OPPONENT, TacticalBot
from impala_league.evaluation.evaluate import score_interval
from impala_league.evaluation.solver import DRAW, ILLEGAL, LOSS, WIN, Solver, SOLVER_GAMES

MAX_PLIES = 36
"""Plies of a position are drawn from 0 .. MAX_PLIES - 1, so that each phase holds hundreds of 1,000."""
PHASES = (("plies 0-9", 0, 10), ("plies 10-19", 10, 20), ("plies 20+", 20, CONNECT_FOUR.rows * CONNECT_FOUR.cols))
"""(name, first ply, last ply + 1) of the phases the rates are split by."""
MAX_POSITIONS = 100_000
"""The most positions one evaluation draws."""


@dataclass(frozen=True)
class Positions:
    """A set of positions: moves[i] the columns played from the empty board, observations int8
    ``[N, 6, 7, 2]`` as our env shows them to the player to move (channel 0 its pieces, row 0 the top),
    action_masks int8 ``[N, 7]``, plies int64 ``[N]`` (pieces on the board)."""

    moves: tuple[tuple[int, ...], ...]
    observations: np.ndarray
    action_masks: np.ndarray
    plies: np.ndarray


def check_count(count: int, what: str = "--positions") -> None:
    """Raise ValueError, one line, unless 1 <= count <= ``MAX_POSITIONS``."""
    if not 1 <= count <= MAX_POSITIONS:
        raise ValueError(f"{what} must be a count of positions in 1..{MAX_POSITIONS:,} (e.g. {what} 1000), "
                         f"not {count}")


def undecided_positions(count: int, seed: int = 0) -> Positions:
    """``count`` distinct connect-four positions where the game is not over, drawn as the module docstring
    says from ``np.random.default_rng(seed)``.

    Raises:
      ValueError: count outside 1..``MAX_POSITIONS``.
    """
    check_count(count, "count")
    rng = np.random.default_rng(seed)
    tactical = TacticalBot("connect_four", seed=int(rng.integers(2**31)))
    game = CONNECT_FOUR
    seen: set[bytes] = set()
    moves_out, observations, plies = [], [], []
    while len(observations) < count:
        target = int(rng.integers(MAX_PLIES))
        board = [[0] * game.cols for _ in range(game.rows)]  # TO_MOVE: the player to move now
        moves: list[int] = []
        over = False
        while len(moves) < target and not over:
            legal = game.legal_moves(board)
            if rng.random() < 0.5:
                move = int(rng.choice(legal))
            else:
                mask = np.zeros(game.num_actions, dtype=np.int8)
                mask[legal] = 1
                move = tactical.act(_observation(board), mask)
            row, col = game.target_cell(board, move)
            board[row][col] = TO_MOVE
            over = game.is_win(board, TO_MOVE, row, col) or len(moves) + 1 == game.rows * game.cols
            board = [[-cell for cell in cells] for cells in board]  # the other player moves next
            moves.append(move)
        observation = _observation(board)
        if over or observation.tobytes() in seen:
            continue
        seen.add(observation.tobytes())
        moves_out.append(tuple(moves))
        observations.append(observation)
        plies.append(len(moves))
    observations = np.stack(observations)
    masks = (observations.sum(-1)[:, 0, :] == 0).astype(np.int8)  # a column is open while its top cell is
    return Positions(tuple(moves_out), observations, masks, np.array(plies, dtype=np.int64))


def _observation(board: list[list[int]]) -> np.ndarray:
    """int8 ``[6, 7, 2]`` of a board whose ``TO_MOVE`` cells are the player to move's."""
    cells = np.asarray(board, dtype=np.int8)
    return np.stack([cells == TO_MOVE, cells == OPPONENT], axis=-1).astype(np.int8)


def solve(positions: Positions, solver: Solver | None = None) -> np.ndarray:
    """int64 ``[N, 7]``: the solver's score of every move of every position (``ILLEGAL`` where not legal)."""
    return (solver or Solver()).move_values(positions.observations)


def player_moves(player, positions: Positions, greedy: bool = True) -> np.ndarray:
    """int64 ``[N]``: the move ``player`` (a ``Policy``, a bot or the solver: anything with ``act_batch``) makes
    in each position; a policy greedy (argmax) or sampling, every position a fresh stream of its own."""
    if isinstance(player, Policy):
        player.reset()
        return player.act_batch(positions.observations, positions.action_masks, greedy,
                                list(range(len(positions.moves))))
    return np.asarray(player.act_batch(positions.observations, positions.action_masks), dtype=np.int64)


def score_moves(positions: Positions, values: np.ndarray, moves: np.ndarray) -> dict:
    """The rates of the module docstring for ``moves`` int64 ``[N]`` in ``positions`` of solved ``values``
    ``[N, 7]``: JSON-ready, {"positions", "lost", "all": rates, "phases": {name: rates}} where rates are
    {"positions" (not already lost), "optimal", "blunder", "win_to_draw" (each a rate), and "optimal_ci95",
    "blunder_ci95"}.

    Raises:
      ValueError: a move that is not legal in its position, or shapes that disagree.
    """
    moves = np.asarray(moves, dtype=np.int64)
    if moves.shape != (len(values),) or values.shape != positions.action_masks.shape:
        raise ValueError(f"positions: {len(values)} positions, {moves.shape} moves, values {values.shape}")
    chosen = values[np.arange(len(moves)), moves]
    if (chosen == ILLEGAL).any():
        raise ValueError(f"positions: an illegal move (position {int(np.flatnonzero(chosen == ILLEGAL)[0])})")
    best, after = np.sign(values.max(1)), np.sign(chosen)
    alive = best != LOSS

    def rates(where: np.ndarray) -> dict:
        n = int(where.sum())
        optimal = float((after == best)[where].mean()) if n else float("nan")
        blunder = float((after == LOSS)[where].mean()) if n else float("nan")
        return {"positions": n, "optimal": optimal, "blunder": blunder,
                "win_to_draw": float(((best == WIN) & (after == DRAW))[where].mean()) if n else float("nan"),
                "optimal_ci95": list(score_interval(optimal, n)) if n else None,
                "blunder_ci95": list(score_interval(blunder, n)) if n else None}

    return {"positions": len(moves), "lost": int((~alive).sum()), "all": rates(alive),
            "phases": {name: rates(alive & (positions.plies >= low) & (positions.plies < high))
                       for name, low, high in PHASES}}


def value_error(policy: Policy, positions: Positions, values: np.ndarray) -> dict | None:
    """The policy's baseline V(x) of each position against its solved result r (+1, 0, -1 for the mover):
    {"mae": mean |V - r|, "sign_agreement": share of positions not drawn where sign V = r, "mean_value"},
    over all positions; None for a recurrent policy (its value depends on the game that led there)."""
    if policy.recurrent:
        return None
    with torch.no_grad():
        _, baseline, _ = policy.model.step(torch.as_tensor(positions.observations),
                                           torch.as_tensor(positions.action_masks), None)
    v, result = baseline.numpy().astype(np.float64), np.sign(values.max(1))
    decided = result != DRAW
    return {"mae": float(np.abs(v - result).mean()), "mean_value": float(v.mean()),
            "sign_agreement": float((np.sign(v[decided]) == result[decided]).mean()) if decided.any() else None}


_SOLVED: dict[tuple[int, int], tuple[Positions, np.ndarray]] = {}


def solved_positions(count: int, seed: int = 0) -> tuple[Positions, np.ndarray]:
    """``undecided_positions(count, seed)`` and their solved values, solved once per process and set."""
    key = (count, seed)
    if key not in _SOLVED:
        positions = undecided_positions(count, seed)
        _SOLVED[key] = positions, solve(positions)
    return _SOLVED[key]


def evaluate_positions(player, env_name: str, count: int, seed: int = 0, greedy: bool = True) -> dict:
    """``player``'s moves in ``count`` positions of seed ``seed`` scored by the solver (``score_moves``), with
    the set's {"count", "seed", "greedy"}.

    Raises:
      ValueError: ``env_name`` not a game the solver solves, or ``count`` out of range (``check_count``).
      solver.SolverMissing: BitBully is not installed.
    """
    if env_name not in SOLVER_GAMES:
        raise ValueError(f"the positions evaluation needs the solver, which solves {' and '.join(SOLVER_GAMES)}, "
                         f"not {env_name}")
    check_count(count)
    positions, values = solved_positions(count, seed)
    result = {"count": count, "seed": seed, "greedy": greedy,
              **score_moves(positions, values, player_moves(player, positions, greedy))}
    if isinstance(player, Policy):
        result["value"] = value_error(player, positions, values)
    return result


def positions_lines(result: dict) -> list[str]:
    """The lines of a positions evaluation (``evaluate_positions``'s dict): the rates over all positions the
    mover has not lost, then one line a phase."""
    def line(name: str, r: dict) -> str:
        if not r["positions"]:
            return f"{name}: no position"
        (ol, oh), (bl, bh) = r["optimal_ci95"], r["blunder_ci95"]
        return (f"{name}: optimal {r['optimal']:.1%} [{ol:.1%}, {oh:.1%}]  blunder {r['blunder']:.1%} "
                f"[{bl:.1%}, {bh:.1%}]  won to drawn {r['win_to_draw']:.1%}  of {r['positions']}")

    value = result.get("value")
    tail = [] if not value else [f"  value V(x) against the solved result: mean |V - r| {value['mae']:.3f}, sign "
                                 f"agreement {value['sign_agreement']:.1%} of the decided positions"]
    head = (f"{result['count']} positions (seed {result['seed']}; {result['lost']} already lost left out), "
            f"{'greedy' if result['greedy'] else 'sampled'} moves scored by the solver:")
    return [head, "  " + line("all", result["all"])] + ["  " + line(n, r) for n, r in result["phases"].items()] + tail
