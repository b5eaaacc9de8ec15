"""FullyConv on SC2 observations, and the sc2:<map> env adapter over pysc2's mock env."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import envs.sc2_wrappers  # noqa: F401  (imports pysc2 through the shim)
from agents.fullyconv import FullyConv
from agents.network import MASKED_LOGIT
from config import ConfigError, EnvConfig, load_config
from envs.sc2_wrappers.env import SC2Adapter, check_game_installed, sc2_game
from envs.sc2_wrappers.observation import AVAILABLE_ACTIONS

ENV = EnvConfig(name="sc2:MoveToBeacon", screen_size=8, minimap_size=8, mock=True)


def _batch(observations: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.stack([o[k] for o in observations])) for k in observations[0]}


def test_fullyconv_heads_come_from_the_shared_state_as_in_the_paper():
    torch.manual_seed(0)
    cfg = load_config(None, ["env.name=sc2:MoveToBeacon", "env.mock=true", "env.screen_size=8",
                             "env.minimap_size=8", "agent.torso=fullyconv", "league.bots=[]", "agent.hidden=16"])
    game = sc2_game(cfg.env)
    model = FullyConv(game.obs, game.codec, cfg.agent)
    env = SC2Adapter(cfg.env, seed=0)
    obs = _batch(env.observations * 2)
    obs["screen"][1, 6, 2, 3] = 48  # unit_type of one pixel of the second observation
    logits, baseline = model(obs)
    assert [tuple(lg.shape) for lg in logits] == [(2, h.size) for h in game.codec.heads]
    assert baseline.shape == (2,)
    unavailable = obs[AVAILABLE_ACTIONS] == 0
    assert (logits[0][unavailable] == MASKED_LOGIT).all() and (logits[0][~unavailable] > -1e3).all()
    # Rebuild the state by hand: screen tower, minimap tower, player broadcast (32 + 32 + 11 channels).
    screen = model.screen_tower(model.screen_features(obs["screen"]))
    minimap = model.minimap_tower(model.minimap_features(obs["minimap"]))
    state = torch.cat([screen, minimap, obs["player"][:, :, None, None].expand(-1, -1, 8, 8)], 1)
    w, b = model.spatial_policy.weight[:, :, 0, 0], model.spatial_policy.bias
    by_hand = torch.einsum("kc,nchw->nkhw", w, state) + b[None, :, None, None]
    for k, head in enumerate(["screen", "minimap", "screen2"]):
        column = [h.name for h in game.codec.heads].index(head)
        assert torch.allclose(logits[column], by_hand[:, k].flatten(1), atol=1e-5)
    assert torch.allclose(baseline, model.baseline(model.fc(state.flatten(1))).squeeze(-1), atol=1e-5)
    assert not torch.equal(logits[1][0], logits[1][1])  # the changed pixel moves the screen head


def test_adapter_steps_sampled_actions_and_concatenates_episodes():
    env = SC2Adapter(ENV, seed=0)
    codec = env.game.codec
    generator = torch.Generator().manual_seed(0)
    dones = []
    for _ in range(22):
        mask = torch.as_tensor(env.observations[0][AVAILABLE_ACTIONS])[None]
        logits = [torch.zeros(1, h.size) for h in codec.heads]
        logits[0] = logits[0].masked_fill(mask == 0, MASKED_LOGIT)
        action = codec.sample(logits, generator)[0].numpy()
        rewards, done = env.step([action])
        assert rewards == [0.0]
        dones.append(done)
    # pysc2's mock ends an episode after 10 steps; the adapter resets and goes on.
    assert [i for i, d in enumerate(dones) if d] == [9, 19]


def test_sc2_config_errors_name_the_fix(tmp_path, monkeypatch):
    base = ["env.mock=true", "agent.torso=fullyconv", "league.bots=[]"]
    with pytest.raises(ConfigError, match="did you mean 'sc2:MoveToBeacon'"):
        load_config(None, ["env.name=sc2:MoveToBecon", *base])
    with pytest.raises(ConfigError, match="race:difficulty"):
        load_config(None, ["env.name=sc2:Simple64", "env.bot=terran", *base])
    with pytest.raises(ConfigError, match="need agent.torso=fullyconv"):
        load_config(None, ["env.name=sc2:MoveToBeacon", "env.mock=true", "league.bots=[]"])
    game = sc2_game(EnvConfig(name="sc2:Simple64", bot="zerg:hard"))
    assert game.agents == ("player_0",) and game.bot == ("zerg", "hard")
    assert sc2_game(EnvConfig(name="sc2:Simple64")).agents == ("player_0", "player_1")
    monkeypatch.setenv("SC2PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="SC2PATH=.*env.mock=true"):
        check_game_installed(EnvConfig(name="sc2:Simple64"))
    check_game_installed(EnvConfig(name="sc2:Simple64", mock=True))
