"""V-trace off-policy actor-critic targets, time-major and batched, in torch.

Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
Weighted Actor-Learner Architectures" (arXiv 1802.01561). The n-step V-trace
target for V(x_s) is eq. (1):

    v_s = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t V

    delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))
    rho_t     = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))
    c_i       = lambda * min(c_bar, pi(a_i|x_i) / mu(a_i|x_i))

and it is computed here with the equivalent backward recursion (Remark 1):

    v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1}))

Here gamma is per step (`discounts` = gamma * (1 - done)), so an episode that
ends mid-unroll cuts both the bootstrap and the trace. The policy-gradient
advantage of section 4.2 is

    pg_rho_s (r_s + gamma_s v_{s+1} - V(x_s)),   pg_rho_s = min(pg_rho_bar, pi/mu).

All tensors are time-major: `[T, B, ...]` with T the unroll length and B the
batch of unrolls. The outputs are targets, so they carry no gradient.

Arguments that `from_importance_weights` and `from_logits` share (every tensor
of one floating dtype and device):
  discounts: A float tensor of shape [T, B]. gamma_t = gamma * (1 - done_t),
    the discount applied after step t; 0 where the episode ended at t (this
    cuts the bootstrap and the trace).
  rewards: A float tensor of shape [T, B]. r_t, the reward after a_t.
  values: A float tensor of shape [T, B]. V(x_t), the learner's value
    estimates (the baseline).
  bootstrap_value: A float tensor of shape [B]. V(x_T), the value estimate of
    the observation after the last step of the unroll.
  clip_rho_threshold: A positive float or None. rho-bar in the paper: clips
    the rho_t inside delta_t V. Sets the fixed point of the value function
    (V^{pi_rho-bar}). None means no clipping.
  clip_pg_rho_threshold: A positive float or None. pg-rho-bar: clips the
    importance weight in front of the policy-gradient advantage. None means
    no clipping.
  clip_c_threshold: A positive float or None. c-bar in the paper: clips the
    trace coefficients c_i (speed of convergence, variance). None means no
    clipping.
  lambda_: A float in [0, 1]. lambda of Remark 2, multiplies every c_i:
    c_i = lambda * min(c-bar, rho_i). 1.0 is plain V-trace.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

__all__ = [
    "VTraceReturns",
    "VTraceFromLogitsReturns",
    "action_log_probs",
    "from_importance_weights",
    "from_logits",
]


class VTraceReturns(NamedTuple):
    """V-trace targets.

    Attributes:
      vs: A float32/float64 tensor of shape [T, B]. The V-trace value targets
        v_s of eq. (1); the baseline is regressed towards them.
      pg_advantages: A float tensor of shape [T, B]. The advantages
        pg_rho_s * (r_s + gamma_s * v_{s+1} - V(x_s)) used in the
        policy-gradient loss (section 4.2).
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor


class VTraceFromLogitsReturns(NamedTuple):
    """V-trace targets plus the log-probabilities they were computed from.

    Attributes:
      vs: A float tensor of shape [T, B]. V-trace value targets v_s (eq. (1)).
        No gradient.
      pg_advantages: A float tensor of shape [T, B]. Policy-gradient
        advantages (section 4.2). No gradient.
      log_rhos: A float tensor of shape [T, B]. log(pi(a_t|x_t) / mu(a_t|x_t)),
        the unclipped log importance weights. No gradient.
      behaviour_action_log_probs: A float tensor of shape [T, B].
        log mu(a_t|x_t) under the behaviour policy (the actor's).
      target_action_log_probs: A float tensor of shape [T, B].
        log pi(a_t|x_t) under the target policy (the learner's). Keeps its
        gradient: the learner's policy-gradient loss is
        -sum(target_action_log_probs * pg_advantages).
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor
    log_rhos: torch.Tensor
    behaviour_action_log_probs: torch.Tensor
    target_action_log_probs: torch.Tensor


def action_log_probs(policy_logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Log-probability of the taken actions under a categorical policy.

    Args:
      policy_logits: A float tensor of shape [T, B, NUM_ACTIONS] with
        un-normalized log-probabilities. Illegal actions must already be masked
        with a large negative *finite* number (e.g. -1e9), never -inf, so that
        log_softmax and its gradient stay finite.
      actions: An int64 tensor of shape [T, B] with values in
        [0, NUM_ACTIONS).

    Returns:
      A float tensor of shape [T, B]: log pi(a_t|x_t). Differentiable with
      respect to `policy_logits`.

    Raises:
      ValueError: on a shape or dtype mismatch, or an action out of range.
    """
    if policy_logits.dim() != 3:
        raise ValueError(
            f"policy_logits must be [T, B, NUM_ACTIONS], got shape {tuple(policy_logits.shape)}"
        )
    if not policy_logits.is_floating_point():
        raise ValueError(f"policy_logits must be floating point, got {policy_logits.dtype}")
    if actions.shape != policy_logits.shape[:2]:
        raise ValueError(
            f"actions must be [T, B] = {tuple(policy_logits.shape[:2])} to match "
            f"policy_logits {tuple(policy_logits.shape)}, got {tuple(actions.shape)}"
        )
    if actions.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"actions must be an integer tensor, got {actions.dtype}")
    num_actions = policy_logits.shape[-1]
    # An out-of-range index is a device-side assert on CUDA (kills the context);
    # one host sync per batch is the cheaper failure.
    if actions.numel() and bool(((actions < 0) | (actions >= num_actions)).any()):
        raise ValueError(f"actions must lie in [0, {num_actions}), got values outside it")
    log_probs = torch.log_softmax(policy_logits, dim=-1)
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def _check_threshold(name: str, value: Optional[float]) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number or None, got {value!r}")


def _check_clipping(clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold, lambda_) -> None:
    """The clipping arguments of `from_importance_weights`: each threshold a positive finite number or
    None, lambda_ a number in [0, 1]."""
    _check_threshold("clip_rho_threshold", clip_rho_threshold)
    _check_threshold("clip_pg_rho_threshold", clip_pg_rho_threshold)
    _check_threshold("clip_c_threshold", clip_c_threshold)
    if isinstance(lambda_, bool) or not isinstance(lambda_, (int, float)) or not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ must be a number in [0, 1], got {lambda_!r}")


def _clipped_ratio(log_rhos: torch.Tensor, threshold: Optional[float]) -> torch.Tensor:
    # Clip in log space: exp(99) overflows float32 to inf before min() could cap it.
    if threshold is None:
        return torch.exp(log_rhos)
    return torch.exp(torch.clamp(log_rhos, max=math.log(threshold)))


def _check_inputs(log_rhos, discounts, rewards, values, bootstrap_value, pg_discounts=None) -> None:
    named = {
        "log_rhos": log_rhos,
        "discounts": discounts,
        "rewards": rewards,
        "values": values,
    }
    if pg_discounts is not None:
        named["pg_discounts"] = pg_discounts
    if values.dim() != 2:
        raise ValueError(f"values must be [T, B], got shape {tuple(values.shape)}")
    if values.shape[0] < 1:
        raise ValueError("values must have T >= 1 time steps, got T = 0")
    for name, tensor in named.items():
        if tensor.shape != values.shape:
            raise ValueError(
                f"{name} must be [T, B] = {tuple(values.shape)} like values, got {tuple(tensor.shape)}"
            )
    if bootstrap_value.shape != values.shape[1:]:
        raise ValueError(
            f"bootstrap_value must be [B] = {tuple(values.shape[1:])}, got {tuple(bootstrap_value.shape)}"
        )
    named["bootstrap_value"] = bootstrap_value
    for name, tensor in named.items():
        if tensor.dtype != values.dtype:
            raise ValueError(
                f"{name} has dtype {tensor.dtype} but values has {values.dtype}; cast them to one float dtype"
            )
        if tensor.device != values.device:
            raise ValueError(f"{name} is on {tensor.device} but values is on {values.device}")
    if not values.is_floating_point():
        raise ValueError(f"inputs must be floating point, got {values.dtype}")


def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    lambda_: float = 1.0,
    pg_discounts: Optional[torch.Tensor] = None,
) -> VTraceReturns:
    r"""V-trace targets from log importance weights (eq. (1), section 4.2).

    All inputs share one floating dtype and device. Computed under
    torch.no_grad(): the outputs never carry gradient, whatever the inputs do.

    Args:
      log_rhos: A float tensor of shape [T, B]. log(pi(a_t|x_t) / mu(a_t|x_t)),
        the log importance sampling weights of the taken actions, target
        policy pi over behaviour policy mu. Unclipped.
      discounts, rewards, values, bootstrap_value, clip_rho_threshold,
        clip_pg_rho_threshold, clip_c_threshold, lambda_: see the module
        docstring.
      pg_discounts: A float tensor of shape [T, B] or None. The gamma_s of the
        policy-gradient advantage only (the targets v_s keep `discounts`); a
        smaller one than the value's makes the advantage of a move that wins
        later smaller than that of one that wins now. None means `discounts`.

    Returns:
      A `VTraceReturns` of:
        vs: A float tensor of shape [T, B], the V-trace targets v_s.
        pg_advantages: A float tensor of shape [T, B],
          min(pg-rho-bar, rho_s) * (r_s + gamma_s * v_{s+1} - V(x_s)),
          with v_T = bootstrap_value and gamma_s from `pg_discounts`.

    Raises:
      ValueError: if shapes, dtypes or devices disagree, a threshold is not
        positive (or None), or lambda_ is outside [0, 1].
    """
    _check_inputs(log_rhos, discounts, rewards, values, bootstrap_value, pg_discounts)
    _check_clipping(clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold, lambda_)
    with torch.no_grad():
        clipped_rhos = _clipped_ratio(log_rhos, clip_rho_threshold)
        cs = lambda_ * _clipped_ratio(log_rhos, clip_c_threshold)
        deltas = clipped_rhos * (rewards + discounts * _next_steps(values, bootstrap_value) - values)
        vs = _traced_back(deltas, discounts * cs) + values

        clipped_pg_rhos = _clipped_ratio(log_rhos, clip_pg_rho_threshold)
        pg_discounts = discounts if pg_discounts is None else pg_discounts
        pg_advantages = clipped_pg_rhos * (rewards + pg_discounts * _next_steps(vs, bootstrap_value) - values)
        return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def _next_steps(per_step: torch.Tensor, bootstrap_value: torch.Tensor) -> torch.Tensor:
    """[T, B]: row t is `per_step`'s row t + 1, and row T - 1 is `bootstrap_value` (the value after the unroll)."""
    return torch.cat([per_step[1:], bootstrap_value.unsqueeze(0)], dim=0)


def _traced_back(deltas: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """v_s - V(x_s) by Remark 1's recursion: delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})), with v_T - V(x_T)
    = 0 (`decay` = gamma_s c_s, both [T, B]). Loops over T only; each step is vectorised over B."""
    vs_minus_v = torch.empty_like(deltas)
    acc = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = torch.addcmul(deltas[t], decay[t], acc)
        vs_minus_v[t] = acc
    return vs_minus_v


def from_logits(
    behaviour_policy_logits: torch.Tensor,
    target_policy_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    lambda_: float = 1.0,
) -> VTraceFromLogitsReturns:
    r"""V-trace for categorical policies given as logits.

    log_rhos = log pi(a_t|x_t) - log mu(a_t|x_t), then
    `from_importance_weights`. Logits must already be masked by the caller:
    illegal actions carry a large negative finite number (-1e9 or
    torch.finfo(dtype).min / 2), never -inf, so every output stays finite.

    Args:
      behaviour_policy_logits: A float tensor of shape [T, B, NUM_ACTIONS].
        Un-normalized log-probabilities of the behaviour policy mu (recorded
        by the actor).
      target_policy_logits: A float tensor of shape [T, B, NUM_ACTIONS].
        Un-normalized log-probabilities of the target policy pi (the learner's
        forward pass); gradient flows through `target_action_log_probs`.
      actions: An int64 tensor of shape [T, B]. The actions a_t taken by the
        behaviour policy, in [0, NUM_ACTIONS).
      discounts, rewards, values, bootstrap_value, clip_rho_threshold,
        clip_pg_rho_threshold, clip_c_threshold, lambda_: see the module
        docstring.

    Returns:
      A `VTraceFromLogitsReturns` (its fields documented there): vs and
      pg_advantages as `from_importance_weights` returns them, log_rhos, and
      both policies' log-probs of the taken actions; only
      target_action_log_probs carries gradient.

    Raises:
      ValueError: on any shape/dtype mismatch (see `action_log_probs` and
        `from_importance_weights`).
    """
    if behaviour_policy_logits.shape != target_policy_logits.shape:
        raise ValueError("behaviour_policy_logits and target_policy_logits must have the same shape [T, B, "
                         f"NUM_ACTIONS], got {tuple(behaviour_policy_logits.shape)} and {tuple(target_policy_logits.shape)}")
    target_action_log_probs = action_log_probs(target_policy_logits, actions)
    behaviour_action_log_probs = action_log_probs(behaviour_policy_logits, actions)
    # Importance weights are constants of the loss: no gradient through them.
    log_rhos = target_action_log_probs.detach() - behaviour_action_log_probs.detach()
    vtrace_returns = from_importance_weights(log_rhos.to(values.dtype), discounts, rewards, values, bootstrap_value,
                                             clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold, lambda_)
    return VTraceFromLogitsReturns(vs=vtrace_returns.vs, pg_advantages=vtrace_returns.pg_advantages,
                                   log_rhos=log_rhos, behaviour_action_log_probs=behaviour_action_log_probs,
                                   target_action_log_probs=target_action_log_probs)


def clip_rewards(rewards: torch.Tensor, clipping: str) -> torch.Tensor:
    """Rewards [...] as the loss sees them (Espeholt et al. 2018, section 5.3 and appendix):

    none            r
    abs_one         clip(r, -1, 1), the DQN and Atari convention
    soft_asymmetric 0.3 * min(tanh(r), 0) + 5 * max(tanh(r), 0), the paper's DMLab-30 clipping: positive
                    rewards are made larger than negative ones (5 against 0.3 at most)

    Raises ValueError for another name."""
    if clipping == "none":
        return rewards
    if clipping == "abs_one":
        return rewards.clamp(-1.0, 1.0)
    if clipping == "soft_asymmetric":
        squashed = torch.tanh(rewards)
        return 0.3 * squashed.clamp(max=0.0) + 5.0 * squashed.clamp(min=0.0)
    raise ValueError(f"reward clipping must be none, abs_one or soft_asymmetric, got {clipping!r}")
