"""A trained policy, loaded from a checkpoint without Redis, for evaluation and play."""

from __future__ import annotations

from pathlib import Path
from typing import Hashable, Mapping, Sequence

import numpy as np
import torch

from impala_league.agents.checkpoint import CheckpointError, model_state, read_checkpoint
from impala_league.agents.core import CoreStates
from impala_league.agents.heads import sample_actions
from impala_league.agents.network import ActorCritic
from impala_league.agents.spec import checked_spec
from impala_league.config import Config, ConfigError, from_yaml_text
from impala_league.envs.registry import EnvSpec


class Policy:
    """pi(a|x) of one checkpoint, on the CPU.

    A network with a recurrent core (`recurrent`) remembers: each stream of observations (a game's
    seat; `act` plays stream 0) carries its core state from call to call, and `reset` starts a new
    episode. Feedforward policies act on the observation alone; `reset` and `settle` do nothing for them.

    Attributes: `config` (the run's resolved Config), `spec` (its EnvSpec), `model` (ActorCritic).
    """

    def __init__(self, model: ActorCritic, config: Config, spec: EnvSpec, seed: int | None = None):
        self.model = model.eval()
        self.config = config
        self.spec = spec
        self.generator = torch.Generator().manual_seed(seed if seed is not None else 0)
        self.cores = CoreStates(model.core.core_size) if model.core is not None else None

    @property
    def recurrent(self) -> bool:
        return self.cores is not None

    def reset(self, stream: Hashable | None = None) -> None:
        """Start a new episode for `stream` (None: every stream)."""
        if self.cores is not None:
            if stream is None:
                self.cores.streams.clear()
            else:
                self.cores.reset(stream)

    def settle(self, stream: Hashable, reward: float, done: bool = False) -> None:
        """The reward `stream` received since its last action (the core's last-reward input), and
        whether its episode ended there (then its next action starts from a fresh state)."""
        if self.cores is not None:
            if done:
                self.cores.reset(stream)
            else:
                self.cores.add_reward(stream, reward)

    def act(self, observation: np.ndarray | Mapping[str, np.ndarray], action_mask: np.ndarray | None = None,
            greedy: bool = True, reward: float = 0.0, stream: Hashable = 0) -> int:
        """One agent's action (greedy: the most likely legal one; else sampled from pi). With a recurrent
        core the calls of one `stream` (one player of one game: pass the agent's name when the policy
        plays several seats) form one episode until `reset()`.

        observation: an array of `spec.obs_shape`, or PettingZoo's observation dict
          `{"observation": array, "action_mask": [A] of 0/1}` (what `env.last()` / `env.observe` give).
        action_mask: [A] of 0/1; None = the dict's mask, or every action legal.
        reward: the reward `stream` received since its previous call (a core with core inputs reads it).

        Raises ValueError: an observation or mask of the wrong shape, a mask without a legal action,
          or a mask given both in the dict and as `action_mask`.
        """
        if isinstance(observation, Mapping):
            if set(observation) != {"observation", "action_mask"}:
                raise ValueError(f"an observation dict must have the keys 'observation' and 'action_mask' "
                                 f"(PettingZoo's convention), got {sorted(map(str, observation))}")
            if action_mask is not None:
                raise ValueError("the action mask was given twice (in the observation dict and as action_mask); "
                                 "give it once")
            observation, action_mask = observation["observation"], observation["action_mask"]
        mask = np.ones(self.spec.num_actions, np.uint8) if action_mask is None else np.asarray(action_mask)
        self.settle(stream, reward)
        return int(self.act_batch(np.asarray(observation)[None], mask[None], greedy, streams=[stream])[0])

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray, greedy: bool = True,
                  streams: Sequence[Hashable] | None = None) -> np.ndarray:
        """Actions [N] int64 for observations [N, *obs_shape] and action_masks [N, A] (0/1).

        streams: with a recurrent core, the stream each row continues (e.g. (game, agent)); rewards and
          episode ends reach it through `settle`. Required then: a recurrent policy given none raises
          ValueError rather than act without its memory.

        Raises ValueError: a shape that does not fit the policy's env, a mask without a legal action, or
          a recurrent policy without `streams` (or with a number of them other than N).
        """
        observations, action_masks = self._check(np.asarray(observations), np.asarray(action_masks))
        core = None
        if self.cores is not None:
            if streams is None or len(streams) != len(observations):
                raise ValueError(f"this policy has a recurrent core ({self.config.agent.core}): act_batch needs one "
                                 f"stream key per row (streams=...), got {None if streams is None else len(streams)}")
            core = self.cores.gather(list(streams))
        with torch.no_grad():
            logits, _, state = self.model.step(torch.as_tensor(observations), torch.as_tensor(action_masks), core)
        actions = sample_actions(logits, self.generator, temperature=0.0 if greedy else 1.0)
        if state is not None:
            self.cores.advance(list(streams), state, actions.tolist())
        return actions.numpy()


    def _check(self, observations: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Observations in the env's dtype and uint8 masks, after checking what the network cannot."""
        spec = self.spec
        if observations.shape[1:] != tuple(spec.obs_shape):
            raise ValueError(f"observation of shape {observations.shape[1:]}; this policy plays {spec.name}, whose "
                             f"observations have shape {tuple(spec.obs_shape)}")
        if masks.shape != (len(observations), spec.num_actions):
            raise ValueError(f"action mask of shape {masks.shape[1:]}; {spec.name} has {spec.num_actions} actions, "
                             f"so a mask has shape ({spec.num_actions},)")
        empty = np.flatnonzero(~(masks != 0).any(axis=1))
        if len(empty):
            which = "the action mask" if len(masks) == 1 else f"action mask {int(empty[0])}"
            raise ValueError(f"{which} has no legal action (all zeros): in PettingZoo that is the mask of an "
                             f"agent whose turn it is not, or of a finished episode; step it with None instead")
        return observations.astype(spec.obs_dtype, copy=False), (masks != 0).astype(np.uint8)


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
    model = ActorCritic(spec.obs_shape, spec.num_actions, config.agent, spec.obs_image)
    try:
        model.load_state_dict(model_state(tensors))
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit the network its config describes: {e}") from None
    torch.set_num_threads(1)
    return Policy(model, config, spec, seed)
