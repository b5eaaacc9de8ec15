"""The learner's update: loss values against a hand computation, finiteness, mirror augmentation,
the learning-rate schedule."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from impala_league.agents.core import dead_units
from impala_league.agents.network import MASKED_LOGIT, ActorCritic, mask_logits
from impala_league.config import AgentConfig, Config, LearnerConfig, RunConfig
from impala_league.distributed.learner import Batch, learn_step, make_optimizer, scheduled_learning_rate
from impala_league.distributed.metrics import DEAD_UNITS_WARNING, LearnerMetrics
from impala_league.envs.registry import env_spec


class TableModel(nn.Module):
    """A 'network' whose outputs are free parameters per time step: logits [T+1, A], values [T+1]."""

    def __init__(self, logits: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.logits = nn.Parameter(logits.clone())
        self.values = nn.Parameter(values.clone())
        self.index = nn.Identity()  # its "torso": the time index, as it is

    def feature_layer(self) -> nn.Module:
        return self.index

    def forward(self, obs, action_mask):  # obs [(T+1) * B, 1] holds the time index
        t = self.index(obs)[:, 0].long()
        return mask_logits(self.logits[t], action_mask), self.values[t]


def make_batch(T: int, A: int, actions, rewards, dones, behaviour_logits, masks=None) -> Batch:
    B = 1
    obs = torch.arange(T + 1).view(T + 1, 1, 1).float()
    mask = torch.ones(T + 1, B, A, dtype=torch.uint8) if masks is None else masks
    return Batch(obs=obs, action_mask=mask, action=torch.tensor(actions).view(T, B),
                 reward=torch.tensor(rewards, dtype=torch.float32).view(T, B),
                 done=torch.tensor(dones).view(T, B).bool(),
                 behaviour_logits=torch.as_tensor(behaviour_logits, dtype=torch.float32).view(T, B, A))


def test_losses_match_a_hand_computation_on_policy():
    # T=2, two actions, on-policy (mu = pi), so rho = 1 and vs are the n-step returns.
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0], [0.0, 0.0]])  # pi(a=1|x0) = 0.75
    values = torch.tensor([0.5, -0.2, 0.4])
    model = TableModel(logits, values)
    batch = make_batch(2, 2, actions=[1, 0], rewards=[0.0, 1.0], dones=[0, 0], behaviour_logits=logits[:2])
    cfg = LearnerConfig(discount=0.9, entropy_cost=0.01, baseline_cost=0.5, grad_norm_clip=1e9)
    stats = learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg)
    # vs_1 = r_1 + g V(x_2) = 1 + 0.9 * 0.4 = 1.36; vs_0 = r_0 + g vs_1 = 1.224.
    vs = np.array([1.224, 1.36])
    v = np.array([0.5, -0.2])
    # pg advantage_t = r_t + g vs_{t+1} - V(x_t): [0 + 0.9 * 1.36 - 0.5, 1 + 0.9 * 0.4 + 0.2] = [0.724, 1.56]
    adv = np.array([0.724, 1.56])
    logp = np.log([0.75, 0.75])
    expected_pg = -(logp * adv).mean()
    expected_baseline = 0.5 * ((vs - v) ** 2).mean()
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert math.isclose(stats["policy_gradient_loss"], expected_pg, rel_tol=1e-5)
    assert math.isclose(stats["baseline_loss"], expected_baseline, rel_tol=1e-5)
    assert math.isclose(stats["entropy"], h, rel_tol=1e-5)
    assert math.isclose(stats["loss"], expected_pg + 0.5 * expected_baseline - 0.01 * h, rel_tol=1e-5)
    assert math.isclose(stats["mean_rho"], 1.0, rel_tol=1e-6)


def test_extreme_log_ratio_and_masked_actions_give_finite_loss_and_gradients():
    spec = env_spec("connect_four")
    T, B, A = 5, 3, spec.num_actions
    torch.manual_seed(0)
    model = ActorCritic(spec.obs_shape, A, AgentConfig(torso="conv", channels=8, hidden=16))
    mask = torch.ones(T + 1, B, A, dtype=torch.uint8)
    mask[..., 3:] = 0  # four of seven columns illegal everywhere
    action = torch.zeros(T, B, dtype=torch.int64)
    behaviour = torch.full((T, B, A), MASKED_LOGIT)
    behaviour[..., 0] = -99.0  # log mu(a=0) ~ -99 below pi's: log-ratio ~ 99
    behaviour[..., 1] = 0.0
    batch = Batch(obs=torch.randint(0, 2, (T + 1, B, *spec.obs_shape), dtype=torch.int8), action_mask=mask,
                  action=action, reward=torch.ones(T, B), done=torch.zeros(T, B, dtype=torch.bool),
                  behaviour_logits=behaviour)
    cfg = LearnerConfig()
    stats = learn_step(model, make_optimizer(model, cfg), batch, cfg)
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert stats["rho_clipped_fraction"] == 1.0
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # The clipped rho (1.0) is what the update used, not e^99.
    model.zero_grad()
    logits, _ = model(batch.obs.flatten(0, 1), mask.flatten(0, 1))
    assert torch.isfinite(torch.log_softmax(logits, -1)).all()


def test_mirror_reflects_boards_actions_and_masks_consistently():
    spec = env_spec("connect_four")
    T, B, A = 3, 2, 7
    g = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 2, (T + 1, B, 6, 7, 2), generator=g, dtype=torch.int8)
    mask = torch.randint(0, 2, (T + 1, B, A), generator=g, dtype=torch.uint8)
    mask[..., 2] = 1
    action = torch.full((T, B), 2, dtype=torch.int64)
    logits = torch.randn(T, B, A, generator=g)
    batch = Batch(obs, mask, action, torch.randn(T, B), torch.zeros(T, B, dtype=torch.bool), logits)
    m = batch.with_mirror(spec)
    assert m.obs.shape[1] == 2 * B
    torch.testing.assert_close(m.obs[:, B:, :, 0], obs[:, :, :, 6])  # column 0 of the mirror = column 6
    assert (m.action[:, B:] == 4).all()  # column 2 -> column 4
    torch.testing.assert_close(m.action_mask[:, B:, 4], mask[..., 2])
    torch.testing.assert_close(m.behaviour_logits[:, B:, 0], logits[..., 6])
    torch.testing.assert_close(m.reward[:, B:], batch.reward)


def test_random_mirror_reflects_the_chosen_unrolls_and_keeps_their_final_observations():
    """flip [F, T, F]: unrolls 0 and 2 stay, unroll 1 is reflected; each truncated step keeps the final
    observation of its own unroll, reflected with it; the batch stays B unrolls wide."""
    spec = env_spec("connect_four")
    T, B, A = 3, 3, 7
    g = torch.Generator().manual_seed(2)
    obs = torch.randint(0, 2, (T + 1, B, 6, 7, 2), generator=g, dtype=torch.int8)
    mask = torch.randint(0, 2, (T + 1, B, A), generator=g, dtype=torch.uint8)
    action = torch.randint(0, A, (T, B), generator=g)
    logits = torch.randn(T, B, A, generator=g)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    truncated[2, 1] = truncated[0, 2] = True
    final_obs = torch.randint(0, 2, (2, 6, 7, 2), generator=g, dtype=torch.int8)
    batch = Batch(obs, mask, action, torch.randn(T, B), truncated.clone(), logits, truncated=truncated,
                  final_obs=final_obs, final_t=torch.tensor([2, 0]), final_b=torch.tensor([1, 2]))
    m = batch.with_random_mirror(spec, torch.tensor([False, True, False]))
    assert m.obs.shape == obs.shape and m.action.shape == (T, B)
    for b in (0, 2):
        torch.testing.assert_close(m.obs[:, b], obs[:, b])
        torch.testing.assert_close(m.action[:, b], action[:, b])
    torch.testing.assert_close(m.obs[:, 1], obs[:, 1].flip(2))
    assert m.action[:, 1].tolist() == [6 - a for a in action[:, 1].tolist()]
    torch.testing.assert_close(m.action_mask[:, 1], mask[:, 1].flip(-1))
    torch.testing.assert_close(m.behaviour_logits[:, 1], logits[:, 1].flip(-1))
    final = {(int(t), int(b)): o for t, b, o in zip(m.final_t, m.final_b, m.final_obs)}
    assert set(final) == {(2, 1), (0, 2)}
    torch.testing.assert_close(final[(2, 1)], final_obs[0].flip(1))  # reflected with unroll 1
    torch.testing.assert_close(final[(0, 2)], final_obs[1])
    assert m.truncated.tolist() == truncated.tolist()


def test_tictactoe_mirror_maps_actions_like_the_board():
    spec = env_spec("tictactoe")
    # Cell (row 0, col 0) = action 0 reflects to (row 0, col 2) = action 2; centre column stays.
    assert spec.mirror_actions[0] == 2 and spec.mirror_actions[4] == 4 and spec.mirror_actions[5] == 3
    assert sorted(spec.mirror_actions) == list(range(9))


def test_reward_on_the_last_step_survives_batch_assembly():
    """T=4, rewards [0, 0, 0, 1], the episode ends at t=3: vs = pg_advantages = [0.970299, 0.9801, 0.99, 1]."""
    from impala_league.distributed import vtrace
    from impala_league.distributed.actor import UnrollBuffer
    from impala_league.distributed.wire.codec import UnrollSpec

    spec = env_spec("tictactoe")
    buffers = [UnrollBuffer(UnrollSpec(spec, 4)) for _ in range(2)]
    unrolls = []
    for buf in buffers:
        for t in range(5):
            got = buf.observe(np.zeros((3, 3, 2), np.int8), np.ones(9, np.uint8))
            if got is not None:
                unrolls.append(got)
                break
            buf.record_action(t, np.zeros(9, np.float32))
            buf.settle(1.0 if t == 3 else 0.0, t == 3)
    batch = Batch.stack(unrolls, torch.device("cpu"))
    assert batch.reward.shape == (4, 2) and batch.reward[-1].tolist() == [1.0, 1.0]
    discounts = (~batch.done).float() * 0.99
    zeros = torch.zeros(4, 2)
    out = vtrace.from_logits(batch.behaviour_logits, batch.behaviour_logits, batch.action, discounts, batch.reward,
                             zeros, torch.zeros(2))
    expected = torch.tensor([0.970299, 0.9801, 0.99, 1.0]).unsqueeze(1).expand(4, 2)
    torch.testing.assert_close(out.vs, expected)
    torch.testing.assert_close(out.pg_advantages, expected)


def test_a_batch_whose_loss_overflows_skips_the_update_instead_of_poisoning_the_weights():
    """Rewards near float32's max pass the decoder (they are finite) but overflow in V-trace: the
    update used to write nan into every weight, after which every unroll was dead-lettered."""
    spec = env_spec("tictactoe")
    T, B, A = 4, 2, spec.num_actions
    torch.manual_seed(0)
    model = ActorCritic(spec.obs_shape, A, AgentConfig(torso="mlp", hidden=16))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reward = torch.tensor([3e38, 3e38, -3e38, 3e38]).view(T, 1).expand(T, B).contiguous()
    batch = Batch(obs=torch.zeros(T + 1, B, *spec.obs_shape, dtype=torch.int8),
                  action_mask=torch.ones(T + 1, B, A, dtype=torch.uint8), action=torch.zeros(T, B, dtype=torch.int64),
                  reward=reward, done=torch.zeros(T, B, dtype=torch.bool), behaviour_logits=torch.zeros(T, B, A))
    cfg = LearnerConfig()
    optimizer = make_optimizer(model, cfg)
    stats = learn_step(model, optimizer, batch, cfg)
    assert stats["skipped_update"] == 1.0
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])
    ok = Batch(batch.obs, batch.action_mask, batch.action, torch.ones(T, B), batch.done, batch.behaviour_logits)
    assert learn_step(model, optimizer, ok, cfg)["skipped_update"] == 0.0
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_linear_schedule_anneals_to_zero_over_whichever_budget_ends_first():
    cfg = Config(run=RunConfig(total_agent_steps=1_000_000, max_minutes=10.0),
                 learner=LearnerConfig(learning_rate=4e-4, lr_schedule="linear"))
    # frames 25% through, time 10% through (60 of 600 s): 4e-4 * 0.75
    assert scheduled_learning_rate(cfg, 250_000, 60.0) == pytest.approx(3e-4)
    # time 50% through (300 s), frames 10%: 4e-4 * 0.5
    assert scheduled_learning_rate(cfg, 100_000, 300.0) == pytest.approx(2e-4)
    assert scheduled_learning_rate(cfg, 0, 700.0) == 0.0  # past the budget: never negative
    cfg.run.max_minutes = 0.0  # no time limit: frames alone
    assert scheduled_learning_rate(cfg, 100_000, 1e6) == pytest.approx(3.6e-4)
    cfg.learner.lr_schedule = "constant"
    assert scheduled_learning_rate(cfg, 900_000, 1e6) == 4e-4


def test_dead_units_are_the_units_off_on_every_row():
    features = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0, 0.0]])
    assert float(dead_units(features)) == 0.5  # units 0 and 3 are 0 on all three rows; 1 and 2 are on somewhere


def test_learn_step_reports_the_torsos_dead_units():
    spec = env_spec("connect_four")
    T, B, A = 4, 2, spec.num_actions
    torch.manual_seed(0)
    model = ActorCritic(spec.obs_shape, A, AgentConfig(torso="conv", channels=8, hidden=16))
    batch = Batch(obs=torch.randint(0, 2, (T + 1, B, *spec.obs_shape), dtype=torch.int8),
                  action_mask=torch.ones(T + 1, B, A, dtype=torch.uint8), action=torch.zeros(T, B, dtype=torch.int64),
                  reward=torch.ones(T, B), done=torch.zeros(T, B, dtype=torch.bool), behaviour_logits=torch.zeros(T, B, A))
    cfg = LearnerConfig()
    with torch.no_grad():
        expected = float(dead_units(model.feature_layer()(model.conv(batch.obs.flatten(0, 1).float().permute(0, 3, 1, 2)).flatten(1))))
    stats = learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg)
    assert stats["dead_units"] == expected < 1.0
    with torch.no_grad():
        model.fc[0].bias.fill_(-1e3)  # every unit's ReLU off on every input
    assert learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg)["dead_units"] == 1.0


def test_dead_units_warn_once_above_the_threshold(caplog):
    metrics = SimpleNamespace(warned_dead_units=False)
    with caplog.at_level(logging.WARNING, logger="learner"):
        LearnerMetrics.warn_dead_units(metrics, {"dead_units": DEAD_UNITS_WARNING})  # not above: quiet
        assert not caplog.records
        LearnerMetrics.warn_dead_units(metrics, {"dead_units": 0.99})
        LearnerMetrics.warn_dead_units(metrics, {"dead_units": 0.99})
    assert len(caplog.records) == 1 and "99% of the torso's output units" in caplog.text
    assert "learner.learning_rate" in caplog.text and "learner.adam_eps" in caplog.text
    assert "learner.redo_every" in caplog.text


def test_the_optimizers_take_their_epsilon_from_the_config():
    model = nn.Linear(2, 1)
    assert make_optimizer(model, LearnerConfig(adam_eps=1e-5)).param_groups[0]["eps"] == 1e-5
    assert make_optimizer(model, LearnerConfig(optimizer="rmsprop", rmsprop_eps=0.01)).param_groups[0]["eps"] == 0.01
