"""A one-agent PettingZoo Parallel env whose observation is a Box of integer planes, for
`env.name: pettingzoo:tests.planes_env`: the space is Box(low, high, (2, 2, 1), dtype) and every
observation holds `value` (an int64 array, as a careless env might return it, whatever the space says).
Each episode is one step; the action (Discrete(2)) is ignored.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Planes(ParallelEnv):
    metadata = {"name": "planes_v0", "render_modes": []}

    def __init__(self, low: int = 0, high: int = 1, value: int = 1, dtype: str = "uint8",
                 render_mode: str | None = None):
        self.space = spaces.Box(low, high, (2, 2, 1), np.dtype(dtype))
        self.value = value
        self.possible_agents = ["agent"]
        self.agents: list[str] = []
        self.render_mode = render_mode

    def observation_space(self, agent: str) -> spaces.Space:
        return self.space

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"agent": np.full((2, 2, 1), self.value, np.int64)}

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.agents = list(self.possible_agents)
        return self._obs(), {"agent": {}}

    def step(self, actions: dict[str, int]):
        self.agents = []
        return self._obs(), {"agent": 0.0}, {"agent": True}, {"agent": False}, {"agent": {}}


def parallel_env(**kwargs) -> Planes:
    return Planes(**kwargs)
