"""The network as torso -> core -> heads (agents.core.Network): one table of torsos, the identity core in
place of "no core", and the checkpoints of the layout before (ActorCritic's and FullyConv's attributes as
state-dict names) loading into it with the same outputs."""

from __future__ import annotations

import json

import pytest
import torch

from impala_league.agents.checkpoint import model_state, read_checkpoint, save_model_only
from impala_league.agents.core import CoreInput, IdentityCore, LSTMCore
from impala_league.agents.model import make_model
from impala_league.agents.network import ActorCritic
from impala_league.agents.torsos import TORSOS, Torso
from impala_league.config import TORSOS as CONFIG_TORSOS
from impala_league.config import AgentConfig, load_config, to_yaml
from impala_league.envs.registry import env_spec
from tests.agents.sc2_mock import mock_sc2_config


def wb(old: str, new: str) -> list[tuple[str, str]]:
    """(old name, new name) of a layer's weight and bias."""
    return [(f"{old}.weight", f"{new}.weight"), (f"{old}.bias", f"{new}.bias")]


# The state-dict names of the layout before, in its order (each list as ActorCritic / FullyConv wrote it),
# beside the name each has now. The order is the parameters' order: the optimizer's `optim.<index>`.
LSTM = [(f"core.lstm.{n}", f"core.lstm.{n}") for n in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")]
HEADS = wb("policy", "heads.policy") + wb("baseline", "heads.baseline")
OLD_MLP_LSTM = wb("fc.0", "torso.fc.0") + wb("fc.2", "torso.fc.2") + LSTM + HEADS
OLD_CONV = wb("conv.0", "torso.conv.0") + wb("conv.2", "torso.conv.2") + wb("fc.0", "torso.fc.0") + HEADS
OLD_SHALLOW = (wb("pixels.trunk.0", "torso.trunk.0") + wb("pixels.trunk.2", "torso.trunk.2")
               + wb("pixels.fc.0", "torso.fc.0") + HEADS)
OLD_RESNET_LSTM = [pair for stack in (0, 4) for pair in (
    wb(f"pixels.trunk.{stack}", f"torso.trunk.{stack}")
    + [p for block in (stack + 2, stack + 3) for conv in ("conv0", "conv1")
       for p in wb(f"pixels.trunk.{block}.{conv}", f"torso.trunk.{block}.{conv}")])
] + wb("pixels.fc.0", "torso.fc.0") + LSTM + HEADS


def old_fullyconv(core: bool) -> list[tuple[str, str]]:
    """FullyConv's names before (8x8 screen and minimap, sc2_embed_dim 8: six embedded layers)."""
    embeddings = [(f"{side}_features.embeddings.{i}.weight", f"torso.{side}_features.embeddings.{i}.weight")
                  for side, layers in (("screen", (4, 6, 16, 20)), ("minimap", (4, 7))) for i in layers]
    towers = [p for side in ("screen", "minimap") for i in (0, 2)
              for p in wb(f"{side}_tower.{i}", f"torso.{side}_tower.{i}")]
    dense = [p for k in range(11) for p in wb(f"head_layers.{k}", f"heads.dense.{k}")]
    return (embeddings + towers + wb("spatial_policy", "torso.spatial_policy") + wb("fc.0", "torso.fc.0")
            + (LSTM if core else []) + dense + wb("baseline", "heads.baseline"))


def test_every_torso_of_the_config_has_a_class_with_one_interface():
    assert set(TORSOS) | {"fullyconv"} == set(CONFIG_TORSOS)  # fullyconv: agents/fullyconv.py's network
    shapes = {"mlp": (3, 3, 2), "conv": (3, 3, 2), "shallow": (2, 24, 24), "resnet": (2, 24, 24)}
    cfg = AgentConfig(hidden=8, channels=4, resnet_channels=(4,))
    for name in shapes:  # (a test's own torsos may be registered too: tests/agents/test_torso_registry.py)
        torso = TORSOS[name].from_config(shapes[name], cfg, image=False)
        assert isinstance(torso, Torso) and torso.out_features == 8
        features, extra = torso.encode(torch.randint(0, 3, (5, *shapes[name])).to(torch.uint8))
        assert features.shape == (5, 8) and extra is None and (features >= 0).all()  # ReLU units
        assert torso.feature_layer() is torso.fc and torso.recyclable_layers()[-1].layer is torso.fc[-2]  # Linear, ReLU


def test_no_core_is_the_identity_core_and_the_pass_has_one_path():
    torch.manual_seed(0)
    obs, mask = torch.randint(0, 2, (4, 3, 3, 2)).float(), torch.ones(4, 9)
    mask[0, 3] = 0
    model = ActorCritic((3, 3, 2), 9, AgentConfig(torso="mlp", hidden=8))
    assert isinstance(model.core, IdentityCore) and not model.core.recurrent and model.core.core_size == 0
    logits, values = model(obs, mask)
    step_logits, step_values, state = model.step(obs, mask, None)
    assert state is None and torch.equal(logits, step_logits) and torch.equal(values, step_values)
    features, _ = model.encode(obs)  # the heads read the torso's features as they are
    torch.testing.assert_close(values, model.heads.baseline(features).squeeze(-1))
    assert logits[0, 3] == -1e9
    assert model.feature_readers() == [model.heads.policy.weight, model.heads.baseline.weight]
    recurrent = ActorCritic((3, 3, 2), 9, AgentConfig(torso="mlp", hidden=8, core="lstm", core_size=4))
    assert isinstance(recurrent.core, LSTMCore) and recurrent.feature_readers() == [recurrent.core.lstm.weight_ih_l0]
    with pytest.raises(TypeError, match="acts through step"):
        recurrent(obs, mask)


def _outputs(model, obs, mask) -> list[torch.Tensor]:
    """The model's logits, values and (with a core) state after one step from a fixed CoreInput."""
    core = None
    if model.core.recurrent:
        g = torch.Generator().manual_seed(1)
        core = CoreInput(torch.randn(len(mask), 2, model.core.core_size, generator=g),
                         torch.arange(len(mask)) - 1, torch.linspace(-2, 2, len(mask)))
    with torch.no_grad():
        return [t for t in model.step(obs, mask, core) if t is not None]


BOARD_CASES = {  # name: (old names, config overrides, env)
    "mlp_lstm": (OLD_MLP_LSTM, ["env.name=tictactoe", "agent.torso=mlp", "agent.hidden=8", "agent.core=lstm",
                                "agent.core_size=6", "learner.mirror_augment=none"]),
    "conv": (OLD_CONV, ["env.name=connect_four", "agent.torso=conv", "agent.hidden=8", "agent.channels=4",
                        "agent.landing_plane=true", "agent.threat_planes=true"]),
}


@pytest.mark.parametrize("case", sorted(BOARD_CASES))
def test_a_checkpoint_with_the_old_names_plays_as_it_did(case, tmp_path):
    from impala_league.agents.policy import load_policy

    pairs, overrides = BOARD_CASES[case]
    cfg = load_config(None, overrides)
    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    torch.manual_seed(0)
    trained = make_model(spec, cfg.agent)
    assert list(trained.state_dict()) == [new for _, new in pairs]  # same parameters, same order
    old = {f"model.{o}": trained.state_dict()[new] for o, new in pairs}  # as the checkpoint held them
    path = tmp_path / "old.safetensors"
    save_model_only(path, old, {"config": to_yaml(cfg), "meta": json.dumps({"step": 7})})
    assert set(model_state(read_checkpoint(path)[0])) == {o for o, _ in pairs}
    obs = torch.randint(0, 2, (3, *spec.obs_shape)).to(torch.float32)
    mask = torch.ones(3, spec.num_actions, dtype=torch.uint8)
    mask[1, 0] = 0
    loaded = load_policy(path).model
    assert type(loaded) is type(trained)
    for got, want in zip(_outputs(loaded, obs, mask), _outputs(trained, obs, mask), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("torso, core, pairs", [("shallow", "none", OLD_SHALLOW), ("resnet", "lstm", OLD_RESNET_LSTM)])
def test_pixel_torsos_load_their_old_names(torso, core, pairs):
    cfg = AgentConfig(torso=torso, hidden=8, resnet_channels=(4, 4), core=core, core_size=6)
    torch.manual_seed(0)
    trained = ActorCritic((2, 24, 24), 3, cfg, image=True)
    assert list(trained.state_dict()) == [new for _, new in pairs]
    fresh = ActorCritic((2, 24, 24), 3, cfg, image=True)
    fresh.load_state_dict({o: trained.state_dict()[new] for o, new in pairs})
    frames = torch.randint(0, 256, (3, 2, 24, 24), dtype=torch.uint8)
    for got, want in zip(_outputs(fresh, frames, torch.ones(3, 3)), _outputs(trained, frames, torch.ones(3, 3))):
        assert torch.equal(got, want)


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_fullyconv_loads_its_old_names(core):
    cfg = mock_sc2_config(core)
    from impala_league.envs.registry import make_env

    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    torch.manual_seed(0)
    trained, fresh = make_model(spec, cfg.agent), make_model(spec, cfg.agent)
    pairs = old_fullyconv(core == "lstm")
    assert list(trained.state_dict()) == [new for _, new in pairs]
    fresh.load_state_dict({o: trained.state_dict()[new] for o, new in pairs})
    step = make_env(cfg.env.name, 0, cfg.env.kwargs).advance()
    obs = {k: torch.as_tensor(v)[None].expand(2, *v.shape).clone() for k, v in step.observations[0].items()}
    mask = torch.as_tensor(step.action_masks[0])[None].expand(2, -1)
    for got, want in zip(_outputs(fresh, obs, mask), _outputs(trained, obs, mask)):
        assert torch.equal(got, want)
