"""Matches of a trained policy against a baseline bot, many games at once with batched inference."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from agents.policy import Policy
from envs.registry import make_env
from evaluation.bots import make_bot


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


def play_match(policy: Policy, opponent: str, games: int, seat: int, seed: int = 0,
               greedy: bool = True) -> MatchResult:
    """Play `games` games of the policy's env, the policy in `seat` and bot `opponent` in the other.

    Game k is seeded `seed + k`; the bot is seeded `seed`. All games advance together so that each
    step is one forward pass for every game where it is the policy's turn.
    """
    env_name = policy.spec.name
    bot = make_bot(opponent, env_name, seed=seed)
    envs = [make_env(env_name, seed=seed + k) for k in range(games)]
    turns = [env.advance() for env in envs]
    outcomes: list[int | None] = [None] * games  # winner seat, -1 = draw
    while True:
        active = [k for k in range(games) if outcomes[k] is None]
        if not active:
            break
        ours = [k for k in active if turns[k].seat == seat]
        actions = {}
        if ours:
            chosen = policy.act_batch(np.stack([turns[k].observation for k in ours]),
                                      np.stack([turns[k].action_mask for k in ours]), greedy)
            actions.update(zip(ours, chosen.tolist()))
        for k in active:
            action = actions[k] if k in actions else bot.act(turns[k].observation, turns[k].action_mask)
            envs[k].act(action)
            turns[k] = envs[k].advance()
            if turns[k].episodes:
                winner = turns[k].episodes[0].winner
                outcomes[k] = -1 if winner is None else winner
    wins = sum(o == seat for o in outcomes)
    draws = sum(o == -1 for o in outcomes)
    return MatchResult(seat, games, wins, draws, games - wins - draws)


def evaluate(policy: Policy, opponent: str, games: int, seed: int = 0, greedy: bool = True) -> dict:
    """`games` games in each seat against `opponent`; a JSON-ready dict keyed by seat name."""
    per_seat = {}
    for seat, name in enumerate(policy.spec.seats):
        per_seat[name] = play_match(policy, opponent, games, seat, seed + 1_000_003 * seat, greedy).as_dict()
    return {"env": policy.spec.name, "opponent": opponent, "games_per_seat": games, "greedy": greedy,
            "seats": per_seat}
