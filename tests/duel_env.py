"""A custom two-player simultaneous-move game, as a user would write one: matching pennies as a
PettingZoo Parallel env with agents `player_0` and `player_1`, for `env.name: pettingzoo:tests.duel_env`.

Each of `rounds` rounds both players show 0 or 1; player_0 scores +1 if they match, else player_1
does (-1 for the other). Observation: the other player's last choice (one-hot, zeros at the start).
`names` renames the agents (e.g. ["agent_0", "agent_1"]), to test seat inference. `nan_every` = k > 0
gives player_1 a NaN reward in the last round of every k-th episode (a buggy env's reward).
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Duel(ParallelEnv):
    metadata = {"name": "duel_v0", "render_modes": []}

    def __init__(self, rounds: int = 3, names: list[str] | None = None, render_mode: str | None = None,
                 nan_every: int = 0):
        self.rounds = rounds
        self.nan_every = nan_every
        self.episodes = 0
        self.possible_agents = list(names or ["player_0", "player_1"])
        self.agents: list[str] = []
        self.render_mode = render_mode

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def _observations(self, last: dict[str, int] | None) -> dict[str, np.ndarray]:
        out = {}
        for me, other in zip(self.possible_agents, self.possible_agents[::-1]):
            obs = np.zeros(2, np.float32)
            if last is not None:
                obs[last[other]] = 1.0
            out[me] = obs
        return out

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.agents = list(self.possible_agents)
        self.round = 0
        self.episodes += 1
        return self._observations(None), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        first, second = self.possible_agents
        score = 1.0 if int(actions[first]) == int(actions[second]) else -1.0
        rewards = {first: score, second: -score}
        self.round += 1
        over = self.round >= self.rounds
        if over and self.nan_every and self.episodes % self.nan_every == 0:
            rewards[second] = float("nan")
        obs = self._observations({a: int(actions[a]) for a in self.possible_agents})
        terminated = {a: over for a in self.agents}
        truncated = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, terminated, truncated, infos


def parallel_env(**kwargs) -> Duel:
    return Duel(**kwargs)
