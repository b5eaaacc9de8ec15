"""A trained policy, loaded from a checkpoint without Redis, for evaluation and play."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from agents.checkpoint import CheckpointError, model_state, read_checkpoint
from agents.heads import checked_spec, sample_actions
from agents.network import ActorCritic
from config import Config, ConfigError, from_yaml_text
from envs.registry import EnvSpec


class Policy:
    """pi(a|x) of one checkpoint, on the CPU.

    Attributes: `config` (the run's resolved Config), `spec` (its EnvSpec), `model` (ActorCritic).
    """

    def __init__(self, model: ActorCritic, config: Config, spec: EnvSpec, seed: int | None = None):
        self.model = model.eval()
        self.config = config
        self.spec = spec
        self.generator = torch.Generator().manual_seed(seed if seed is not None else 0)

    def act(self, observation: np.ndarray, action_mask: np.ndarray | None = None, greedy: bool = True) -> int:
        """One agent's action. observation: `spec.obs_shape`; action_mask: [A] of 0/1 (None = all legal)."""
        mask = np.ones(self.spec.num_actions, np.uint8) if action_mask is None else action_mask
        return int(self.act_batch(observation[None], mask[None], greedy)[0])

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray, greedy: bool = True) -> np.ndarray:
        """Actions [N] int64 for observations [N, *obs_shape] and action_masks [N, A]."""
        with torch.no_grad():
            logits, _ = self.model(torch.as_tensor(observations), torch.as_tensor(action_masks))
        actions = sample_actions(logits, self.generator, temperature=0.0 if greedy else 1.0)
        return actions.numpy()


def load_policy(path: str | Path, seed: int | None = None) -> Policy:
    """Load the policy of a learner checkpoint (`<run dir>/checkpoints/latest.safetensors`).

    Raises CheckpointError naming the file if it is missing, corrupt, or does not fit its own config.
    """
    tensors, metadata = read_checkpoint(path)
    try:
        config = from_yaml_text(metadata["config"])
        spec = checked_spec(config)
    except ConfigError as e:
        raise CheckpointError(f"{path}: the run config in its metadata is not usable: {e}") from None
    model = ActorCritic(spec.obs_shape, spec.num_actions, config.agent)
    try:
        model.load_state_dict(model_state(tensors))
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit the network its config describes: {e}") from None
    torch.set_num_threads(1)
    return Policy(model, config, spec, seed)
