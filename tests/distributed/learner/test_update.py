"""The learner's update (impala_league/distributed/learner/update.py): loss values against a hand computation,
finiteness, a skipped update, the learning-rate schedule, the optimizers, the torso's dead units, the
bfloat16 forward pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from impala_league.agents.core import dead_units
from impala_league.agents.network import MASKED_LOGIT, ActorCritic, mask_logits
from impala_league.agents.torsos import scale_frames
from impala_league.batch import Batch
from impala_league.config import AgentConfig, Config, LearnerConfig, RunConfig
from impala_league.distributed.learner.update import (autocast_dtype, cpu_has_amx_bf16, learn_step, make_optimizer,
                                                      scheduled_learning_rate, slow_bf16_warning)
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
        expected = float(dead_units(model.feature_layer()(model.torso.conv(batch.obs.flatten(0, 1).float().permute(0, 3, 1, 2)).flatten(1))))
    stats = learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg)
    assert stats["dead_units"] == expected < 1.0
    with torch.no_grad():
        model.torso.fc[0].bias.fill_(-1e3)  # every unit's ReLU off on every input
    assert learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg)["dead_units"] == 1.0


def test_the_optimizers_take_their_epsilon_from_the_config():
    model = nn.Linear(2, 1)
    assert make_optimizer(model, LearnerConfig(adam_eps=1e-5)).param_groups[0]["eps"] == 1e-5
    assert make_optimizer(model, LearnerConfig(optimizer="rmsprop", rmsprop_eps=0.01)).param_groups[0]["eps"] == 0.01


def pixel_batch(T: int, B: int, A: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(obs=torch.randint(0, 256, (T + 1, B, 4, 84, 84), dtype=torch.uint8, generator=g),
                 action_mask=torch.ones(T + 1, B, A, dtype=torch.uint8), action=torch.randint(0, A, (T, B), generator=g),
                 reward=torch.randn(T, B, generator=g), done=torch.zeros(T, B, dtype=torch.bool),
                 behaviour_logits=torch.randn(T, B, A, generator=g))


def test_precision_auto_is_bfloat16_only_for_pixel_torsos_on_an_amx_cpu():
    cpu = torch.device("cpu")
    board = ActorCritic(env_spec("connect_four").obs_shape, 7, AgentConfig(torso="conv", channels=8, hidden=16))
    pixels = ActorCritic((4, 84, 84), 6, AgentConfig(torso="shallow"))
    assert autocast_dtype("fp32", cpu, pixels) is None
    assert autocast_dtype("bf16", cpu, board) is torch.bfloat16
    assert autocast_dtype("auto", cpu, board) is None
    assert autocast_dtype("auto", cpu, pixels) is (torch.bfloat16 if cpu_has_amx_bf16() else None)
    assert autocast_dtype("auto", torch.device("cuda"), pixels) is None


def test_bf16_on_a_cpu_without_bfloat16_kernels_is_warned_of_and_nothing_else_is():
    cpu, native = torch.device("cpu"), torch.ops.mkldnn._is_mkldnn_bf16_supported()
    warning = slow_bf16_warning("bf16", cpu)
    assert (warning is None) == native
    if warning:
        assert "learner.precision=fp32" in warning
    assert slow_bf16_warning("fp32", cpu) is None and slow_bf16_warning("auto", cpu) is None
    assert slow_bf16_warning("bf16", torch.device("cuda")) is None


def test_a_bfloat16_update_keeps_float32_weights_and_the_float32_loss_within_bfloat16s_precision():
    T, B, A = 5, 2, 6
    batch, cfgs = pixel_batch(T, B, A), {p: LearnerConfig(precision=p) for p in ("fp32", "bf16")}
    stats, grads = {}, {}
    for precision, cfg in cfgs.items():
        torch.manual_seed(0)
        model = ActorCritic((4, 84, 84), A, AgentConfig(torso="shallow"))
        stats[precision] = learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg)
        grads[precision] = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    for key in ("baseline_loss", "entropy", "dead_units"):
        assert stats["bf16"][key] == pytest.approx(stats["fp32"][key], rel=0.02, abs=1e-3), key
    # bfloat16 keeps 8 significant bits: the gradient's direction, not its last digits
    assert torch.nn.functional.cosine_similarity(grads["bf16"], grads["fp32"], dim=0) > 0.99
    assert not torch.equal(grads["bf16"], grads["fp32"])  # it did run in bfloat16


def test_scale_frames_gives_floats_in_0_1_in_the_autocast_dtype():
    frames = torch.tensor([[0, 51, 255]], dtype=torch.uint8)
    assert scale_frames(frames).dtype == torch.float32
    assert torch.equal(scale_frames(frames), frames.float() / 255)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert scale_frames(frames).dtype == torch.bfloat16
        assert scale_frames(frames).tolist() == [[0.0, 0.2001953125, 1.0]]
    floats = torch.tensor([255.0])
    assert scale_frames(floats).item() == 1.0 and floats.item() == 255.0  # the caller's tensor is left as it was


def test_centered_frames_have_zero_mean_per_observation_and_keep_their_differences():
    frames = torch.zeros(2, 2, 2, 2, dtype=torch.uint8)
    frames[0, 0, 0, 0] = 255  # observation 0: one white pixel of 8, mean 1/8
    frames[1] = 51  # observation 1: uniform 0.2, nothing but its mean
    x = scale_frames(frames, center=True)
    assert torch.allclose(x[0].flatten(), torch.tensor([7 / 8] + [-1 / 8] * 7))
    assert torch.allclose(x[1], torch.zeros(2, 2, 2), atol=1e-7)
    torch.manual_seed(0)
    a = ActorCritic((4, 84, 84), 6, AgentConfig(torso="shallow", center_frames=True))
    torch.manual_seed(0)
    b = ActorCritic((4, 84, 84), 6, AgentConfig(torso="shallow"))
    batch = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    assert not torch.allclose(a.torso(batch), b.torso(batch))  # the option reaches the network
