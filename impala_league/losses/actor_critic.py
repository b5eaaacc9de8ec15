"""The actor-critic losses of IMPALA (Espeholt et al. 2018, sec. 4) on a batch of unrolls, under one of the
off-policy corrections of its Table 2, from what the network computed on the batch.

`batch` is the learner's stacked batch (impala_league.batch.Batch), read for its time-major `[T, B]`
fields: reward, done, truncated, action and behaviour_logits. `head` is the policy head of the network's
action space (agents.heads: DiscreteHead, FunctionCallHead), read through `ActionHead`.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import torch

import impala_league.distributed.vtrace as vtrace
from impala_league.batch import Batch
from impala_league.config import LearnerConfig


class ActionHead(Protocol):
    """What the losses read from a policy head: per-step log-probs [T, B] of the taken actions (summed
    over the heads a multi-head action uses) under the learner's logits and the behaviour logits, and
    the policy's entropy [T, B]."""

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor: ...

    def behaviour_log_prob(self, behaviour: torch.Tensor, actions: torch.Tensor) -> torch.Tensor: ...

    def entropy(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor: ...


EPSILON_CORRECTION = 1e-6  # the epsilon of the paper's epsilon-correction: log(pi + epsilon)
ADVANTAGE_EPS = 1e-8  # normalize_advantages: a batch of equal advantages gives 0, not nan


class Targets(NamedTuple):
    """What the losses need from one correction; every field [T, B] float.

    vs: value targets (no gradient). pg_advantages: the advantages in front of the policy's log-prob
    (no gradient). log_pi: the log-prob term of the policy gradient, with gradient. log_rhos:
    log pi(a_t|x_t) - log mu(a_t|x_t), unclipped, for the diagnostics (no gradient).
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor
    log_pi: torch.Tensor
    log_rhos: torch.Tensor


def off_policy_targets(logits: torch.Tensor, values: torch.Tensor, batch: Batch, cfg: LearnerConfig,
                       head: ActionHead, final_values: torch.Tensor | None = None) -> Targets:
    """Value targets and policy-gradient advantages under the off-policy correction `cfg.correction`
    (IMPALA, Espeholt et al. 2018, Table 2 and appendix D):

      vtrace  vs from V-trace (eq. 1); advantage min(pg_rho_bar, rho_t) (r_t + gamma_t v_{t+1} - V(x_t)).
      is1     vs uncorrected n-step returns; the advantage weighted by this step's own ratio only,
              min(pg_rho_bar, rho_t) (1-step importance sampling).
      epsilon vs uncorrected; no weight; log pi in the policy gradient is log(pi + 1e-6), which
              bounds it when the behaviour policy took an action that pi now gives ~0 probability.
      none    vs uncorrected n-step returns; no weight.

    "Uncorrected" = V-trace with every rho and c set to 1 (with learner.lambda_=1, the n-step
    bootstrapped returns). logits [T+1, B, ...] (masked), values [T+1, B], both with gradient; `head`
    reads log pi and log mu of the actions from them (summed over the heads a multi-head action uses).

    Rewards are clipped first by `cfg.reward_clipping` (vtrace.clip_rewards): the loss only, never the
    episode statistics, which the actors report from the game's own rewards.

    Episode ends: discounts are gamma * (1 - done), so nothing flows across an episode boundary, also
    inside an unroll. A truncated step t (a time limit, not the game's end) is not terminal: its
    one-step target is r_t + gamma * V(x_final), x_final being the final observation of that episode
    (`final_values` [T, B], no gradient, 0 where not truncated). It is folded into the reward,
    r'_t = r_t + gamma * V(x_final), with discount 0, which gives exactly
    delta_t = rho_t (r_t + gamma V(x_final) - V(x_t)), vs_t = V(x_t) + delta_t, and the advantage
    min(pg_rho_bar, rho_t) (r_t + gamma V(x_final) - V(x_t)): V-trace (eq. 1) with v_{t+1} := V(x_final)
    and the next episode's values cut off.

    `cfg.pg_discount` (when set) is the gamma of the policy-gradient advantage only, e.g.
    r_t + gamma_pg vs_{t+1} - V(x_t) under V-trace; the value targets and a truncated step's
    bootstrap keep `cfg.discount`.
    """
    not_done = (~batch.done).float()
    discounts = not_done * cfg.discount
    pg_discounts = None if cfg.pg_discount is None else not_done * cfg.pg_discount
    rewards = vtrace.clip_rewards(batch.reward, cfg.reward_clipping)
    if final_values is not None and batch.truncated is not None:
        rewards = rewards + cfg.discount * batch.truncated.float() * final_values
    log_pi = head.log_prob(logits[:-1], batch.action)
    log_mu = head.behaviour_log_prob(batch.behaviour_logits, batch.action)
    log_rhos = (log_pi - log_mu).detach()
    targets = dict(discounts=discounts, rewards=rewards, values=values[:-1].detach(),
                   bootstrap_value=values[-1].detach(), lambda_=cfg.lambda_,
                   pg_discounts=pg_discounts)
    if cfg.correction == "vtrace":
        vt = vtrace.from_importance_weights(log_rhos, clip_rho_threshold=cfg.clip_rho_threshold,
                                            clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
                                            clip_c_threshold=cfg.clip_c_threshold, **targets)
        return Targets(vt.vs, vt.pg_advantages, log_pi, log_rhos)
    plain = vtrace.from_importance_weights(torch.zeros_like(log_rhos), clip_rho_threshold=None,
                                           clip_pg_rho_threshold=None, clip_c_threshold=None, **targets)
    if cfg.correction == "is1":
        rhos = log_rhos.exp() if cfg.clip_pg_rho_threshold is None else log_rhos.clamp(
            max=math.log(cfg.clip_pg_rho_threshold)).exp()
        return Targets(plain.vs, rhos * plain.pg_advantages, log_pi, log_rhos)
    if cfg.correction == "epsilon":
        return Targets(plain.vs, plain.pg_advantages, torch.log(log_pi.exp() + EPSILON_CORRECTION), log_rhos)
    return Targets(plain.vs, plain.pg_advantages, log_pi, log_rhos)


def actor_critic_loss(logits: torch.Tensor, values: torch.Tensor, final_values: torch.Tensor | None, batch: Batch,
                      cfg: LearnerConfig, head: ActionHead) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The IMPALA loss on `batch` (with gradient) and its parts and diagnostics (0-dim tensors, no gradient),
    from the network's outputs on it (agents.core.forward_batch): logits [T+1, B, ...] (masked) and values
    [T+1, B] with gradient, final_values [T, B] or None (see `off_policy_targets`).

    `head` gives log pi(a|x), log mu(a|x) and the entropy; for multi-head actions they are sums over the heads the action uses, so
    log_rho = log pi(a|x) - log mu(a|x) is the sum of the per-head log-ratios.

    loss = policy_gradient_loss + baseline_cost * baseline_loss + entropy_cost * entropy_loss, with
      policy_gradient_loss = -mean(pg_advantage_t * log pi(a_t|x_t)),  (pg_advantage standardized over the
                             batch, (A - mean A) / (std A + 1e-8), with cfg.normalize_advantages)
      baseline_loss        = mean(0.5 * (v_t - V(x_t))^2),
      entropy_loss         = -mean(H(pi(.|x_t))),
    v_t and pg_advantage_t from the off-policy correction `cfg.correction` (see `off_policy_targets`;
    V-trace, eq. 1, by default) and means over the T x B steps (a sum would tie the step size to T x B).
    With correction `none` on on-policy unrolls this is A3C's n-step advantage actor-critic loss
    (Mnih et al. 2016, Algorithm S3). The diagnostics mean_rho, rho_clipped_fraction and
    c_clipped_fraction describe the batch's importance ratios pi/mu, whichever correction is used;
    truncated_fraction is the share of steps a time limit ended (bootstrapped, not terminal).
    """
    vt = off_policy_targets(logits, values, batch, cfg, head, final_values)
    pg_advantages = vt.pg_advantages
    if cfg.normalize_advantages:  # Sample Factory's APPO: the pg term's scale no longer follows the rewards'
        pg_advantages = (pg_advantages - pg_advantages.mean()) / (pg_advantages.std() + ADVANTAGE_EPS)
    policy_gradient_loss = -(vt.log_pi * pg_advantages).mean()
    baseline_loss = 0.5 * (vt.vs - values[:-1]).pow(2).mean()
    entropy = head.entropy(logits[:-1], batch.action).mean()
    loss = policy_gradient_loss + cfg.baseline_cost * baseline_loss - cfg.entropy_cost * entropy
    rhos = vt.log_rhos.clamp(max=10.0).exp()  # capped so one stale step cannot make the mean inf
    parts = {"loss": loss, "policy_gradient_loss": policy_gradient_loss, "baseline_loss": baseline_loss,
             "entropy": entropy, "mean_rho": rhos.mean(),
             "rho_clipped_fraction": (rhos > (cfg.clip_rho_threshold or math.inf)).float().mean(),
             "c_clipped_fraction": (rhos > (cfg.clip_c_threshold or math.inf)).float().mean(),
             "truncated_fraction": (batch.truncated.float().mean() if batch.truncated is not None
                                    else torch.zeros((), device=loss.device))}
    return loss, {k: v.detach() for k, v in parts.items()}
