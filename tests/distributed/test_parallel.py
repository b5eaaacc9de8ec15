"""Simultaneous-move and single-agent envs: the Parallel adapter, the registry's spaces, and real runs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

from impala_league import REPO
from impala_league.distributed.actor import UnrollBuffer
from impala_league.distributed.wire.codec import UnrollSpec
from impala_league.envs.parallel import ParallelAdapter
from impala_league.envs.registry import EnvSpec, env_spec, make_env
from impala_league.envs.spaces import UnsupportedSpace, observation_encoder
from impala_league.distributed.vtrace import from_importance_weights

AGENTS = ["red_0", "red_1", "blue_0"]
DIES_AT = {"red_0": 3, "red_1": 1, "blue_0": 2}  # the step (0-based) whose action is the unit's last
MAX_CYCLES = 4  # every unit still alive after step 3 is truncated


class Skirmish(ParallelEnv):
    """Three units, two teams. At step t each acting unit gets reward 10 * (its index + 1) + t; a
    unit is terminated on its DIES_AT step (red_0's death at step 3 coincides with the time limit:
    terminated wins, it is dead). Observations are [index, t]."""

    metadata = {"name": "skirmish"}

    def __init__(self):
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent):
        return spaces.Box(0, 100, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self):
        return {a: np.array([AGENTS.index(a), self.t], np.float32) for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(AGENTS), 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents)
        rewards = {a: 10.0 * (AGENTS.index(a) + 1) + self.t for a in self.agents}
        terminated = {a: DIES_AT[a] == self.t for a in self.agents}
        truncated = {a: self.t + 1 >= MAX_CYCLES for a in self.agents}
        self.t += 1
        self.agents = [a for a in self.agents if not terminated[a] and not truncated[a]]
        obs = self._obs()
        return obs, rewards, terminated, truncated, {a: {} for a in obs}


SPEC = EnvSpec("skirmish", (2,), np.dtype(np.float32), 3, ("red", "blue"), agents=tuple(AGENTS),
               agent_seats=(0, 0, 1), kind="parallel")


def adapter(outcome="units_left"):
    encode = observation_encoder(spaces.Box(0, 100, (2,), np.float32)).encode
    return ParallelAdapter(Skirmish, 0, [encode] * 3, SPEC.agent_seats, 3, outcome)


def test_units_die_at_different_times_and_each_stream_ends_with_its_own_done():
    env = adapter()
    T = 3
    buffers = [UnrollBuffer(UnrollSpec(SPEC, T)) for _ in AGENTS]
    unrolls: dict[int, list] = {i: [] for i in range(3)}
    episodes = []
    step = env.advance()
    acting_per_step = []
    for _ in range(6):  # one full episode (4 env steps) and two steps of the next
        for s in step.settlements:
            buffers[s.agent].settle(s.reward, s.done)
        episodes += step.episodes
        acting_per_step.append(list(step.agents))
        for agent, obs, mask in zip(step.agents, step.observations, step.action_masks):
            out = buffers[agent].observe(obs, mask)
            if out is not None:
                unrolls[agent].append(out)
            buffers[agent].record_action(agent, np.zeros(3, np.float32))
        env.act(list(step.agents))
        step = env.advance()
    # Dead units are no longer asked to act; the slot comes back in the next episode.
    assert acting_per_step == [[0, 1, 2], [0, 1, 2], [0, 2], [0], [0, 1, 2], [0, 1, 2]]
    # red_1: acts at t=0 (reward 20) and t=1 (21, dies) -> its next observation is the new episode's t=0,
    # which completes its first unroll of T=3 steps only after one more step of the next episode.
    r1 = unrolls[1][0]
    np.testing.assert_array_equal(r1["reward"], [20, 21, 20])
    np.testing.assert_array_equal(r1["done"], [0, 1, 0])
    np.testing.assert_array_equal(r1["obs"][:, 1], [0, 1, 0, 1])  # the bootstrap observation is t=1 of episode 2
    # blue_0 (index 2): rewards 30, 31, 32 and dies at t=2.
    b0 = unrolls[2][0]
    np.testing.assert_array_equal(b0["reward"], [30, 31, 32])
    np.testing.assert_array_equal(b0["done"], [0, 0, 1])
    np.testing.assert_array_equal(b0["obs"][:, 1], [0, 1, 2, 0])
    # red_0: the last unit, acts at t=0..3; terminated at t=3 together with the time limit.
    r0 = unrolls[0][0]
    np.testing.assert_array_equal(r0["reward"], [10, 11, 12])
    np.testing.assert_array_equal(r0["done"], [0, 0, 0])
    assert buffers[0].arrays["reward"][0] == 13 and buffers[0].arrays["done"][0] == 1
    # The outcome: red_0 died at the last step (terminated, not truncated), so no unit is left: a draw;
    # the returns are per team: red 10+11+12+13 + 20+21, blue 30+31+32.
    assert len(episodes) == 1
    assert episodes[0].returns == (87.0, 93.0) and episodes[0].length == 4 and episodes[0].winner is None


def first_episode(env):
    while True:
        step = env.advance()
        if step.episodes:
            return step.episodes[0]
        env.act([0] * len(step.agents))


def test_outcome_rules(monkeypatch):
    # With the deaths above: no unit is left (a draw by units), but blue's return 93 beats red's 87.
    assert first_episode(adapter("return")).winner == 1
    # Nobody dies: the time limit ends it with red's 2 units against blue's 1.
    monkeypatch.setitem(globals(), "DIES_AT", {a: 99 for a in AGENTS})
    episode = first_episode(adapter("units_left"))
    assert episode.returns == (10 + 11 + 12 + 13 + 20 + 21 + 22 + 23, 30 + 31 + 32 + 33)
    assert episode.winner == 0


def test_bootstrap_stops_at_a_dead_units_last_step():
    # V-trace targets of blue_0's unroll (rewards 30, 31, 32, done at the last step), on-policy
    # (log_rhos 0) with values V = 5 everywhere and bootstrap value 1000 for the next episode's
    # observation: the death must cut the bootstrap, so vs_t are the plain discounted sums.
    gamma = 0.5
    rewards = torch.tensor([[30.0], [31.0], [32.0]])
    done = torch.tensor([[0.0], [0.0], [1.0]])
    out = from_importance_weights(torch.zeros(3, 1), gamma * (1 - done), rewards, torch.full((3, 1), 5.0),
                                  torch.tensor([1000.0]))
    expected = [30 + 0.5 * 31 + 0.25 * 32, 31 + 0.5 * 32, 32]
    np.testing.assert_allclose(out.vs[:, 0].numpy(), expected)
    # pg advantage at the last step: r + gamma * 0 * bootstrap - V = 32 - 5.
    assert out.pg_advantages[2, 0].item() == pytest.approx(27.0)


def test_registry_reads_teams_and_pads_roles():
    battle = env_spec("battle", {"map_size": 20})
    assert battle.seats == ("red", "blue") and battle.kind == "parallel"
    assert battle.obs_shape == (13, 13, 5) and battle.num_actions == 21
    assert battle.agent_seats.count(0) == battle.agent_seats.count(1) == len(battle.agents) // 2
    tag = env_spec("mpe:simple_tag")  # adversaries see 16 numbers, the good agent 14
    assert tag.seats == ("adversary", "agent") and tag.obs_shape == (16 + 2,)
    env = make_env("mpe:simple_tag", 3)
    step = env.advance()
    good = step.agents.index(3)
    obs = step.observations[good]
    assert obs[14:16].tolist() == [0, 0] and obs[16:].tolist() == [0, 1]  # padding, then seat one-hot
    assert step.observations[0][16:].tolist() == [1, 0]
    cart = env_spec("gym:CartPole-v1")
    assert cart.seats == ("agent",) and cart.obs_shape == (4,) and cart.num_actions == 2


def test_spaces_are_encoded_or_refused_with_the_reason():
    one_hot = observation_encoder(spaces.Discrete(4, start=1))
    np.testing.assert_array_equal(one_hot.encode(3)[0], [0, 0, 1, 0])
    multi = observation_encoder(spaces.MultiDiscrete([2, 3]))
    np.testing.assert_array_equal(multi.encode([1, 2])[0], [0, 1, 0, 0, 1])
    image = observation_encoder(spaces.Box(0, 255, (4, 4, 3), np.uint8))
    assert image.dtype == np.uint8 and one_hot.dtype == np.int8  # images travel as uint8, one-hots as int8
    with pytest.raises(UnsupportedSpace, match="Tuple"):
        observation_encoder(spaces.Tuple([spaces.Discrete(2)]))
    with pytest.raises(ValueError, match="action space Box.*Discrete"):
        env_spec("gym:Pendulum-v1")
    with pytest.raises(ValueError, match="did you mean 'gym:CartPole-v1'"):
        env_spec("gym:CartPol-v1")
    with pytest.raises(ValueError, match="cannot import 'pettingzoo.classic.nope_v1'"):
        env_spec("pettingzoo:pettingzoo.classic.nope_v1")
    with pytest.raises(ValueError, match="does not accept env.kwargs"):
        env_spec("battle", {"no_such_option": 1})
    with pytest.raises(ValueError, match="refuses env.kwargs"):
        env_spec("battle", {"map_size": 5})


def test_any_pettingzoo_env_by_import_path_plays():
    spec = env_spec("pettingzoo:pettingzoo.classic.go_v5", {"board_size": 5})
    assert spec.kind == "aec" and spec.num_actions == 26 and spec.obs_shape == (5, 5, 17)
    env = make_env("pettingzoo:pettingzoo.classic.go_v5", 0, {"board_size": 5})
    step = env.advance()
    assert step.agents == [0] and step.action_masks[0][25] == 1  # pass is legal


def test_images_travel_as_uint8_and_reach_the_network_scaled():
    from impala_league.agents.network import ActorCritic
    from impala_league.config import AgentConfig

    torch.manual_seed(0)
    cfg = AgentConfig(torso="mlp", hidden=8, mlp_layers=1)
    model = ActorCritic((4, 4, 3), 2, cfg, image=True)  # EnvSpec.obs_image: a uint8 Box of bounds 0..255
    unscaled = ActorCritic((4, 4, 3), 2, cfg)
    unscaled.load_state_dict(model.state_dict())
    image = torch.full((1, 4, 4, 3), 255, dtype=torch.uint8)
    mask = torch.ones(1, 2)
    np.testing.assert_allclose(model(image, mask)[0].detach(), unscaled(torch.ones(1, 4, 4, 3), mask)[0].detach())


def _train(tmp_path, redis_url, config: str, name: str, *overrides: str, eval_games: int = 0):
    cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / config), "--redis-url", redis_url,
           "--eval-games", str(eval_games), "--set", f"run.name={name}", "--set", f"run.dir={tmp_path}",
           "--set", "run.wandb_mode=disabled", "--set", "run.log_every_s=1", "--set", "run.max_minutes=0",
           "--set", "actor.num_actors=1", *[a for o in overrides for a in ("--set", o)]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return proc, records


def test_battle_trains_end_to_end_with_dying_units(tmp_path, redis_url, redis_client, run_name):
    # A small map: 4 units a team (map_size 12), 30-step battles, both teams the learning policy.
    proc, records = _train(tmp_path, redis_url, "configs/battle.yaml", run_name, "env.kwargs.map_size=12",
                           "env.kwargs.max_cycles=30", "run.total_agent_steps=6000", "actor.num_envs=2",
                           "actor.unroll_length=10", "learner.batch_size=8", "agent.channels=8", "agent.hidden=32",
                           eval_games=2)
    assert records[-1]["agent_steps_trained"] >= 6000
    from impala_league.distributed.wire.transport import ResultsStream

    results = ResultsStream(redis_client, run_name).read_new()
    assert results and all(r["length"] <= 30 and len(r["returns"]) == 2 for r in results)
    assert {r["winner"] for r in results} <= {-1, 0, 1}
    assert "greedy policy vs random over 2 games per seat:" in proc.stdout and "as red: won" in proc.stdout


def test_gym_env_trains_and_reports_returns(tmp_path, redis_url, run_name):
    proc, records = _train(tmp_path, redis_url, "configs/cartpole.yaml", run_name, "run.total_agent_steps=20000",
                           "actor.num_envs=4", eval_games=3)
    assert records[-1]["agent_steps_trained"] >= 20000
    returns = [r["episode_return"] for r in records if "episode_return" in r]
    assert returns and all(r >= 8 for r in returns)  # CartPole ends no earlier than 8 steps
    assert "greedy policy over 3 episodes: mean return" in proc.stdout


def test_a_battle_won_by_elimination_is_a_win_not_a_draw(monkeypatch):
    # MAgent2 marks every unit terminated on the step that ends a battle, survivors included; the
    # adapter reads the game's own count of living units, so the team that wiped out the other wins.
    class Wipeout(Skirmish):
        def step(self, actions):
            obs, rewards, terminated, truncated, infos = super().step(actions)
            if self.t == 2:  # step 1 killed blue's last unit: the game ends, red_0 alive but flagged too
                terminated = {a: True for a in terminated}
                self.agents = []
            return obs, rewards, terminated, truncated, infos

    monkeypatch.setitem(globals(), "DIES_AT", {"red_0": 99, "red_1": 0, "blue_0": 1})
    encode = observation_encoder(spaces.Box(0, 100, (2,), np.float32)).encode
    plain = first_episode(ParallelAdapter(Wipeout, 0, [encode] * 3, SPEC.agent_seats, 3, "units_left"))
    # Counting terminations alone cannot tell the survivor from the dead: why battle reads the game's count.
    assert plain.units_left == (0, 0) and plain.winner is None
    counted = first_episode(ParallelAdapter(Wipeout, 0, [encode] * 3, SPEC.agent_seats, 3, "units_left",
                                            units_left=lambda env: (1, 0)))
    assert counted.units_left == (1, 0) and counted.winner == 0


def test_magent_battle_counts_its_living_units_per_team():
    env = make_env("battle", 0, {"map_size": 12, "max_cycles": 3})
    episode = first_episode(env)  # three steps of all-zero actions (stand still): nobody dies
    assert episode.units_left == (2, 2) and episode.winner is None
