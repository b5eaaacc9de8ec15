"""ReDo (agents/redo.py): dormant units are found by their score, re-initialized with zero outgoing weights
and zero optimizer state, and the network computes the same function afterwards."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest
import torch

from impala_league.agents.network import ActorCritic
from impala_league.agents.redo import recycle_dormant_units, unit_scores
from impala_league.config import AgentConfig, ConfigError, load_config
from impala_league.distributed.learner.data_parallel import Group
from impala_league.distributed.learner.role import Learner


def frames(n: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (n, 4, 52, 52), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))


def shallow(**kwargs) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic((4, 52, 52), 5, AgentConfig(torso="shallow", hidden=16, **kwargs))


def adam_with_state(model: ActorCritic, x: torch.Tensor) -> torch.optim.Adam:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    logits, values = model(x, torch.ones(len(x), 5))
    (logits.sum() + values.sum()).backward()
    optimizer.step()
    return optimizer


def test_scores_are_each_units_mean_over_the_layers_mean():
    model, x = shallow(), frames()
    fc = model.torso.fc[0]
    with torch.no_grad():
        fc.bias[:4] = -1e3  # four units 0 on every frame
    scores = unit_scores(model, x)
    assert [len(s) for s in scores] == [16, 32, 16]  # conv1 channels, conv2 channels, FC units
    h = model.torso(x)
    torch.testing.assert_close(scores[2], h.mean(0) / h.mean())
    assert (scores[2][:4] == 0).all() and (scores[2][4:] > 0).all()


def test_dead_fc_units_are_recycled_and_the_function_kept():
    model, x = shallow(), frames()
    fc = model.torso.fc[0]
    with torch.no_grad():
        fc.bias[:4] = -1e3
    optimizer = adam_with_state(model, x)
    with torch.no_grad():
        fc.bias[:4] = -1e3  # still dead after the step
    mask = torch.ones(len(x), 5)
    before = [t.detach().clone() for t in model(x, mask)]
    alive = unit_scores(model, x)[2] > 0
    kept_rows = fc.weight[alive].detach().clone()
    assert (model.torso(x)[:, :4] == 0).all()
    dormant = sum(int((s <= 0).sum()) for s in unit_scores(model, x))  # the 4, and any conv channel off here

    recycled, units = recycle_dormant_units(model, optimizer, x, threshold=0.0, seed=3)

    assert (recycled, units) == (dormant, 16 + 32 + 16) and dormant >= 4
    assert (fc.bias[:4] == 0).all()  # the torso's init: orthogonal weights, zero biases
    assert (fc.weight[:4].norm(dim=1) > 0).all()
    same = fc.weight[alive] == kept_rows  # or zeroed: the columns of a recycled conv2 channel
    assert (same | (fc.weight[alive] == 0)).all() and same.float().mean() > 0.8
    for head in (model.heads.policy, model.heads.baseline):  # the features' readers: outgoing weights 0
        assert (head.weight[:, :4] == 0).all() and (head.weight[:, 4:] != 0).any()
        for moment in optimizer.state[head.weight].values():
            if moment.dim() == 2:
                assert (moment[:, :4] == 0).all()
    for moment in ("exp_avg", "exp_avg_sq"):
        assert (optimizer.state[fc.weight][moment][:4] == 0).all()
        assert (optimizer.state[fc.weight][moment][4:] != 0).any()
    for old, new in zip(before, model(x, mask)):
        torch.testing.assert_close(new, old)
    assert (model.torso(x)[:, :4] > 0).any()  # fresh units see the frames again


def test_a_dead_conv_channel_is_recycled_with_the_next_convs_input_zeroed():
    model, x = shallow(), frames()
    conv1, conv2 = model.torso.trunk[0], model.torso.trunk[2]
    with torch.no_grad():
        conv1.bias[3] = -1e3
    mask = torch.ones(len(x), 5)
    before = [t.detach().clone() for t in model(x, mask)]
    assert unit_scores(model, x)[0][3] == 0
    recycle_dormant_units(model, None, x, threshold=0.0, seed=3)
    assert conv1.bias[3] == 0
    assert (conv2.weight[:, 3] == 0).all() and (conv2.weight[:, 2] != 0).any()
    for old, new in zip(before, model(x, mask)):
        torch.testing.assert_close(new, old)


def test_a_dead_conv2_channel_zeroes_its_block_of_fc_columns():
    model, x = shallow(), frames()  # conv2's map is 5x5 on 52x52 frames: 25 FC columns a channel
    conv2, fc = model.torso.trunk[2], model.torso.fc[0]
    with torch.no_grad():
        conv2.bias[5] = -1e3
    recycle_dormant_units(model, None, x, threshold=0.0, seed=3)
    assert fc.in_features == 32 * 25
    assert (fc.weight[:, 125:150] == 0).all() and (fc.weight[:, 100:125] != 0).all(0).any()
    assert (fc.weight[:, 150:175] != 0).all(0).any()


def test_threshold_tau_recycles_weak_units_too_and_the_seed_decides_the_draw():
    a, b, x = shallow(), shallow(), frames()
    for model in (a, b):
        with torch.no_grad():
            model.torso.fc[0].weight[7] *= 1e-3  # weak, not dead
    assert 0 < unit_scores(a, x)[2][7] <= 0.01
    c = shallow()
    with torch.no_grad():
        c.torso.fc[0].weight[7] *= 1e-3
    recycle_dormant_units(c, None, x, threshold=0.0, seed=3)
    assert (c.heads.policy.weight[:, 7] != 0).any()  # tau 0: only units that are 0 everywhere
    recycle_dormant_units(a, None, x, threshold=0.01, seed=3)
    assert (a.heads.policy.weight[:, 7] == 0).all()
    recycle_dormant_units(b, None, x, threshold=0.01, seed=3)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb)


@pytest.mark.parametrize("kwargs", [dict(core="lstm", core_size=8)])
def test_with_a_core_the_cores_input_weights_are_the_readers(kwargs):
    model, x = shallow(**kwargs), frames()
    with torch.no_grad():
        model.torso.fc[0].bias[:2] = -1e3
    recycle_dormant_units(model, None, x, threshold=0.0, seed=3)
    w = model.core.lstm.weight_ih_l0
    assert (w[:, :2] == 0).all() and (w[:, 2:16] != 0).any()


def test_mlp_and_conv_torsos_chain_their_layers():
    for cfg, shape in ((AgentConfig(torso="mlp", hidden=8, mlp_layers=2), (5,)),
                       (AgentConfig(torso="conv", channels=4, kernel_size=3, conv_layers=1, hidden=8), (4, 4, 2))):
        model = ActorCritic(shape, 3, cfg)
        first, second = [r.layer for r in model.recyclable_layers()][:2]
        with torch.no_grad():
            first.bias[1] = -1e3
        x = torch.rand(10, *shape)
        before = model(x, torch.ones(10, 3))[0].detach().clone()
        assert recycle_dormant_units(model, None, x, threshold=0.0, seed=0)[0] >= 1
        block = second.weight.shape[1] // first.weight.shape[0]
        assert (second.weight[:, block:2 * block] == 0).all()
        torch.testing.assert_close(model(x, torch.ones(10, 3))[0], before)


def test_the_learner_recycles_over_its_batchs_observations(caplog):
    model = shallow()
    with torch.no_grad():
        model.torso.fc[0].bias[:3] = -1e3
    T, B = 3, 2
    batch = SimpleNamespace(obs=frames((T + 1) * B).view(T + 1, B, 4, 52, 52))
    learner = SimpleNamespace(model=model, optimizer=None, step=1000, group=Group.single(), label="learner",
                              cfg=load_config(None, ["learner.redo_every=1000", "run.seed=5"]))
    with caplog.at_level(logging.INFO, logger="learner"):
        Learner.recycle(learner, batch)
    assert (model.heads.policy.weight[:, :3] == 0).all()
    assert re.search(r"learner update 1000: recycled \d+ of 64 torso units \(ReDo\)", caplog.text)


@pytest.mark.parametrize("overrides, message", [
    (["learner.redo_every=100", "learner.algo=a3c"], r"learner.redo_every > 0 needs learner.algo=impala"),
    (["learner.redo_threshold=2"], r"learner.redo_threshold must be in \[0, 1\]"),
    (["learner.redo_every=-1"], r"learner.redo_every must be >= 0"),
])
def test_bad_redo_settings_are_refused_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
