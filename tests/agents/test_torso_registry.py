"""A torso of one's own: one class and one `register_torso` line, named by the config, trained through
ActorCritic; or registered by a module that `agent.torso=<module>:<name>` imports."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from impala_league.agents.network import ActorCritic
from impala_league.agents.torsos import TORSOS, Torso, register_torso, torso_class
from impala_league.config import ConfigError, load_config


@register_torso("test_sum_of_cells")
class SumOfCells(Torso):
    """obs [N, *obs_shape] -> features [N, hidden]: one linear layer and a ReLU over the flattened board."""

    def __init__(self, obs_shape, cfg, image=False):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(math.prod(obs_shape), cfg.hidden), nn.ReLU())
        self.out_features = cfg.hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(obs.flatten(1).float())


def test_a_registered_torso_is_named_by_the_config_and_trains_through_actor_critic():
    cfg = load_config(None, ["env.name=tictactoe", "agent.torso=test_sum_of_cells", "agent.hidden=16"])
    torch.manual_seed(0)
    model = ActorCritic((3, 3, 2), 9, cfg.agent)
    assert type(model.torso) is SumOfCells
    obs, mask = torch.randint(0, 2, (4, 3, 3, 2)).float(), torch.ones(4, 9)
    before = model.torso.fc[0].weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = model(obs, mask)
    logits, baseline = out[0], out[1]
    assert logits.shape == (4, 9) and baseline.shape == (4,)
    (baseline - 1.0).pow(2).mean().backward()  # one step towards a value of 1
    optimizer.step()
    assert not torch.equal(before, model.torso.fc[0].weight)
    assert (model(obs, mask)[1] - 1.0).pow(2).mean() < (baseline.detach() - 1.0).pow(2).mean()


def test_the_registry_refuses_a_taken_name_and_the_config_an_unknown_torso():
    with pytest.raises(ValueError, match="taken or reserved"):
        register_torso("mlp")(SumOfCells)
    with pytest.raises(TypeError, match="not a subclass"):
        register_torso("test_not_a_torso")(nn.Linear)
    with pytest.raises(ConfigError, match=r"agent.torso must be conv, mlp, .*test_sum_of_cells or <module>:<name>"):
        load_config(None, ["agent.torso=tiny"])


def test_a_module_torso_is_imported_by_name(tmp_path, monkeypatch):
    (tmp_path / "my_torsos_for_test.py").write_text(
        "from torch import nn\nfrom impala_league.agents.torsos import register_torso\n"
        "from tests.agents.test_torso_registry import SumOfCells\n\n\n"
        "@register_torso('test_module_torso')\nclass ModuleTorso(SumOfCells):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["env.name=tictactoe", "agent.torso=my_torsos_for_test:test_module_torso"])
    assert "test_module_torso" not in TORSOS  # nothing imported it yet
    model = ActorCritic((3, 3, 2), 9, cfg.agent)
    assert type(model.torso).__name__ == "ModuleTorso"
    with pytest.raises(ConfigError, match="registers no torso 'nope'"):
        torso_class("my_torsos_for_test:nope")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_here'"):
        torso_class("no_such_module_here:x")
