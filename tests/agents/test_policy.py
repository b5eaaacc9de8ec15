"""A trained policy from Python, as docs/evaluation.md shows it: `from impala_league.agents import load_policy`, then `act`
on what PettingZoo gives (its observation dict), refusing masks and shapes that cannot be played."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pettingzoo.classic import tictactoe_v3

from impala_league import REPO
from impala_league.agents.network import ActorCritic
from impala_league.config import load_config, to_yaml
from impala_league.agents.checkpoint import save_checkpoint
from impala_league.envs.registry import env_spec
from tests.agents.sc2_mock import mock_sc2_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    cfg = load_config(None, ["env.name=tictactoe", "agent.hidden=8", "agent.channels=4"])
    spec = env_spec("tictactoe")
    path = tmp_path_factory.mktemp("policy") / "latest.safetensors"
    save_checkpoint(path, ActorCritic(spec.obs_shape, spec.num_actions, cfg.agent), None, to_yaml(cfg),
                    {"step": 0, "agent_steps_trained": 0})
    return path


def test_load_policy_imports_from_agents_as_documented(checkpoint):
    code = f"from impala_league.agents import load_policy; print(type(load_policy({str(checkpoint)!r})).__name__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Policy"


def test_act_plays_a_whole_pettingzoo_game_from_its_observation_dicts(checkpoint):
    from impala_league.agents import load_policy

    policy = load_policy(checkpoint)
    env = tictactoe_v3.env()
    env.reset(seed=3)
    moves = 0
    for agent in env.agent_iter():
        observation, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        action = policy.act(observation)  # the dict itself: its mask is applied
        assert observation["action_mask"][action] == 1
        # Same answer as the array and mask given apart (greedy: deterministic).
        assert action == policy.act(observation["observation"], observation["action_mask"])
        env.step(action)
        moves += 1
    assert 5 <= moves <= 9


def test_act_refuses_an_all_zero_mask_a_wrong_shape_and_a_mask_given_twice(checkpoint):
    from impala_league.agents import load_policy

    policy = load_policy(checkpoint)
    env = tictactoe_v3.env()
    env.reset(seed=0)
    waiting = env.observe("player_2")  # not its turn: PettingZoo gives it an all-zero mask
    assert not waiting["action_mask"].any()
    with pytest.raises(ValueError, match="has no legal action"):
        policy.act(waiting)
    with pytest.raises(ValueError, match="has no legal action"):
        policy.act(waiting["observation"], np.zeros(9, np.int8))
    with pytest.raises(ValueError, match=r"observation of shape \(9,\); this policy plays tictactoe, whose "
                                         r"observations have shape \(3, 3, 2\)"):
        policy.act(np.zeros(9, np.int8))
    with pytest.raises(ValueError, match=r"action mask of shape \(7,\); tictactoe has 9 actions"):
        policy.act(waiting["observation"], np.ones(7, np.int8))
    with pytest.raises(ValueError, match="given twice"):
        policy.act(env.observe("player_1"), np.ones(9, np.int8))
    with pytest.raises(ValueError, match="must have the keys"):
        policy.act({"obs": waiting["observation"]})
    with pytest.raises(ValueError, match="action mask 1 has no legal action"):
        policy.act_batch(np.zeros((2, 3, 3, 2), np.int8), np.array([[1] * 9, [0] * 9]))


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_load_policy_plays_a_starcraft_checkpoint_with_its_fullyconv_network(core, tmp_path):
    """load_policy builds the network the checkpoint's config names (make_model), here SC2LE's FullyConv,
    and plays pysc2's mock env with FunctionCalls; greedy, its actions are the heads' argmaxes."""
    cfg = mock_sc2_config(core)
    import torch

    from impala_league.agents import load_policy
    from impala_league.agents.fullyconv import FullyConv
    from impala_league.agents.model import make_model, policy_head
    from impala_league.envs.registry import make_env

    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    torch.manual_seed(0)
    model = make_model(spec, cfg.agent)
    path = tmp_path / "latest.safetensors"
    save_checkpoint(path, model, None, to_yaml(cfg), {"step": 0, "agent_steps_trained": 0})
    policy = load_policy(path)
    assert isinstance(policy.model, FullyConv) and policy.recurrent == (core == "lstm")
    for name, value in model.state_dict().items():
        assert torch.equal(policy.model.state_dict()[name], value)
    env, head = make_env(cfg.env.name, 0, cfg.env.kwargs), policy_head(spec)
    step = env.advance()
    for t in range(12):
        obs, mask = step.observations[0], step.action_masks[0]
        action = policy.act(obs, mask, reward=step.settlements[0].reward if step.settlements else 0.0)
        assert action.shape == (len(spec.action_heads),) and mask[action[0]] == 1
        if core == "none":  # the network's own greedy FunctionCall
            batch = {k: torch.as_tensor(v)[None] for k, v in obs.items()}
            logits, _ = model.eval()(batch, torch.as_tensor(mask)[None])
            np.testing.assert_array_equal(action, head.play(logits, None, 0.0)[0].numpy())
        env.act([action])
        step = env.advance()
    with pytest.raises(ValueError, match="dict of the arrays"):
        policy.act({"screen": obs["screen"]}, mask)
