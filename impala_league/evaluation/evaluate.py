"""Games between two players (policy vs bot, policy vs policy, bot vs bot), many at once.

A *side* is either a trained `Policy` or a `Bot`; either is asked once per step for every game where
it is that side's turn (`act_batch`: one forward pass, or one batched search). `play_games` is the one
game loop; `play_match` / `evaluate` are the policy-vs-baseline-bot summaries that `run.py evaluate
--checkpoint` and the end of training print, and `evaluation/tournament.py` builds round-robins on it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np

from impala_league.agents.policy import Policy
from impala_league.envs.registry import env_spec, make_env
from impala_league.evaluation.bots import GAMES, Bot, make_bot
from impala_league.evaluation.judges import MCTSJudge
from impala_league.evaluation.tactics import Tactics, count_tactics

Side = Union[Policy, Bot, MCTSJudge]

SEAT_SEED_STRIDE = 1_000_003
"""Seat s of `evaluate(..., seed)` plays from seed `seed + SEAT_SEED_STRIDE * s`: more than any match's games,
so no two seats share a game's seed."""


@dataclass(frozen=True)
class GameRecord:
    """One finished game: enough to count it and to re-simulate it (see `evaluation/replays.py`).

    seed: the env seed it was reset with; actions: every action in order of play (in a turn-based
    game one per move, seat 0 first; in a simultaneous game the acting agents' actions of each step
    in turn); returns: summed reward per seat; winner: the winning seat by the env's rule, None for a
    draw; length: env steps (moves, in a turn-based game).
    """

    seed: int
    actions: tuple[int, ...]
    returns: tuple[float, ...]
    winner: int | None
    length: int


def play_games(env_name: str, sides: tuple[Side, ...], games: int, seed: int = 0,
               greedy: bool = True, kwargs: Mapping[str, Any] | None = None,
               seats: Sequence[Sequence[str]] | None = None, empty_mask: str = "error") -> list[GameRecord]:
    """Play `games` games of `env_name` (built with `kwargs`, its seats declared by `seats` as in
    `envs.registry.env_spec`, and `empty_mask` as in `make_env`) with `sides[s]` playing seat `s`.

    Game k is seeded `seed + k`. All games advance together: at each step a policy side chooses for
    every agent of its seat in every game in one forward pass (`greedy`: argmax, else a sample from
    its generator); a bot side is asked for all of them in one call, so results are reproducible.
    A judge side (`MCTSJudge`) starts a pyspiel state per game, is told every move of every game and
    checks each position against it (raising judges.LockstepError where they differ).
    A recurrent policy keeps one core state per game and agent (stream (k, agent)), fed the rewards
    that agent receives and started afresh at its episode's end, and at this call's start.

    Returns the records of the games in order k = 0 .. games-1.
    """
    spec = env_spec(env_name, kwargs, seats)
    if len(sides) != len(spec.seats):
        raise ValueError(f"{env_name} has {len(spec.seats)} seats ({', '.join(spec.seats)}), got {len(sides)} sides")
    envs = [make_env(env_name, seed + k, kwargs, seats=seats, empty_mask=empty_mask) for k in range(games)]
    policies = list({id(side): side for side in sides if isinstance(side, Policy)}.values())  # each once
    judges = list({id(side): side for side in sides if isinstance(side, MCTSJudge)}.values())
    for policy in policies:
        policy.reset()
    steps = [env.advance() for env in envs]
    for judge in judges:
        judge.begin(games, spec.agent_seats, steps)
    actions: list[list[int]] = [[] for _ in range(games)]
    records: list[GameRecord | None] = [None] * games
    while True:
        active = [k for k in range(games) if records[k] is None]
        if not active:
            break
        chosen = _choose(sides, spec.agent_seats, steps, active, greedy)
        for k in active:
            acts = [chosen[(k, j)] for j in range(len(steps[k].agents))]
            actions[k] += acts
            envs[k].act(acts)
            steps[k] = envs[k].advance()
            for judge in judges:
                judge.follow(k, acts, steps[k])
            for s in steps[k].settlements:
                for policy in policies:
                    policy.settle((k, s.agent), s.reward, s.done or s.truncated)
            if steps[k].episodes:
                episode = steps[k].episodes[0]
                records[k] = GameRecord(seed + k, tuple(actions[k]), episode.returns, episode.winner, episode.length)
    return records  # type: ignore[return-value]


def _choose(sides: tuple[Side, ...], agent_seats: Mapping[str, int], steps: list, active: list[int],
            greedy: bool) -> dict[tuple[int, int], int]:
    """(game k, agent index j) -> the action of every agent to move in the `active` games: each side
    answers for all agents of its seat in one call (a policy's forward pass, a bot's or judge's batch)."""
    chosen: dict[tuple[int, int], int] = {}
    for seat, side in enumerate(sides):
        mine = [(k, j) for k in active for j, agent in enumerate(steps[k].agents) if agent_seats[agent] == seat]
        if not mine:
            continue
        observations = np.stack([steps[k].observations[j] for k, j in mine])
        masks = np.stack([steps[k].action_masks[j] for k, j in mine])
        if isinstance(side, Policy):
            batch = side.act_batch(observations, masks, greedy, [(k, steps[k].agents[j]) for k, j in mine])
        elif isinstance(side, MCTSJudge):
            batch = side.act_games([k for k, _ in mine], observations, masks)
        else:
            batch = side.act_batch(observations, masks)
        chosen.update(zip(mine, batch.tolist()))
    return chosen


@dataclass
class MatchResult:
    """Outcomes of `games` games with the policy in seat `seat` (0 moves first); in connect four and
    tic-tac-toe also its one-move `tactics` (`evaluation/tactics.py`)."""

    seat: int
    games: int
    wins: int
    draws: int
    losses: int
    mean_return: float = 0.0  # the seat's summed reward per game (two-player Atari: its score difference)
    tactics: Tactics | None = None

    @property
    def win_rate(self) -> float:
        return self.wins / self.games

    @property
    def score(self) -> float:
        """(wins + draws / 2) / games: the share of the points won."""
        return (self.wins + 0.5 * self.draws) / self.games

    def as_dict(self) -> dict:
        """The counts and rates, `score` and its 95% interval `score_ci95` ([low, high], `score_interval`)."""
        return {**asdict(self), "tactics": self.tactics and self.tactics.as_dict(), "win_rate": self.win_rate,
                "draw_rate": self.draws / self.games, "loss_rate": self.losses / self.games, "score": self.score,
                "score_ci95": list(score_interval(self.score, self.games))}


def score_interval(score: float, games: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson interval (z = 1.96: 95%) of a score (wins + draws / 2) / games over `games` games.

    Counts a draw as half a win, as if each game were a coin flip weighted `score`: the interval is a
    little wider than the score's own (a draw varies less than a coin flip), never empty at 0 or 1, and
    inside [0, 1]. 50 games at score 0.5 give [0.366, 0.634]; 50 draws as well.
    """
    if games <= 0:
        return 0.0, 1.0
    centre = (score + z * z / (2 * games)) / (1 + z * z / games)
    half = z / (1 + z * z / games) * float(np.sqrt(score * (1 - score) / games + z * z / (4 * games * games)))
    return max(0.0, centre - half), min(1.0, centre + half)


def count_outcomes(records: list[GameRecord], seat: int) -> MatchResult:
    """Wins, draws and losses of the player in `seat` over `records`, and its mean return per game."""
    wins = sum(r.winner == seat for r in records)
    draws = sum(r.winner is None for r in records)
    mean_return = float(np.mean([r.returns[seat] for r in records])) if records else 0.0
    return MatchResult(seat, len(records), wins, draws, len(records) - wins - draws, mean_return)


def play_seat(player: Side, env_name: str, opponent: str, games: int, seat: int, seed: int = 0,
              greedy: bool = True, kwargs: Mapping[str, Any] | None = None,
              seats: Sequence[Sequence[str]] | None = None,
              empty_mask: str = "error") -> tuple[list[GameRecord], MatchResult]:
    """Play `games` games of `env_name` (built as in `play_games`), `player` (any side) in `seat` and bot
    `opponent` (seeded `seed`) in every other; game k is seeded `seed + k`.

    Returns the games' records and `player`'s MatchResult, with its tactics counted in a game of `GAMES`.
    Raises ValueError if `opponent` is not a valid bot spec for the env.
    """
    bot = make_bot(opponent, env_name, seed=seed)
    sides = tuple(player if s == seat else bot for s in range(len(env_spec(env_name, kwargs, seats).seats)))
    records = play_games(env_name, sides, games, seed, greedy, kwargs, seats, empty_mask)
    result = count_outcomes(records, seat)
    if env_name in GAMES:
        result.tactics = count_tactics(GAMES[env_name], (r.actions for r in records), seat)
    return records, result


def play_match(policy: Policy, opponent: str, games: int, seat: int, seed: int = 0,
               greedy: bool = True, record_dir: str | Path | None = None,
               name: str = "checkpoint") -> MatchResult:
    """Play `games` games of the policy's env, the policy in `seat` and bot `opponent` in every other.

    Game k is seeded `seed + k`; the bot is seeded `seed`. With `record_dir`, every game is saved
    there as a replay, the policy named `name` (see `evaluation/replays.py`).

    Raises ValueError if `opponent` is not a valid bot spec for the env.
    """
    spec, env = policy.spec, policy.config.env
    records, result = play_seat(policy, spec.name, opponent, games, seat, seed, greedy, env.kwargs, env.seats,
                                env.empty_mask)
    if record_dir is not None:
        from impala_league.evaluation.replays import save_match

        names = tuple(name if s == seat else opponent for s in range(len(spec.seats)))
        save_match(record_dir, spec.name, names, records, env.kwargs, env.seats)
    return result


def episode_returns(policy: Policy, games: int, seed: int = 0, greedy: bool = True,
                    record_dir: str | Path | None = None, name: str = "checkpoint",
                    kwargs: Mapping[str, Any] | None = None) -> dict:
    """The policy alone in a one-seat env (a gymnasium env) built with `kwargs` (default: the policy's own
    env.kwargs): `games` episodes, JSON-ready summary of their returns (mean, std, min, max, and each
    game's in `returns`) and lengths. With `record_dir`, every episode is saved there as a replay, the
    policy named `name`."""
    kwargs = policy.config.env.kwargs if kwargs is None else kwargs
    records = play_games(policy.spec.name, (policy,), games, seed, greedy, kwargs,
                         policy.config.env.seats, policy.config.env.empty_mask)
    if record_dir is not None:
        from impala_league.evaluation.replays import save_match

        save_match(record_dir, policy.spec.name, (name,), records, kwargs, policy.config.env.seats)
    returns = np.array([r.returns[0] for r in records])
    return {"env": policy.spec.name, "episodes": games, "greedy": greedy, "mean_return": float(returns.mean()),
            "std_return": float(returns.std()), "min_return": float(returns.min()),
            "max_return": float(returns.max()), "mean_length": float(np.mean([r.length for r in records])),
            "returns": returns.tolist()}


def evaluate(policy: Policy, opponent: str, games: int, seed: int = 0, greedy: bool = True,
             record_dir: str | Path | None = None, name: str = "checkpoint") -> dict:
    """`games` games in each seat against `opponent`; a JSON-ready dict keyed by seat name.

    With `record_dir`, every game is saved there as a replay (see `play_match`).
    """
    per_seat = {}
    for seat, seat_name in enumerate(policy.spec.seats):
        per_seat[seat_name] = play_match(policy, opponent, games, seat, seed + SEAT_SEED_STRIDE * seat, greedy,
                                         record_dir, name).as_dict()
    return {"env": policy.spec.name, "opponent": opponent, "games_per_seat": games, "greedy": greedy,
            "seats": per_seat}
