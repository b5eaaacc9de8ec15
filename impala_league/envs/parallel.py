"""Adapter for PettingZoo Parallel (simultaneous-move) games and for single-agent gymnasium envs.

Every living agent acts at every step. Which step a reward belongs to is decided here:

* *Simultaneous step.* The rewards `env.step` returns are the outcome of the actions just taken: each
  acting agent's reward settles the step it just took (a settlement per acting agent, every step).
* *Dead unit.* An agent whose `terminated` flag is set has its step settled with `done=True`; it is
  no longer asked to act, and its stream goes on with the next episode (the slot is reused).
* *Time limit.* A truncated (and not terminated) agent is settled with `done=True, truncated=True`
  and its final observation (the one `env.step` returns with the truncation, before the reset), from
  whose value the learner bootstraps; it still counts as alive for the outcome. An agent that is
  both terminated and truncated is terminated (it is dead).
* *Lost life.* A step whose info carries `envs.atari.LIFE_LOST` (an Atari game with `end_on_life_loss`)
  is settled with `done=True` (terminal for the learner: discount 0, the core reset) while the agent
  plays on in the same game; the episode and its score end with the game.
* *Empty mask.* An acting agent with an all-zero mask raises `NoLegalAction`; with
  `empty_mask="skip"` it is left out of the step and of the action dict passed to `env.step`, and the
  rewards it receives meanwhile settle its previous step (as a waiting player's do in envs/aec.py).
* *Episode end.* When no agent is left (PettingZoo removes finished agents), the episode's result is
  recorded and the env is reset with the next seed; play goes on without a gap.
* *Outcome.* `outcome="return"`: the seat whose agents' summed reward is highest wins;
  `outcome="units_left"`: the seat with the most agents alive at the end wins (a battle); ties draw.
  Alive means never terminated, unless the env counts its living units itself (`units_left`): MAgent2
  marks every unit terminated on the step that ends a battle, survivors included, so for it the
  game's own count is read after the last step.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import numpy as np

from impala_league.envs.atari import LIFE_LOST
from impala_league.envs.base import EMPTY_MASK_RULES, EpisodeResult, EpisodeSeeds, Settlement, Step, check_mask, leader

log = logging.getLogger("envs")

Encode = Callable[[Any], tuple[np.ndarray, "np.ndarray | None"]]
OUTCOMES = ("return", "units_left")


class ParallelAdapter:
    """One PettingZoo Parallel env seen as agents that all act at once.

    Args:
      make: zero-argument factory of the Parallel env.
      seed: an int (episode k is reset with `seed + k`) or a numpy SeedSequence (episode k gets
        a seed drawn from its child k); see `EpisodeSeeds`.
      encoders: per agent (in `possible_agents` order), raw observation -> (observation, mask or None).
      agent_seats: the seat (side) of each agent.
      num_actions: A, for the all-legal mask of envs without one.
      outcome: "return" or "units_left", the rule that names the winning seat.
      units_left: optional, env -> living units per seat, read after the episode's last step; without
        it a unit is alive until it is terminated.
      name: the env's registry name, for error messages.
      empty_mask: "error" (an acting agent without a legal action raises NoLegalAction) or "skip"
        (such an agent does not act this step); see envs/base.py.

    Use: `step = adapter.advance()`, choose one action per agent in `step.agents`, `adapter.act(actions)`.
    """

    def __init__(self, make: Callable[[], object], seed: int | np.random.SeedSequence, encoders: Sequence[Encode],
                 agent_seats: Sequence[int], num_actions: int, outcome: str = "return",
                 units_left: Callable[[Any], Sequence[int]] | None = None, name: str = "parallel",
                 empty_mask: str = "error"):
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        if empty_mask not in EMPTY_MASK_RULES:
            raise ValueError(f"empty_mask must be one of {EMPTY_MASK_RULES}, got {empty_mask!r}")
        self.name = name
        self._empty_mask = empty_mask
        self.env = make()
        self.agents: tuple[str, ...] = tuple(self.env.possible_agents)
        self._index = {agent: i for i, agent in enumerate(self.agents)}
        self._encoders = list(encoders)
        self._seats = list(agent_seats)
        self._num_seats = max(self._seats) + 1
        self._all_legal = np.ones(num_actions, np.uint8)
        self._outcome = outcome
        self._units_left = units_left
        self.seeds = EpisodeSeeds(seed)  # seeds(k): the reset seed of episode k
        self._episode = 0
        self._pending: list[Settlement] = []
        self._episodes: list[EpisodeResult] = []
        self._reset()

    def _reset(self) -> None:
        self._obs, self._infos = self.env.reset(seed=self.seeds(self._episode))
        self._episode += 1
        self._returns = [0.0] * self._num_seats
        self._alive = set(self.env.agents)
        self._acted: set[str] = set()  # agents with a step in this episode (a settlement has a step to land on)
        self._acting: list[str] = []
        self._length = 0

    def advance(self) -> Step:
        """The agents to act now (every living agent), with what was settled since the last call."""
        agents, observations, masks = [], [], []
        self._acting = []
        for name in self.env.agents:
            i = self._index[name]
            observation, mask = self._encoders[i](self._obs[name])
            if mask is None:
                mask = self._infos.get(name, {}).get("action_mask", self._all_legal)
            mask = np.asarray(mask, np.uint8)
            if not check_mask(mask, self.name, name, self._length, self._empty_mask):
                continue
            self._acting.append(name)
            agents.append(i)
            observations.append(observation)
            masks.append(mask)
        step = Step(agents, observations, masks, self._pending, self._episodes)
        self._pending, self._episodes = [], []
        return step

    def act(self, actions: Sequence[int]) -> None:
        """Step the env with one action per agent of the last `advance`, in its order."""
        present = list(self.env.agents)
        self._acted.update(self._acting)
        self._obs, rewards, terminated, truncated, self._infos = self.env.step(
            {name: int(a) for name, a in zip(self._acting, actions)})
        self._length += 1
        still = set(self.env.agents)
        for name in present:
            i = self._index[name]
            reward = float(rewards.get(name, 0.0))
            self._returns[self._seats[i]] += reward
            if terminated.get(name, False):
                self._alive.discard(name)
            if name in self._acted:
                self._pending.append(self._settle(name, reward, bool(terminated.get(name, False)),
                                                  bool(truncated.get(name, False)), name in still))
        if not still:
            self._episodes.append(self._result())
            self._reset()

    def _settle(self, name: str, reward: float, terminated: bool, truncated: bool, present: bool) -> Settlement:
        """The settlement of agent `name`'s last step: terminated (or gone without a flag: dead),
        truncated (with its final observation, encoded as its observations are), or going on."""
        i = self._index[name]
        if terminated or (not truncated and not present):
            return Settlement(i, reward, True)
        if not truncated:
            # a lost life ends the step's learning episode (envs/atari.py end_on_life_loss); the game goes on
            return Settlement(i, reward, bool(self._infos.get(name, {}).get(LIFE_LOST, False)))
        if name not in self._obs:
            log.warning("env '%s': agent '%s' was truncated without a final observation; its last step is "
                        "settled as terminated (no bootstrap)", self.name, name)
            return Settlement(i, reward, True)
        return Settlement(i, reward, True, truncated=True, final_observation=self._encoders[i](self._obs[name])[0])

    def _result(self) -> EpisodeResult:
        if self._outcome == "return":
            return EpisodeResult(tuple(self._returns), self._length, leader(self._returns))
        if self._units_left is not None:
            left = tuple(int(n) for n in self._units_left(self.env))
        else:
            counts = [0] * self._num_seats
            for name in self._alive:
                counts[self._seats[self._index[name]]] += 1
            left = tuple(counts)
        return EpisodeResult(tuple(self._returns), self._length, leader(left), left)


class _OneAgent:
    """A gymnasium env dressed as a one-agent Parallel env (agent name "agent")."""

    def __init__(self, env: Any):
        self.env = env
        self.possible_agents = ["agent"]
        self.agents: list[str] = []

    def reset(self, seed: int | None = None):
        obs, info = self.env.reset(seed=seed)
        self.agents = ["agent"]
        return {"agent": obs}, {"agent": info}

    def step(self, actions: dict[str, int]):
        obs, reward, terminated, truncated, info = self.env.step(actions["agent"])
        if terminated or truncated:
            self.agents = []
        return ({"agent": obs}, {"agent": reward}, {"agent": terminated}, {"agent": truncated},
                {"agent": info})


def single_agent_adapter(make: Callable[[], object], seed: int | np.random.SeedSequence, encode: Encode,
                         num_actions: int, name: str = "gym", empty_mask: str = "error") -> ParallelAdapter:
    """A gymnasium env (`make()` returns it) as the one-agent case of `ParallelAdapter`: one seat,
    the return is the episode's score, and a time-limit truncation (gymnasium's `TimeLimit`) is
    settled as truncated with the observation `step` returned with it."""
    return ParallelAdapter(lambda: _OneAgent(make()), seed, [encode], [0], num_actions, name=name,
                           empty_mask=empty_mask)
