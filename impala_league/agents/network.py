"""Actor-critic networks for a Discrete action space: a torso of agents/torsos.py (`TORSOS`: mlp, conv,
shallow, resnet), a core (agents/core.py: the LSTM or the identity), and `LinearHeads`: a policy head with
action masking and a baseline head."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from impala_league.agents.core import Network, make_core
from impala_league.agents.torsos import TORSOS, orthogonal_init, torso_class
from impala_league.config import AgentConfig

# Illegal actions get this logit: exp() underflows to exactly 0, yet log-probs and entropies stay
# finite (0 * -1e9 = 0), where -inf would give 0 * inf = nan.
MASKED_LOGIT = -1e9


def mask_logits(logits: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """logits [..., A] float; action_mask [..., A] (bool or 0/1). Illegal entries become MASKED_LOGIT."""
    return logits.masked_fill(action_mask == 0, MASKED_LOGIT)


class LinearHeads(nn.Module):
    """pi's logits and V from the core's output: features [N, in_features] -> (policy_logits [N, A]
    float32 with illegal actions at MASKED_LOGIT, baseline [N] float32), one linear layer each.

    gains: (policy, baseline) gains of an orthogonal initialization (the pixel torsos' (0.01, 1.0): a
    near-uniform first policy, as in IMPALA's Atari agents' reference implementations), or None for
    PyTorch's default.
    """

    def __init__(self, in_features: int, num_actions: int, gains: tuple[float, float] | None = None):
        super().__init__()
        self.policy = nn.Linear(in_features, num_actions)
        self.baseline = nn.Linear(in_features, 1)
        if gains is not None:
            orthogonal_init(self.policy, gains[0])
            orthogonal_init(self.baseline, gains[1])

    def forward(self, features: torch.Tensor, extra: None,
                action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return mask_logits(self.policy(features), action_mask), self.baseline(features).squeeze(-1)

    def feature_readers(self) -> list[torch.Tensor]:
        """The weights that read the core's output: both heads'."""
        return [self.policy.weight, self.baseline.weight]


class ActorCritic(Network):
    """pi(a|x) and V(x) for one agent's observation (Espeholt et al. 2018): torso -> core -> LinearHeads.

    Args:
      obs_shape: one observation's shape; boards are channels-last (H, W, C) as PettingZoo gives them,
        frames for the pixel torsos channels-first (C, H, W) as gymnasium's frame stack gives them.
      num_actions: A, the size of the Discrete action space.
      cfg: `cfg.torso` names the torso class in agents.torsos.TORSOS; its sizes, and the core (`cfg.core`).
      image: the observation is an image (EnvSpec.obs_image): a board or vector torso scales it by 1/255
        (the pixel torsos always scale their uint8 frames).

    Raises ValueError for fullyconv (agents.model.make_model builds it), ConfigError (a ValueError) for a
    torso that is not registered (`agents.torsos.torso_class`).
    """

    def __init__(self, obs_shape: Sequence[int], num_actions: int, cfg: AgentConfig, image: bool = False):
        if cfg.torso == "fullyconv":
            raise ValueError(f"agent.torso=fullyconv is not a torso of ActorCritic (one of {sorted(TORSOS)}); "
                             "build networks with agents.model.make_model")
        torso = torso_class(cfg.torso).from_config(obs_shape, cfg, image)
        core = make_core(cfg, torso.out_features, num_actions)
        super().__init__(torso, core, LinearHeads(core.out_size, num_actions, torso.head_gains))
        self.obs_shape = tuple(obs_shape)
        self.num_actions = num_actions
        self.image = image


def explore(logits: torch.Tensor, action_mask: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
    """Behaviour logits of mu = (1 - epsilon) * pi + epsilon * uniform(legal actions).

    logits [N, A] masked policy logits; action_mask [N, A]; epsilon [N] in [0, 1].
    Returns masked logits [N, A] whose softmax is mu, so the learner's V-trace sees the true
    behaviour probabilities of the exploratory moves (Ape-X style per-env epsilon).
    """
    legal = (action_mask != 0).float()
    uniform = legal / legal.sum(-1, keepdim=True)
    mu = (1 - epsilon[:, None]) * torch.softmax(logits, -1) + epsilon[:, None] * uniform
    return mask_logits(torch.log(mu.clamp(min=1e-30)), action_mask)
