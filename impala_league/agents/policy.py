"""A trained policy, loaded from a checkpoint without Redis, for evaluation and play: any network the
project trains (agents.model.make_model: ActorCritic with any torso, StarCraft II's FullyConv), with or
without a recurrent core."""

from __future__ import annotations

from pathlib import Path
from typing import Hashable, Mapping, Sequence

import numpy as np
import torch

from impala_league.agents.checkpoint import CheckpointError, model_state, read_checkpoint
from impala_league.agents.core import CoreStates, Network
from impala_league.agents.model import make_model, policy_head
from impala_league.agents.spec import checked_spec
from impala_league.config import Config, ConfigError, from_yaml_text
from impala_league.envs.registry import EnvSpec


class Policy:
    """pi(a|x) of one checkpoint, on the CPU.

    A network with a recurrent core (`recurrent`) remembers: each stream of observations (a game's
    seat; `act` plays stream 0) carries its core state from call to call, and `reset` starts a new
    episode. Feedforward policies act on the observation alone; `reset` and `settle` do nothing for them.

    Actions are those of the env's policy head (agents.model.policy_head): an int of Discrete(A), or for
    StarCraft II an int64 FunctionCall [H] (function id, then its arguments; envs/sc2_wrappers/actions.py),
    whose observation is a dict of named arrays (EnvSpec.obs_arrays) and mask `available_actions`.

    Attributes: `config` (the run's resolved Config), `spec` (its EnvSpec), `model` (agents.core.Network).
    """

    def __init__(self, model: Network, config: Config, spec: EnvSpec, seed: int | None = None):
        self.model = model.eval()
        self.config = config
        self.spec = spec
        self.head = policy_head(spec)
        self.generator = torch.Generator().manual_seed(seed if seed is not None else 0)
        self.cores = CoreStates(model.core.core_size) if model.core.recurrent else None

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
            greedy: bool = True, reward: float = 0.0, stream: Hashable = 0) -> int | np.ndarray:
        """One agent's action (greedy: the most likely legal one; else sampled from pi): an int, or for
        StarCraft II a FunctionCall int64 [H]. With a recurrent core the calls of one `stream` (one player of
        one game: pass the agent's name when the policy plays several seats) form one episode until `reset()`.

        observation: an array of `spec.obs_shape`, or PettingZoo's observation dict
          `{"observation": array, "action_mask": [A] of 0/1}` (what `env.last()` / `env.observe` give); for
          StarCraft II the dict of named arrays (screen, minimap, player) that the env adapter gives.
        action_mask: [A] of 0/1; None = the dict's mask, or every action legal.
        reward: the reward `stream` received since its previous call (a core with core inputs reads it).

        Raises ValueError: an observation or mask of the wrong shape, a mask without a legal action,
          or a mask given both in the dict and as `action_mask`.
        """
        observation, action_mask = self._unpack(observation, action_mask)
        mask = np.ones(self.spec.num_actions, np.uint8) if action_mask is None else np.asarray(action_mask)
        self.settle(stream, reward)
        batch = ({k: np.asarray(v)[None] for k, v in observation.items()} if isinstance(observation, Mapping)
                 else np.asarray(observation)[None])
        action = self.act_batch(batch, mask[None], greedy, streams=[stream])[0]
        return int(action) if action.ndim == 0 else action

    def _unpack(self, observation, action_mask):
        """(observation, action_mask) of `act`'s arguments: PettingZoo's dict split in two; a StarCraft II
        observation (a dict of the spec's named arrays) kept whole."""
        if not isinstance(observation, Mapping) or self.spec.obs_arrays is not None:
            return observation, action_mask
        if set(observation) != {"observation", "action_mask"}:
            raise ValueError(f"an observation dict must have the keys 'observation' and 'action_mask' "
                             f"(PettingZoo's convention), got {sorted(map(str, observation))}")
        if action_mask is not None:
            raise ValueError("the action mask was given twice (in the observation dict and as action_mask); "
                             "give it once")
        return observation["observation"], observation["action_mask"]

    def act_batch(self, observations: np.ndarray | Mapping[str, np.ndarray], action_masks: np.ndarray,
                  greedy: bool = True, streams: Sequence[Hashable] | None = None) -> np.ndarray:
        """Actions int64 [N] (or FunctionCalls [N, H]) for observations [N, *obs_shape] (StarCraft II: a
        dict of named arrays [N, ...]) and action_masks [N, A] (0/1).

        streams: with a recurrent core, the stream each row continues (e.g. (game, agent)); rewards and
          episode ends reach it through `settle`. Required then: a recurrent policy given none raises
          ValueError rather than act without its memory.

        Raises ValueError: a shape that does not fit the policy's env, a mask without a legal action, or
          a recurrent policy without `streams` (or with a number of them other than N).
        """
        observations, action_masks = self._check(observations, np.asarray(action_masks))
        core = None
        if self.cores is not None:
            if streams is None or len(streams) != len(action_masks):
                raise ValueError(f"this policy has a recurrent core ({self.config.agent.core}): act_batch needs one "
                                 f"stream key per row (streams=...), got {None if streams is None else len(streams)}")
            core = self.cores.gather(list(streams))
        obs = ({k: torch.as_tensor(v) for k, v in observations.items()} if isinstance(observations, dict)
               else torch.as_tensor(observations))
        with torch.no_grad():
            logits, _, state = self.model.step(obs, torch.as_tensor(action_masks), core)
        actions = self.head.play(logits, self.generator, 0.0 if greedy else 1.0)
        if state is not None:  # head 0 (the function id of a FunctionCall) is the core's last action
            self.cores.advance(list(streams), state, (actions if actions.dim() == 1 else actions[:, 0]).tolist())
        return actions.numpy()

    def _check(self, observations, masks: np.ndarray) -> tuple[np.ndarray | dict[str, np.ndarray], np.ndarray]:
        """Observations in the env's dtypes and uint8 masks, after checking what the network cannot."""
        spec = self.spec
        if spec.obs_arrays is not None:
            observations = self._check_arrays(observations)
            n = len(next(iter(observations.values())))
        else:
            observations = np.asarray(observations)
            n = len(observations)
            if observations.shape[1:] != tuple(spec.obs_shape):
                raise ValueError(f"observation of shape {observations.shape[1:]}; this policy plays {spec.name}, "
                                 f"whose observations have shape {tuple(spec.obs_shape)}")
            observations = observations.astype(spec.obs_dtype, copy=False)
        if masks.shape != (n, spec.num_actions):
            raise ValueError(f"action mask of shape {masks.shape[1:]}; {spec.name} has {spec.num_actions} actions, "
                             f"so a mask has shape ({spec.num_actions},)")
        empty = np.flatnonzero(~(masks != 0).any(axis=1))
        if len(empty):
            which = "the action mask" if len(masks) == 1 else f"action mask {int(empty[0])}"
            raise ValueError(f"{which} has no legal action (all zeros): in PettingZoo that is the mask of an "
                             f"agent whose turn it is not, or of a finished episode; step it with None instead")
        return observations, (masks != 0).astype(np.uint8)

    def _check_arrays(self, observations) -> dict[str, np.ndarray]:
        """A dict of named observation arrays [N, ...] (EnvSpec.obs_arrays) in the env's dtypes, checked."""
        arrays = {name: (shape, dtype) for name, shape, dtype in self.spec.obs_arrays}
        if not isinstance(observations, Mapping) or set(observations) != set(arrays):
            got = sorted(map(str, observations)) if isinstance(observations, Mapping) else type(observations).__name__
            raise ValueError(f"{self.spec.name}'s observation is a dict of the arrays {sorted(arrays)}, got {got}")
        out = {name: np.asarray(observations[name]) for name in arrays}
        sizes = {len(a) for a in out.values()}
        for name, (shape, dtype) in arrays.items():
            if out[name].shape[1:] != tuple(shape) or len(sizes) != 1:
                raise ValueError(f"observation array {name!r} of shape {out[name].shape}; {self.spec.name} gives "
                                 f"[N, *{tuple(shape)}], the same N for every array")
            out[name] = out[name].astype(dtype, copy=False)
        return out


def load_policy(path: str | Path, seed: int | None = None) -> Policy:
    """Load the policy of a learner checkpoint (`<run dir>/checkpoints/latest.safetensors`): the network
    its config names (agents.model.make_model), with weights of the layout before agents.core.Network too.

    Raises CheckpointError naming the file if it is missing, corrupt, or does not fit its own config.
    """
    tensors, metadata = read_checkpoint(path)
    try:
        config = from_yaml_text(metadata["config"])
        spec = checked_spec(config)
    except ConfigError as e:
        raise CheckpointError(f"{path}: the run config in its metadata is not usable: {e}") from None
    model = make_model(spec, config.agent)  # the network the run trained: its torso, core and heads
    try:
        model.load_state_dict(model_state(tensors))
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit the network its config describes: {e}") from None
    torch.set_num_threads(1)
    return Policy(model, config, spec, seed)
