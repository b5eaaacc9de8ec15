"""What every env adapter gives the actor: steps of acting agents, settlements, finished episodes.

Terms used across `envs/`:

* **agent**: one PettingZoo agent (a seat of a board game, one unit of a battle, the one agent of a
  gymnasium env), numbered by its index in `EnvSpec.agents`. Each agent the learner plays is one
  *learning stream*.
* **seat**: a side of the game, the unit of outcomes and of the league: the two players of a board
  game, the red and blue teams of a battle. `EnvSpec.agent_seats[i]` is agent i's seat.
* **step**: the agents that must act now, with their observations and action masks (one agent in a
  turn-based game, every living unit in a simultaneous one).
* **settlement**: the reward and done flag of an agent's previous action, once they are known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Settlement:
    """The outcome of agent `agent`'s previous action: the reward received since, and whether its
    stream ended there (the episode ended, or the unit died)."""

    agent: int
    reward: float
    done: bool


@dataclass(frozen=True)
class EpisodeResult:
    """A finished episode.

    returns: summed reward per seat (over the seat's agents); length: env steps taken (in a
    turn-based game, moves); winner: the winning seat by the env's rule, None for a draw;
    units_left: agents alive per seat at the end, where the outcome is decided by it (a battle).
    """

    returns: tuple[float, ...]
    length: int
    winner: int | None
    units_left: tuple[int, ...] | None = None


class EpisodeSeeds:
    """The reset seed of each episode of one env.

    From an int `s` (evaluation, replays, benchmarks): episode k is reset with `s + k`, so a recorded
    game names its seed. From a numpy `SeedSequence` (the actors, see distributed/actor.py): episode k
    is reset with a 63-bit integer drawn from the sequence's child k (`spawn_key + (k,)`, what
    `SeedSequence.spawn` would give as its k-th child). Sequences with different entropy or spawn keys
    (other run seeds, actors, envs) give unrelated seeds: no env replays another env's episodes, as
    the sums `s + k` of neighbouring envs did.

    Envs that keep fewer bits use the low ones (MAgent2 stores a C int; pysc2 takes 32 bits, see
    `envs.registry.make_env`).
    """

    def __init__(self, seed: int | np.random.SeedSequence):
        self.sequence = seed if isinstance(seed, np.random.SeedSequence) else None
        self.base = None if self.sequence is not None else int(seed)

    def __call__(self, episode: int) -> int:
        """The seed of episode `episode` (0 = the first)."""
        if self.sequence is None:
            return self.base + episode
        child = np.random.SeedSequence(self.sequence.entropy, spawn_key=(*self.sequence.spawn_key, episode),
                                       pool_size=self.sequence.pool_size)
        return int(child.generate_state(1, np.uint64)[0] >> np.uint64(1))


def leader(scores: Sequence[float]) -> int | None:
    """Index of the strictly highest score, or None when several share it (a draw)."""
    best = max(scores)
    leaders = [s for s, v in enumerate(scores) if v == best]
    return leaders[0] if len(leaders) == 1 else None


@dataclass
class Step:
    """What an adapter's `advance` returns.

    agents: indices of the agents that must act now; `act` takes one action per entry, in order.
    observations: per acting agent, shape `EnvSpec.obs_shape`, dtype `EnvSpec.obs_dtype`.
    action_masks: per acting agent, uint8 `[num_actions]`, 1 = legal.
    settlements: outcomes of earlier actions made known since the last `advance`.
    episodes: episodes that ended since the last `advance` (play has already gone on in a new one).
    """

    agents: list[int]
    observations: list[np.ndarray]
    action_masks: list[np.ndarray]
    settlements: list[Settlement] = field(default_factory=list)
    episodes: list[EpisodeResult] = field(default_factory=list)
