"""FullyConv on SC2 observations, and the sc2:<map> env adapter over pysc2's mock env."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import impala_league.envs.sc2_wrappers  # noqa: F401  (imports pysc2 through the shim)
from impala_league.agents.fullyconv import FullyConv
from impala_league.agents.heads import FunctionCallHead
from impala_league.agents.model import make_model, policy_head
from impala_league.agents.network import MASKED_LOGIT
from impala_league.config import ConfigError
from impala_league.checked_config import load_config
from impala_league.envs.registry import env_spec, make_env
from impala_league.envs.sc2_wrappers.compat import SC2NotInstalledError
from impala_league.envs.sc2_wrappers.env import check_game_installed, sc2_game

KWARGS = {"mock": True, "screen_size": 8, "minimap_size": 8}
NAME = "sc2:MoveToBeacon"


def _batch(observations: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.stack([o[k] for o in observations])) for k in observations[0]}


def test_fullyconv_heads_come_from_the_shared_state_as_in_the_paper():
    torch.manual_seed(0)
    cfg = load_config(None, [f"env.name={NAME}", "env.kwargs={mock: true, screen_size: 8, minimap_size: 8}",
                             "agent.torso=fullyconv", "league.bots=[]", "agent.hidden=16"])
    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    model = make_model(spec, cfg.agent)
    assert isinstance(model, FullyConv)
    head = policy_head(spec)
    step = make_env(NAME, 0, KWARGS).advance()
    obs = _batch(step.observations * 2)
    mask = torch.as_tensor(np.stack(step.action_masks * 2))
    obs["screen"][1, 6, 2, 3] = 48  # unit_type of one pixel of the second observation
    flat, baseline = model(obs, mask)
    logits = head.split(flat)
    assert [tuple(lg.shape) for lg in logits] == [(2, size) for size in spec.action_heads]
    assert baseline.shape == (2,)
    assert (logits[0][mask == 0] == MASKED_LOGIT).all() and (logits[0][mask == 1] > -1e3).all()
    # Rebuild the state by hand: screen tower, minimap tower, player broadcast (32 + 32 + 11 channels).
    torso = model.torso
    screen = torso.screen_tower(torso.screen_features(obs["screen"]))
    minimap = torso.minimap_tower(torso.minimap_features(obs["minimap"]))
    state = torch.cat([screen, minimap, obs["player"][:, :, None, None].expand(-1, -1, 8, 8)], 1)
    w, b = torso.spatial_policy.weight[:, :, 0, 0], torso.spatial_policy.bias
    by_hand = torch.einsum("kc,nchw->nkhw", w, state) + b[None, :, None, None]
    for k, column in enumerate([1, 2, 3]):  # screen, minimap, screen2
        assert torch.allclose(logits[column], by_hand[:, k].flatten(1), atol=1e-5)
    assert torch.allclose(baseline, model.heads.baseline(torso.fc(state.flatten(1))).squeeze(-1), atol=1e-5)
    assert not torch.equal(logits[1][0], logits[1][1])  # the changed pixel moves the screen head


def test_adapter_settles_every_step_and_concatenates_episodes():
    env = make_env(NAME, 0, KWARGS)
    head = policy_head(env_spec(NAME, KWARGS))
    assert isinstance(head, FunctionCallHead)
    generator = torch.Generator().manual_seed(0)
    step, ends, settled = env.advance(), [], 0
    for t in range(22):
        assert step.agents == [0] and set(step.observations[0]) == {"screen", "minimap", "player"}
        logits = torch.zeros(1, sum(head.sizes))
        logits[0, :573][torch.as_tensor(step.action_masks[0]) == 0] = MASKED_LOGIT
        actions, behaviour = head.sample(logits, torch.as_tensor(step.action_masks[0])[None], torch.zeros(1),
                                         generator)
        assert behaviour[0].sum().item() == pytest.approx(head.log_prob(logits, actions).item())
        env.act([actions[0].numpy()])
        step = env.advance()
        settled += len(step.settlements)
        if step.episodes:
            assert step.settlements[-1].done and step.episodes[0].length == 10
            ends.append(t)
    assert settled == 22 and ends == [9, 19]  # pysc2's mock ends an episode after 10 steps


def test_melee_map_has_two_agents_acting_at_once_each_in_its_own_seat():
    kwargs = {**KWARGS}
    spec = env_spec("sc2:Simple64", kwargs)
    assert spec.agent_seats == (0, 1) and spec.kind == "sc2"
    env = make_env("sc2:Simple64", 0, kwargs)
    no_op = np.zeros(len(spec.action_heads), np.int64)
    step = env.advance()
    for _ in range(10):
        assert step.agents == [0, 1]
        env.act([no_op, no_op])
        step = env.advance()
    assert [(s.agent, s.done) for s in step.settlements] == [(0, True), (1, True)]
    assert step.episodes[0].returns == (0.0, 0.0) and step.episodes[0].winner is None  # the mock's draw


def test_sc2_config_errors_name_the_fix(tmp_path, monkeypatch):
    base = ["agent.torso=fullyconv", "league.bots=[]"]
    with pytest.raises(ConfigError, match="did you mean 'sc2:MoveToBeacon'"):
        load_config(None, ["env.name=sc2:MoveToBecon", *base])
    with pytest.raises(ConfigError, match="race:difficulty"):
        load_config(None, ["env.name=sc2:Simple64", "env.kwargs={bot: terran}", *base])
    with pytest.raises(ConfigError, match="did you mean 'screen_size'"):
        load_config(None, ["env.name=sc2:Simple64", "env.kwargs={screensize: 16}", *base])
    with pytest.raises(ConfigError, match="need agent.torso=fullyconv"):
        load_config(None, [f"env.name={NAME}", "league.bots=[]"])
    with pytest.raises(ConfigError, match="actor.epsilon"):
        load_config(None, [f"env.name={NAME}", "actor.epsilon=0.1", *base])
    game = sc2_game("sc2:Simple64", {"bot": "zerg:hard"})
    assert game.agents == ("player_0",) and game.bot == ("zerg", "hard")
    assert env_spec("sc2:Simple64").seats == ("player_0", "player_1")
    monkeypatch.setenv("SC2PATH", str(tmp_path))
    with pytest.raises(SC2NotInstalledError, match="SC2PATH=.*env.kwargs.mock=true"):
        check_game_installed("sc2:Simple64")
    check_game_installed("sc2:Simple64", {"mock": True})
