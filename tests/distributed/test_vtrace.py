"""Value checks for distributed/vtrace.py against eq. (1) of IMPALA (arXiv 1802.01561)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from impala_league.distributed import vtrace


def reference_vtrace(
    log_rhos,
    discounts,
    rewards,
    values,
    bootstrap_value,
    clip_rho_threshold=1.0,
    clip_pg_rho_threshold=1.0,
    clip_c_threshold=1.0,
    lambda_=1.0,
    pg_discounts=None,
):
    """Eq. (1) in its explicit-sum form, float64, one (s, b) at a time.

    v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V,
    delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)), V(x_T) = bootstrap.
    Deliberately not the backward recursion that the implementation uses.
    """
    log_rhos, discounts, rewards, values = (
        np.asarray(a, dtype=np.float64) for a in (log_rhos, discounts, rewards, values)
    )
    bootstrap_value = np.asarray(bootstrap_value, dtype=np.float64)
    pg_discounts = discounts if pg_discounts is None else np.asarray(pg_discounts, dtype=np.float64)
    T, B = values.shape

    def clip(rho, threshold):
        return rho if threshold is None else min(threshold, rho)

    vs = np.zeros((T, B))
    pg = np.zeros((T, B))
    for b in range(B):
        v_ext = list(values[:, b]) + [bootstrap_value[b]]
        rho = [math.exp(x) for x in log_rhos[:, b]]
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                trace = 1.0
                for i in range(s, t):
                    trace *= discounts[i, b] * lambda_ * clip(rho[i], clip_c_threshold)
                delta = clip(rho[t], clip_rho_threshold) * (
                    rewards[t, b] + discounts[t, b] * v_ext[t + 1] - v_ext[t]
                )
                total += trace * delta
            vs[s, b] = v_ext[s] + total
        for s in range(T):
            v_next = vs[s + 1, b] if s + 1 < T else bootstrap_value[b]
            pg[s, b] = clip(rho[s], clip_pg_rho_threshold) * (
                rewards[s, b] + pg_discounts[s, b] * v_next - values[s, b]
            )
    return vs, pg


def _random_inputs(rng, T, B, log_rho_scale, done_prob):
    log_rhos = rng.normal(0.0, log_rho_scale, size=(T, B))
    done = rng.random((T, B)) < done_prob
    discounts = 0.99 * (1.0 - done)
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    bootstrap_value = rng.normal(size=(B,))
    return log_rhos, discounts, rewards, values, bootstrap_value


CLIPPING = {
    "no_clipping": dict(clip_rho_threshold=None, clip_pg_rho_threshold=None, clip_c_threshold=None),
    "all_at_1": dict(clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, clip_c_threshold=1.0),
    "rho_bar_ne_c_bar": dict(clip_rho_threshold=2.0, clip_pg_rho_threshold=1.0, clip_c_threshold=0.7),
    "pg_rho_bar_differs": dict(clip_rho_threshold=1.0, clip_pg_rho_threshold=3.5, clip_c_threshold=1.0),
    "lambda_0.5": dict(clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, clip_c_threshold=1.0, lambda_=0.5),
    "lambda_0.95_c_bar_none": dict(
        clip_rho_threshold=1.5, clip_pg_rho_threshold=None, clip_c_threshold=None, lambda_=0.95
    ),
}


@pytest.mark.parametrize("clipping", sorted(CLIPPING))
@pytest.mark.parametrize("T,B", [(1, 1), (5, 3), (17, 4)])
@pytest.mark.parametrize("log_rho_scale,done_prob", [(0.5, 0.0), (3.0, 0.2)])
def test_matches_eq1_reference(clipping, T, B, log_rho_scale, done_prob):
    kwargs = CLIPPING[clipping]
    seed = [sorted(CLIPPING).index(clipping), T, B, int(10 * log_rho_scale)]
    rng = np.random.default_rng(seed)
    inputs = _random_inputs(rng, T, B, log_rho_scale, done_prob)
    if done_prob > 0 and T > 2:
        inputs[1][T // 2, :] = 0.0  # at least one episode end mid-unroll in every column

    # float64: to 1e-6.
    ours = vtrace.from_importance_weights(*(torch.tensor(a) for a in inputs), **kwargs)
    want_vs, want_pg = reference_vtrace(*inputs, **kwargs)
    np.testing.assert_allclose(ours.vs.numpy(), want_vs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours.pg_advantages.numpy(), want_pg, rtol=1e-6, atol=1e-6)

    # float32: against the reference run on the same float32-rounded inputs.
    inputs32 = [np.asarray(a, dtype=np.float32) for a in inputs]
    ours32 = vtrace.from_importance_weights(*(torch.from_numpy(a) for a in inputs32), **kwargs)
    assert ours32.vs.dtype == torch.float32
    want_vs32, want_pg32 = reference_vtrace(*inputs32, **kwargs)
    scale = max(1.0, np.abs(want_vs32).max(), np.abs(want_pg32).max())
    np.testing.assert_allclose(ours32.vs.numpy(), want_vs32, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(ours32.pg_advantages.numpy(), want_pg32, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("clipping", ["all_at_1", "rho_bar_ne_c_bar"])
def test_pg_discounts_change_only_the_advantage(clipping):
    # A policy-gradient gamma of 0.7 beside a value gamma of 0.99: vs is the plain V-trace target,
    # the advantage uses 0.7 (0 at episode ends), against the float64 reference.
    T, B = 9, 3
    rng = np.random.default_rng(7)
    inputs = _random_inputs(rng, T, B, 1.0, 0.2)
    pg_discounts = 0.7 / 0.99 * inputs[1]
    kwargs = CLIPPING[clipping]
    plain = vtrace.from_importance_weights(*(torch.tensor(a) for a in inputs), **kwargs)
    ours = vtrace.from_importance_weights(*(torch.tensor(a) for a in inputs), **kwargs,
                                          pg_discounts=torch.tensor(pg_discounts))
    want_vs, want_pg = reference_vtrace(*inputs, **kwargs, pg_discounts=pg_discounts)
    np.testing.assert_allclose(ours.vs.numpy(), plain.vs.numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(ours.pg_advantages.numpy(), want_pg, rtol=1e-6, atol=1e-6)
    assert np.abs(ours.pg_advantages.numpy() - plain.pg_advantages.numpy()).max() > 0.1


def test_pg_discount_hand_values():
    # A win (reward 1) on the last of three steps, V = 0.5 everywhere, on-policy. Value gamma 0.9:
    # vs = 0.81, 0.9, 1. Policy-gradient gamma 0.5: advantages 0.5 * 0.9 - 0.5 = -0.05,
    # 0.5 * 1 - 0.5 = 0, 1 - 0.5 = 0.5 (with gamma 0.9 they would be 0.31, 0.4, 0.5).
    log_rhos = torch.zeros(3, 1, dtype=torch.float64)
    discounts = torch.tensor([[0.9], [0.9], [0.0]], dtype=torch.float64)
    rewards = torch.tensor([[0.0], [0.0], [1.0]], dtype=torch.float64)
    values = torch.full((3, 1), 0.5, dtype=torch.float64)
    out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, torch.zeros(1, dtype=torch.float64),
                                         pg_discounts=discounts / 0.9 * 0.5)
    np.testing.assert_allclose(out.vs[:, 0].numpy(), [0.81, 0.9, 1.0], atol=1e-12)
    np.testing.assert_allclose(out.pg_advantages[:, 0].numpy(), [-0.05, 0.0, 0.5], atol=1e-12)


def test_reference_sees_episode_boundary():
    # Guard on the reference itself: a zero discount must cut the sum, so the
    # target before the boundary cannot depend on anything after it.
    T, B = 6, 2
    rng = np.random.default_rng(0)
    log_rhos, discounts, rewards, values, bootstrap = _random_inputs(rng, T, B, 1.0, 0.0)
    discounts[2, :] = 0.0
    vs_a, _ = reference_vtrace(log_rhos, discounts, rewards, values, bootstrap)
    rewards[3:] += 100.0
    values[3:] -= 50.0
    vs_b, _ = reference_vtrace(log_rhos, discounts, rewards, values, bootstrap)
    np.testing.assert_allclose(vs_a[:3], vs_b[:3])
    ours = vtrace.from_importance_weights(
        *(torch.tensor(a) for a in (log_rhos, discounts, rewards, values, bootstrap))
    )
    np.testing.assert_allclose(ours.vs.numpy(), vs_b, rtol=1e-6, atol=1e-6)


def test_seed_example_on_policy_n_step_returns():
    # pi/mu = 1.6, 1.4, 1.8: all clipped to rho_bar = c_bar = 1, so every rho_t
    # and c_t is 1 and eq. (1) telescopes into the on-policy n-step return
    # bootstrapped from V(x_3) = 0.3:
    #   v_2 = 0.5 + 0.99 * 0.3       = 0.797
    #   v_1 = 0   + 0.99 * 0.797     = 0.78903
    #   v_0 = 1   + 0.99 * 0.78903   = 1.7811397
    pi = torch.tensor([0.8, 0.7, 0.9], dtype=torch.float64)
    mu = torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)
    log_rhos = (torch.log(pi) - torch.log(mu)).unsqueeze(1)
    discounts = torch.full((3, 1), 0.99, dtype=torch.float64)
    rewards = torch.tensor([[1.0], [0.0], [0.5]], dtype=torch.float64)
    values = torch.tensor([[0.0], [0.1], [0.2]], dtype=torch.float64)
    bootstrap = torch.tensor([0.3], dtype=torch.float64)
    out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    np.testing.assert_allclose(out.vs[:, 0].numpy(), [1.7811397, 0.78903, 0.797], atol=1e-5)
    # pg_rho = 1 too: advantage = r_s + gamma v_{s+1} - V(x_s) = v_s - V(x_s) here.
    np.testing.assert_allclose(
        out.pg_advantages[:, 0].numpy(), [1.7811397, 0.68903, 0.597], atol=1e-5
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reward_on_last_step(dtype):
    # A terminal reward of 1 at t=3 discounted back: 0.99^3, 0.99^2, 0.99, 1.
    # V = 0 everywhere and rho = 1, so pg_advantages equal vs.
    T = 4
    log_rhos = torch.zeros(T, 1, dtype=dtype)
    discounts = torch.tensor([[0.99], [0.99], [0.99], [0.0]], dtype=dtype)
    rewards = torch.tensor([[0.0], [0.0], [0.0], [1.0]], dtype=dtype)
    values = torch.zeros(T, 1, dtype=dtype)
    bootstrap = torch.zeros(1, dtype=dtype)
    out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    want = [0.970299, 0.9801, 0.99, 1.0]
    np.testing.assert_allclose(out.vs[:, 0].numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(out.pg_advantages[:, 0].numpy(), want, rtol=1e-6)


def test_outputs_carry_no_gradient():
    T, B = 5, 3
    rng = np.random.default_rng(1)
    tensors = [torch.tensor(a, requires_grad=True) for a in _random_inputs(rng, T, B, 1.0, 0.1)]
    out = vtrace.from_importance_weights(*tensors)
    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad


def _logits_case(dtype=torch.float32):
    # Two time steps, two batch entries, three actions.
    # behaviour: uniform (log mu = -log 3 for every action).
    # target: logits (0, ln 2, ln 5) -> pi = (1/8, 2/8, 5/8); +7 is a no-op shift.
    behaviour = torch.zeros(2, 2, 3, dtype=dtype)
    target = torch.tensor([0.0, math.log(2.0), math.log(5.0)], dtype=dtype).expand(2, 2, 3).clone()
    target[1, 1] += 7.0
    actions = torch.tensor([[0, 1], [2, 2]])
    pi = np.array([[1 / 8, 2 / 8], [5 / 8, 5 / 8]])
    return behaviour, target, actions, pi


def test_action_log_probs_hand_values():
    behaviour, target, actions, pi = _logits_case(torch.float64)
    np.testing.assert_allclose(vtrace.action_log_probs(target, actions).numpy(), np.log(pi), rtol=1e-12)
    np.testing.assert_allclose(
        vtrace.action_log_probs(behaviour, actions).numpy(), np.full((2, 2), -math.log(3.0)), rtol=1e-12
    )


def test_from_logits_hand_values():
    behaviour, target, actions, pi = _logits_case()
    T, B = actions.shape
    discounts = torch.full((T, B), 0.9)
    rewards = torch.tensor([[1.0, 0.0], [0.5, -1.0]])
    values = torch.tensor([[0.2, -0.1], [0.0, 0.3]])
    bootstrap = torch.tensor([0.4, 0.0])
    out = vtrace.from_logits(behaviour, target, actions, discounts, rewards, values, bootstrap)

    # log rho = log pi - log(1/3): ln(3/8), ln(6/8), ln(15/8), ln(15/8).
    want_log_rhos = np.log(pi * 3.0)
    np.testing.assert_allclose(out.log_rhos.numpy(), want_log_rhos, rtol=1e-6)
    np.testing.assert_allclose(out.target_action_log_probs.detach().numpy(), np.log(pi), rtol=1e-6)
    np.testing.assert_allclose(out.behaviour_action_log_probs.numpy(), np.full((2, 2), -math.log(3.0)), rtol=1e-6)

    want_vs, want_pg = reference_vtrace(want_log_rhos, discounts, rewards, values, bootstrap)
    np.testing.assert_allclose(out.vs.numpy(), want_vs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.pg_advantages.numpy(), want_pg, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_value", [-1e9, torch.finfo(torch.float32).min / 2])
def test_from_logits_masked_actions_stay_finite(mask_value):
    T, B = 3, 2
    # Action 1 is illegal everywhere. Behaviour puts ~e^-99 on action 0, target
    # puts 1 / (1 + e^-1) on it: log(pi/mu) = 99 - ln(1 + e^-1) ~ 98.687, and
    # exp() of that overflows float32.
    behaviour = torch.tensor([-99.0, mask_value, 0.0]).expand(T, B, 3).clone()
    target_raw = torch.tensor([0.0, mask_value, -1.0]).expand(T, B, 3).clone()
    target_raw[2, 1] = torch.tensor([mask_value, mask_value, 0.0])  # taken action 0 masked in pi: rho = 0
    target = target_raw.requires_grad_(True)
    actions = torch.zeros(T, B, dtype=torch.int64)
    discounts = torch.full((T, B), 0.99)
    rewards = torch.ones(T, B)
    values = torch.zeros(T, B, requires_grad=True)
    bootstrap = torch.zeros(B)

    out = vtrace.from_logits(behaviour, target, actions, discounts, rewards, values, bootstrap)
    for name, tensor in out._asdict().items():
        assert torch.isfinite(tensor).all(), name
    assert out.log_rhos[0, 0].item() == pytest.approx(99.0 - math.log1p(math.exp(-1.0)), abs=1e-4)
    assert out.log_rhos[2, 1].item() < -1e8
    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad
    assert not out.log_rhos.requires_grad
    assert out.target_action_log_probs.requires_grad

    # rho clipped to 1 wherever log_rho = 99; with V = 0 and r = 1 the
    # on-policy returns follow, except where pi(a) = 0 (rho = 0 kills delta).
    assert out.pg_advantages[2, 1].item() == 0.0
    np.testing.assert_allclose(out.vs[:, 0].numpy(), [1 + 0.99 + 0.99**2, 1 + 0.99, 1.0], rtol=1e-6)

    loss = -(out.target_action_log_probs * out.pg_advantages).sum() + (out.vs - values).pow(2).sum()
    loss.backward()
    assert torch.isfinite(target.grad).all()
    assert torch.isfinite(values.grad).all()
    assert target.grad.abs().sum() > 0


def _ok_inputs(T=4, B=3):
    return dict(
        log_rhos=torch.zeros(T, B),
        discounts=torch.full((T, B), 0.99),
        rewards=torch.zeros(T, B),
        values=torch.zeros(T, B),
        bootstrap_value=torch.zeros(B),
    )


@pytest.mark.parametrize(
    "name,bad",
    [
        ("log_rhos", torch.zeros(4, 2)),
        ("discounts", torch.zeros(3, 3)),
        ("rewards", torch.zeros(4, 3, 1)),
        ("values", torch.zeros(4)),
        ("bootstrap_value", torch.zeros(4, 3)),
        ("bootstrap_value", torch.zeros(1, 3)),
        ("bootstrap_value", torch.zeros(2)),
        ("rewards", torch.zeros(4, 3, dtype=torch.float64)),
        ("pg_discounts", torch.zeros(4, 2)),
        ("pg_discounts", torch.zeros(4, 3, dtype=torch.float64)),
    ],
)
def test_from_importance_weights_rejects_bad_shapes(name, bad):
    inputs = _ok_inputs()
    inputs[name] = bad
    with pytest.raises(ValueError, match=name):
        vtrace.from_importance_weights(**inputs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(clip_rho_threshold=0.0),
        dict(clip_c_threshold=-1.0),
        dict(clip_pg_rho_threshold=float("nan")),
        dict(clip_rho_threshold="1.0"),
        dict(lambda_=1.5),
        dict(lambda_=-0.1),
    ],
)
def test_from_importance_weights_rejects_bad_hyperparameters(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        vtrace.from_importance_weights(**_ok_inputs(), **kwargs)


def test_from_logits_rejects_bad_shapes():
    T, B, A = 4, 3, 5
    rest = _ok_inputs(T, B)
    del rest["log_rhos"]
    logits = torch.zeros(T, B, A)
    actions = torch.zeros(T, B, dtype=torch.int64)
    with pytest.raises(ValueError, match="same shape"):
        vtrace.from_logits(logits, torch.zeros(T, B, A + 1), actions, **rest)
    with pytest.raises(ValueError, match="actions"):
        vtrace.from_logits(logits, logits, torch.zeros(T, B + 1, dtype=torch.int64), **rest)
    with pytest.raises(ValueError, match="integer"):
        vtrace.from_logits(logits, logits, torch.zeros(T, B), **rest)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        vtrace.from_logits(logits, logits, torch.full((T, B), A, dtype=torch.int64), **rest)
    with pytest.raises(ValueError, match="NUM_ACTIONS"):
        vtrace.action_log_probs(torch.zeros(T, B), actions)
    rest["values"] = torch.zeros(T + 1, B)
    with pytest.raises(ValueError, match="values"):
        vtrace.from_logits(logits, logits, actions, **rest)
