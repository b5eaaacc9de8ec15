"""Adapter for PettingZoo turn-based (AEC) games: one learning stream per agent (seat).

The AEC loop (`agent_iter`, `last`, `step`) makes turn order explicit. This adapter turns it into two
kinds of events for the actor:

* a **turn**: agent `s` must act now on `(observation, action_mask)` (a `Step` with one agent);
* a **settlement**: the reward and done flag of agent `s`'s previous step are now known.

In the two-player board games every agent is its own seat, so "seat" and "agent" coincide here.

Which step a reward belongs to is decided here and only here:

* *Waiting player.* PettingZoo accumulates every reward an agent receives between two of its own
  actions; `last()` returns that sum when the agent is next selected. It belongs to the agent's
  previous step: the move that led to the position it is in now.
* *Game end.* When the game ends (on either player's move) every agent is selected once more with
  `terminated` (or `truncated`) set and must be stepped with `None`. Its final reward settles its
  last step with `done=True`; no extra step is added to its stream. So in connect four the loser's
  last *own* move carries the -1, the winner's winning move the +1.
* *Time limit.* A truncated (not terminated) agent's last step is settled with `done=True,
  truncated=True` and the observation `last()` gives with the truncation (the state the episode was
  cut in), from whose value the learner bootstraps (the board games here have no time limit; other
  AEC games may).
* *No legal move.* A selected agent whose mask is all zeros raises `NoLegalAction` (naming the env,
  the agent and the move number) before any action is chosen: a turn cannot be skipped.
* *Seat that never acted.* A seat whose episode ends before its first move has no step to settle and
  is skipped.

After the last agent is stepped with `None` the env is reset (with the next seed) and play goes on,
so the actor sees an endless sequence of turns with episodes concatenated.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from impala_league.envs.base import EpisodeResult, EpisodeSeeds, Settlement, Step, check_mask, leader

Encode = Callable[[Any], tuple[np.ndarray, "np.ndarray | None"]]


class AECAdapter:
    """One PettingZoo AEC env seen as seats that take turns.

    Args:
      make: zero-argument factory of the PettingZoo AEC env (with PettingZoo's default wrappers).
      seed: an int (episode k is reset with `seed + k`) or a numpy SeedSequence (episode k gets
        a seed drawn from its child k); see `EpisodeSeeds`.
      encoders: per agent, raw observation -> (observation, action mask or None); see envs/spaces.py.
      num_actions: A, for the all-legal mask of envs without one.
      name: the env's registry name, for error messages.

    Use: `step = adapter.advance()`, pick an action for `step.agents[0]`, `adapter.act([action])`, repeat.

    Raises NoLegalAction from `advance` when the agent to move has no legal action.
    """

    def __init__(self, make: Callable[[], object], seed: int | np.random.SeedSequence, encoders: Sequence[Encode],
                 num_actions: int, name: str = "aec"):
        self.name = name
        self.env = make()
        self.agents: tuple[str, ...] = tuple(self.env.possible_agents)
        self._seat = {agent: i for i, agent in enumerate(self.agents)}
        self._encoders = list(encoders)
        self._all_legal = np.ones(num_actions, np.uint8)
        self.seeds = EpisodeSeeds(seed)  # seeds(k): the reset seed of episode k
        self._episode = 0
        self._reset()

    def _reset(self) -> None:
        self.env.reset(seed=self.seeds(self._episode))
        self._episode += 1
        self._acted = [False] * len(self.agents)  # has the seat a step awaiting settlement?
        self._returns = [0.0] * len(self.agents)
        self._length = 0

    def advance(self) -> Step:
        """Run the AEC loop until some agent must choose an action; collect what was settled."""
        settlements: list[Settlement] = []
        episodes: list[EpisodeResult] = []
        env = self.env
        while True:
            if not env.agents:
                episodes.append(EpisodeResult(tuple(self._returns), self._length, leader(self._returns)))
                self._reset()
                continue
            agent = env.agent_selection
            seat = self._seat[agent]
            obs, reward, terminated, truncated, _ = env.last()
            reward = float(reward)
            self._returns[seat] += reward
            done = bool(terminated or truncated)
            if self._acted[seat]:
                if truncated and not terminated:
                    settlements.append(Settlement(seat, reward, True, truncated=True,
                                                  final_observation=self._encoders[seat](obs)[0]))
                else:
                    settlements.append(Settlement(seat, reward, done))
            if done:
                self._acted[seat] = False
                env.step(None)
                continue
            observation, mask = self._encoders[seat](obs)
            self._mask = self._all_legal if mask is None else np.asarray(mask, np.uint8)
            check_mask(self._mask, self.name, agent, self._length)
            return Step([seat], [observation], [self._mask], settlements, episodes)

    def act(self, actions: Sequence[int]) -> None:
        """Play `actions[0]` for the agent of the last `advance`.

        Raises ValueError if the action is outside the action space or illegal by the last mask.
        """
        action = int(actions[0])
        if not (0 <= action < len(self._mask) and self._mask[action]):
            raise ValueError(f"illegal action {action} for {self.env.agent_selection}: legal actions are "
                             f"{np.flatnonzero(self._mask).tolist()}")
        self._acted[self._seat[self.env.agent_selection]] = True
        self._length += 1
        self.env.step(action)
