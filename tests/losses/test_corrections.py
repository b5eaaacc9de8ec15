"""Off-policy corrections of IMPALA's Table 2 (learner.correction) against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from impala_league.config import ConfigError, LearnerConfig, load_config
from impala_league.distributed.learner.update import learn_step
from tests.distributed.learner.test_update import TableModel, make_batch

# T=2, B=1, two actions; actions [1, 0]; pi(1|x0) = 0.75, pi(0|x1) = 0.75 (the learner's table);
# mu(1|x0) = 0.5, mu(0|x1) = 0.9 (the actor's), so rho = [1.5, 0.75 / 0.9 = 5/6].
# V(x) = [0.5, -0.2], bootstrap V(x2) = 0.4, rewards [0, 1], gamma 0.9, no episode end.
PI_LOGITS = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0], [0.0, 0.0]])
MU_LOGITS = torch.tensor([[0.0, 0.0], [math.log(9.0), 0.0]])
VALUES = torch.tensor([0.5, -0.2, 0.4])
V = np.array([0.5, -0.2])
LOG_PI = np.log([0.75, 0.75])

# vtrace: clipped rho = c = [1, 5/6].
#   delta_1 = 5/6 (1 + 0.9 * 0.4 + 0.2) = 1.3        -> vs_1 = -0.2 + 1.3 = 1.1
#   delta_0 = 1 (0 + 0.9 * -0.2 - 0.5) = -0.68       -> vs_0 = 0.5 - 0.68 + 0.9 * 1 * 1.3 = 0.99
#   pg advantages: [1 (0.9 * 1.1 - 0.5), 5/6 (1 + 0.36 + 0.2)] = [0.49, 1.3]
# uncorrected (none, epsilon, is1): vs = n-step returns [0.9 * 1.36, 1 + 0.9 * 0.4] = [1.224, 1.36],
#   advantages [0.9 * 1.36 - 0.5, 1.36 + 0.2] = [0.724, 1.56];
#   is1 weights them by min(1, rho_t) = [1, 5/6]: [0.724, 1.3].
EXPECTED = {
    "vtrace": (np.array([0.99, 1.1]), np.array([0.49, 1.3])),
    "none": (np.array([1.224, 1.36]), np.array([0.724, 1.56])),
    "epsilon": (np.array([1.224, 1.36]), np.array([0.724, 1.56])),
    "is1": (np.array([1.224, 1.36]), np.array([0.724, 1.3])),
}


def run_step(correction: str, pi_logits=PI_LOGITS, **cfg_kwargs) -> dict[str, float]:
    model = TableModel(pi_logits, VALUES)
    batch = make_batch(2, 2, actions=[1, 0], rewards=[0.0, 1.0], dones=[0, 0], behaviour_logits=MU_LOGITS)
    cfg = LearnerConfig(discount=0.9, entropy_cost=0.0, baseline_cost=0.5, grad_norm_clip=1e9,
                        correction=correction, **cfg_kwargs)
    return learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg)


@pytest.mark.parametrize("correction", ["vtrace", "is1", "epsilon", "none"])
def test_losses_match_the_hand_computation(correction):
    vs, adv = EXPECTED[correction]
    log_pi = np.log(np.exp(LOG_PI) + 1e-6) if correction == "epsilon" else LOG_PI
    stats = run_step(correction)
    assert math.isclose(stats["baseline_loss"], 0.5 * ((vs - V) ** 2).mean(), rel_tol=1e-5)
    assert math.isclose(stats["policy_gradient_loss"], -(log_pi * adv).mean(), rel_tol=1e-5)
    # Diagnostics describe the batch's ratios whatever the correction: mean rho (1.5 + 5/6) / 2.
    assert math.isclose(stats["mean_rho"], (1.5 + 5 / 6) / 2, rel_tol=1e-5)
    assert stats["rho_clipped_fraction"] == 0.5


# learner.pg_discount = 0.5: the same value targets, the advantages with 0.5 in place of gamma:
#   vtrace [1 (0.5 * 1.1 - 0.5), 5/6 (1 + 0.5 * 0.4 + 0.2)] = [0.05, 7/6];
#   none   [0.5 * 1.36 - 0.5, 1 + 0.5 * 0.4 + 0.2] = [0.18, 1.4].
@pytest.mark.parametrize("correction,adv", [("vtrace", [0.05, 7 / 6]), ("none", [0.18, 1.4])])
def test_pg_discount_changes_the_advantages_not_the_value_targets(correction, adv):
    vs = EXPECTED[correction][0]
    stats = run_step(correction, pg_discount=0.5)
    assert math.isclose(stats["baseline_loss"], 0.5 * ((vs - V) ** 2).mean(), rel_tol=1e-5)
    assert math.isclose(stats["policy_gradient_loss"], -(LOG_PI * np.array(adv)).mean(), rel_tol=1e-5)


def test_is1_without_pg_rho_clipping_uses_the_raw_ratio():
    stats = run_step("is1", clip_pg_rho_threshold=None)
    adv = np.array([1.5 * 0.724, 5 / 6 * 1.56])
    assert math.isclose(stats["policy_gradient_loss"], -(LOG_PI * adv).mean(), rel_tol=1e-5)


def test_epsilon_bounds_the_log_prob_of_an_action_pi_almost_never_takes():
    # pi(0|x1) = 1e-7: log pi = -16.12, log(pi + 1e-6) = log(1.1e-6) = -13.72.
    logits = PI_LOGITS.clone()
    logits[1] = torch.tensor([0.0, math.log(1e7 - 1)])
    p1 = 1e-7
    adv = np.array([0.724, 1.56])  # uncorrected: the values and rewards did not change
    eps = run_step("epsilon", pi_logits=logits)
    none = run_step("none", pi_logits=logits)
    expected_eps = -(np.log([0.75 + 1e-6, p1 + 1e-6]) * adv).mean()
    expected_none = -(np.log([0.75, p1]) * adv).mean()
    assert math.isclose(eps["policy_gradient_loss"], expected_eps, rel_tol=1e-4)
    assert math.isclose(none["policy_gradient_loss"], expected_none, rel_tol=1e-4)
    assert none["policy_gradient_loss"] - eps["policy_gradient_loss"] > 1.8  # 0.5 * 1.56 * 2.40


def test_a_float64_reference_agrees_on_a_random_off_policy_batch():
    """T=6 with an episode end, random logits: each correction against a loop written from the paper."""
    g = np.random.default_rng(3)
    T, A, gamma = 6, 3, 0.95
    pi_logits = torch.tensor(g.normal(size=(T + 1, A)))
    mu_logits = torch.tensor(g.normal(size=(T, A)))
    values = torch.tensor(g.normal(size=T + 1))
    actions, rewards, dones = g.integers(0, A, T), g.normal(size=T), np.array([0, 0, 1, 0, 0, 0])

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    pi = softmax(pi_logits.numpy()[:T])[np.arange(T), actions]
    mu = softmax(mu_logits.numpy())[np.arange(T), actions]
    rho, v, disc = pi / mu, values.numpy(), gamma * (1 - dones)
    for correction in ("vtrace", "is1", "epsilon", "none"):
        c = np.minimum(1.0, rho) if correction == "vtrace" else np.ones(T)
        vs = np.zeros(T)
        nxt = 0.0  # v_{t+1} - V(x_{t+1}), 0 after the bootstrap
        for t in reversed(range(T)):
            nxt = c[t] * (rewards[t] + disc[t] * v[t + 1] - v[t]) + disc[t] * c[t] * nxt
            vs[t] = v[t] + nxt
        vs_next = np.append(vs[1:], v[T])
        adv = rewards + disc * vs_next - v[:T]
        if correction in ("vtrace", "is1"):
            adv = np.minimum(1.0, rho) * adv
        log_term = np.log(pi + 1e-6) if correction == "epsilon" else np.log(pi)
        model = TableModel(pi_logits.float(), values.float())
        batch = make_batch(T, A, actions=actions.tolist(), rewards=rewards.tolist(), dones=dones.tolist(),
                           behaviour_logits=mu_logits.float())
        cfg = LearnerConfig(discount=gamma, entropy_cost=0.0, grad_norm_clip=1e9, correction=correction)
        stats = learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg)
        assert math.isclose(stats["baseline_loss"], 0.5 * ((vs - v[:T]) ** 2).mean(), rel_tol=1e-4), correction
        assert math.isclose(stats["policy_gradient_loss"], -(log_term * adv).mean(), rel_tol=1e-4, abs_tol=1e-6), \
            correction


def test_an_unknown_correction_is_a_config_error():
    with pytest.raises(ConfigError, match="learner.correction must be vtrace, is1, epsilon or none"):
        load_config(None, ["learner.correction=retrace"])


def test_normalized_advantages_are_standardized_over_the_batch():
    # pi(1|x0) = 0.5 now (rho_0 = 1, clipped as before): the V-trace advantages stay [0.49, 1.3]; standardized
    # (torch's unbiased std of two values, |1.3 - 0.49| / sqrt 2) they are [-1/sqrt 2, 1/sqrt 2].
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [0.0, 0.0]])
    log_pi = np.log([0.5, 0.75])
    plain = run_step("vtrace", pi_logits=logits)
    normalized = run_step("vtrace", pi_logits=logits, normalize_advantages=True)
    assert math.isclose(plain["policy_gradient_loss"], -(log_pi * np.array([0.49, 1.3])).mean(), rel_tol=1e-5)
    expected = -(log_pi * np.array([-1, 1]) / math.sqrt(2)).mean()
    assert math.isclose(normalized["policy_gradient_loss"], expected, rel_tol=1e-5)
    assert normalized["baseline_loss"] == plain["baseline_loss"]  # the value targets are not touched
