"""From gymnasium spaces to the one observation array and Discrete action the network takes.

Observations:
* `Box`: as it is; uint8 Boxes (images, 0/1 planes) and int8 Boxes (boards) keep their dtype on the
  wire, any other dtype becomes float32.
* `Discrete(n)`: a one-hot int8 `[n]`.
* `MultiDiscrete(nvec)`: the one-hots of its components, concatenated: int8 `[sum(nvec)]`.
* `Dict` with `observation` and `action_mask` keys (PettingZoo's convention for legal moves): the
  `observation` part as above, and the mask.

An image is a uint8 Box whose bounds are 0..255 (`ObsEncoder.image`, carried in `EnvSpec.obs_image`):
the network scales it by 1/255. Every other observation reaches the network as it is: a uint8 Box of
0/1 planes stays 0 and 1, not 0 and 1/255. An integer observation outside its space's bounds (which lie
inside the dtype's range), or a Discrete value outside 0..n-1 after `start`, is refused with a
ValueError naming the env, the agent, the value and the bounds: it is never cast into range (-1 would
become 255 in uint8).

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

    shape / dtype: of the encoded observation; has_mask: the space carries an action mask; image: the
    observation is an image (a uint8 Box of bounds 0..255), which the network scales by 1/255.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    has_mask: bool
    encode: Callable[[Any], tuple[np.ndarray, np.ndarray | None]]
    image: bool = False


def _bounded(space: spaces.Box, dtype: np.dtype, where: str) -> Callable[[Any], np.ndarray]:
    """The encoder of an integer Box: the raw value as `dtype`, after checking it lies within the
    space's bounds (raises ValueError naming `where`, the value and the bounds, instead of wrapping)."""
    low, high = np.asarray(space.low), np.asarray(space.high)
    uniform = low.min() == low.max() and high.min() == high.max()
    lo, hi = low.min(), high.max()

    def encode(x: Any) -> np.ndarray:
        raw = np.asarray(x)
        if raw.size and (raw.min() < lo or raw.max() > hi or not uniform and ((raw < low) | (raw > high)).any()):
            at = tuple(int(i) for i in np.argwhere((raw < low) | (raw > high))[0])
            raise ValueError(f"{where}: observation value {raw[at].item()} at index {at} is outside the space's "
                             f"bounds [{low[at] if low.ndim else lo}, {high[at] if high.ndim else hi}] "
                             f"({space.dtype}); it is refused rather than cast into range")
        return raw.astype(dtype, copy=False)
    return encode


def _plain(space: spaces.Space, where: str) -> tuple[tuple[int, ...], np.dtype, Callable[[Any], np.ndarray], bool]:
    """(shape, dtype, encoder, image) of a space that is not a Dict."""
    if isinstance(space, spaces.Box):
        dtype = space.dtype if space.dtype in (np.uint8, np.int8) else np.dtype(np.float32)
        image = space.dtype == np.uint8 and bool((space.low == 0).all() and (space.high == 255).all())
        if np.issubdtype(space.dtype, np.integer):
            return tuple(space.shape), dtype, _bounded(space, dtype, where), image
        return tuple(space.shape), dtype, lambda x: np.asarray(x, dtype), image
    if isinstance(space, spaces.Discrete):
        n, start = int(space.n), int(space.start)

        def one_hot(x: Any) -> np.ndarray:
            if not start <= int(x) < start + n:
                raise ValueError(f"{where}: observation {int(x)} is outside Discrete({n}, start={start})")
            out = np.zeros(n, np.int8)
            out[int(x) - start] = 1
            return out
        return (n,), np.dtype(np.int8), one_hot, False
    if isinstance(space, spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise UnsupportedSpace(f"{where}: MultiDiscrete observations must be 1-D, got nvec shape "
                                   f"{space.nvec.shape}")
        offsets = np.concatenate([[0], np.cumsum(space.nvec)[:-1]]).astype(np.int64)
        start = np.asarray(space.start, np.int64)
        total = int(space.nvec.sum())

        def one_hots(x: Any) -> np.ndarray:
            index = np.asarray(x, np.int64) - start
            if ((index < 0) | (index >= space.nvec)).any():
                raise ValueError(f"{where}: observation {np.asarray(x).tolist()} is outside MultiDiscrete"
                                 f"({space.nvec.tolist()}, start={start.tolist()})")
            out = np.zeros(total, np.int8)
            out[offsets + index] = 1
            return out
        return (total,), np.dtype(np.int8), one_hots, False
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
        shape, dtype, inner, image = _plain(space.spaces["observation"], where)
        return ObsEncoder(shape, dtype, True,
                          lambda x: (inner(x["observation"]), np.asarray(x["action_mask"], np.uint8)), image)
    shape, dtype, plain, image = _plain(space, where)
    return ObsEncoder(shape, dtype, False, lambda x: (plain(x), None), image)


def num_actions(space: spaces.Space, where: str = "env") -> int:
    """Size A of a Discrete action space. Raises UnsupportedSpace for any other action space."""
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise UnsupportedSpace(f"{where}: Discrete action space starting at {space.start} is not supported "
                                   f"(actions are 0 .. n-1)")
        return int(space.n)
    raise UnsupportedSpace(f"{where}: action space {space} is not supported: this stack trains Discrete "
                           f"actions (with optional masks); discretize continuous actions with a wrapper")
