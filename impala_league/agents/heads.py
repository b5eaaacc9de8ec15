"""Policy heads: how the actor samples from a network's logits and how the learner scores actions.

The actor and the learner call one interface for every env:
* `DiscreteHead`: one Discrete action masked by `action_mask` (board games, battle, MPE, gym).
  The behaviour record is mu's masked logits [A].
* `FunctionCallHead`: pysc2 FunctionCalls (envs/sc2_wrappers/actions.py). The network's logits are
  its heads' logits side by side, [..., sum of head sizes]; an action is int64 [H]; the behaviour
  record is log mu_h(a_h|x) per head [H] (0 for heads the action does not use).
In both, log pi(a|x) is what V-trace's log_rho = log pi(a|x) - log mu(a|x) and the policy gradient use.
"""

from __future__ import annotations

import torch

from impala_league.agents.network import explore
from impala_league.distributed.vtrace import action_log_probs


def sample_actions(logits: torch.Tensor, generator: torch.Generator | None = None,
                   temperature: float = 1.0) -> torch.Tensor:
    """Draw one action per row from softmax(logits / temperature) [N, A] (Gumbel-max: argmax of the
    scaled logits + Gumbel noise); temperature 0 is the argmax itself.

    Masked actions (agents.network.MASKED_LOGIT) are never drawn: Gumbel noise is bounded far below 1e9 in float32,
    so temperature must stay below about 1e6.
    """
    if temperature == 0:
        return logits.argmax(-1)
    u = torch.rand(logits.shape, generator=generator).clamp_(min=1e-20)
    scaled = logits if temperature == 1 else logits / temperature
    return (scaled - torch.log(-torch.log(u))).argmax(-1)


class DiscreteHead:
    """One Discrete(A) action; logits [..., A] are already masked (agents.network.mask_logits)."""

    behaviour_key = "behaviour_logits"

    def sample(self, logits: torch.Tensor, masks: torch.Tensor, epsilon: torch.Tensor,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions int64 [N] from mu = (1 - epsilon) pi + epsilon uniform(legal) (epsilon [N]), and mu's
        logits [N, A] for the unroll."""
        if bool((epsilon > 0).any()):
            logits = explore(logits, masks, epsilon)
        return sample_actions(logits, generator), logits

    def play(self, logits: torch.Tensor, generator: torch.Generator, temperature: float) -> torch.Tensor:
        """An opponent's actions int64 [N] from softmax(logits / temperature); 0 = argmax. Nothing recorded."""
        return sample_actions(logits, generator, temperature)

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a|x): logits [T, B, A], actions int64 [T, B] -> [T, B]."""
        return action_log_probs(logits, actions)

    def behaviour_log_prob(self, behaviour: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log mu(a|x) from the recorded behaviour logits [T, B, A] -> [T, B]."""
        return action_log_probs(behaviour, actions)

    def entropy(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """H(pi(.|x)) [T, B]; masked actions have probability exactly 0 and add 0."""
        log_pi = torch.log_softmax(logits, -1)
        return -(log_pi.exp() * log_pi).sum(-1)


class FunctionCallHead:
    """pysc2 FunctionCalls through `codec` (a FunctionCallCodec); see the module doc for the layout."""

    behaviour_key = "behaviour_log_probs"

    def __init__(self, codec):
        self.codec = codec
        self.sizes = [h.size for h in codec.heads]

    def split(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """[..., sum of sizes] -> one [..., size] tensor per head."""
        return list(torch.split(logits, self.sizes, -1))

    def sample(self, logits: torch.Tensor, masks: torch.Tensor, epsilon: torch.Tensor,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions int64 [N, H] drawn from pi, and log pi_h(a_h|x) [N, H] for the unroll (mu = pi:
        StarCraft II runs have no epsilon exploration; the config refuses actor.epsilon > 0)."""
        heads = self.split(logits)
        actions = self.draw(heads, generator)
        return actions, self.codec.head_log_probs(heads, actions)

    def play(self, logits: torch.Tensor, generator: torch.Generator, temperature: float) -> torch.Tensor:
        """An opponent's actions int64 [N, H], every head at `temperature` (0 = argmax). Nothing recorded."""
        return self.draw(self.split(logits), generator, temperature)

    def draw(self, heads: list[torch.Tensor], generator: torch.Generator | None = None,
             temperature: float = 1.0) -> torch.Tensor:
        """One action per row from every head's softmax(logits / temperature) (0 = argmax).
        heads: per head, float [N, size] (function logits already masked).

        Returns int64 [N, num_heads]; heads the drawn function does not use hold 0. Masked function ids
        (agents.network.MASKED_LOGIT) are never drawn.
        """
        drawn = torch.stack([sample_actions(lg, generator, temperature) for lg in heads], -1)
        return self.codec.zero_unused(drawn)

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a|x) = sum over the heads the function uses: [T, B, sum], [T, B, H] -> [T, B]."""
        return self.codec.log_prob(self.split(logits), actions)

    def behaviour_log_prob(self, behaviour: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log mu(a|x) = sum of the recorded per-head log-probs [T, B, H] -> [T, B]."""
        return behaviour.sum(-1)

    def entropy(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Entropy summed over the function head and the argument heads the taken function uses."""
        return self.codec.entropy(self.split(logits), actions[..., 0])
