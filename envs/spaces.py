"""From gymnasium spaces to the one observation array and Discrete action the network takes.

Observations:
* `Box`: as it is; uint8 Boxes (images) and int8 Boxes (boards) keep their dtype on the wire, any
  other dtype becomes float32.
* `Discrete(n)`: a one-hot int8 `[n]`.
* `MultiDiscrete(nvec)`: the one-hots of its components, concatenated: int8 `[sum(nvec)]`.

uint8 is kept for images: the network scales uint8 observations by 1/255 (see agents/network.py).
* `Dict` with `observation` and `action_mask` keys (PettingZoo's convention for legal moves): the
  `observation` part as above, and the mask.

Actions must be `Discrete`. Anything else is refused with `UnsupportedSpace`, naming the space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from gymnasium import spaces


class UnsupportedSpace(ValueError):
    """An env whose observation or action space this stack cannot train on; the message says which and why."""


@dataclass(frozen=True)
class ObsEncoder:
    """Turns one raw observation of a space into `(observation, action_mask or None)`.

    shape / dtype: of the encoded observation; has_mask: the space carries an action mask.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    has_mask: bool
    encode: Callable[[Any], tuple[np.ndarray, np.ndarray | None]]


def _plain(space: spaces.Space, where: str) -> tuple[tuple[int, ...], np.dtype, Callable[[Any], np.ndarray]]:
    if isinstance(space, spaces.Box):
        dtype = space.dtype if space.dtype in (np.uint8, np.int8) else np.dtype(np.float32)
        return tuple(space.shape), dtype, lambda x: np.asarray(x, dtype)
    if isinstance(space, spaces.Discrete):
        n, start = int(space.n), int(space.start)

        def one_hot(x: Any) -> np.ndarray:
            out = np.zeros(n, np.int8)
            out[int(x) - start] = 1
            return out
        return (n,), np.dtype(np.int8), one_hot
    if isinstance(space, spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise UnsupportedSpace(f"{where}: MultiDiscrete observations must be 1-D, got nvec shape "
                                   f"{space.nvec.shape}")
        offsets = np.concatenate([[0], np.cumsum(space.nvec)[:-1]]).astype(np.int64)
        start = np.asarray(space.start, np.int64)
        total = int(space.nvec.sum())

        def one_hots(x: Any) -> np.ndarray:
            out = np.zeros(total, np.int8)
            out[offsets + np.asarray(x, np.int64) - start] = 1
            return out
        return (total,), np.dtype(np.int8), one_hots
    raise UnsupportedSpace(f"{where}: observation space {space} is not supported: use Box, Discrete, "
                           f"MultiDiscrete, or a Dict of 'observation' and 'action_mask'")


def observation_encoder(space: spaces.Space, where: str = "env") -> ObsEncoder:
    """The encoder of observations from `space`. `where` names the env/agent in error messages.

    Raises UnsupportedSpace for any other space (e.g. a Dict without the action-mask convention,
    Tuple, Graph, Text).
    """
    if isinstance(space, spaces.Dict):
        if set(space.spaces) != {"observation", "action_mask"}:
            raise UnsupportedSpace(f"{where}: Dict observation space with keys {sorted(space.spaces)} is not "
                                   f"supported: only {{'observation', 'action_mask'}} (PettingZoo's legal-move "
                                   f"convention); flatten it with a wrapper first")
        shape, dtype, inner = _plain(space.spaces["observation"], where)
        return ObsEncoder(shape, dtype, True,
                          lambda x: (inner(x["observation"]), np.asarray(x["action_mask"], np.uint8)))
    shape, dtype, plain = _plain(space, where)
    return ObsEncoder(shape, dtype, False, lambda x: (plain(x), None))


def num_actions(space: spaces.Space, where: str = "env") -> int:
    """Size A of a Discrete action space. Raises UnsupportedSpace for any other action space."""
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise UnsupportedSpace(f"{where}: Discrete action space starting at {space.start} is not supported "
                                   f"(actions are 0 .. n-1)")
        return int(space.n)
    raise UnsupportedSpace(f"{where}: action space {space} is not supported: this stack trains Discrete "
                           f"actions (with optional masks); discretize continuous actions with a wrapper")
