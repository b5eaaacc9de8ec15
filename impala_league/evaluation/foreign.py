"""Players from outside the project, judged by its judges exactly as a checkpoint is.

A *player* is anything with ``act_batch(observations, action_masks) -> int64 [N]``, the interface of a
``Bot`` (evaluation/bots.py): ``observations`` int8 ``[N, H, W, 2]`` as our env shows the board to the
player to move (channel 0 its pieces, channel 1 the opponent's, row 0 the top), ``action_masks`` int8
``[N, num_actions]`` (1 where legal); it answers one legal action a position (a column in connect four,
0 = left). Such a player is judged

* in the solver's positions by ``evaluation.positions.evaluate_positions(player, "connect_four", N, seed)``,
  which already takes one;
* in games by ``evaluate_player`` here: the games ``evaluation.evaluate.evaluate`` plays for a checkpoint,
  through the same ``evaluate.play_seat`` with the same seeds (seat s: ``seed + SEAT_SEED_STRIDE * s``), so a
  foreign player and a checkpoint meet the same judge's games (an ``mcts:N`` judge's game k of a seat draws
  from the same RandomState for both).

A policy trained on OpenSpiel's board (RLlib's ``OpenSpielEnv`` gives its networks the flat
``state.observation_tensor()``) reads our observation through ``spiel_observation_tensors``.
"""

from __future__ import annotations

import numpy as np

from impala_league.envs.registry import env_spec
from impala_league.evaluation.evaluate import SEAT_SEED_STRIDE, play_seat
from impala_league.evaluation.judges import OPENSPIEL_GAMES


def spiel_observation_tensors(env_name: str, observations: np.ndarray) -> np.ndarray:
    """OpenSpiel's ``observation_tensor()`` of each of our positions: float32 ``[N, 3 * H * W]``.

    Args:
      env_name: one of ``judges.OPENSPIEL_GAMES`` (connect_four, tictactoe).
      observations: int8 ``[N, H, W, 2]``, our observations of the player to move (channel 0 its pieces).

    OpenSpiel's tensor is the board from no one's side: three planes ``[3, H, W]`` in C order, the pieces
    of its player 0 (``SpielGame.x_plane``, our seat 0, who moves first), of its player 1 (``o_plane``) and
    the empty cells (the third plane), row 0 the bottom where ``SpielGame.bottom_first`` (connect four).
    The player to move is read from the piece counts: seat 0 when both have as many pieces, seat 1 when
    the opponent has one more.

    Raises:
      ValueError: a game OpenSpiel does not have here, observations not ``[N, H, W, 2]``, or piece counts
        that no game of alternating moves reaches.
    """
    if env_name not in OPENSPIEL_GAMES:
        raise ValueError(f"OpenSpiel's observation tensor: {' and '.join(OPENSPIEL_GAMES)}, not {env_name}")
    game = OPENSPIEL_GAMES[env_name]
    observations = np.asarray(observations)
    if observations.ndim != 4 or observations.shape[-1] != 2:
        raise ValueError(f"{env_name}: expected observations [N, H, W, 2], got {observations.shape}")
    mine, theirs = observations[..., 0].astype(np.float32), observations[..., 1].astype(np.float32)
    first = mine.sum((1, 2)) == theirs.sum((1, 2))
    second = theirs.sum((1, 2)) == mine.sum((1, 2)) + 1
    if not (first | second).all():
        bad = int(np.flatnonzero(~(first | second))[0])
        raise ValueError(f"{env_name}: position {bad} has {int(mine[bad].sum())} pieces of the player to move and "
                         f"{int(theirs[bad].sum())} of the opponent: no game of alternating moves gets there")
    seat0 = np.where(first[:, None, None], mine, theirs)
    seat1 = np.where(first[:, None, None], theirs, mine)
    empty_plane = ({0, 1, 2} - {game.x_plane, game.o_plane}).pop()
    tensor = np.zeros((len(observations), 3, *observations.shape[1:3]), dtype=np.float32)
    tensor[:, game.x_plane], tensor[:, game.o_plane] = seat0, seat1
    tensor[:, empty_plane] = 1.0 - seat0 - seat1
    if game.bottom_first:
        tensor = tensor[:, :, ::-1]
    return np.ascontiguousarray(tensor).reshape(len(observations), -1)


def evaluate_player(player, env_name: str, opponent: str, games: int, seed: int = 0) -> dict:
    """``games`` games in each seat of ``env_name`` (its plain observation, no env kwargs) between ``player``
    (the module docstring's interface) and the bot or judge ``opponent`` (``bots.make_bot``'s spec, e.g.
    ``mcts:1600``): a JSON-ready dict as ``evaluate.evaluate`` returns for a checkpoint, {"env", "opponent",
    "games_per_seat", "seats": {seat name: ``MatchResult.as_dict()``}} (``score`` = (wins + draws / 2) / games).

    Seat s plays games seeded ``seed + SEAT_SEED_STRIDE * s + k`` against the opponent seeded
    ``seed + SEAT_SEED_STRIDE * s``: the games ``evaluate.evaluate(policy, opponent, games, seed)`` plays.

    Raises:
      ValueError: ``opponent`` is not a bot or judge of ``env_name``.
    """
    per_seat = {}
    for seat, seat_name in enumerate(env_spec(env_name).seats):
        _, result = play_seat(player, env_name, opponent, games, seat, seed + SEAT_SEED_STRIDE * seat)
        per_seat[seat_name] = result.as_dict()
    return {"env": env_name, "opponent": opponent, "games_per_seat": games, "seats": per_seat}
