"""An acting agent with no legal action is an error (naming env, agent and step), in every adapter,
unless the env is built with empty_mask="skip": then that agent is not asked to act."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

from impala_league.distributed.actor import UnrollBuffer
from impala_league.distributed.wire.codec import UnrollSpec
from impala_league.envs.aec import AECAdapter
from impala_league.envs.base import NoLegalAction
from impala_league.envs.parallel import ParallelAdapter
from impala_league.envs.registry import EnvSpec, make_env
from impala_league.envs.spaces import observation_encoder

AGENTS = ["hunter_0", "prey_0"]
A = 3
SPEC = EnvSpec("resting", (1,), np.dtype(np.float32), A, ("hunter", "prey"), agents=tuple(AGENTS),
               agent_seats=(0, 1), kind="parallel")
ENCODE = observation_encoder(spaces.Box(0, 100, (1,), np.float32)).encode


class Resting(ParallelEnv):
    """prey_0 rests on odd steps: its `info["action_mask"]` is then all zeros. Every step each agent
    present gets reward t + 1 (resting or not); 4 steps an episode. Records the action dicts."""

    metadata = {"name": "resting"}

    def __init__(self):
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self.t = 0
        self.received: list[dict] = []

    def observation_space(self, agent):
        return spaces.Box(0, 100, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(A)

    def _infos(self):
        rest = np.zeros(A, np.int8) if self.t % 2 else np.ones(A, np.int8)
        return {a: {"action_mask": rest if a == "prey_0" else np.ones(A, np.int8)} for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(AGENTS), 0
        return {a: np.array([0], np.float32) for a in self.agents}, self._infos()

    def step(self, actions):
        self.received.append(dict(actions))
        acting = list(self.agents)
        rewards = {a: float(self.t + 1) for a in acting}
        self.t += 1
        end = self.t >= 4
        self.agents = [] if end else acting
        obs = {a: np.array([self.t], np.float32) for a in acting}
        return obs, rewards, {a: end for a in acting}, {a: False for a in acting}, self._infos()


def test_an_acting_agent_without_a_legal_action_is_an_error_naming_env_agent_and_step():
    adapter = ParallelAdapter(Resting, 0, [ENCODE] * 2, SPEC.agent_seats, A, name="resting")
    step = adapter.advance()
    assert step.agents == [0, 1]
    adapter.act([0, 0])
    with pytest.raises(NoLegalAction, match=r"env 'resting': agent 'prey_0' must act at step 1 .*all zeros"):
        adapter.advance()


def test_skip_leaves_a_resting_agent_out_and_settles_its_rewards_on_its_previous_step():
    adapter = ParallelAdapter(Resting, 0, [ENCODE] * 2, SPEC.agent_seats, A, name="resting", empty_mask="skip")
    buffers = [UnrollBuffer(UnrollSpec(SPEC, 2)) for _ in AGENTS]
    unrolls: dict[int, list] = {0: [], 1: []}
    acting = []
    step = adapter.advance()
    for _ in range(4):
        for s in step.settlements:
            buffers[s.agent].settle(s.reward, s.done, s.truncated, s.final_observation)
        acting.append(list(step.agents))
        for a, obs, mask in zip(step.agents, step.observations, step.action_masks):
            assert mask.any()
            out = buffers[a].observe(obs, mask)
            if out is not None:
                unrolls[a].append(out)
            buffers[a].record_action(1, np.zeros(A, np.float32))
        adapter.act([1] * len(step.agents))
        step = adapter.advance()
    for s in step.settlements:
        buffers[s.agent].settle(s.reward, s.done, s.truncated, s.final_observation)
    assert acting == [[0, 1], [0], [0, 1], [0]]
    # The env is never handed an action for the resting agent.
    assert adapter.env.received == [{"hunter_0": 1, "prey_0": 1}, {"hunter_0": 1},
                                    {"hunter_0": 1, "prey_0": 1}, {"hunter_0": 1}]
    # prey_0 acted at steps 0 and 2: each of its steps holds its own reward and the one received
    # while resting (1 + 2, then 3 + 4), and its second step ends the episode.
    assert buffers[1].arrays["reward"].tolist() == [3.0, 7.0] and buffers[1].arrays["done"].tolist() == [0, 1]
    assert unrolls[0][0]["reward"].tolist() == [1.0, 2.0]


def test_skip_is_refused_for_turn_based_games():
    with pytest.raises(ValueError, match="turn-based"):
        make_env("tictactoe", 0, empty_mask="skip")


def test_turn_based_agent_without_a_legal_move_is_an_error_before_any_action():
    from pettingzoo.classic import tictactoe_v3

    class NoMoves:
        """tic-tac-toe whose masks are all zeros (as a buggy game would report)."""

        def __init__(self):
            self.env = tictactoe_v3.raw_env()
            self.possible_agents = self.env.possible_agents

        def __getattr__(self, name):
            return getattr(self.env, name)

        def last(self):
            obs, *rest = self.env.last()
            return {**obs, "action_mask": np.zeros(9, np.int8)}, *rest

    from impala_league.envs.registry import _lookup

    encoders = _lookup("tictactoe", None).encoders
    adapter = AECAdapter(NoMoves, 0, encoders, 9, name="tictactoe")
    with pytest.raises(NoLegalAction, match=r"env 'tictactoe': agent 'player_1' must act at step 0"):
        adapter.advance()
