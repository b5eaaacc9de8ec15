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
* **terminated / truncated**: an episode ends either because the game is over for that agent
  (terminated: nothing follows, the value of what comes after is 0) or because it stopped being
  watched (truncated: a time limit such as MPE's `max_cycles` or gymnasium's `TimeLimit`; the game
  would have gone on, so the learner bootstraps from the value of the episode's final observation).
  Both end the episode for replays, evaluation and episode statistics.
* **empty mask**: an acting agent whose action mask is all zeros has no legal move. The adapters
  raise `NoLegalAction` where they read the mask, unless the env is built with
  `empty_mask="skip"` (for games that use an all-zero mask to say "not acting now"): such an agent is
  then not asked to act at all, and what it receives meanwhile settles its previous step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np


EMPTY_MASK_RULES = ("error", "skip")


class NoLegalAction(ValueError):
    """An agent that must act has an action mask of all zeros (see `empty mask` above)."""


def check_mask(mask: np.ndarray, env: str, agent: str, step: int, rule: str = "error") -> bool:
    """True when `mask` (uint8 [A]) has a legal action; False when it has none and `rule` is "skip".

    Raises:
      NoLegalAction: naming the env, the agent and the episode step, when the mask is all zeros and
        `rule` is "error".
    """
    if mask.any():
        return True
    if rule == "skip":
        return False
    raise NoLegalAction(f"env '{env}': agent '{agent}' must act at step {step} of its episode but its action "
                        f"mask is all zeros (no legal action); if this game uses an empty mask to mean "
                        f"'not acting now', build it with env.empty_mask=skip")


@dataclass(frozen=True)
class EnvSpec:
    """What the actor, learner, codec and agents need to know about a game.

    obs_shape / obs_dtype: one agent's observation (channels last for boards and local views).
    num_actions: size of the Discrete action space; `action_mask` is uint8 [num_actions].
    seats: the sides of the game in order (seat 0 moves first in turn-based games): the unit of
      outcomes, evaluation and the league.
    agents: every agent (PettingZoo `possible_agents`); agent_seats[i] is the seat of agent i. In the
      board games each agent is its own seat; in a battle every unit of a team shares its seat.
    kind: "aec" (turn-based), "parallel" (simultaneous moves), "gym" (one agent) or "sc2".
    obs_arrays: for envs whose observation is several named arrays (StarCraft II), (name, shape,
      dtype) of each; None = one array of obs_shape / obs_dtype.
    action_heads: for multi-head actions (StarCraft II FunctionCalls), the number of choices of each
      head, head 0 being masked by `action_mask` [num_actions]; None = one Discrete(num_actions).
    mirror_actions: for a game symmetric under reflecting observation axis `mirror_axis`, the action
      that each action becomes under the reflection; None where the game has no such symmetry.
    version: the versioned env module the game comes from (e.g. `connect_four_v3`); replays record it
      and refuse to re-simulate under another.
    obs_image: the observation is an image, a uint8 Box of bounds 0..255 (envs/spaces.py): the network
      scales it by 1/255. False for every other observation, uint8 0/1 planes included: they reach the
      network as they are.
    frames_per_step: emulator frames per env step (an Atari frame skip: 4), so that runs can be counted
      in frames as the published Atari curves are; 1 elsewhere.
    """

    name: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    seats: tuple[str, ...]
    mirror_axis: Optional[int] = None
    mirror_actions: Optional[tuple[int, ...]] = None
    version: Optional[str] = None
    agents: tuple[str, ...] = ()
    agent_seats: tuple[int, ...] = ()
    kind: str = "aec"
    obs_arrays: Optional[tuple[tuple[str, tuple[int, ...], np.dtype], ...]] = None
    action_heads: Optional[tuple[int, ...]] = None
    obs_image: bool = False
    frames_per_step: int = 1

    def __post_init__(self) -> None:
        if not self.agents:  # turn-based board games: one agent per seat
            object.__setattr__(self, "agents", self.seats)
            object.__setattr__(self, "agent_seats", tuple(range(len(self.seats))))


@dataclass(frozen=True)
class Settlement:
    """The outcome of agent `agent`'s previous action: the reward received since, and whether its
    stream ended there (`done`: the episode ended, or the unit died).

    truncated: the end was a time limit, not the game's end (implies `done`).
    final_observation: with `truncated`, the agent's observation of the state the episode was cut
      in (shape and dtype of `EnvSpec.obs_shape` / `obs_dtype`, or a dict of named arrays), kept
      from before the env's reset: the learner bootstraps the step from its value. None otherwise.
    """

    agent: int
    reward: float
    done: bool
    truncated: bool = False
    final_observation: Any = None


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
    """Index of the strictly highest score, or None when several share it (a draw) or when any score is
    NaN (no winner can be read from it: `max` would pick by seat order)."""
    if any(math.isnan(s) for s in scores):
        return None
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


class GroupSlot:
    """Game `index` of a group that steps many games in one call (atari_vector.AtariVectorGroup,
    atari2p_vector.Atari2pGroup), with the adapter interface (`advance`, `act`) of one env: the group's
    `advance(i)` and `act(i, actions)` for that game."""

    def __init__(self, group: Any, index: int):
        self.group = group
        self.index = index
        self.name = group.name

    def advance(self) -> Step:
        return self.group.advance(self.index)

    def act(self, actions: Sequence[int]) -> None:
        self.group.act(self.index, actions)
