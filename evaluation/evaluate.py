"""Games between two players (policy vs bot, policy vs policy, bot vs bot), many at once.

A *side* is either a trained `Policy` (anything with `act_batch`: every game where it is that side's
turn is one batched forward pass) or a `Bot` (`act` per game). `play_games` is the one game loop;
`play_match` / `evaluate` are the policy-vs-baseline-bot summaries that `run.py evaluate
--checkpoint` and the end of training print, and `evaluation/tournament.py` builds round-robins on it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np

from envs.registry import make_env
from evaluation.bots import Bot, make_bot

if TYPE_CHECKING:
    from agents.policy import Policy

Side = Union["Policy", Bot]


@dataclass(frozen=True)
class GameRecord:
    """One finished game: enough to count it and to re-simulate it (see `evaluation/replays.py`).

    seed: the env seed it was reset with; actions: every action in order of play (seat 0 first);
    returns: summed reward per seat; winner: seat with the highest return, None for a draw.
    """

    seed: int
    actions: tuple[int, ...]
    returns: tuple[float, ...]
    winner: int | None

    @property
    def length(self) -> int:
        return len(self.actions)


def play_games(env_name: str, sides: tuple[Side, Side], games: int, seed: int = 0,
               greedy: bool = True) -> list[GameRecord]:
    """Play `games` games of `env_name` with `sides[s]` in seat `s` (seat 0 moves first).

    Game k is seeded `seed + k`. All games advance together: at each step a policy side chooses for
    every game where it is its turn in one forward pass (`greedy`: argmax, else a sample from its
    generator); a bot side is asked game by game, in game order, so results are reproducible.

    Returns the records of the games in order k = 0 .. games-1.
    """
    envs = [make_env(env_name, seed=seed + k) for k in range(games)]
    turns = [env.advance() for env in envs]
    actions: list[list[int]] = [[] for _ in range(games)]
    records: list[GameRecord | None] = [None] * games
    while True:
        active = [k for k in range(games) if records[k] is None]
        if not active:
            break
        chosen: dict[int, int] = {}
        for seat, side in enumerate(sides):
            mine = [k for k in active if turns[k].seat == seat]
            if mine and hasattr(side, "act_batch"):
                batch = side.act_batch(np.stack([turns[k].observation for k in mine]),
                                       np.stack([turns[k].action_mask for k in mine]), greedy)
                chosen.update(zip(mine, batch.tolist()))
        for k in active:
            action = chosen[k] if k in chosen else sides[turns[k].seat].act(turns[k].observation,
                                                                          turns[k].action_mask)
            actions[k].append(int(action))
            envs[k].act(action)
            turns[k] = envs[k].advance()
            if turns[k].episodes:
                episode = turns[k].episodes[0]
                records[k] = GameRecord(seed + k, tuple(actions[k]), episode.returns, episode.winner)
    return records  # type: ignore[return-value]


@dataclass
class MatchResult:
    """Outcomes of `games` games with the policy in seat `seat` (0 moves first)."""

    seat: int
    games: int
    wins: int
    draws: int
    losses: int

    @property
    def win_rate(self) -> float:
        return self.wins / self.games

    def as_dict(self) -> dict:
        return {**asdict(self), "win_rate": self.win_rate, "draw_rate": self.draws / self.games,
                "loss_rate": self.losses / self.games}


def count_outcomes(records: list[GameRecord], seat: int) -> MatchResult:
    """Wins, draws and losses of the player in `seat` over `records`."""
    wins = sum(r.winner == seat for r in records)
    draws = sum(r.winner is None for r in records)
    return MatchResult(seat, len(records), wins, draws, len(records) - wins - draws)


def play_match(policy: Policy, opponent: str, games: int, seat: int, seed: int = 0,
               greedy: bool = True, record_dir: str | Path | None = None,
               name: str = "checkpoint") -> MatchResult:
    """Play `games` games of the policy's env, the policy in `seat` and bot `opponent` in the other.

    Game k is seeded `seed + k`; the bot is seeded `seed`. With `record_dir`, every game is saved
    there as a replay, the policy named `name` (see `evaluation/replays.py`).

    Raises ValueError if `opponent` is not a valid bot spec for the env.
    """
    env_name = policy.spec.name
    bot = make_bot(opponent, env_name, seed=seed)
    sides = (policy, bot) if seat == 0 else (bot, policy)
    records = play_games(env_name, sides, games, seed, greedy)
    if record_dir is not None:
        from evaluation.replays import save_match

        names = (name, opponent) if seat == 0 else (opponent, name)
        save_match(record_dir, env_name, names, records)
    return count_outcomes(records, seat)


def evaluate(policy: Policy, opponent: str, games: int, seed: int = 0, greedy: bool = True,
             record_dir: str | Path | None = None, name: str = "checkpoint") -> dict:
    """`games` games in each seat against `opponent`; a JSON-ready dict keyed by seat name.

    With `record_dir`, every game is saved there as a replay (see `play_match`).
    """
    per_seat = {}
    for seat, seat_name in enumerate(policy.spec.seats):
        per_seat[seat_name] = play_match(policy, opponent, games, seat, seed + 1_000_003 * seat, greedy,
                                         record_dir, name).as_dict()
    return {"env": policy.spec.name, "opponent": opponent, "games_per_seat": games, "greedy": greedy,
            "seats": per_seat}
